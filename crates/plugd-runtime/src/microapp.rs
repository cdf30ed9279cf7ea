//! The runtime side of the nexo microapp contract (seed 001): the binding
//! context and inbound reference agent turns put on `tools/call`, the
//! notifications microapps get (`nexo/notify/transcript_appended`,
//! `nexo/notify/agent_event`, `agents/updated` followed by a `tools/list`
//! refresh), and the `nexo/admin/*` methods plugd can back.
//!
//! **Agents.** plugd runs one agent, configured by `plugd.yaml` (`agent:`,
//! `llm:`, `tenant:`); its id is `tenant.agent_id`, or [`DEFAULT_AGENT_ID`].
//! Its bindings are the channel kinds the workspace's channel plugins serve,
//! in [`Runtime::channel_kinds`] order (`binding_index` is the position,
//! `binding_id` is `<channel>:<account_id or "default">`, the seed's form).
//!
//! **Admin.** The `nexo/admin/*` methods are a host service of the agent
//! side (`plugd_agent::microapp_admin`, reached through
//! [`crate::agent_seam::AgentParts::microapp_admin`]).

use std::time::{SystemTime, UNIX_EPOCH};

use plugd_dialects::microapp::notify;
use serde_json::{Value, json};

use crate::Runtime;
use crate::config::PlugdConfig;
use crate::hooks::HookContext;
use crate::llm::LlmConfig;

/// The id of plugd's agent when `tenant.agent_id` names none.
pub const DEFAULT_AGENT_ID: &str = "default";

/// Most entries one `nexo/admin/transcripts/read` returns.
pub const MAX_TRANSCRIPT_READ: usize = 500;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The seed's inbound message reference of a channel message:
/// `{kind: "<channel>_message", from, ts_ms, session_id}`.
pub fn inbound_reference(channel: &str, from: &str, ts_ms: u64, session_id: &str) -> Value {
    json!({
        "kind": format!("{channel}_message"),
        "from": from,
        "ts_ms": ts_ms,
        "session_id": session_id,
    })
}

/// The agent id of a turn context.
pub fn agent_id(ctx: &HookContext) -> String {
    ctx.agent_id
        .clone()
        .unwrap_or_else(|| DEFAULT_AGENT_ID.to_owned())
}

impl Runtime {
    /// The seed's `binding_context` of a turn with context `ctx`: the agent,
    /// the channel the turn came from (`null` for HTTP and CLI turns that
    /// name none), the account (`account_id`, else the tenant), the binding
    /// id and its index among the channels this plugd serves.
    pub fn binding_context(&self, ctx: &HookContext) -> Value {
        let set = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let account = set(&ctx.account_id).or_else(|| set(&ctx.tenant_id));
        let channel = set(&ctx.channel);
        let binding_id = channel
            .as_deref()
            .map(|c| format!("{c}:{}", account.as_deref().unwrap_or("default")));
        let binding_index = channel.as_deref().and_then(|c| {
            self.channel_kinds()
                .iter()
                .position(|(k, _)| k.as_str() == c)
        });
        json!({
            "agent_id": agent_id(ctx),
            "channel": channel,
            "account_id": account,
            "binding_id": binding_id,
            "binding_index": binding_index,
        })
    }

    /// Sends notification `method` to every running microapp whose entry may
    /// receive it (see `notification_capability`); returns how many got it.
    /// Idle microapps are not started for a notification; a full queue sheds
    /// it (logged).
    pub fn notify_microapps(&self, method: &str, params: &Value) -> usize {
        let mut sent = 0;
        for (id, sup) in self.inner.plugins.iter() {
            if sup.spec().microapp.is_none() {
                continue;
            }
            let Some(conn) = sup.current() else { continue };
            match notify(&conn, method, params.clone()) {
                Ok(true) => sent += 1,
                Ok(false) => {
                    tracing::warn!(plugin = %id, %method, "notification shed: the microapp's queue is full")
                }
                Err(why) => tracing::trace!(plugin = %id, %method, "not sent: {why}"),
            }
        }
        sent
    }

