// A TypeScript Dexto module (needs Node 22.6+ or tsx).
interface PluginResult {
  ok: boolean;
  modify?: Record<string, unknown>;
}

export default class Typed {
  async beforeToolCall(payload: { toolName: string }): Promise<PluginResult> {
    return { ok: true, modify: { typed: payload.toolName } };
  }
}
