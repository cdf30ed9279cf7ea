//! One MCP client's session: the handshake, request dispatch, cancellation,
//! the requests plugd sends the client (elicitation) and their answers, and
//! `notifications/tools/list_changed`.
//!
//! Transport-neutral: a transport hands every incoming message to
//! [`Session::handle`] with a [`Sink`] for messages tied to that request
//! (progress, elicitation), and writes back what it returns. Messages not
//! tied to a request (list_changed) go to the sink given by
//! [`Session::set_notifier`] (stdout for stdio, the GET stream on HTTP).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::{AbortHandle, Abortable, Aborted};
use plugd_mcp::version;
use plugd_runtime::mcp_config::ProfileMatcher;
use plugd_wire::jsonrpc::{DecodeError, Id, Message};
use serde_json::{Map, Value, json};
use std::panic::AssertUnwindSafe;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::{Caller, Gateway, SERVER_NAME, catalog, tools};

/// Where the messages of one request, or of the session, go: whole
/// JSON-RPC messages, in order.
pub type Sink = mpsc::UnboundedSender<Value>;

/// JSON-RPC error codes the gateway answers with.
pub(crate) mod code {
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// A `limits:` rule of plugd.yaml refused a `tools/call`
    /// (`data.retryAfterSeconds`, `data.rule`).
    pub const RATE_LIMITED: i64 = -32029;
}

/// The methods of the stateful revisions that 2026-07-28 removed: a
/// stateless request for one is answered `-32601` (HTTP `404`).
pub(crate) const REMOVED_IN_STATELESS: [&str; 5] = [
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

/// Most requests of one session in flight at once; beyond, a request is
/// answered with an error at once (a client cannot pile up tasks).
pub const MAX_IN_FLIGHT: usize = 1024;

/// How long bursts of catalog changes are gathered into one
/// `notifications/tools/list_changed`.
const LIST_CHANGED_DEBOUNCE: Duration = Duration::from_millis(100);

/// A JSON-RPC error object.
pub(crate) fn error(code: i64, message: impl Into<String>) -> Value {
    json!({"code": code, "message": message.into()})
}

/// One client's session; cheap to clone (clones share it).
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id)
            .field("caller", &self.inner.caller)
            .finish()
    }
}

pub(crate) struct SessionInner {
    pub(crate) gw: Gateway,
    pub(crate) id: String,
    pub(crate) caller: Caller,
    pub(crate) profile: Option<(String, ProfileMatcher)>,
    state: Mutex<State>,
    inflight: Mutex<HashMap<String, AbortHandle>>,
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    next_request: AtomicU64,
    /// `plugd-` and random hex: the ids of plugd's requests to the client
    /// differ between nodes serving one session, so an answer reaches the
    /// node that asked.
    request_prefix: String,
    notifier: Mutex<Option<Sink>>,
    watcher: Mutex<Option<JoinHandle<()>>>,
    events: Mutex<Option<JoinHandle<()>>>,
    /// (server, original URI) → the URI the client subscribed with.
    subscriptions: Mutex<HashMap<(String, String), String>>,
    /// Export id → the binding its first resolution chose (an org
    /// identity's session): taken again while it applies.
    pub(crate) pins: Mutex<HashMap<String, String>>,
    /// The MCP names this session's searches found (`discovery: search`).
    pub(crate) loaded: Mutex<BTreeSet<String>>,
    /// Whether `pins` or `loaded` changed since [`Session::take_changed`].
    pub(crate) changed: std::sync::atomic::AtomicBool,
    /// The caller's latest access token ([`Session::set_user`]).
    user: Mutex<Option<plugd_host::dialect::UserToken>>,
}

/// Most pins and found tools one session keeps (a bigger catalog is
/// searched, not loaded whole).
pub(crate) const MAX_SESSION_TOOLS: usize = 4096;

/// Takes a request off the session's in-flight list when it ends, however
/// it ends (answered, aborted, or its caller gone).
struct Unlist<'a> {
    inflight: &'a Mutex<HashMap<String, AbortHandle>>,
    key: String,
}

