//! Supervision of one plugin: lazy or eager start, handshake, crash
//! detection, restart with backoff, graceful shutdown.
//!
//! **Architecture invariant**: callers hold a [`Supervised`] (one per plugin),
//! never a connection. Each call asks it for the current [`Conn`], so a
//! restart swaps the connection underneath and every handle keeps working.
//!
//! States: `idle` (not started) → `starting` → `running` → on a crash
//! `backoff` (1 s, 2 s, 4 s … capped) → `starting` …; after the restart budget
//! is spent, `failed` until [`Supervised::reset`]. The budget resets after
//! `stable_after` of uptime. A caller that finds the plugin idle starts it; a
//! caller that finds it starting or backing off waits for the next attempt
//! (bounded by its own deadline) and gets that attempt's error if it fails.
//!
//! A VAI package's `Supervised` supervises its `worker` process and holds
//! its other process groups ([`crate::groups`]): a child `Supervised` per
//! isolated export, each with its own state and restart budget, and the
//! per-invocation processes running now; [`Supervised::export_connection`]
//! and [`Supervised::call_tool`] route each export there, and stop and
//! reset act on all of them.
//!
//! **Why one file** (~1,600 product lines; its tests are the integration
//! tests that drive real children): `Supervised`, its `SupInner` state
//! machine (`Slot`, `Control`, the start gate's lanes, backoff, the restart
//! budget) and the routing of a VAI package's process groups share one lock
//! and one status channel, and every transition is read against the others
//! (a caller's wait, a crash, a stop, an operator reset). Split along those
//! lines, each piece would need the private state of the others; the
//! seams that are real already live beside it (`groups.rs`, `launch.rs`,
//! `remote.rs`, `dialect.rs`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use plugd_manifest::vai::{ProcessRole, WORKER_GROUP};
use plugd_manifest::{PluginSpec, StartMode};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

pub use crate::dialect::conn::{Conn, MAX_CANCELLED_CALLS};
use crate::dialect::{self, CallContext, HostServices};
use crate::groups::{GroupPlan, ProcessInfo};
use crate::launch::Launch;
use crate::model::{Handshake, HandshakeError, ToolDef, ToolError};
use crate::peer::{CallError, Closed, Peer, PeerConfig, PeerStats};
use crate::spawn::SpawnError;
use crate::stderr;

/// Host-wide defaults, each overridable by environment.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// `initialize` reply deadline (`NEXO_PLUGIN_INIT_TIMEOUT_MS`, 5 s).
    pub init_timeout: Duration,
    /// Tool call deadline (`NEXO_PLUGIN_TOOL_TIMEOUT_MS`, 60 s).
    pub tool_timeout: Duration,
    /// Largest frame from a plugin (`PLUGD_MAX_FRAME_BYTES`, 16 MiB).
    pub max_frame: usize,
    /// Host-to-plugin queue depth (`PLUGD_QUEUE_DEPTH`, 64).
    pub queue_depth: usize,
    /// stderr lines kept for crash reports (`PLUGD_STDERR_TAIL`, 32).
    pub stderr_tail: usize,
    /// Bounds how many eager starts and restarts run at once
    /// (`PLUGD_START_CONCURRENCY`, default [`default_start_concurrency`]).
    pub start_gate: StartGate,
}

/// The host-wide bound on concurrent starts (eager starts, restarts and
/// lazy starts on demand), shared by every plugin of a runtime. A start
/// waits for its turn before it spawns, so its initialize deadline only runs
/// once it has one. A caller waiting for the plugin (a tool call) lets its
/// start skip the queue into the callers' lane, which is bounded by the same
/// size: a gateway session that starts fifteen servers at once runs at most
/// twice `size` handshakes together, never all of them.
#[derive(Debug, Clone)]
pub struct StartGate {
    permits: Arc<tokio::sync::Semaphore>,
    /// The lane of starts a waiting caller moved ahead of the queue.
    lane: Arc<tokio::sync::Semaphore>,
    size: usize,
}

impl StartGate {
    /// A gate letting `size` (at least 1) starts run at once.
    pub fn new(size: usize) -> StartGate {
        let size = size.max(1);
        StartGate {
            permits: Arc::new(tokio::sync::Semaphore::new(size)),
            lane: Arc::new(tokio::sync::Semaphore::new(size)),
            size,
        }
    }

    /// How many starts may run at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Starts running right now (queue and callers' lane).
    pub fn running(&self) -> usize {
        2 * self.size - self.permits.available_permits() - self.lane.available_permits()
    }
}

/// Whether a failure `reason` says only that the plugin's `initialize` was
/// not answered in time: a host too busy to start it (a start storm), which
/// the next demand may retry, unlike a crash or a refusal.
fn overloaded(reason: &str) -> bool {
    reason.contains("did not answer initialize within")
        || reason.contains("did not answer hello within")
}

/// Returns once the plugin is stopping or stopped (or its status channel
/// closed).
async fn until_stopping(mut status: watch::Receiver<Status>) {
    let _ = status
        .wait_for(|s| matches!(s, Status::Stopping | Status::Stopped))
        .await
        .map(|_| ());
}

/// Default start concurrency: twice the CPUs, at least 4.
pub fn default_start_concurrency() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() * 2)
        .unwrap_or(4)
        .max(4)
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            init_timeout: Duration::from_secs(5),
            tool_timeout: Duration::from_secs(60),
            max_frame: plugd_wire::DEFAULT_MAX_FRAME,
            queue_depth: crate::peer::DEFAULT_QUEUE_DEPTH,
            stderr_tail: stderr::DEFAULT_TAIL,
            start_gate: StartGate::new(default_start_concurrency()),
        }
    }
}

