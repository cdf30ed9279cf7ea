//! The MCP gateway over Streamable HTTP: `POST|GET|DELETE /mcp` and
//! `/mcp/{profile}` on serve's listeners, behind the same authentication as
//! the rest of the API (the `agent` role is enough to list and call).
//!
//! - `POST` an `initialize` request: a new session, its id in the
//!   `Mcp-Session-Id` response header; the session belongs to the identity
//!   that made it (another identity using its id gets `404`, as if it did not
//!   exist).
//! - `POST` any other request with that header: a JSON response, or an SSE
//!   stream (`tools/call` with a progress token, or whose client can be asked
//!   to approve through elicitation) carrying the request's notifications
//!   and server requests, then its response. Client responses and
//!   notifications: `202 Accepted`.
//! - A request naming the stateless revision (`2026-07-28`) in its `_meta`
//!   needs no session.
//! - `GET` with the header: the session's stream for `tools/list_changed`.
//! - `DELETE` with the header: the session ends.
//!
//! Sessions idle for [`SESSION_IDLE`] are dropped; at most
//! [`MAX_SESSIONS`] live at once.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use plugd_gateway::{Caller, Gateway, GatewayError, Session};
use plugd_mcp::version;
use plugd_store::tokens::Role;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::auth::Identity;
use crate::{ApiError, AppState, JsonBody, error};

/// Most MCP sessions alive at once.
pub const MAX_SESSIONS: usize = 4096;

/// A session unused this long is dropped.
pub const SESSION_IDLE: Duration = Duration::from_secs(3600);

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// The gateway and its live HTTP sessions.
#[derive(Debug)]
pub struct McpHttp {
    gateway: Gateway,
    sessions: Mutex<HashMap<String, Live>>,
}

#[derive(Debug)]
struct Live {
    session: Session,
    owner: String,
    profile: Option<String>,
    used: Instant,
}

impl McpHttp {
    /// Sessions over `gateway`.
    pub fn new(gateway: Gateway) -> McpHttp {
        McpHttp {
            gateway,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live session `id` of `owner` under `profile`; `None` also when
    /// it belongs to someone else.
    fn find(&self, id: &str, owner: &str, profile: Option<&str>) -> Option<Session> {
        let mut map = self.lock();
        let live = map.get_mut(id)?;
        if live.owner != owner || live.profile.as_deref() != profile {
            return None;
        }
        live.used = Instant::now();
        Some(live.session.clone())
    }

    fn insert(&self, session: Session, owner: &str, profile: Option<&str>) -> Result<(), ApiError> {
        let mut map = self.lock();
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, l| {
                let keep = l.used.elapsed() < SESSION_IDLE;
                if !keep {
                    l.session.close();
                }
                keep
            });
        }
        if map.len() >= MAX_SESSIONS {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                error::code::TOO_MANY_SESSIONS,
                format!("{MAX_SESSIONS} MCP sessions are open; end some with DELETE /mcp"),
            ));
        }
        map.insert(
            session.id().to_owned(),
            Live {
                session,
                owner: owner.to_owned(),
                profile: profile.map(str::to_owned),
                used: Instant::now(),
            },
        );
        Ok(())
    }

    fn remove(&self, id: &str, owner: &str, profile: Option<&str>) -> bool {
        let mut map = self.lock();
        match map.get(id) {
            Some(l) if l.owner == owner && l.profile.as_deref() == profile => {
                if let Some(l) = map.remove(id) {
                    l.session.close();
                }
                true
            }
            _ => false,
        }
    }
}

fn caller(identity: &Identity) -> Caller {
    Caller {
        name: identity.name.clone(),
        may_approve_critical: identity.role == Role::Admin,
    }
}

fn mcp_state(state: &AppState) -> Result<&Arc<McpHttp>, ApiError> {
    state.mcp.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            error::code::MCP_UNAVAILABLE,
            "this plugd serve has no MCP gateway",
        )
    })
}

fn gateway_error(e: GatewayError) -> ApiError {
    match e {
        GatewayError::UnknownProfile { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, error::code::NOT_FOUND, e.to_string())
        }
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error::code::INTERNAL,
            e.to_string(),
        ),
    }
}

fn session_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The `Mcp-Session-Id` a `method` request must carry.
fn required_session(headers: &HeaderMap, method: &str) -> Result<String, ApiError> {
    session_header(headers).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            error::code::MCP_SESSION_REQUIRED,
            format!("{method} /mcp needs the Mcp-Session-Id header of an initialized session"),
        )
    })
}

fn no_session(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        error::code::MCP_SESSION_NOT_FOUND,
        format!("no MCP session {id:?}; it ended or expired: send initialize again"),
    )
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    crate::wants_sse(headers)
}

/// `POST /mcp` and `POST /mcp/{profile}`.
pub async fn post_mcp(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    profile: Option<Path<String>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    post(state, identity, profile.map(|Path(p)| p), headers, body).await
}

