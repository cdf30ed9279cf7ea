// A Dexto plugin module for plugd's tests: what each call does is chosen by
// the payload's `act`. It implements three of the four extension points
// (not afterToolResult) so the missing one can be seen to pass.
import { appendFileSync, writeFileSync } from 'node:fs';

export default class Behave {
  async initialize(config) {
    this.config = config;
    // One line per initialize, so tests can count restarts.
    if (config.initMarker) appendFileSync(config.initMarker, `${process.pid}\n`);
  }

  async beforeLLMRequest(payload, context) {
    return this.act(payload, context);
  }

  async beforeToolCall(payload, context) {
    return this.act(payload, context);
  }

  async beforeResponse(payload, context) {
    return this.act(payload, context);
  }

  async act(payload, context) {
    switch (payload.act) {
      case 'modify':
        return {
          ok: true,
          modify: {
            tag: `${payload.tag ?? ''}${this.config.tag}`,
            pid: process.pid,
            seen: { sessionId: context.sessionId, userId: context.userId, tenantId: context.tenantId },
            config: this.config,
            llm: context.llmConfig ?? null,
          },
        };
      case 'block':
        return {
          ok: true,
          cancel: true,
          message: `blocked by ${this.config.tag}`,
          notices: [{ kind: 'block', code: 'TEST_BLOCK', message: 'not this one' }],
        };
      case 'throw':
        throw new Error('boom in hook');
      case 'hang':
        return new Promise(() => {});
      case 'spin':
        for (;;) {
          // a busy loop: the event loop never turns again
        }
      case 'exit':
        process.exit(1);
        break;
      case 'log':
        context.logger.warn('quota nearly used', { used: 99 });
        context.logger.info('plain info');
        return { ok: true };
      case 'chatty':
        console.log('console.log junk');
        console.info('{"jsonrpc":"2.0","id":1,"result":{"fake":true}}');
        process.stdout.write('raw stdout junk\n');
        return { ok: true, modify: { chatty: true } };
      case 'bad':
        return 'yes';
      case 'bad-ok':
        return { ok: 'yes' };
      default:
        return { ok: true };
    }
  }

  async cleanup() {
    if (this.config.cleanupMarker) writeFileSync(this.config.cleanupMarker, `cleaned ${process.pid}`);
  }
}
