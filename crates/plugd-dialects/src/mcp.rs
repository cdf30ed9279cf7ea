//! The mcp dialect: Model Context Protocol servers over stdio or Streamable
//! HTTP (line-delimited JSON-RPC 2.0, protocol revisions 2026-07-28,
//! 2025-11-25, 2025-06-18, 2025-03-26 and 2024-11-05).
//!
//! * Negotiation: by default the `initialize` handshake first, and
//!   `server/discover` only when the server refuses it (`-32022`, or no
//!   `initialize`), so a server speaking both keeps its session features;
//!   with plugd.yaml `stateless: true` ([`McpState::stateless`]) as the
//!   official SDKs' clients do it: first
//!   `server/discover` at the stateless revision 2026-07-28 (with the
//!   `_meta` below), answered within [`DISCOVER_TIMEOUT`]. A server listing
//!   it in `supportedVersions` is spoken to statelessly: no `initialize`, no
//!   `notifications/initialized`, the capabilities of the discover result,
//!   and every request carrying `io.modelcontextprotocol/protocolVersion`,
//!   `clientCapabilities` and `clientInfo` in `_meta` ([`McpProtocol`]).
//!   A `-32022` refusal whose `data.supported` names 2026-07-28 is asked
//!   once more (the refusal was of that request, SEP-2575's retry).
//!   Any other answer (an error such as `-32601`, a malformed or oversized
//!   result, only stateful revisions, silence) falls back to the handshake
//!   below, which then has its whole timeout; only `-32022` naming
//!   nothing but revisions plugd lacks is refused. A `tools/call` answered
//!   `resultType: "input_required"` has its `inputRequests` (elicitation,
//!   sampling) answered like the same requests sent on their own, and is
//!   sent again with `inputResponses` and `requestState`, at most
//!   [`MAX_INPUT_ROUNDS`] times; any other result that is not
//!   `"complete"` fails, saying what the server asked for (unless the
//!   gateway's client is on 2026-07-28 itself: `CallContext::rounds`, the
//!   result is returned for it to answer). A stateless server on stdio
//!   declaring `listChanged` is sent one `subscriptions/listen` for the
//!   connection's life, where that revision has it send its list changes.
//! * Handshake: `initialize` (plugd offers [`PROTOCOL_VERSION`], accepts any
//!   of [`SUPPORTED_VERSIONS`] back and refuses the rest, which kills the
//!   server), then `notifications/initialized`, then `tools/list` over at most
//!   [`MAX_PAGES`] pages.
//! * Tool names: `<server>/<tool>` in the registry, the MCP tool name on the
//!   wire; `inputSchema` is the input schema.
//! * Calls: `tools/call {name, arguments, _meta: {progressToken}}`. The token
//!   is the host's request id, inserted by [`McpProtocol`] when the request is
//!   encoded, so `notifications/progress` maps straight back to the call as
//!   an [`Incoming::Event`]. `isError: true` becomes
//!   [`ToolError::ExecutionFailed`] with the text content; any other result
//!   is returned whole.
//! * Tasks: a tool listed with `execution.taskSupport: "required"` by a
//!   server declaring `tasks.requests.tools.call` is called task-augmented
//!   and polled to its end in [`crate::mcp_tasks`] (hidden with a warning
//!   when the server lacks the capability); `notifications/tasks/status`
//!   wakes the poll.
//! * Cancel: a caller that gives up sends `notifications/cancelled
//!   {requestId, reason}`; a server still sending progress or a response for
//!   it after [`CANCEL_GRACE`] is killed (`expects_ack: false`), which the
//!   supervisor does not count as a crash (see `Supervised::call_tool` for
//!   the other calls in flight).
//! * Roots: offered only to a server the operator gave roots in plugd.yaml
//!   (`mcp.servers.NAME.roots`, [`HostServices::mcp_roots`]); then
//!   `initialize` declares `roots` and `roots/list` answers those
//!   directories, as they are at each request (serve sends
//!   `notifications/roots/list_changed` when plugd.yaml changes them). Any
//!   other server is not told plugd has roots and its
//!   `roots/list` gets `-32601`: the workspace (`.mcp.json`, `plugd.yaml`,
//!   `.plugd/`) is never offered by default.
//! * Resources, resource templates, prompts and completion: in
//!   [`crate::mcp_features`], sent only when `initialize` declared them;
//!   `notifications/resources/updated` (for a subscribed URI),
//!   `notifications/resources/list_changed` and
//!   `notifications/prompts/list_changed` drop the cached listings and go out
//!   on the host's [`McpEvents`].
//! * Server requests: `ping` → `{}`, `roots/list` as above,
//!   `sampling/createMessage` and `elicitation/create` → the client of the
//!   newest call in flight that takes them ([`CallContext::client`], set by
//!   plugd's MCP gateway), else the host's [`ServerRequests`]
//!   ([`HostServices::mcp_requests`]: the runtime asks a person, or the
//!   LLM provider when the operator allows it), else [`NOT_SUPPORTED`]
//!   saying nobody can be asked; anything else `-32601`. `notifications/message` is logged and
//!   passed to that client too. `notifications/tools/list_changed` asks the supervisor to
//!   re-read the catalog (bursts are coalesced).
//! * Shutdown: MCP has no shutdown request; SIGTERM to the process group, and
//!   the supervisor SIGKILLs after the spec's `shutdown_grace`.
//!
//! **Why one file** (~1,500 product lines): it is one contract's dialect,
//! and the version negotiation (`open`, `judge_discover`, the stateless
//! `_meta`), the handshake, the paginated `tools/list` with its checks and
//! `tools/call` with its input rounds all read and write the same
//! connection state (`McpState`) and protocol (`McpProtocol`). The parts
//! with a seam of their own are already apart: task-augmented calls
//! (`mcp_tasks.rs`), resources, prompts and completion
//! (`mcp_features.rs`), host-wide MCP state (plugd-host's
//! `dialect/mcp_host.rs`).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use plugd_manifest::PluginSpec;
use plugd_wire::{ErrorObject, Framing, Id, codes};
use serde_json::{Value, json};

use crate::mcp_features::{Envelope, FeatureState, ListKind};
use crate::mcp_tasks::{self, TaskWatchers};
use plugd_host::dialect::{
    CallContext, CallFuture, Capabilities, CatalogChanged, ClientHandle, Dialect, DialectFuture,
    HandshakeArgs, HandshakeFuture, McpEvent, McpEvents, McpRequests, McpRoots, McpSubscriptions,
    Setup, SetupArgs, ToolCall,
};
use plugd_host::model::{Handshake, HandshakeError, ToolDef, ToolError, ToolMeta, map_tool_error};
use plugd_host::peer::{CallError, CancelPolicy, Handler, HandlerFuture, Peer};
use plugd_host::protocol::{Incoming, JsonRpc, Protocol, decode_jsonrpc};
use plugd_host::supervisor::Conn;

/// The protocol revision plugd offers in `initialize` (shared with the
/// gateway in `plugd-mcp`).
pub const PROTOCOL_VERSION: &str = plugd_mcp::LATEST_STATEFUL;

/// The revisions plugd accepts in the `initialize` reply.
pub const SUPPORTED_VERSIONS: [&str; 4] = plugd_mcp::version::STATEFUL;

/// Most `tools/list` pages read for one catalog.
pub const MAX_PAGES: usize = 100;

/// Most tools accepted from one server.
pub const MAX_TOOLS: usize = 10_000;

/// How long a server has to go quiet about a cancelled request.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// JSON-RPC error code plugd answers `sampling/createMessage` and
/// `elicitation/create` with: in the implementation-defined server-error
/// range, distinct from `-32601` (which means "no such method").
pub const NOT_SUPPORTED: i64 = -32001;

/// How long bursts of `notifications/tools/list_changed` are gathered into
/// one catalog refresh.
const LIST_CHANGED_DEBOUNCE: Duration = Duration::from_millis(50);

