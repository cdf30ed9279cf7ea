//! plugd's runtime: a workspace's plugins under supervision, gated by approval,
//! with their tools in one registry.
//!
//! [`Runtime::open`] discovers the plugins of a workspace, restores approvals,
//! cached catalogs and failure marks from the state store, and wraps each
//! plugin in a [`Supervised`]. Nothing starts until a tool is called, a plugin
//! is approved, or [`Runtime::start_eager`] runs.
//!
//! **Architecture invariant**: a plugin runs only while its approval's digest
//! equals the digest of its directory as it is now; this is checked before
//! every start, so a plugin changed on disk stops being startable at once.
//! What starts is the approval's read-only pin (see [`pin`]), never the
//! source directory that was just digested.
//!
//! Why one file: `Runtime` itself is here (the type, its private state
//! `RtInner`, `RuntimeError`, opening a workspace and the approval
//! lifecycle), and all of it reads the same private state; each other concern
//! adds its own `impl Runtime` in its own module.

pub use plugd_governance::{containment, marketplace, signing};
pub use plugd_store::pin;

pub mod agent_seam;
pub mod auth_config;
pub mod bindings_rt;
pub mod broker_config;
mod changes;
pub mod channels;
pub mod cluster_packages;
mod cluster_pins;
pub mod compaction;
pub mod config;
pub mod config_gate;
#[cfg(test)]
mod config_sections_tests;
pub mod config_watch;
pub mod consent;
pub mod delegation;
pub mod deno;
mod error_codes;
pub mod events;
pub mod governed;
pub mod hook_specs;
pub mod hooks;
mod host_api;
pub mod host_secrets;
pub mod invocations;
pub mod limits;
pub mod llm;
pub mod mcp_config;
pub mod mcp_features;
pub mod mcp_remote;
pub mod mcp_requests;
mod mcp_upstream;
pub mod memory_config;
pub mod microapp;
pub mod outbox;

pub mod plugin_config;
mod plugin_row;
mod plugin_set;
pub mod record_payload;
pub mod registry;
pub mod risk;
pub mod risk_config;
pub mod runs;
pub mod serve_lock;
pub mod serve_record;
pub mod settings_form;
pub mod skills;
pub mod tool_pins;
pub mod tool_policy;
pub mod watch;
pub mod workspace;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use plugd_host::dialect::{CallContext, HostServices};
use plugd_host::{
    CallToolError, Handshake, HostConfig, Launch, Observer, Status, Supervised, ToolDef,
};
use plugd_manifest::{LoadOptions, PluginSpec};
use plugd_store::digest::{DigestLimits, plugin_digest};
use plugd_store::{Approval, StateStore};
use serde::Serialize;
use serde_json::Value;

use changes::{Withheld, WithheldMap};

pub use plugin_row::{LiveRow, PluginRow};
pub use registry::{ArgsError, FieldError, ToolEntry, ToolRegistry};
pub use workspace::{BrokenPlugin, Discovery};

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The workspace could not be opened.
    #[error("{0}")]
    Workspace(String),
    /// No plugin with that id.
    #[error("no plugin {0:?} in this workspace; `plugd plugin list` shows what is there")]
    UnknownPlugin(String),
    /// The plugin's directory could not be loaded.
    #[error("plugin {name:?} cannot be loaded: {error}")]
    Broken {
        /// Directory name.
        name: String,
        /// Why.
        error: String,
    },
    /// No tool with that name.
    #[error("no tool {0:?}; `plugd tool list` shows the tools of approved plugins")]
    UnknownTool(String),
    /// The tool belongs to an approved plugin whose files changed since:
    /// its tools are withheld until it is approved again.
    #[error(
        "tool {tool:?} is withheld: plugin {plugin:?} changed since it was approved ({files}); review the files and run `plugd plugin approve {plugin}`"
    )]
    Changed {
        /// The plugin.
        plugin: String,
        /// The tool asked for.
        tool: String,
        /// What changed, files named relative to the plugin directory.
        files: String,
    },
    /// The arguments did not match the schema (the plugin was not called).
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The call failed.
    #[error(transparent)]
    Call(#[from] CallToolError),
    /// Approval was refused.
    #[error("plugin {plugin:?} was not approved: {reason}")]
    ApprovalFailed {
        /// Plugin id.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] plugd_store::StoreError),
    /// The plugin directory could not be digested.
    #[error(transparent)]
    Digest(#[from] plugd_store::digest::DigestError),
    /// No vector backend with that name.
    #[error("no vector backend {name:?}; the backends here are {known}")]
    UnknownVectorBackend {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
    /// No channel adapter of that kind.
    #[error("no channel {kind:?}; the channels here are {known}")]
    UnknownChannel {
        /// The kind asked for.
        kind: String,
        /// The kinds there are.
        known: String,
    },
    /// The risk gate refused the call (disabled, denied, not approved in time).
    #[error(transparent)]
    Gate(#[from] risk::GateError),
    /// An operator stopped the plugin (`plugd plugin stop`); it stays
    /// stopped until `plugd plugin start`.
    #[error("plugin {plugin:?} is {reason}")]
    Stopped {
        /// Plugin id.
        plugin: String,
        /// Who stopped it and when, and the command that starts it.
        reason: String,
    },
    /// The plugin is not approved (MCP resources, prompts, completion).
    #[error("plugin {plugin:?} is not approved; review it and run `plugd plugin approve {plugin}`")]
    NotApproved {
        /// Plugin id.
        plugin: String,
    },
    /// The plugin changed since it was approved (MCP resources, prompts,
    /// completion; a tool call says [`RuntimeError::Changed`]).
    #[error(
        "plugin {plugin:?} changed since it was approved ({files}); review the files and run `plugd plugin approve {plugin}`"
    )]
    PluginChanged {
        /// Plugin id.
        plugin: String,
        /// What changed.
        files: String,
    },
    /// plugd.yaml refuses this MCP server's resources.
    #[error("the resources of MCP server {server:?} are not served: {why}")]
    ResourcesDenied {
        /// The server.
        server: String,
        /// Which setting, and what to do.
        why: String,
    },
    /// An MCP resource, prompt or completion request failed.
    #[error(transparent)]
    Feature(plugd_dialects::FeatureError),
    /// A setting could not be read, validated, stored or applied.
    #[error("plugin {plugin:?} settings: {message}")]
    Config {
        /// Plugin id.
        plugin: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A `before_tool_call` or `after_tool_result` hook refused the call
    /// (before it: the plugin never saw it); the hook's message.
    #[error("the call was blocked by a {point} hook: {message}")]
    BlockedByHook {
        /// Where.
        point: hooks::HookPoint,
        /// The blocking handler's message.
        message: String,
        /// The notices of that point's run.
        notices: Vec<hooks::Notice>,
    },
    /// A `limits:` rule of plugd.yaml refused the call before it ran (the
    /// plugin never saw it): the caller is over `rule`'s rate.
    #[error(
        "rate limited by plugd.yaml's limits rule {rule:?}: retry in {}s",
        retry_after_ms.div_ceil(1000)
    )]
    RateLimited {
        /// The rule's name.
        rule: String,
        /// Milliseconds until its bucket has a token again.
        retry_after_ms: u64,
    },
    /// No active binding of this export in the caller's scope: the export
    /// does not exist for it (the same whether it is unknown, disabled or
    /// another org's).
    #[error(
        "no export {export:?} for org {org:?}; GET /v1/plugin-tools lists the exports you can call"
    )]
    UnknownExport {
        /// The export asked for.
        export: String,
        /// The caller's org.
        org: String,
    },
    /// The binding a call resolved to cannot serve it: a secret it
    /// references is gone, or the package version it names is not installed.
    #[error(
        "binding {binding_id} cannot serve the call: {}; fix it with `plugd binding update {binding_id}` (PATCH /v1/plugin-bindings/{binding_id})",
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    InvalidBinding {
        /// The binding.
        binding_id: String,
        /// Each problem, with its JSON Pointer in the binding.
        problems: Vec<plugd_control::Problem>,
    },
    /// A call of a remote MCP server with plugd.yaml `upstream_auth` could
    /// not get the caller's own credential; it was not sent, and no shared
    /// credential was used instead.
    #[error(
        "MCP server {server:?} is called with each caller's own credential (plugd.yaml mcp.servers.{server}.upstream_auth): {message}"
    )]
    UpstreamAuth {
        /// The server.
        server: String,
        /// Why (never a token).
        message: String,
    },
}