impl HostConfig {
    /// Defaults with the environment's overrides applied; unparsable values
    /// are reported as errors naming the variable.
    pub fn from_env() -> Result<Self, String> {
        let mut c = HostConfig::default();
        let num = |key: &str| -> Result<Option<u64>, String> {
            match std::env::var(key) {
                Ok(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or_else(|| format!("{key}={v:?} is not a positive integer")),
                Err(_) => Ok(None),
            }
        };
        if let Some(ms) = num("NEXO_PLUGIN_INIT_TIMEOUT_MS")? {
            c.init_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = num("NEXO_PLUGIN_TOOL_TIMEOUT_MS")? {
            c.tool_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = num("PLUGD_MAX_FRAME_BYTES")? {
            c.max_frame = n as usize;
        }
        if let Some(n) = num("PLUGD_QUEUE_DEPTH")? {
            c.queue_depth = n as usize;
        }
        if let Some(n) = num("PLUGD_STDERR_TAIL")? {
            c.stderr_tail = n as usize;
        }
        if let Some(n) = num("PLUGD_START_CONCURRENCY")? {
            c.start_gate = StartGate::new(n as usize);
        }
        Ok(c)
    }
}

/// What the runtime around the supervisor wants to know and decide.
///
/// `may_start` and `started` are async: the runtime reads and writes its
/// state store there (which may be a database across the network).
/// `failed` is called under the supervisor's lock and stays synchronous: an
/// observer that records it hands the write to a task.
#[async_trait::async_trait]
pub trait Observer: Send + Sync + 'static {
    /// Called before every start; an `Err` refuses the start with that reason
    /// (e.g. the plugin lost its approval). `Ok` carries what the host decided
    /// for this start ([`Launch`]: configuration, containment, secrets to
    /// scrub).
    async fn may_start(&self, spec: &PluginSpec) -> Result<Launch, String> {
        let _ = spec;
        Ok(Launch::default())
    }
    /// Called after each successful handshake.
    async fn started(&self, spec: &PluginSpec, handshake: &Handshake) {
        let _ = (spec, handshake);
    }
    /// Called when the supervisor gives up on a plugin.
    fn failed(&self, spec: &PluginSpec, reason: &str) {
        let _ = (spec, reason);
    }
    /// Which process group serves each export of a VAI package (see
    /// [`crate::groups`]); asked when a package first routes a call and
    /// again after each reset. The default is the manifest's plan with
    /// nothing trusted.
    fn process_groups(&self, spec: &PluginSpec) -> GroupPlan {
        GroupPlan::from_manifest(spec)
    }
}

/// The observer of a package's other process groups: starts are decided by
/// the package's observer; a handshake does not replace the package's
/// catalog, and a group that gives up is logged, not recorded as the
/// package's failure (the other groups keep serving).
struct GroupObserver {
    parent: Arc<dyn Observer>,
}

#[async_trait::async_trait]
impl Observer for GroupObserver {
    async fn may_start(&self, spec: &PluginSpec) -> Result<Launch, String> {
        self.parent.may_start(spec).await
    }
    fn failed(&self, spec: &PluginSpec, reason: &str) {
        let group = spec.process_role().map(|r| r.group).unwrap_or_default();
        tracing::warn!(plugin = %spec.id, group = %group, "process group failed: {reason}");
    }
    fn process_groups(&self, spec: &PluginSpec) -> GroupPlan {
        self.parent.process_groups(spec)
    }
}

/// An observer that allows everything and records nothing.
#[derive(Debug, Default)]
pub struct NoObserver;
#[async_trait::async_trait]
impl Observer for NoObserver {}

/// Why a plugin could not be used.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The start was refused before spawning.
    #[error("plugin {plugin:?} may not start: {reason}")]
    Refused {
        /// Plugin id.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// The process could not be started.
    #[error("{0}")]
    Spawn(Arc<SpawnError>),
    /// The handshake failed.
    #[error("plugin {plugin:?} failed to start: {source}")]
    Handshake {
        /// Plugin id.
        plugin: String,
        /// The failure.
        #[source]
        source: HandshakeError,
    },
    /// The supervisor gave up; a manual restart is needed.
    #[error(
        "plugin {plugin:?} is failed: {reason}; run `plugd plugin restart {plugin}` after fixing it"
    )]
    Failed {
        /// Plugin id.
        plugin: String,
        /// The last failure.
        reason: String,
    },
    /// The plugin did not become ready within the caller's deadline.
    #[error("plugin {plugin:?} did not become ready in time ({state})")]
    NotReady {
        /// Plugin id.
        plugin: String,
        /// The state it was in.
        state: String,
    },
    /// The plugin is being shut down.
    #[error("plugin {plugin:?} is shutting down")]
    Stopping {
        /// Plugin id.
        plugin: String,
    },
}

/// The observable state of a supervised plugin.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Status {
    /// Not started (lazy plugins until first use).
    Idle,
    /// Spawned, handshake under way.
    Starting,
    /// Serving.
    Running {
        /// The process id (and process group id).
        pid: u32,
        /// Unix seconds when it started.
        since_unix: u64,
    },
    /// Waiting before restart attempt `attempt`.
    Backoff {
        /// The attempt about to be made (1-based).
        attempt: u32,
        /// Milliseconds until it.
        delay_ms: u64,
        /// Why the last run or start ended.
        last_error: String,
    },
    /// Given up; needs `plugd plugin restart`.
    Failed {
        /// Why.
        reason: String,
    },
    /// Shutting down.
    Stopping,
    /// Shut down; starts again on demand.
    Stopped,
}

impl Status {
    /// The state's name, as `plugd plugin list` prints it.
    pub fn name(&self) -> &'static str {
        match self {
            Status::Idle => "idle",
            Status::Starting => "starting",
            Status::Running { .. } => "running",
            Status::Backoff { .. } => "backoff",
            Status::Failed { .. } => "failed",
            Status::Stopping => "stopping",
            Status::Stopped => "stopped",
        }
    }
}

enum Slot {
    Idle,
    Starting,
    Running(Arc<Conn>),
    Backoff,
    Failed(String),
    Stopping,
    Stopped,
}

struct Control {
    slot: Slot,
    /// The start attempt under way, so a stop can wait for it to settle.
    start_task: Option<tokio::task::JoinHandle<()>>,
    /// Restarts used from the current budget.
    restarts: u32,
    /// Bumped on every stop/reset so stale start and restart tasks give up.
    epoch: u64,
    /// The plugin failed because its handshakes timed out (a host too busy
    /// to start it in time, e.g. a start storm): the next demand after this
    /// instant starts it again with a fresh budget instead of failing.
    retry_after: Option<Instant>,
}

/// One supervised plugin. Cheap to clone; every clone is the same plugin.
#[derive(Clone)]
pub struct Supervised {
    inner: Arc<SupInner>,
}

struct SupInner {
    spec: Arc<PluginSpec>,
    config: Arc<HostConfig>,
    observer: Arc<dyn Observer>,
    services: HostServices,
    control: Mutex<Control>,
    status: watch::Sender<Status>,
    /// The plugin said its catalog changed before it was marked running.
    catalog_dirty: std::sync::atomic::AtomicBool,
    /// A caller waits for the start queued at the gate: let it skip the queue.
    urgent: tokio::sync::Notify,
    /// Restarts after a crash or a failed start since this plugin was loaded
    /// (never reset, unlike the budget).
    restarts_total: std::sync::atomic::AtomicU64,
    /// The operator's log of its stderr, kept across runs (shared by every
    /// process group of a package).
    log: crate::log_ring::LogRing,
    /// A VAI package's other process groups (`None`: one process serves
    /// everything, or this is itself one of those groups).
    groups: Option<Arc<Groups>>,
    /// A remote server's per-user sessions ([`Supervised::for_user`]).
    users: crate::user_sessions::UserSessions,
}

