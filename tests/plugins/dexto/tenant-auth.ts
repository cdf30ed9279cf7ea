// agents/plugins/tenant-auth.ts

import type {
  DextoPlugin,
  ExecutionContext,
  PluginResult,
  BeforeLLMRequestPayload,
  BeforeToolCallPayload,
  AfterToolResultPayload,
} from '@dexto/core';

/**
 * Multi-tenant authentication and authorization plugin
 *
 * Responsibilities:
 * - Enforce tenant quotas before LLM requests
 * - Check tool access permissions before tool calls
 * - Audit all operations after tool execution
 */
export default class TenantAuthPlugin implements DextoPlugin {
  private config: {
    enforceQuota: boolean;
    checkToolAccess: boolean;
  };

  async initialize(config: any) {
    this.config = config;
  }

  async beforeLLMRequest(
    payload: BeforeLLMRequestPayload,
    context: ExecutionContext
  ): Promise<PluginResult> {
    if (!this.config.enforceQuota) {
      return { ok: true };
    }

    const { tenantId } = context;
    if (!tenantId) {
      // Not a multi-tenant request
      return { ok: true };
    }

    // Query tenant quota from storage
    const usage = await this.getTenantUsageToday(tenantId, context);
    const quota = await this.getTenantQuota(tenantId, context);

    if (usage.tokens >= quota.tokensPerDay) {
      return {
        ok: false,
        cancel: true,
        message: 'Daily token limit exceeded. Please upgrade your plan or try again tomorrow.',
        notices: [{
          kind: 'block',
          code: 'QUOTA_EXCEEDED',
          message: `Tenant ${tenantId} exceeded quota`,
          details: { used: usage.tokens, limit: quota.tokensPerDay }
        }]
      };
    }

    return { ok: true };
  }

  async beforeToolCall(
    payload: BeforeToolCallPayload,
    context: ExecutionContext
  ): Promise<PluginResult> {
    if (!this.config.checkToolAccess) {
      return { ok: true };
    }

    const { tenantId } = context;
    if (!tenantId) {
      return { ok: true };
    }

    // Query allowed tools for tenant
    const allowedTools = await this.getAllowedTools(tenantId, context);

    if (!allowedTools.includes(payload.toolName)) {
      return {
        ok: false,
        cancel: true,
        message: `Tool '${payload.toolName}' is not available on your plan.`,
        notices: [{
          kind: 'block',
          code: 'TOOL_NOT_ALLOWED',
          message: `Tenant ${tenantId} attempted to use restricted tool`,
          details: { toolName: payload.toolName, allowed: allowedTools }
        }]
      };
    }

    return { ok: true };
  }

  async afterToolResult(
    payload: AfterToolResultPayload,
    context: ExecutionContext
  ): Promise<PluginResult> {
    const { tenantId, userId } = context;

    // Record tool usage for billing/analytics
    await this.recordToolUsage(tenantId, payload.toolName, context);

    // Audit log
    context.logger.info('Tool execution completed', {
      tenant: tenantId,
      user: userId,
      tool: payload.toolName,
      success: payload.success,
      sessionId: payload.sessionId
    });

    return { ok: true };
  }

  // Helper methods (not part of DextoPlugin interface)
  private async getTenantUsageToday(tenantId: string, context: ExecutionContext) {
    const db = context.agent.storage.database;
    const key = `tenant:${tenantId}:usage:${new Date().toISOString().split('T')[0]}`;
    return await db.get(key) || { tokens: 0, requests: 0 };
  }

  private async getTenantQuota(tenantId: string, context: ExecutionContext) {
    const db = context.agent.storage.database;
    const key = `tenant:${tenantId}:quota`;
    return await db.get(key) || { tokensPerDay: 100000, requestsPerMinute: 60 };
  }

  private async getAllowedTools(tenantId: string, context: ExecutionContext) {
    const db = context.agent.storage.database;
    const key = `tenant:${tenantId}:allowed_tools`;
    return await db.get(key) || ['*']; // Default: all tools
  }

  private async recordToolUsage(tenantId: string, toolName: string, context: ExecutionContext) {
    const db = context.agent.storage.database;
    const key = `tenant:${tenantId}:usage:tools`;
    const usage = await db.get(key) || {};
    usage[toolName] = (usage[toolName] || 0) + 1;
    await db.set(key, usage);
  }
}