/// What `plugd plugin list` / `show` report about one plugin.
#[derive(Debug, Clone, Serialize)]
pub struct PluginInfo {
    /// Plugin id (the directory name for plugins that failed to load).
    pub id: String,
    /// Manifest dialect (`native`), or `unknown` when the manifest is broken.
    pub dialect: String,
    /// `invalid`, `unapproved`, `changed`, or the supervisor state
    /// (`idle`, `starting`, `running`, `backoff`, `failed`, `stopping`, `stopped`).
    pub state: String,
    /// Approved, and unchanged since.
    pub approved: bool,
    /// Plugin version.
    pub version: Option<String>,
    /// Plugin directory.
    pub dir: PathBuf,
    /// Why it is invalid, changed or failed.
    pub error: Option<String>,
    /// Tools it contributes (from the live or cached catalog).
    pub tools: Vec<String>,
    /// Tools withheld because their definition changed since approval, or
    /// because they are new (see [`tool_pins`]): name, reason, hashes and
    /// a diff. Empty unless an approved plugin reported such a catalog.
    pub withheld_tools: Vec<plugd_control::store::tool_pins::WithheldTool>,
    /// Tools its manifest declares (native `[plugin.extends] tools`), known
    /// before it ever runs: what the console shows before approval.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub declared_tools: Vec<String>,
    /// Restarts after a crash or a failed start since serve loaded it.
    #[serde(default)]
    pub restarts: u64,
    /// Detailed supervisor status.
    pub status: Option<Status>,
    /// Digest of the plugin directory now.
    pub digest: Option<String>,
    /// The approval, if any.
    pub approval: Option<ApprovalInfo>,
    /// The exact command line that runs (program, then arguments).
    pub command: Vec<String>,
    /// The exact environment the child gets.
    pub env: BTreeMap<String, String>,
    /// Working directory of the child.
    pub cwd: Option<PathBuf>,
    /// `lazy` or `eager`.
    pub start: Option<String>,
    /// Non-fatal manifest findings.
    pub warnings: Vec<String>,
    /// Each tool's effective risk and whether it is enabled.
    pub tool_risks: BTreeMap<String, risk::ToolRisk>,
    /// Counters of the live connection (shed notifications, junk lines, …).
    pub stats: Option<plugd_host::PeerStats>,
    /// Broker traffic since this runtime opened: events published, publishes
    /// dropped (outside the allowlist), events delivered and shed.
    pub broker: Option<plugd_host::native_host::BrokerStats>,
    /// Effective permissions of the next start: sandbox mechanism, network,
    /// paths, user, limits, environment, VAI requested vs granted; mechanism
    /// `refused` when the next start would be refused. `None` for a plugin
    /// whose manifest does not load.
    pub permissions: Option<containment::EffectivePermissions>,
    /// The dialect-specific part of the declaration (native extends and
    /// channels, Salmex config schema, VAI exports with their permissions,
    /// microapp capabilities, MCP entry).
    pub details: Value,
    /// Its signature: signed by whom, unsigned, tampered, not applicable.
    pub signature: signing::SignatureStatus,
    /// Its settings (secrets as `••••`), see [`plugin_config`].
    pub config: Vec<plugin_config::ConfigEntry>,
    /// A VAI package's processes: one per process group, with its exports,
    /// state and the pids running now (empty for other plugins).
    pub processes: Vec<plugd_host::groups::ProcessInfo>,
}

/// Who approved what, and when.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalInfo {
    /// The digest the approval covers.
    pub digest: String,
    /// Who approved.
    pub approved_by: String,
    /// When (RFC 3339).
    pub approved_at: String,
}

struct TrustObserver {
    dir: PathBuf,
    pins: pin::Pins,
    shared_pins: Arc<cluster_pins::SharedPins>,
    store: Arc<dyn StateStore>,
    registry: Arc<RwLock<ToolRegistry>>,
    signing: SharedSigning,
    redactions: Arc<plugin_config::Redactions>,
    /// Where plugins reach the API with their delegation tokens.
    delegations: Arc<delegation::Delegations>,
    /// The MCP servers whose new tools are accepted ([`tool_pins`]).
    accept_new: Arc<tool_pins::AcceptNew>,
}