/// The process groups of a VAI package beside its `worker` process (the
/// package's own [`Supervised`]).
#[derive(Default)]
struct Groups {
    /// Which group serves each export, until the next reset.
    plan: Mutex<Option<Arc<GroupPlan>>>,
    /// Long-lived `isolated:<export>` groups, made on first use.
    children: Mutex<std::collections::BTreeMap<String, Supervised>>,
    /// Per-invocation processes alive now, with their group.
    live: Mutex<Vec<(String, Supervised)>>,
    /// Bounds the per-invocation processes of each export.
    slots: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Groups {
    fn forget(&self, sup: &Supervised) {
        locked(&self.live).retain(|(_, s)| !Arc::ptr_eq(&s.inner, &sup.inner));
    }

    fn all(&self) -> Vec<Supervised> {
        let mut out: Vec<Supervised> = locked(&self.children).values().cloned().collect();
        out.extend(locked(&self.live).iter().map(|(_, s)| s.clone()));
        out
    }
}

/// A connection to the process that serves one export, for one invocation
/// ([`Supervised::export_connection`]). A per-invocation process is
/// stopped when this is dropped.
pub struct ExportConn {
    conn: Arc<Conn>,
    ctx: CallContext,
    group: String,
    _one_shot: Option<OneShot>,
}

impl std::fmt::Debug for ExportConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportConn")
            .field("group", &self.group)
            .field("pid", &self.conn.process.pid())
            .finish()
    }
}

impl ExportConn {
    /// The connection.
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The call context to send with it (a per-invocation process fixes
    /// the invocation id its scratch directory is named after).
    pub fn context(&self) -> &CallContext {
        &self.ctx
    }

    /// The process group: `worker`, `isolated:<export>`, or `main` for a
    /// plugin that is not a VAI package.
    pub fn group(&self) -> &str {
        &self.group
    }
}

impl std::ops::Deref for ExportConn {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

/// A per-invocation process: stopped (and its slot freed) when dropped.
struct OneShot {
    sup: Option<Supervised>,
    groups: Arc<Groups>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for OneShot {
    fn drop(&mut self) {
        let Some(sup) = self.sup.take() else { return };
        let groups = self.groups.clone();
        let permit = self.permit.take();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    sup.stop().await;
                    groups.forget(&sup);
                    drop(permit);
                });
            }
            Err(_) => {
                if let Some(c) = sup.current() {
                    c.process.kill_group();
                }
                groups.forget(&sup);
            }
        }
    }
}

/// Where a call of an export goes.
enum Route {
    /// This supervisor's own process.
    Here,
    /// A long-lived isolated group.
    Child(Supervised),
    /// A process of its own for this invocation.
    PerInvocation(String),
}

impl std::fmt::Debug for Supervised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervised")
            .field("plugin", &self.inner.spec.id)
            .finish()
    }
}

impl Supervised {
    /// Supervision for `spec`; nothing starts until [`Supervised::connection`]
    /// or [`Supervised::start`].
    ///
    /// A VAI package's supervisor runs its `worker` process group itself
    /// and routes the exports of its other groups to processes of their own
    /// ([`Supervised::export_connection`], [`crate::groups`]).
    pub fn new(
        spec: Arc<PluginSpec>,
        config: Arc<HostConfig>,
        observer: Arc<dyn Observer>,
        services: HostServices,
    ) -> Self {
        let (spec, groups) = match &spec.vai {
            Some(v) if v.process.is_none() => (
                Arc::new(spec.for_process(ProcessRole::worker())),
                Some(Arc::new(Groups::default())),
            ),
            _ => (spec, None),
        };
        Self::build(
            spec,
            config,
            observer,
            services,
            crate::log_ring::LogRing::default(),
            groups,
        )
    }

    fn build(
        spec: Arc<PluginSpec>,
        config: Arc<HostConfig>,
        observer: Arc<dyn Observer>,
        services: HostServices,
        log: crate::log_ring::LogRing,
        groups: Option<Arc<Groups>>,
    ) -> Self {
        Supervised {
            inner: Arc::new(SupInner {
                spec,
                config,
                observer,
                services,
                control: Mutex::new(Control {
                    slot: Slot::Idle,
                    start_task: None,
                    restarts: 0,
                    epoch: 0,
                    retry_after: None,
                }),
                status: watch::channel(Status::Idle).0,
                catalog_dirty: std::sync::atomic::AtomicBool::new(false),
                urgent: tokio::sync::Notify::new(),
                restarts_total: std::sync::atomic::AtomicU64::new(0),
                log,
                groups,
                users: crate::user_sessions::UserSessions::default(),
            }),
        }
    }

    /// `subject`'s own session with this remote server (plugd.yaml
    /// `upstream_auth`; see [`crate::user_sessions`]): the same spec and
    /// start checks, with `credentials` (made once, when the session is
    /// made) instead of the server's own. Opened on first use; idle and
    /// surplus sessions are stopped here.
    pub fn for_user(
        &self,
        subject: &str,
        credentials: impl FnOnce() -> Arc<dyn plugd_mcp_http::Credentials>,
    ) -> Supervised {
        let (sup, closing) = self.inner.users.get_or_make(subject, || {
            let mut spec = (*self.inner.spec).clone();
            spec.supervisor.start = StartMode::Lazy;
            Supervised::build(
                Arc::new(spec),
                self.inner.config.clone(),
                Arc::new(crate::user_sessions::UserObserver {
                    parent: self.inner.observer.clone(),
                    subject: subject.to_owned(),
                    credentials: credentials(),
                }),
                self.inner.services.clone(),
                self.inner.log.clone(),
                None,
            )
        });
        if !closing.is_empty()
            && let Ok(h) = tokio::runtime::Handle::try_current()
        {
            h.spawn(async move {
                for s in closing {
                    s.stop().await;
                }
            });
        }
        sup
    }

    /// Closes every per-user session (the server's `upstream_auth`
    /// changed); the next call of each user opens a new one.
    pub fn close_user_sessions(&self) {
        let closing = self.inner.users.take_all();
        if !closing.is_empty()
            && let Ok(h) = tokio::runtime::Handle::try_current()
        {
            h.spawn(async move {
                for s in closing {
                    s.stop().await;
                }
            });
        }
    }

    /// Closes `subject`'s session, if open (its credentials changed).
    pub fn close_user_session(&self, subject: &str) {
        if let Some(s) = self.inner.users.take(subject)
            && let Ok(h) = tokio::runtime::Handle::try_current()
        {
            h.spawn(async move { s.stop().await });
        }
    }

    /// How many per-user sessions are open ([`Supervised::for_user`]).
    pub fn user_sessions(&self) -> usize {
        self.inner.users.len()
    }

    /// A supervisor for `spec`, one of this package's other process groups.
    fn derived(&self, spec: PluginSpec) -> Supervised {
        Supervised::build(
            Arc::new(spec),
            self.inner.config.clone(),
            Arc::new(GroupObserver {
                parent: self.inner.observer.clone(),
            }),
            self.inner.services.clone(),
            self.inner.log.clone(),
            None,
        )
    }

