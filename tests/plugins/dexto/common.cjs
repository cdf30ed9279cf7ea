// A CommonJS Dexto module: `module.exports = class …`.
module.exports = class CommonPlugin {
  async beforeToolCall(payload) {
    return { ok: true, modify: { form: 'module.exports', toolName: `${payload.toolName}!` } };
  }
};
