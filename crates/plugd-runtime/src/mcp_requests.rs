//! What hosted MCP servers ask of plugd outside calls made through its MCP
//! gateway: `elicitation/create` reaches a person the way a risky call does,
//! and `sampling/createMessage` reaches the configured LLM provider when the
//! operator allows it for that server.
//!
//! During a gateway call whose client supports them, both go to that client
//! instead (plugd-host's MCP dialect decides; this module is its fallback,
//! [`plugd_host::dialect::ServerRequests`]).
//!
//! **Elicitation.** The runtime's [`Elicitor`] asks: `plugd tool call` on a
//! terminal prompts there; `plugd serve` and `plugd mcp` record a pending
//! approval ([`ELICITATION_TOOL`], risk [`ELICITATION_RISK`]) whose
//! `args_preview` is the server's `message` and `requestedSchema` (or
//! `url`), listed by `plugd approvals list` and `GET /v1/approvals`. An
//! operator answers it: approve = `accept` (with the form's content as a
//! JSON object: `plugd approvals approve ID --content JSON`, or `"content"`
//! in the body of `POST /v1/approvals/ID:approve`), deny = `decline`, deny
//! with reason `cancel` = `cancel`; nobody within
//! `risk.approval_timeout_secs` = `cancel`. Content is checked against the
//! requested schema when it is given and again before it is sent back, so a
//! server never receives content that does not match what it asked for.
//! With no elicitor (no terminal, no serve), the request is refused with an
//! error saying where it could be answered.
//!
//! **Sampling.** Refused unless plugd.yaml says `mcp.servers.NAME.sampling:
//! true` (the error says so); then the messages (text; images and audio are
//! refused, since plugd's providers take text only) go to the `llm:`
//! provider with `maxTokens` cut to `sampling_max_tokens`, and the reply is
//! a `CreateMessageResult` (`role`, `content`, `model`, `stopReason`).
//!
//! **Limits.** Each server may have [`MAX_IN_FLIGHT`] elicitations and as
//! many sampling requests waiting at once (more are refused at once, so a
//! flooding server cannot fill the approval queue); an elicitation's
//! message and schema are at most [`MAX_ELICITATION_BYTES`] of JSON;
//! sampling takes at most [`MAX_SAMPLING_MESSAGES`] messages and
//! [`MAX_SAMPLING_BYTES`] of text.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use plugd_dialects::mcp::NOT_SUPPORTED;
use plugd_host::dialect::{AnswerFuture, ServerRequests};
use plugd_store::tool_state::{ApprovalState, CallApproval, Decide, NewCallApproval};
use plugd_wire::{ErrorObject, codes};
use serde::Serialize;
use serde_json::{Value, json};

use crate::config::PlugdConfig;
use crate::risk::DecideError;
use crate::{RtInner, Runtime};

/// The `tool` of an elicitation's approval record.
pub const ELICITATION_TOOL: &str = "elicitation/create";

/// The `risk` of an elicitation's approval record.
pub const ELICITATION_RISK: &str = "elicitation";

/// Requests of each kind one server may have waiting at once.
pub const MAX_IN_FLIGHT: usize = 4;

/// Largest elicitation (message plus schema or URL), in bytes of JSON.
pub const MAX_ELICITATION_BYTES: usize = 16 * 1024;

/// Most messages in one sampling request.
pub const MAX_SAMPLING_MESSAGES: usize = 256;

/// Most text in one sampling request (messages and system prompt), in bytes.
pub const MAX_SAMPLING_BYTES: usize = 1024 * 1024;

/// How often a waiting elicitation re-reads its record (another process,
/// such as `plugd approvals approve`, may decide it).
const POLL: Duration = Duration::from_millis(200);

/// What a server asks a person.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Elicitation {
    /// The server (its plugin id).
    pub server: String,
    /// The server's message.
    pub message: String,
    /// What it wants.
    pub mode: ElicitMode,
}