    /// Which process group serves each export (`None`: not a VAI package,
    /// one process serves everything). Computed by the observer on first
    /// use and after each reset; an export whose class is not honoured is
    /// logged then.
    pub fn group_plan(&self) -> Option<Arc<GroupPlan>> {
        let groups = self.inner.groups.as_ref()?;
        let mut slot = locked(&groups.plan);
        if let Some(p) = &*slot {
            return Some(p.clone());
        }
        let plan = Arc::new(self.inner.observer.process_groups(&self.inner.spec));
        for note in plan.notes() {
            tracing::warn!(plugin = %self.inner.spec.id, "{note}");
        }
        *slot = Some(plan.clone());
        Some(plan)
    }

    fn route(&self, export: &str) -> Route {
        let Some(plan) = self.group_plan() else {
            return Route::Here;
        };
        let Some(p) = plan.placement(export) else {
            // Not an export: the dialect answers "unknown export".
            return Route::Here;
        };
        if p.group == WORKER_GROUP {
            return Route::Here;
        }
        if p.per_invocation {
            return Route::PerInvocation(p.export.clone());
        }
        let groups = self.inner.groups.as_ref().expect("a plan implies groups");
        let mut children = locked(&groups.children);
        let child = children.entry(p.group.clone()).or_insert_with(|| {
            self.derived(self.inner.spec.for_process(ProcessRole {
                group: p.group.clone(),
                scratch: None,
            }))
        });
        Route::Child(child.clone())
    }

    /// The connection of the process that serves `export` (for a plugin
    /// that is not a VAI package, its only process), started if needed
    /// and waited for until `deadline`. An export that runs per invocation
    /// gets a process of its own, stopped when the returned value drops;
    /// send [`ExportConn::context`] with the call.
    pub async fn export_connection(
        &self,
        export: &str,
        ctx: &CallContext,
        deadline: Instant,
    ) -> Result<ExportConn, PluginError> {
        let here = |conn, group: &str| ExportConn {
            conn,
            ctx: ctx.clone(),
            group: group.to_owned(),
            _one_shot: None,
        };
        match self.route(export) {
            Route::Here => {
                let group = if self.inner.groups.is_some() {
                    WORKER_GROUP
                } else {
                    "main"
                };
                Ok(here(self.connection(deadline).await?, group))
            }
            Route::Child(c) => {
                let group = c
                    .inner
                    .spec
                    .process_role()
                    .map(|r| r.group)
                    .unwrap_or_default();
                Ok(here(c.connection(deadline).await?, &group))
            }
            Route::PerInvocation(export) => self.one_shot(&export, ctx, deadline).await,
        }
    }