/// Longest MCP tool name accepted (the 2025-11-25 revision's limit).
const MAX_TOOL_NAME: usize = 128;

/// The MCP envelope: JSON-RPC over lines, with the progress token of
/// `tools/call` set to the host request id, progress notifications routed to
/// their call, and `notifications/cancelled` as the cancel. On a stateless
/// (2026-07-28) connection every request also carries the revision, client
/// capabilities and client info in `_meta` ([`FeatureState::set_stateless`]).
#[derive(Debug, Clone, Default)]
pub struct McpProtocol {
    envelope: Envelope,
}

impl McpProtocol {
    /// The envelope of a connection whose per-request `_meta` (once its
    /// handshake sets it) is `envelope`.
    pub fn new(envelope: Envelope) -> Self {
        McpProtocol { envelope }
    }
}

impl Protocol for McpProtocol {
    fn framing(&self) -> Framing {
        Framing::Lines
    }

    fn encode_request(&self, id: i64, method: &str, params: Option<Value>) -> Vec<u8> {
        let stateless = self.envelope.get();
        let params = if method == "tools/call" || stateless.is_some() {
            let mut params = params.unwrap_or_else(|| json!({}));
            if let Some(obj) = params.as_object_mut() {
                let meta = obj.entry("_meta").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    if method == "tools/call" {
                        meta.insert("progressToken".into(), json!(id));
                    }
                    for (k, v) in stateless.into_iter().flatten() {
                        // The capabilities of the client plugd relays a
                        // call's input_required to (set by the gateway)
                        // stand in for plugd's own.
                        if k == plugd_mcp::META_CLIENT_CAPABILITIES && meta.contains_key(k) {
                            continue;
                        }
                        meta.insert(k.clone(), v.clone());
                    }
                }
            }
            Some(params)
        } else {
            params
        };
        JsonRpc::LINES.encode_request(id, method, params)
    }

    fn encode_notification(&self, method: &str, params: Option<Value>) -> Vec<u8> {
        JsonRpc::LINES.encode_notification(method, params)
    }

    fn encode_response(&self, id: Id, outcome: Result<Value, ErrorObject>) -> Vec<u8> {
        JsonRpc::LINES.encode_response(id, outcome)
    }

    fn encode_cancel(&self, id: i64, reason: &str) -> Option<Vec<u8>> {
        Some(JsonRpc::LINES.encode_notification(
            "notifications/cancelled",
            Some(json!({"requestId": id, "reason": reason})),
        ))
    }

    fn decode(&self, bytes: &[u8]) -> Result<Incoming, String> {
        match decode_jsonrpc(bytes)? {
            Incoming::Notification { method, params } if method == "notifications/progress" => {
                match params.as_ref().and_then(progress_token) {
                    Some(id) => Ok(Incoming::Event {
                        request_id: Some(id),
                        event: params.unwrap_or(Value::Null),
                    }),
                    // A token plugd never issued: let the handler log it.
                    None => Ok(Incoming::Notification { method, params }),
                }
            }
            other => Ok(other),
        }
    }
}

/// The host request id a progress notification's token names (plugd sends
/// integers; a server may echo it as a string).
fn progress_token(params: &Value) -> Option<i64> {
    match params.get("progressToken")? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Serves an MCP server's requests and notifications.
pub struct McpHandler {
    plugin: Arc<str>,
    /// The roots of every server, read at each `roots/list`.
    roots: McpRoots,
    /// Whether this connection was offered the `roots` capability (the
    /// server had roots when it started).
    offered_roots: bool,
    catalog_changed: CatalogChanged,
    refresh_pending: Arc<AtomicBool>,
    /// The connection's state (its cached listings).
    state: Arc<McpState>,
    /// Where resource and prompt changes go.
    events: McpEvents,
    /// Who answers elicitation and sampling outside gateway calls.
    requests: McpRequests,
}

impl McpHandler {
    /// A handler for `plugin`, answering `roots/list` with its current
    /// entry in `roots` (and `-32601` when it had none at the start: the
    /// server was not offered roots).
    pub fn new(plugin: &str, roots: McpRoots, catalog_changed: CatalogChanged) -> Self {
        let offered_roots = roots.get(plugin).is_some();
        McpHandler {
            plugin: plugin.into(),
            offered_roots,
            roots,
            catalog_changed,
            refresh_pending: Arc::new(AtomicBool::new(false)),
            state: Arc::new(McpState::new(offered_roots, McpSubscriptions::default())),
            events: McpEvents::default(),
            requests: McpRequests::default(),
        }
    }

    /// Passes elicitation and sampling that no gateway client takes to
    /// `requests`.
    pub fn with_requests(mut self, requests: McpRequests) -> Self {
        self.requests = requests;
        self
    }

    /// Forwards resource and prompt changes to `events`, keeping `state`'s
    /// cache and subscriptions.
    pub fn with_features(mut self, state: Arc<McpState>, events: McpEvents) -> Self {
        self.state = state;
        self.events = events;
        self
    }
}

impl Handler for McpHandler {
    fn request(&self, method: String, params: Option<Value>) -> HandlerFuture {
        let outcome = match method.as_str() {
            "ping" => Ok(json!({})),
            "roots/list" => match self
                .offered_roots
                .then(|| self.roots.get(&self.plugin).unwrap_or_default())
            {
                Some(roots) => Ok(json!({"roots": roots.iter().map(|r| json!({
                    "uri": file_uri(r),
                    "name": r.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".into()),
                })).collect::<Vec<_>>()})),
                None => {
                    tracing::info!(plugin = %self.plugin, "roots/list refused: no roots configured for this server");
                    Err(ErrorObject::new(
                        codes::METHOD_NOT_FOUND,
                        format!(
                            "plugd offers server {} no roots (it did not declare the roots capability); the operator can list directories in plugd.yaml mcp.servers.{}.roots",
                            self.plugin, self.plugin
                        ),
                    ))
                }
            },
            "sampling/createMessage" | "elicitation/create" => {
                match self.state.client_for(&method) {
                    Some(link) => {
                        tracing::info!(plugin = %self.plugin, method, "server request passed to the calling MCP client");
                        return link.0.request(method, params.unwrap_or_else(|| json!({})));
                    }
                    None => match self.requests.get() {
                        Some(host) => {
                            tracing::info!(plugin = %self.plugin, method, "server request passed to the runtime");
                            return host.answer(
                                &self.plugin,
                                &method,
                                params.unwrap_or_else(|| json!({})),
                            );
                        }
                        None => {
                            tracing::info!(plugin = %self.plugin, method, "server request refused: nobody can answer it");
                            Err(ErrorObject::new(
                                NOT_SUPPORTED,
                                format!(
                                    "plugd has nobody to ask {method} for server {}: this host has no runtime to answer it and no MCP client of a call takes it",
                                    self.plugin
                                ),
                            ))
                        }
                    },
                }
            }
            _ => Err(ErrorObject::new(
                codes::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
            )),
        };
        Box::pin(async move { outcome })
    }

    fn notification(&self, method: String, params: Option<Value>) {
        match method.as_str() {
            "notifications/tools/list_changed" => {
                if self.refresh_pending.swap(true, Ordering::AcqRel) {
                    return; // a refresh is already scheduled
                }
                let pending = self.refresh_pending.clone();
                let changed = self.catalog_changed.clone();
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(async move {
                            tokio::time::sleep(LIST_CHANGED_DEBOUNCE).await;
                            pending.store(false, Ordering::Release);
                            changed();
                        });
                    }
                    Err(_) => {
                        pending.store(false, Ordering::Release);
                        changed();
                    }
                }
            }
            "notifications/resources/updated" => {
                let uri = params
                    .as_ref()
                    .and_then(|p| p.get("uri"))
                    .and_then(Value::as_str);
                match uri {
                    Some(uri) if self.state.subscriptions.contains(&self.plugin, uri) => {
                        self.events.send(McpEvent::ResourceUpdated {
                            server: self.plugin.to_string(),
                            uri: uri.to_owned(),
                        });
                    }
                    _ => tracing::debug!(
                        plugin = %self.plugin,
                        "resources/updated for a URI plugd is not subscribed to ignored: {}",
                        params.as_ref().map(preview).unwrap_or_default()
                    ),
                }
            }
            "notifications/resources/list_changed" => {
                self.state
                    .features
                    .invalidate(&[ListKind::Resources, ListKind::Templates]);
                self.events.send(McpEvent::ResourcesListChanged {
                    server: self.plugin.to_string(),
                });
            }
            "notifications/prompts/list_changed" => {
                self.state.features.invalidate(&[ListKind::Prompts]);
                self.events.send(McpEvent::PromptsListChanged {
                    server: self.plugin.to_string(),
                });
            }
            "notifications/tasks/status" => {
                if !self.state.tasks.status_changed(params.as_ref()) {
                    tracing::debug!(plugin = %self.plugin, "tasks/status for a task no call waits on ignored");
                }
            }
            "notifications/message" => {
                let p = params.unwrap_or(Value::Null);
                if let Some(link) = self.state.latest_client() {
                    link.0.notify("notifications/message", p.clone());
                }
                let level = p.get("level").and_then(Value::as_str).unwrap_or("info");
                let data = p.get("data").map(Value::to_string).unwrap_or_default();
                let data: String = data.chars().take(2000).collect();
                match level {
                    "debug" => tracing::debug!(plugin = %self.plugin, "server log: {data}"),
                    "info" | "notice" => {
                        tracing::info!(plugin = %self.plugin, "server log: {data}")
                    }
                    "warning" => tracing::warn!(plugin = %self.plugin, "server log: {data}"),
                    _ => tracing::error!(plugin = %self.plugin, level, "server log: {data}"),
                }
            }
            other => {
                tracing::debug!(plugin = %self.plugin, method = other, "server notification ignored")
            }
        }
    }
}

