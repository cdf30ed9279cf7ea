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
//! - A request naming the stateless revision (`2026-07-28`) in its `_meta`,
//!   or sent with `MCP-Protocol-Version: 2026-07-28`, needs no session. Its
//!   envelope is checked first ([`check_stateless`]: `400` with a JSON-RPC
//!   error carrying its id), its errors get the revision's HTTP status
//!   ([`stateless_status`]), it is a stream only when it asked for progress
//!   or log messages, and `subscriptions/listen` is a stream of the list
//!   changes it asked for ([`listen_stream`]).
//! - `GET` with the header: the session's stream for `tools/list_changed`.
//!   With `Last-Event-ID` as well: that stream (the `GET` stream or a
//!   request's) resumed, what the client missed first (see
//!   [`crate::mcp_stream`]: event ids, priming events, connections closed
//!   after `mcp.http.stream_close_after_ms`); an id this session cannot
//!   resume is answered `400` with a JSON-RPC error.
//! - `DELETE` with the header: the session ends.
//! - A JSON-RPC batch (an array) is accepted on the 2025-03-26 revision
//!   only, the one revision that has batches: on any other (the session's
//!   negotiated one, else `MCP-Protocol-Version`) it is answered `400` with
//!   a JSON-RPC error. One batch holds at most `mcp.http.max_batch_items`
//!   messages and `mcp.http.max_batch_bytes` bytes (defaults
//!   [`DEFAULT_MAX_BATCH_ITEMS`], [`DEFAULT_MAX_BATCH_BYTES`]): a bigger one
//!   is refused whole, `400`, before any of it runs. Its messages run one
//!   after the other, so one batch holds one message's work at a time.
//! - `Mcp-Method` and `Mcp-Name` (2026-07-28 routing headers), when sent,
//!   must say what the body says (its `method`; the `name` of `tools/call`
//!   and `prompts/get`, the `uri` of `resources/read`, plain or
//!   `=?base64?…?=`): otherwise `400` with a JSON-RPC error (`-32020`,
//!   HeaderMismatch), and nothing runs. A 2026-07-28 request must send
//!   them (`Mcp-Name` when the body names a tool, prompt or resource).
//!
//! Sessions idle for [`SESSION_IDLE`] are dropped; at most
//! [`MAX_SESSIONS`] live at once, and at most
//! `mcp.http.max_sessions_per_identity` (default
//! [`DEFAULT_SESSIONS_PER_IDENTITY`]) per identity: one more `initialize` is
//! answered `429` with a JSON-RPC error naming the limit and the setting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use plugd_gateway::{Caller, Gateway, GatewayError, OrgScope, Session};
use plugd_mcp::version;
use plugd_runtime::mcp_config::McpHttpConfig;
pub use plugd_runtime::mcp_config::{
    DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_BATCH_ITEMS, DEFAULT_SESSIONS_PER_IDENTITY,
};
use plugd_store::tokens::Role;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::auth::Identity;
use crate::mcp_stream::{self, Hub, STANDALONE};
use crate::{ApiError, AppState, JsonBody, error};
use plugd_store::{Lifetime, LiveKind};

/// Most MCP sessions alive at once.
pub const MAX_SESSIONS: usize = 4096;

/// A session unused this long is dropped.
pub const SESSION_IDLE: Duration = Duration::from_secs(3600);

/// The lifetime of a session kept in the state store: [`SESSION_IDLE`].
const STORED_LIFETIME: Lifetime = Lifetime {
    idle_ms: SESSION_IDLE.as_millis() as i64,
    max_age_ms: None,
};

/// How often a session in use is marked used in the state store.
const STORE_TOUCH_EVERY: Duration = Duration::from_secs(60);

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";

/// The one revision with JSON-RPC batches.
const BATCH_REVISION: &str = "2025-03-26";

/// JSON-RPC's "invalid request".
const INVALID_REQUEST: i64 = -32600;

/// The JSON-RPC error code of a refusal by the transport (a limit, an
/// event id it cannot resume).
const TRANSPORT_ERROR: i64 = -32000;

/// The gateway and its live HTTP sessions.
#[derive(Debug)]
pub struct McpHttp {
    gateway: Gateway,
    limits: McpHttpConfig,
    sessions: Mutex<HashMap<String, Live>>,
    /// Where sessions are kept beyond this process (the state store): a
    /// session this serve does not hold is rebuilt from there.
    store: Arc<dyn plugd_store::StateStore>,
    /// The sessions of the legacy HTTP+SSE transport ([`crate::mcp_sse`]).
    legacy: crate::mcp_sse::Legacy,
    /// The last control epoch read, and when: one read per
    /// [`EPOCH_RECHECK`] serves every request.
    epoch: Mutex<Option<(Instant, i64)>>,
}

