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
//                             event {name, payload, source, id, timestamp}
//                             (bus subject dexto.agent.<name>, to agentEventBus listeners)
// Notifications to plugd:     log {level, message, data, method, call}
//                             events.emit {name, payload}   (agentEventBus.emit)
// Requests to plugd (context.agent, served by crates/plugd-runtime/src/hooks/dexto_agent.rs):
//   storage.get|set|delete|list {space, key|prefix, value}   storage.database|cache
//   sessions.list|get|history {id, limit}                     sessionManager
//   tools.list {}                                             toolManager
//   mcp.list {}                                               mcpManager
//   events.subscribe|unsubscribe {name}                       agentEventBus.on|off
// stateManager answers from the snapshot `load` brings (llmConfig, runtimeConfig).
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
let llmConfig = null;
let runtimeConfig = null;

// Dexto's times are epoch milliseconds; plugd sends RFC 3339.
const millis = (t) => {
  const n = typeof t === 'string' ? Date.parse(t) : NaN;
  return Number.isNaN(n) ? undefined : n;
};

// `context.agent.sessionManager`: read-only, plugd's stored sessions.
function sessionMetadata(s) {
  return Object.freeze({ createdAt: millis(s.createdAt), lastActivity: millis(s.lastActivity), messageCount: s.messageCount });
}
async function sessionHistory(id, limit) {
  const params = { id: String(id) };
  if (limit !== undefined) params.limit = limit;
  const { messages } = await request('sessions.history', params);
  return messages.map((m) => ({ ...m, timestamp: millis(m.timestamp) }));
}
async function sessionRow(id) {
  return (await request('sessions.get', { id: String(id) })).session ?? undefined;
}
const sessionManager = Object.freeze({
  listSessions: async () => (await request('sessions.list', {})).ids,
  getSession: async (id) => {
    const s = await sessionRow(id);
    if (!s) return undefined;
    return Object.freeze({ id: s.id, metadata: sessionMetadata(s), getHistory: (limit) => sessionHistory(s.id, limit) });
  },
  getSessionMetadata: async (id) => {
    const s = await sessionRow(id);
    return s ? sessionMetadata(s) : undefined;
  },
  getSessionHistory: (id, limit) => sessionHistory(id, limit),
});

// Dexto's ToolSet: {[name]: {name, description, parameters}}.
function toolSet(list) {
  const set = {};
  for (const t of list) set[t.name] = Object.freeze({ name: t.name, description: t.description, parameters: t.parameters });
  return Object.freeze(set);
}
const agentTools = async () => (await request('tools.list', {})).tools;
const toolManager = Object.freeze({
  getAllTools: async () => toolSet(await agentTools()),
  getToolNames: async () => (await agentTools()).map((t) => t.name),
  hasTool: async (name) => (await agentTools()).some((t) => t.name === name),
});

const mcpServers = async () => (await request('mcp.list', {})).servers;
const mcpManager = Object.freeze({
  getClients: async () =>
    new Map(
      (await mcpServers()).map((s) => [
        s.name,
        Object.freeze({ name: s.name, transport: s.transport, state: s.state, getTools: async () => toolSet(s.tools) }),
      ]),
    ),
  getAllTools: async () => toolSet((await mcpServers()).flatMap((s) => s.tools)),
  getFailedConnections: async () =>
    Object.fromEntries(
      (await mcpServers())
        .filter((s) => s.state === 'failed')
        .map((s) => [s.name, `plugd reports MCP server ${s.name} failed; see \`plugd plugin show ${s.name}\``]),
    ),
});

// The agent's effective configuration as plugd loaded it (no secrets).
const stateManager = Object.freeze({
  getLLMConfig: () => llmConfig,
  getRuntimeConfig: () => runtimeConfig,
});