impl Drop for Unlist<'_> {
    fn drop(&mut self) {
        lock(self.inflight).remove(&self.key);
    }
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        if let Some(w) = lock(&self.watcher).take() {
            w.abort();
        }
        if let Some(w) = lock(&self.events).take() {
            w.abort();
        }
        self.release_subscriptions();
        for (_, task) in lock(&self.inflight).drain() {
            task.abort();
        }
    }
}

impl SessionInner {
    /// Leaves every resource subscription of the session (it ended: DELETE,
    /// expiry, the transport closed); a hosted server is sent
    /// `resources/unsubscribe` for a URI no other session still holds.
    fn release_subscriptions(&self) {
        let held: Vec<(String, String)> = lock(&self.subscriptions)
            .drain()
            .map(|(key, _)| key)
            .collect();
        let mut last = Vec::new();
        for (server, uri) in held {
            self.gw.count_subscription(&server, &uri, false);
            if !self.gw.still_subscribed(&server, &uri) {
                last.push((server, uri));
            }
        }
        if last.is_empty() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(session = %self.id, subscriptions = last.len(), "an MCP session ended outside the async runtime; its servers were not sent resources/unsubscribe");
            return;
        };
        let rt = self.gw.runtime().clone();
        let session = self.id.clone();
        handle.spawn(async move {
            for (server, uri) in last {
                match rt.unsubscribe_resource(&server, &uri).await {
                    Ok(()) => tracing::debug!(session, server, uri, "unsubscribed the resource the ended MCP session held last"),
                    Err(e) => tracing::warn!(session, server, uri, error = %e, "resources/unsubscribe for an ended MCP session failed"),
                }
            }
        });
    }
}

#[derive(Debug, Clone)]
struct State {
    /// The revision `initialize` settled on (`None` before it).
    version: Option<&'static str>,
    initialized: bool,
    capabilities: Value,
    client: Value,
}

/// What one request may use of the client, from the session or (stateless
/// revision) from the request's own `_meta`.
#[derive(Debug, Clone)]
pub(crate) struct RequestCx {
    pub(crate) version: &'static str,
    pub(crate) capabilities: Value,
    /// Where messages tied to this request go; `None`: nowhere (a JSON
    /// response on HTTP).
    pub(crate) sink: Option<Sink>,
}

