//! The interface every dialect implements ([`Dialect`]) and what the host
//! hands a dialect: who a call is for ([`CallContext`]), the host's services
//! ([`HostServices`]), a run's envelope and handler ([`Setup`]).
//!
//! **Architecture invariant**: a dialect only translates. It says which
//! envelope ([`Protocol`]) a plugin speaks, how the handshake goes, how a tool
//! call and a shutdown look on the wire, and how the plugin's own requests and
//! notifications are served ([`Handler`]). Supervision, deadlines, approval,
//! schema validation and the registry are shared by all of them.
//!
//! **API boundary**: the dialects themselves live in `plugd-dialects` (one
//! module per contract); the supervisor reaches them only through the
//! [`Dialects`] table in [`HostServices`], so this crate never names one.

pub mod conn;
pub mod mcp_host;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use plugd_manifest::PluginSpec;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::launch::Launch;
use crate::model::{Handshake, HandshakeError, ToolDef, ToolError};
use crate::native_host::HostApi;
use crate::peer::{CancelPolicy, Handler, Peer};
use crate::protocol::Protocol;

pub use conn::Conn;
pub use mcp_host::{
    AnswerFuture, EVENT_CAPACITY, McpEvent, McpEvents, McpRequests, McpSubscriptions,
    ServerRequests,
};

/// Who and what a tool call is for. Dialects send what their contract knows.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The agent making the call (native `agent_id`, microapp binding).
    pub agent_id: Option<String>,
    /// The session (microapp inbound, VAI context).
    pub session_id: Option<String>,
    /// Microapp `binding_context` (agent, channel, account, …).
    pub binding: Option<Value>,
    /// Microapp `inbound` message reference.
    pub inbound: Option<Value>,
    /// Trace id (VAI context); generated when absent.
    pub trace_id: Option<String>,
    /// Tenant scope (VAI context).
    pub org_id: Option<String>,
    /// Project scope (VAI context).
    pub project_id: Option<String>,
    /// Progress events of the call, as the plugin sends them.
    pub progress: Option<mpsc::UnboundedSender<Value>>,
    /// The client behind the call, for what the plugin asks of it during
    /// the call (MCP `elicitation/create`, `sampling/createMessage`) and the
    /// log messages it sends (MCP `notifications/message`); the MCP
    /// gateway sets it.
    pub client: Option<ClientHandle>,
    /// Who asked (`token:NAME`, a Unix user, `cli:USER`), for the
    /// invocation record; no dialect sends it.
    pub caller: Option<String>,
    /// The caller's role (`admin`, `operator`, `agent`, `viewer`) when the
    /// surface knows it (HTTP invoke, `/mcp`), for plugd.yaml `limits:`
    /// rules `per: caller.role`; no dialect sends it.
    pub caller_role: Option<String>,
    /// The caller's groups (an OAuth/OIDC identity's groups claim), for
    /// plugd.yaml `policy:` rules on `caller.groups`; empty otherwise.
    pub caller_groups: Vec<String>,
    /// The invocation record's id (VAI `context.invocation_id`); generated
    /// when absent.
    pub invocation_id: Option<String>,
    /// The binding the call resolved through (seed 003), when it came
    /// through one: its config and resolved secrets replace the launch
    /// configuration's in the VAI `context`.
    pub bound: Option<Arc<BoundCall>>,
    /// The chain the call belongs to (VAI `context.chain_id`).
    pub chain_id: Option<String>,
    /// The run the call belongs to (VAI `context.run_id`).
    pub run_id: Option<String>,
    /// The delegated credentials minted for this invocation (VAI
    /// `context.gateway`); the runtime mints them, a dialect only sends them.
    pub gateway: Option<GatewayGrant>,
    /// Set by the MCP gateway for a client on the stateless revision
    /// (2026-07-28), which answers a server's `input_required` result
    /// itself: these params of its request (`inputResponses`,
    /// `requestState`, often none) go to an MCP server with the call, and
    /// an `input_required` result comes back as the call's result.
    pub rounds: Option<serde_json::Map<String, Value>>,
    /// The caller's own access token, when the surface validated one (a
    /// JWT on `/mcp` or `/v1`): what a remote MCP server with plugd.yaml
    /// `upstream_auth` gets exchanged for that user's token. No dialect
    /// sends it; `Debug` never shows it.
    pub user: Option<UserToken>,
}

