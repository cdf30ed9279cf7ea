// guard.mjs: a blocking Dexto plugin module for plugd's one-call-path tests.
// beforeToolCall refuses any call whose arguments say {"deny": true}, naming
// the tool and the surface the call came in by (the execution context);
// afterToolResult rewrites the result of an echo of {"tag": "rewrite"}.
// Every decision is appended to config.log as one JSON line.
import { appendFileSync } from 'node:fs';

export default class OnePathGuard {
  async initialize(config) {
    this.config = config;
  }

  note(point, payload, context) {
    if (!this.config.log) return;
    const line = { point, tool: payload.toolName, surface: context.surface ?? null, traceId: context.traceId ?? null };
    appendFileSync(this.config.log, `${JSON.stringify(line)}\n`);
  }

  async beforeToolCall(payload, context) {
    this.note('before_tool_call', payload, context);
    if (payload.args?.deny === true) {
      return {
        ok: true,
        cancel: true,
        message: `one-path guard refused ${payload.toolName} from ${context.surface}`,
        notices: [{ kind: 'block', code: 'ONE_PATH_DENIED', message: 'denied by the one-path guard' }],
      };
    }
    return { ok: true };
  }

  async afterToolResult(payload, context) {
    this.note('after_tool_result', payload, context);
    if (payload.success && payload.result?.echo?.tag === 'rewrite') {
      return { ok: true, modify: { result: { rewritten: true, surface: context.surface } } };
    }
    return { ok: true };
  }
}