    /// Starts a process for one invocation of isolated `export`, whose
    /// only writable directory is that invocation's scratch directory.
    async fn one_shot(
        &self,
        export: &str,
        ctx: &CallContext,
        deadline: Instant,
    ) -> Result<ExportConn, PluginError> {
        let spec = &self.inner.spec;
        let groups = self.inner.groups.clone().expect("routed by a plan");
        let group = crate::groups::isolated_group(export);
        let max = spec
            .vai
            .as_ref()
            .and_then(|v| v.export(export))
            .and_then(|e| e.max_concurrency)
            .map_or_else(per_invocation_cap, |n| n as usize);
        let sem = locked(&groups.slots)
            .entry(export.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(max.max(1))))
            .clone();
        let permit = match tokio::time::timeout_at(deadline.into(), sem.acquire_owned()).await {
            Ok(Ok(p)) => p,
            _ => {
                return Err(PluginError::NotReady {
                    plugin: spec.id.clone(),
                    state: format!(
                        "all {max} per-invocation processes of export {export:?} stayed busy until the call's deadline"
                    ),
                });
            }
        };
        let invocation = ctx
            .invocation_id
            .as_deref()
            .and_then(crate::groups::safe_invocation_id)
            .map_or_else(|| crate::model::fresh_id("inv"), str::to_owned);
        let dir = self
            .inner
            .services
            .state_dir(&spec.id)
            .join("scratch")
            .join(&invocation);
        let mut run = spec.for_process(ProcessRole {
            group: group.clone(),
            scratch: Some(dir),
        });
        // One run: a crash fails this invocation and is not restarted.
        run.supervisor.restart_attempts = 0;
        run.supervisor.start = StartMode::Lazy;
        let sup = self.derived(run);
        locked(&groups.live).push((group.clone(), sup.clone()));
        let one_shot = OneShot {
            sup: Some(sup.clone()),
            groups,
            permit: Some(permit),
        };
        let conn = sup.connection(deadline).await?;
        let mut ctx = ctx.clone();
        ctx.invocation_id = Some(invocation);
        Ok(ExportConn {
            conn,
            ctx,
            group,
            _one_shot: Some(one_shot),
        })
    }

    /// The processes of this plugin: for a VAI package one entry per
    /// process group (with the pids running now), else none.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        let Some(plan) = self.group_plan() else {
            return Vec::new();
        };
        let groups = self.inner.groups.as_ref().expect("a plan implies groups");
        let info = |group: &str, exports: Vec<String>, sup: Option<&Supervised>| {
            let status = sup.map_or(Status::Idle, Supervised::status);
            let error = match &status {
                Status::Failed { reason } => Some(reason.clone()),
                Status::Backoff { last_error, .. } => Some(last_error.clone()),
                _ => None,
            };
            ProcessInfo {
                group: group.to_owned(),
                exports,
                per_invocation: false,
                state: status.name().to_owned(),
                pids: match status {
                    Status::Running { pid, .. } => vec![pid],
                    _ => Vec::new(),
                },
                restarts: sup.map_or(0, Supervised::restarts),
                error,
            }
        };
        let mut out = Vec::new();
        for (group, exports, per_invocation) in plan.groups() {
            if group == WORKER_GROUP {
                out.push(info(&group, exports, Some(self)));
            } else if per_invocation {
                let pids: Vec<u32> = locked(&groups.live)
                    .iter()
                    .filter(|(g, _)| *g == group)
                    .filter_map(|(_, s)| match s.status() {
                        Status::Running { pid, .. } => Some(pid),
                        _ => None,
                    })
                    .collect();
                out.push(ProcessInfo {
                    group,
                    exports,
                    per_invocation: true,
                    state: if pids.is_empty() { "idle" } else { "running" }.to_owned(),
                    pids,
                    restarts: 0,
                    error: None,
                });
            } else {
                let child = locked(&groups.children).get(&group).cloned();
                out.push(info(&group, exports, child.as_ref()));
            }
        }
        out
    }

    /// The plugin's spec.
    pub fn spec(&self) -> &Arc<PluginSpec> {
        &self.inner.spec
    }

    /// The plugin's recent stderr, across its runs (for operators).
    pub fn log(&self) -> &crate::log_ring::LogRing {
        &self.inner.log
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.inner.status.borrow().clone()
    }

    /// A receiver of status changes.
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.inner.status.subscribe()
    }

    /// How many times plugd restarted this plugin after a crash or a failed
    /// start since it was loaded (operator restarts not counted).
    pub fn restarts(&self) -> u64 {
        self.inner
            .restarts_total
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counters of the current connection, if running.
    pub fn stats(&self) -> Option<PeerStats> {
        self.current().map(|c| c.peer.stats())
    }

    /// The running connection, if any, without starting anything.
    pub fn current(&self) -> Option<Arc<Conn>> {
        match &self.inner.lock().slot {
            Slot::Running(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// Starts the plugin now if it is idle or stopped (eager start).
    pub fn start(&self) {
        let mut ctl = self.inner.lock();
        if matches!(ctl.slot, Slot::Idle | Slot::Stopped) {
            self.inner.begin_start(&mut ctl, true);
        }
    }

    /// Puts the plugin in the failed state (restoring a failure recorded by an
    /// earlier run of plugd) without notifying the observer.
    pub fn mark_failed(&self, reason: String) {
        let mut ctl = self.inner.lock();
        ctl.epoch += 1;
        ctl.slot = Slot::Failed(reason.clone());
        drop(ctl);
        self.inner.publish(Status::Failed { reason });
    }

    /// Leaves a failed state for idle, without starting anything.
    pub fn clear_failure(&self) {
        let mut ctl = self.inner.lock();
        if matches!(ctl.slot, Slot::Failed(_)) {
            ctl.epoch += 1;
            ctl.restarts = 0;
            ctl.slot = Slot::Idle;
            drop(ctl);
            self.inner.publish(Status::Idle);
        }
    }

    /// Whether the manifest asks for an eager start.
    pub fn is_eager(&self) -> bool {
        self.inner.spec.supervisor.start == StartMode::Eager
    }

    /// The current connection, starting the plugin if needed and waiting (until
    /// `deadline`) for a start or restart under way.
    pub async fn connection(&self, deadline: Instant) -> Result<Arc<Conn>, PluginError> {
        let inner = &self.inner;
        let id = || inner.spec.id.clone();
        let mut rx = inner.status.subscribe();
        let mut waited_on_start = false;
        loop {
            // Mark the current status seen *before* looking at the slot, so a
            // change made after the look always wakes the wait below.
            let state = rx.borrow_and_update().name();
            {
                let mut ctl = inner.lock();
                match &ctl.slot {
                    // A connection whose process just died is not handed out:
                    // the monitor is about to schedule the restart; wait for it.
                    Slot::Running(conn) if conn.peer.closed_reason().is_none() => {
                        return Ok(conn.clone());
                    }
                    Slot::Running(_) => {}
                    Slot::Failed(reason) => {
                        let reason = reason.clone();
                        let retry = match ctl.retry_after {
                            Some(at) => Instant::now() >= at,
                            // Restored from an earlier run of plugd.
                            None => overloaded(&reason),
                        };
                        if !retry || waited_on_start {
                            return Err(PluginError::Failed {
                                plugin: id(),
                                reason,
                            });
                        }
                        tracing::info!(plugin = %inner.spec.id, "starting again on demand: it failed only because its handshakes timed out ({reason})");
                        ctl.retry_after = None;
                        ctl.restarts = 0;
                        ctl.epoch += 1;
                        inner.begin_start(&mut ctl, true);
                        waited_on_start = true;
                    }
                    Slot::Idle | Slot::Stopped => {
                        // Through the start gate like every start; this
                        // caller's wait moves it into the callers' lane.
                        inner.begin_start(&mut ctl, true);
                        waited_on_start = true;
                    }
                    Slot::Starting => {
                        // A start queued at the gate: this caller is waiting.
                        inner.urgent.notify_one();
                        waited_on_start = true;
                    }
                    Slot::Backoff if waited_on_start => {
                        // The attempt this caller waited for failed.
                        let status = inner.status.borrow().clone();
                        let reason = match status {
                            Status::Backoff {
                                last_error,
                                delay_ms,
                                ..
                            } => {
                                format!("{last_error} (retrying in {delay_ms} ms)")
                            }
                            other => other.name().to_owned(),
                        };
                        return Err(PluginError::NotReady {
                            plugin: id(),
                            state: reason,
                        });
                    }
                    Slot::Backoff => {}
                    Slot::Stopping => return Err(PluginError::Stopping { plugin: id() }),
                }
            }
            match tokio::time::timeout_at(deadline.into(), rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => {
                    return Err(PluginError::NotReady {
                        plugin: id(),
                        state: state.to_owned(),
                    });
                }
            }
        }
    }

    /// Calls a tool through the current connection, the dialect's way, with
    /// the plugin's (or the host's) tool timeout unless `timeout` is given.
    pub async fn call_tool(
        &self,
        tool: &ToolDef,
        args: Value,
        ctx: &CallContext,
        timeout: Option<Duration>,
    ) -> Result<Value, CallToolError> {
        let timeout = timeout.unwrap_or_else(|| self.call_timeout());
        match self.route(tool.wire()) {
            Route::Here => {}
            Route::Child(child) => {
                return Box::pin(child.call_tool(tool, args, ctx, Some(timeout))).await;
            }
            Route::PerInvocation(export) => {
                let started = Instant::now() + self.init_timeout().max(timeout);
                let ec = self.one_shot(&export, ctx, started).await?;
                let out =
                    dialect::call_tool(&ec.conn, &ec.conn.spec, tool, args, &ec.ctx, timeout).await;
                return Ok(out?);
            }
        }
        let conn = self.connect_for(timeout).await?;
        // The deadline counts from when the call is sent; a retry keeps it.
        let deadline = Instant::now() + timeout;
        let first =
            dialect::call_tool(&conn, &self.inner.spec, tool, args.clone(), ctx, timeout).await;
        let closed = match first {
            Err(ToolError::Call(CallError::Timeout { id, .. })) => {
                conn.note_cancelled(id, &tool.name);
                return Err(first.unwrap_err().into());
            }
            Err(ToolError::Call(CallError::Closed(closed))) if conn.killed_as_runaway() => closed,
            other => return Ok(other?),
        };
        // Another call on this run ignored its cancel and plugd killed the
        // process: not this call's fault, and not a crash. It is sent again
        // once, to the restarted server, only when repeating it is safe.
        let culprit = conn.runaway_culprit();
        let plugin = &self.inner.spec.id;
        let killed = |outcome: String| {
            CallToolError::Tool(ToolError::Call(CallError::Closed(Arc::new(Closed {
                plugin: closed.plugin.clone(),
                cause: format!("plugd killed it because {culprit} ignored its cancel; {outcome}"),
                stderr_tail: closed.stderr_tail.clone(),
                expected: true,
            }))))
        };
        if !retry_safe(&self.inner.spec, tool) {
            tracing::warn!(plugin = %plugin, tool = %tool.name, "call failed by a runaway kill; not retried (not read-only or idempotent)");
            return Err(killed(format!(
                "this call of tool {:?} was not retried because the tool is not marked read-only or idempotent (MCP annotations readOnlyHint/idempotentHint, VAI effect_class read_only/idempotent_write)",
                tool.name
            )));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(killed(format!(
                "this call of tool {:?} was not retried: its {timeout:?} deadline had passed",
                tool.name
            )));
        }
        tracing::info!(plugin = %plugin, tool = %tool.name, left_ms = left.as_millis() as u64,
            "retrying a call failed by a runaway kill (the tool is read-only or idempotent)");
        let again = async {
            let conn = self.connection(deadline).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            let out = dialect::call_tool(&conn, &self.inner.spec, tool, args, ctx, left).await;
            if let Err(ToolError::Call(CallError::Timeout { id, .. })) = &out {
                conn.note_cancelled(*id, &tool.name);
            }
            Ok::<_, CallToolError>((conn, out))
        };
        match tokio::time::timeout_at(deadline.into(), again).await {
            Err(_) | Ok(Err(CallToolError::Plugin(PluginError::NotReady { .. }))) => {
                Err(killed(format!(
                    "the retry of this call of tool {:?} (read-only or idempotent) did not finish within its {timeout:?} deadline",
                    tool.name
                )))
            }
            Ok(Err(e)) => Err(e),
            // The peer's timeout names what was left of the deadline; the
            // caller configured the whole of it.
            Ok(Ok((_, Err(ToolError::Call(CallError::Timeout { .. }))))) => Err(killed(format!(
                "the retry of this call of tool {:?} (read-only or idempotent) did not finish within its {timeout:?} deadline",
                tool.name
            ))),
            Ok(Ok((conn, Err(ToolError::Call(CallError::Closed(_))))))
                if conn.killed_as_runaway() =>
            {
                Err(killed(format!(
                    "this call of tool {:?} was retried once and the retry was killed the same way",
                    tool.name
                )))
            }
            Ok(Ok((_, out))) => Ok(out?),
        }
    }

    /// How long one call may take once connected: the plugin's own
    /// timeout, else the host's tool timeout.
    pub fn call_timeout(&self) -> Duration {
        self.inner
            .spec
            .supervisor
            .call_timeout
            .unwrap_or(self.inner.config.tool_timeout)
    }

    /// The current connection for a request other than a tool call (MCP
    /// resources, prompts, completion), started on demand like a tool call,
    /// with the call timeout the request gets once connected (the plugin's,
    /// else the host's tool timeout).
    pub async fn call_connection(&self) -> Result<(Arc<Conn>, Duration), PluginError> {
        let timeout = self.call_timeout();
        Ok((self.connect_for(timeout).await?, timeout))
    }

    /// The current connection for a request that may take `timeout` once
    /// connected. A cold start is bounded by the init timeout, not by the
    /// request's: it gets its whole timeout once a connection is there (a
    /// slow start must not eat the time of the call it serves).
    async fn connect_for(&self, timeout: Duration) -> Result<Arc<Conn>, PluginError> {
        self.connection(Instant::now() + self.init_timeout().max(timeout))
            .await
    }

    fn init_timeout(&self) -> Duration {
        self.inner
            .spec
            .supervisor
            .init_timeout
            .unwrap_or(self.inner.config.init_timeout)
    }

    /// Re-reads the running plugin's tool catalog and tells the observer.
    pub async fn refresh_tools(&self) -> Result<Vec<ToolDef>, PluginError> {
        let Some(conn) = self.current() else {
            return Ok(Vec::new());
        };
        let spec = &self.inner.spec;
        let timeout = spec
            .supervisor
            .init_timeout
            .unwrap_or(self.inner.config.init_timeout);
        let tools = (self.inner.services.dialects.of(spec.dialect))
            .refresh_tools(&conn, spec, timeout)
            .await
            .map_err(|source| PluginError::Handshake {
                plugin: spec.id.clone(),
                source,
            })?;
        let handshake = Handshake {
            tools: tools.clone(),
            ..conn.handshake.clone()
        };
        self.inner.observer.started(spec, &handshake).await;
        Ok(tools)
    }

    /// [`Supervised::refresh_tools`] for a plugin's own `list_changed`: a
    /// failure is a warning only while the instance it asked is still the
    /// running one (a refresh racing a stop or restart is dropped quietly).
    async fn refresh_in_background(&self) {
        let asked = self.current();
        if let Err(e) = self.refresh_tools().await {
            let same = match (&asked, self.current()) {
                (Some(a), Some(now)) => Arc::ptr_eq(a, &now) && now.peer.closed_reason().is_none(),
                _ => false,
            };
            if same {
                tracing::warn!(plugin = %self.spec().id, "tool catalog refresh failed: {e}");
            } else {
                tracing::debug!(plugin = %self.spec().id, "tool catalog refresh abandoned: the instance stopped ({e})");
            }
        }
    }

    /// Graceful stop; the plugin starts again on demand afterwards. A start
    /// under way is waited for (bounded by the init timeout) and then shut
    /// down, so nothing it spawned outlives the stop.
    pub async fn stop(&self) {
        // A package's other process groups stop with it.
        let others = self
            .inner
            .groups
            .as_ref()
            .map(|g| g.all())
            .unwrap_or_default();
        // And a remote server's per-user sessions.
        let mut others = others;
        others.extend(self.inner.users.take_all());
        let others = futures_util::future::join_all(others.iter().map(|s| Box::pin(s.stop())));
        let (_, ()) = tokio::join!(others, self.stop_own());
    }

    async fn stop_own(&self) {
        let (conn, starting) = {
            let mut ctl = self.inner.lock();
            ctl.epoch += 1;
            let starting = ctl.start_task.take();
            let conn = match std::mem::replace(&mut ctl.slot, Slot::Stopping) {
                Slot::Running(conn) => Some(conn),
                Slot::Failed(reason) => {
                    ctl.slot = Slot::Failed(reason);
                    None
                }
                _ => None,
            };
            (conn, starting)
        };
        if !matches!(self.status(), Status::Failed { .. }) {
            self.inner.publish(Status::Stopping);
        }
        if let Some(task) = starting {
            // The stale attempt notices the new epoch and shuts its child down.
            let _ = task.await;
        }
        if let Some(conn) = conn {
            let sup = &self.inner.spec.supervisor;
            conn.shutdown(sup.shutdown_timeout, sup.shutdown_grace)
                .await;
        }
        let mut ctl = self.inner.lock();
        if matches!(ctl.slot, Slot::Stopping) {
            ctl.slot = Slot::Stopped;
            drop(ctl);
            self.inner.publish(Status::Stopped);
        }
    }

    /// Clears a failed state and the restart budget (`plugd plugin restart`),
    /// stopping a running instance first; eager plugins start again at once.
    pub async fn reset(&self) {
        self.stop().await;
        if let Some(g) = &self.inner.groups {
            // The next call reads the operator's policy again.
            *locked(&g.plan) = None;
            locked(&g.children).clear();
        }
        {
            let mut ctl = self.inner.lock();
            ctl.epoch += 1;
            ctl.restarts = 0;
            ctl.slot = Slot::Idle;
        }
        self.inner.publish(Status::Idle);
        if self.is_eager() {
            self.start();
        }
    }
}

/// [`crate::groups::DEFAULT_PER_INVOCATION_PROCS`], or
/// `PLUGD_ISOLATED_MAX_PROCS` when set to a positive integer.
fn per_invocation_cap() -> usize {
    std::env::var("PLUGD_ISOLATED_MAX_PROCS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(crate::groups::DEFAULT_PER_INVOCATION_PROCS)
}

/// Whether calling `tool` twice is safe: MCP annotations `readOnlyHint` or
/// `idempotentHint` true (the server's claim, kept in the tool's metadata),
/// or a VAI tool export of `effect_class` `read_only` or
/// `idempotent_write`.
pub fn retry_safe(spec: &PluginSpec, tool: &ToolDef) -> bool {
    if let Some(meta) = &tool.meta
        && (meta.hint("readOnlyHint") == Some(true) || meta.hint("idempotentHint") == Some(true))
    {
        return true;
    }
    spec.vai
        .as_ref()
        .and_then(|v| v.export(tool.wire()))
        .and_then(|e| e.tool.as_ref())
        .is_some_and(|t| {
            matches!(
                t.effect_class,
                plugd_manifest::vai::EffectClass::ReadOnly
                    | plugd_manifest::vai::EffectClass::IdempotentWrite
            )
        })
}

/// A tool call that failed before or during the call.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CallToolError {
    /// The plugin could not be reached.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The call failed.
    #[error(transparent)]
    Tool(#[from] ToolError),
}

impl SupInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, status: Status) {
        self.status.send_replace(status);
    }

    /// Moves to `starting` and launches the attempt. Caller holds the lock.
    /// A `gated` start (eager, restart) first waits for its turn at the
    /// host's [`StartGate`].
    fn begin_start(self: &Arc<Self>, ctl: &mut Control, gated: bool) {
        ctl.slot = Slot::Starting;
        let epoch = ctl.epoch;
        self.publish(Status::Starting);
        let this = self.clone();
        ctl.start_task = Some(tokio::spawn(async move {
            let result = this.launch(gated).await;
            this.finish_start(epoch, result).await;
        }));
    }

    /// Waits for a turn at the start gate: a permit of the queue, or of the
    /// callers' lane when a caller waiting for the plugin moved it ahead;
    /// `Err` when it was stopped meanwhile.
    async fn await_turn(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, PluginError> {
        let gate = self.config.start_gate.permits.clone();
        let lane = self.config.start_gate.lane.clone();
        let stopping = || PluginError::Stopping {
            plugin: self.spec.id.clone(),
        };
        tokio::select! {
            permit = gate.acquire_owned() => Ok(permit.ok()),
            () = self.urgent.notified() => {
                // A caller waits: ahead of the queue, in the callers' lane.
                tokio::select! {
                    permit = lane.acquire_owned() => Ok(permit.ok()),
                    () = until_stopping(self.status.subscribe()) => Err(stopping()),
                }
            }
            () = until_stopping(self.status.subscribe()) => Err(stopping()),
        }
    }

    async fn launch(self: &Arc<Self>, gated: bool) -> Result<Arc<Conn>, PluginError> {
        let spec = &self.spec;
        let plugin = spec.id.clone();
        // Held until the handshake is over: the deadline starts with the turn.
        let _turn = if gated {
            self.await_turn().await?
        } else {
            None
        };
        let launch = Arc::new(self.observer.may_start(spec).await.map_err(|reason| {
            PluginError::Refused {
                plugin: plugin.clone(),
                reason,
            }
        })?);
        // What runs is the launch's spec (rebased onto the approval's pin)
        // when the observer gave one: never a path into the mutable source.
        let run = launch.run_spec.clone().unwrap_or_else(|| spec.clone());
        let crate::remote::Started {
            reader: stdout,
            writer: stdin,
            stderr,
            handle,
            exit,
        } = crate::remote::start(&run, &launch, self.config.max_frame)
            .map_err(|e| PluginError::Spawn(Arc::new(e)))?;
        let weak = Arc::downgrade(self);
        let catalog_changed: dialect::CatalogChanged = Arc::new(move || {
            if let Some(inner) = weak.upgrade() {
                let sup = Supervised { inner };
                if sup.current().is_none() {
                    // Still in the handshake: refresh once it is running.
                    sup.inner
                        .catalog_dirty
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                tokio::spawn(async move { sup.refresh_in_background().await });
            }
        });
        let redact: stderr::SharedRedact = Arc::new(std::sync::RwLock::new(launch.redact.clone()));
        let dialect = self.services.dialects.of(spec.dialect);
        let setup = dialect.setup(dialect::SetupArgs {
            spec: &run,
            services: &self.services,
            catalog_changed,
            redact: &redact,
        });
        let dialect_state = setup.state.clone();
        let mut peer_config = PeerConfig::with_protocol(&plugin, setup.protocol);
        peer_config.max_frame = self.config.max_frame;
        peer_config.queue_depth = self.config.queue_depth;
        peer_config.cancel = setup.cancel;
        let runaway_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runaway = (handle.clone(), runaway_flag.clone());
        peer_config.on_runaway = Some(Arc::new(move |_why: String| {
            runaway.1.store(true, std::sync::atomic::Ordering::Release);
            runaway.0.kill_group();
        }));
        let peer = Peer::start(peer_config, stdout, stdin, setup.handler);
        let tail = stderr::collect_logged(
            peer.plugin().clone(),
            stderr,
            self.config.stderr_tail,
            redact,
            self.log.clone(),
        );

        // The reaper notices the exit at once and fails every pending call.
        {
            let peer = peer.clone();
            let tail = tail.clone();
            let launch = launch.clone();
            tokio::spawn(async move {
                let exit = exit.wait(&launch).await;
                tail.settle(Duration::from_millis(200)).await;
                // A stream the host could not read is the real cause of a kill.
                let cause = match peer.reader_end() {
                    Some(why) if why.starts_with("unreadable output") => {
                        format!("{why}; the plugin was killed ({exit})")
                    }
                    _ => exit,
                };
                peer.close(Closed {
                    plugin: peer.plugin().clone(),
                    cause,
                    stderr_tail: tail.lines(),
                    expected: false,
                });
            });
        }
        // A child that closes stdout but lives on is useless: give it a moment
        // to exit on its own, then kill it.
        {
            let peer = peer.clone();
            let handle = handle.clone();
            tokio::spawn(async move {
                let why = peer.wait_reader_done().await;
                // Unreadable output cannot recover: kill at once. A closed
                // stdout may be an orderly exit: give it a moment first.
                let wait = if why.starts_with("unreadable output") {
                    Duration::ZERO
                } else {
                    Duration::from_millis(500)
                };
                if tokio::time::timeout(wait, peer.wait_closed())
                    .await
                    .is_err()
                {
                    tracing::warn!(plugin = %peer.plugin(), "{why} but the process lives on; killing it");
                    handle.kill_group();
                }
            });
        }

        let init_timeout = spec
            .supervisor
            .init_timeout
            .unwrap_or(self.config.init_timeout);
        let handshake = dialect.handshake(dialect::HandshakeArgs {
            peer: &peer,
            spec,
            services: &self.services,
            state: dialect_state.as_ref(),
            launch: &launch,
            timeout: init_timeout,
        });
        match handshake.await {
            Ok(handshake) => {
                for w in &handshake.warnings {
                    tracing::warn!(plugin = %plugin, "{w}");
                }
                Ok(Arc::new(Conn {
                    peer,
                    process: handle,
                    handshake,
                    stderr: tail,
                    spec: spec.clone(),
                    services: self.services.clone(),
                    state: dialect_state,
                    launch,
                    started: Instant::now(),
                    runaway: runaway_flag,
                    cancelled_calls: Mutex::default(),
                }))
            }
            Err(source) => {
                handle.kill_group();
                // Prefer the exit report when the child died during initialize.
                let source = match source {
                    HandshakeError::Call(CallError::Closed(_))
                    | HandshakeError::Call(CallError::Timeout { .. }) => {
                        match tokio::time::timeout(Duration::from_secs(2), peer.wait_closed()).await
                        {
                            Ok(closed)
                                if matches!(source, HandshakeError::Call(CallError::Closed(_))) =>
                            {
                                HandshakeError::Call(CallError::Closed(closed))
                            }
                            _ => source,
                        }
                    }
                    other => other,
                };
                Err(PluginError::Handshake { plugin, source })
            }
        }
    }

    async fn finish_start(self: &Arc<Self>, epoch: u64, result: Result<Arc<Conn>, PluginError>) {
        let stale = self.lock().epoch != epoch;
        if stale {
            // Stopped or reset meanwhile: this run is not wanted.
            if let Ok(conn) = result {
                let sup = &self.spec.supervisor;
                conn.shutdown(sup.shutdown_timeout, sup.shutdown_grace)
                    .await;
            }
            return;
        }
        self.settle_start(epoch, result).await;
    }

    async fn settle_start(self: &Arc<Self>, epoch: u64, result: Result<Arc<Conn>, PluginError>) {
        // The lock is released before the observer is awaited.
        let Some((conn, status)) = self.settle_locked(epoch, result) else {
            return;
        };
        self.observer.started(&self.spec, &conn.handshake).await;
        self.publish(status);
        if self
            .catalog_dirty
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            let sup = Supervised {
                inner: self.clone(),
            };
            tokio::spawn(async move { sup.refresh_in_background().await });
        }
        let this = self.clone();
        tokio::spawn(async move { this.monitor(epoch, conn).await });
    }

    /// The part of `settle_start` under the lock: a running
    /// connection and its status to publish, or `None` (stale, failed or
    /// restarting).
    fn settle_locked(
        self: &Arc<Self>,
        epoch: u64,
        result: Result<Arc<Conn>, PluginError>,
    ) -> Option<(Arc<Conn>, Status)> {
        let mut ctl = self.lock();
        if ctl.epoch != epoch {
            if let Ok(conn) = result {
                conn.process.kill_group();
            }
            return None;
        }
        match result {
            Ok(conn) => {
                let status = Status::Running {
                    pid: conn.process.pid(),
                    since_unix: SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                };
                ctl.slot = Slot::Running(conn.clone());
                Some((conn, status))
            }
            Err(e) => {
                let permanent = match &e {
                    PluginError::Handshake { source, .. } => source.is_permanent(),
                    PluginError::Refused { .. } | PluginError::Spawn(_) => true,
                    _ => false,
                };
                if permanent {
                    self.fail(&mut ctl, e.to_string());
                } else {
                    self.schedule_restart(&mut ctl, e.to_string());
                }
                None
            }
        }
    }

    async fn monitor(self: Arc<Self>, epoch: u64, conn: Arc<Conn>) {
        let closed = conn.peer.wait_closed().await;
        let mut ctl = self.lock();
        let current = matches!(&ctl.slot, Slot::Running(c) if Arc::ptr_eq(c, &conn));
        if ctl.epoch != epoch || !current {
            return; // an orderly stop
        }
        if conn.killed_as_runaway() {
            // plugd killed it for ignoring a cancel: not a crash, and no
            // step towards `failed`. It starts again when next needed.
            tracing::warn!(plugin = %self.spec.id,
                "stopped for working on past a cancelled call; it starts again when next needed ({closed})");
            ctl.epoch += 1;
            if self.spec.supervisor.start == StartMode::Eager {
                self.begin_start(&mut ctl, true);
            } else {
                ctl.slot = Slot::Idle;
                drop(ctl);
                self.publish(Status::Idle);
            }
            return;
        }
        tracing::error!(plugin = %self.spec.id, "{closed}");
        if conn.uptime() >= self.spec.supervisor.stable_after {
            ctl.restarts = 0;
        }
        self.schedule_restart(&mut ctl, closed.to_string());
    }

    fn fail(&self, ctl: &mut Control, reason: String) {
        tracing::error!(plugin = %self.spec.id, "{reason}");
        ctl.slot = Slot::Failed(reason.clone());
        self.observer.failed(&self.spec, &reason);
        self.publish(Status::Failed { reason });
    }

    fn schedule_restart(self: &Arc<Self>, ctl: &mut Control, reason: String) {
        let sup = &self.spec.supervisor;
        if ctl.restarts >= sup.restart_attempts {
            let n = ctl.restarts;
            if overloaded(&reason) {
                ctl.retry_after = Some(Instant::now() + sup.backoff_base);
            }
            self.fail(
                ctl,
                format!("gave up after {n} restart attempts; last error: {reason}"),
            );
            return;
        }
        let delay = sup
            .backoff_base
            .saturating_mul(2u32.saturating_pow(ctl.restarts))
            .min(sup.backoff_max);
        ctl.restarts += 1;
        self.restarts_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ctl.slot = Slot::Backoff;
        let epoch = ctl.epoch;
        tracing::warn!(plugin = %self.spec.id, attempt = ctl.restarts, delay_ms = delay.as_millis() as u64,
            "restarting after: {reason}");
        self.publish(Status::Backoff {
            attempt: ctl.restarts,
            delay_ms: delay.as_millis() as u64,
            last_error: reason,
        });
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut ctl = this.lock();
            if ctl.epoch == epoch && matches!(ctl.slot, Slot::Backoff) {
                this.begin_start(&mut ctl, true);
            }
        });
    }
}