/// The `capabilities` plugd declares in `initialize`: `elicitation` and
/// `sampling` (answered during calls made through plugd's MCP gateway by a
/// client that supports them, else by the host's [`ServerRequests`]: a
/// person, or the LLM provider when the operator allows it), and `roots`
/// only when the operator configured roots for the server. No `tasks`:
/// plugd makes task-augmented calls (which needs no client capability) but
/// receives none and lists none.
pub fn client_capabilities(offers_roots: bool) -> Value {
    let mut caps = json!({"elicitation": {}, "sampling": {}});
    if offers_roots {
        caps["roots"] = json!({"listChanged": true});
    }
    caps
}

/// `file://` URI of an absolute path, percent-encoding everything but
/// unreserved characters and `/`.
pub fn file_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// What plugd told one MCP connection at its start, and what it learned
/// of the server ([`Conn::state`]).
#[derive(Debug)]
pub struct McpState {
    /// Whether `initialize` declared the `roots` capability.
    pub offered_roots: bool,
    /// plugd.yaml `mcp.servers.NAME.stateless`: `Some(true)` tries the
    /// stateless revision first, `Some(false)` never speaks it, unset tries
    /// the handshake first (see [`open`]).
    pub stateless: Option<bool>,
    /// The server's capabilities and the cached listings.
    pub features: FeatureState,
    /// The plugin's resource subscriptions (shared by all its runs).
    pub subscriptions: McpSubscriptions,
    /// The calls waiting on a task, woken by `notifications/tasks/status`.
    pub tasks: TaskWatchers,
    /// The clients of the calls in flight that have one, oldest first.
    /// MCP over stdio does not say which call a server request belongs to,
    /// so requests and log messages go to the newest call's client.
    clients: std::sync::Mutex<Vec<(u64, ClientHandle)>>,
    next_call: std::sync::atomic::AtomicU64,
}