/// A caller's validated access token and whose it is.
///
/// `Debug` shows the subject only, never the token.
#[derive(Clone, PartialEq, Eq)]
pub struct UserToken {
    /// The identity's name (`oidc:HOST/SUB`): the key of everything kept
    /// per user (exchanged tokens, upstream sessions).
    pub subject: String,
    /// The issuer that signed it (`iss`).
    pub issuer: String,
    /// The raw bearer token.
    pub token: plugd_mcp_http::exchange::Secret,
}

impl UserToken {
    /// `token`, validated, of `subject` from `issuer`.
    pub fn new(subject: &str, issuer: &str, token: &str) -> UserToken {
        UserToken {
            subject: subject.to_owned(),
            issuer: issuer.to_owned(),
            token: plugd_mcp_http::exchange::Secret::new(token),
        }
    }
}

impl std::fmt::Debug for UserToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserToken")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

/// VAI `context.gateway`: where the plugin reaches plugd's API, the
/// delegation token minted for one invocation, and its scopes.
///
/// `Debug` never shows the token.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GatewayGrant {
    /// `http://127.0.0.1:PORT` (`None` when nothing serves the API).
    pub base_url: Option<String>,
    /// `vai_dlg_…`.
    pub delegation_token: String,
    /// The granted scopes.
    pub scopes: Vec<String>,
}

impl std::fmt::Debug for GatewayGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayGrant")
            .field("base_url", &self.base_url)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// What a call made through a binding carries to the plugin and to its
/// invocation record: the binding, its package version, and the binding's
/// config and secrets as they are at call time.
///
/// `Debug` shows the secret slots' names only, never their values.
#[derive(Clone, Default)]
pub struct BoundCall {
    /// `bind_…`.
    pub binding_id: String,
    /// The package (`acme/devkit`).
    pub package_id: String,
    /// The version the binding names.
    pub package_version: String,
    /// The binding's `config` (VAI `context.config`).
    pub config: Value,
    /// Slot → value, decrypted, only the slots the export declares (VAI
    /// `context.secrets`).
    pub secrets: serde_json::Map<String, Value>,
    /// The binding's ceiling on the export's delegated scopes.
    pub gateway_api_scopes: Option<Vec<String>>,
}

