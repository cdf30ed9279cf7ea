//! The hook pipeline: every handler of one interception point, in priority
//! order, each seeing the previous one's output.
//!
//! The four Dexto extension points (`before_llm_request`, `before_tool_call`,
//! `after_tool_result`, `before_response`) plus nexo's `before_message`. A
//! handler is anything implementing [`HookHandler`]: a built-in Rust plugin, a
//! remote plugin of any dialect, or a Dexto JavaScript module. Each one maps
//! its own reply onto [`HandlerResult`] (Dexto's `PluginResult`). The
//! handlers themselves and the building of a pipeline from `plugd.yaml` are
//! plugd-agent's (`plugd_agent::hooks`), reached through
//! [`crate::agent_seam::AgentParts::build_pipeline`]; this module is the
//! model and the runner every tool call passes.
//!
//! Rules (seed 002, issue 4):
//! * order by `priority`, lower first; priorities are unique among the enabled
//!   handlers of a point, and a clash is an error naming both handlers;
//! * a `blocking` handler's `cancel` stops the chain; a non-blocking one's is
//!   logged as a notice and the chain goes on;
//! * `modify` is merged key by key into the payload the next handler sees;
//! * a handler error, timeout or crash is handled by its `on_error` policy
//!   (default `block` for blocking handlers, `continue` for the others):
//!   fail closed where the operator said the handler matters;
//! * every decision is logged with handler, point, duration and outcome.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub mod dexto_package;

/// Largest per-handler `timeout_ms` of plugd.yaml (10 minutes).
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// An interception point of the agent loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    /// Before the user's input goes to the LLM (`beforeLLMRequest`).
    BeforeLlmRequest,
    /// Before a tool runs (`beforeToolCall`).
    BeforeToolCall,
    /// After a tool returned (`afterToolResult`).
    AfterToolResult,
    /// Before the reply goes to the user (`beforeResponse`).
    BeforeResponse,
    /// An inbound channel message, before it starts a turn (nexo).
    BeforeMessage,
}

impl HookPoint {
    /// Every point, in agent-loop order.
    pub const ALL: [HookPoint; 5] = [
        HookPoint::BeforeMessage,
        HookPoint::BeforeLlmRequest,
        HookPoint::BeforeToolCall,
        HookPoint::AfterToolResult,
        HookPoint::BeforeResponse,
    ];

    /// The snake_case name (`plugd hook run POINT`, the HTTP API, nexo's `hook_name`).
    pub fn name(self) -> &'static str {
        match self {
            HookPoint::BeforeLlmRequest => "before_llm_request",
            HookPoint::BeforeToolCall => "before_tool_call",
            HookPoint::AfterToolResult => "after_tool_result",
            HookPoint::BeforeResponse => "before_response",
            HookPoint::BeforeMessage => "before_message",
        }
    }

    /// The Dexto method name (`beforeLLMRequest`, …); `None` for `before_message`.
    pub fn dexto_method(self) -> Option<&'static str> {
        match self {
            HookPoint::BeforeLlmRequest => Some("beforeLLMRequest"),
            HookPoint::BeforeToolCall => Some("beforeToolCall"),
            HookPoint::AfterToolResult => Some("afterToolResult"),
            HookPoint::BeforeResponse => Some("beforeResponse"),
            HookPoint::BeforeMessage => None,
        }
    }

    /// Parses a snake_case name.
    pub fn parse(s: &str) -> Option<HookPoint> {
        HookPoint::ALL.into_iter().find(|p| p.name() == s)
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who and what a hook run is about. Field names are snake_case on plugd's
/// own surfaces; the Dexto host translates them to `sessionId` and friends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HookContext {
    /// The session.
    pub session_id: Option<String>,
    /// The tenant (multi-tenant deployments).
    pub tenant_id: Option<String>,
    /// The end user.
    pub user_id: Option<String>,
    /// The agent.
    pub agent_id: Option<String>,
    /// The channel a message came from.
    pub channel: Option<String>,
    /// The channel account (nexo binding).
    pub account_id: Option<String>,
    /// Trace id for logs.
    pub trace_id: Option<String>,
    /// Milliseconds the whole run may take (each handler also has its own timeout).
    pub deadline_ms: Option<u64>,
    /// The surface a tool call came in by (`http`, `mcp`, `cli`, `agent`,
    /// `binding`, `runtime`), set by the governed call path
    /// ([`crate::governed`]); never taken from a caller.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub surface: Option<String>,
}