impl RequestCx {
    /// Whether the client can answer `elicitation/create` on this request.
    pub(crate) fn can_elicit(&self) -> bool {
        self.sink.is_some()
            && self.version != version::STATELESS
            && self
                .capabilities
                .get("elicitation")
                .is_some_and(Value::is_object)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn random_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No OS randomness: the id is still unique in this process, and an
        // HTTP session is bound to its caller besides.
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        b[..8].copy_from_slice(&n.to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    hex::encode(b)
}

impl Session {
    pub(crate) fn new(
        gw: Gateway,
        caller: Caller,
        profile: Option<(String, ProfileMatcher)>,
    ) -> Session {
        Session::with_state(
            gw,
            random_id(),
            caller,
            profile,
            State {
                version: None,
                initialized: false,
                capabilities: json!({}),
                client: Value::Null,
            },
        )
    }

    /// The session `id` rebuilt from its [`Session::snapshot`] (kept in the
    /// state store): `None` when the snapshot is not one this build wrote.
    pub(crate) fn restore(
        gw: Gateway,
        id: &str,
        caller: Caller,
        profile: Option<(String, ProfileMatcher)>,
        snapshot: &Value,
    ) -> Option<Session> {
        let version = snapshot.get("version")?.as_str()?;
        let version = version::SUPPORTED.iter().copied().find(|v| *v == version)?;
        let capabilities = snapshot.get("capabilities")?.clone();
        if !capabilities.is_object() {
            return None;
        }
        let session = Session::with_state(
            gw,
            id.to_owned(),
            caller,
            profile,
            State {
                version: Some(version),
                initialized: snapshot.get("initialized").and_then(Value::as_bool) == Some(true),
                capabilities,
                client: snapshot.get("client").cloned().unwrap_or(Value::Null),
            },
        );
        // What the session chose and found, as far as it is well formed.
        if let Some(pins) = snapshot.get("pins").and_then(Value::as_object) {
            let mut p = lock(&session.inner.pins);
            for (export, binding) in pins.iter().take(MAX_SESSION_TOOLS) {
                if let Some(b) = binding.as_str() {
                    p.insert(export.clone(), b.to_owned());
                }
            }
        }
        if let Some(loaded) = snapshot.get("loaded").and_then(Value::as_array) {
            let mut l = lock(&session.inner.loaded);
            for name in loaded.iter().take(MAX_SESSION_TOOLS) {
                if let Some(n) = name.as_str() {
                    l.insert(n.to_owned());
                }
            }
        }
        Some(session)
    }

    /// What rebuilds this session elsewhere (another serve, another node):
    /// the negotiated revision, the client's capabilities and info. `None`
    /// before `initialize` settled a revision.
    pub fn snapshot(&self) -> Option<Value> {
        let state = lock(&self.inner.state);
        Some(json!({
            "version": state.version?,
            "initialized": state.initialized,
            "capabilities": state.capabilities,
            "client": state.client,
            "pins": *lock(&self.inner.pins),
            "loaded": *lock(&self.inner.loaded),
        }))
    }

    fn with_state(
        gw: Gateway,
        id: String,
        caller: Caller,
        profile: Option<(String, ProfileMatcher)>,
        state: State,
    ) -> Session {
        Session {
            inner: Arc::new(SessionInner {
                gw,
                id,
                caller,
                profile,
                state: Mutex::new(state),
                inflight: Mutex::new(HashMap::new()),
                pending: Mutex::new(HashMap::new()),
                next_request: AtomicU64::new(1),
                request_prefix: {
                    let mut b = [0u8; 4];
                    let _ = getrandom::fill(&mut b);
                    format!("plugd-{}-", hex::encode(b))
                },
                notifier: Mutex::new(None),
                watcher: Mutex::new(None),
                events: Mutex::new(None),
                subscriptions: Mutex::new(HashMap::new()),
                pins: Mutex::new(HashMap::new()),
                loaded: Mutex::new(BTreeSet::new()),
                changed: std::sync::atomic::AtomicBool::new(false),
                user: Mutex::new(None),
            }),
        }
    }

    /// The session id (`Mcp-Session-Id` on HTTP).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Who the session serves.
    pub fn caller(&self) -> &Caller {
        &self.inner.caller
    }

    /// Sets the caller's own access token, from the request being served
    /// (a session belongs to one identity, so it is always that identity's
    /// latest): the calls it makes of a remote server with plugd.yaml
    /// `upstream_auth` carry it. `None`: the caller has none.
    pub fn set_user(&self, user: Option<plugd_host::dialect::UserToken>) {
        *lock(&self.inner.user) = user;
    }

    /// The caller's own access token, when it has one.
    pub fn user(&self) -> Option<plugd_host::dialect::UserToken> {
        lock(&self.inner.user).clone()
    }

    /// The profile it serves, if any.
    pub fn profile(&self) -> Option<&str> {
        self.inner.profile.as_ref().map(|(n, _)| n.as_str())
    }

    /// Whether the client said, at `initialize`, that it answers
    /// `elicitation/create`.
    pub fn can_elicit(&self) -> bool {
        let s = lock(&self.inner.state);
        s.capabilities
            .get("elicitation")
            .is_some_and(Value::is_object)
    }

    /// Whether the client said, at `initialize`, that it answers
    /// `sampling/createMessage`.
    pub fn can_sample(&self) -> bool {
        let s = lock(&self.inner.state);
        s.capabilities.get("sampling").is_some_and(Value::is_object)
    }

    /// Whether the answer to request `msg` may be preceded by messages to
    /// the client (progress, questions, log lines): HTTP streams it.
    pub fn may_stream(&self, msg: &Value) -> bool {
        msg.get("method").and_then(Value::as_str) == Some("tools/call")
            && tools::may_stream(self, msg.get("params").unwrap_or(&Value::Null))
    }

    /// The revision `initialize` settled on.
    pub fn protocol_version(&self) -> Option<&'static str> {
        lock(&self.inner.state).version
    }

    /// Sends messages not tied to a request (list_changed) to `sink`, and
    /// starts watching the catalog for them.
    pub fn set_notifier(&self, sink: Sink) {
        *lock(&self.inner.notifier) = Some(sink);
        let mut watcher = lock(&self.inner.watcher);
        if watcher.is_none() {
            *watcher = Some(tokio::spawn(watch_tools(
                Arc::downgrade(&self.inner),
                self.inner.gw.runtime().tool_changes(),
            )));
        }
        let mut events = lock(&self.inner.events);
        if events.is_none() {
            *events = Some(tokio::spawn(watch_servers(
                Arc::downgrade(&self.inner),
                self.inner.gw.runtime().mcp_events(),
            )));
        }
    }

    /// 2026-07-28 `subscriptions/listen`: this (request-scoped) session
    /// sends the catalog's list changes to `sink` from now on, as a
    /// handshake-made session would on its stream.
    pub fn listen(&self, sink: Sink) {
        lock(&self.inner.state).version = Some(version::STATELESS);
        self.set_notifier(sink);
    }

    /// Records that the client subscribed to (or left) `server`'s `uri`,
    /// which it names `client_uri`.
    pub(crate) fn subscribed(&self, server: &str, uri: &str, client_uri: &str, on: bool) {
        let key = (server.to_owned(), uri.to_owned());
        let mut subs = lock(&self.inner.subscriptions);
        let changed = if on {
            subs.insert(key, client_uri.to_owned()).is_none()
        } else {
            subs.remove(&key).is_some()
        };
        drop(subs);
        if changed {
            self.inner.gw.count_subscription(server, uri, on);
        }
    }

    /// Handles one message from the client. Returns the response to a
    /// request; `None` for notifications, responses, and a request the
    /// client cancelled (MCP: no response after a cancel).
    pub async fn handle(&self, msg: Value, sink: Option<Sink>) -> Option<Value> {
        let id_value = |id: Option<Id>| serde_json::to_value(id).unwrap_or(Value::Null);
        match Message::from_value(msg) {
            Ok(Message::Request(r)) => Some(
                self.request(id_value(Some(r.id)), r.method, r.params, sink)
                    .await?,
            ),
            Ok(Message::Notification(n)) => {
                self.notification(&n.method, n.params);
                None
            }
            Ok(Message::Response(r)) => {
                if let Some(id) = r.id {
                    let mut rest = Map::new();
                    match r.outcome {
                        Ok(result) => rest.insert("result".into(), result),
                        Err(e) => rest.insert(
                            "error".into(),
                            serde_json::to_value(e).unwrap_or(Value::Null),
                        ),
                    };
                    self.answer(&id, rest);
                }
                None
            }
            Err(e) => {
                let id = match &e {
                    DecodeError::Invalid { id, .. } => id.clone(),
                    _ => None,
                };
                Some(respond(id_value(id), Err(error(e.code(), e.to_string()))))
            }
        }
    }

    async fn request(
        &self,
        id: Value,
        method: String,
        params: Option<Value>,
        sink: Option<Sink>,
    ) -> Option<Value> {
        let key = id.to_string();
        let cx = match self.request_cx(&method, params.as_ref(), sink) {
            Ok(cx) => cx,
            Err(e) => return Some(respond(id, Err(e))),
        };
        if lock(&self.inner.inflight).len() >= MAX_IN_FLIGHT {
            return Some(respond(
                id,
                Err(error(
                    code::INTERNAL,
                    format!(
                        "more than {MAX_IN_FLIGHT} requests in flight on this session; wait for some to finish"
                    ),
                )),
            ));
        }
        // Run here, not in a task of its own (issue 29: a task per request
        // cost a spawn and a copy of this large future): abortable, so a
        // `notifications/cancelled` or the session's end stops it, and a
        // panic is caught and answered as an internal error.
        let (abort, registration) = AbortHandle::new_pair();
        lock(&self.inner.inflight).insert(key.clone(), abort);
        let _unlist = Unlist {
            inflight: &self.inner.inflight,
            key,
        };
        let call = AssertUnwindSafe(self.dispatch(&method, params, cx)).catch_unwind();
        match Abortable::new(call, registration).await {
            Ok(Ok(result)) => Some(respond(id, result)),
            Err(Aborted) => None,
            Ok(Err(panic)) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(session = %self.inner.id, method, panic = %why, "MCP request handler panicked");
                Some(respond(id, Err(error(code::INTERNAL, "internal error"))))
            }
        }
    }

