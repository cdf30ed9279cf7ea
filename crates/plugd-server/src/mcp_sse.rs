//! The deprecated HTTP+SSE transport of MCP 2024-11-05, opt-in with
//! plugd.yaml `mcp.http.legacy_sse: true`: `GET /sse` (or
//! `/sse/{profile}`) opens an event stream whose first event, `endpoint`,
//! names `POST /messages?sessionId=…` (`/messages/{profile}?…`); each
//! message posted there is answered `202 Accepted` and its response, with
//! the notifications and server requests on the way, goes out on the
//! stream as a `message` event.
//!
//! The same gateway sessions as `/mcp` ([`crate::mcp`]), with its
//! authentication, profiles and limits: a session belongs to the identity
//! that opened the stream (another identity posting to it gets `404`, as if
//! it did not exist), counts against `mcp.http.max_sessions_per_identity`
//! and [`crate::mcp::MAX_SESSIONS`], ends when its stream closes or after
//! [`crate::mcp::SESSION_IDLE`] without a message, and bodies are bounded
//! by the API's body limit. JSON-RPC batches (not in 2024-11-05) are
//! refused with `400`. Off: every one of these paths answers `404`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use plugd_gateway::Session;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::auth::Identity;
use crate::mcp::{MAX_SESSIONS, McpHttp, SESSION_IDLE};
use crate::{ApiError, AppState, JsonBody, error};

/// How often an idle stream gets an SSE comment, so that a client gone
/// without a word is noticed (the write fails) and its session ends.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The live legacy sessions of one serve.
#[derive(Debug, Default)]
pub struct Legacy {
    sessions: Mutex<HashMap<String, LegacyLive>>,
}

#[derive(Debug)]
struct LegacyLive {
    session: Session,
    out: mpsc::UnboundedSender<Value>,
    owner: String,
    profile: Option<String>,
    used: Instant,
}

impl Legacy {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, LegacyLive>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends session `id` (its stream closed or went idle).
    fn end(&self, id: &str) {
        if let Some(l) = self.lock().remove(id) {
            l.session.close();
        }
    }

    /// Legacy sessions `owner` holds.
    pub(crate) fn held_by(&self, owner: &str) -> usize {
        self.lock().values().filter(|l| l.owner == owner).count()
    }
}

/// Ends its session when the stream's body is dropped (the client went).
struct EndOnDrop {
    mcp: Arc<McpHttp>,
    id: String,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.mcp.legacy().end(&self.id);
    }
}

fn enabled(state: &AppState, method: &Method, path: &str) -> Result<Arc<McpHttp>, ApiError> {
    match state.mcp.as_ref() {
        Some(mcp) if mcp.limits().legacy_sse => Ok(mcp.clone()),
        _ => Err(ApiError::no_route(method.as_str(), path)),
    }
}

/// The transport's routes when `on` (plugd.yaml `mcp.http.legacy_sse`,
/// read at start); none otherwise, so that its paths stay unknown (`404`
/// for everyone, as without the transport).
pub fn routes(on: bool) -> axum::Router<AppState> {
    use axum::routing::{get, post};
    if !on {
        return axum::Router::new();
    }
    axum::Router::new()
        .route("/sse", get(get_sse))
        .route("/sse/{profile}", get(get_sse))
        .route("/messages", post(post_messages))
        .route("/messages/{profile}", post(post_messages))
}

