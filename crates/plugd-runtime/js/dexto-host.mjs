// plugd's Dexto host: runs ONE Dexto plugin module (seed 002) and serves it to
// plugd over newline-delimited JSON-RPC 2.0 on stdin/stdout.
//
// It ships inside plugd (`include_str!` in crates/plugd-runtime/src/hooks/dexto.rs),
// which writes it to `DIR/.plugd/dexto-host.mjs` and starts it through
// `plugd_host::spawn`, one process per module.
//
// Requests from plugd (each answered on its own, so a call that never
// resolves cannot hold up the next one):
//   load    {name, module, config, llmConfig} -> {methods, cleanup, node}
//           imports the module, validates its shape exactly as Dexto's loader
//           does, instantiates it and awaits `initialize(config)`.
//   hook    {method, payload, context, call} -> {skipped: true} | {returned, value}
//   cleanup {} -> {}
//   ping    {} -> {}       (liveness: an event loop stuck in a busy loop never answers)
// Notifications from plugd:   cancel {call}   (aborts that call's context.abortSignal)
// Notifications to plugd:     log {level, message, data, method, call}
// Requests to plugd:          storage.get|set|delete|list {space, key|prefix, value}
//                             (context.agent.storage.database|cache)
//
// stdout is the protocol channel: console.* and process.stdout.write from the
// module are redirected to stderr, which plugd logs line by line.

import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';
import { Console } from 'node:console';
import { existsSync, realpathSync } from 'node:fs';
import { createRequire } from 'node:module';

const writeProtocol = process.stdout.write.bind(process.stdout);
process.stdout.write = (chunk, encoding, cb) => process.stderr.write(chunk, encoding, cb);
globalThis.console = new Console({ stdout: process.stderr, stderr: process.stderr });

const EXTENSION_POINTS = ['beforeLLMRequest', 'beforeToolCall', 'afterToolResult', 'beforeResponse'];

// JSON-RPC error codes (plugd maps them onto its messages).
const E = {
  NOT_FOUND: -32001,
  IMPORT: -32002,
  NO_DEFAULT: -32003,
  NOT_CLASS: -32004,
  INSTANTIATE: -32005,
  NO_EXTENSION_POINT: -32006,
  NOT_FUNCTION: -32007,
  INITIALIZE: -32008,
  THREW: -32010,
  UNSERIALIZABLE: -32011,
  CLEANUP: -32012,
  STATE: -32013,
  INVALID: -32602,
  METHOD: -32601,
};

class RpcError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

function send(obj) {
  let line;
  try {
    line = JSON.stringify(obj);
  } catch (e) {
    if (obj.id === undefined) return;
    line = JSON.stringify({
      jsonrpc: '2.0',
      id: obj.id,
      error: { code: E.UNSERIALIZABLE, message: `returned a value that is not JSON (${describe(e)})` },
    });
  }
  writeProtocol(line + '\n');
}

function describe(e) {
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  try {
    return `threw ${JSON.stringify(e)}`;
  } catch {
    return `threw ${String(e)}`;
  }
}

// `SyntaxError: …` plus the `file:line` Node puts first in a CommonJS stack.
function importFailure(e, modulePath) {
  let where = '';
  const first = typeof e?.stack === 'string' ? e.stack.split('\n')[0] : '';
  if (first.includes(modulePath) && /:\d+$/.test(first)) where = ` (at ${first.replace(/^file:\/\//, '')})`;
  let hint = '';
  if (e instanceof SyntaxError && /import statement outside a module|Unexpected token 'export'/.test(e.message)) {
    hint = '; Node loaded it as CommonJS: rename it to .mjs or add {"type": "module"} to its package.json';
  }
  return `${describe(e)}${where}${hint}`;
}

let plugin = null;
let pluginName = '';
const aborts = new Map();

function safeData(data) {
  if (data === undefined) return undefined;
  try {
    return JSON.parse(JSON.stringify(data));
  } catch {
    return String(data);
  }
}