impl HookContext {
    /// `self` (the defaults) overlaid by `over`: fields set in `over` win.
    pub fn overlaid(&self, over: &HookContext) -> HookContext {
        let pick = |a: &Option<String>, b: &Option<String>| a.clone().or_else(|| b.clone());
        HookContext {
            session_id: pick(&over.session_id, &self.session_id),
            tenant_id: pick(&over.tenant_id, &self.tenant_id),
            user_id: pick(&over.user_id, &self.user_id),
            agent_id: pick(&over.agent_id, &self.agent_id),
            channel: pick(&over.channel, &self.channel),
            account_id: pick(&over.account_id, &self.account_id),
            trace_id: pick(&over.trace_id, &self.trace_id),
            deadline_ms: over.deadline_ms.or(self.deadline_ms),
            surface: pick(&over.surface, &self.surface),
        }
    }
}

/// The kind of a [`Notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoticeKind {
    /// Something was allowed.
    Allow,
    /// Something was blocked.
    Block,
    /// A warning.
    Warn,
    /// Information.
    Info,
}

/// A notice for logs, events and the caller (Dexto `PluginNotice`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    /// Its kind.
    pub kind: NoticeKind,
    /// A stable code, e.g. `INPUT_TOO_LONG`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A human message.
    pub message: String,
    /// Structured detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// The handler that produced it (set by the pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
}

impl Notice {
    /// A notice of `kind` with `code` and `message`.
    pub fn new(kind: NoticeKind, code: Option<&str>, message: impl Into<String>) -> Self {
        Notice {
            kind,
            code: code.map(str::to_owned),
            message: message.into(),
            details: None,
            handler: None,
        }
    }
}

/// What one handler decided (Dexto `PluginResult`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HandlerResult {
    /// `false`: the handler failed (its `on_error` policy applies).
    pub ok: bool,
    /// Keys to merge into the payload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modify: Option<Map<String, Value>>,
    /// Stop the chain (honoured only for blocking handlers).
    pub cancel: bool,
    /// Why, for the user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Notices.
    pub notices: Vec<Notice>,
}

impl Default for HandlerResult {
    fn default() -> Self {
        HandlerResult {
            ok: true,
            modify: None,
            cancel: false,
            message: None,
            notices: Vec::new(),
        }
    }
}

impl HandlerResult {
    /// Continue unchanged.
    pub fn pass() -> Self {
        HandlerResult::default()
    }

    /// Continue with `modify` merged into the payload.
    pub fn modify(modify: Map<String, Value>) -> Self {
        HandlerResult {
            modify: Some(modify),
            ..HandlerResult::default()
        }
    }

    /// Cancel with a message and one block notice.
    pub fn block(code: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        HandlerResult {
            cancel: true,
            notices: vec![Notice::new(NoticeKind::Block, Some(code), message.clone())],
            message: Some(message),
            ..HandlerResult::default()
        }
    }
}

/// Why a handler produced no result.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    /// It failed (remote error, crash, malformed reply).
    #[error("{0}")]
    Failed(String),
    /// It did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The future a handler returns.
pub type HookFuture<'a> =
    Pin<Box<dyn Future<Output = Result<HandlerResult, HookError>> + Send + 'a>>;

/// One hook handler, whatever it is backed by.
pub trait HookHandler: Send + Sync + 'static {
    /// Handles `payload` at `point`.
    fn handle<'a>(
        &'a self,
        point: HookPoint,
        payload: &'a Value,
        ctx: &'a HookContext,
    ) -> HookFuture<'a>;
    /// Releases resources (Dexto `cleanup`); default: nothing.
    fn cleanup(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }
    /// Reloads the handler if its source changed since it was loaded (a
    /// Dexto module file, under `plugd serve`); default: nothing to reload.
    fn reload_if_changed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }
}

/// What to do when a handler errors, times out or crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Stop the chain (fail closed).
    Block,
    /// Log a notice and go on.
    Continue,
}

/// How one handler takes part in a point's chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HandlerSpec {
    /// Its name (unique per point).
    pub name: String,
    /// The points it handles.
    pub points: Vec<HookPoint>,
    /// Lower runs first; unique among the enabled handlers of a point.
    pub priority: i64,
    /// Whether its cancel stops the chain.
    pub blocking: bool,
    /// Error policy; `None` = `block` if blocking, else `continue`.
    pub on_error: Option<OnError>,
    /// Per-call timeout (default 5 s).
    pub timeout: Duration,
}