impl McpState {
    /// State for a connection offered roots or not.
    pub fn new(offered_roots: bool, subscriptions: McpSubscriptions) -> Self {
        McpState {
            offered_roots,
            stateless: None,
            features: FeatureState::default(),
            subscriptions,
            tasks: TaskWatchers::default(),
            clients: std::sync::Mutex::new(Vec::new()),
            next_call: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, Vec<(u64, ClientHandle)>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The newest call's client that takes `method`.
    fn client_for(&self, method: &str) -> Option<ClientHandle> {
        self.clients()
            .iter()
            .rev()
            .find(|(_, c)| c.0.accepts(method))
            .map(|(_, c)| c.clone())
    }

    fn latest_client(&self) -> Option<ClientHandle> {
        self.clients().last().map(|(_, c)| c.clone())
    }

    /// Registers a call's client until the guard drops.
    fn enter(self: &Arc<Self>, client: ClientHandle) -> ClientGuard {
        let id = self.next_call.fetch_add(1, Ordering::Relaxed);
        self.clients().push((id, client));
        ClientGuard {
            state: self.clone(),
            id,
        }
    }
}

/// Removes a call's client from [`McpState`] when the call ends.
struct ClientGuard {
    state: Arc<McpState>,
    id: u64,
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.state.clients().retain(|(i, _)| *i != self.id);
    }
}

/// The MCP state of `conn`, when it is an MCP server's run.
fn mcp_state(conn: &Conn) -> Option<Arc<McpState>> {
    conn.state.clone()?.downcast::<McpState>().ok()
}

/// Whether `conn` (an MCP server's run) was offered the `roots` capability,
/// so `notifications/roots/list_changed` means something to it (never on a
/// stateless connection: 2026-07-28 has no client notifications but
/// cancellation).
pub fn offered_roots(conn: &Conn) -> bool {
    conn.state
        .as_ref()
        .and_then(|s| s.downcast_ref::<McpState>())
        .is_some_and(|s| s.offered_roots && s.features.stateless_revision().is_none())
}

/// Envelope, handler and cancel policy for an MCP server.
fn setup(a: SetupArgs<'_>) -> Setup {
    let SetupArgs {
        spec,
        services,
        catalog_changed,
        ..
    } = a;
    let handler = McpHandler::new(&spec.id, services.mcp_roots.clone(), catalog_changed);
    let mut state = McpState::new(handler.offered_roots, services.mcp_subscriptions.clone());
    state.stateless = services.mcp_stateless.get(&spec.id);
    let state = Arc::new(state);
    let handler = handler
        .with_features(state.clone(), services.mcp_events.clone())
        .with_requests(services.mcp_requests.clone());
    Setup {
        protocol: Arc::new(McpProtocol::new(state.features.envelope())),
        handler: Arc::new(handler),
        cancel: Some(CancelPolicy {
            grace: CANCEL_GRACE,
            expects_ack: false,
        }),
        state: Some(state),
    }
}

/// How long a server has to answer `server/discover` before plugd sends
/// `initialize` instead (the official Python SDK's bound). A late answer is
/// still taken when the server then refuses `initialize`.
pub const DISCOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// `_meta` key of the lowest log level a 2026-07-28 request wants
/// `notifications/message` for.
const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// Most `input_required` rounds of one call (the official SDKs' default).
pub const MAX_INPUT_ROUNDS: usize = 10;

/// Most input requests answered in one round.
const MAX_INPUT_REQUESTS: usize = 16;

/// Most revisions read from one `server/discover` answer.
const MAX_DISCOVER_VERSIONS: usize = 64;

/// What opening a connection learned.
struct Opened {
    capabilities: Value,
    server_version: Option<String>,
    /// The revision the connection speaks.
    revision: String,
    /// When the rest of the handshake's deadline starts counting.
    from: tokio::time::Instant,
}

/// Why plugd did not adopt a `server/discover` answer and makes the
/// `initialize` handshake instead; `warn` when the server did something a
/// server should not (a legacy server answering `-32601` is not warned of).
struct Fallback {
    why: String,
    warn: bool,
}

/// The revision, client capabilities and client info every request of a
/// stateless connection carries in `_meta`.
fn stateless_meta(
    revision: &str,
    capabilities: &Value,
    client_info: &Value,
) -> serde_json::Map<String, Value> {
    serde_json::Map::from_iter([
        (plugd_mcp::META_PROTOCOL_VERSION.to_owned(), json!(revision)),
        (
            plugd_mcp::META_CLIENT_CAPABILITIES.to_owned(),
            capabilities.clone(),
        ),
        (plugd_mcp::META_CLIENT_INFO.to_owned(), client_info.clone()),
        // 2026-07-28 sends log messages only to a request that asks for
        // them; the handshake revisions send every level, as here.
        (META_LOG_LEVEL.to_owned(), json!("debug")),
    ])
}

/// Opens the connection the way the official SDKs' clients do: a
/// `server/discover` at the stateless revision, bounded by
/// [`DISCOVER_TIMEOUT`]; a server that lists a stateless revision plugd
/// speaks is spoken to without a handshake, any other answer (an error, a
/// malformed or oversized result, only stateful revisions, silence) leads
/// to the `initialize` handshake with a full `timeout` of its own, as
/// before. Only a server that speaks nothing but stateless revisions plugd
/// does not know (`-32022` without a stateful one) is refused.
async fn open(
    peer: &Peer,
    spec: &PluginSpec,
    mcp: &McpState,
    timeout: Duration,
    warnings: &mut Vec<String>,
) -> Result<Opened, HandshakeError> {
    match mcp.stateless {
        Some(true) => {}
        Some(false) => return initialize(peer, spec, mcp.offered_roots, timeout).await,
        None => {
            // The handshake first: a server that speaks both revisions keeps
            // working as it did (SDK 2.3.0 stdio servers refuse server
            // requests and subscriptions at 2026-07-28). A server that
            // refuses the handshake (-32022, or no `initialize` at all) is
            // asked with server/discover next.
            match initialize(peer, spec, mcp.offered_roots, timeout).await {
                Err(HandshakeError::Call(CallError::Remote { error, .. }))
                    if error.code == plugd_mcp::version::UNSUPPORTED_PROTOCOL_VERSION
                        || error.code == -32601 =>
                {
                    tracing::debug!(plugin = %spec.id, "initialize refused ({}); trying server/discover", error.code);
                }
                other => return other,
            }
        }
    }
    let offered = client_capabilities(mcp.offered_roots);
    let meta = stateless_meta(plugd_mcp::STATELESS, &offered, &client_info());
    let from = tokio::time::Instant::now();
    let probe_peer = peer.clone();
    let params = json!({"_meta": Value::Object(meta.clone())});
    let waited = DISCOVER_TIMEOUT.min(timeout);
    // The probe runs as its own task, outliving the wait and the fallback
    // handshake after it, so giving up waiting neither cancels it (the
    // spec forbids cancelling it) nor turns a late answer into an unknown
    // id.
    let probe = || {
        let (peer, params) = (probe_peer.clone(), params.clone());
        tokio::spawn(async move {
            peer.call("server/discover", Some(params), waited + timeout)
                .await
        })
    };
    let mut retried = false;
    let pending = loop {
        let mut probe = probe();
        match tokio::time::timeout(waited, &mut probe).await {
            // Refused with -32022 naming the stateless revision among the
            // supported ones: the refusal was of this request, not of the
            // revision; asked once more (SEP-2575's retry).
            Ok(joined) if !retried && refused_but_stateless(&joined) => {
                tracing::debug!(plugin = %spec.id, "server/discover refused with -32022 naming {}; asking again", plugd_mcp::STATELESS);
                retried = true;
            }
            Ok(joined) => match judge_discover(spec, joined)? {
                Ok((capabilities, server_version)) => {
                    return Ok(adopt(mcp, meta, capabilities, server_version, from));
                }
                Err(fallback) => {
                    note_fallback(spec, fallback, warnings);
                    break None;
                }
            },
            Err(_) => break Some(probe),
        }
    };
    match initialize(peer, spec, mcp.offered_roots, timeout).await {
        Ok(opened) => {
            if pending.is_some() {
                note_fallback(
                    spec,
                    Fallback {
                        why: format!(
                            "it did not answer server/discover within {waited:?} (a server should answer a method it does not know with -32601 at once)"
                        ),
                        warn: true,
                    },
                    warnings,
                );
            }
            Ok(opened)
        }
        // A slow server that speaks the stateless revision answered the
        // probe late and now refuses the handshake: take its late answer.
        Err(HandshakeError::Call(CallError::Remote { error, .. })) if pending.is_some() => {
            let late = pending.expect("checked above").await;
            match judge_discover(spec, late)? {
                Ok((capabilities, server_version)) => {
                    Ok(adopt(mcp, meta, capabilities, server_version, from))
                }
                Err(fallback) => Err(HandshakeError::Malformed {
                    plugin: spec.id.clone(),
                    reason: format!(
                        "it refused initialize ({}) after not answering server/discover within {waited:?}, and its late discover answer is unusable: {}",
                        error, fallback.why
                    ),
                }),
            }
        }
        Err(e) => Err(e),
    }
}

/// Whether a `server/discover` answer is `-32022` (unsupported protocol
/// version) whose `data.supported` names the stateless revision plugd
/// asked in: worth asking again rather than falling back.
fn refused_but_stateless(
    joined: &Result<Result<Value, CallError>, tokio::task::JoinError>,
) -> bool {
    let Ok(Err(CallError::Remote { error, .. })) = joined else {
        return false;
    };
    error.code == plugd_mcp::version::UNSUPPORTED_PROTOCOL_VERSION
        && error
            .data
            .as_ref()
            .and_then(|d| d.get("supported"))
            .and_then(Value::as_array)
            .is_some_and(|s| s.iter().any(|v| v == plugd_mcp::STATELESS))
}

fn note_fallback(spec: &PluginSpec, fallback: Fallback, warnings: &mut Vec<String>) {
    if fallback.warn {
        warnings.push(format!(
            "speaking MCP with the initialize handshake: {}",
            fallback.why
        ));
    } else {
        tracing::debug!(plugin = %spec.id, "initialize handshake: {}", fallback.why);
    }
}

/// Makes `mcp` a stateless connection with the server's discovered
/// capabilities.
fn adopt(
    mcp: &McpState,
    meta: serde_json::Map<String, Value>,
    mut capabilities: Value,
    server_version: Option<String>,
    from: tokio::time::Instant,
) -> Opened {
    // 2026-07-28 replaced resources/subscribe with subscriptions/listen,
    // which plugd does not speak: a subscription cannot be offered.
    if let Some(resources) = capabilities
        .get_mut("resources")
        .and_then(Value::as_object_mut)
    {
        resources.remove("subscribe");
    }
    mcp.features.set_stateless(meta);
    Opened {
        capabilities,
        server_version,
        revision: plugd_mcp::STATELESS.to_owned(),
        from,
    }
}

/// Reads the outcome of a `server/discover` probe: the server's
/// capabilities and version when it speaks a stateless revision plugd does,
/// a [`Fallback`] to `initialize` otherwise, or an error when the
/// connection is lost or the server can only speak revisions plugd lacks.
#[allow(clippy::type_complexity)]
fn judge_discover(
    spec: &PluginSpec,
    joined: Result<Result<Value, CallError>, tokio::task::JoinError>,
) -> Result<Result<(Value, Option<String>), Fallback>, HandshakeError> {
    let warn = |why: String| Ok(Err(Fallback { why, warn: true }));
    let reply = match joined {
        Err(e) => return warn(format!("the server/discover probe failed: {e}")),
        Ok(Ok(reply)) => reply,
        Ok(Err(CallError::Remote { error, .. })) => {
            if error.code == plugd_mcp::version::UNSUPPORTED_PROTOCOL_VERSION {
                let supported: Vec<String> = error
                    .data
                    .as_ref()
                    .and_then(|d| d.get("supported"))
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .take(MAX_DISCOVER_VERSIONS)
                            .filter_map(Value::as_str)
                            .map(|v| v.chars().take(64).collect())
                            .collect()
                    })
                    .unwrap_or_default();
                if !supported.is_empty()
                    && !supported
                        .iter()
                        .any(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
                {
                    return Err(HandshakeError::Malformed {
                        plugin: spec.id.clone(),
                        reason: format!(
                            "the server speaks only MCP revision(s) {} (its answer to server/discover at {}); plugd speaks {}",
                            supported.join(", "),
                            plugd_mcp::STATELESS,
                            plugd_mcp::SUPPORTED.join(", ")
                        ),
                    });
                }
            }
            return Ok(Err(Fallback {
                why: format!(
                    "server/discover answered {} {}",
                    error.code,
                    error.message.chars().take(200).collect::<String>()
                ),
                warn: false,
            }));
        }
        Ok(Err(e @ CallError::Closed(_))) => return Err(HandshakeError::Call(e)),
        Ok(Err(e)) => return warn(format!("server/discover failed: {e}")),
    };
    let Some(obj) = reply.as_object() else {
        return warn(format!(
            "its server/discover answer is not a result object: {}",
            preview(&reply)
        ));
    };
    match obj.get("resultType") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "complete" => {}
        Some(other) => {
            return warn(format!(
                "its server/discover answer has resultType {}, not \"complete\"",
                preview(other)
            ));
        }
    }
    let Some(versions) = obj.get("supportedVersions").and_then(Value::as_array) else {
        return warn(format!(
            "its server/discover answer has no \"supportedVersions\" array: {}",
            preview(&reply)
        ));
    };
    let versions: Vec<&str> = versions
        .iter()
        .take(MAX_DISCOVER_VERSIONS)
        .filter_map(Value::as_str)
        .collect();
    if plugd_mcp::version::choose_stateless(versions.iter().copied()).is_none() {
        return Ok(Err(Fallback {
            why: format!(
                "server/discover lists no stateless revision plugd speaks ({})",
                preview(&json!(versions))
            ),
            warn: false,
        }));
    }
    let capabilities = match obj.get("capabilities") {
        Some(c @ Value::Object(_)) => c.clone(),
        other => {
            return warn(format!(
                "its server/discover answer has no \"capabilities\" object ({})",
                other.map(preview).unwrap_or_else(|| "none".into())
            ));
        }
    };
    let server_version = obj
        .get("_meta")
        .and_then(|m| m.get("io.modelcontextprotocol/serverInfo"))
        .and_then(|i| i.get("version"))
        .and_then(Value::as_str)
        .map(|s| s.chars().take(128).collect());
    Ok(Ok((capabilities, server_version)))
}