// Requests to plugd (ids "h1", "h2", ...): the agent's storage.
let nextRequest = 1;
const waiting = new Map();
function request(method, params) {
  const id = `h${nextRequest++}`;
  return new Promise((resolve, reject) => {
    waiting.set(id, { resolve, reject });
    send({ jsonrpc: '2.0', id, method, params });
  });
}

// `context.agent.storage.database` / `.cache` (seed 002): JSON values by key
// in plugd's state database, shared by the agent's plugins. A missing key is
// `undefined`, so `await db.get(key) || fallback` works as in the seed.
function keyValue(space) {
  return Object.freeze({
    get: async (key) => (await request('storage.get', { space, key: String(key) })).value ?? undefined,
    set: async (key, value) => {
      await request('storage.set', { space, key: String(key), value: value === undefined ? null : value });
    },
    delete: async (key) => (await request('storage.delete', { space, key: String(key) })).deleted,
    list: async (prefix = '') => (await request('storage.list', { space, prefix: String(prefix) })).keys,
  });
}
const agent = Object.freeze({
  storage: Object.freeze({ database: keyValue('database'), cache: keyValue('cache') }),
});

function logger(method, call) {
  const at = (level) => (message, data) => {
    send({ jsonrpc: '2.0', method: 'log', params: { level, message: String(message), data: safeData(data), method, call } });
  };
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

// Dexto's validatePluginShape (seed 002), check for check; the messages are
// the seed's, lower-cased (plugd adds what to do).
function validatePluginShape(PluginClass, name) {
  // 1. Check it's a class/constructor
  if (typeof PluginClass !== 'function') {
    throw new RpcError(E.NOT_CLASS, `plugin '${name}' default export must be a class`);
  }
  // 2. Instantiate to check constructor
  let instance;
  try {
    instance = new PluginClass();
  } catch (e) {
    throw new RpcError(E.INSTANTIATE, `failed to instantiate plugin '${name}': ${describe(e)}`);
  }
  // 3. Check it has at least one extension point method
  if (!EXTENSION_POINTS.some((point) => typeof instance[point] === 'function')) {
    throw new RpcError(
      E.NO_EXTENSION_POINT,
      `plugin '${name}' must implement at least one extension point method (${EXTENSION_POINTS.join(', ')})`,
    );
  }
  // 4. Validate initialize if present
  if (instance.initialize && typeof instance.initialize !== 'function') {
    throw new RpcError(E.NOT_FUNCTION, `plugin '${name}' initialize must be a function`);
  }
  // 5. Validate cleanup if present
  if (instance.cleanup && typeof instance.cleanup !== 'function') {
    throw new RpcError(E.NOT_FUNCTION, `plugin '${name}' cleanup must be a function`);
  }
}

let llmConfig = null;

async function load({ name, module, config, llmConfig: llm }) {
  if (plugin) throw new RpcError(E.STATE, 'a module is already loaded in this host');
  if (typeof module !== 'string' || typeof name !== 'string') throw new RpcError(E.INVALID, 'load needs {name, module}');
  if (!existsSync(module)) throw new RpcError(E.NOT_FOUND, `plugin at ${module} does not exist`);
  let ns;
  try {
    ns = await import(pathToFileURL(module).href);
  } catch (e) {
    throw new RpcError(E.IMPORT, `cannot be imported: ${importFailure(e, module)}`);
  }
  let PluginClass = ns.default;
  // CommonJS interop: `import()` of a CommonJS file makes `module.exports` the
  // default export. `exports.default = class …` (what TypeScript and Babel
  // emit) is unwrapped, and an untouched `module.exports` ({}) is no export.
  const required = createRequire(import.meta.url).cache[realpathSync(module)];
  if (required && PluginClass === required.exports && PluginClass && typeof PluginClass === 'object') {
    if ('default' in PluginClass) PluginClass = PluginClass.default;
    else if (Object.keys(PluginClass).length === 0) PluginClass = undefined;
  }
  if (!PluginClass) throw new RpcError(E.NO_DEFAULT, `plugin at ${module} has no default export`);
  validatePluginShape(PluginClass, name);
  const instance = new PluginClass();
  if (instance.initialize) {
    try {
      await instance.initialize(config ?? {});
    } catch (e) {
      throw new RpcError(E.INITIALIZE, `failed to initialize plugin '${name}': ${describe(e)}`);
    }
  }
  plugin = instance;
  pluginName = name;
  llmConfig = llm && typeof llm === 'object' ? Object.freeze({ ...llm }) : null;
  return {
    methods: EXTENSION_POINTS.filter((m) => typeof instance[m] === 'function'),
    cleanup: typeof instance.cleanup === 'function',
    node: process.versions.node,
  };
}

function kind(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

async function hook({ method, payload, context, call }) {
  if (!plugin) throw new RpcError(E.STATE, 'no module is loaded in this host');
  if (!EXTENSION_POINTS.includes(method)) throw new RpcError(E.INVALID, `unknown extension point ${JSON.stringify(method)}`);
  if (typeof plugin[method] !== 'function') return { skipped: true };
  const abort = new AbortController();
  aborts.set(call, abort);
  const ctx = { ...(context ?? {}), llmConfig, agent, logger: logger(method, call), abortSignal: abort.signal };
  try {
    const value = await plugin[method](payload, ctx);
    return { returned: kind(value), value: value === undefined ? null : value };
  } catch (e) {
    throw new RpcError(E.THREW, `${method} threw ${describe(e)}`);
  } finally {
    aborts.delete(call);
  }
}

async function cleanup() {
  if (plugin && typeof plugin.cleanup === 'function') {
    try {
      await plugin.cleanup();
    } catch (e) {
      throw new RpcError(E.CLEANUP, `cleanup threw ${describe(e)}`);
    }
  }
  return {};
}

const METHODS = { load, hook, cleanup, ping: async () => ({}) };

async function serve(msg) {
  const fn = Object.hasOwn(METHODS, msg.method) ? METHODS[msg.method] : null;
  try {
    if (!fn) throw new RpcError(E.METHOD, `method not found: ${msg.method}`);
    const result = await fn(msg.params ?? {});
    send({ jsonrpc: '2.0', id: msg.id, result });
  } catch (e) {
    const code = e instanceof RpcError ? e.code : -32603;
    send({ jsonrpc: '2.0', id: msg.id, error: { code, message: e instanceof RpcError ? e.message : describe(e) } });
  }
}

// A module's stray rejection or throw is logged, not fatal: the host serves
// other calls. `process.exit()` still ends the host, and plugd restarts it.
process.on('unhandledRejection', (e) => process.stderr.write(`[ERROR] ${pluginName}: unhandled rejection: ${describe(e)}\n`));
process.on('uncaughtException', (e) => process.stderr.write(`[ERROR] ${pluginName}: uncaught exception: ${describe(e)}\n`));

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch {
    process.stderr.write(`[WARN] dexto host: unreadable frame from plugd: ${line.slice(0, 200)}\n`);
    return;
  }
  if (typeof msg?.method !== 'string') {
    // A reply to one of our requests.
    const slot = waiting.get(msg?.id);
    if (slot) {
      waiting.delete(msg.id);
      if (msg.error) slot.reject(new Error(`plugd: ${msg.error.message ?? 'storage call failed'}`));
      else slot.resolve(msg.result ?? {});
    }
    return;
  }
  if (msg.id === undefined || msg.id === null) {
    if (msg.method === 'cancel') {
      const call = msg.params?.call;
      aborts.get(call)?.abort(new Error('plugd gave up on this call (deadline)'));
      aborts.delete(call);
    }
    return;
  }
  serve(msg);
});
// plugd closed our stdin: it is gone or stopping us.
rl.on('close', () => process.exit(0));