/// The hand-off kind of an MCP client's answer to another node's question
/// (`plugd_control::forward`).
pub const MCP_ANSWER: &str = "mcp.answer";

/// Takes the other nodes' hand-offs for the MCP sessions this node holds:
/// a client's answer to a question one of its calls asked.
pub struct McpTaker {
    state: AppState,
}

impl McpTaker {
    /// The taker of `state`'s MCP sessions.
    pub fn new(state: AppState) -> McpTaker {
        McpTaker { state }
    }
}

#[async_trait::async_trait]
impl plugd_control::forward::Taker for McpTaker {
    async fn take(&self, kind: &str, key: &str, payload: Value) -> bool {
        if kind != MCP_ANSWER {
            return false;
        }
        let Some(mcp) = self.state.mcp.as_ref() else {
            return false;
        };
        let session = mcp.lock().get(key).map(|l| l.session.clone());
        session.is_some_and(|s| s.deliver_answer(payload))
    }
}

/// How long one read of the control epoch answers for every request.
const EPOCH_RECHECK: Duration = Duration::from_millis(1);

#[derive(Debug)]
struct Live {
    session: Session,
    hub: Arc<Hub>,
    owner: String,
    profile: Option<String>,
    used: Instant,
    /// When the store last heard the session was used.
    stored_used: Instant,
    /// The control epoch at which the store last had this session (`None`:
    /// not checked since it was opened here). An ended session moves the
    /// epoch, so a session ended through another node is dropped here at
    /// its next request.
    epoch: Option<i64>,
}

impl Live {
    fn end(&self) {
        self.session.close();
        self.hub.close_all();
    }
}

/// Why a session was not opened.
enum Refused {
    /// Every slot is taken.
    Full,
    /// The identity holds its share.
    PerIdentity(usize),
}

impl McpHttp {
    /// Sessions over `gateway`, within `limits` (plugd.yaml `mcp.http`).
    pub fn new(
        gateway: Gateway,
        limits: &McpHttpConfig,
        store: Arc<dyn plugd_store::StateStore>,
    ) -> McpHttp {
        McpHttp {
            gateway,
            limits: limits.clone(),
            sessions: Mutex::new(HashMap::new()),
            store,
            legacy: crate::mcp_sse::Legacy::default(),
            epoch: Mutex::new(None),
        }
    }