/// How long a `subscriptions/listen` request may stay open: the life of
/// the connection (the server's exit fails it sooner).
const LISTEN_FOR: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The `subscriptions/listen` filter for the list changes a stateless
/// server declares it sends (`listChanged` of tools, prompts, resources);
/// `None` when it declares none.
fn listen_filter(capabilities: &Value) -> Option<Value> {
    let mut filter = serde_json::Map::new();
    for (cap, key) in [
        ("tools", "toolsListChanged"),
        ("prompts", "promptsListChanged"),
        ("resources", "resourcesListChanged"),
    ] {
        if capabilities
            .get(cap)
            .and_then(|c| c.get("listChanged"))
            .and_then(Value::as_bool)
            == Some(true)
        {
            filter.insert(key.into(), json!(true));
        }
    }
    (!filter.is_empty()).then_some(Value::Object(filter))
}

/// 2026-07-28 has a server send its list changes only on a
/// `subscriptions/listen` stream: a stateless server on stdio gets one for
/// the connection's life, so its `notifications/*/list_changed` reach the
/// handler above as a session's would. It ends with the connection (or at
/// once, for a server without the method).
fn listen(peer: &Peer, plugin: &str, filter: Value) {
    let peer = peer.clone();
    let plugin = plugin.to_owned();
    tokio::spawn(async move {
        let params = json!({"notifications": filter});
        match peer
            .call("subscriptions/listen", Some(params), LISTEN_FOR)
            .await
        {
            Ok(_) => tracing::debug!(
                plugin,
                "the MCP server ended its subscriptions/listen stream"
            ),
            Err(e) => {
                tracing::debug!(plugin, error = %e, "subscriptions/listen to the MCP server ended")
            }
        }
    });
}

/// plugd's `clientInfo`.
fn client_info() -> Value {
    json!({"name": "plugd", "version": env!("CARGO_PKG_VERSION")})
}

/// `server/discover` (or `initialize` with version negotiation and
/// `notifications/initialized`), then the tool catalog.
pub async fn handshake(
    peer: &Peer,
    spec: &PluginSpec,
    state: Option<&plugd_host::dialect::DialectState>,
    timeout: Duration,
) -> Result<Handshake, HandshakeError> {
    let mcp = state.and_then(|s| s.downcast_ref::<McpState>());
    let mut warnings = Vec::new();
    let opened = match mcp {
        Some(mcp) => open(peer, spec, mcp, timeout, &mut warnings).await?,
        None => initialize(peer, spec, false, timeout).await?,
    };
    let Opened {
        capabilities,
        server_version,
        revision,
        from,
    } = opened;
    tracing::debug!(plugin = %spec.id, revision, "MCP connection open");
    let deadline = from + timeout;
    let has_tools = capabilities.get("tools").is_some_and(|t| !t.is_null());
    if let Some(mcp) = mcp {
        mcp.features.set_capabilities(capabilities.clone());
    }
    let tools = if has_tools {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        list_tools(
            peer,
            spec,
            &capabilities,
            left.max(Duration::from_millis(1)),
            &mut warnings,
        )
        .await?
    } else {
        warnings.push("the server declares no \"tools\" capability; it offers no tools".into());
        Vec::new()
    };
    if revision == plugd_mcp::STATELESS
        && spec.mcp.as_ref().is_none_or(|m| !m.is_remote())
        && let Some(filter) = listen_filter(&capabilities)
    {
        listen(peer, &spec.id, filter);
    }
    // Subscriptions belong to the plugin: a restarted server gets them back.
    if let Some(mcp) = mcp {
        let uris = mcp.subscriptions.of(&spec.id);
        if !uris.is_empty() {
            if crate::mcp_features::Capability::Subscribe.declared_in(&capabilities) {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                crate::mcp_features::resubscribe(
                    peer,
                    &spec.id,
                    uris,
                    left.max(Duration::from_millis(1)),
                    &mut warnings,
                )
                .await;
            } else {
                warnings.push(format!(
                    "the server no longer declares resources.subscribe; its {} subscription(s) lapse",
                    uris.len()
                ));
            }
        }
    }
    Ok(Handshake {
        server_version,
        tools,
        warnings,
    })
}

/// The `initialize` handshake (plugd offers [`PROTOCOL_VERSION`] and
/// accepts any of [`SUPPORTED_VERSIONS`]), then `notifications/initialized`.
async fn initialize(
    peer: &Peer,
    spec: &PluginSpec,
    offered: bool,
    timeout: Duration,
) -> Result<Opened, HandshakeError> {
    let from = tokio::time::Instant::now();
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: spec.id.clone(),
        reason,
    };
    let reply = peer
        .call(
            "initialize",
            Some(json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": client_capabilities(offered),
                "clientInfo": client_info(),
            })),
            timeout,
        )
        .await?;
    let Some(obj) = reply.as_object() else {
        return Err(malformed(format!(
            "expected an initialize result object, got {}",
            preview(&reply)
        )));
    };
    let version = match obj.get("protocolVersion") {
        Some(Value::String(v)) => v.as_str(),
        Some(other) => {
            return Err(malformed(format!(
                "\"protocolVersion\" must be a string, got {}",
                preview(other)
            )));
        }
        None => return Err(malformed("the reply has no \"protocolVersion\"".into())),
    };
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(malformed(format!(
            "unsupported MCP protocol version {:?}; plugd speaks {}; upgrade the server or pin a release that speaks one of them",
            version.chars().take(64).collect::<String>(),
            SUPPORTED_VERSIONS.join(", ")
        )));
    }
    let server_version = obj
        .get("serverInfo")
        .and_then(|i| i.get("version"))
        .and_then(Value::as_str)
        .map(|s| s.chars().take(128).collect());
    let mut capabilities = match obj.get("capabilities") {
        Some(c @ Value::Object(_)) => c.clone(),
        _ => json!({}),
    };
    // 2024-11-05 had completion/complete without a `completions`
    // capability (it came in 2025-03-26): a server of that revision with
    // prompts or resources may be asked, as the official clients do.
    if version == "2024-11-05"
        && let Some(caps) = capabilities.as_object_mut()
        && (caps.contains_key("prompts") || caps.contains_key("resources"))
    {
        caps.entry("completions").or_insert_with(|| json!({}));
    }
    peer.notify("notifications/initialized", None);
    Ok(Opened {
        capabilities,
        server_version,
        revision: version.to_owned(),
        from,
    })
}

