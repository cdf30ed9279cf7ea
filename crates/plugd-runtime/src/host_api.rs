//! The runtime's side of the services native plugins call (nexo contract
//! §5.1-§5.4): the bus, long-term memory (keyword or semantic recall, see
//! `recall.rs`), and `llm.complete` through the provider of `plugd.yaml`'s
//! `llm:` section.
//!
//! The LLM provider is built on first use (a workspace without `llm:` answers
//! `-32603 llm not configured`), from the configuration as it is then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use plugd_host::bus::{Bus, LocalBus};
use plugd_host::extensions::{ChannelError, OutboundMessage};
use plugd_host::native_host::{
    AdminFuture, ApiFuture, BrokerCounters, CompleteRequest, CompleteUsage, Completion,
    DispatchFuture, HostApi, ServiceError,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::config::PlugdConfig;
use crate::llm::{ChatMessage, ChatRequest, Delta, FinishReason, LlmConfig, LlmProvider, Role};
use crate::recall::RecallError;
use crate::{RtInner, Runtime};

/// The workspace's LLM provider and the name plugins ask for it by, or why
/// there is none.
type Provider = (Arc<dyn LlmProvider>, String);

/// The services a [`Runtime`] offers its native plugins.
pub(crate) struct RuntimeApi {
    bus: Arc<LocalBus>,
    counters: Mutex<HashMap<String, Arc<BrokerCounters>>>,
    runtime: OnceLock<Weak<RtInner>>,
    llm: tokio::sync::OnceCell<Provider>,
    next_event: AtomicU64,
}

impl RuntimeApi {
    pub(crate) fn new() -> RuntimeApi {
        RuntimeApi {
            bus: Arc::new(LocalBus::new()),
            counters: Mutex::new(HashMap::new()),
            runtime: OnceLock::new(),
            llm: tokio::sync::OnceCell::new(),
            next_event: AtomicU64::new(0),
        }
    }

    /// Binds the runtime (for plugin LLM providers and the workspace
    /// configuration); called once [`Runtime::open`] built it.
    pub(crate) fn bind(&self, runtime: &Runtime) {
        let _ = self.runtime.set(Arc::downgrade(&runtime.inner));
    }

    pub(crate) fn local_bus(&self) -> &Arc<LocalBus> {
        &self.bus
    }

    /// The broker counters of every plugin seen so far.
    pub(crate) fn counters_of(&self, plugin: &str) -> Option<Arc<BrokerCounters>> {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(plugin)
            .cloned()
    }

    async fn provider(&self) -> Result<(Arc<dyn LlmProvider>, String), ServiceError> {
        let built = self
            .llm
            .get_or_try_init(|| async {
                let runtime = self
                    .runtime
                    .get()
                    .and_then(Weak::upgrade)
                    .map(|inner| Runtime { inner })
                    .ok_or_else(|| "llm not configured: the runtime is shutting down".to_owned())?;
                let config = PlugdConfig::load(runtime.dir())
                    .map_err(|e| format!("llm not configured: {e}"))?;
                let llm = config.llm.as_ref().ok_or_else(|| {
                    format!(
                        "llm not configured: {} has no llm: section",
                        runtime.dir().join(crate::config::CONFIG_FILE).display()
                    )
                })?;
                let kind = match llm {
                    LlmConfig::Openai { .. } => "openai".to_owned(),
                    LlmConfig::Plugin { name, .. } => name.clone(),
                    LlmConfig::Scripted { .. } => "scripted".to_owned(),
                };
                let provider = crate::llm::build_provider(llm, &runtime, runtime.dir())
                    .map_err(|e| e.to_string())?;
                Ok::<Provider, String>((provider, kind))
            })
            .await;
        // A failure is not kept: the next request tries again (the operator
        // may have fixed plugd.yaml meanwhile).
        built.cloned().map_err(ServiceError::NotConfigured)
    }
}

fn role(name: &str) -> Role {
    match name {
        "system" => Role::System,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => Role::User,
    }
}

fn finish(reason: &FinishReason) -> String {
    match reason {
        FinishReason::Stop => "stop".into(),
        FinishReason::Length => "length".into(),
        FinishReason::ToolUse => "tool_use".into(),
        FinishReason::Other(r) => format!("other:{r}"),
    }
}

impl HostApi for RuntimeApi {
    fn memory_recall(
        &self,
        plugin: &str,
        agent_id: String,
        query: String,
        limit: usize,
    ) -> ApiFuture<Vec<Value>> {
        let plugin = plugin.to_owned();
        let this = self.runtime.get().and_then(Weak::upgrade);
        Box::pin(async move {
            let Some(inner) = this else {
                return Err(ServiceError::NotConfigured(
                    "memory not available: the runtime is shutting down".into(),
                ));
            };
            let runtime = Runtime { inner };
            // Keyword or semantic recall as plugd.yaml's `memory:` says
            // (crate::recall); a failure is never hidden by a fallback.
            let entries = runtime
                .memory_recall(&agent_id, &query, Some(limit))
                .await
                .map_err(|e| match e {
                    RecallError::Store(plugd_store::StoreError::Invalid { .. }) => {
                        ServiceError::InvalidParams(format!("memory.recall: {e}"))
                    }
                    RecallError::Disabled { .. } => ServiceError::NotConfigured(e.to_string()),
                    other => {
                        tracing::warn!(%plugin, error = %other, "memory.recall failed");
                        ServiceError::Failed(format!("memory backend error: {other}"))
                    }
                })?;
            Ok(entries
                .into_iter()
                .map(|e| {
                    json!({
                        "id": e.id,
                        "agent_id": e.agent_id,
                        "content": e.content,
                        "tags": e.tags,
                        "concept_tags": [],
                        "created_at": e.created_at,
                        "memory_type": null,
                    })
                })
                .collect())
        })
    }

    fn llm_complete(
        &self,
        plugin: &str,
        request: CompleteRequest,
        deltas: Option<mpsc::UnboundedSender<String>>,
    ) -> ApiFuture<Completion> {
        let plugin = plugin.to_owned();
        // The provider is resolved inside the future; `self` outlives it
        // through the runtime that owns the services.
        let this = self.runtime.get().and_then(Weak::upgrade);
        Box::pin(async move {
            let Some(inner) = this else {
                return Err(ServiceError::NotConfigured(
                    "llm not configured: the runtime is shutting down".into(),
                ));
            };
            let api = inner.api.clone();
            let (provider, kind) = api.provider().await?;
            if request.provider != kind && request.provider != provider.name() {
                return Err(ServiceError::NotConfigured(format!(
                    "llm not configured: provider {:?} is not registered (this workspace has {:?})",
                    request.provider, kind
                )));
            }
            let mut messages: Vec<ChatMessage> = request
                .messages
                .iter()
                .map(|m| ChatMessage::text(role(&m.role), m.content.clone()))
                .collect();
            messages.retain(|m| !(m.role == Role::System && m.content.is_empty()));
            let chat = ChatRequest {
                model: Some(request.model.clone()),
                messages,
                tools: Vec::new(),
                max_tokens: Some(request.max_tokens),
                temperature: Some(request.temperature),
                system_prompt: request.system_prompt.clone(),
            };
            let (tx, mut rx) = mpsc::unbounded_channel::<Delta>();
            let streaming = deltas.is_some();
            let forward = async move {
                while let Some(d) = rx.recv().await {
                    if let (Delta::TextDelta { delta }, Some(out)) = (d, deltas.as_ref())
                        && !delta.is_empty()
                    {
                        let _ = out.send(delta);
                    }
                }
            };
            let call = provider.chat(&chat, streaming.then_some(tx));
            let (reply, ()) = tokio::join!(call, forward);
            let reply = reply.map_err(|e| {
                tracing::warn!(%plugin, error = %e, "llm.complete failed");
                ServiceError::Failed(e.to_string())
            })?;
            if reply.content.is_empty() && !reply.tool_calls.is_empty() {
                return Err(ServiceError::ToolCallsOnly);
            }
            Ok(Completion {
                content: reply.content,
                finish_reason: finish(&reply.finish_reason),
                usage: CompleteUsage {
                    prompt_tokens: reply.usage.prompt_tokens,
                    completion_tokens: reply.usage.completion_tokens,
                },
            })
        })
    }

    fn microapp_admin(&self, plugin: &str, method: &str, params: Value) -> AdminFuture {
        let runtime = self
            .runtime
            .get()
            .and_then(Weak::upgrade)
            .map(|inner| Runtime { inner });
        let plugin = plugin.to_owned();
        let method = method.to_owned();
        Box::pin(async move {
            let Some(runtime) = runtime else {
                return Err(plugd_wire::ErrorObject::new(
                    plugd_wire::codes::INTERNAL_ERROR,
                    format!("{method}: the runtime is shutting down"),
                ));
            };
            crate::microapp::admin(&runtime, &plugin, &method, params).await
        })
    }

    fn dispatch(&self, plugin: &str, channel: &str, msg: OutboundMessage) -> DispatchFuture {
        let runtime = self
            .runtime
            .get()
            .and_then(Weak::upgrade)
            .map(|inner| Runtime { inner });
        let plugin = plugin.to_owned();
        let channel = channel.to_owned();
        Box::pin(async move {
            let Some(runtime) = runtime else {
                return Err(ChannelError::Other {
                    kind: channel,
                    message: "the runtime is shutting down".into(),
                });
            };
            let sent = crate::channels::dispatch(&runtime, &channel, msg).await;
            if let Err(e) = &sent {
                tracing::warn!(%plugin, kind = %channel, "nexo/dispatch failed: {e}");
            }
            sent
        })
    }

    fn allowlist(&self, spec: &plugd_manifest::PluginSpec) -> plugd_host::bus::Allowlist {
        let base =
            plugd_host::bus::Allowlist::for_channels(&plugd_host::native_host::channel_kinds(spec));
        let Some(runtime) = self.runtime.get().and_then(Weak::upgrade) else {
            return base;
        };
        // Read at each start, so a changed grant applies on the next restart.
        match PlugdConfig::load(&runtime.dir) {
            Ok(config) => config.broker.extend(&spec.id, base),
            Err(e) => {
                tracing::warn!(plugin = %spec.id, "plugd.yaml unreadable, so no broker grants apply: {e}");
                base
            }
        }
    }

    fn bus(&self) -> Arc<dyn Bus> {
        self.bus.clone()
    }

    fn broker_counters(&self, plugin: &str) -> Arc<BrokerCounters> {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(plugin.to_owned())
            .or_default()
            .clone()
    }

    fn event_id(&self) -> String {
        let n = self.next_event.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("evt_{nanos:x}{:x}{n:x}", std::process::id())
    }

    fn now(&self) -> String {
        plugd_store::now_rfc3339()
    }
}
