// The seed's TypeScript / Node microapp skeleton as plain JavaScript, with
// tools/call, tools/list and shutdown filled in the same pattern.
const readline = require('readline');

const rl = readline.createInterface({ input: process.stdin });

const TOOLS = [{
  name: 'hello_ts_greet',
  description: 'Echo a greeting',
  input_schema: {
    type: 'object',
    properties: { name: { type: 'string' } },
    required: ['name']
  }
}];

function respond(id, result) {
  process.stdout.write(JSON.stringify({ jsonrpc: '2.0', id, result }) + '\n');
}

rl.on('line', (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch (e) {
    process.stderr.write(`[WARN] unparsable line: ${e.message}\n`);
    return;
  }
  if (req.id === undefined) {
    // A notification (agents/updated, nexo/notify/*): nothing to answer.
    process.stderr.write(`[INFO] notification ${req.method}\n`);
    return;
  }
  switch (req.method) {
    case 'initialize':
      respond(req.id, { tools: TOOLS, version: '0.1.0' });
      break;
    case 'tools/list':
      respond(req.id, { tools: TOOLS });
      break;
    case 'tools/call': {
      const { tool, args } = req.params;
      if (tool !== 'hello_ts_greet') {
        respond(req.id, { error: `unknown tool: ${tool}` });
        break;
      }
      respond(req.id, { output: { greeting: `hello, ${args.name}` } });
      break;
    }
    case 'shutdown':
      respond(req.id, { ok: true });
      rl.close();
      break;
    default:
      process.stdout.write(JSON.stringify({
        jsonrpc: '2.0', id: req.id,
        error: { code: -32601, message: `unknown: ${req.method}` }
      }) + '\n');
  }
});