    /// The control epoch, read at most once per [`EPOCH_RECHECK`].
    async fn epoch_now(&self) -> Result<i64, ApiError> {
        let cached = *self.epoch.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, n)) = cached
            && at.elapsed() < EPOCH_RECHECK
        {
            return Ok(n);
        }
        let at = Instant::now();
        let n = self
            .store
            .control_epoch_within(EPOCH_RECHECK)
            .await
            .map_err(store_error)?;
        *self.epoch.lock().unwrap_or_else(|p| p.into_inner()) = Some((at, n));
        Ok(n)
    }

    /// plugd.yaml `mcp.http`.
    pub fn limits(&self) -> &McpHttpConfig {
        &self.limits
    }

    /// The gateway the sessions run on.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// The legacy HTTP+SSE transport's sessions.
    pub fn legacy(&self) -> &crate::mcp_sse::Legacy {
        &self.legacy
    }

    /// Streamable HTTP sessions `owner` holds.
    pub(crate) fn held_by(&self, owner: &str) -> usize {
        self.lock().values().filter(|l| l.owner == owner).count()
    }

    fn stream_options(&self, version: Option<&str>) -> mcp_stream::Options {
        let ms = |v: u64| Duration::from_millis(v);
        mcp_stream::Options {
            resumable: version.is_some_and(|v| version::at_least(v, "2025-11-25")),
            close_after: (self.limits.stream_close_after_ms > 0)
                .then(|| ms(self.limits.stream_close_after_ms)),
            retry: ms(self.limits.stream_retry_ms),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live session `id` of `owner` under `profile`, with its streams;
    /// `None` also when it belongs to someone else. A session this serve
    /// does not hold (opened before a restart, or on another node) is
    /// rebuilt from the state store.
    async fn find(
        &self,
        id: &str,
        identity: &Identity,
        profile: Option<&str>,
    ) -> Result<Option<(Session, Arc<Hub>)>, ApiError> {
        let owner = identity.name.as_str();
        let epoch = self.epoch_now().await?;
        let stale = self
            .lock()
            .get(id)
            .is_some_and(|live| live.epoch != Some(epoch));
        if stale {
            // Something changed since this session was last confirmed: it
            // may have ended through another node.
            let stored = self
                .store
                .live_session_get(LiveKind::Mcp, id, STORED_LIFETIME)
                .await
                .map_err(store_error)?;
            if stored.is_none() {
                tracing::info!(session = %id, "MCP session ended elsewhere (another node or process)");
                self.forget(id);
                return Ok(None);
            }
            if let Some(live) = self.lock().get_mut(id) {
                live.epoch = Some(epoch);
            }
        }
        let touch = {
            let mut map = self.lock();
            if let Some(live) = map.get_mut(id) {
                if live.owner != owner || live.profile.as_deref() != profile {
                    return Ok(None);
                }
                live.used = Instant::now();
                let touch = live.stored_used.elapsed() >= STORE_TOUCH_EVERY;
                if touch {
                    live.stored_used = live.used;
                }
                let found = (live.session.clone(), live.hub.clone());
                if !touch {
                    return Ok(Some(found));
                }
                Some(found)
            } else {
                None
            }
        };
        if let Some(found) = touch {
            self.store
                .live_session_touch(LiveKind::Mcp, id)
                .await
                .map_err(store_error)?;
            return Ok(Some(found));
        }
        let Some(stored) = self
            .store
            .live_session_get(LiveKind::Mcp, id, STORED_LIFETIME)
            .await
            .map_err(store_error)?
        else {
            return Ok(None);
        };
        if stored.owner != owner || stored.profile.as_deref() != profile {
            return Ok(None);
        }
        let caller = Caller {
            name: owner.to_owned(),
            may_approve_critical: stored
                .data
                .get("may_approve_critical")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            role: stored
                .data
                .get("caller_role")
                .and_then(Value::as_str)
                .map(str::to_owned),
            // The org scope and the groups are the identity's own (its
            // current token's), never the stored ones.
            org: caller(identity).org,
            groups: caller(identity).groups,
        };
        let Some(session) = self
            .gateway
            .restore_session(id, caller, profile, &stored.data)
            .map_err(gateway_error)?
        else {
            tracing::warn!(session = %id, "a stored MCP session could not be rebuilt; the client must initialize again");
            return Ok(None);
        };
        tracing::info!(session = %id, owner, "MCP session rebuilt from the state store");
        let hub = Hub::new(self.stream_options(session.protocol_version()));
        let mut map = self.lock();
        // Another request may have rebuilt it meanwhile: keep that one.
        let live = map.entry(id.to_owned()).or_insert_with(|| Live {
            session,
            hub,
            owner: owner.to_owned(),
            profile: profile.map(str::to_owned),
            used: Instant::now(),
            stored_used: Instant::now(),
            epoch: Some(epoch),
        });
        Ok(Some((live.session.clone(), live.hub.clone())))
    }

    /// Drops session `id` from this serve only (it could not be stored).
    fn forget(&self, id: &str) {
        if let Some(l) = self.lock().remove(id) {
            l.end();
        }
    }

    /// Keeps session `session` of `owner` in the state store.
    async fn store_session(
        &self,
        session: &Session,
        owner: &str,
        profile: Option<&str>,
        may_approve_critical: bool,
    ) -> Result<(), ApiError> {
        let Some(mut snapshot) = session.snapshot() else {
            return Ok(());
        };
        snapshot["may_approve_critical"] = Value::Bool(may_approve_critical);
        if let Some(role) = &session.caller().role {
            snapshot["caller_role"] = Value::String(role.clone());
        }

        // Sessions nobody used for an hour go from the store too (a read
        // of one also drops it, but one never read again would stay).
        self.store
            .live_sessions_sweep(LiveKind::Mcp, STORED_LIFETIME)
            .await
            .map_err(store_error)?;
        self.store
            .live_session_put(LiveKind::Mcp, session.id(), owner, profile, &snapshot)
            .await
            .map_err(store_error)
    }

    fn insert(&self, session: Session, owner: &str, profile: Option<&str>) -> Result<(), Refused> {
        let per_identity = self.limits.max_sessions_per_identity;
        let mut map = self.lock();
        let legacy = self.legacy.held_by(owner);
        let held = |map: &HashMap<String, Live>| {
            map.values().filter(|l| l.owner == owner).count() + legacy
        };
        if map.len() >= MAX_SESSIONS || held(&map) >= per_identity {
            map.retain(|_, l| {
                let keep = l.used.elapsed() < SESSION_IDLE;
                if !keep {
                    l.end();
                }
                keep
            });
        }
        if held(&map) >= per_identity {
            return Err(Refused::PerIdentity(per_identity));
        }
        if map.len() >= MAX_SESSIONS {
            return Err(Refused::Full);
        }
        let hub = Hub::new(self.stream_options(session.protocol_version()));
        map.insert(
            session.id().to_owned(),
            Live {
                session,
                hub,
                owner: owner.to_owned(),
                profile: profile.map(str::to_owned),
                used: Instant::now(),
                stored_used: Instant::now(),
                epoch: None,
            },
        );
        Ok(())
    }

    /// Ends session `id` of `owner` here and in the state store; whether
    /// it was theirs.
    async fn remove(&self, id: &str, owner: &str, profile: Option<&str>) -> Result<bool, ApiError> {
        let local = {
            let mut map = self.lock();
            match map.get(id) {
                Some(l) if l.owner == owner && l.profile.as_deref() == profile => {
                    if let Some(l) = map.remove(id) {
                        l.end();
                    }
                    Some(true)
                }
                Some(_) => Some(false),
                None => None,
            }
        };
        match local {
            Some(false) => Ok(false),
            Some(true) => {
                self.store
                    .live_session_delete(LiveKind::Mcp, id)
                    .await
                    .map_err(store_error)?;
                Ok(true)
            }
            None => {
                let stored = self
                    .store
                    .live_session_get(LiveKind::Mcp, id, STORED_LIFETIME)
                    .await
                    .map_err(store_error)?;
                match stored {
                    Some(s) if s.owner == owner && s.profile.as_deref() == profile => self
                        .store
                        .live_session_delete(LiveKind::Mcp, id)
                        .await
                        .map_err(store_error),
                    _ => Ok(false),
                }
            }
        }
    }
}

use crate::error::store_error;

/// An HTTP refusal whose body is a JSON-RPC error response (`id`: the
/// request's, or null), so an MCP client shows its message.
fn rpc_refusal(status: StatusCode, id: Value, message: String, data: Value) -> Response {
    rpc_error(status, id, TRANSPORT_ERROR, message, data)
}

/// [`rpc_refusal`] with another JSON-RPC error code.
fn rpc_error(status: StatusCode, id: Value, code: i64, message: String, data: Value) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message, "data": data},
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn refused(why: Refused, identity: &Identity, id: Value) -> Response {
    match why {
        Refused::Full => rpc_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            id,
            format!(
                "{MAX_SESSIONS} MCP sessions are open on this plugd serve, its limit; end some with DELETE /mcp"
            ),
            json!({"code": error::code::TOO_MANY_SESSIONS, "limit": MAX_SESSIONS}),
        ),
        Refused::PerIdentity(limit) => rpc_refusal(
            StatusCode::TOO_MANY_REQUESTS,
            id,
            format!(
                "{} holds {limit} open MCP sessions, the most one identity may hold (mcp.http.max_sessions_per_identity in plugd.yaml); end one with DELETE /mcp, or raise the limit and restart plugd serve",
                identity.name
            ),
            json!({
                "code": error::code::TOO_MANY_SESSIONS,
                "limit": limit,
                "setting": "mcp.http.max_sessions_per_identity",
            }),
        ),
    }
}

