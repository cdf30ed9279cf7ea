// Invalid: no default export.
export class Named {
  async beforeToolCall() {
    return { ok: true };
  }
}