    /// The revision and capabilities a request is served under.
    fn request_cx(
        &self,
        method: &str,
        params: Option<&Value>,
        sink: Option<Sink>,
    ) -> Result<RequestCx, Value> {
        let meta = params.and_then(|p| p.get("_meta"));
        let stateless = version::meta_revision(params).and_then(Value::as_str);
        if let Some(v) = stateless {
            if v != version::STATELESS && !version::is_supported(v) {
                return Err(json!({
                    "code": code::INVALID_PARAMS,
                    "message": format!("unsupported protocol version {v:?}"),
                    "data": {"supported": version::SUPPORTED, "requested": v},
                }));
            }
            if v == version::STATELESS {
                return Ok(RequestCx {
                    version: version::STATELESS,
                    capabilities: meta
                        .and_then(|m| m.get(version::META_CLIENT_CAPABILITIES))
                        .cloned()
                        .unwrap_or_else(|| json!({})),
                    sink,
                });
            }
        }
        let state = lock(&self.inner.state);
        match state.version {
            Some(v) => Ok(RequestCx {
                version: v,
                capabilities: state.capabilities.clone(),
                sink,
            }),
            None if matches!(method, "initialize" | "ping" | "server/discover") => Ok(RequestCx {
                version: version::LATEST_STATEFUL,
                capabilities: json!({}),
                sink,
            }),
            None => Err(error(
                code::INVALID_REQUEST,
                format!(
                    "{method} before initialize; send initialize first (or name protocol version {} in _meta)",
                    version::STATELESS
                ),
            )),
        }
    }