    /// What a turn appended to session `session_id` (entries `(role, body)`,
    /// the first at transcript position `first_seq`), to the microapps
    /// holding `transcripts_subscribe`: one `nexo/notify/transcript_appended
    /// {session_id, role, body, ts_ms}` and one `nexo/notify/agent_event
    /// {kind: "transcript_appended", agent_id, payload}` per entry.
    pub fn notify_transcript(
        &self,
        agent: &str,
        session_id: &str,
        first_seq: usize,
        entries: &[(&str, &str)],
    ) {
        if !self.any_microapp() {
            return;
        }
        let ts_ms = now_ms();
        for (i, (role, body)) in entries.iter().enumerate() {
            self.notify_microapps(
                "nexo/notify/transcript_appended",
                &json!({"session_id": session_id, "role": role, "body": body, "ts_ms": ts_ms}),
            );
            self.notify_microapps(
                "nexo/notify/agent_event",
                &json!({
                    "kind": "transcript_appended",
                    "agent_id": agent,
                    "payload": {
                        "session_id": session_id,
                        "seq": first_seq + i,
                        "role": role,
                        "body": body,
                        "ts_ms": ts_ms,
                    },
                }),
            );
        }
    }

    /// `nexo/notify/agent_event {kind, agent_id, payload}` to the microapps
    /// holding `transcripts_subscribe`.
    pub fn notify_agent_event(&self, kind: &str, agent: &str, payload: Value) {
        if !self.any_microapp() {
            return;
        }
        self.notify_microapps(
            "nexo/notify/agent_event",
            &json!({"kind": kind, "agent_id": agent, "payload": payload}),
        );
    }

    /// The ids of the workspace's microapps.
    pub fn microapp_ids(&self) -> Vec<String> {
        self.inner
            .plugins
            .iter()
            .filter(|(_, s)| s.spec().microapp.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn any_microapp(&self) -> bool {
        self.inner
            .plugins
            .values()
            .any(|s| s.spec().microapp.is_some())
    }

    /// The agents of `config` as `agents/get` shows them (one: plugd's).
    pub fn agents(&self, config: &PlugdConfig) -> Vec<Value> {
        let id = config
            .tenant
            .agent_id
            .clone()
            .unwrap_or_else(|| DEFAULT_AGENT_ID.to_owned());
        let (provider, model) = match &config.llm {
            Some(LlmConfig::Openai { model, .. }) => {
                (Some("openai".to_owned()), Some(model.clone()))
            }
            Some(LlmConfig::Plugin { plugin, model, .. }) => {
                (Some(format!("plugin:{plugin}")), Some(model.clone()))
            }
            Some(LlmConfig::Scripted { .. }) => (Some("scripted".to_owned()), None),
            None => (None, None),
        };
        let account = config
            .tenant
            .account_id
            .clone()
            .or_else(|| config.tenant.tenant_id.clone());
        let bindings: Vec<Value> = self
            .channel_kinds()
            .into_iter()
            .enumerate()
            .map(|(i, (kind, plugin))| {
                json!({
                    "channel": kind,
                    "plugin": plugin,
                    "instance": null,
                    "binding_id": format!("{kind}:{}", account.as_deref().unwrap_or("default")),
                    "binding_index": i,
                })
            })
            .collect();
        vec![json!({
            "id": id,
            "active": true,
            "model_provider": provider,
            "model": model,
            "system_prompt": config.agent.system_prompt,
            "max_tool_rounds": config.agent.max_tool_rounds,
            "tenant_id": config.tenant.tenant_id,
            "account_id": account,
            "inbound_bindings": bindings,
        })]
    }

    /// `agents/updated {agent_ids}` to every running microapp, then
    /// `tools/list` again for each (the binding surface changed).
    pub async fn agents_updated(&self, agent_ids: &[String]) {
        self.notify_microapps("agents/updated", &json!({"agent_ids": agent_ids}));
        for (id, sup) in self.inner.plugins.iter() {
            if sup.spec().microapp.is_none() || sup.current().is_none() {
                continue;
            }
            if let Err(e) = sup.refresh_tools().await {
                tracing::warn!(plugin = %id, "tools/list after agents/updated failed: {e}");
            }
        }
    }
}
