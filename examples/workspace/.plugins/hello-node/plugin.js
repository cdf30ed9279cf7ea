// hello-node: a nexo/plugd native plugin in plain Node.js 20 (no dependencies).
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const readline = require("node:readline");

// The host already validated the manifest; the plugin only needs id and
// version, and echoes this JSON copy (kept in step with nexo-plugin.toml).
const MANIFEST = {
  plugin: {
    id: "hello_node",
    version: "0.1.0",
    name: "Hello (Node)",
    description: "Greets; a dependency-free Node.js plugin",
    entrypoint: { command: "node", args: ["plugin.js"] },
    extends: { tools: ["hello_node_greet"] },
  },
};
const SERVER_VERSION = `${MANIFEST.plugin.id}-${MANIFEST.plugin.version}`;

const TOOLS = [
  {
    name: "hello_node_greet",
    description: "Greet someone by name",
    input_schema: {
      type: "object",
      properties: { name: { type: "string" } },
      required: ["name"],
    },
  },
];

const log = (level, msg) => process.stderr.write(`[${level}] ${msg}\n`);

// Sanity check: warn if the JSON copy drifted from the TOML next to us.
try {
  const toml = fs.readFileSync(path.join(__dirname, "nexo-plugin.toml"), "utf8");
  if (!toml.includes(`id = "${MANIFEST.plugin.id}"`)) log("WARN", "nexo-plugin.toml id differs from plugin.js");
} catch (e) {
  log("WARN", `cannot read nexo-plugin.toml: ${e.message}`);
}

const send = (frame) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...frame }) + "\n");
const reply = (id, result) => send({ id, result });
const replyError = (id, code, message, data) =>
  send({ id, error: data === undefined ? { code, message } : { code, message, data } });

const handlers = {
  hello_node_greet(args) {
    const name = args && typeof args.name === "string" ? args.name : null;
    if (name === null) {
      const e = new Error("invalid argument: missing string `name`");
      e.code = -33402;
      e.data = { details: { field: "name" } };
      throw e;
    }
    return { content: [{ type: "text", text: `Hello, ${name}!` }], is_error: false };
  },
};

// Async handlers in flight; shutdown waits for them so no reply is lost.
const inflight = new Set();

function invoke(id, params) {
  const tool = params.tool_name;
  const handler = Object.hasOwn(handlers, tool) ? handlers[tool] : null;
  if (!handler) return replyError(id, -33401, `tool not found: ${tool}`);
  const fail = (e) => replyError(id, typeof e.code === "number" ? e.code : -33403, String(e.message), e.data);
  let result;
  try {
    result = handler(params.args ?? null);
  } catch (e) {
    return fail(e);
  }
  if (result && typeof result.then === "function") {
    const p = Promise.resolve(result).then((r) => reply(id, r), fail);
    inflight.add(p);
    p.finally(() => inflight.delete(p));
  } else {
    reply(id, result);
  }
}

log("INFO", `${SERVER_VERSION} starting, pid ${process.pid}`);
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch {
    log("WARN", `ignored a line that is not JSON: ${line.slice(0, 80)}`);
    return;
  }
  if (msg === null || typeof msg !== "object" || typeof msg.method !== "string") {
    log("WARN", `ignored a frame that is not a request: ${line.slice(0, 80)}`);
    return;
  }
  if (!("id" in msg)) return; // notification: never answered
  const params = msg.params && typeof msg.params === "object" ? msg.params : {};
  switch (msg.method) {
    case "initialize":
      log("INFO", `initialize from nexo ${params.nexo_version}`);
      return reply(msg.id, { manifest: MANIFEST, server_version: SERVER_VERSION, tools: TOOLS });
    case "tool.invoke":
      return invoke(msg.id, params);
    case "shutdown":
      log("INFO", "shutdown requested");
      rl.close();
      Promise.allSettled([...inflight]).then(() => {
        // Exit only once the reply has reached the pipe.
        process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id: msg.id, result: { ok: true } }) + "\n", () =>
          process.exit(0),
        );
      });
      return;
    default:
      return replyError(msg.id, -32601, `method not found: ${msg.method}`);
  }
});
rl.on("close", () => log("INFO", "stdin closed"));
