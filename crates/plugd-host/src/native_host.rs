//! The host side of the nexo contract's services for native plugins: the
//! broker bridge (§5.1 `broker.event`, §5.4 `broker.publish`, §6 allowlist,
//! §8 shedding) and the child-to-host requests `memory.recall` (§5.2) and
//! `llm.complete` with `llm.complete.delta` streaming (§5.3).
//!
//! **Architecture invariant**: this module checks what crosses the boundary
//! (parameters, topics, capabilities, identity) and maps outcomes to the
//! contract's error codes; the services themselves (the store, the LLM
//! providers, the bus) are the runtime's, behind [`HostApi`].
//!
//! These are host services, not permissions: every approved plugin may call
//! `memory.recall` and `llm.complete` and use the broker bridge, as the
//! contract's host offers them (its examples declare only `["broker"]` in
//! `[plugin.requires] nexo_capabilities`, which says what the plugin needs,
//! not what it may do). The broker allowlist comes from
//! `[[plugin.channels.register]]` alone (§6). Least privilege is operator
//! policy: [`HostApi::denied_services`] (plugd.yaml `host_services.deny`,
//! off by default) turns a service off for one plugin, answered `-32603`.
//! Each request is served on its own task with its own deadline, so a slow
//! LLM never delays a tool reply.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugd_manifest::PluginSpec;
use plugd_wire::{ErrorObject, codes};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::bus::{Allowlist, Bus, Delivery, Event, Sink, SubscriptionGuard, check_subject};
use crate::extensions::{ChannelError, OutboundMessage, SendReceipt};
use crate::peer::{Handler, HandlerFuture, Peer, Request};

/// The broker bridge (`broker.event`, `broker.publish`).
pub const CAP_BROKER: &str = "broker";
/// `memory.recall`.
pub const CAP_MEMORY: &str = "memory";
/// `llm.complete`.
pub const CAP_LLM: &str = "llm";
/// Every host service plugd provides, by the name a manifest's
/// `[plugin.requires] nexo_capabilities` and plugd.yaml's
/// `host_services.deny` use.
pub const HOST_SERVICES: &[&str] = plugd_manifest::PROVIDED_CAPABILITIES;

/// `memory.recall` deadline.
pub const MEMORY_RECALL_TIMEOUT: Duration = Duration::from_secs(10);
/// `llm.complete` deadline (`NEXO_PLUGIN_LLM_TIMEOUT_MS` overrides both).
pub const LLM_COMPLETE_TIMEOUT: Duration = Duration::from_secs(60);
/// `llm.complete` deadline when streaming.
pub const LLM_STREAM_TIMEOUT: Duration = Duration::from_secs(300);

/// `limit` when a `memory.recall` gives none (§5.2).
pub const DEFAULT_RECALL_LIMIT: u64 = 10;
/// Hard cap on `memory.recall` `limit` (§5.2).
pub const MAX_RECALL_LIMIT: u64 = 1000;
/// `max_tokens` when an `llm.complete` gives none (§5.3).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// `temperature` when an `llm.complete` gives none (§5.3).
pub const DEFAULT_TEMPERATURE: f64 = 0.7;

/// What [`HostApi::dispatch`] returns.
pub type DispatchFuture = Pin<Box<dyn Future<Output = Result<SendReceipt, ChannelError>> + Send>>;

/// What [`HostApi::microapp_admin`] returns: the result, or the JSON-RPC error
/// the microapp gets.
pub type AdminFuture = Pin<Box<dyn Future<Output = Result<Value, ErrorObject>> + Send>>;

/// What a host service returns.
pub type ApiFuture<T> = Pin<Box<dyn Future<Output = Result<T, ServiceError>> + Send>>;

/// Why a host service failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The service is not set up (`-32603`, e.g. "memory disabled", "llm not configured").
    #[error("{0}")]
    NotConfigured(String),
    /// The service failed (`-32603`).
    #[error("{0}")]
    Failed(String),
    /// The parameters were refused by the service (`-32602`).
    #[error("{0}")]
    InvalidParams(String),
    /// The provider answered with tool calls only (`-32601`, §5.3).
    #[error("the provider returned tool calls instead of text; llm.complete supports text only")]
    ToolCallsOnly,
}