impl BoundCall {
    /// The secret values, to scrub from whatever leaves the call.
    pub fn secret_values(&self) -> Vec<String> {
        self.secrets
            .values()
            .filter_map(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl std::fmt::Debug for BoundCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundCall")
            .field("binding_id", &self.binding_id)
            .field("package_id", &self.package_id)
            .field("package_version", &self.package_version)
            .field("secret_slots", &self.secrets.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The client behind a call, as a dialect sees it.
pub trait ClientLink: Send + Sync {
    /// Whether the client takes requests `method`.
    fn accepts(&self, method: &str) -> bool;
    /// Asks the client; its result, or the error to answer the plugin with.
    fn request(
        &self,
        method: String,
        params: Value,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Value, plugd_wire::ErrorObject>> + Send>,
    >;
    /// Passes a notification on (best effort).
    fn notify(&self, method: &str, params: Value);
}

/// A shared [`ClientLink`].
#[derive(Clone)]
pub struct ClientHandle(pub Arc<dyn ClientLink>);

impl std::fmt::Debug for ClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientHandle")
    }
}

/// What the host offers dialect handlers.
#[derive(Clone)]
pub struct HostServices {
    /// The workspace directory.
    pub workspace: PathBuf,
    /// Root of per-plugin state directories (`DIR/.plugd/state`).
    pub state_root: PathBuf,
    /// The runtime's services for native plugins (broker, memory, LLM);
    /// `None`: every such request answers `-32603`.
    pub api: Option<Arc<dyn HostApi>>,
    /// MCP server name → the directories answered to its `roots/list`
    /// (plugd.yaml `mcp.servers.NAME.roots`); a server absent here when it
    /// starts is not offered the `roots` capability. Serve updates it when
    /// plugd.yaml changes ([`McpRoots::replace`]).
    pub mcp_roots: McpRoots,
    /// plugd.yaml's `stateless` per MCP server: `true` tries the stateless
    /// revision first, `false` never speaks it (see `plugd_dialects::mcp`).
    pub mcp_stateless: McpServerFlags,
    /// Where MCP servers' resource and prompt changes are forwarded (one
    /// broadcast for the host, so receivers outlive restarts).
    pub mcp_events: McpEvents,
    /// The resources each MCP server is subscribed to (renewed after a
    /// restart).
    pub mcp_subscriptions: McpSubscriptions,
    /// Who answers MCP servers' elicitation and sampling requests outside
    /// gateway calls (set by the runtime; unset: refused).
    pub mcp_requests: McpRequests,
    /// The dialect of each contract (`plugd_dialects::table`).
    pub dialects: Dialects,
}

/// The roots offered to each hosted MCP server, shared by the runtime and
/// every MCP connection, replaceable while they run.
#[derive(Clone, Default)]
pub struct McpRoots(Arc<std::sync::RwLock<std::collections::BTreeMap<String, Vec<PathBuf>>>>);

impl McpRoots {
    /// Roots from a map of server name → directories.
    pub fn new(map: std::collections::BTreeMap<String, Vec<PathBuf>>) -> Self {
        McpRoots(Arc::new(std::sync::RwLock::new(map)))
    }

    /// The roots of `server` now; `None` when it has none configured.
    pub fn get(&self, server: &str) -> Option<Vec<PathBuf>> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(server)
            .cloned()
    }

    /// Replaces every server's roots; returns the servers whose roots
    /// changed (added, removed or different).
    pub fn replace(&self, map: std::collections::BTreeMap<String, Vec<PathBuf>>) -> Vec<String> {
        let mut cur = self.0.write().unwrap_or_else(|p| p.into_inner());
        let mut changed: Vec<String> = cur
            .iter()
            .filter(|(k, v)| map.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .collect();
        changed.extend(map.keys().filter(|k| !cur.contains_key(*k)).cloned());
        changed.sort();
        *cur = map;
        changed
    }
}

/// A flag per MCP server name shared by every start, replaced when
/// plugd.yaml changes.
#[derive(Debug, Clone, Default)]
pub struct McpServerFlags(Arc<std::sync::RwLock<std::collections::BTreeMap<String, bool>>>);

impl McpServerFlags {
    /// The flag of `server` now, if set.
    pub fn get(&self, server: &str) -> Option<bool> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(server)
            .copied()
    }

    /// Replaces every flag.
    pub fn replace(&self, flags: std::collections::BTreeMap<String, bool>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = flags;
    }
}

impl std::fmt::Debug for HostServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostServices")
            .field("workspace", &self.workspace)
            .finish()
    }
}

impl HostServices {
    /// Services for a workspace at `dir` (state under `dir/.plugd/state`),
    /// speaking the contracts of `dialects`.
    pub fn for_workspace(dir: &std::path::Path, dialects: Dialects) -> Self {
        HostServices {
            workspace: dir.to_path_buf(),
            state_root: dir.join(".plugd").join("state"),
            api: None,
            mcp_roots: McpRoots::default(),
            mcp_stateless: McpServerFlags::default(),
            mcp_events: McpEvents::default(),
            mcp_subscriptions: McpSubscriptions::default(),
            mcp_requests: McpRequests::default(),
            dialects,
        }
    }

    /// The state directory of plugin `id` (created on demand by dialects
    /// that hand it to the plugin).
    pub fn state_dir(&self, id: &str) -> PathBuf {
        self.state_root.join(id.replace('/', "__"))
    }
}

/// A dialect's per-connection state ([`Setup::state`], [`Conn::state`]).
pub type DialectState = Arc<dyn std::any::Any + Send + Sync>;

/// Asks the supervisor to re-read a running plugin's tool catalog (MCP
/// `notifications/tools/list_changed`).
pub type CatalogChanged = Arc<dyn Fn() + Send + Sync>;

