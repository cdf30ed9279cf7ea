// result-guard.mjs: a Dexto plugin module for plugd's agent-turn tests.
// afterToolResult replaces a result that mentions "secret" with a redacted
// marker, and blocks the turn when the tool echoed {"block": true}.
export default class ResultGuard {
  async afterToolResult(payload) {
    const text = JSON.stringify(payload.result ?? null);
    if (payload.result?.echo?.block === true) {
      return {
        ok: true,
        cancel: true,
        message: `the result of ${payload.toolName} may not reach the model`,
        notices: [{ kind: 'block', code: 'RESULT_BLOCKED', message: 'blocked a tool result' }],
      };
    }
    if (text.includes('secret')) {
      return {
        ok: true,
        modify: { result: { redacted: true } },
        notices: [{ kind: 'info', code: 'RESULT_REDACTED', message: 'redacted a tool result' }],
      };
    }
    return { ok: true };
  }
}