// `agentEventBus`: EventEmitter-style, bridged to plugd's bus on subjects
// `dexto.agent.<name>`. Subscriptions and emits go out in program order (one
// chain), so `on(x)` then `emit(x)` reaches the listener; listeners are
// called with the payload when the event comes back from the bus, the
// module's own emits included.
const EVENT_NAME = /^[A-Za-z0-9_:-]{1,128}$/;
const MAX_EVENT_PAYLOAD = 64 * 1024;
const listeners = new Map();
let busChain = Promise.resolve();
function busOp(op) {
  busChain = busChain.then(op).catch((e) => process.stderr.write(`[ERROR] ${pluginName}: agentEventBus: ${describe(e)}\n`));
}
function checkEventName(name) {
  if (typeof name !== 'string' || !EVENT_NAME.test(name)) {
    throw new TypeError(`agentEventBus: event name ${JSON.stringify(String(name)).slice(0, 80)} is not 1-128 letters, digits, '_', '-' or ':'`);
  }
}
function addListener(name, fn, once) {
  checkEventName(name);
  if (typeof fn !== 'function') throw new TypeError(`agentEventBus: the listener of ${name} must be a function`);
  let list = listeners.get(name);
  if (!list) {
    list = [];
    listeners.set(name, list);
    busOp(() => request('events.subscribe', { name }));
  }
  list.push({ fn, once });
}
function removeListener(name, fn) {
  const list = listeners.get(name);
  if (!list) return;
  const i = list.findIndex((l) => l.fn === fn);
  if (i >= 0) list.splice(i, 1);
  if (list.length === 0) {
    listeners.delete(name);
    busOp(() => request('events.unsubscribe', { name }));
  }
}
const agentEventBus = Object.freeze({
  on(name, fn) {
    addListener(name, fn, false);
    return this;
  },
  addListener(name, fn) {
    addListener(name, fn, false);
    return this;
  },
  once(name, fn) {
    addListener(name, fn, true);
    return this;
  },
  off(name, fn) {
    removeListener(name, fn);
    return this;
  },
  removeListener(name, fn) {
    removeListener(name, fn);
    return this;
  },
  removeAllListeners(name) {
    for (const n of name === undefined ? [...listeners.keys()] : [name]) {
      for (const l of [...(listeners.get(n) ?? [])]) removeListener(n, l.fn);
    }
    return this;
  },
  listenerCount: (name) => listeners.get(name)?.length ?? 0,
  // plugd's addition: resolves once the subscriptions and emits made so far
  // have reached plugd (an event published after it reaches the listeners).
  ready: () => busChain,
  emit(name, payload) {
    checkEventName(name);
    const value = payload === undefined ? null : safeData(payload);
    const size = Buffer.byteLength(JSON.stringify(value));
    if (size > MAX_EVENT_PAYLOAD) throw new RangeError(`agentEventBus: the payload of ${name} is ${size} bytes; at most ${MAX_EVENT_PAYLOAD}`);
    busOp(() => send({ jsonrpc: '2.0', method: 'events.emit', params: { name, payload: value } }));
    return true;
  },
});
function deliver({ name, payload }) {
  for (const l of [...(listeners.get(name) ?? [])]) {
    if (l.once) removeListener(name, l.fn);
    try {
      const r = l.fn(payload);
      if (r && typeof r.catch === 'function') r.catch((e) => process.stderr.write(`[ERROR] ${pluginName}: listener of ${name} rejected: ${describe(e)}\n`));
    } catch (e) {
      process.stderr.write(`[ERROR] ${pluginName}: listener of ${name} threw: ${describe(e)}\n`);
    }
  }
}

const agent = Object.freeze({
  sessionManager,
  toolManager,
  mcpManager,
  stateManager,
  agentEventBus,
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

async function load({ name, module, config, llmConfig: llm, runtimeConfig: runtime }) {
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
  // stateManager answers from here on, `initialize` included.
  llmConfig = llm && typeof llm === 'object' ? Object.freeze({ ...llm }) : null;
  runtimeConfig = runtime && typeof runtime === 'object' ? deepFreeze(runtime) : null;
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
  return {
    methods: EXTENSION_POINTS.filter((m) => typeof instance[m] === 'function'),
    cleanup: typeof instance.cleanup === 'function',
    node: process.versions.node,
  };
}

function deepFreeze(v) {
  if (v && typeof v === 'object') {
    for (const x of Object.values(v)) deepFreeze(x);
    Object.freeze(v);
  }
  return v;
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
      if (msg.error) slot.reject(new Error(`plugd: ${msg.error.message ?? 'request failed'}`));
      else slot.resolve(msg.result ?? {});
    }
    return;
  }
  if (msg.id === undefined || msg.id === null) {
    if (msg.method === 'event') {
      deliver(msg.params ?? {});
      return;
    }
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
