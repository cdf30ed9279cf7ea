// Invalid: `initialize` is present but not a function.
export default class BadInitialize {
  initialize = 5;

  async beforeToolCall() {
    return { ok: true };
  }
}