pub(crate) fn caller(identity: &Identity) -> Caller {
    Caller {
        name: identity.name.clone(),
        may_approve_critical: identity.role == Role::Admin,
        role: Some(identity.role.as_str().to_owned()),
        org: identity.tenant.as_ref().map(|t| OrgScope {
            org_id: t.org_id.clone(),
            project_ids: t.project_ids.clone(),
        }),
        groups: identity.groups.clone(),
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

pub(crate) fn gateway_error(e: GatewayError) -> ApiError {
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
    let stateless = is_stateless(&headers, &body);
    let modern = header_text(&headers, VERSION_HEADER) == Some(version::STATELESS)
        || version::meta_revision(body.get("params")).and_then(Value::as_str)
            == Some(version::STATELESS);
    if let Err(resp) = check_routing_headers(&headers, &body, modern) {
        return Ok(*resp);
    }
    if stateless && let Err(resp) = check_stateless(&headers, &body) {
        return Ok(*resp);
    }
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
    if let Value::Array(batch) = &body
        && let Err(resp) = check_batch_size(batch, &mcp.limits)
    {
        return Ok(*resp);
    }
    let profile = profile.as_deref();
    let is_initialize = body.get("method").and_then(Value::as_str) == Some("initialize");
    let session = match session_header(&headers) {
        _ if is_initialize && !stateless => {
            let session = mcp
                .gateway
                .session(caller(&identity), profile)
                .map_err(gateway_error)?;
            session.set_user(identity.user.clone());
            let request_id = body.get("id").cloned().unwrap_or(Value::Null);
            let reply = session.handle(body, None).await;
            let ok = reply.as_ref().is_some_and(|r| r.get("result").is_some());
            let mut resp = json_response(reply);
            if ok {
                if let Err(why) = mcp.insert(session.clone(), &identity.name, profile) {
                    session.close();
                    return Ok(refused(why, &identity, request_id));
                }
                let may_approve = caller(&identity).may_approve_critical;
                if let Err(e) = mcp
                    .store_session(&session, &identity.name, profile, may_approve)
                    .await
                {
                    mcp.forget(session.id());
                    return Err(e);
                }
                if let Ok(v) = HeaderValue::from_str(session.id()) {
                    resp.headers_mut().insert(SESSION_HEADER, v);
                }
            }
            return Ok(resp);
        }
        Some(id) => mcp
            .find(&id, &identity, profile)
            .await?
            .ok_or_else(|| no_session(&id))?,
        None if stateless => (
            mcp.gateway
                .session(caller(&identity), profile)
                .map_err(gateway_error)?,
            Hub::new(mcp.stream_options(None)),
        ),
        None => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                error::code::MCP_SESSION_REQUIRED,
                "this request needs the Mcp-Session-Id header of an initialized session (or the 2026-07-28 revision in params._meta)",
            ));
        }
    };
    let (session, hub) = session;
    session.set_user(identity.user.clone());
    let kept = session.clone();
    let resp = match body {
        Value::Array(batch) => {
            // Batches are 2025-03-26's only: the session's revision
            // decides, else the header's (MCP: absent means 2025-03-26).
            let negotiated: Option<&str> = session.protocol_version();
            let revision = negotiated
                .or_else(|| header_text(&headers, VERSION_HEADER))
                .unwrap_or(BATCH_REVISION)
                .to_owned();
            if revision != BATCH_REVISION {
                return Ok(invalid(
                    Value::Null,
                    format!(
                        "JSON-RPC batches are not part of MCP revision {revision} (only {BATCH_REVISION} has them); send one message per request"
                    ),
                    json!({"code": "batch_not_supported", "revision": revision}),
                ));
            }
            let mut out = Vec::with_capacity(batch.len());
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
        msg if !stateless && session.answers_elsewhere(&msg) && state.forwarder.is_some() => {
            // The client's answer to a question another node's call asked
            // (the session moved between nodes meanwhile): handed to the
            // node that waits for it.
            let forwarder = state.forwarder.as_ref().expect("checked above");
            match forwarder.offer(MCP_ANSWER, session.id(), msg).await {
                Ok(taken) => {
                    if !taken {
                        tracing::debug!(session = %session.id(), "an MCP response no node waits for; ignored");
                    }
                    Ok(StatusCode::ACCEPTED.into_response())
                }
                Err(e) => {
                    let mut err = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        error::code::NODES_UNAVAILABLE,
                        format!("this answer belongs to a call on another node: {e}"),
                    );
                    err.retry_after_secs = Some(1);
                    Err(err)
                }
            }
        }
        msg if msg.get("method").is_none() || msg.get("id").is_none() => {
            // A notification or a response to one of plugd's requests.
            session.handle(msg, None).await;
            Ok(StatusCode::ACCEPTED.into_response())
        }
        msg if stateless
            && msg.get("method").and_then(Value::as_str) == Some("subscriptions/listen") =>
        {
            Ok(listen_stream(session, &msg))
        }
        msg if stateless => {
            // 2026-07-28: a stream only for what the request asked to hear
            // (progress, log messages), so an error keeps its HTTP status.
            let asked = msg
                .get("params")
                .and_then(|p| p.get("_meta"))
                .is_some_and(|m| {
                    m.get("progressToken").is_some() || m.get(META_LOG_LEVEL).is_some()
                });
            if accepts_sse(&headers) && asked && session.may_stream(&msg) {
                return Ok(stream(session, &hub, msg));
            }
            let reply = session.handle(msg, None).await;
            let status = reply
                .as_ref()
                .map_or(StatusCode::ACCEPTED, stateless_status);
            let mut resp = json_response(reply);
            *resp.status_mut() = status;
            Ok(resp)
        }
        msg if accepts_sse(&headers) && session.may_stream(&msg) => Ok(stream(session, &hub, msg)),
        msg => Ok(json_response(session.handle(msg, None).await)),
    };
    // What the session chose or found since it was stored (a binding an
    // export resolved to, tools a search loaded) goes to the store, so a
    // rebuilt session keeps it (a streamed request's, at the next one).
    if !stateless && kept.take_changed() {
        let may_approve = caller(&identity).may_approve_critical;
        if let Err(e) = mcp
            .store_session(&kept, &identity.name, profile, may_approve)
            .await
        {
            tracing::warn!(session = %kept.id(), error = %e.message, "could not store what the MCP session chose; a rebuilt session resolves again");
        }
    }
    resp
}

