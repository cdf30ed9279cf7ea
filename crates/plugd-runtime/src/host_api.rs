//! The runtime's side of the services native plugins call (nexo contract
//! §5.1-§5.4): the bus, long-term memory (keyword or semantic recall, see
//! `recall.rs`), and `llm.complete` through a provider registered by name.
//!
//! `llm.complete {provider: NAME}` reaches, in this order: the entry `NAME`
//! of `plugd.yaml`'s `llm_providers:`; the single `llm:` section when `NAME`
//! is its kind (`openai`, `scripted`) or its plugin provider name (the
//! back-compatible form); a provider `NAME` an approved native plugin
//! declares in `[plugin.extends].llm_providers`. Anything else is `-32603`
//! naming the registered providers. Providers are built on first use, from
//! the configuration as it is then; a failure is not kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use plugd_host::bus::Bus;
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
    /// The bus [`Runtime::open_with`] was given (the in-process
    /// [`plugd_host::bus::LocalBus`] unless the node chose another backend).
    bus: Arc<dyn Bus>,
    counters: Mutex<HashMap<String, Arc<BrokerCounters>>>,
    runtime: OnceLock<Weak<RtInner>>,
    llm: tokio::sync::OnceCell<Provider>,
    /// `llm_providers:` entries built so far, by name.
    named: Mutex<HashMap<String, Arc<dyn LlmProvider>>>,
    next_event: AtomicU64,
}

impl RuntimeApi {
    pub(crate) fn new(bus: Arc<dyn Bus>) -> RuntimeApi {
        RuntimeApi {
            bus,
            counters: Mutex::new(HashMap::new()),
            runtime: OnceLock::new(),
            llm: tokio::sync::OnceCell::new(),
            named: Mutex::new(HashMap::new()),
            next_event: AtomicU64::new(0),
        }
    }

    /// Binds the runtime (for plugin LLM providers and the workspace
    /// configuration); called once [`Runtime::open`] built it.
    pub(crate) fn bind(&self, runtime: &Runtime) {
        let _ = self.runtime.set(Arc::downgrade(&runtime.inner));
    }

    pub(crate) fn shared_bus(&self) -> &Arc<dyn Bus> {
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
                    .live()
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

    /// The runtime these services belong to, unless it is shutting down.
    fn live(&self) -> Option<Runtime> {
        self.runtime
            .get()
            .and_then(Weak::upgrade)
            .map(|inner| Runtime { inner })
    }

    fn runtime(&self) -> Result<Runtime, ServiceError> {
        self.live().ok_or_else(|| {
            ServiceError::NotConfigured("llm not configured: the runtime is shutting down".into())
        })
    }

    /// The provider registered as `name` (see the module docs), with `model`
    /// as the default model of a plugin provider.
    async fn provider_named(
        &self,
        name: &str,
        model: &str,
    ) -> Result<Arc<dyn LlmProvider>, ServiceError> {
        let runtime = self.runtime()?;
        let config = PlugdConfig::load(runtime.dir())
            .map_err(|e| ServiceError::NotConfigured(format!("llm not configured: {e}")))?;
        if let Some(llm) = config.llm_providers.get(name) {
            if let Some(p) = self
                .named
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
            {
                return Ok(p.clone());
            }
            let built = crate::llm::build_provider(llm, &runtime, runtime.dir())
                .map_err(|e| ServiceError::NotConfigured(format!("llm_providers.{name}: {e}")))?;
            self.named
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_owned(), built.clone());
            return Ok(built);
        }
        let legacy = config.llm.as_ref().map(|llm| match llm {
            LlmConfig::Openai { .. } => "openai".to_owned(),
            LlmConfig::Plugin { name, .. } => name.clone(),
            LlmConfig::Scripted { .. } => "scripted".to_owned(),
        });
        if legacy.as_deref() == Some(name) {
            return Ok(self.provider().await?.0);
        }
        let plugins = plugin_providers(&runtime);
        if let Some((plugin, _)) = plugins.iter().find(|(_, n)| n == name) {
            let p = crate::llm::plugin::PluginProvider::new(&runtime, plugin, name, model)
                .map_err(|e| ServiceError::NotConfigured(e.to_string()))?;
            return Ok(Arc::new(p));
        }
        let mut registered: Vec<String> = config.llm_providers.keys().cloned().collect();
        registered.extend(legacy);
        registered.extend(
            plugins
                .into_iter()
                .map(|(plugin, n)| format!("{n} (plugin {plugin})")),
        );
        Err(ServiceError::NotConfigured(if registered.is_empty() {
            format!(
                "llm not configured: provider {name:?} is not registered and this workspace has no provider; add llm_providers.{name} to {}",
                runtime.dir().join(crate::config::CONFIG_FILE).display()
            )
        } else {
            format!(
                "llm not configured: provider {name:?} is not registered; registered: {}",
                registered.join(", ")
            )
        }))
    }
}

/// `(plugin, provider)` for each provider an approved native plugin declares
/// in `[plugin.extends].llm_providers`, sorted by plugin id.
fn plugin_providers(runtime: &Runtime) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (id, sup) in runtime.inner.plugins.iter() {
        let spec = sup.spec();
        let Some(native) = spec.native.as_ref() else {
            continue;
        };
        if native.extends.llm_providers.is_empty()
            || !matches!(runtime.inner.store.approval(&id), Ok(Some(_)))
        {
            continue;
        }
        for name in &native.extends.llm_providers {
            out.push((id.clone(), name.clone()));
        }
    }
    out
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
            let provider = api
                .provider_named(&request.provider, &request.model)
                .await?;
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
                ..ChatRequest::default()
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
        let runtime = self.live();
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
        let runtime = self.live();
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

    fn denied_services(&self, spec: &plugd_manifest::PluginSpec) -> Vec<String> {
        let Some(runtime) = self.runtime.get().and_then(Weak::upgrade) else {
            return Vec::new();
        };
        match PlugdConfig::load(&runtime.dir) {
            Ok(config) => config.host_services.denied(&spec.id),
            Err(e) => {
                // Fail closed: an operator who wrote a deny list meant it.
                tracing::warn!(plugin = %spec.id, "plugd.yaml unreadable, so every host service is denied until it is fixed: {e}");
                plugd_host::native_host::HOST_SERVICES
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect()
            }
        }
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
        // A UUID v4, as nexo's `Event.id` (§5.1). Without randomness (never
        // expected) the counter and the clock still make it unique here.
        let mut b = [0u8; 16];
        if getrandom::fill(&mut b).is_err() {
            let n = self.next_event.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            b[..8].copy_from_slice(&n.to_be_bytes());
            b[8..].copy_from_slice(&(nanos as u64).to_be_bytes());
        }
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }

    fn now(&self) -> String {
        plugd_store::now_rfc3339()
    }
}