impl HandlerSpec {
    /// The default per-handler timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// The effective error policy.
    pub fn on_error(&self) -> OnError {
        self.on_error.unwrap_or(if self.blocking {
            OnError::Block
        } else {
            OnError::Continue
        })
    }
}

/// A configuration error of the pipeline (stops start-up).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// Two enabled handlers of one point share a priority.
    #[error(
        "hook handlers {first:?} and {second:?} both have priority {priority} at {point}; priorities must be unique (lower runs first)"
    )]
    PriorityClash {
        /// The point.
        point: HookPoint,
        /// The priority.
        priority: i64,
        /// One handler.
        first: String,
        /// The other.
        second: String,
    },
    /// A handler could not be loaded or initialized.
    #[error("hook handler {name:?} failed to initialize: {reason}")]
    Init {
        /// The handler.
        name: String,
        /// Why.
        reason: String,
    },
}

/// The result of running one point's chain; `plugd hook run` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// `continue` or `blocked`.
    pub outcome: OutcomeKind,
    /// The payload after every modification that was applied.
    pub payload: Value,
    /// Why it was blocked (the blocking handler's message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every notice, in order.
    pub notices: Vec<Notice>,
    /// The handler that blocked, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
}

/// Whether the chain let the payload through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeKind {
    /// Go on with the (possibly modified) payload.
    Continue,
    /// Stop.
    Blocked,
}

impl Outcome {
    /// `true` when blocked.
    pub fn is_blocked(&self) -> bool {
        self.outcome == OutcomeKind::Blocked
    }
}

struct Entry {
    spec: HandlerSpec,
    handler: Arc<dyn HookHandler>,
}

/// Every enabled handler, per point, in priority order. A clone shares
/// the handlers.
#[derive(Default, Clone)]
pub struct Pipeline {
    chains: BTreeMap<HookPoint, Vec<Arc<Entry>>>,
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: BTreeMap<&str, Vec<&str>> = self
            .chains
            .iter()
            .map(|(p, c)| (p.name(), c.iter().map(|e| e.spec.name.as_str()).collect()))
            .collect();
        f.debug_struct("Pipeline").field("chains", &names).finish()
    }
}

impl Pipeline {
    /// Builds the chains; fails on a priority clash within a point.
    pub fn new(
        handlers: Vec<(HandlerSpec, Arc<dyn HookHandler>)>,
    ) -> Result<Pipeline, PipelineError> {
        let mut chains: BTreeMap<HookPoint, Vec<Arc<Entry>>> = BTreeMap::new();
        for (spec, handler) in handlers {
            let entry = Arc::new(Entry { spec, handler });
            for point in &entry.spec.points {
                chains.entry(*point).or_default().push(entry.clone());
            }
        }
        for (point, chain) in &mut chains {
            chain.sort_by_key(|e| e.spec.priority);
            for pair in chain.windows(2) {
                if pair[0].spec.priority == pair[1].spec.priority {
                    return Err(PipelineError::PriorityClash {
                        point: *point,
                        priority: pair[0].spec.priority,
                        first: pair[0].spec.name.clone(),
                        second: pair[1].spec.name.clone(),
                    });
                }
            }
        }
        Ok(Pipeline { chains })
    }

    /// The handler names of `point`, in the order they run.
    pub fn chain(&self, point: HookPoint) -> Vec<&str> {
        self.chains
            .get(&point)
            .map(|c| c.iter().map(|e| e.spec.name.as_str()).collect())
            .unwrap_or_default()
    }