/// The `_meta` key tagging each notification of a listen stream with the
/// id of its `subscriptions/listen` request.
const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The list changes `subscriptions/listen` can ask for: its filter's key,
/// and the notification.
const LISTEN_KINDS: [(&str, &str); 3] = [
    ("toolsListChanged", "notifications/tools/list_changed"),
    ("promptsListChanged", "notifications/prompts/list_changed"),
    (
        "resourcesListChanged",
        "notifications/resources/list_changed",
    ),
];

/// 2026-07-28 `subscriptions/listen`: an SSE stream that opens with
/// `notifications/subscriptions/acknowledged` (the filter's kinds plugd
/// honours: the three list changes; resource updates are not offered), then
/// carries the catalog's list changes the filter asked for, each tagged
/// with the request's id in `_meta`. It lasts until the client goes.
fn listen_stream(session: Session, msg: &Value) -> Response {
    use futures_util::StreamExt as _;
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let filter = msg
        .get("params")
        .and_then(|p| p.get("notifications"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut honoured = serde_json::Map::new();
    for (key, _) in LISTEN_KINDS {
        if filter.get(key).and_then(Value::as_bool) == Some(true) {
            honoured.insert(key.into(), json!(true));
        }
    }
    let tag = json!({(META_SUBSCRIPTION_ID): id});
    let ack = json!({
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": honoured, "_meta": tag},
    });
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    session.listen(tx);
    let wanted: Vec<&'static str> = LISTEN_KINDS
        .iter()
        .filter(|(key, _)| honoured.contains_key(*key))
        .map(|(_, method)| *method)
        .collect();
    let changes = futures_util::stream::unfold((rx, session), |(mut rx, session)| async move {
        let m = rx.recv().await?;
        Some((m, (rx, session)))
    })
    .filter_map(move |mut m: Value| {
        let keep = m
            .get("method")
            .and_then(Value::as_str)
            .is_some_and(|method| wanted.contains(&method));
        if keep {
            let params = m
                .as_object_mut()
                .map(|o| o.entry("params").or_insert_with(|| json!({})));
            if let Some(Value::Object(p)) = params {
                let meta = p.entry("_meta").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(META_SUBSCRIPTION_ID.into(), id.clone());
                }
            }
        }
        std::future::ready(keep.then_some(m))
    });
    let frames = futures_util::stream::once(std::future::ready(ack))
        .chain(changes)
        .map(|m| Ok::<_, std::convert::Infallible>(format!("data: {m}\n\n")));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(frames),
    )
        .into_response()
}