/// The two kinds of elicitation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum ElicitMode {
    /// Fill in a form: an object of the `requestedSchema`'s properties.
    Form {
        /// The `requestedSchema`, as sent.
        #[serde(rename = "requestedSchema")]
        schema: Value,
    },
    /// Visit a URL (2025-11-25); accepting sends no content.
    Url {
        /// The URL.
        url: String,
    },
}

/// What the person chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ElicitAction {
    /// Accepted (with content for a form).
    Accept,
    /// Said no.
    Decline,
    /// Dismissed it without choosing.
    Cancel,
}

/// The person's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ElicitAnswer {
    /// Accept, decline or cancel.
    pub action: ElicitAction,
    /// The form's content (accepted forms only).
    pub content: Option<Value>,
}

/// How asking went.
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    /// The person answered (or the wait ran out: `cancel`).
    Answered(ElicitAnswer),
    /// Nobody could be asked; why, and where it could be answered.
    Unavailable(String),
}

/// A boxed future of [`Asked`].
pub type AskFuture<'a> = Pin<Box<dyn Future<Output = Asked> + Send + 'a>>;

/// Who asks a person (the CLI's terminal prompt, serve's approval queue).
pub trait Elicitor: Send + Sync {
    /// Asks `question`; form content it returns is checked again afterwards.
    fn elicit<'a>(&'a self, question: &'a Elicitation) -> AskFuture<'a>;
}

/// The runtime's state for server requests.
#[derive(Default)]
pub(crate) struct RequestsState {
    elicitor: RwLock<Option<Arc<dyn Elicitor>>>,
    /// (server, kind) → requests waiting.
    in_flight: Mutex<HashMap<(String, &'static str), usize>>,
}

/// An in-flight slot of one kind of request of one server (at most
/// [`MAX_IN_FLIGHT`]); released when dropped.
pub struct Slot<'a> {
    state: &'a RequestsState,
    key: (String, &'static str),
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut map = self
            .state
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

impl RequestsState {
    fn slot(&self, server: &str, kind: &'static str) -> Option<Slot<'_>> {
        let key = (server.to_owned(), kind);
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key.clone()).or_insert(0);
        if *n >= MAX_IN_FLIGHT {
            return None;
        }
        *n += 1;
        Some(Slot { state: self, key })
    }
}

impl Runtime {
    /// Takes one of `server`'s [`MAX_IN_FLIGHT`] slots for `kind` requests
    /// (`"sampling"`, `"elicitation"`), `None` when all are taken.
    pub fn mcp_request_slot(&self, server: &str, kind: &'static str) -> Option<Slot<'_>> {
        self.inner.mcp_requests.slot(server, kind)
    }

    /// Sets who asks a person when a hosted MCP server elicits outside a
    /// gateway call (the CLI's terminal prompt).
    pub fn set_elicitor(&self, elicitor: Arc<dyn Elicitor>) {
        *self
            .inner
            .mcp_requests
            .elicitor
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(elicitor);
    }

    /// Records elicitations as pending approvals in the store (what `plugd
    /// serve` and `plugd mcp` do).
    pub fn use_elicitation_queue(&self) {
        self.set_elicitor(Arc::new(Queue {
            rt: Arc::downgrade(&self.inner),
        }));
    }
}

/// The [`ServerRequests`] the runtime gives its MCP connections.
pub(crate) struct Answerer {
    pub(crate) rt: Weak<RtInner>,
}

impl ServerRequests for Answerer {
    fn answer(&self, server: &str, method: &str, params: Value) -> AnswerFuture {
        let rt = self.rt.upgrade().map(|inner| Runtime { inner });
        let server = server.to_owned();
        let method = method.to_owned();
        Box::pin(async move {
            let Some(rt) = rt else {
                return Err(ErrorObject::new(
                    NOT_SUPPORTED,
                    format!("plugd is shutting down; {method} of server {server:?} not answered"),
                ));
            };
            match method.as_str() {
                "elicitation/create" => elicit(&rt, &server, &params).await,
                "sampling/createMessage" => sample(&rt, &server, &params).await,
                _ => Err(ErrorObject::new(
                    codes::METHOD_NOT_FOUND,
                    format!("method not found: {method}"),
                )),
            }
        })
    }
}

fn invalid_params(message: String) -> ErrorObject {
    ErrorObject::new(codes::INVALID_PARAMS, message)
}

/// Reads an `elicitation/create` request (bounded; the schema must compile).
pub fn parse_elicitation(server: &str, params: &Value) -> Result<Elicitation, ErrorObject> {
    let size = serde_json::to_vec(params).map_or(usize::MAX, |b| b.len());
    if size > MAX_ELICITATION_BYTES {
        return Err(invalid_params(format!(
            "elicitation/create of server {server:?} is {size} bytes; plugd shows at most {MAX_ELICITATION_BYTES}"
        )));
    }
    let message = match params.get("message") {
        Some(Value::String(m)) => m.clone(),
        _ => {
            return Err(invalid_params(
                "elicitation/create needs a string \"message\"".into(),
            ));
        }
    };
    let mode = match params.get("mode").and_then(Value::as_str) {
        None | Some("form") => {
            let schema = params.get("requestedSchema").cloned().unwrap_or(json!({}));
            if !schema.is_object() {
                return Err(invalid_params(
                    "elicitation/create \"requestedSchema\" must be an object schema".into(),
                ));
            }
            if let Err(e) = jsonschema::validator_for(&schema) {
                return Err(invalid_params(format!(
                    "elicitation/create \"requestedSchema\" is not a JSON Schema: {e}"
                )));
            }
            ElicitMode::Form { schema }
        }
        Some("url") => match params.get("url").and_then(Value::as_str) {
            Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
                ElicitMode::Url {
                    url: url.to_owned(),
                }
            }
            _ => {
                return Err(invalid_params(
                    "elicitation/create in url mode needs an http(s) \"url\"".into(),
                ));
            }
        },
        Some(other) => {
            return Err(invalid_params(format!(
                "elicitation/create mode {:?} is unknown; plugd knows \"form\" and \"url\"",
                other.chars().take(40).collect::<String>()
            )));
        }
    };
    Ok(Elicitation {
        server: server.to_owned(),
        message,
        mode,
    })
}

/// Checks form `content` against `schema`: `Ok` or the reasons, each naming
/// the field.
pub fn check_content(schema: &Value, content: &Value) -> Result<(), String> {
    if !content.is_object() {
        return Err(format!(
            "the content must be a JSON object, got {}",
            crate::mcp_requests::short(content)
        ));
    }
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("the schema does not compile: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(content)
        .take(10)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the content does not match the requested schema: {}",
            errors.join("; ")
        ))
    }
}