/// Reads the whole catalog with `tools/list`, following `nextCursor`.
/// `caps` are the server's capabilities: a tool that requires tasks is
/// listed (and marked, [`ToolMeta::execution`]) only when they declare
/// task-augmented `tools/call`.
async fn list_tools(
    peer: &Peer,
    spec: &PluginSpec,
    caps: &Value,
    timeout: Duration,
    warnings: &mut Vec<String>,
) -> Result<Vec<ToolDef>, HandshakeError> {
    let tasks = mcp_tasks::runs_tool_tasks(caps);
    let deadline = tokio::time::Instant::now() + timeout;
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: spec.id.clone(),
        reason,
    };
    let mut tools: Vec<ToolDef> = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    let mut cursors: HashSet<String> = HashSet::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        if page >= MAX_PAGES {
            return Err(malformed(format!(
                "tools/list still had more pages after {MAX_PAGES}; plugd reads at most {MAX_PAGES} pages"
            )));
        }
        let params = cursor.as_ref().map(|c| json!({"cursor": c}));
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_millis(1));
        let reply = peer.call("tools/list", params, left).await?;
        let list = reply
            .get("tools")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                malformed(format!(
                    "tools/list page {page}: expected {{\"tools\": [...]}}, got {}",
                    preview(&reply)
                ))
            })?;
        for (i, raw) in list.iter().enumerate() {
            let Some(name) = raw.get("name").and_then(Value::as_str) else {
                return Err(malformed(format!(
                    "tools/list page {page}, tool {i}: no string \"name\" in {}",
                    preview(raw)
                )));
            };
            if !valid_tool_name(name) {
                warnings.push(format!(
                    "tool {:?} skipped: MCP tool names are 1-{MAX_TOOL_NAME} characters of A-Z, a-z, 0-9, _, -, . and /",
                    name.chars().take(64).collect::<String>()
                ));
                continue;
            }
            let schema = match raw.get("inputSchema") {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(s) if s.is_object() => s.clone(),
                Some(other) => {
                    warnings.push(format!(
                        "tool {name:?} skipped: its inputSchema is not a JSON Schema object ({})",
                        preview(other)
                    ));
                    continue;
                }
            };
            // 2025-11-25 tasks: a tool that can only run as a task is called
            // as one (mcp_tasks); without the server's capability neither
            // call can work, so it is not offered.
            let task_support = mcp_tasks::task_support(raw);
            if task_support == Some("required") && !tasks {
                warnings.push(format!(
                    "tool {name:?} hidden: it requires task-augmented calls (execution.taskSupport \"required\") but the server does not declare tasks.requests.tools.call, so no call can work"
                ));
                continue;
            }
            if !names.insert(name.to_owned()) {
                warnings.push(format!(
                    "tool {name:?} is listed twice; the first definition is kept"
                ));
                continue;
            }
            if tools.len() >= MAX_TOOLS {
                return Err(malformed(format!(
                    "the server lists more than {MAX_TOOLS} tools"
                )));
            }
            let description = raw
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let mut meta = tool_meta(name, raw, warnings);
            if tasks && let Some(support) = task_support {
                meta.get_or_insert_with(Default::default).execution =
                    Some(serde_json::Map::from_iter([(
                        "taskSupport".to_owned(),
                        json!(support.chars().take(32).collect::<String>()),
                    )]));
            }
            tools.push(ToolDef {
                name: format!("{}/{name}", spec.id),
                description,
                input_schema: schema,
                wire_name: Some(name.to_owned()),
                risk_level: None,
                meta,
            });
        }
        match reply.get("nextCursor") {
            None | Some(Value::Null) => break,
            Some(Value::String(next)) => {
                if !cursors.insert(next.clone()) {
                    return Err(malformed(format!(
                        "tools/list returned cursor {:?} twice; its pagination loops",
                        next.chars().take(64).collect::<String>()
                    )));
                }
                cursor = Some(next.clone());
            }
            Some(other) => {
                return Err(malformed(format!(
                    "tools/list \"nextCursor\" must be a string, got {}",
                    preview(other)
                )));
            }
        }
    }
    Ok(tools)
}

fn valid_tool_name(name: &str) -> bool {
    (1..=MAX_TOOL_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
}

/// A short rendering of a value for error messages.
pub(crate) fn preview(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// Longest tool `title` kept, in characters.
pub const MAX_TITLE: usize = 256;

/// Largest `annotations`, `outputSchema` or `icons` value kept, in bytes of
/// JSON; a bigger one is dropped with a warning.
pub const MAX_META_BYTES: usize = 64 * 1024;

/// Most icons kept per tool.
pub const MAX_ICONS: usize = 16;

/// The metadata of one `tools/list` entry: `title`, `annotations`,
/// `outputSchema` and `icons`, each kept when well-formed and bounded, else
/// dropped with a warning naming the tool and the field (the tool itself
/// stays callable). `None` when there is nothing to keep.
fn tool_meta(name: &str, raw: &Value, warnings: &mut Vec<String>) -> Option<Box<ToolMeta>> {
    let mut meta = ToolMeta::default();
    let mut drop = |field: &str, why: String| {
        warnings.push(format!("tool {name:?}: its {field} is ignored: {why}"));
    };
    let oversized = |v: &Value| serde_json::to_vec(v).map_or(true, |b| b.len() > MAX_META_BYTES);
    match raw.get("title") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) => meta.title = Some(t.chars().take(MAX_TITLE).collect()),
        Some(other) => drop("title", format!("not a string ({})", preview(other))),
    }
    match raw.get("annotations") {
        None | Some(Value::Null) => {}
        Some(v) if oversized(v) => drop("annotations", format!("over {MAX_META_BYTES} bytes")),
        Some(Value::Object(map)) => {
            // A hint of the wrong type is dropped alone: a lying
            // `"readOnlyHint": "yes"` must not count as true.
            let mut kept = map.clone();
            for hint in [
                "readOnlyHint",
                "destructiveHint",
                "idempotentHint",
                "openWorldHint",
            ] {
                if kept.get(hint).is_some_and(|v| !v.is_boolean()) {
                    kept.remove(hint);
                    drop(&format!("annotations.{hint}"), "not a boolean".into());
                }
            }
            meta.annotations = Some(kept);
        }
        Some(other) => drop("annotations", format!("not an object ({})", preview(other))),
    }
    match raw.get("outputSchema") {
        None | Some(Value::Null) => {}
        Some(v) if oversized(v) => drop("outputSchema", format!("over {MAX_META_BYTES} bytes")),
        Some(v @ Value::Object(_)) => meta.output_schema = Some(v.clone()),
        Some(other) => drop(
            "outputSchema",
            format!("not a JSON Schema object ({})", preview(other)),
        ),
    }
    match raw.get("icons") {
        None | Some(Value::Null) => {}
        Some(v) if oversized(v) => drop("icons", format!("over {MAX_META_BYTES} bytes")),
        Some(Value::Array(icons)) => {
            meta.icons = Some(icons.iter().take(MAX_ICONS).cloned().collect());
        }
        Some(other) => drop("icons", format!("not an array ({})", preview(other))),
    }
    (meta != ToolMeta::default()).then(|| Box::new(meta))
}