impl ServiceError {
    fn into_error(self) -> ErrorObject {
        let code = match &self {
            ServiceError::InvalidParams(_) => codes::INVALID_PARAMS,
            ServiceError::ToolCallsOnly => codes::METHOD_NOT_FOUND,
            _ => codes::INTERNAL_ERROR,
        };
        ErrorObject::new(code, self.to_string())
    }
}

/// One message of an `llm.complete` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompleteMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// An `llm.complete` request, checked and with defaults applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompleteRequest {
    /// Provider name.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// The conversation (never empty).
    pub messages: Vec<CompleteMessage>,
    /// Output budget.
    pub max_tokens: u32,
    /// Sampling temperature, as sent (an `f64`, so 0.7 stays 0.7 on the wire).
    pub temperature: f64,
    /// Optional system prompt.
    pub system_prompt: Option<String>,
}

/// Token counts of a completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompleteUsage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
}

/// A finished completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// The whole text.
    pub content: String,
    /// `stop`, `length`, `tool_use` or `other:<reason>`.
    pub finish_reason: String,
    /// Token counts.
    pub usage: CompleteUsage,
}

/// Counters of one plugin's broker traffic (shown by `plugd plugin show`).
#[derive(Debug, Default)]
pub struct BrokerCounters {
    /// Events the plugin published that reached the bus.
    pub published: AtomicU64,
    /// Publishes dropped because the topic is outside the plugin's allowlist
    /// or the event was malformed.
    pub dropped: AtomicU64,
    /// `broker.event` notifications queued for the plugin.
    pub delivered: AtomicU64,
    /// `broker.event` notifications shed because its queue was full (§8).
    pub shed: AtomicU64,
}

/// A snapshot of [`BrokerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerStats {
    /// Events published.
    pub published: u64,
    /// Publishes dropped.
    pub dropped: u64,
    /// Events delivered.
    pub delivered: u64,
    /// Events shed.
    pub shed: u64,
}

impl BrokerCounters {
    /// The current values.
    pub fn snapshot(&self) -> BrokerStats {
        BrokerStats {
            published: self.published.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            shed: self.shed.load(Ordering::Relaxed),
        }
    }
}

/// The services a runtime offers native plugins.
pub trait HostApi: Send + Sync + 'static {
    /// Up to `limit` long-term memory entries of `agent_id` matching `query`,
    /// as §5.2 entry objects.
    fn memory_recall(
        &self,
        plugin: &str,
        agent_id: String,
        query: String,
        limit: usize,
    ) -> ApiFuture<Vec<Value>>;
    /// One completion; with `deltas`, text chunks are sent as they arrive.
    fn llm_complete(
        &self,
        plugin: &str,
        request: CompleteRequest,
        deltas: Option<mpsc::UnboundedSender<String>>,
    ) -> ApiFuture<Completion>;
    /// The bus.
    fn bus(&self) -> Arc<dyn Bus>;
    /// The broker counters of `plugin` (kept across restarts).
    fn broker_counters(&self, plugin: &str) -> Arc<BrokerCounters>;
    /// The host services (names in [`HOST_SERVICES`]) the operator denies
    /// `spec`; read once per start. The default: none.
    fn denied_services(&self, spec: &PluginSpec) -> Vec<String> {
        let _ = spec;
        Vec::new()
    }
    /// What `spec` may receive and publish: its channel kinds' topics (§6)
    /// plus operator grants.
    fn allowlist(&self, spec: &PluginSpec) -> Allowlist {
        Allowlist::for_channels(&channel_kinds(spec))
    }
    /// A fresh event id.
    fn event_id(&self) -> String;
    /// The time now, RFC 3339.
    fn now(&self) -> String;
    /// Sends `msg` out through the adapter of channel `channel` on behalf of
    /// `plugin` (microapp `nexo/dispatch`). The default: no channels.
    fn dispatch(&self, plugin: &str, channel: &str, msg: OutboundMessage) -> DispatchFuture {
        let _ = (plugin, msg);
        let kind = channel.to_owned();
        Box::pin(async move {
            Err(ChannelError::Other {
                message: format!("no channel {kind:?} is available in this plugd"),
                kind,
            })
        })
    }
    /// Answers a microapp's `nexo/admin/*` request `method` (its capability
    /// already checked, `params` an object). The default: `-32601`, this host
    /// has no admin surface.
    fn microapp_admin(&self, plugin: &str, method: &str, params: Value) -> AdminFuture {
        let _ = (plugin, params);
        let message = format!("{method}: this host has no admin surface");
        Box::pin(async move { Err(ErrorObject::new(codes::METHOD_NOT_FOUND, message)) })
    }
    /// The deadline of `llm.complete` (streaming or not):
    /// `NEXO_PLUGIN_LLM_TIMEOUT_MS` when set, else 60 s / 300 s.
    fn llm_timeout(&self, stream: bool) -> Duration {
        let env = std::env::var(crate::native_llm::TIMEOUT_ENV).ok();
        crate::native_llm::llm_timeout(env.as_deref(), stream).unwrap_or_else(|e| {
            tracing::warn!("{e}; using the default deadline");
            if stream {
                LLM_STREAM_TIMEOUT
            } else {
                LLM_COMPLETE_TIMEOUT
            }
        })
    }
}