/// `v` as JSON, cut for a message.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// The result a server gets for `answer` to `question`, content checked.
fn elicit_result(question: &Elicitation, answer: ElicitAnswer) -> Result<Value, ErrorObject> {
    match (answer.action, &question.mode) {
        (ElicitAction::Accept, ElicitMode::Form { schema }) => {
            let content = answer.content.unwrap_or_else(|| json!({}));
            if let Err(why) = check_content(schema, &content) {
                tracing::warn!(plugin = %question.server, "elicitation answer refused: {why}");
                return Err(ErrorObject::new(
                    codes::INTERNAL_ERROR,
                    format!("the person's answer was not sent: {why}"),
                ));
            }
            Ok(json!({"action": "accept", "content": content}))
        }
        (ElicitAction::Accept, ElicitMode::Url { .. }) => Ok(json!({"action": "accept"})),
        (ElicitAction::Decline, _) => Ok(json!({"action": "decline"})),
        (ElicitAction::Cancel, _) => Ok(json!({"action": "cancel"})),
    }
}

async fn elicit(rt: &Runtime, server: &str, params: &Value) -> Result<Value, ErrorObject> {
    let question = parse_elicitation(server, params)?;
    let elicitor = rt
        .inner
        .mcp_requests
        .elicitor
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let Some(elicitor) = elicitor else {
        return Err(ErrorObject::new(
            NOT_SUPPORTED,
            format!(
                "plugd has nobody to ask server {server:?}'s question: call the tool from `plugd tool call` on a terminal, through `plugd serve` (answered with `plugd approvals approve ID`), or through plugd's MCP gateway with a client that supports elicitation"
            ),
        ));
    };
    let Some(_slot) = rt.inner.mcp_requests.slot(server, "elicitation") else {
        return Err(ErrorObject::new(
            NOT_SUPPORTED,
            format!(
                "server {server:?} already has {MAX_IN_FLIGHT} questions waiting for a person; plugd refuses more until they are answered"
            ),
        ));
    };
    tracing::info!(plugin = %server, "server asks a person (elicitation/create)");
    match elicitor.elicit(&question).await {
        Asked::Answered(answer) => {
            tracing::info!(plugin = %server, action = ?answer.action, "elicitation answered");
            elicit_result(&question, answer)
        }
        Asked::Unavailable(why) => Err(ErrorObject::new(
            NOT_SUPPORTED,
            format!("plugd could not ask anyone server {server:?}'s question: {why}"),
        )),
    }
}

