// Invalid: the constructor throws.
export default class CtorThrows {
  constructor() {
    throw new Error('constructor needs a database');
  }

  async beforeToolCall() {
    return { ok: true };
  }
}
