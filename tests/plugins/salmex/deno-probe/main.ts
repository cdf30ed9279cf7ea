// deno-probe: a Salmex Deno plugin (no imports) whose tools try what its Deno permissions allow: read a path, write a path, connect to a port.
const enc = new TextEncoder();
const dec = new TextDecoder();

function send(msg: unknown) {
  const json = enc.encode(JSON.stringify(msg));
  const head = enc.encode(`Content-Length: ${json.length}\r\n\r\n`);
  const out = new Uint8Array(head.length + json.length);
  out.set(head);
  out.set(json, head.length);
  let written = 0;
  while (written < out.length) written += Deno.stdout.writeSync(out.subarray(written));
}

function text(t: string, isError = false) {
  return { content: [{ type: "text", text: t }], isError };
}

async function call(name: string, args: Record<string, unknown>) {
  try {
    if (name === "say_hello") return text(`Hello, ${args.name ?? "world"}!`);
    if (name === "read") return text(await Deno.readTextFile(String(args.path)));
    if (name === "write") {
      await Deno.writeTextFile(String(args.path), "probe");
      return text("written");
    }
    if (name === "connect") {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(args.port) });
      conn.close();
      return text("connected");
    }
    return text(`unknown tool ${name}`, true);
  } catch (e) {
    return text(`${(e as Error).name}: ${(e as Error).message}`, true);
  }
}

async function handle(msg: any) {
  if (msg.method === "initialize") {
    send({ jsonrpc: "2.0", id: msg.id, result: { protocolVersion: "1.0", capabilities: { tools: ["say_hello", "read", "write", "connect"].map((name) => ({ name })) } } });
  } else if (msg.method === "tools/call") {
    send({ jsonrpc: "2.0", id: msg.id, result: await call(msg.params?.name, msg.params?.arguments ?? {}) });
  } else if (msg.method === "shutdown") {
    Deno.exit(0);
  }
}

let buf = new Uint8Array(0);
for await (const chunk of Deno.stdin.readable) {
  const joined = new Uint8Array(buf.length + chunk.length);
  joined.set(buf);
  joined.set(chunk, buf.length);
  buf = joined;
  while (true) {
    const s = dec.decode(buf);
    const end = s.indexOf("\r\n\r\n");
    if (end < 0) break;
    const m = s.slice(0, end).match(/Content-Length: (\d+)/);
    if (!m) break;
    const start = enc.encode(s.slice(0, end + 4)).length;
    const len = parseInt(m[1], 10);
    if (buf.length < start + len) break;
    const body = dec.decode(buf.subarray(start, start + len));
    buf = buf.slice(start + len);
    handle(JSON.parse(body));
  }
}