    /// Runs `point`'s chain over `payload`.
    pub async fn run(&self, point: HookPoint, payload: Value, ctx: &HookContext) -> Outcome {
        let mut payload = payload;
        let mut notices = Vec::new();
        let run_deadline = ctx
            .deadline_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        for entry in self
            .chains
            .get(&point)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let spec = &entry.spec;
            let started = Instant::now();
            let mut limit = spec.timeout;
            if let Some(d) = run_deadline {
                limit = limit.min(d.saturating_duration_since(started));
            }
            let handled = async {
                match tokio::time::timeout(limit, entry.handler.handle(point, &payload, ctx)).await
                {
                    Ok(r) => r,
                    Err(_) => Err(HookError::Timeout(limit)),
                }
            };
            let subject = || plugd_telemetry::Subject {
                export: Some(&spec.name),
                ..Default::default()
            };
            let result = plugd_telemetry::in_span("hook handler", subject, handled).await;
            let took_ms = started.elapsed().as_millis() as u64;
            // ok=false is a handler failure under its error policy.
            let result = match result {
                Ok(r) if !r.ok => {
                    let why = r
                        .message
                        .clone()
                        .unwrap_or_else(|| "handler reported ok=false".into());
                    notices.extend(tag(r.notices, &spec.name));
                    Err(HookError::Failed(why))
                }
                other => other,
            };
            let result = match result {
                Ok(r) => r,
                Err(e) => {
                    let policy = spec.on_error();
                    tracing::warn!(handler = %spec.name, %point, took_ms, error = %e, ?policy, "hook handler failed");
                    let code = if matches!(e, HookError::Timeout(_)) {
                        "HOOK_TIMEOUT"
                    } else {
                        "HOOK_FAILED"
                    };
                    let message = format!("hook handler {:?} failed at {point}: {e}", spec.name);
                    match policy {
                        OnError::Block => {
                            let mut n = Notice::new(NoticeKind::Block, Some(code), message.clone());
                            n.handler = Some(spec.name.clone());
                            notices.push(n);
                            return Outcome {
                                outcome: OutcomeKind::Blocked,
                                payload,
                                message: Some(message),
                                notices,
                                handler: Some(spec.name.clone()),
                            };
                        }
                        OnError::Continue => {
                            let mut n = Notice::new(NoticeKind::Warn, Some(code), message);
                            n.handler = Some(spec.name.clone());
                            notices.push(n);
                            continue;
                        }
                    }
                }
            };
            if let Some(modify) = &result.modify {
                merge(&mut payload, modify);
            }
            notices.extend(tag(result.notices, &spec.name));
            let outcome = if result.cancel && spec.blocking {
                "blocked"
            } else if result.cancel {
                "cancel ignored (non-blocking)"
            } else if result.modify.is_some() {
                "modified"
            } else {
                "continue"
            };
            tracing::info!(handler = %spec.name, %point, took_ms, outcome, "hook decision");
            if result.cancel {
                let message = result
                    .message
                    .unwrap_or_else(|| format!("blocked by hook handler {:?}", spec.name));
                if spec.blocking {
                    return Outcome {
                        outcome: OutcomeKind::Blocked,
                        payload,
                        message: Some(message),
                        notices,
                        handler: Some(spec.name.clone()),
                    };
                }
                let mut n = Notice::new(NoticeKind::Warn, Some("NON_BLOCKING_CANCEL"), message);
                n.handler = Some(spec.name.clone());
                notices.push(n);
            }
        }
        Outcome {
            outcome: OutcomeKind::Continue,
            payload,
            message: None,
            notices,
            handler: None,
        }
    }

    /// Asks every handler to reload if its source changed
    /// ([`HookHandler::reload_if_changed`]); serve runs it periodically
    /// (`config_watch::watch_modules`).
    pub async fn reload_changed(&self) {
        // Collected first: the future stays `Send` (no raw pointers across
        // an await).
        let mut unique: Vec<&Arc<Entry>> = Vec::new();
        for entry in self.chains.values().flatten() {
            if !unique.iter().any(|e| Arc::ptr_eq(e, entry)) {
                unique.push(entry);
            }
        }
        for entry in unique {
            entry.handler.reload_if_changed().await;
        }
    }

    /// Calls every handler's cleanup.
    pub async fn cleanup(&self) {
        let mut seen: Vec<*const Entry> = Vec::new();
        for entry in self.chains.values().flatten() {
            let ptr = Arc::as_ptr(entry);
            if !seen.contains(&ptr) {
                seen.push(ptr);
                entry.handler.cleanup().await;
            }
        }
    }
}

fn tag(notices: Vec<Notice>, handler: &str) -> impl Iterator<Item = Notice> + '_ {
    notices.into_iter().map(move |mut n| {
        n.handler.get_or_insert_with(|| handler.to_owned());
        n
    })
}

/// Merges `modify` into `payload` key by key (a non-object payload is replaced
/// by an object holding the keys).
pub fn merge(payload: &mut Value, modify: &Map<String, Value>) {
    if !payload.is_object() {
        *payload = Value::Object(Map::new());
    }
    if let Value::Object(map) = payload {
        for (k, v) in modify {
            map.insert(k.clone(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests;
