// Invalid: the default export is an object, not a class.
export default {
  async beforeToolCall() {
    return { ok: true };
  },
};