    async fn dispatch(
        &self,
        method: &str,
        params: Option<Value>,
        cx: RequestCx,
    ) -> Result<Value, Value> {
        let params = params.unwrap_or_else(|| json!({}));
        if !params.is_object() {
            return Err(error(code::INVALID_PARAMS, "params must be an object"));
        }
        let stateless = cx.version == version::STATELESS;
        if stateless && REMOVED_IN_STATELESS.contains(&method) {
            return Err(json!({
                "code": code::METHOD_NOT_FOUND,
                "message": format!("method {method:?} is not part of MCP revision {} (it has no handshake, no sessions and no server-side log level or subscriptions); see server/discover", version::STATELESS),
                "data": {"method": method, "revision": version::STATELESS},
            }));
        }
        let out = match method {
            "initialize" => self.initialize(&params),
            "server/discover" => Ok(self.discover()),
            "ping" => Ok(json!({})),
            "logging/setLevel" => match params.get("level").and_then(Value::as_str) {
                Some(_) => Ok(json!({})),
                None => Err(error(
                    code::INVALID_PARAMS,
                    "logging/setLevel needs a \"level\"",
                )),
            },
            "tools/list" => tools::list(self, &cx).await,
            "tools/call" => tools::call(self, &params, &cx).await,
            "resources/list" => catalog::resources(self).await,
            "resources/templates/list" => catalog::templates(self).await,
            "resources/read" => catalog::read(self, &params, stateless).await,
            "resources/subscribe" => catalog::subscribe(self, &params, true).await,
            "resources/unsubscribe" => catalog::subscribe(self, &params, false).await,
            "prompts/list" => catalog::prompts(self).await,
            "prompts/get" => catalog::get_prompt(self, &params, stateless).await,
            "completion/complete" => catalog::complete(self, &params).await,
            _ => Err(error(
                code::METHOD_NOT_FOUND,
                format!("method {method:?} is not offered by plugd's MCP gateway"),
            )),
        }?;
        Ok(
            if cx.version == version::STATELESS || method == "server/discover" {
                stateless_result(method, out)
            } else {
                out
            },
        )
    }

