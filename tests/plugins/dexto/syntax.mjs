// Invalid: a syntax error (on purpose).
export default class Broken {
  async beforeToolCall() {
    return { ok: true,, };
  }
}