/// The `_meta` key of a 2026-07-28 request asking for log messages.
const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// 2026-07-28: the protocol version header disagrees with `_meta`.
const HEADER_MISMATCH: i64 = -32020;

/// JSON-RPC's "invalid params".
const INVALID_PARAMS: i64 = -32602;

/// Whether a message is on the stateless revision: its `_meta` names a
/// protocol version (any: the session-less path), or it comes with
/// `MCP-Protocol-Version: 2026-07-28`.
fn is_stateless(headers: &HeaderMap, body: &Value) -> bool {
    body.is_object()
        && (version::meta_revision(body.get("params")).is_some()
            || header_text(headers, VERSION_HEADER) == Some(version::STATELESS))
}

/// The HTTP status of a 2026-07-28 JSON response: `404` for a method the
/// server does not have, `400` for the revision's own refusals (header
/// mismatch, a capability the client did not declare, an unsupported
/// version), `200` otherwise.
fn stateless_status(reply: &Value) -> StatusCode {
    match reply
        .get("error")
        .and_then(|e| e.get("code"))
        .and_then(Value::as_i64)
    {
        Some(-32601) => StatusCode::NOT_FOUND,
        Some(-32020 | -32021) => StatusCode::BAD_REQUEST,
        Some(c) if c == version::UNSUPPORTED_PROTOCOL_VERSION => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

/// The checks of a 2026-07-28 request's envelope, before anything runs, each
/// answered `400` with a JSON-RPC error carrying the request's id: a
/// version plugd does not speak (`-32022`, with the versions it does), a
/// `_meta` without `protocolVersion` or `clientCapabilities` (`-32602`),
/// a header that says another version than `_meta` (`-32020`).
/// Notifications and responses pass.
fn check_stateless(headers: &HeaderMap, body: &Value) -> Result<(), Box<Response>> {
    if body.get("method").is_none() || body.get("id").is_none() {
        return Ok(());
    }
    let id = body.get("id").cloned().unwrap_or(Value::Null);
    let unsupported = |v: &str| {
        Box::new(rpc_error(
            StatusCode::BAD_REQUEST,
            id.clone(),
            version::UNSUPPORTED_PROTOCOL_VERSION,
            format!(
                "unsupported MCP protocol version {v:?}; plugd speaks {}",
                version::SUPPORTED.join(", ")
            ),
            json!({"supported": version::SUPPORTED, "requested": v}),
        ))
    };
    let header = header_text(headers, VERSION_HEADER);
    if let Some(v) = header
        && !version::is_supported(v)
    {
        return Err(unsupported(v));
    }
    let invalid_params = |message: String| {
        Box::new(rpc_error(
            StatusCode::BAD_REQUEST,
            id.clone(),
            INVALID_PARAMS,
            message,
            json!({"code": "invalid_meta"}),
        ))
    };
    let Some(meta) = body
        .get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(Value::as_object)
    else {
        return Err(invalid_params(format!(
            "a request of MCP revision {} needs params._meta with {} and {}",
            version::STATELESS,
            version::META_PROTOCOL_VERSION,
            version::META_CLIENT_CAPABILITIES
        )));
    };
    let Some(meta_version) = meta.get(version::META_PROTOCOL_VERSION) else {
        return Err(invalid_params(format!(
            "params._meta has no {}; name the protocol version of the request there",
            version::META_PROTOCOL_VERSION
        )));
    };
    let meta_version = meta_version.as_str().unwrap_or("(not text)");
    if meta_version == version::STATELESS
        && !meta
            .get(version::META_CLIENT_CAPABILITIES)
            .is_some_and(Value::is_object)
    {
        return Err(invalid_params(format!(
            "params._meta has no {} object; send the client's capabilities ({{}} for none)",
            version::META_CLIENT_CAPABILITIES
        )));
    }
    if let Some(h) = header
        && h != meta_version
    {
        return Err(Box::new(rpc_error(
            StatusCode::BAD_REQUEST,
            id.clone(),
            HEADER_MISMATCH,
            format!(
                "MCP-Protocol-Version {h:?} does not match params._meta {} {meta_version:?}; send the same version in both",
                version::META_PROTOCOL_VERSION
            ),
            json!({"header": h, "meta": meta_version}),
        )));
    }
    if !version::is_supported(meta_version) {
        return Err(unsupported(meta_version));
    }
    Ok(())
}

/// Bytes `v` takes as JSON, counted without writing it anywhere.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A `400` JSON-RPC "invalid request" of the transport.
fn invalid(id: Value, message: String, data: Value) -> Response {
    rpc_error(StatusCode::BAD_REQUEST, id, INVALID_REQUEST, message, data)
}

/// `400` unless a batch fits `limits` (checked before any of it runs).
fn check_batch_size(batch: &[Value], limits: &McpHttpConfig) -> Result<(), Box<Response>> {
    if batch.is_empty() {
        return Err(Box::new(invalid(
            Value::Null,
            "an empty JSON-RPC batch; send at least one message".into(),
            json!({"code": "empty_batch"}),
        )));
    }
    if batch.len() > limits.max_batch_items {
        return Err(Box::new(invalid(
            Value::Null,
            format!(
                "a JSON-RPC batch of {} messages; at most {} may be sent in one (mcp.http.max_batch_items in plugd.yaml): send them in several requests",
                batch.len(),
                limits.max_batch_items
            ),
            json!({"code": "batch_too_large", "limit": limits.max_batch_items, "setting": "mcp.http.max_batch_items"}),
        )));
    }
    let bytes: usize = batch.iter().map(json_len).sum();
    if bytes > limits.max_batch_bytes {
        return Err(Box::new(invalid(
            Value::Null,
            format!(
                "a JSON-RPC batch of {bytes} bytes; at most {} may be sent in one (mcp.http.max_batch_bytes in plugd.yaml): send them in several requests",
                limits.max_batch_bytes
            ),
            json!({"code": "batch_too_large", "limit": limits.max_batch_bytes, "setting": "mcp.http.max_batch_bytes"}),
        )));
    }
    Ok(())
}

/// The value of header `name` as text (`(not text)` when it is not).
fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .map(|v| v.to_str().unwrap_or("(not text)"))
}

/// An `Mcp-Name` value: plain, or `=?base64?…?=` (decoded; `None` when
/// that is not base64 of UTF-8).
fn decode_name(value: &str) -> Option<String> {
    use base64::Engine as _;
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
        None => Some(value.to_owned()),
    }
}