#[async_trait::async_trait]
impl Observer for TrustObserver {
    async fn may_start(&self, spec: &PluginSpec) -> Result<Launch, String> {
        let approval = self
            .store
            .approval(&spec.id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "it is not approved; review it and run `plugd plugin approve {}`",
                    spec.id
                )
            })?;
        signing::check(&self.signing.get(), spec)?;
        let (dir_digest, now) = spec_digests(spec)?;
        if now != approval.digest {
            let files = changes::describe(spec, &approval.digest, &self.dir.join(".plugd"));
            return Err(format!(
                "its files changed since it was approved ({files}; {} then, {now} now); review it and run `plugd plugin approve {}`",
                approval.digest, spec.id
            ));
        }
        // Run from the approval's pin, never from the source directory just
        // digested: a file swapped in after this check is never executed.
        let run = match dir_digest {
            Some(d) => {
                let pin = match self.pins.verify(&spec.id, &d) {
                    // Approved on another node: its pin is in the cluster.
                    Err(pin::PinError::Missing { .. }) if self.shared_pins.enabled() => self
                        .shared_pins
                        .fetch(&self.pins, &spec.id, &d)
                        .await
                        .and_then(|_| self.pins.verify(&spec.id, &d)),
                    other => other,
                }
                .map_err(|e| e.to_string())?;
                self.shared_pins.publish(&self.pins, &spec.id, &d).await;
                Some(Arc::new(spec.rebased(&pin)))
            }
            None => None,
        };
        let run_spec = run.as_deref().unwrap_or(spec);
        let (mut containment, perms) = containment::effective(run_spec, &self.dir)?;
        self.delegations.route_gateway(run_spec, &mut containment);
        let mut launch = plugin_config::launch_for(&*self.store, run_spec).await?;
        self.redactions.remember(&spec.id, &launch.redact);
        launch.containment = containment;
        mcp_remote::prepare(&self.store, run_spec, &mut launch).await?;
        self.redactions.remember(&spec.id, &launch.redact);
        // `interpreter: "deno"`: Deno's permissions follow the effective ones.
        let deno =
            deno::with_permissions(run_spec, &perms, &containment::state_dir(&self.dir, spec))?;
        launch.run_spec = match deno {
            Some(d) => Some(Arc::new(d)),
            None => run,
        };
        Ok(launch)
    }

    fn process_groups(&self, spec: &PluginSpec) -> plugd_host::groups::GroupPlan {
        containment::group_plan(spec, &self.dir)
    }

    async fn started(&self, spec: &PluginSpec, handshake: &Handshake) {
        // An approved plugin's catalog is screened against its pinned
        // definitions: what changed or is new is withheld ([`tool_pins`]).
        let approval = self.store.approval(&spec.id).await;
        let offered = match &approval {
            Ok(Some(a)) => {
                tool_pins::screen(
                    &*self.store,
                    &spec.id,
                    &a.digest,
                    &handshake.tools,
                    self.accept_new.get(&spec.id),
                )
                .await
                .offered
            }
            Ok(None) => handshake.tools.clone(),
            Err(e) => {
                tracing::warn!(plugin = %spec.id, error = %e, "cannot read the approval; offering none of its tools until it can");
                Vec::new()
            }
        };
        write(&self.registry).set_plugin_tools(&spec.id, &offered);
        // A failure recorded earlier (a start storm's timed-out handshakes,
        // retried on demand) is over once it runs.
        if let Ok(Some(_)) = self.store.failure(&spec.id).await
            && let Err(e) = self.store.clear_failure(&spec.id).await
        {
            tracing::warn!(plugin = %spec.id, error = %e, "could not clear the recorded failure");
        }
        if let Ok(Some(approval)) = approval {
            // The cache lists what is offered, so a restart of plugd does not
            // offer a withheld tool before the plugin runs again.
            let catalog = serde_json::to_value(&offered).unwrap_or(Value::Null);
            if catalog != approval.catalog
                && let Err(e) = self
                    .store
                    .update_catalog(&spec.id, &approval.digest, &catalog)
                    .await
            {
                tracing::warn!(plugin = %spec.id, error = %e, "could not cache the tool catalog");
            }
        }
    }

    fn failed(&self, spec: &PluginSpec, reason: &str) {
        // Called under the supervisor's lock: the write goes to a task.
        let reason = self.redactions.scrub(&spec.id, reason);
        let (store, id) = (self.store.clone(), spec.id.clone());
        let record = async move {
            if let Err(e) = store.mark_failed(&id, &reason).await {
                tracing::warn!(plugin = %id, error = %e, "could not record the failure");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(record);
            }
            Err(_) => {
                tracing::warn!(plugin = %spec.id, "could not record the failure: no async runtime")
            }
        }
    }
}

/// How the reason of an operator stop begins (see [`Runtime::stop`]).
const OPERATOR_STOP: &str = "stopped by an operator";

/// The reason of an operator stop holding `sup`, if one does.
fn operator_stop(sup: &Supervised) -> Option<String> {
    match sup.status() {
        Status::Failed { reason } if reason.starts_with(OPERATOR_STOP) => Some(reason),
        _ => None,
    }
}

fn write(r: &RwLock<ToolRegistry>) -> std::sync::RwLockWriteGuard<'_, ToolRegistry> {
    r.write().unwrap_or_else(|p| p.into_inner())
}

fn read(r: &RwLock<ToolRegistry>) -> std::sync::RwLockReadGuard<'_, ToolRegistry> {
    r.read().unwrap_or_else(|p| p.into_inner())
}

/// A workspace's plugins, supervised. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RtInner>,
}

struct RtInner {
    risk: risk::RiskState,
    /// The consent caches' epoch ([`consent`]).
    consent: consent::ConsentWatch,
    /// plugd.yaml's `limits:` in force ([`limits`]).
    limits: limits::LimitsState,
    dir: PathBuf,
    /// The state store (SQLite or PostgreSQL): the runtime names no backend.
    state: Arc<dyn StateStore>,
    /// The discovered plugins; [`Runtime::rescan`] adds new directories.
    plugins: plugin_set::PluginMap,
    /// What a plugin discovered later is supervised with.
    observer: Arc<TrustObserver>,
    host_config: Arc<HostConfig>,
    services: HostServices,
    registry: Arc<RwLock<ToolRegistry>>,
    digests: Mutex<HashMap<String, Result<String, String>>>,
    withheld: WithheldMap,
    api: Arc<host_api::RuntimeApi>,
    signing: SharedSigning,
    redactions: Arc<plugin_config::Redactions>,
    channels: channels::CounterMap,
    pins: pin::Pins,
    /// The cluster's blob store for pins, once the node gives one.
    shared_pins: Arc<cluster_pins::SharedPins>,
    /// One lock per plugin: approvals, revocations and digest updates of a
    /// plugin never interleave.
    approval_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The roots offered to MCP servers (plugd.yaml `mcp:`), shared with
    /// their connections.
    mcp_roots: plugd_host::dialect::McpRoots,
    mcp_stateless: plugd_host::dialect::McpServerFlags,
    /// plugd.yaml `upstream_auth`: per-user credentials of remote servers.
    upstreams: mcp_upstream::Upstreams,
    /// MCP resources, prompts and completion: plugd.yaml's resource
    /// policy, the event broadcast, the subscriptions.
    mcp_features: mcp_features::McpFeatures,
    /// Who answers MCP servers' elicitation outside gateway calls, and the
    /// requests waiting per server.
    mcp_requests: mcp_requests::RequestsState,
    /// Invocation records of every tool call ([`invocations`]).
    invocations: invocations::Recorder,
    /// The change feed of live surfaces ([`events`]).
    events: events::Events,
    /// The processes of installed packages, started by calls through
    /// bindings ([`bindings_rt`]).
    packages: bindings_rt::PackageProcs,
    /// Live delegation tokens of VAI invocations ([`delegation`]).
    delegations: Arc<delegation::Delegations>,
    /// The hook pipeline every tool call passes ([`governed`]).
    hooks: RwLock<Option<governed::Hooks>>,
    /// The agent side: LLM providers, memory ([`agent_seam`]).
    agent: Arc<dyn agent_seam::AgentParts>,
    /// This node's id in the cluster (`--node-id`, else a fresh one).
    node_id: std::sync::OnceLock<String>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

impl Runtime {
    /// Opens the workspace at `dir` (state in `dir/.plugd/`, SQLite), with
    /// `agent` as its agent side (plugd-agent's `parts()`;
    /// [`agent_seam::no_agent`] for a runtime without one, which refuses
    /// what needs it).
    pub async fn open(
        dir: &Path,
        config: HostConfig,
        agent: Arc<dyn agent_seam::AgentParts>,
    ) -> Result<Runtime, RuntimeError> {
        let state = plugd_store::Store::open(&workspace_state_dir(dir)?)?;
        Runtime::open_on(dir, Arc::new(state), config, agent).await
    }

    /// [`Runtime::open`] on the state store `state` (SQLite or PostgreSQL),
    /// with the in-process bus.
    pub async fn open_on(
        dir: &Path,
        state: Arc<dyn StateStore>,
        config: HostConfig,
        agent: Arc<dyn agent_seam::AgentParts>,
    ) -> Result<Runtime, RuntimeError> {
        let bus = Arc::new(plugd_host::bus::LocalBus::new());
        Runtime::open_with(dir, state, config, bus, agent).await
    }