    fn initialize(&self, params: &Value) -> Result<Value, Value> {
        let Some(requested) = params.get("protocolVersion").and_then(Value::as_str) else {
            return Err(error(
                code::INVALID_PARAMS,
                "initialize needs \"protocolVersion\"",
            ));
        };
        let chosen = version::negotiate(requested);
        {
            let mut state = lock(&self.inner.state);
            state.version = Some(chosen);
            state.capabilities = params
                .get("capabilities")
                .filter(|c| c.is_object())
                .cloned()
                .unwrap_or_else(|| json!({}));
            state.client = params.get("clientInfo").cloned().unwrap_or(Value::Null);
        }
        let client = params
            .get("clientInfo")
            .map(|c| c.to_string())
            .unwrap_or_default();
        tracing::info!(
            session = %self.inner.id,
            caller = %self.inner.caller.name,
            client = %client,
            requested,
            chosen,
            "MCP client initialized"
        );
        Ok(json!({
            "protocolVersion": chosen,
            "capabilities": self.capabilities(),
            "serverInfo": self.server_info(),
            "instructions": self.instructions(),
        }))
    }

    fn discover(&self) -> Value {
        json!({
            "supportedVersions": version::SUPPORTED,
            "capabilities": self.capabilities(),
            "serverInfo": self.server_info(),
            "instructions": self.instructions(),
            // Where 2026-07-28 has the server identify itself.
            "_meta": {"io.modelcontextprotocol/serverInfo": self.server_info()},
        })
    }

    fn capabilities(&self) -> Value {
        json!({
            "tools": {"listChanged": true},
            "resources": {"subscribe": true, "listChanged": true},
            "prompts": {"listChanged": true},
            "completions": {},
            "logging": {},
        })
    }

    fn server_info(&self) -> Value {
        json!({
            "name": SERVER_NAME,
            "title": "plugd plugin runtime",
            "version": self.inner.gw.inner.version,
        })
    }

    fn instructions(&self) -> String {
        let scope = match (&self.inner.caller.org, self.profile()) {
            (Some(o), Some(p)) => format!("the tools bound to org {:?} in profile {p:?}", o.org_id),
            (Some(o), None) => format!("the tools bound to org {:?}", o.org_id),
            (None, Some(p)) => format!("the tools of profile {p:?}"),
            (None, None) => "every enabled tool".into(),
        };
        format!(
            "plugd serves {scope} of the approved plugins in {}. Calls pass plugd's governance: high and critical tools need a person's approval.",
            self.inner.gw.runtime().dir().display()
        )
    }

    fn notification(&self, method: &str, params: Option<Value>) {
        match method {
            "notifications/initialized" => lock(&self.inner.state).initialized = true,
            "notifications/cancelled" => {
                let Some(id) = params.as_ref().and_then(|p| p.get("requestId")) else {
                    return;
                };
                if let Some(task) = lock(&self.inner.inflight).remove(&id.to_string()) {
                    let reason = params
                        .as_ref()
                        .and_then(|p| p.get("reason"))
                        .map(|r| r.to_string())
                        .unwrap_or_default();
                    tracing::info!(session = %self.inner.id, request = %id, reason = %reason, "MCP client cancelled a request");
                    task.abort();
                }
            }
            _ => tracing::debug!(session = %self.inner.id, method, "MCP notification ignored"),
        }
    }