/// Serve's elicitor: a pending approval record that an operator decides.
struct Queue {
    rt: Weak<RtInner>,
}

impl Elicitor for Queue {
    fn elicit<'a>(&'a self, question: &'a Elicitation) -> AskFuture<'a> {
        Box::pin(async move {
            let Some(rt) = self.rt.upgrade().map(|inner| Runtime { inner }) else {
                return Asked::Unavailable("plugd is shutting down".into());
            };
            let timeout =
                rt.risk_config()
                    .map(|p| p.approval_timeout)
                    .unwrap_or(Duration::from_secs(
                        crate::risk::DEFAULT_APPROVAL_TIMEOUT_SECS,
                    ));
            let shown = match &question.mode {
                ElicitMode::Form { schema } => {
                    json!({"message": question.message, "requestedSchema": schema})
                }
                ElicitMode::Url { url } => {
                    json!({"mode": "url", "message": question.message, "url": url})
                }
            };
            let store = &rt.inner.state;
            let record = match store
                .call_approval_request(&NewCallApproval {
                    tool: ELICITATION_TOOL.into(),
                    plugin_id: question.server.clone(),
                    risk: ELICITATION_RISK.into(),
                    args_preview: shown.to_string(),
                    expires_at_ms: plugd_store::outbox::now_ms()
                        + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2),
                    ..NewCallApproval::default()
                })
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    return Asked::Unavailable(format!(
                        "the question could not be recorded as a pending approval: {e}"
                    ));
                }
            };
            let id = record.id;
            tracing::warn!(
                approval = %id, plugin = %question.server,
                "MCP server asks a person: `plugd approvals approve {id} --content JSON` (accept), `plugd approvals deny {id}` (decline), or POST /v1/approvals/{id}:approve"
            );
            let mut guard = Abandon {
                store: store.clone(),
                id: id.clone(),
                armed: true,
            };
            let cancel = Asked::Answered(ElicitAnswer {
                action: ElicitAction::Cancel,
                content: None,
            });
            let deadline = Instant::now() + timeout;
            loop {
                let decided = rt.inner.risk.decided.clone();
                let notified = decided.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                match store.call_approval(&id).await {
                    Ok(Some(a)) if a.state != ApprovalState::Pending => {
                        guard.armed = false;
                        return Asked::Answered(answer_of(&a));
                    }
                    Ok(Some(_)) if Instant::now() >= deadline => {
                        let _ = store
                            .call_approval_decide(&id, ApprovalState::TimedOut, "timeout", None)
                            .await;
                        guard.armed = false;
                        // Decided in the same instant: that answer counts.
                        if let Ok(Some(a)) = store.call_approval(&id).await
                            && a.state == ApprovalState::Approved
                        {
                            return Asked::Answered(answer_of(&a));
                        }
                        tracing::warn!(approval = %id, plugin = %question.server, "nobody answered the server's question in time; cancelled");
                        return cancel;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        guard.armed = false;
                        return Asked::Unavailable(format!(
                            "approval {id} vanished from the store"
                        ));
                    }
                    Err(e) => {
                        tracing::warn!(approval = %id, error = %e, "cannot read the pending question; retrying");
                        if Instant::now() >= deadline {
                            return cancel;
                        }
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(left.min(POLL)) => {}
                }
            }
        })
    }
}