    /// [`Runtime::open_on`] with `bus` as what plugins publish on and
    /// receive from. `plugd-node` chooses both backends.
    pub async fn open_with(
        dir: &Path,
        state: Arc<dyn StateStore>,
        config: HostConfig,
        bus: Arc<dyn plugd_host::bus::Bus>,
        agent: Arc<dyn agent_seam::AgentParts>,
    ) -> Result<Runtime, RuntimeError> {
        let dir = dir
            .canonicalize()
            .map_err(|e| RuntimeError::Workspace(format!("workspace {}: {e}", dir.display())))?;
        let store = state;
        // Whatever a plugd that died without stopping its plugins (kill -9)
        // left behind is killed before anything new starts.
        plugd_host::procs::cleanup_stale(&dir.join(".plugd").join("procs"));
        let discovery = workspace::discover(&dir, &LoadOptions::from_env());
        let registry = Arc::new(RwLock::new(ToolRegistry::default()));
        let signing = SharedSigning::new(
            signing::SigningPolicy::load(&dir)
                .map_err(|e| RuntimeError::Workspace(e.to_string()))?,
        );
        let redactions = Arc::new(plugin_config::Redactions::default());
        let pins = pin::Pins::new(&dir.join(".plugd"));
        let shared_pins: Arc<cluster_pins::SharedPins> = Arc::default();
        let delegations: Arc<delegation::Delegations> = Arc::default();
        let accept_new: Arc<tool_pins::AcceptNew> = Arc::default();
        let observer = Arc::new(TrustObserver {
            dir: dir.clone(),
            pins: pins.clone(),
            shared_pins: shared_pins.clone(),
            store: store.clone(),
            registry: registry.clone(),
            signing: signing.clone(),
            redactions: redactions.clone(),
            delegations: delegations.clone(),
            accept_new: accept_new.clone(),
        });
        let config = Arc::new(config);
        let api = Arc::new(host_api::RuntimeApi::new(bus));
        let mut services = HostServices::for_workspace(&dir, plugd_dialects::table());
        services.api = Some(api.clone());
        // Roots offered to MCP servers, read once: a plugd.yaml that does
        // not load offers none (every command that needs it reports why).
        let loaded = config::PlugdConfig::load(&dir).ok();
        services.mcp_roots = plugd_host::dialect::McpRoots::new(
            loaded.as_ref().map(|c| c.mcp.roots()).unwrap_or_default(),
        );
        let upstreams = mcp_upstream::Upstreams::default();
        upstreams.replace(
            loaded
                .as_ref()
                .map(|c| c.mcp.upstream_auth())
                .unwrap_or_default(),
        );
        accept_new.replace(
            loaded
                .as_ref()
                .map(|c| c.mcp.accept_new_tools())
                .unwrap_or_default(),
        );
        services.mcp_stateless.replace(
            loaded
                .as_ref()
                .map(|c| c.mcp.stateless())
                .unwrap_or_default(),
        );
        let mcp_features = mcp_features::McpFeatures::new(
            config::PlugdConfig::load(&dir)
                .as_ref()
                .map(|c| &c.mcp)
                .map_err(|e| e.to_string()),
            services.mcp_events.clone(),
            services.mcp_subscriptions.clone(),
        );
        let mut digests = HashMap::new();
        let mut plugins = BTreeMap::new();
        let withheld = WithheldMap::default();
        let state_dir = dir.join(".plugd");
        for (id, spec) in discovery.plugins {
            let approval = store.approval(&id).await?;
            let digest = changes::display_digest(&spec, approval.as_ref(), &state_dir);
            match (approval, &digest) {
                (Some(approval), Ok(d)) if &approval.digest == d => {
                    let tools: Vec<ToolDef> =
                        serde_json::from_value(approval.catalog.clone()).unwrap_or_default();
                    write(&registry).set_plugin_tools(&id, &tools);
                }
                (Some(approval), _) => withheld.insert(
                    &id,
                    Withheld {
                        tools: changes::catalog_names(&approval),
                        files: changes::describe(&spec, &approval.digest, &state_dir),
                    },
                ),
                (None, _) => {}
            }
            let supervised =
                Supervised::new(spec, config.clone(), observer.clone(), services.clone());
            if let Some(failure) = store.failure(&id).await? {
                supervised.mark_failed(failure.reason);
            }
            digests.insert(id.clone(), digest);
            plugins.insert(id, supervised);
        }
        let dir_for_packages = dir.clone();
        let events = events::Events::default();
        let plugins = plugin_set::PluginMap::new(plugin_set::PluginSet {
            map: plugins,
            broken: discovery.broken,
        });
        let runtime = Runtime {
            inner: Arc::new(RtInner {
                risk: risk::RiskState::default(),
                consent: consent::ConsentWatch::default(),
                limits: limits::LimitsState::default(),
                channels: channels::CounterMap::default(),
                dir,
                state: store.clone(),
                plugins,
                observer,
                host_config: config.clone(),
                services: services.clone(),
                registry,
                digests: Mutex::new(digests),
                withheld,
                api,
                signing,
                redactions,
                pins,
                shared_pins,
                approval_locks: Mutex::new(HashMap::new()),
                mcp_roots: services.mcp_roots.clone(),
                upstreams,
                mcp_stateless: services.mcp_stateless.clone(),
                mcp_features,
                mcp_requests: mcp_requests::RequestsState::default(),
                invocations: invocations::Recorder::start(&store).with_events(events.sender()),
                events,
                packages: bindings_rt::PackageProcs::new(
                    &dir_for_packages,
                    store.clone(),
                    config.clone(),
                    services.clone(),
                    delegations.clone(),
                ),
                delegations,
                hooks: RwLock::new(None),
                agent,
                node_id: std::sync::OnceLock::new(),
            }),
        };
        runtime.inner.api.bind(&runtime);
        if let Err(e) = runtime.refresh_disabled().await {
            tracing::warn!(error = %e, "cannot read which tools are disabled; listing none until it can");
        }
        consent::watch(&runtime);
        services.mcp_requests.set(Arc::new(mcp_requests::Answerer {
            rt: Arc::downgrade(&runtime.inner),
        }));
        Ok(runtime)
    }

    /// The bus plugins publish on and receive from (`broker.publish`,
    /// `broker.event`).
    pub fn bus(&self) -> Arc<dyn plugd_host::bus::Bus> {
        self.inner.api.shared_bus().clone()
    }

    /// Publishes `event` on the bus as the host (operators, `plugd bus
    /// publish`): the subject is checked, a missing id and timestamp are
    /// filled. Returns the event as published and who took it.
    pub fn publish(
        &self,
        mut event: plugd_host::bus::Event,
    ) -> Result<(plugd_host::bus::Event, plugd_host::bus::Published), plugd_host::bus::SubjectError>
    {
        use plugd_host::native_host::HostApi as _;
        plugd_host::bus::check_subject(&event.topic)?;
        let api = &self.inner.api;
        event.complete(|| api.event_id(), || api.now());
        let published = api.shared_bus().publish(event.clone());
        Ok((event, published))
    }

    /// Broker traffic counters of plugin `id` since this runtime opened
    /// (`None` before its first broker activity).
    pub fn broker_stats(&self, id: &str) -> Option<plugd_host::native_host::BrokerStats> {
        self.inner.api.counters_of(id).map(|c| c.snapshot())
    }

    /// The workspace directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The state store (SQLite or PostgreSQL); callers `.await` its trait
    /// methods.
    pub fn state(&self) -> &Arc<dyn StateStore> {
        &self.inner.state
    }

    /// Names this runtime's node (`plugd serve --node-id`); only the first
    /// call counts, and before it [`Runtime::node_id`] makes a fresh id.
    pub fn set_node_id(&self, id: &str) {
        let _ = self.inner.node_id.set(id.to_owned());
    }