    /// A response from the client to a request plugd sent it; whether a
    /// request of this session here was waiting for it.
    fn answer(&self, id: &Id, rest: Map<String, Value>) -> bool {
        let key = match id {
            Id::Str(s) => s.clone(),
            Id::Int(n) => n.to_string(),
        };
        let Some(tx) = lock(&self.inner.pending).remove(&key) else {
            tracing::debug!(session = %self.inner.id, id = %id, "response to no request of plugd's here");
            return false;
        };
        let _ = tx.send(Value::Object(rest));
        true
    }

    /// Whether `msg` is a JSON-RPC response (no `method`, an `id`, a
    /// `result` or an `error`) that no request of this session here waits
    /// for: another node serving the session may have asked it.
    pub fn answers_elsewhere(&self, msg: &Value) -> bool {
        let is_response = msg.get("method").is_none()
            && (msg.get("result").is_some() || msg.get("error").is_some());
        let key = match msg.get("id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return false,
        };
        is_response && !lock(&self.inner.pending).contains_key(&key)
    }

    /// Delivers the client's response `msg` (handed over by another node)
    /// to the request of this session waiting for it; whether one was.
    pub fn deliver_answer(&self, msg: Value) -> bool {
        match Message::from_value(msg) {
            Ok(Message::Response(r)) => {
                let Some(id) = r.id else { return false };
                let mut rest = Map::new();
                match r.outcome {
                    Ok(result) => rest.insert("result".into(), result),
                    Err(e) => rest.insert(
                        "error".into(),
                        serde_json::to_value(e).unwrap_or(Value::Null),
                    ),
                };
                self.answer(&id, rest)
            }
            _ => false,
        }
    }

    /// Sends request `method` to the client through `sink` and waits up to
    /// `timeout` for its answer: `Ok(result)`, or `Err` saying why not.
    pub(crate) async fn ask_client(
        &self,
        sink: &Sink,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        let n = self.inner.next_request.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{n}", self.inner.request_prefix);
        let (tx, rx) = oneshot::channel();
        lock(&self.inner.pending).insert(id.clone(), tx);
        let _cleanup = PendingCleanup {
            session: Arc::downgrade(&self.inner),
            id: id.clone(),
        };
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if sink.send(msg).is_err() {
            return Err("the client's stream is closed".into());
        }
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => Err(format!(
                "the client did not answer {method} within {} s",
                timeout.as_secs()
            )),
            Ok(Err(_)) => Err("the session ended".into()),
            Ok(Ok(reply)) => match (reply.get("result"), reply.get("error")) {
                (Some(r), _) => Ok(r.clone()),
                (None, Some(e)) => Err(format!(
                    "the client answered {method} with an error: {}",
                    e.get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("(no message)")
                )),
                (None, None) => Err(format!(
                    "the client's answer to {method} has neither result nor error"
                )),
            },
        }
    }

    /// Whether what the session chose or found (the binding each export
    /// resolved to, the tools its searches loaded) changed since the last
    /// call; a transport that keeps sessions stores its snapshot again.
    pub fn take_changed(&self) -> bool {
        self.inner.changed.swap(false, Ordering::Relaxed)
    }

    /// Tells the client its tool list changed (a search found tools):
    /// on the session's stream, else on `sink` (the request's stream),
    /// only after the handshake.
    pub(crate) fn tools_changed(&self, sink: Option<&Sink>) {
        if !self.ready() {
            return;
        }
        if !self.notify("notifications/tools/list_changed")
            && let Some(sink) = sink
        {
            let _ =
                sink.send(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}));
        }
    }

    /// Sends a notification not tied to a request; `false` when no stream
    /// is open for it.
    fn notify(&self, method: &str) -> bool {
        self.notify_with(method, None)
    }

    fn notify_with(&self, method: &str, params: Option<Value>) -> bool {
        let sink = lock(&self.inner.notifier).clone();
        let mut msg = json!({"jsonrpc": "2.0", "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        sink.is_some_and(|s| s.send(msg).is_ok())
    }

    /// Whether the client finished the handshake.
    fn ready(&self) -> bool {
        let s = lock(&self.inner.state);
        s.version.is_some()
    }

    /// Drops the session's notification stream (the transport is gone).
    pub fn set_closed(&self) {
        *lock(&self.inner.notifier) = None;
    }

    /// Fails every request in flight and every question pending (the
    /// transport closed).
    pub fn close(&self) {
        for (_, task) in lock(&self.inner.inflight).drain() {
            task.abort();
        }
        lock(&self.inner.pending).clear();
        if let Some(w) = lock(&self.inner.watcher).take() {
            w.abort();
        }
        if let Some(w) = lock(&self.inner.events).take() {
            w.abort();
        }
        *lock(&self.inner.notifier) = None;
    }
}

struct PendingCleanup {
    session: Weak<SessionInner>,
    id: String,
}

impl Drop for PendingCleanup {
    fn drop(&mut self) {
        if let Some(s) = self.session.upgrade() {
            lock(&s.pending).remove(&self.id);
        }
    }
}

/// A JSON-RPC response.
pub(crate) fn respond(id: Value, outcome: Result<Value, Value>) -> Value {
    match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
    }
}