/// `tools/call`; progress goes to `ctx.progress`.
/// `params` with the current trace in `_meta.traceparent` (and
/// `_meta.tracestate`), as the MCP SDKs read it, when traces are on.
pub(crate) fn with_trace(mut params: Value) -> Value {
    if let (Some((parent, state)), Some(obj)) =
        (plugd_telemetry::traceparent(), params.as_object_mut())
    {
        let meta = obj.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("traceparent".into(), json!(parent));
            if let Some(state) = state {
                meta.insert("tracestate".into(), json!(state));
            }
        }
    }
    params
}

/// The MCP contract (a server over stdio or Streamable HTTP).
#[derive(Debug, Clone, Copy, Default)]
pub struct Mcp;

impl Dialect for Mcp {
    fn name(&self) -> &'static str {
        "mcp"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            server_features: true,
            mcp_results: true,
            unsigned: Some(
                "an MCP server is declared by a .mcp.json entry and has no plugin directory to sign",
            ),
            ..Capabilities::default()
        }
    }

    fn setup(&self, a: SetupArgs<'_>) -> Setup {
        setup(a)
    }

    fn handshake<'a>(&'a self, a: HandshakeArgs<'a>) -> HandshakeFuture<'a> {
        Box::pin(handshake(a.peer, a.spec, a.state, a.timeout))
    }

    /// Re-reads the catalog (after `notifications/tools/list_changed`).
    fn refresh_tools<'a>(
        &'a self,
        conn: &'a Conn,
        spec: &'a PluginSpec,
        timeout: Duration,
    ) -> DialectFuture<'a, Result<Vec<ToolDef>, HandshakeError>> {
        Box::pin(async move {
            let mut warnings = Vec::new();
            let caps = mcp_state(conn)
                .map(|s| s.features.capabilities().clone())
                .unwrap_or_default();
            let tools = list_tools(&conn.peer, spec, &caps, timeout, &mut warnings).await?;
            for w in warnings {
                tracing::warn!(plugin = %spec.id, "{w}");
            }
            Ok(tools)
        })
    }

    fn call_tool<'a>(&'a self, call: ToolCall<'a>) -> CallFuture<'a> {
        let (conn, _spec, tool, args, ctx, timeout) = call.into_parts();
        Box::pin(async move {
            let plugin = conn.peer.plugin();
            let state = mcp_state(conn);
            let _client = ctx
                .client
                .clone()
                .and_then(|c| Some(state.as_ref()?.enter(c)));
            let tools_call_error = |e: CallError| match e {
                // -32601 here means "no tools/call", which map_tool_error would
                // describe in native terms; keep the server's own error.
                CallError::Remote { ref error, .. } if error.code == codes::METHOD_NOT_FOUND => {
                    ToolError::Call(e)
                }
                e => map_tool_error(plugin, &tool.name, e),
            };
            let caps = state.as_ref().map(|s| s.features.capabilities());
            let result = if mcp_tasks::requires_task(tool)
                && caps.is_some_and(mcp_tasks::runs_tool_tasks)
            {
                mcp_tasks::call_as_task(
                    &conn.peer,
                    tool,
                    args,
                    ctx,
                    timeout,
                    caps.is_some_and(mcp_tasks::cancels_tasks),
                    state.as_ref().map(|s| &s.tasks),
                    tools_call_error,
                )
                .await?
            } else {
                let deadline = tokio::time::Instant::now() + timeout;
                let mut params = with_trace(json!({"name": tool.wire(), "arguments": args}));
                // A 2026-07-28 client of the gateway answers input_required
                // itself: its answers go along, the question goes back.
                let passes_input = ctx.rounds.is_some();
                for (k, v) in ctx.rounds.iter().flatten() {
                    match (params.get_mut(k).and_then(Value::as_object_mut), v) {
                        // `_meta`: merged (the trace stays).
                        (Some(meta), Value::Object(add)) => {
                            meta.extend(add.iter().map(|(k, v)| (k.clone(), v.clone())));
                        }
                        _ => params[k] = v.clone(),
                    }
                }
                let mut rounds = 0;
                loop {
                    // The first request has the call's own timeout (errors report
                    // the configured value); answers to input share what is left.
                    let left = if rounds == 0 {
                        timeout
                    } else {
                        deadline
                            .saturating_duration_since(tokio::time::Instant::now())
                            .max(Duration::from_millis(1))
                    };
                    let result = conn
                        .peer
                        .call_with(
                            "tools/call",
                            Some(params.clone()),
                            left,
                            ctx.progress.clone(),
                        )
                        .await
                        .map_err(tools_call_error)?;
                    // 2026-07-28: the server asks for input inside the result and
                    // is asked again with the answers.
                    let asks =
                        result.get("resultType").and_then(Value::as_str) == Some("input_required");
                    if passes_input && asks {
                        return Ok(result);
                    }
                    if !asks || rounds >= MAX_INPUT_ROUNDS {
                        break result;
                    }
                    rounds += 1;
                    let responses = answer_inputs(&result, ctx).await.map_err(|message| {
                        ToolError::ExecutionFailed {
                            plugin: plugin.clone(),
                            tool: tool.name.clone(),
                            message,
                        }
                    })?;
                    params["inputResponses"] = Value::Object(responses);
                    match result.get("requestState") {
                        Some(state @ Value::String(_)) => params["requestState"] = state.clone(),
                        _ => {
                            if let Some(p) = params.as_object_mut() {
                                p.remove("requestState");
                            }
                        }
                    }
                }
            };
            if let Some(why) = not_complete(&result) {
                return Err(ToolError::ExecutionFailed {
                    plugin: plugin.clone(),
                    tool: tool.name.clone(),
                    message: why,
                });
            }
            if result.get("isError").and_then(Value::as_bool) == Some(true) {
                return Err(ToolError::ExecutionFailed {
                    plugin: plugin.clone(),
                    tool: tool.name.clone(),
                    message: error_text(&result),
                });
            }
            Ok(result)
        })
    }

    /// MCP over stdio has no shutdown request: SIGTERM to the process group; the
    /// supervisor SIGKILLs after `shutdown_grace`.
    fn shutdown<'a>(&'a self, conn: &'a Conn, _reply_timeout: Duration) -> DialectFuture<'a, ()> {
        Box::pin(async move {
            conn.process.terminate_group();
        })
    }
}

/// Answers the `inputRequests` of a 2026-07-28 `input_required` result the
/// way plugd answers the same requests sent on their own: elicitation and
/// sampling by the client of the call that takes them (a call made through
/// plugd's MCP gateway), anything else not at all. The error says what
/// could not be answered.
async fn answer_inputs(
    result: &Value,
    ctx: &CallContext,
) -> Result<serde_json::Map<String, Value>, String> {
    let mut responses = serde_json::Map::new();
    let Some(requests) = result.get("inputRequests").and_then(Value::as_object) else {
        return Ok(responses);
    };
    if requests.len() > MAX_INPUT_REQUESTS {
        return Err(format!(
            "the server asked for {} inputs at once; plugd answers at most {MAX_INPUT_REQUESTS}",
            requests.len()
        ));
    }
    for (key, request) in requests {
        let method = request
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let method: String = method.chars().take(64).collect();
        let client = match method.as_str() {
            "elicitation/create" | "sampling/createMessage" => {
                ctx.client.as_ref().filter(|c| c.0.accepts(&method))
            }
            _ => None,
        };
        let Some(client) = client else {
            return Err(format!(
                "the server needs input to go on (resultType \"input_required\": {method:?}) and plugd has nobody to ask it for this call: elicitation and sampling are answered only during a call made through plugd's MCP gateway by a client that supports them"
            ));
        };
        let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
        match client.0.request(method.clone(), params).await {
            Ok(answer) => {
                responses.insert(key.clone(), answer);
            }
            Err(e) => {
                return Err(format!(
                    "the client of the call refused the server's {method}: {}",
                    e.message
                ));
            }
        }
    }
    Ok(responses)
}