    /// This node's id: lease holders (`NODE/retention`, `NODE/channels`)
    /// and the node's row in the store carry it.
    pub fn node_id(&self) -> &str {
        self.inner
            .node_id
            .get_or_init(|| plugd_control::id::fresh("node"))
    }

    /// The agent side this runtime was opened with ([`agent_seam`]).
    pub fn agent_parts(&self) -> &Arc<dyn agent_seam::AgentParts> {
        &self.inner.agent
    }

    /// Every supervised plugin (loaded manifests; broken ones are not
    /// here), sorted by id.
    pub fn supervised_plugins(&self) -> Vec<(String, Supervised)> {
        self.inner.plugins.iter().collect()
    }

    /// The supervised plugin `id`.
    pub fn supervised(&self, id: &str) -> Result<Supervised, RuntimeError> {
        let set = self.inner.plugins.snapshot();
        match set.map.get(id) {
            Some(s) => Ok(s.clone()),
            None => match set.broken.iter().find(|b| b.name == id) {
                Some(b) => Err(RuntimeError::Broken {
                    name: b.name.clone(),
                    error: b.error.clone(),
                }),
                None => Err(RuntimeError::UnknownPlugin(id.to_owned())),
            },
        }
    }

    fn digest_now(&self, id: &str, refresh: bool) -> Result<String, String> {
        if refresh && let Some(sup) = self.inner.plugins.get(id) {
            // Hashed outside the lock: one plugin's walk never holds up the others.
            let d = changes::approval_digest(sup.spec(), &self.inner.dir.join(".plugd"));
            self.set_digest(id, d.clone());
            return d;
        }
        let digests = self.inner.digests.lock().unwrap_or_else(|p| p.into_inner());
        digests
            .get(id)
            .cloned()
            .unwrap_or_else(|| Err("unknown plugin".into()))
    }

    /// Records the digest `id`'s directory has now (the watcher's and
    /// approval's way to keep `plugin list` current).
    fn set_digest(&self, id: &str, digest: Result<String, String>) {
        let mut digests = self.inner.digests.lock().unwrap_or_else(|p| p.into_inner());
        digests.insert(id.to_owned(), digest);
    }

