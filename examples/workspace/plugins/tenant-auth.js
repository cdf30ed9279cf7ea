// tenant-auth: the multi-tenant authentication plugin of the Dexto plugin
// specification (seed 002, "Example: Tenant Auth Plugin"), in JavaScript.
//
// Responsibilities (as in the seed):
// - enforce tenant quotas before LLM requests      (QUOTA_EXCEEDED)
// - check tool access permissions before tool calls (TOOL_NOT_ALLOWED)
// - audit all operations after tool execution      (context.logger.info)
//
// Adapted for plugd, which runs this file unmodified in its Node host:
// - TypeScript types removed; `export default class` as in the seed.
// - Dexto reads usage, quotas and allowed tools from its storage backends
//   (`context.agent.storage`). plugd hands modules no storage, so they come
//   from `config.tenants` (same shapes as the seed's storage records), and
//   otherwise from the DEMO_TENANTS table below.
// - A request with a tenant id that is in neither is refused with
//   UNAUTHORIZED, the notice code the seed's HTTP mapping turns into 401.
//   Requests without a tenant id pass, as in the seed.
// - `checkToolAccess` defaults to true (the seed reads it from config; the
//   issue's example config only sets `enforceQuota`). Allowed tools may be
//   ['*'], the seed's default, meaning every tool.
// - Usage is recorded in memory (the seed writes it to storage).
//
// Configure it in plugd.yaml:
//   plugins:
//     custom:
//       - name: tenant-auth
//         module: "${{dexto.agent_dir}}/plugins/tenant-auth.js"
//         blocking: true
//         priority: 100
//         config: {enforceQuota: true}

const DEMO_TENANTS = {
  // Well within quota, every tool.
  acme: {
    usage: { tokens: 1200, requests: 4 },
    quota: { tokensPerDay: 100000, requestsPerMinute: 60 },
    allowedTools: ['*'],
  },
  // Used up today's tokens.
  globex: {
    usage: { tokens: 100000, requests: 310 },
    quota: { tokensPerDay: 100000, requestsPerMinute: 60 },
    allowedTools: ['*'],
  },
  // A plan with one tool.
  initech: {
    usage: { tokens: 0, requests: 0 },
    quota: { tokensPerDay: 5000, requestsPerMinute: 10 },
    allowedTools: ['hello_python_greet'],
  },
};

/**
 * Multi-tenant authentication and authorization plugin.
 */
export default class TenantAuthPlugin {
  async initialize(config) {
    this.config = config ?? {};
    this.tenants = this.config.tenants ?? DEMO_TENANTS;
    this.toolUsage = new Map();
  }

  async beforeLLMRequest(payload, context) {
    const { tenantId } = context;
    if (!tenantId) {
      // Not a multi-tenant request
      return { ok: true };
    }
    const unknown = this.unauthorized(tenantId);
    if (unknown) return unknown;

    if (!this.config.enforceQuota) {
      return { ok: true };
    }

    const usage = await this.getTenantUsageToday(tenantId);
    const quota = await this.getTenantQuota(tenantId);

    if (usage.tokens >= quota.tokensPerDay) {
      return {
        ok: false,
        cancel: true,
        message: 'Daily token limit exceeded. Please upgrade your plan or try again tomorrow.',
        notices: [
          {
            kind: 'block',
            code: 'QUOTA_EXCEEDED',
            message: `Tenant ${tenantId} exceeded quota`,
            details: { used: usage.tokens, limit: quota.tokensPerDay },
          },
        ],
      };
    }

    return { ok: true };
  }

  async beforeToolCall(payload, context) {
    if (this.config.checkToolAccess === false) {
      return { ok: true };
    }

    const { tenantId } = context;
    if (!tenantId) {
      return { ok: true };
    }
    const unknown = this.unauthorized(tenantId);
    if (unknown) return unknown;

    const allowedTools = await this.getAllowedTools(tenantId);

    if (!allowedTools.includes('*') && !allowedTools.includes(payload.toolName)) {
      return {
        ok: false,
        cancel: true,
        message: `Tool '${payload.toolName}' is not available on your plan.`,
        notices: [
          {
            kind: 'block',
            code: 'TOOL_NOT_ALLOWED',
            message: `Tenant ${tenantId} attempted to use restricted tool`,
            details: { toolName: payload.toolName, allowed: allowedTools },
          },
        ],
      };
    }

    return { ok: true };
  }

  async afterToolResult(payload, context) {
    const { tenantId, userId } = context;

    // Record tool usage for billing/analytics
    await this.recordToolUsage(tenantId, payload.toolName);

    // Audit log
    context.logger.info('Tool execution completed', {
      tenant: tenantId,
      user: userId,
      tool: payload.toolName,
      success: payload.success,
      sessionId: payload.sessionId,
    });

    return { ok: true };
  }

  // Helper methods (not part of the DextoPlugin interface)

  unauthorized(tenantId) {
    if (Object.hasOwn(this.tenants, tenantId)) return null;
    return {
      ok: false,
      cancel: true,
      message: 'Unknown tenant. Check your API key.',
      notices: [
        {
          kind: 'block',
          code: 'UNAUTHORIZED',
          message: `Tenant ${tenantId} is not known`,
          details: { tenantId },
        },
      ],
    };
  }

  async getTenantUsageToday(tenantId) {
    return this.tenants[tenantId]?.usage ?? { tokens: 0, requests: 0 };
  }

  async getTenantQuota(tenantId) {
    return this.tenants[tenantId]?.quota ?? { tokensPerDay: 100000, requestsPerMinute: 60 };
  }

  async getAllowedTools(tenantId) {
    return this.tenants[tenantId]?.allowedTools ?? ['*']; // Default: all tools
  }

  async recordToolUsage(tenantId, toolName) {
    const key = `tenant:${tenantId}:tool:${toolName}`;
    this.toolUsage.set(key, (this.toolUsage.get(key) ?? 0) + 1);
  }
}
