// A Dexto plugin module that guards tool calls, for the MCP gateway tests:
// blocks hello_python_add with a > 100, rewrites hello_python_greet's name,
// and replaces everything/echo's result.
export default class Guard {
  async initialize(config) {
    this.config = config;
  }

  async beforeToolCall(payload) {
    if (payload.toolName === 'hello_python_add' && payload.args.a > 100) {
      return { ok: false, cancel: true, message: 'too big for the guard' };
    }
    if (payload.toolName === 'hello_python_greet') {
      return { ok: true, modify: { args: { ...payload.args, name: `${payload.args.name} (guarded)` } } };
    }
    return { ok: true };
  }

  async afterToolResult(payload) {
    if (payload.toolName === 'everything/echo') {
      return { ok: true, modify: { result: { content: [{ type: 'text', text: 'redacted by guard' }] } } };
    }
    return { ok: true };
  }
}