    /// Every plugin, valid or not, sorted by id, with the whole report of
    /// each ([`Runtime::plugin_list`] is the cheap listing).
    pub async fn plugins(&self) -> Result<Vec<PluginInfo>, RuntimeError> {
        let mut out = Vec::new();
        let set = self.inner.plugins.snapshot();
        for id in set.map.keys() {
            out.push(self.plugin(id).await?);
        }
        for b in &set.broken {
            out.push(broken_info(b));
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Every plugin, valid or not, sorted by id, with only what `plugd plugin
    /// list` and `GET /v1/plugins` show filled in (id, dialect, state,
    /// approved, version, dir, error, tools, digest, approval, status); the
    /// rest is left empty ([`Runtime::plugin`] fills it). Reads the approvals
    /// in one query and no plugin file, so it stays fast with many plugins.
    pub async fn plugin_list(&self) -> Result<Vec<PluginInfo>, RuntimeError> {
        let mut approvals: HashMap<String, Approval> = self
            .inner
            .state
            .approvals()
            .await?
            .into_iter()
            .map(|a| (a.plugin_id.clone(), a))
            .collect();
        let mut out = Vec::new();
        let set = self.inner.plugins.snapshot();
        for id in set.map.keys() {
            out.push(self.brief(id, approvals.remove(id)).await?);
        }
        for b in &set.broken {
            out.push(broken_info(b));
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// One plugin with only what [`Runtime::plugin_list`] fills in (its row
    /// of `GET /v1/plugins`).
    pub async fn plugin_brief(&self, id: &str) -> Result<PluginInfo, RuntimeError> {
        let approval = self.inner.state.approval(id).await?;
        self.brief(id, approval).await
    }

    /// One plugin's report.
    pub async fn plugin(&self, id: &str) -> Result<PluginInfo, RuntimeError> {
        let approval = self.inner.state.approval(id).await?;
        let mut info = self.brief(id, approval).await?;
        if let Some(a) = info.approval.as_ref().filter(|_| info.approved) {
            info.withheld_tools = tool_pins::withheld_of(&*self.inner.state, id, &a.digest).await;
        }
        let sup = self.supervised(id)?;
        let spec = sup.spec();
        // What a start runs: the approval's pin while the approval holds.
        let pinned = match (info.approved, spec.pin_dir) {
            (true, true) => self.inner.pins.current(id).map(|p| spec.rebased(&p)),
            _ => None,
        };
        let run_spec = pinned.as_ref().unwrap_or(spec);
        let deno = containment::effective(run_spec, &self.inner.dir)
            .ok()
            .and_then(|(_, perms)| {
                let state = containment::state_dir(&self.inner.dir, spec);
                deno::with_permissions(run_spec, &perms, &state)
                    .ok()
                    .flatten()
            });
        let run_spec = deno.as_ref().unwrap_or(run_spec);
        let program = containment::program_path(run_spec, &self.inner.dir);
        info.env = plugd_host::spawn::child_env(&spec.command.env)
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        info.command = std::iter::once(program)
            .chain(run_spec.command.args.iter().cloned())
            .collect();
        info.cwd = Some(run_spec.dir.clone());
        info.start = Some(format!("{:?}", spec.supervisor.start).to_lowercase());
        info.warnings = spec.warnings.clone();
        info.declared_tools = spec.declared_tools.clone();
        info.tool_risks = self.tool_risks(id);
        info.stats = sup.stats();
        info.broker = self.broker_stats(id);
        info.permissions = Some(
            containment::effective(run_spec, &self.inner.dir)
                .map_or_else(containment::EffectivePermissions::refused, |(_, r)| r),
        );
        info.details = serde_json::to_value(&**spec)
            .ok()
            .and_then(|v| v.get(spec.dialect.to_string()).cloned())
            .unwrap_or(Value::Null);
        info.signature = signing::status(&self.inner.signing.get(), spec);
        info.config = self.config_show(id).await.unwrap_or_default();
        info.processes = sup.processes();
        Ok(info)
    }

    /// The state part of a plugin's report, from its `approval`.
    async fn brief(
        &self,
        id: &str,
        approval: Option<Approval>,
    ) -> Result<PluginInfo, RuntimeError> {
        let sup = self.supervised(id)?;
        let spec = sup.spec();
        let digest = self.digest_now(id, false);
        let status = sup.status();
        let changed = matches!((&approval, &digest), (Some(a), Ok(d)) if &a.digest != d);
        let (state, error) = match (&approval, &digest) {
            (_, Err(e)) => ("invalid".to_owned(), Some(e.clone())),
            (None, _) => ("unapproved".to_owned(), None),
            _ if changed => {
                let files = self
                    .inner
                    .withheld
                    .get(id)
                    .map(|w| format!(" ({})", w.files))
                    .unwrap_or_default();
                (
                    "changed".to_owned(),
                    Some(format!(
                        "files changed since approval{files}; run `plugd plugin approve {id}` after review"
                    )),
                )
            }
            _ => {
                let waiting = if matches!(
                    status,
                    Status::Idle | Status::Stopped | Status::Failed { .. }
                ) {
                    plugin_config::missing_required(&*self.inner.state, spec).await
                } else {
                    None
                };
                let err = match &status {
                    Status::Failed { reason } if reason.starts_with(OPERATOR_STOP) => {
                        Some(reason.clone())
                    }
                    _ if waiting.is_some() => waiting.clone(),
                    Status::Failed { reason } => Some(reason.clone()),
                    Status::Backoff { last_error, .. } => Some(last_error.clone()),
                    _ => None,
                };
                let state = if operator_stop(&sup).is_some() {
                    "stopped"
                } else if waiting.is_some() {
                    "unconfigured"
                } else {
                    status.name()
                };
                (state.to_owned(), err)
            }
        };
        let approved = approval.is_some() && !changed && digest.is_ok();
        let tools = read(&self.inner.registry)
            .plugin_tools(id)
            .iter()
            .map(|t| t.name.clone())
            .collect();
        Ok(PluginInfo {
            id: id.to_owned(),
            dialect: spec.dialect.to_string(),
            state,
            approved,
            version: Some(spec.version.clone()),
            dir: spec.dir.clone(),
            error,
            tools,
            declared_tools: Vec::new(),
            restarts: sup.restarts(),
            // Counters are atomics of the live connection: cheap to read.
            stats: sup.stats(),
            status: Some(status),
            digest: digest.ok(),
            approval: approval.map(|a| ApprovalInfo {
                digest: a.digest,
                approved_by: a.approved_by,
                approved_at: a.approved_at,
            }),
            ..unread_info("not read for the plugin list; `plugd plugin show` reads it")
        })
    }

    /// The lock that serializes approvals, revocations and digest updates
    /// of plugin `id`.
    fn approval_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .inner
            .approval_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        locks.entry(id.to_owned()).or_default().clone()
    }

    /// Approves `id` as its files are now: snapshots the plugin directory
    /// into a read-only pin (refusing symlinks that leave it) and records
    /// the digest of that copy, starts the plugin once from the pin to fetch
    /// and cache its tool catalog, and rolls the approval back if the plugin
    /// fails its handshake. Approvals and revocations of one plugin are
    /// serialized, so concurrent approvals leave it approved exactly once.
    pub async fn approve(&self, id: &str, by: &str) -> Result<PluginInfo, RuntimeError> {
        let lock = self.approval_lock(id);
        let _serial = lock.lock().await;
        // A plugin directory added since the runtime opened is found here
        // at the latest (serve's watcher finds it within a second).
        let sup = match self.supervised(id) {
            Err(RuntimeError::UnknownPlugin(_)) => {
                let rt = self.clone();
                rt.rescan().await;
                self.supervised(id)?
            }
            other => other?,
        };
        let failed = |reason: String| RuntimeError::ApprovalFailed {
            plugin: id.to_owned(),
            reason,
        };
        signing::check(&self.inner.signing.get(), sup.spec()).map_err(failed)?;
        let (digest, pin) = self.pin_now(id, sup.spec()).await.map_err(failed)?;
        let store = &self.inner.state;
        let approval = Approval {
            plugin_id: id.to_owned(),
            digest,
            approved_by: by.to_owned(),
            approved_at: plugd_store::now_rfc3339(),
            catalog: Value::Array(Vec::new()),
        };
        if let Err(e) = store.approve_clearing_failure(&approval).await {
            if let Some(pin) = &pin {
                let _ = self.inner.pins.restore(id, pin);
            }
            return Err(e.into());
        }
        self.inner.withheld.remove(id);
        // The new approval replaced the old one: its pin may go.
        if let Some(pin) = &pin
            && let Err(e) = self.inner.pins.forget(pin)
        {
            tracing::warn!(plugin = %id, "could not remove the previous pin: {e}");
        }
        // The other nodes of a cluster start it from this pin.
        if let Some(pin) = &pin {
            self.inner
                .shared_pins
                .publish(&self.inner.pins, id, &pin.dir_digest)
                .await;
        }
        // Seed 004's order is discovery → approval → configuration → first
        // call: a Salmex plugin whose required settings are not set yet is
        // approved on its plugin.json catalog and waits, unconfigured, for
        // `plugd plugin config ID set`; its first call then starts it.
        let declared = plugd_dialects::of(sup.spec().dialect).declared_catalog(sup.spec());
        let waits = match declared {
            Some(_) => plugin_config::missing_required(&**store, sup.spec())
                .await
                .is_some(),
            None => false,
        };
        if let Some(tools) = declared.filter(|_| waits) {
            let catalog = serde_json::to_value(&tools).unwrap_or(Value::Null);
            store.update_catalog(id, &approval.digest, &catalog).await?;
            sup.stop().await;
            sup.clear_failure();
            write(&self.inner.registry).set_plugin_tools(id, &tools);
            return self.plugin(id).await;
        }
        sup.reset().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        if let Err(e) = sup.connection(deadline).await {
            store.revoke_exact(&approval).await?;
            write(&self.inner.registry).remove_plugin(id);
            sup.stop().await;
            sup.clear_failure();
            self.release_pin(id);
            return Err(RuntimeError::ApprovalFailed {
                plugin: id.to_owned(),
                reason: format!("its handshake failed, so the approval was not kept: {e}"),
            });
        }
        self.plugin(id).await
    }

    /// Pins the plugin's directory (when its dialect keeps its code there)
    /// and returns the approval digest of the copy. Fails if the source
    /// changed while it was being copied.
    async fn pin_now(
        &self,
        id: &str,
        spec: &Arc<PluginSpec>,
    ) -> Result<(String, Option<pin::Pin>), String> {
        if !spec.pin_dir {
            return self.digest_now(id, true).map(|d| (d, None));
        }
        let pins = self.inner.pins.clone();
        let (plugin, dir) = (id.to_owned(), spec.dir.clone());
        let pin = tokio::task::spawn_blocking(move || pins.create(&plugin, &dir))
            .await
            .map_err(|e| format!("pinning failed: {e}"))?
            .map_err(|e| e.to_string())?;
        let approved = changes::spec_digest_from(Some(&pin.dir_digest), spec);
        let now = self.digest_now(id, true);
        if now.as_ref() != Ok(&approved) {
            // Keep the previous approval's pin: that approval still stands.
            if let Err(e) = self.inner.pins.restore(id, &pin) {
                tracing::warn!(plugin = %id, "could not restore the previous pin: {e}");
            }
            return Err(format!(
                "its files changed while they were being copied into the pin {:?}; approve again once they are stable",
                pin.path.display().to_string()
            ));
        }
        Ok((approved, Some(pin)))
    }

    fn release_pin(&self, id: &str) {
        if let Err(e) = self.inner.pins.release(id) {
            tracing::warn!(plugin = %id, "could not remove the old pin: {e}");
        }
    }

    /// Withdraws the approval: the plugin stops and its tools disappear at
    /// once; its pin is removed unless another approved plugin uses it.
    pub async fn revoke(&self, id: &str) -> Result<bool, RuntimeError> {
        let lock = self.approval_lock(id);
        let _serial = lock.lock().await;
        let sup = self.supervised(id)?.clone();
        let had = self.inner.state.revoke(id).await?;
        write(&self.inner.registry).remove_plugin(id);
        self.inner.withheld.remove(id);
        sup.stop().await;
        self.release_pin(id);
        Ok(had)
    }

    /// Clears a failed state and restarts (eager) or re-arms (lazy) the plugin.
    pub async fn restart(&self, id: &str) -> Result<(), RuntimeError> {
        let sup = self.supervised(id)?.clone();
        self.inner.state.clear_failure(id).await?;
        sup.reset().await;
        Ok(())
    }

    /// Every enabled tool of the approved plugins, sorted by name (what the
    /// agent sees; [`Runtime::tool_views`] includes disabled ones).
    pub fn tools(&self) -> Vec<Arc<ToolEntry>> {
        self.enabled_tools()
    }

    /// The tool registered as `name`, enabled or not.
    pub fn tool(&self, name: &str) -> Option<Arc<ToolEntry>> {
        read(&self.inner.registry).get(name)
    }

    /// Sees every change of the tools: a plugin approved, revoked,
    /// restarted with a new catalog, changed on disk (its tools withheld), or
    /// a tool enabled or disabled.
    pub fn tool_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        read(&self.inner.registry).subscribe()
    }

    /// Validates `args` and calls tool `name` for the agent `agent_id`.
    pub async fn call_tool(
        &self,
        name: &str,
        args: Value,
        agent_id: Option<&str>,
    ) -> Result<Value, RuntimeError> {
        let ctx = CallContext {
            agent_id: agent_id.map(str::to_owned),
            ..CallContext::default()
        };
        self.call_tool_with(name, args, &ctx).await
    }

    /// Validates `args` and calls tool `name` with a full call context
    /// (binding, inbound message, progress sink), through the governed
    /// path ([`governed`]).
    pub async fn call_tool_with(
        &self,
        name: &str,
        args: Value,
        ctx: &CallContext,
    ) -> Result<Value, RuntimeError> {
        self.call_tool_approved_by(name, args, ctx, None).await
    }

    /// [`Runtime::call_tool_with`], with `approver` deciding a `high` or
    /// `critical` call instead of the runtime's own (a surface that can ask
    /// its own user, like the MCP gateway through elicitation). Every other
    /// check is the same.
    pub async fn call_tool_approved_by(
        &self,
        name: &str,
        args: Value,
        ctx: &CallContext,
        approver: Option<&dyn risk::Approver>,
    ) -> Result<Value, RuntimeError> {
        let gov = governed::Governed {
            approver,
            ..governed::Governed::new(governed::Surface::Runtime)
        };
        self.call_tool_governed(name, args, ctx, &gov).await.outcome
    }

    /// The invocation records' writer and counters.
    pub fn invocations(&self) -> &invocations::Recorder {
        &self.inner.invocations
    }

    /// The risk gate and the call on the supervisor `sup` (a workspace
    /// plugin's, or an installed package's for a call through a binding),
    /// once [`governed`] checked it and ran its `before_tool_call` hooks.
    async fn call_entry_on(
        &self,
        sup: &Supervised,
        entry: &ToolEntry,
        args: Value,
        ctx: &CallContext,
        asked: risk::Asked<'_>,
        decisions: &mut Vec<record_payload::CallDecision>,
    ) -> Result<Value, RuntimeError> {
        risk::gate(self, entry, &args, ctx, asked, decisions).await?;
        if let Some(reason) = operator_stop(sup) {
            return Err(RuntimeError::Stopped {
                plugin: entry.plugin.to_string(),
                reason,
            });
        }
        // A VAI export that asks for gateway scopes gets a token for this
        // invocation; it is revoked when `_minted` drops, however the call ends.
        // A binding may narrow the export's scopes (seed 003 policy override).
        let ceiling = ctx
            .bound
            .as_ref()
            .and_then(|b| b.gateway_api_scopes.as_deref());
        let minted = self.delegate_within(
            sup.spec(),
            entry.def.wire(),
            ctx,
            sup.call_timeout(),
            ceiling,
        );
        let delegated;
        let ctx = match &minted {
            Some(m) => {
                delegated = CallContext {
                    gateway: Some(m.grant.clone()),
                    ..ctx.clone()
                };
                &delegated
            }
            None => ctx,
        };
        // A remote server with `upstream_auth`: the caller's own session.
        let own = self.upstream_session(sup, ctx).await?;
        let result = own
            .as_ref()
            .unwrap_or(sup)
            .call_tool(&entry.def, args, ctx, None)
            .await;
        drop(minted);
        let result = result?;
        entry.check_output(&result).map_err(|message| {
            RuntimeError::Call(CallToolError::Tool(
                plugd_host::model::ToolError::ExecutionFailed {
                    plugin: entry.plugin.as_str().into(),
                    tool: entry.name.clone(),
                    message,
                },
            ))
        })?;
        Ok(result)
    }

    /// Stops plugin `id` as an operator action (`plugd plugin stop`): the
    /// stop is recorded in the state database (as a failure of a fixed
    /// form), so it holds — no call, eager start or configuration change
    /// starts it again, in this process, a running serve or after a
    /// restart of plugd — until [`Runtime::start`] (or `plugd plugin
    /// restart`, or a new approval).
    pub async fn stop(&self, id: &str, by: &str) -> Result<(), RuntimeError> {
        let sup = self.supervised(id)?.clone();
        let reason = format!(
            "{OPERATOR_STOP} ({by}, {}); run `plugd plugin start {id}` to start it",
            plugd_store::now_rfc3339()
        );
        self.inner.state.mark_failed(id, &reason).await?;
        sup.stop().await;
        sup.mark_failed(reason);
        Ok(())
    }

    /// Starts plugin `id` now as an operator action (`plugd plugin
    /// start`): clears an operator stop (or a failure) and the restart
    /// budget, then waits up to 30 s for the handshake, so a start that
    /// cannot succeed (not approved, settings missing) says why.
    pub async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        let sup = self.supervised(id)?.clone();
        self.inner.state.clear_failure(id).await?;
        sup.reset().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        sup.connection(deadline)
            .await
            .map_err(|e| RuntimeError::Call(CallToolError::Plugin(e)))?;
        Ok(())
    }

    /// Why plugin `id` is held stopped by an operator, if it is.
    pub fn operator_stopped(&self, id: &str) -> Option<String> {
        operator_stop(&self.supervised(id).ok()?)
    }

    /// Why there is no tool `name`: withheld because its plugin changed
    /// since approval (the files named), or unknown.
    async fn unknown_tool(&self, name: &str) -> RuntimeError {
        match self.inner.withheld.owner_of(name) {
            Some((plugin, files)) => RuntimeError::Changed {
                plugin,
                tool: name.to_owned(),
                files,
            },
            None => self
                .declared_not_advertised(name)
                .await
                .unwrap_or_else(|| RuntimeError::UnknownTool(name.to_owned())),
        }
    }

    /// nexo §4.1.1: a tool an approved native plugin declares in
    /// `[plugin.extends].tools` but did not advertise answers `-33401`
    /// (ToolNotFound), not "unknown tool".
    async fn declared_not_advertised(&self, name: &str) -> Option<RuntimeError> {
        let mut found = None;
        for (id, sup) in self.inner.plugins.iter() {
            let spec = sup.spec();
            if plugd_dialects::of(spec.dialect)
                .capabilities()
                .declared_tool_not_found
                && spec.declared_tools.iter().any(|t| t == name)
                && matches!(self.inner.state.approval(&id).await, Ok(Some(_)))
            {
                found = Some(id);
                break;
            }
        }
        let id = found?;
        Some(RuntimeError::Call(CallToolError::Tool(
            plugd_host::model::ToolError::NotFound {
                plugin: std::sync::Arc::from(id.as_str()),
                tool: name.to_owned(),
                message: "declared in [plugin.extends].tools but not advertised in the plugin's initialize reply (-33401 ToolNotFound, nexo §4.1.1)".to_owned(),
            },
        )))
    }

    /// Starts every approved plugin whose manifest asks for an eager start;
    /// each start waits its turn at the host's start gate
    /// (`PLUGD_START_CONCURRENCY`) before its initialize deadline runs.
    pub async fn start_eager(&self) -> Vec<String> {
        let mut started = Vec::new();
        for (id, sup) in self.inner.plugins.iter() {
            if !sup.is_eager() {
                continue;
            }
            // Approved as its files are now (the full report is not needed).
            let approved = matches!(
                (self.inner.state.approval(&id).await, self.digest_now(&id, false)),
                (Ok(Some(a)), Ok(d)) if a.digest == d
            );
            if approved && !matches!(sup.status(), Status::Failed { .. }) {
                sup.start();
                started.push(id.clone());
            }
        }
        started
    }

    /// Shuts every plugin down, concurrently, and waits until all are reaped.
    pub async fn shutdown(&self) {
        let plugins: Vec<Supervised> = self.inner.plugins.values().collect();
        let stops = plugins.iter().map(|s| s.stop());
        futures_util::future::join_all(stops).await;
        self.inner.packages.stop_all().await;
        let rt = self.clone();
        let _ = tokio::task::spawn_blocking(move || rt.invocations().flush()).await;
    }
}

/// The signing policy in force, shared by the runtime and the start gate;
/// serve's config gate replaces it when an approved plugd.yaml changes it.
#[derive(Clone)]
struct SharedSigning(Arc<RwLock<Arc<signing::SigningPolicy>>>);

impl SharedSigning {
    fn new(policy: signing::SigningPolicy) -> SharedSigning {
        SharedSigning(Arc::new(RwLock::new(Arc::new(policy))))
    }

    fn get(&self) -> Arc<signing::SigningPolicy> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, policy: signing::SigningPolicy) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }
}

impl Runtime {
    /// Replaces the signing policy (serve's config gate, after plugd.yaml's
    /// `require_signatures` / `trusted_publishers` changed and the change is
    /// in force); the next approval and the next start check against it.
    pub fn set_signing_policy(&self, policy: signing::SigningPolicy) {
        self.inner.signing.set(policy);
    }

