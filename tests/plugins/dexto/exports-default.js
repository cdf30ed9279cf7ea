// A CommonJS Dexto module as TypeScript/Babel emit it: `exports.default = class …`.
'use strict';
Object.defineProperty(exports, '__esModule', { value: true });
class EmittedPlugin {
  async beforeToolCall() {
    return { ok: true, modify: { form: 'exports.default' } };
  }
}
exports.default = EmittedPlugin;