/// `400` with `-32020` (HeaderMismatch) when `Mcp-Method` or `Mcp-Name`
/// disagree with the body (a batch carries neither: they route one
/// message); on the stateless revision (`stateless`) a request must send
/// them: `Mcp-Method` always, `Mcp-Name` when the body names a tool, prompt
/// or resource.
fn check_routing_headers(
    headers: &HeaderMap,
    body: &Value,
    stateless: bool,
) -> Result<(), Box<Response>> {
    let method_h = header_text(headers, METHOD_HEADER);
    let name_h = header_text(headers, NAME_HEADER);
    let required = stateless && body.get("id").is_some() && body.get("method").is_some();
    if method_h.is_none() && name_h.is_none() && !required {
        return Ok(());
    }
    let id = body.get("id").cloned().unwrap_or(Value::Null);
    let mismatch = |what: &str, sent: Option<&str>, body_says: Option<&str>| {
        let message = match sent {
            Some(sent) => format!(
                "{what} {sent:?} does not match the body ({}); send the headers of the message in the body, or none",
                body_says.map_or("which names none".to_owned(), |b| format!("{b:?}"))
            ),
            None => format!(
                "a request of MCP revision {} must send the {what} header ({})",
                version::STATELESS,
                body_says.map_or("the body's method".to_owned(), |b| format!("{b:?}"))
            ),
        };
        Box::new(rpc_error(
            StatusCode::BAD_REQUEST,
            id.clone(),
            HEADER_MISMATCH,
            message,
            json!({"code": "header_mismatch", "header": sent, "body": body_says}),
        ))
    };
    let method = body.get("method").and_then(Value::as_str);
    match method_h {
        Some(m) if Some(m) != method => return Err(mismatch("Mcp-Method", Some(m), method)),
        None if required => return Err(mismatch("Mcp-Method", None, method)),
        _ => {}
    }
    let key = match method {
        Some("tools/call" | "prompts/get") => Some("name"),
        Some("resources/read") => Some("uri"),
        _ => None,
    };
    let named = key
        .and_then(|k| body.get("params").and_then(|p| p.get(k)))
        .and_then(Value::as_str);
    match name_h {
        Some(n) if decode_name(n).as_deref() != named || named.is_none() => {
            return Err(mismatch("Mcp-Name", Some(n), named));
        }
        None if required && named.is_some() => return Err(mismatch("Mcp-Name", None, named)),
        _ => {}
    }
    Ok(())
}