    /// Looks at the workspace again for plugins that appeared since it was
    /// opened (a new `.plugins/<name>/`, a new `.mcp.json` or
    /// `extensions.yaml` entry) and supervises them, unapproved unless an
    /// approval of exactly their files is on record; manifests that no
    /// longer load are listed as broken. A plugin already known keeps its
    /// `Supervised` (its changes are the watcher's and the start gate's
    /// business). Returns the ids added.
    pub async fn rescan(&self) -> Vec<String> {
        let discovery = workspace::discover(&self.inner.dir, &LoadOptions::from_env());
        let state_dir = self.inner.dir.join(".plugd");
        let inner = &self.inner;
        // What the store says about the new plugins, read before the set
        // is updated (the update itself does not wait).
        let known = inner.plugins.snapshot();
        let mut stored: HashMap<String, (Option<Approval>, Option<plugd_store::Failure>)> =
            HashMap::new();
        for id in discovery.plugins.keys() {
            if known.map.contains_key(id) {
                continue;
            }
            let approval = inner.state.approval(id).await.ok().flatten();
            let failure = inner.state.failure(id).await.ok().flatten();
            stored.insert(id.clone(), (approval, failure));
        }
        let added = inner.plugins.update(|current| {
            let mut map = current.map.clone();
            let mut added = Vec::new();
            for (id, spec) in discovery.plugins {
                if map.contains_key(&id) {
                    continue;
                }
                let (approval, failure) = stored.remove(&id).unwrap_or_default();
                let digest = changes::display_digest(&spec, approval.as_ref(), &state_dir);
                match (approval, &digest) {
                    (Some(approval), Ok(d)) if &approval.digest == d => {
                        let tools: Vec<ToolDef> =
                            serde_json::from_value(approval.catalog.clone()).unwrap_or_default();
                        write(&inner.registry).set_plugin_tools(&id, &tools);
                    }
                    (Some(approval), _) => inner.withheld.insert(
                        &id,
                        Withheld {
                            tools: changes::catalog_names(&approval),
                            files: changes::describe(&spec, &approval.digest, &state_dir),
                        },
                    ),
                    (None, _) => {}
                }
                let sup = Supervised::new(
                    spec,
                    inner.host_config.clone(),
                    inner.observer.clone(),
                    inner.services.clone(),
                );
                if let Some(failure) = failure {
                    sup.mark_failed(failure.reason);
                }
                inner
                    .digests
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.clone(), digest);
                map.insert(id.clone(), sup);
                added.push(id);
            }
            let broken = discovery
                .broken
                .into_iter()
                .filter(|b| !map.contains_key(&b.name))
                .collect();
            (plugin_set::PluginSet { map, broken }, added)
        });
        for id in &added {
            tracing::info!(plugin = %id, "new plugin found in the workspace; it runs only once approved");
            self.plugin_changed(id);
        }
        added
    }
}