/// The channel kinds of a native plugin's `[[plugin.channels.register]]`.
pub fn channel_kinds(spec: &PluginSpec) -> Vec<String> {
    spec.native
        .as_ref()
        .map(|n| n.channels.iter().map(|c| c.kind.clone()).collect())
        .unwrap_or_default()
}

fn invalid(message: impl Into<String>) -> ErrorObject {
    ErrorObject::new(codes::INVALID_PARAMS, message.into())
}

/// Serves a native plugin's requests and notifications.
pub struct NativeHost {
    spec: Arc<PluginSpec>,
    api: Option<Arc<dyn HostApi>>,
    allowlist: Allowlist,
    /// Services the operator denies this plugin (`host_services.deny`).
    denied: Vec<String>,
    counters: Option<Arc<BrokerCounters>>,
    /// Dropped-publish warnings: one in full, then one summary per interval.
    drops: crate::throttle::Throttle,
}

impl std::fmt::Debug for NativeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeHost")
            .field("plugin", &self.spec.id)
            .finish_non_exhaustive()
    }
}

/// The per-connection state of a native plugin: its allowlist (decided once
/// per start) and its bus subscriptions.
#[derive(Debug, Default)]
pub struct NativeState {
    allowlist: Allowlist,
    broker_denied: bool,
    subscriptions: Mutex<Vec<SubscriptionGuard>>,
}

impl NativeHost {
    /// The connection state that goes with this handler.
    pub fn state(&self) -> NativeState {
        NativeState {
            allowlist: self.allowlist.clone(),
            broker_denied: self.denied.iter().any(|d| d == CAP_BROKER),
            subscriptions: Mutex::new(Vec::new()),
        }
    }
}

impl NativeHost {
    /// The handler for `spec`; without `api`, every service answers `-32603`.
    pub fn new(spec: Arc<PluginSpec>, api: Option<Arc<dyn HostApi>>) -> NativeHost {
        let allowlist = api.as_ref().map(|a| a.allowlist(&spec)).unwrap_or_default();
        let denied = api
            .as_ref()
            .map(|a| a.denied_services(&spec))
            .unwrap_or_default();
        let counters = api.as_ref().map(|a| a.broker_counters(&spec.id));
        let plugin = spec.id.clone();
        let interval = crate::throttle::WARN_INTERVAL;
        let drops = crate::throttle::Throttle::new(
            interval,
            Arc::new(move |topic, n, last| {
                tracing::warn!(
                    plugin = %plugin,
                    topic,
                    dropped = n,
                    "dropped {} publishes on {topic} in the last {} s; the last because: {last}",
                    crate::throttle::thousands(n),
                    interval.as_secs()
                );
            }),
        );
        NativeHost {
            spec,
            api,
            allowlist,
            denied,
            counters,
            drops,
        }
    }