/// How to talk to one run of a plugin.
pub struct Setup {
    /// The envelope.
    pub protocol: Arc<dyn Protocol>,
    /// Serves the plugin's requests and notifications.
    pub handler: Arc<dyn Handler>,
    /// Cancel behaviour, for contracts that have one.
    pub cancel: Option<CancelPolicy>,
    /// Per-connection state the dialect keeps (downcast it in its own
    /// functions: the handshake gets it, later calls find it in [`Conn::state`]).
    pub state: Option<DialectState>,
}

/// Gives the dialect of a contract: the one table the runtime hands the
/// host (`plugd_dialects::table`).
#[derive(Clone, Copy)]
pub struct Dialects(pub fn(plugd_manifest::Dialect) -> &'static dyn Dialect);

impl Dialects {
    /// The dialect of contract `d`.
    pub fn of(&self, d: plugd_manifest::Dialect) -> &'static dyn Dialect {
        (self.0)(d)
    }
}

impl std::fmt::Debug for Dialects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dialects")
    }
}

/// A dialect's boxed future (the trait is object safe).
pub type DialectFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What [`Dialect::handshake`] resolves to.
pub type HandshakeFuture<'a> = DialectFuture<'a, Result<Handshake, HandshakeError>>;

/// What [`Dialect::call_tool`] resolves to.
pub type CallFuture<'a> = DialectFuture<'a, Result<Value, ToolError>>;

/// What [`Dialect::setup`] works with.
pub struct SetupArgs<'a> {
    /// The plugin as this run starts it.
    pub spec: &'a Arc<PluginSpec>,
    /// What the host offers it.
    pub services: &'a HostServices,
    /// Asks the supervisor to re-read the tool catalog.
    pub catalog_changed: CatalogChanged,
    /// The run's secrets to scrub from what the plugin logs.
    pub redact: &'a crate::stderr::SharedRedact,
}

/// One tool call, as [`Dialect::call_tool`] makes it.
pub struct ToolCall<'a> {
    /// The running plugin.
    pub conn: &'a Conn,
    /// The plugin's spec.
    pub spec: &'a PluginSpec,
    /// The registry entry (its wire name is sent).
    pub tool: &'a ToolDef,
    /// The arguments.
    pub args: Value,
    /// Who and what the call is for.
    pub ctx: &'a CallContext,
    /// The call deadline.
    pub timeout: Duration,
}

impl<'a> ToolCall<'a> {
    /// `(conn, spec, tool, args, ctx, timeout)`.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(
        self,
    ) -> (
        &'a Conn,
        &'a PluginSpec,
        &'a ToolDef,
        Value,
        &'a CallContext,
        Duration,
    ) {
        (
            self.conn,
            self.spec,
            self.tool,
            self.args,
            self.ctx,
            self.timeout,
        )
    }
}

/// What a handshake works with.
pub struct HandshakeArgs<'a> {
    /// The connection, before it is a [`Conn`].
    pub peer: &'a Peer,
    /// The plugin.
    pub spec: &'a PluginSpec,
    /// What the host offers it.
    pub services: &'a HostServices,
    /// The connection state [`Dialect::setup`] returned.
    pub state: Option<&'a DialectState>,
    /// What the host decided for this start (its configuration).
    pub launch: &'a Launch,
    /// The handshake deadline.
    pub timeout: Duration,
}

/// What a contract offers beyond tool calls: data the runtime, governance
/// and the gateway read instead of matching on the contract.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Server features beyond tools (resources, resource templates,
    /// prompts, completion): MCP.
    pub server_features: bool,
    /// Its tool results are MCP `CallToolResult`s and it may log to the
    /// client during a call: the MCP gateway passes both on as they come
    /// (MCP).
    pub mcp_results: bool,
    /// How it serves a hook bound to it (`hook:` in plugd.yaml), when it can.
    pub hooks: Option<HookStyle>,
    /// It may serve nexo's provider methods: `llm.chat` providers and
    /// `memory.embed` (native).
    pub nexo_providers: bool,
    /// A tool it declares but did not advertise answers `-33401`
    /// (ToolNotFound), not "unknown tool" (nexo §4.1.1: native).
    pub declared_tool_not_found: bool,
    /// Its tools are known from its manifest without a start
    /// ([`Dialect::declared_tool`]: VAI).
    pub catalog_in_manifest: bool,
    /// Its calls carry the invocation record's id (VAI
    /// `context.invocation_id`).
    pub sends_invocation_id: bool,
    /// New settings reach a running plugin without a restart
    /// ([`Dialect::config_changed`]: Salmex `config/changed`).
    pub live_config: bool,
    /// Why a plugin of this contract has no signature to check, when it
    /// cannot have one (microapp, MCP).
    pub unsigned: Option<&'static str>,
}

