// seed 004's minimal Node.js plugin ("Here is a minimal Node.js plugin"); every line below this one is copied verbatim.
const readline = require('readline');

let config = {};

function send(msg) {
  const json = JSON.stringify(msg);
  process.stdout.write(`Content-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`);
}

function handle(msg) {
  if (msg.method === 'initialize') {
    config = msg.params?.config || {};
    send({
      jsonrpc: '2.0', id: msg.id,
      result: {
        protocolVersion: '1.0',
        capabilities: { tools: [{ name: 'say_hello', description: 'Greet someone', parameters: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] } }] }
      }
    });
  } else if (msg.method === 'tools/call') {
    const greeting = config.greeting || 'Hello';
    const name = msg.params?.arguments?.name || 'world';
    send({
      jsonrpc: '2.0', id: msg.id,
      result: { content: [{ type: 'text', text: `${greeting}, ${name}!` }] }
    });
  } else if (msg.method === 'shutdown') {
    process.exit(0);
  }
}

// Read Content-Length framed messages from stdin
let buffer = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  buffer += chunk;
  while (true) {
    const headerEnd = buffer.indexOf('\r\n\r\n');
    if (headerEnd === -1) break;
    const header = buffer.slice(0, headerEnd);
    const match = header.match(/Content-Length: (\d+)/);
    if (!match) break;
    const len = parseInt(match[1], 10);
    const bodyStart = headerEnd + 4;
    if (buffer.length < bodyStart + len) break;
    const body = buffer.slice(bodyStart, bodyStart + len);
    buffer = buffer.slice(bodyStart + len);
    handle(JSON.parse(body));
  }
});