    /// The services, unless the operator denied `service` to this plugin.
    fn need(&self, service: &str, method: &str) -> Result<Arc<dyn HostApi>, ErrorObject> {
        if self.denied.iter().any(|d| d == service) {
            return Err(ErrorObject::new(
                codes::INTERNAL_ERROR,
                denied_message(&self.spec.id, service, method),
            ));
        }
        self.api.clone().ok_or_else(|| {
            ErrorObject::new(
                codes::INTERNAL_ERROR,
                format!("{method}: host services are not available in this host"),
            )
        })
    }

    fn recall(&self, params: Option<Value>) -> HandlerFuture {
        let api = match self.need(CAP_MEMORY, "memory.recall") {
            Ok(api) => api,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let parsed = (|| {
            let p = params.as_ref().and_then(Value::as_object).ok_or_else(|| {
                invalid("memory.recall params must be an object {agent_id, query, limit}")
            })?;
            let agent = p
                .get("agent_id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| invalid("memory.recall: agent_id must be a non-empty string"))?;
            let query = p
                .get("query")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("memory.recall: query must be a string"))?;
            let limit = match p.get("limit") {
                None | Some(Value::Null) => DEFAULT_RECALL_LIMIT,
                Some(v) => v
                    .as_u64()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| invalid("memory.recall: limit must be a positive integer"))?,
            };
            Ok((
                agent.to_owned(),
                query.to_owned(),
                limit.min(MAX_RECALL_LIMIT),
            ))
        })();
        let plugin = self.spec.id.clone();
        Box::pin(async move {
            let (agent, query, limit) = parsed?;
            let fut = api.memory_recall(&plugin, agent, query, limit as usize);
            match tokio::time::timeout(MEMORY_RECALL_TIMEOUT, fut).await {
                Ok(Ok(entries)) => Ok(json!({ "entries": entries })),
                Ok(Err(e)) => Err(e.into_error()),
                Err(_) => Err(ErrorObject::new(
                    codes::INTERNAL_ERROR,
                    format!(
                        "memory.recall timed out after {} ms",
                        MEMORY_RECALL_TIMEOUT.as_millis()
                    ),
                )),
            }
        })
    }