/// The answer a decided record carries: approved = accept (its `reason` is
/// the content, as JSON), denied with reason `cancel` or timed out =
/// cancel, otherwise decline.
fn answer_of(a: &CallApproval) -> ElicitAnswer {
    match a.state {
        ApprovalState::Approved => ElicitAnswer {
            action: ElicitAction::Accept,
            content: a
                .reason
                .as_deref()
                .map(|r| serde_json::from_str(r).unwrap_or(Value::String(r.to_owned()))),
        },
        ApprovalState::Denied if a.reason.as_deref().map(str::trim) == Some("cancel") => {
            ElicitAnswer {
                action: ElicitAction::Cancel,
                content: None,
            }
        }
        ApprovalState::Denied => ElicitAnswer {
            action: ElicitAction::Decline,
            content: None,
        },
        _ => ElicitAnswer {
            action: ElicitAction::Cancel,
            content: None,
        },
    }
}

/// Withdraws a still-pending question when the server stops waiting (the
/// write goes to a task: `drop` cannot wait).
struct Abandon {
    store: Arc<dyn plugd_store::StateStore>,
    id: String,
    armed: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, id) = (self.store.clone(), std::mem::take(&mut self.id));
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let _ = store
                    .call_approval_decide(&id, ApprovalState::Denied, "plugd", Some("cancel"))
                    .await;
            });
        }
    }
}

/// Whether approval record `a` is an MCP server's question.
pub fn is_elicitation(a: &CallApproval) -> bool {
    a.tool == ELICITATION_TOOL && a.risk == ELICITATION_RISK
}

/// An operator's answer to a pending question (called by
/// [`Runtime::decide_approval`]): `approve` with `reason` holding the form's
/// content as JSON (checked against the requested schema first: a mismatch
/// is refused and the question stays pending), or a denial (`reason`
/// `cancel` cancels, anything else declines).
pub(crate) async fn decide(
    rt: &Runtime,
    a: &CallApproval,
    approve: bool,
    by: &str,
    reason: Option<&str>,
) -> Result<CallApproval, DecideError> {
    let state = if approve {
        let shown: Value = serde_json::from_str(&a.args_preview).unwrap_or(Value::Null);
        if shown.get("mode").and_then(Value::as_str) != Some("url") {
            let schema = shown.get("requestedSchema").cloned().unwrap_or(json!({}));
            let content = match reason {
                None => json!({}),
                Some(text) => serde_json::from_str(text).map_err(|e| {
                    DecideError::Invalid(format!(
                        "the content of question {} is not JSON ({e}); give a JSON object of the requested fields",
                        a.id
                    ))
                })?,
            };
            check_content(&schema, &content).map_err(|why| {
                DecideError::Invalid(format!(
                    "question {} of server {:?}: {why}; the question still waits (requested schema: {})",
                    a.id,
                    a.plugin,
                    short(&schema)
                ))
            })?;
        }
        ApprovalState::Approved
    } else {
        ApprovalState::Denied
    };
    let reason = match (approve, reason) {
        (false, Some(r)) if r.trim() == "cancel" => Some("cancel"),
        (false, _) => Some("decline"),
        (true, r) => r,
    };
    match rt
        .inner
        .state
        .call_approval_decide(&a.id, state, by, reason)
        .await
        .map_err(|e| DecideError::Store(e.to_string()))?
    {
        Decide::Decided(d) => {
            rt.inner.risk.decided.notify_waiters();
            tracing::info!(approval = %d.id, plugin = %d.plugin, state = d.state.as_str(), by, "MCP server question answered");
            Ok(d)
        }
        Decide::Unknown => Err(DecideError::Unknown(a.id.clone())),
        Decide::AlreadyDecided(d) => Err(DecideError::AlreadyDecided(Box::new(d))),
    }
}