fn json_response(reply: Option<Value>) -> Response {
    match reply {
        // `to_vec` writes straight into a buffer (`to_string` goes through
        // `fmt::Display` and its per-piece formatter calls).
        Some(r) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(&r).unwrap_or_default(),
        )
            .into_response(),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// An SSE stream of one request: what it sends on the way, then its
/// response (the stream ends after it). The request runs on its own task:
/// a client that disconnects has not cancelled it (it may resume the
/// stream), a `notifications/cancelled` does.
fn stream(session: Session, hub: &Arc<Hub>, msg: Value) -> Response {
    let n = hub.open();
    let response = hub.connect(n);
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    let hub = hub.clone();
    tokio::spawn(async move {
        let call = session.handle(msg, Some(tx));
        tokio::pin!(call);
        let mut open = true;
        let reply = loop {
            tokio::select! {
                m = rx.recv(), if open => match m {
                    Some(m) => hub.emit(n, &m, false),
                    None => open = false,
                },
                reply = &mut call => break reply,
            }
        };
        while let Ok(m) = rx.try_recv() {
            hub.emit(n, &m, false);
        }
        match reply {
            Some(r) => hub.emit(n, &r, true),
            None => hub.end(n),
        }
    });
    response
}

/// `GET /mcp` and `GET /mcp/{profile}`: the session's own stream
/// (list_changed, resource updates).
pub async fn get_mcp(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    profile: Option<Path<String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    listen(state, identity, profile.map(|Path(p)| p), headers).await
}

async fn listen(
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
    let (session, hub) = mcp
        .find(&id, &identity, profile.as_deref())
        .await?
        .ok_or_else(|| no_session(&id))?;
    if let Some(last) = headers.get(LAST_EVENT_ID) {
        let last = String::from_utf8_lossy(last.as_bytes());
        return Ok(match hub.resume(&last) {
            Ok(resp) => resp,
            Err(e) => {
                tracing::info!(session = %session.id(), error = %e, "an MCP stream could not be resumed");
                rpc_refusal(
                    StatusCode::BAD_REQUEST,
                    Value::Null,
                    e.to_string(),
                    json!({"lastEventId": last.chars().take(80).collect::<String>()}),
                )
            }
        });
    }
    if hub.start_standalone() {
        let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
        session.set_notifier(tx);
        let hub = hub.clone();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                hub.emit(STANDALONE, &m, false);
            }
        });
    }
    Ok(hub.connect(STANDALONE))
}

/// `DELETE /mcp` and `DELETE /mcp/{profile}`: ends the session.
pub async fn delete_mcp(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    profile: Option<Path<String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    end(state, identity, profile.map(|Path(p)| p), headers).await
}

async fn end(
    state: AppState,
    identity: Identity,
    profile: Option<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mcp = mcp_state(&state)?;
    let id = required_session(&headers, "DELETE")?;
    if mcp.remove(&id, &identity.name, profile.as_deref()).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(no_session(&id))
    }
}