    fn complete(&self, request: Request) -> HandlerFuture {
        let api = match self.need(CAP_LLM, "llm.complete") {
            Ok(api) => api,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let parsed = parse_complete(request.params.as_ref());
        let plugin = self.spec.id.clone();
        Box::pin(async move {
            let (req, stream) = parsed?;
            let timeout = api.llm_timeout(stream);
            let request_id = serde_json::to_value(&request.id).unwrap_or(Value::Null);
            let (tx, mut rx) = mpsc::unbounded_channel::<String>();
            let fut = api.llm_complete(&plugin, req, stream.then_some(tx));
            // Forward chunks as they come; all are queued before the reply.
            let notifier = request.notifier.clone();
            let forward = async move {
                while let Some(chunk) = rx.recv().await {
                    let params = json!({"request_id": request_id, "chunk": chunk});
                    if !notifier.send("llm.complete.delta", Some(params)).await {
                        break;
                    }
                }
            };
            let work = async move {
                let (out, ()) = tokio::join!(fut, forward);
                out
            };
            match tokio::time::timeout(timeout, work).await {
                Ok(Ok(done)) if stream => Ok(json!({
                    "finish_reason": done.finish_reason,
                    "usage": done.usage,
                })),
                Ok(Ok(done)) => Ok(json!({
                    "content": done.content,
                    "finish_reason": done.finish_reason,
                    "usage": done.usage,
                })),
                Ok(Err(e)) => Err(e.into_error()),
                Err(_) => Err(ErrorObject::new(
                    codes::INTERNAL_ERROR,
                    format!("llm.complete timed out after {} ms", timeout.as_millis()),
                )),
            }
        })
    }

    fn publish(&self, params: Option<Value>) {
        let plugin = &self.spec.id;
        let key: String = params
            .as_ref()
            .and_then(|p| p.get("topic"))
            .and_then(Value::as_str)
            .map(|t| t.chars().take(200).collect())
            .unwrap_or_else(|| "(no topic)".to_owned());
        let drop_it = |why: String| {
            let n = self
                .counters
                .as_ref()
                .map(|c| c.dropped.fetch_add(1, Ordering::Relaxed) + 1);
            // Counted always; logged once per interval per topic, plus a summary.
            if !self.drops.hit(&key, &why) {
                return;
            }
            match n {
                Some(n) => {
                    tracing::warn!(plugin = %plugin, dropped_total = n, "broker.publish dropped: {why}")
                }
                None => tracing::warn!(plugin = %plugin, "broker.publish dropped: {why}"),
            }
        };
        let api = match self.need(CAP_BROKER, "broker.publish") {
            Ok(api) => api,
            Err(e) => return drop_it(e.message),
        };
        let Some(p) = params.as_ref().and_then(Value::as_object) else {
            return drop_it("params must be an object {topic, event}".into());
        };
        let Some(topic) = p.get("topic").and_then(Value::as_str) else {
            return drop_it("topic must be a string".into());
        };
        if let Err(e) = check_subject(topic) {
            return drop_it(e.to_string());
        }
        if !self.allowlist.may_publish(topic) {
            return drop_it(format!(
                "topic {topic:?} is outside its allowlist ({})",
                if self.allowlist.accept.is_empty() {
                    "empty: declare [[plugin.channels.register]] kinds".to_owned()
                } else {
                    self.allowlist.accept.join(", ")
                }
            ));
        }
        let raw = p.get("event").cloned().unwrap_or_else(|| json!({}));
        if !raw.is_object() {
            return drop_it("event must be an object".into());
        }
        let mut event: Event = match serde_json::from_value(raw) {
            Ok(e) => e,
            Err(e) => return drop_it(format!("event is malformed: {e}")),
        };
        // The checked topic is the one that counts; a source naming someone
        // else is replaced by the plugin's own id.
        event.topic = topic.to_owned();
        let kinds = channel_kinds(&self.spec);
        if event.source != *plugin && !kinds.contains(&event.source) {
            if !event.source.is_empty() {
                tracing::warn!(plugin = %plugin, claimed = %event.source, "broker.publish: source replaced by the plugin id");
            }
            event.source = plugin.clone();
        }
        event.complete(|| api.event_id(), || api.now());
        if let Some(c) = &self.counters {
            c.published.fetch_add(1, Ordering::Relaxed);
        }
        api.bus().publish(event);
    }
}

/// The message of a call the operator denied.
pub fn denied_message(plugin: &str, service: &str, method: &str) -> String {
    format!(
        "{method} is not configured for plugin {plugin:?}: the operator denies it the \"{service}\" host service (plugd.yaml host_services.deny.{plugin})"
    )
}

fn parse_complete(params: Option<&Value>) -> Result<(CompleteRequest, bool), ErrorObject> {
    let p = params
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("llm.complete params must be an object"))?;
    let text = |k: &str| -> Result<String, ErrorObject> {
        p.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned)
            .ok_or_else(|| invalid(format!("llm.complete: {k} must be a non-empty string")))
    };
    let provider = text("provider")?;
    let model = text("model")?;
    let list = p
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| invalid("llm.complete: messages must be a non-empty array"))?;
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        let content = m.get("content").and_then(Value::as_str);
        match (role, content) {
            (Some(r @ ("system" | "user" | "assistant" | "tool")), Some(c)) => {
                messages.push(CompleteMessage {
                    role: r.to_owned(),
                    content: c.to_owned(),
                })
            }
            _ => {
                return Err(invalid(format!(
                    "llm.complete: messages[{i}] must be {{role: system|user|assistant|tool, content: string}}"
                )));
            }
        }
    }
    let max_tokens = match p.get("max_tokens") {
        None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
        Some(v) => v
            .as_u64()
            .filter(|n| *n > 0)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
            .ok_or_else(|| invalid("llm.complete: max_tokens must be a positive integer"))?,
    };
    let temperature = match p.get("temperature") {
        None | Some(Value::Null) => DEFAULT_TEMPERATURE,
        Some(v) => v
            .as_f64()
            .filter(|t| t.is_finite() && (0.0..=2.0).contains(t))
            .ok_or_else(|| invalid("llm.complete: temperature must be a number from 0 to 2"))?,
    };
    let system_prompt = match p.get("system_prompt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid("llm.complete: system_prompt must be a string")),
    };
    let stream = match p.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("llm.complete: stream must be a boolean")),
    };
    Ok((
        CompleteRequest {
            provider,
            model,
            messages,
            max_tokens,
            temperature,
            system_prompt,
        },
        stream,
    ))
}