async fn post(
    state: AppState,
    identity: Identity,
    profile: Option<String>,
    headers: HeaderMap,
    body: Value,
) -> Result<Response, ApiError> {
    let mcp = mcp_state(&state)?.clone();
    if let Some(v) = headers.get(VERSION_HEADER).and_then(|v| v.to_str().ok())
        && !version::is_supported(v)
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            error::code::INVALID_BODY,
            format!(
                "unsupported MCP-Protocol-Version {v:?}; plugd speaks {}",
                version::SUPPORTED.join(", ")
            ),
        ));
    }
    let profile = profile.as_deref();
    let is_initialize = body.get("method").and_then(Value::as_str) == Some("initialize");
    let stateless = body
        .get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(version::META_PROTOCOL_VERSION))
        .is_some();
    let session = match session_header(&headers) {
        _ if is_initialize => {
            let session = mcp
                .gateway
                .session(caller(&identity), profile)
                .map_err(gateway_error)?;
            let reply = session.handle(body, None).await;
            let ok = reply.as_ref().is_some_and(|r| r.get("result").is_some());
            let mut resp = json_response(reply);
            if ok {
                mcp.insert(session.clone(), &identity.name, profile)?;
                if let Ok(v) = HeaderValue::from_str(session.id()) {
                    resp.headers_mut().insert(SESSION_HEADER, v);
                }
            }
            return Ok(resp);
        }
        Some(id) => mcp
            .find(&id, &identity.name, profile)
            .ok_or_else(|| no_session(&id))?,
        None if stateless => mcp
            .gateway
            .session(caller(&identity), profile)
            .map_err(gateway_error)?,
        None => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                error::code::MCP_SESSION_REQUIRED,
                "this request needs the Mcp-Session-Id header of an initialized session (or the 2026-07-28 revision in params._meta)",
            ));
        }
    };
    match body {
        Value::Array(batch) => {
            let mut out = Vec::new();
            for m in batch {
                if let Some(r) = session.handle(m, None).await {
                    out.push(r);
                }
            }
            Ok(if out.is_empty() {
                StatusCode::ACCEPTED.into_response()
            } else {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    Value::Array(out).to_string(),
                )
                    .into_response()
            })
        }
        msg if msg.get("method").is_none() || msg.get("id").is_none() => {
            // A notification or a response to one of plugd's requests.
            session.handle(msg, None).await;
            Ok(StatusCode::ACCEPTED.into_response())
        }
        msg if accepts_sse(&headers) && session.may_stream(&msg) => Ok(stream(session, msg)),
        msg => Ok(json_response(session.handle(msg, None).await)),
    }
}

fn json_response(reply: Option<Value>) -> Response {
    match reply {
        Some(r) => ([(header::CONTENT_TYPE, "application/json")], r.to_string()).into_response(),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// An SSE stream of one request: what it sends on the way, then its
/// response (the stream ends after it).
fn stream(session: Session, msg: Value) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let sink = tx.clone();
    tokio::spawn(async move {
        let reply = session.handle(msg, Some(sink)).await;
        if let Some(r) = reply {
            let _ = tx.send(r);
        }
    });
    sse(rx, move |msg| {
        msg.get("id") == Some(&id) && msg.get("method").is_none()
    })
}

/// An SSE response of the messages `rx` yields, one `message` event each,
/// ending after the message `last` is true of (or when `rx` closes).
fn sse(
    rx: mpsc::UnboundedReceiver<Value>,
    last: impl Fn(&Value) -> bool + Send + Sync + 'static,
) -> Response {
    let last = std::sync::Arc::new(last);
    let events = futures_util::stream::unfold((rx, false), move |(mut rx, done)| {
        let last = last.clone();
        async move {
            if done {
                return None;
            }
            let msg = rx.recv().await?;
            let end = last(&msg);
            let event: Result<Event, Infallible> =
                Ok(Event::default().event("message").data(msg.to_string()));
            Some((event, (rx, end)))
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// `GET /mcp` and `GET /mcp/{profile}`: the session's own stream
/// (list_changed, resource updates).
pub async fn get_mcp(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    profile: Option<Path<String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    listen(state, identity, profile.map(|Path(p)| p), headers)
}

fn listen(
    state: AppState,
    identity: Identity,
    profile: Option<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mcp = mcp_state(&state)?;
    if !accepts_sse(&headers) {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            error::code::NOT_ACCEPTABLE,
            "GET /mcp opens an event stream; send Accept: text/event-stream",
        ));
    }
    let id = required_session(&headers, "GET")?;
    let session = mcp
        .find(&id, &identity.name, profile.as_deref())
        .ok_or_else(|| no_session(&id))?;
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    session.set_notifier(tx);
    Ok(sse(rx, |_| false))
}

/// `DELETE /mcp` and `DELETE /mcp/{profile}`: ends the session.
pub async fn delete_mcp(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    profile: Option<Path<String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    end(state, identity, profile.map(|Path(p)| p), headers)
}

fn end(
    state: AppState,
    identity: Identity,
    profile: Option<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mcp = mcp_state(&state)?;
    let id = required_session(&headers, "DELETE")?;
    if mcp.remove(&id, &identity.name, profile.as_deref()) {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(no_session(&id))
    }
}