/// How a contract serves a hook event bound to one of its plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookStyle {
    /// `hook.on_hook`, for hooks declared in `[plugin.extends].hooks`
    /// (native).
    OnHook,
    /// Votes of the hooks the plugin registered (microapp).
    Vote,
}

/// One plugin contract: how its envelope, handshake, tool calls and
/// shutdown look on the wire, and what it can do beyond tools. Adding a
/// contract is one implementation of this trait (in `plugd-dialects`).
pub trait Dialect: Send + Sync + 'static {
    /// The contract's name (`native`, `microapp`, `salmex`, `vai`, `mcp`).
    fn name(&self) -> &'static str;

    /// What the contract offers beyond tool calls; by default nothing.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// A declared tool as the registry knows it before the plugin runs,
    /// when the contract can say without a start (VAI); else `None`.
    fn declared_tool(
        &self,
        spec: &PluginSpec,
        tool: &plugd_manifest::DeclaredTool,
    ) -> Option<ToolDef> {
        let _ = (spec, tool);
        None
    }

    /// The catalog `spec` declares, when the contract lets plugd approve a
    /// plugin on it and leave it unconfigured until its settings are set
    /// (Salmex); else `None`.
    fn declared_catalog(&self, spec: &PluginSpec) -> Option<Vec<ToolDef>> {
        let _ = spec;
        None
    }

    /// Tells a running plugin its settings changed, when the contract can
    /// ([`Capabilities::live_config`]); `false` when it could not be told
    /// (restart it instead).
    fn config_changed(&self, conn: &Conn, config: Value) -> bool {
        let _ = (conn, config);
        false
    }

    /// The envelope, handler and cancel policy of one run.
    fn setup(&self, a: SetupArgs<'_>) -> Setup;

    /// The handshake; validates identity and the tool catalog.
    fn handshake<'a>(&'a self, args: HandshakeArgs<'a>) -> HandshakeFuture<'a>;

    /// Re-reads the tool catalog of a running plugin; by default the one
    /// its handshake gave.
    fn refresh_tools<'a>(
        &'a self,
        conn: &'a Conn,
        spec: &'a PluginSpec,
        timeout: Duration,
    ) -> DialectFuture<'a, Result<Vec<ToolDef>, HandshakeError>> {
        let _ = (spec, timeout);
        Box::pin(async move { Ok(conn.handshake.tools.clone()) })
    }

    /// Calls one tool. `tool` is the registry entry (its wire name is sent).
    fn call_tool<'a>(&'a self, call: ToolCall<'a>) -> CallFuture<'a>;

    /// Asks the plugin to stop, the contract's way; resolves once the
    /// request was made (or failed). The supervisor then waits its grace
    /// period and kills.
    fn shutdown<'a>(&'a self, conn: &'a Conn, reply_timeout: Duration) -> DialectFuture<'a, ()>;
}

/// Calls one tool through `conn`'s dialect, inside the plugin round trip
/// span (what the dialect sends carries its trace).
pub async fn call_tool(
    conn: &Conn,
    spec: &PluginSpec,
    tool: &ToolDef,
    args: Value,
    ctx: &CallContext,
    timeout: Duration,
) -> Result<Value, ToolError> {
    let dialect = spec.dialect.to_string();
    let subject = || plugd_telemetry::Subject {
        plugin: Some(&spec.id),
        dialect: Some(&dialect),
        export: Some(&tool.name),
        binding: None,
    };
    let call = ToolCall {
        conn,
        spec,
        tool,
        args,
        ctx,
        timeout,
    };
    let round_trip = conn.services.dialects.of(spec.dialect).call_tool(call);
    plugd_telemetry::in_span("plugin round trip", subject, round_trip).await
}
