// arg-tagger.mjs: a Dexto plugin module for plugd's agent-turn tests.
// beforeToolCall appends config.tag to args.trail, so a chain of taggers
// shows in the tool's arguments the order the hooks ran in.
export default class ArgTagger {
  async initialize(config) {
    this.tag = String(config.tag ?? '?');
  }

  async beforeToolCall(payload) {
    const args = { ...(payload.args ?? {}) };
    args.trail = `${args.trail ?? ''}${this.tag}`;
    return { ok: true, modify: { args }, notices: [{ kind: 'info', code: `TAGGED_${this.tag}`, message: `tagged ${this.tag}` }] };
  }
}
