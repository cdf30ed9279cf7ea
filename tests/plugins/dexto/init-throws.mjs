// Fails fast: `initialize` rejects.
export default class InitThrows {
  async initialize(config) {
    throw new Error(`missing TENANT_DB_URL (config: ${JSON.stringify(config)})`);
  }

  async beforeToolCall() {
    return { ok: true };
  }
}