impl Handler for NativeHost {
    fn handle(&self, request: Request) -> HandlerFuture {
        match request.method.as_str() {
            "memory.recall" => self.recall(request.params),
            "llm.complete" => self.complete(request),
            _ => self.request(request.method, request.params),
        }
    }

    fn notification(&self, method: String, params: Option<Value>) {
        match method.as_str() {
            "broker.publish" => self.publish(params),
            _ => {
                tracing::debug!(plugin = %self.spec.id, %method, "notification from plugin ignored")
            }
        }
    }
}

/// After a successful handshake: delivers the bus events the plugin's
/// allowlist names as `broker.event` notifications, shed when its queue is
/// full (§8). The subscriptions end with the connection's state.
pub fn attach(peer: &Peer, spec: &PluginSpec, api: Option<&Arc<dyn HostApi>>, state: &NativeState) {
    let Some(api) = api else { return };
    if state.broker_denied {
        tracing::info!(plugin = %spec.id, "broker.event not delivered: plugd.yaml host_services.deny");
        return;
    }
    let allowlist = &state.allowlist;
    let counters = api.broker_counters(&spec.id);
    let bus = api.bus();
    let mut guards = state
        .subscriptions
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    for pattern in &allowlist.deliver {
        let peer = peer.clone();
        let counters = counters.clone();
        let sink: Sink = Arc::new(move |event: &Event| {
            if peer.closed_reason().is_some() {
                return Delivery::Closed;
            }
            let params = json!({"topic": event.topic, "event": event});
            if peer.notify("broker.event", Some(params)) {
                counters.delivered.fetch_add(1, Ordering::Relaxed);
                Delivery::Queued
            } else if peer.closed_reason().is_some() {
                Delivery::Closed
            } else {
                counters.shed.fetch_add(1, Ordering::Relaxed);
                Delivery::Shed
            }
        });
        // The plugin's copies on a cluster's nodes share its events.
        match bus.subscribe_group(pattern, &spec.id, sink) {
            Ok(guard) => guards.push(guard),
            Err(e) => {
                tracing::warn!(plugin = %spec.id, %pattern, "cannot subscribe: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_params_are_checked_with_defaults() {
        let (r, stream) = parse_complete(Some(&json!({
            "provider": "p", "model": "m",
            "messages": [{"role": "user", "content": "hi"}]
        })))
        .unwrap();
        assert!(!stream);
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(r.temperature, DEFAULT_TEMPERATURE);
        let bad = [
            json!(null),
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            json!({"provider": "p", "model": "m", "messages": []}),
            json!({"provider": "p", "model": "m", "messages": [{"role": "robot", "content": "x"}]}),
            json!({"provider": "p", "model": "m", "messages": [{"role": "user"}]}),
            json!({"provider": "p", "model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
            json!({"provider": "p", "model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            json!({"provider": "p", "model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
        ];
        for b in bad {
            let e = parse_complete(Some(&b)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_PARAMS, "{b}");
        }
        let (r, _) = parse_complete(Some(&json!({
            "provider": "p", "model": "m", "max_tokens": 1u64 << 40,
            "messages": [{"role": "user", "content": "x"}]
        })))
        .unwrap();
        assert_eq!(r.max_tokens, u32::MAX);
    }

    #[test]
    fn service_errors_map_to_contract_codes() {
        assert_eq!(
            ServiceError::NotConfigured("llm not configured".into())
                .into_error()
                .code,
            codes::INTERNAL_ERROR
        );
        assert_eq!(
            ServiceError::ToolCallsOnly.into_error().code,
            codes::METHOD_NOT_FOUND
        );
        assert_eq!(
            ServiceError::InvalidParams("x".into()).into_error().code,
            codes::INVALID_PARAMS
        );
    }
}