/// Why a 2026-07-28 result is not a final one (`resultType` other than
/// `"complete"`), or `None` for a final result (every result of the
/// stateful revisions, which have no `resultType`).
pub(crate) fn not_complete(result: &Value) -> Option<String> {
    match result.get("resultType") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) if t == "complete" => None,
        Some(Value::String(t)) if t == "input_required" => {
            let asked: Vec<String> = result
                .get("inputRequests")
                .and_then(Value::as_object)
                .map(|m| {
                    m.values()
                        .filter_map(|r| r.get("method").and_then(Value::as_str))
                        .take(8)
                        .map(|m| m.chars().take(64).collect())
                        .collect()
                })
                .unwrap_or_default();
            Some(format!(
                "the server still needs input after {MAX_INPUT_ROUNDS} rounds of answers (resultType \"input_required\"{})",
                if asked.is_empty() {
                    String::new()
                } else {
                    format!(": {}", asked.join(", "))
                }
            ))
        }
        Some(other) => Some(format!(
            "the server answered with resultType {}, which plugd does not know",
            preview(other)
        )),
    }
}

/// The text content of an `isError` result, joined by newlines (the JSON of
/// the content when it has no text).
fn error_text(result: &Value) -> String {
    let texts: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|c| c.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let text = if texts.is_empty() {
        result
            .get("content")
            .map(preview)
            .unwrap_or_else(|| "the tool reported an error without content".into())
    } else {
        texts.join("\n")
    };
    text.chars().take(4096).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_metadata_is_bounded_and_typed() {
        let mut warnings = Vec::new();
        let huge = "x".repeat(MAX_META_BYTES + 1);
        let raw = json!({
            "title": "t".repeat(MAX_TITLE + 50),
            "annotations": {"note": huge},
            "outputSchema": {"type": "object"},
            "icons": (0..MAX_ICONS + 5).map(|i| json!({"src": i.to_string()})).collect::<Vec<_>>(),
        });
        let meta = tool_meta("big", &raw, &mut warnings).unwrap();
        assert_eq!(meta.title.as_ref().unwrap().chars().count(), MAX_TITLE);
        assert!(meta.annotations.is_none(), "oversized annotations dropped");
        assert_eq!(meta.icons.as_ref().unwrap().len(), MAX_ICONS);
        assert_eq!(meta.output_schema, Some(json!({"type": "object"})));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("tool \"big\": its annotations is ignored"),
            "{warnings:?}"
        );
        // Nothing to keep: no meta at all.
        assert!(tool_meta("plain", &json!({"name": "plain"}), &mut warnings).is_none());
        assert!(
            tool_meta(
                "nulls",
                &json!({"title": null, "annotations": null}),
                &mut warnings
            )
            .is_none()
        );
    }

    #[test]
    fn tools_call_carries_the_request_id_as_progress_token() {
        let bytes = McpProtocol::default().encode_request(
            7,
            "tools/call",
            Some(json!({"name": "echo", "arguments": {}})),
        );
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["params"]["_meta"]["progressToken"], 7);
        assert_eq!(v["params"]["name"], "echo");
        let bytes = McpProtocol::default().encode_request(8, "tools/list", None);
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(v.get("params").is_none(), "{v}");
    }

    #[test]
    fn a_stateless_connection_stamps_every_request() {
        let envelope = Envelope::default();
        let protocol = McpProtocol::new(envelope.clone());
        let v: Value =
            serde_json::from_slice(&protocol.encode_request(1, "tools/list", None)).unwrap();
        assert!(v.get("params").is_none(), "not stateless yet: {v}");
        let _ = envelope.set(stateless_meta(
            plugd_mcp::STATELESS,
            &client_capabilities(false),
            &client_info(),
        ));
        for (method, params) in [
            ("tools/list", None),
            ("resources/read", Some(json!({"uri": "a://b"}))),
            ("tools/call", Some(json!({"name": "echo", "arguments": {}}))),
        ] {
            let v: Value =
                serde_json::from_slice(&protocol.encode_request(2, method, params)).unwrap();
            let meta = &v["params"]["_meta"];
            assert_eq!(meta[plugd_mcp::META_PROTOCOL_VERSION], "2026-07-28", "{v}");
            assert!(meta[plugd_mcp::META_CLIENT_CAPABILITIES]["elicitation"].is_object());
            assert_eq!(meta[plugd_mcp::META_CLIENT_INFO]["name"], "plugd");
        }
        let v: Value = serde_json::from_slice(&protocol.encode_request(
            3,
            "tools/call",
            Some(json!({"name": "echo"})),
        ))
        .unwrap();
        assert_eq!(v["params"]["_meta"]["progressToken"], 3);
    }

    #[test]
    fn results_that_are_not_final_are_named() {
        assert!(not_complete(&json!({"content": []})).is_none());
        assert!(not_complete(&json!({"resultType": "complete"})).is_none());
        let why = not_complete(&json!({"resultType": "input_required",
            "inputRequests": {"a": {"method": "sampling/createMessage"}}}))
        .unwrap();
        assert!(why.contains("sampling/createMessage"), "{why}");
        assert!(
            not_complete(&json!({"resultType": 7}))
                .unwrap()
                .contains("does not know")
        );
    }

    #[test]
    fn progress_is_an_event_of_its_call() {
        let got = McpProtocol::default()
            .decode(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1,"total":2}}"#)
            .unwrap();
        assert_eq!(
            got,
            Incoming::Event {
                request_id: Some(7),
                event: json!({"progressToken":7,"progress":1,"total":2})
            }
        );
        let got = McpProtocol::default()
            .decode(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"x"}}"#)
            .unwrap();
        assert!(matches!(got, Incoming::Notification { .. }), "{got:?}");
        assert!(McpProtocol::default().decode(b"not json").is_err());
    }

    #[test]
    fn cancel_is_notifications_cancelled() {
        let bytes = McpProtocol::default()
            .encode_cancel(9, "deadline_exceeded")
            .unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["method"], "notifications/cancelled");
        assert_eq!(
            v["params"],
            json!({"requestId": 9, "reason": "deadline_exceeded"})
        );
        assert!(v.get("id").is_none());
    }

    #[test]
    fn file_uris_are_percent_encoded() {
        assert_eq!(
            file_uri(Path::new("/tmp/a b/ü")),
            "file:///tmp/a%20b/%C3%BC"
        );
    }

    #[test]
    fn tool_names() {
        for ok in ["echo", "get-sum", "a.b/c_d", &"x".repeat(128)] {
            assert!(valid_tool_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a\nb", "é", &"x".repeat(129)] {
            assert!(!valid_tool_name(bad), "{bad}");
        }
    }

    #[test]
    fn error_text_joins_text_content() {
        let r = json!({"isError": true, "content": [{"type":"text","text":"a"},{"type":"image","data":""},{"type":"text","text":"b"}]});
        assert_eq!(error_text(&r), "a\nb");
        assert!(error_text(&json!({"isError": true})).contains("without content"));
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::jsonrpc_frame;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "progressToken",
        "progress",
        "total",
        "message",
        "requestId",
        "reason",
        "_meta",
    ];
    const STRINGS: &[&str] = &[
        "notifications/progress",
        "notifications/message",
        "notifications/cancelled",
        "notifications/tools/list_changed",
        "tools/call",
        "1",
        "-1",
        "9223372036854775808",
        " 1",
    ];

    fn frame() -> BoxedStrategy<Value> {
        jsonrpc_frame(STRINGS, KEYS, STRINGS)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn decode_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = McpProtocol::default().decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_notifications(v in frame()) {
            let _ = McpProtocol::default().decode(v.to_string().as_bytes());
        }
    }
}