/// The state directory of the workspace at `dir` (`DIR/.plugd`).
fn workspace_state_dir(dir: &Path) -> Result<PathBuf, RuntimeError> {
    let dir = dir
        .canonicalize()
        .map_err(|e| RuntimeError::Workspace(format!("workspace {}: {e}", dir.display())))?;
    Ok(dir.join(".plugd"))
}

fn broken_info(b: &BrokenPlugin) -> PluginInfo {
    PluginInfo {
        id: b.name.clone(),
        dialect: "unknown".into(),
        state: "invalid".into(),
        dir: b.dir.clone(),
        error: Some(b.error.clone()),
        ..unread_info("the plugin cannot be loaded")
    }
}

/// A report with nothing read beyond what the caller fills in; the
/// signature says why it was not checked.
fn unread_info(why: &str) -> PluginInfo {
    PluginInfo {
        id: String::new(),
        dialect: String::new(),
        state: String::new(),
        approved: false,
        version: None,
        dir: PathBuf::new(),
        error: None,
        tools: Vec::new(),
        withheld_tools: Vec::new(),
        declared_tools: Vec::new(),
        restarts: 0,
        status: None,
        digest: None,
        approval: None,
        command: Vec::new(),
        env: BTreeMap::new(),
        cwd: None,
        start: None,
        warnings: Vec::new(),
        tool_risks: BTreeMap::new(),
        stats: None,
        broker: None,
        permissions: None,
        details: Value::Null,
        signature: signing::SignatureStatus::NotApplicable { reason: why.into() },
        config: Vec::new(),
        processes: Vec::new(),
    }
}

/// The digest an approval is pinned to: the plugin directory's files (when
/// the dialect keeps its code there) and the declaration entry outside it
/// (`extensions.yaml` / `.mcp.json`), if any.
pub fn spec_digest(spec: &PluginSpec) -> Result<String, String> {
    spec_digests(spec).map(|(_, d)| d)
}

/// The directory's own digest (`None` when the dialect does not pin a
/// directory) and [`spec_digest`].
fn spec_digests(spec: &PluginSpec) -> Result<(Option<String>, String), String> {
    let dir = if spec.pin_dir {
        Some(plugin_digest(&spec.dir, &DigestLimits::default()).map_err(|e| e.to_string())?)
    } else {
        None
    };
    Ok((dir.clone(), changes::spec_digest_from(dir.as_deref(), spec)))
}