async fn sample(rt: &Runtime, server: &str, params: &Value) -> Result<Value, ErrorObject> {
    let config = PlugdConfig::load(rt.dir()).map_err(|e| {
        sampling_refused(format!(
            "plugd does not sample for server {server:?}: plugd.yaml cannot be read ({e})"
        ))
    })?;
    let allowed = config.mcp.servers.get(server).filter(|s| s.sampling);
    let Some(allowed) = allowed else {
        tracing::info!(plugin = %server, "sampling/createMessage refused: not allowed for this server");
        return Err(sampling_refused(format!(
            "plugd does not sample for MCP server {server:?}: the operator has not allowed it; set mcp.servers.{server}.sampling: true in plugd.yaml to let it use the llm: provider"
        )));
    };
    let Some(llm) = config.llm.as_ref() else {
        return Err(sampling_refused(format!(
            "sampling is allowed for server {server:?} but plugd.yaml has no llm: section; configure a provider there"
        )));
    };
    // The request itself (its shape, the in-flight bound, the provider) is
    // the agent side's.
    let agent = rt.inner.agent.clone();
    agent
        .sample(rt, server, llm, params, allowed.sampling_max_tokens)
        .await
}

/// Refuses sampling (`-32601`-style "not supported" with the reason).
pub fn sampling_refused(message: String) -> ErrorObject {
    ErrorObject::new(NOT_SUPPORTED, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elicitations_are_bounded_and_their_schema_must_compile() {
        let q = parse_elicitation(
            "s",
            &json!({"message": "name?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}),
        )
        .unwrap();
        assert_eq!(q.message, "name?");
        assert!(matches!(q.mode, ElicitMode::Form { .. }));
        let q = parse_elicitation(
            "s",
            &json!({"message": "go", "mode": "url", "url": "https://x.test/a"}),
        )
        .unwrap();
        assert_eq!(
            q.mode,
            ElicitMode::Url {
                url: "https://x.test/a".into()
            }
        );
        for (bad, wants) in [
            (json!({}), "\"message\""),
            (
                json!({"message": "m", "requestedSchema": 5}),
                "object schema",
            ),
            (
                json!({"message": "m", "requestedSchema": {"type": "nonsense"}}),
                "not a JSON Schema",
            ),
            (
                json!({"message": "m", "mode": "url", "url": "file:///etc/passwd"}),
                "http(s)",
            ),
            (json!({"message": "m", "mode": "telepathy"}), "unknown"),
            (
                json!({"message": "x".repeat(MAX_ELICITATION_BYTES)}),
                "bytes",
            ),
        ] {
            let e = parse_elicitation("s", &bad).unwrap_err();
            assert!(e.message.contains(wants), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn content_is_checked_against_the_requested_schema() {
        let schema = json!({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}, "required": ["age"]});
        assert!(check_content(&schema, &json!({"age": 3})).is_ok());
        let e = check_content(&schema, &json!({"age": -1})).unwrap_err();
        assert!(e.contains("/age"), "{e}");
        assert!(
            check_content(&schema, &json!({}))
                .unwrap_err()
                .contains("age")
        );
        assert!(
            check_content(&schema, &json!([1]))
                .unwrap_err()
                .contains("JSON object")
        );
        let q = Elicitation {
            server: "s".into(),
            message: "m".into(),
            mode: ElicitMode::Form { schema },
        };
        let bad = ElicitAnswer {
            action: ElicitAction::Accept,
            content: Some(json!({"age": "old"})),
        };
        assert!(
            elicit_result(&q, bad).is_err(),
            "invalid content is never sent"
        );
        let decline = ElicitAnswer {
            action: ElicitAction::Decline,
            content: Some(json!({"age": "old"})),
        };
        assert_eq!(
            elicit_result(&q, decline).unwrap(),
            json!({"action": "decline"})
        );
    }
}
