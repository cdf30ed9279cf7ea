// A Dexto module that calls every `context.agent` manager plugd offers and
// records what it sees in the agent's storage (`probe:<name>:*` keys), for
// tests/it/dexto.rs to assert on.
//
//   beforeLLMRequest agentEventBus.on for the names in config.listen (first
//                    call), sessionManager, toolManager, mcpManager,
//                    stateManager, read-only checks, then agentEventBus.emit
//                    of config.emit
//   beforeResponse   waits (bounded) for config.expect events and records them
export default class AgentProbe {
  async initialize(config) {
    this.config = config;
    this.events = [];
    this.listen = config.listen ?? [];
    this.subscribed = false;
  }

  key(what) {
    return `probe:${this.config.name}:${what}`;
  }

  async beforeLLMRequest(payload, context) {
    const a = context.agent;
    if (!this.subscribed) {
      // On the first call: the bus comes with the context.
      this.subscribed = true;
      for (const name of this.listen) a.agentEventBus.on(name, (p) => this.events.push({ name, payload: p }));
      await a.agentEventBus.ready();
    }
    const seen = {};
    const sm = a.sessionManager;
    seen.sessions = await sm.listSessions();
    const s = await sm.getSession(this.config.session);
    seen.session = s ? { id: s.id, metadata: s.metadata, history: await s.getHistory() } : null;
    seen.lastTwo = (await sm.getSessionHistory(this.config.session, 2)).map((m) => m.content);
    seen.metadata = await sm.getSessionMetadata(this.config.session);
    seen.missing = (await sm.getSession('no-such-session')) === undefined;
    seen.traversal = (await sm.getSession('../other-workspace')) === undefined;
    try {
      await sm.getSessionHistory('no-such-session');
      seen.missingHistory = 'resolved';
    } catch (e) {
      seen.missingHistory = e.message;
    }
    try {
      await sm.getSessionHistory(this.config.session, 100000);
      seen.hugeLimit = 'resolved';
    } catch (e) {
      seen.hugeLimit = e.message;
    }

    const tools = await a.toolManager.getAllTools();
    seen.tools = Object.keys(tools).sort();
    seen.echo = tools[this.config.tool] ?? null;
    seen.hasTool = await a.toolManager.hasTool(this.config.tool);
    seen.hasNoTool = await a.toolManager.hasTool('no/such-tool');

    const clients = await a.mcpManager.getClients();
    seen.mcp = [];
    for (const [name, c] of clients) {
      seen.mcp.push({ name, transport: c.transport, state: c.state, tools: Object.keys(await c.getTools()).sort() });
    }
    seen.mcpTools = Object.keys(await a.mcpManager.getAllTools()).sort();
    seen.failed = await a.mcpManager.getFailedConnections();

    seen.llm = a.stateManager.getLLMConfig(context.sessionId);
    seen.runtime = a.stateManager.getRuntimeConfig(context.sessionId);
    seen.llmIsContextLlm = JSON.stringify(seen.llm) === JSON.stringify(context.llmConfig);

    seen.frozen = Object.isFrozen(a) && Object.isFrozen(sm) && Object.isFrozen(a.toolManager);
    seen.noWrites = ['createSession', 'deleteSession', 'executeTool', 'updateLLM'].filter(
      (m) => m in sm || m in a.toolManager || m in a.mcpManager || m in a.stateManager,
    );
    try {
      a.sessionManager.createSession = () => 1;
      seen.assign = 'allowed';
    } catch (e) {
      seen.assign = e.constructor.name;
    }
    try {
      a.agentEventBus.emit('bad.name', {});
      seen.badName = 'sent';
    } catch (e) {
      seen.badName = e.message;
    }
    try {
      a.agentEventBus.emit('too:big', 'x'.repeat(70 * 1024));
      seen.bigPayload = 'sent';
    } catch (e) {
      seen.bigPayload = e.message;
    }
    seen.listenerCount = this.listen.map((n) => a.agentEventBus.listenerCount(n));
    await a.storage.database.set(this.key('seen'), seen);
    for (const e of this.config.emit ?? []) a.agentEventBus.emit(e.name, e.payload);
    return { ok: true };
  }

  async beforeResponse(payload, context) {
    // Events come back through plugd's bus; wait (bounded) for the expected ones.
    const want = this.config.expect ?? 0;
    for (let i = 0; i < 100 && this.events.length < want; i++) await new Promise((r) => setTimeout(r, 50));
    await context.agent.storage.database.set(this.key('events'), this.events);
    return { ok: true };
  }
}