/// A stateless-revision result: `resultType: "complete"`, and for the
/// cacheable methods a cache hint that keeps clients asking (the catalog
/// changes with approvals, and depends on who asks).
fn stateless_result(method: &str, mut out: Value) -> Value {
    if let Some(obj) = out.as_object_mut() {
        obj.entry("resultType").or_insert_with(|| json!("complete"));
        if matches!(
            method,
            "server/discover"
                | "tools/list"
                | "resources/list"
                | "resources/templates/list"
                | "prompts/list"
                | "resources/read"
        ) {
            obj.entry("cacheScope").or_insert_with(|| json!("private"));
            obj.entry("ttlMs").or_insert_with(|| json!(0));
        }
    }
    out
}

/// Passes the hosted servers' resource updates (of URIs this session
/// subscribed to) and list changes (of servers it sees) on to the client.
async fn watch_servers(
    session: Weak<SessionInner>,
    mut events: tokio::sync::broadcast::Receiver<plugd_host::dialect::McpEvent>,
) {
    use plugd_host::dialect::McpEvent;
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let event = match events.recv().await {
            Ok(e) => e,
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "an MCP session fell behind the servers' notifications"
                );
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let Some(inner) = session.upgrade() else {
            return;
        };
        let s = Session { inner };
        if !s.ready() {
            continue;
        }
        match event {
            McpEvent::ResourceUpdated { server, uri } => {
                let client = lock(&s.inner.subscriptions).get(&(server, uri)).cloned();
                if let Some(uri) = client {
                    s.notify_with("notifications/resources/updated", Some(json!({"uri": uri})));
                }
            }
            McpEvent::ResourcesListChanged { server } if catalog::scope(&s).await.has(&server) => {
                s.notify("notifications/resources/list_changed");
            }
            McpEvent::PromptsListChanged { server } if catalog::scope(&s).await.has(&server) => {
                s.notify("notifications/prompts/list_changed");
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

/// Sends `notifications/tools/list_changed` when the tools this session
/// sees change (debounced; only after the handshake).
async fn watch_tools(session: Weak<SessionInner>, mut changes: tokio::sync::watch::Receiver<u64>) {
    let mut last = match session.upgrade() {
        Some(inner) => tools::visible_names(&Session { inner }).await,
        None => return,
    };
    loop {
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(LIST_CHANGED_DEBOUNCE).await;
        changes.borrow_and_update();
        let Some(inner) = session.upgrade() else {
            return;
        };
        let s = Session { inner };
        let names = tools::visible_names(&s).await;
        if names != last {
            last = names;
            if s.ready() {
                s.notify("notifications/tools/list_changed");
                tracing::debug!(session = %s.inner.id, tools = last.len(), "sent tools/list_changed");
            }
        }
    }
}