/// `GET /sse` and `GET /sse/{profile}`: a new session and its stream.
pub async fn get_sse(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    profile: Option<Path<String>>,
) -> Result<Response, ApiError> {
    let profile = profile.map(|Path(p)| p);
    let path = match &profile {
        Some(p) => format!("/sse/{p}"),
        None => "/sse".to_owned(),
    };
    let mcp = enabled(&state, &Method::GET, &path)?;
    let session = mcp
        .gateway()
        .session(crate::mcp::caller(&identity), profile.as_deref())
        .map_err(crate::mcp::gateway_error)?;
    let id = session.id().to_owned();
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    {
        let per_identity = mcp.limits().max_sessions_per_identity;
        // Before the legacy lock: McpHttp::insert takes its own, then this.
        let streamable = mcp.held_by(&identity.name);
        let mut map = mcp.legacy().lock();
        map.retain(|_, l| {
            let keep = l.used.elapsed() < SESSION_IDLE;
            if !keep {
                l.session.close();
            }
            keep
        });
        let held = map.values().filter(|l| l.owner == identity.name).count() + streamable;
        if held >= per_identity {
            session.close();
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                error::code::TOO_MANY_SESSIONS,
                format!(
                    "{} holds {per_identity} open MCP sessions, the most one identity may hold (mcp.http.max_sessions_per_identity in plugd.yaml); close a stream, or raise the limit and restart plugd serve",
                    identity.name
                ),
            ));
        }
        if map.len() >= MAX_SESSIONS {
            session.close();
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                error::code::TOO_MANY_SESSIONS,
                format!(
                    "{MAX_SESSIONS} legacy MCP sessions are open on this plugd serve, its limit"
                ),
            ));
        }
        map.insert(
            id.clone(),
            LegacyLive {
                session: session.clone(),
                out: tx.clone(),
                owner: identity.name.clone(),
                profile: profile.clone(),
                used: Instant::now(),
            },
        );
    }
    session.set_notifier(tx);
    let endpoint = match &profile {
        Some(p) => format!("/messages/{p}?sessionId={id}"),
        None => format!("/messages?sessionId={id}"),
    };
    let guard = EndOnDrop {
        mcp: mcp.clone(),
        id: id.clone(),
    };
    let first = futures_util::stream::once(std::future::ready(Ok::<_, std::convert::Infallible>(
        format!("event: endpoint\ndata: {endpoint}\n\n"),
    )));
    let rest = futures_util::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let frame = tokio::select! {
            m = rx.recv() => format!("event: message\ndata: {}\n\n", m?),
            () = tokio::time::sleep(KEEPALIVE) => {
                let idle = guard
                    .mcp
                    .legacy()
                    .lock()
                    .get(&guard.id)
                    .is_none_or(|l| l.used.elapsed() >= SESSION_IDLE);
                if idle {
                    return None;
                }
                ": keepalive\n\n".to_owned()
            }
        };
        Some((Ok(frame), (rx, guard)))
    });
    use futures_util::StreamExt as _;
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(first.chain(rest)),
    )
        .into_response())
}

/// `POST /messages?sessionId=…` and `POST /messages/{profile}?sessionId=…`.
pub async fn post_messages(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    profile: Option<Path<String>>,
    RawQuery(query): RawQuery,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let profile = profile.map(|Path(p)| p);
    let path = match &profile {
        Some(p) => format!("/messages/{p}"),
        None => "/messages".to_owned(),
    };
    let mcp = enabled(&state, &Method::POST, &path)?;
    let Some(id) = query.as_deref().and_then(session_id) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            error::code::MCP_SESSION_REQUIRED,
            format!(
                "POST {path} needs ?sessionId= with the id the endpoint event of GET /sse named"
            ),
        ));
    };
    let found = {
        let mut map = mcp.legacy().lock();
        match map.get_mut(&id) {
            Some(l) if l.owner == identity.name && l.profile == profile => {
                l.used = Instant::now();
                Some((l.session.clone(), l.out.clone()))
            }
            _ => None,
        }
    };
    let Some((session, out)) = found else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            error::code::MCP_SESSION_NOT_FOUND,
            format!("no MCP session {id:?}; it ended or expired: open GET /sse again"),
        ));
    };
    session.set_user(identity.user.clone());
    if body.is_array() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            error::code::INVALID_BODY,
            "JSON-RPC batches are not part of MCP 2024-11-05's HTTP+SSE transport; post one message at a time",
        ));
    }
    let is_request = body.get("method").is_some() && body.get("id").is_some();
    if is_request {
        // The response goes out on the stream; the request runs on its own
        // task so that a slow tool does not hold the POST.
        tokio::spawn(async move {
            if let Some(reply) = session.handle(body, Some(out.clone())).await {
                let _ = out.send(reply);
            }
        });
    } else {
        session.handle(body, None).await;
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

/// The `sessionId` of a query string.
fn session_id(query: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "sessionId" && !v.is_empty()).then(|| v.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::session_id;

    #[test]
    fn session_id_is_read_from_the_query() {
        assert_eq!(session_id("sessionId=abc").as_deref(), Some("abc"));
        assert_eq!(session_id("x=1&sessionId=abc").as_deref(), Some("abc"));
        assert_eq!(session_id("sessionId="), None);
        assert_eq!(session_id("session=abc"), None);
    }
}
