//! Dexto plugin modules (seed 002), run unmodified in a small Node host
//! process that ships with plugd.
//!
//! A Dexto plugin is a JavaScript module whose default export is a class
//! implementing any of `beforeLLMRequest`, `beforeToolCall`,
//! `afterToolResult` and `beforeResponse` (plus optional `initialize(config)`
//! and `cleanup()`), each returning a `PluginResult`
//! `{ok, modify, cancel, message, notices}`.
//!
//! # How it runs
//!
//! [`load`] writes the host script (`js/dexto-host.mjs`, embedded in this
//! crate) to `DIR/.plugd/dexto-host.mjs` and starts `node` on it through
//! [`plugd_host::spawn`] (process group, cleared environment plus allowlist,
//! kill-and-reap), one process per module, working directory = the
//! workspace. The two talk newline-delimited JSON-RPC 2.0 through a
//! [`Peer`]: `load`, `hook`, `cleanup` and `ping` requests, `cancel` and
//! `event` notifications to the host, `log` and `events.emit` notifications
//! from it, and its requests for `context.agent` (storage, sessions, tools,
//! MCP servers, bus subscriptions; served by [`super::dexto_agent`]). The host sends
//! `console.*` and `process.stdout.write` of the module to stderr, which plugd
//! logs, so a chatty module cannot corrupt the protocol.
//!
//! # Loading: the seed's rules, exactly
//!
//! The host follows Dexto's loader (`PluginManager.initialize`,
//! `validatePluginShape`):
//!
//! > 1. ✅ Default export exists
//! > 2. ✅ Default export is a class (function)
//! > 3. ✅ Class can be instantiated (constructor works)
//! > 4. ✅ At least one extension point method exists
//! > 5. ✅ `initialize()` and `cleanup()` are functions (if present)
//!
//! and then, as the seed's `PluginManager` does, instantiates the class again
//! and awaits `initialize(config || {})`:
//!
//! > **Fail-Fast Policy:** If any plugin's `initialize()` method fails,
//! > **agent startup fails**. No partial initialization - all plugins must
//! > load successfully. Clear error messages indicating which plugin failed
//! > and why.
//!
//! Every failure is a [`PipelineError::Init`] naming the handler, and its
//! reason (a [`DextoError`]) names the module path: file missing, not a
//! `.js`/`.mjs`/`.cjs`/`.ts` file, Node missing, no TypeScript loader, import
//! failure (Node's first error line, e.g. `SyntaxError: Unexpected token ','`),
//! no default export, default export not a class, constructor throws, no
//! extension point, `initialize`/`cleanup` not functions, `initialize` throws
//! (its message).
//!
//! Module forms: ESM (`export default class …`, in `.mjs` or in `.js`, which
//! Node 20.19+ detects), CommonJS (`module.exports = class …`, and
//! `exports.default = class …` as TypeScript and Babel emit it).
//!
//! TypeScript (`.ts`, `.mts`, `.cts`) needs a loader. plugd asks the `node`
//! it will use for its version: 22.6 or newer runs the host with
//! `--experimental-strip-types`; otherwise a `tsx` on `PATH` runs the host
//! (tsx registers its ESM loader for the dynamic `import()`); otherwise
//! loading fails with [`DextoError::NoTypeScript`], which says so. `ts-node`
//! is not used: its CLI hooks `require`, not the ESM `import()` the host
//! uses.
//!
//! # Calls
//!
//! [`HookHandler::handle`] calls the module's method for the point with the
//! payload and a context `{sessionId, userId, tenantId, agentId, channel,
//! accountId, traceId, deadlineMs, llmConfig, logger, abortSignal, agent}`
//! (only the ids that are set). `agent` holds the seed's managers
//! (`sessionManager`, `toolManager`, `mcpManager`, `stateManager`,
//! `agentEventBus`) and `storage`, frozen and read-only; see
//! [`super::dexto_agent`] for what each answers. `logger.debug/info/warn/error(message, data)` become `log`
//! notifications, logged by plugd under the target `plugd::dexto` with the
//! handler name. A point the module does not implement, and
//! `before_message` (not a Dexto point), pass.
//!
//! The reply is validated: anything but an object, or a field of the wrong
//! type, is a [`HookError::Failed`] naming the module. `{ok: false, cancel:
//! true}` is a cancel (the seed blocks with the plugin's message when the
//! plugin is blocking, as the tenant-auth example relies on); any other
//! `ok: false` is a handler failure under its `on_error` policy.
//!
//! Deadlines come from the pipeline, which wraps `handle` in the handler
//! timeout. When a call is dropped unanswered the host is told (`cancel`
//! aborts that call's `abortSignal`) and pinged: a host that does not answer
//! the ping within [`DextoOptions::liveness`] (a module spinning in a busy
//! loop) is killed, so it cannot stay wedged. A call that never resolves
//! does not block others: the host serves every request on its own.
//!
//! If the host process dies, the call in flight fails ([`HookError::Failed`],
//! so the entry's `on_error` applies) and the next call starts a new host,
//! which re-runs `initialize`.
//!
//! # Reloading (the seed's "Hot Reloading")
//!
//! [`HookHandler::reload_if_changed`] (which `plugd serve` calls every
//! second, see `config_watch::watch_modules`) compares the module file with
//! what was loaded (size, times, inode, then a SHA-256 of the bytes). When
//! it changed, a new host loads the new version while the old one keeps
//! serving; if the new one loads (shape checks and `initialize` pass) it
//! takes over and the old one finishes its calls, runs `cleanup` and is
//! stopped; if not, the old one stays and plugd logs a warning with the
//! reason, trying again when the file changes again. Only the module file
//! itself is watched, not what it imports. [`HookHandler::cleanup`] calls the module's
//! `cleanup` and stops the process.
//!
//! Why one file: one Node host per Dexto module is one state machine (spawn,
//! handshake, the module's four points, reload, restart on death, shutdown)
//! over one connection; the `context.agent` it serves is `dexto_agent.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use plugd_host::peer::Handler;
use plugd_host::protocol::JsonRpc;
use plugd_host::spawn::{self, ProcessHandle, SpawnError, SpawnSpec};
use plugd_host::stderr::{self, StderrTail};
use plugd_host::{CallError, Closed, Peer, PeerConfig};
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt;

use super::dexto_agent::{self, AgentServices, EventBridge};
use plugd_runtime::hooks::{
    HandlerResult, HookContext, HookError, HookFuture, HookHandler, HookPoint, Notice, NoticeKind,
    PipelineError,
};

/// The Node host script, shipped inside plugd.
pub const HOST_SCRIPT: &str = include_str!("../../js/dexto-host.mjs");

/// Where the host script is written, relative to the workspace.
pub const HOST_SCRIPT_PATH: &str = ".plugd/dexto-host.mjs";

/// After a failed (re)start, calls fail with the same error for this long
/// before the next start is tried, so a broken module is not respawned per call.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// How long the module's `cleanup` may take.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

/// Longest log message or data forwarded from a module (bytes).
const MAX_LOG: usize = 4096;

/// The variable naming the `tsx` program (an absolute path).
pub const TSX_ENV: &str = "PLUGD_TSX";

/// How plugd runs Dexto modules.
#[derive(Clone)]
pub struct DextoOptions {
    /// The Node program: a bare name looked up in `PATH` (default `node`) or
    /// an absolute path.
    pub node: String,
    /// How long loading may take (import, validation and `initialize`).
    pub init_timeout: Duration,
    /// Upper bound of one hook call when nobody else bounds it; the pipeline's
    /// handler timeout is normally much shorter.
    pub call_limit: Duration,
    /// How long the host has to answer a ping after a call was abandoned
    /// before it is considered wedged and killed.
    pub liveness: Duration,
    /// Variables for the module's process, on top of plugd's allowlist
    /// (`PATH`, `HOME`, `LANG`): the host environment is not inherited, so a
    /// module reading secrets from `process.env` needs them listed here.
    pub env: BTreeMap<String, String>,
    /// The TypeScript loader for `.ts` modules on Node below 22.6: `tsx` as
    /// `PLUGD_TSX` names it, else `tsx` on `PATH` (scripts/test and
    /// scripts/run install a pinned one into `.npm-tools`).
    pub tsx: Option<PathBuf>,
    /// The agent's key-value storage behind `context.agent.storage`
    /// (`database` and `cache`); `None`: every storage call fails saying
    /// plugd gave the module none.
    pub storage: Option<Arc<dyn plugd_store::StateStore>>,
    /// `context.llmConfig`: provider, model and limits of the running
    /// agent (`null` when it has no LLM).
    pub llm_config: Value,
    /// The runtime behind `context.agent.toolManager`, `mcpManager` and
    /// `agentEventBus` (`None`: each of their calls fails saying so).
    pub runtime: Option<plugd_runtime::Runtime>,
    /// What `context.agent.stateManager.getRuntimeConfig()` answers: the
    /// agent's effective configuration, without secrets (see
    /// `build::dexto_runtime_config`).
    pub runtime_config: Value,
}

impl fmt::Debug for DextoOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DextoOptions")
            .field("node", &self.node)
            .field("tsx", &self.tsx)
            .field("storage", &self.storage.is_some())
            .field("runtime", &self.runtime.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for DextoOptions {
    fn default() -> Self {
        DextoOptions {
            node: "node".to_owned(),
            init_timeout: Duration::from_secs(10),
            call_limit: Duration::from_secs(60),
            liveness: Duration::from_secs(2),
            env: BTreeMap::new(),
            tsx: std::env::var_os(TSX_ENV).map(PathBuf::from),
            storage: None,
            llm_config: Value::Null,
            runtime: None,
            runtime_config: Value::Null,
        }
    }
}

/// Which of the seed's loader checks a module failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadFailure {
    /// Node could not import it (syntax error, missing dependency, …).
    Import,
    /// It has no default export.
    NoDefaultExport,
    /// The default export is not a class.
    NotAClass,
    /// The constructor threw.
    Instantiate,
    /// The instance implements none of the four extension points.
    NoExtensionPoint,
    /// `initialize` or `cleanup` is present but not a function.
    NotAFunction,
    /// `initialize(config)` threw or rejected, or did not finish in time.
    Initialize,
    /// Anything else the host reported.
    Other,
}

impl LoadFailure {
    fn from_code(code: i64) -> LoadFailure {
        match code {
            -32001 | -32002 => LoadFailure::Import,
            -32003 => LoadFailure::NoDefaultExport,
            -32004 => LoadFailure::NotAClass,
            -32005 => LoadFailure::Instantiate,
            -32006 => LoadFailure::NoExtensionPoint,
            -32007 => LoadFailure::NotAFunction,
            -32008 => LoadFailure::Initialize,
            _ => LoadFailure::Other,
        }
    }

    fn advice(self) -> &'static str {
        match self {
            LoadFailure::Import => "fix the module (`node --check FILE` shows where)",
            LoadFailure::NoDefaultExport => {
                "export the plugin class with `export default class …` or `module.exports = class …`"
            }
            LoadFailure::NotAClass => {
                "export the plugin class itself, not an instance or an object"
            }
            LoadFailure::Instantiate => {
                "the class must be constructible with `new Plugin()`, without arguments"
            }
            LoadFailure::NoExtensionPoint => "add at least one of these methods to the class",
            LoadFailure::NotAFunction => "make it a method or remove it",
            LoadFailure::Initialize => {
                "fix the module or its `config`; plugd does not start with a broken plugin"
            }
            LoadFailure::Other => "see plugd's log for the module's stderr",
        }
    }
}

/// Why a Dexto module could not be loaded (the reason of a
/// [`PipelineError::Init`], or of a [`HookError::Failed`] on restart).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DextoError {
    /// The module path is relative.
    #[error(
        "dexto module {module:?} is not an absolute path; write it as \"${{{{dexto.agent_dir}}}}/plugins/<file>.js\" or give the full path"
    )]
    NotAbsolute {
        /// The path as given.
        module: PathBuf,
    },
    /// The module file does not exist.
    #[error("dexto module {module:?} does not exist; check the path in the plugin's `module`")]
    Missing {
        /// The path.
        module: PathBuf,
    },
    /// Not a JavaScript or TypeScript file.
    #[error(
        "dexto module {module:?} is not a .js, .mjs, .cjs or .ts file; point `module` at the plugin's JavaScript"
    )]
    Extension {
        /// The path.
        module: PathBuf,
    },
    /// `node` is not on `PATH`.
    #[error(
        "dexto module {module:?} needs Node.js, but {program:?} is not on PATH; install Node.js 20 or newer"
    )]
    NodeMissing {
        /// The module.
        module: PathBuf,
        /// The program looked up.
        program: String,
    },
    /// A TypeScript module without a loader.
    #[error(
        "dexto module {module:?} is TypeScript, but no TypeScript loader is available ({why}); compile it to .js, use Node 22.6 or newer, or put tsx on PATH"
    )]
    NoTypeScript {
        /// The module.
        module: PathBuf,
        /// What was looked for.
        why: String,
    },
    /// The seed's loader rejected the module, or `initialize` failed.
    #[error("dexto module {module:?}: {detail}; {}", kind.advice())]
    Rejected {
        /// The module.
        module: PathBuf,
        /// Which check failed.
        kind: LoadFailure,
        /// What the host said.
        detail: String,
    },
    /// The Node host could not be started or died while loading.
    #[error("dexto module {module:?}: {reason}")]
    Host {
        /// The module.
        module: PathBuf,
        /// What happened.
        reason: String,
    },
}

/// Loads the Dexto module at `module` (an absolute path) under `name`,
/// validates its shape as Dexto's loader does, and calls its `initialize`
/// with `config`; fails fast with a message naming the handler.
pub async fn load(
    name: &str,
    module: &Path,
    config: &Value,
    workspace: &Path,
) -> Result<Arc<dyn HookHandler>, PipelineError> {
    let m = load_module(name, module, config, workspace, &DextoOptions::default()).await?;
    Ok(m)
}

/// [`load`] with explicit options, returning the concrete handler (its
/// [`DextoModule::points`] tell which points the module implements).
pub async fn load_module(
    name: &str,
    module: &Path,
    config: &Value,
    workspace: &Path,
    options: &DextoOptions,
) -> Result<Arc<DextoModule>, PipelineError> {
    let init = |e: DextoError| PipelineError::Init {
        name: name.to_owned(),
        reason: e.to_string(),
    };
    let launch = prepare(module, workspace, options).await.map_err(init)?;
    // Taken before the start, so a change made while it loads is noticed.
    let stamp = stamp_of(module, None);
    let m = DextoModule {
        name: name.into(),
        module: module.to_path_buf(),
        config: config.clone(),
        workspace: workspace.to_path_buf(),
        launch,
        options: options.clone(),
        slot: tokio::sync::Mutex::new(Slot::default()),
        calls: AtomicU64::new(1),
        stamp: std::sync::Mutex::new(stamp),
    };
    let host = m.start().await.map_err(init)?;
    tracing::info!(handler = name, module = %module.display(), loader = m.launch.loader,
        points = ?host.methods, "dexto module loaded");
    m.slot.lock().await.current = Some(host);
    Ok(Arc::new(m))
}

/// How the host process is started for one module.
#[derive(Debug, Clone)]
struct Launch {
    program: String,
    args: Vec<String>,
    /// `node`, `node --experimental-strip-types` or `tsx`, for logs.
    loader: &'static str,
}

/// Checks the path, writes the host script and picks the loader.
async fn prepare(
    module: &Path,
    workspace: &Path,
    options: &DextoOptions,
) -> Result<Launch, DextoError> {
    if !module.is_absolute() {
        return Err(DextoError::NotAbsolute {
            module: module.to_path_buf(),
        });
    }
    if !module.is_file() {
        return Err(DextoError::Missing {
            module: module.to_path_buf(),
        });
    }
    let ext = module
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    let typescript = match ext {
        "js" | "mjs" | "cjs" => false,
        "ts" | "mts" | "cts" => true,
        _ => {
            return Err(DextoError::Extension {
                module: module.to_path_buf(),
            });
        }
    };
    let script = write_host_script(workspace).map_err(|reason| DextoError::Host {
        module: module.to_path_buf(),
        reason,
    })?;
    let script = script.to_string_lossy().into_owned();
    if spawn::resolve_program("dexto", &options.node).is_err() {
        return Err(DextoError::NodeMissing {
            module: module.to_path_buf(),
            program: options.node.clone(),
        });
    }
    if !typescript {
        return Ok(Launch {
            program: options.node.clone(),
            args: vec![script],
            loader: "node",
        });
    }
    let version = node_version(&options.node, workspace)
        .await
        .map_err(|reason| DextoError::Host {
            module: module.to_path_buf(),
            reason,
        })?;
    if version >= (22, 6, 0) {
        return Ok(Launch {
            program: options.node.clone(),
            args: vec![
                "--experimental-strip-types".into(),
                "--disable-warning=ExperimentalWarning".into(),
                script,
            ],
            loader: "node --experimental-strip-types",
        });
    }
    let tsx = match &options.tsx {
        Some(p) if p.is_file() => Some(p.clone()),
        Some(p) => {
            return Err(DextoError::NoTypeScript {
                module: module.to_path_buf(),
                why: format!("{TSX_ENV} names {}, which is not a file", p.display()),
            });
        }
        None => spawn::resolve_program("dexto", "tsx").ok(),
    };
    if let Some(tsx) = tsx {
        return Ok(Launch {
            program: tsx.to_string_lossy().into_owned(),
            args: vec![script],
            loader: "tsx",
        });
    }
    let (a, b, c) = version;
    Err(DextoError::NoTypeScript {
        module: module.to_path_buf(),
        why: format!(
            "node v{a}.{b}.{c} has no --experimental-strip-types (it needs 22.6 or newer) and tsx is not on PATH"
        ),
    })
}

/// Writes the host script to `DIR/.plugd/dexto-host.mjs` unless it is there
/// already (atomically: temporary file, then rename).
fn write_host_script(workspace: &Path) -> Result<PathBuf, String> {
    let path = workspace.join(HOST_SCRIPT_PATH);
    if std::fs::read(&path).is_ok_and(|b| b == HOST_SCRIPT.as_bytes()) {
        return Ok(path);
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let fail = |what: &str, e: std::io::Error| {
        format!(
            "cannot write the node host to {}: {what}: {e}; make the workspace's .plugd directory writable",
            path.display()
        )
    };
    let dir = path.parent().unwrap_or(workspace);
    std::fs::create_dir_all(dir).map_err(|e| fail("creating the directory", e))?;
    let tmp = dir.join(format!(
        ".dexto-host.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, HOST_SCRIPT).map_err(|e| fail("writing", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail("renaming", e)
    })?;
    Ok(path)
}

/// `node -p process.versions.node`, through the audited spawn helper.
async fn node_version(node: &str, cwd: &Path) -> Result<(u32, u32, u32), String> {
    let spawned = spawn::spawn(&SpawnSpec {
        plugin_id: "dexto".into(),
        program: node.to_owned(),
        args: vec!["-p".into(), "process.versions.node".into()],
        cwd: cwd.to_path_buf(),
        env: BTreeMap::new(),
        containment: Default::default(),
    })
    .map_err(|e| format!("cannot ask node for its version: {e}"))?;
    let spawn::Spawned {
        stdin,
        mut stdout,
        mut reaper,
        ..
    } = spawned;
    drop(stdin);
    let mut out = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        (&mut stdout).take(256).read_to_end(&mut out),
    )
    .await;
    if !matches!(read, Ok(Ok(_))) {
        return Err(format!("{node:?} did not report its version within 10 s"));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), reaper.wait()).await;
    let text = String::from_utf8_lossy(&out);
    let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(a)), Some(Some(b)), Some(Some(c))) => Ok((a, b, c)),
        _ => Err(format!(
            "{node:?} reported an unreadable version {:?}",
            text.trim()
        )),
    }
}

/// A running host process. Dropping the last reference kills its group.
struct HostProc {
    peer: Peer,
    process: ProcessHandle,
    /// Kept so the stderr task's tail lives as long as the process.
    _stderr: StderrTail,
    methods: Vec<HookPoint>,
    has_cleanup: bool,
}

impl Drop for HostProc {
    fn drop(&mut self) {
        self.process.kill_group();
    }
}

#[derive(Default)]
struct Slot {
    current: Option<Arc<HostProc>>,
    stopped: bool,
    last_failure: Option<(Instant, String)>,
}

/// A loaded Dexto module: a [`HookHandler`] backed by its Node host process.
pub struct DextoModule {
    name: Arc<str>,
    module: PathBuf,
    config: Value,
    workspace: PathBuf,
    launch: Launch,
    options: DextoOptions,
    slot: tokio::sync::Mutex<Slot>,
    calls: AtomicU64,
    /// The module file as last loaded (or last tried).
    stamp: std::sync::Mutex<Option<FileStamp>>,
}

/// What a module file looked like: metadata for the cheap check, then its
/// digest to tell a touch from a change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    meta: (u64, i64, i64, i64, i64, u64),
    digest: [u8; 32],
}

/// The stamp of `path`, `None` when it cannot be read.
fn stamp_of(path: &Path, meta_only_if: Option<&FileStamp>) -> Option<FileStamp> {
    use sha2::Digest as _;
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    let meta = (
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        m.ino(),
    );
    if let Some(last) = meta_only_if
        && last.meta == meta
    {
        return Some(last.clone());
    }
    let bytes = std::fs::read(path).ok()?;
    Some(FileStamp {
        meta,
        digest: sha2::Sha256::digest(&bytes).into(),
    })
}

impl fmt::Debug for DextoModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DextoModule")
            .field("name", &self.name)
            .field("module", &self.module)
            .field("loader", &self.launch.loader)
            .finish()
    }
}

impl DextoModule {
    /// The handler name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module path.
    pub fn module(&self) -> &Path {
        &self.module
    }

    /// The points the module implements, as of its last (re)start.
    pub async fn points(&self) -> Vec<HookPoint> {
        let slot = self.slot.lock().await;
        slot.current
            .as_ref()
            .map(|h| h.methods.clone())
            .unwrap_or_default()
    }

    /// The host's PID (also its process group), if it is running.
    pub async fn pid(&self) -> Option<u32> {
        let slot = self.slot.lock().await;
        slot.current
            .as_ref()
            .filter(|h| h.peer.closed_reason().is_none())
            .map(|h| h.process.pid())
    }

    /// Starts a host and loads the module into it.
    async fn start(&self) -> Result<Arc<HostProc>, DextoError> {
        let module = || self.module.clone();
        let spawned = spawn::spawn(&SpawnSpec {
            plugin_id: self.name.to_string(),
            program: self.launch.program.clone(),
            args: self.launch.args.clone(),
            cwd: self.workspace.clone(),
            env: self.options.env.clone(),
            containment: Default::default(),
        })
        .map_err(|e| match e {
            SpawnError::NotFound { program, .. } => DextoError::NodeMissing {
                module: module(),
                program,
            },
            other => DextoError::Host {
                module: module(),
                reason: format!("cannot start the node host: {other}"),
            },
        })?;
        let spawn::Spawned {
            stdin,
            stdout,
            stderr,
            handle,
            mut reaper,
        } = spawned;
        let events = Arc::new(HostEvents {
            handler: self.name.clone(),
            module: self.module.display().to_string().into(),
            services: AgentServices {
                store: self
                    .options
                    .storage
                    .clone()
                    .or_else(|| self.options.runtime.as_ref().map(|r| r.state().clone())),
                runtime: self.options.runtime.clone(),
            },
            bridge: Default::default(),
        });
        let peer = Peer::start(
            PeerConfig::with_protocol(&self.name, Arc::new(JsonRpc::LINES)),
            stdout,
            stdin,
            events,
        );
        let tail = stderr::collect(peer.plugin().clone(), stderr, stderr::DEFAULT_TAIL);
        // The exit is noticed at once and fails every pending call.
        {
            let peer = peer.clone();
            let tail = tail.clone();
            tokio::spawn(async move {
                let status = reaper.wait().await;
                tail.settle(Duration::from_millis(200)).await;
                peer.close(Closed {
                    plugin: peer.plugin().clone(),
                    cause: spawn::describe_exit(&status),
                    stderr_tail: tail.lines(),
                    expected: false,
                });
            });
        }
        // A host that closes stdout but lives on is useless.
        {
            let peer = peer.clone();
            let handle = handle.clone();
            tokio::spawn(async move {
                let why = peer.wait_reader_done().await;
                if tokio::time::timeout(Duration::from_millis(500), peer.wait_closed())
                    .await
                    .is_err()
                {
                    tracing::warn!(handler = %peer.plugin(), "dexto host: {why} but the process lives on; killing it");
                    handle.kill_group();
                }
            });
        }
        // From here on, dropping `host` (an error, or the caller giving up)
        // kills the process.
        let mut host = HostProc {
            peer,
            process: handle,
            _stderr: tail,
            methods: Vec::new(),
            has_cleanup: false,
        };
        let params = json!({
            "name": &*self.name,
            "module": self.module.to_string_lossy(),
            "config": &self.config,
            "llmConfig": &self.options.llm_config,
            "runtimeConfig": &self.options.runtime_config,
        });
        let reply = host
            .peer
            .call("load", Some(params), self.options.init_timeout)
            .await;
        let reply = match reply {
            Ok(v) => v,
            Err(CallError::Remote { error, .. }) => {
                return Err(DextoError::Rejected {
                    module: module(),
                    kind: LoadFailure::from_code(error.code),
                    detail: error.message,
                });
            }
            Err(CallError::Timeout { after, .. }) => {
                return Err(DextoError::Rejected {
                    module: module(),
                    kind: LoadFailure::Initialize,
                    detail: format!("loading and initialize did not finish within {after:?}"),
                });
            }
            Err(CallError::Closed(c)) => {
                return Err(DextoError::Host {
                    module: module(),
                    reason: format!("the node host exited while loading the module ({c})"),
                });
            }
            Err(e) => {
                return Err(DextoError::Host {
                    module: module(),
                    reason: e.to_string(),
                });
            }
        };
        host.methods = reply["methods"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .filter_map(|m| {
                        HookPoint::ALL
                            .into_iter()
                            .find(|p| p.dexto_method() == Some(m))
                    })
                    .collect()
            })
            .unwrap_or_default();
        host.has_cleanup = reply["cleanup"].as_bool().unwrap_or(false);
        Ok(Arc::new(host))
    }

    /// The running host, restarted if it died.
    async fn host(&self) -> Result<Arc<HostProc>, String> {
        let mut slot = self.slot.lock().await;
        if slot.stopped {
            return Err(format!(
                "dexto module {:?} was cleaned up and takes no more calls",
                self.module
            ));
        }
        if let Some(h) = &slot.current {
            match h.peer.closed_reason() {
                None => return Ok(h.clone()),
                Some(why) => {
                    tracing::warn!(handler = %self.name, module = %self.module.display(),
                        "dexto host ended ({why}); starting it again");
                    slot.current = None;
                }
            }
        }
        if let Some((at, why)) = &slot.last_failure
            && at.elapsed() < RESTART_PAUSE
        {
            return Err(why.clone());
        }
        match self.start().await {
            Ok(h) => {
                slot.last_failure = None;
                slot.current = Some(h.clone());
                Ok(h)
            }
            Err(e) => {
                let why = format!("restarting the node host failed: {e}");
                slot.last_failure = Some((Instant::now(), why.clone()));
                Err(why)
            }
        }
    }

    /// Loads the changed module file in a new host and swaps it in; a
    /// version that fails to load leaves the running one in place.
    async fn reload(&self) {
        match self.start().await {
            Ok(host) => {
                let old = {
                    let mut slot = self.slot.lock().await;
                    if slot.stopped {
                        return; // `host` is dropped, which stops it
                    }
                    slot.last_failure = None;
                    slot.current.replace(host.clone())
                };
                tracing::info!(handler = %self.name, module = %self.module.display(),
                    points = ?host.methods, "dexto module changed; reloaded (initialize passed), the previous instance is stopped");
                if let Some(old) = old {
                    tokio::spawn(retire(old, self.name.clone(), self.options.call_limit));
                }
            }
            Err(e) => {
                tracing::warn!(handler = %self.name, module = %self.module.display(),
                    "dexto module changed, but the new version does not load; keeping the previous instance: {e}");
            }
        }
    }

    async fn call(
        &self,
        point: HookPoint,
        method: &'static str,
        payload: &Value,
        ctx: &HookContext,
    ) -> Result<HandlerResult, HookError> {
        let host = self.host().await.map_err(HookError::Failed)?;
        if !host.methods.contains(&point) {
            return Ok(HandlerResult::pass());
        }
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let params = json!({
            "method": method,
            "payload": payload,
            "context": context_json(ctx),
            "call": call,
        });
        let mut guard = Abandoned {
            host: host.clone(),
            call,
            liveness: self.options.liveness,
            armed: true,
        };
        let reply = host
            .peer
            .call("hook", Some(params), self.options.call_limit)
            .await;
        let failed =
            |what: String| HookError::Failed(format!("dexto module {:?}: {what}", self.module));
        match reply {
            Ok(v) => {
                guard.armed = false;
                reply_result(method, v).map_err(failed)
            }
            Err(CallError::Remote { error, .. }) => {
                guard.armed = false;
                Err(failed(error.message))
            }
            Err(CallError::Closed(c)) => {
                guard.armed = false;
                Err(failed(format!(
                    "the node host died during {method} ({c}); it starts again on the next call"
                )))
            }
            // Armed: the abandoned call is cancelled and the host pinged.
            Err(CallError::Timeout { after, .. }) => Err(HookError::Timeout(after)),
            Err(e) => {
                guard.armed = false;
                Err(failed(e.to_string()))
            }
        }
    }
}

/// Stops a replaced host once its calls are done (bounded by `limit`):
/// its `cleanup`, then the process group.
async fn retire(old: Arc<HostProc>, name: Arc<str>, limit: Duration) {
    let until = Instant::now() + limit;
    while Arc::strong_count(&old) > 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if old.has_cleanup
        && old.peer.closed_reason().is_none()
        && let Err(e) = old.peer.call("cleanup", None, CLEANUP_LIMIT).await
    {
        tracing::warn!(handler = %name, "cleanup of the replaced dexto module failed: {e}");
    }
    old.process.kill_group();
}

impl HookHandler for DextoModule {
    fn handle<'a>(
        &'a self,
        point: HookPoint,
        payload: &'a Value,
        ctx: &'a HookContext,
    ) -> HookFuture<'a> {
        Box::pin(async move {
            match point.dexto_method() {
                None => Ok(HandlerResult::pass()),
                Some(method) => self.call(point, method, payload, ctx).await,
            }
        })
    }

    fn reload_if_changed(&self) -> Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let last = self.stamp.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let path = self.module.clone();
            let known = last.clone();
            let now = tokio::task::spawn_blocking(move || stamp_of(&path, known.as_ref()))
                .await
                .ok()
                .flatten();
            let Some(now) = now else {
                // Gone or unreadable (an editor's save in progress): keep
                // what runs, look again next time.
                return;
            };
            if last.as_ref() == Some(&now) {
                return;
            }
            *self.stamp.lock().unwrap_or_else(|p| p.into_inner()) = Some(now.clone());
            if last.is_some_and(|l| l.digest == now.digest) {
                return; // touched, not changed
            }
            self.reload().await;
        })
    }

    fn cleanup(&self) -> Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let mut slot = self.slot.lock().await;
            slot.stopped = true;
            let Some(host) = slot.current.take() else {
                return;
            };
            if host.has_cleanup && host.peer.closed_reason().is_none() {
                match host.peer.call("cleanup", None, CLEANUP_LIMIT).await {
                    Ok(_) => {
                        tracing::debug!(handler = %self.name, "dexto module cleaned up")
                    }
                    Err(e) => {
                        tracing::warn!(handler = %self.name, module = %self.module.display(),
                            "dexto module cleanup failed: {e}")
                    }
                }
            }
            host.process.kill_group();
            let _ = tokio::time::timeout(Duration::from_secs(2), host.peer.wait_closed()).await;
        })
    }
}

/// An unanswered call whose caller went away (the pipeline's timeout): the
/// host is told to abort it, and pinged; a host that cannot answer a ping is
/// stuck (a busy loop) and is killed, so the next call restarts it.
struct Abandoned {
    host: Arc<HostProc>,
    call: u64,
    liveness: Duration,
    armed: bool,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.armed || self.host.peer.closed_reason().is_some() {
            return;
        }
        self.host
            .peer
            .notify("cancel", Some(json!({ "call": self.call })));
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let host = self.host.clone();
        let liveness = self.liveness;
        rt.spawn(async move {
            if let Err(CallError::Timeout { .. }) = host.peer.call("ping", None, liveness).await {
                tracing::warn!(handler = %host.peer.plugin(),
                    "dexto host did not answer a ping within {liveness:?} after a call was abandoned; its event loop is stuck, killing it");
                host.process.kill_group();
            }
        });
    }
}

/// Serves the host's requests (`context.agent`, see [`super::dexto_agent`])
/// and forwards its `log` notifications to tracing.
struct HostEvents {
    handler: Arc<str>,
    module: Arc<str>,
    services: AgentServices,
    bridge: Arc<std::sync::Mutex<EventBridge>>,
}

impl Handler for HostEvents {
    /// `storage.*`, `sessions.*`, `tools.list`, `mcp.list` and
    /// `events.subscribe|unsubscribe` from the module's `context.agent`.
    fn handle(&self, request: plugd_host::peer::Request) -> plugd_host::peer::HandlerFuture {
        let services = self.services.clone();
        let handler = self.handler.clone();
        let bridge = self.bridge.clone();
        Box::pin(async move {
            let params = request.params.unwrap_or(Value::Null);
            dexto_agent::serve(
                &services,
                &bridge,
                &handler,
                &request.method,
                params,
                request.notifier,
            )
            .await
        })
    }

    fn notification(&self, method: String, params: Option<Value>) {
        if method == "events.emit" {
            let p = params.unwrap_or(Value::Null);
            dexto_agent::emit(self.services.runtime.as_ref(), &self.handler, &p);
            return;
        }
        if method != "log" {
            return;
        }
        let p = params.unwrap_or(Value::Null);
        let message = cut(p["message"].as_str().unwrap_or_default());
        let hook = p["method"].as_str().unwrap_or_default();
        let data = match p.get("data") {
            None | Some(Value::Null) => String::new(),
            Some(d) => cut(&d.to_string()).to_owned(),
        };
        let (handler, module) = (&*self.handler, &*self.module);
        match p["level"].as_str().unwrap_or("info") {
            "error" => {
                tracing::error!(target: "plugd::dexto", handler, module, hook, data, "{message}")
            }
            "warn" => {
                tracing::warn!(target: "plugd::dexto", handler, module, hook, data, "{message}")
            }
            "debug" => {
                tracing::debug!(target: "plugd::dexto", handler, module, hook, data, "{message}")
            }
            _ => tracing::info!(target: "plugd::dexto", handler, module, hook, data, "{message}"),
        }
    }
}

fn cut(s: &str) -> &str {
    if s.len() <= MAX_LOG {
        return s;
    }
    let mut end = MAX_LOG;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The Dexto `ExecutionContext` fields plugd knows (camelCase, only those set).
fn context_json(ctx: &HookContext) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            m.insert(k.into(), Value::String(v.clone()));
        }
    };
    put("sessionId", &ctx.session_id);
    put("userId", &ctx.user_id);
    put("tenantId", &ctx.tenant_id);
    put("agentId", &ctx.agent_id);
    put("channel", &ctx.channel);
    put("accountId", &ctx.account_id);
    put("traceId", &ctx.trace_id);
    put("surface", &ctx.surface);
    if let Some(ms) = ctx.deadline_ms {
        m.insert("deadlineMs".into(), ms.into());
    }
    Value::Object(m)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads the host's `hook` reply `{skipped?, returned, value}`.
fn reply_result(method: &str, v: Value) -> Result<HandlerResult, String> {
    if v["skipped"] == Value::Bool(true) {
        return Ok(HandlerResult::pass());
    }
    let returned = v["returned"].as_str().unwrap_or("nothing").to_owned();
    let value = match v {
        Value::Object(mut m) => m.remove("value").unwrap_or(Value::Null),
        _ => Value::Null,
    };
    to_result(method, &returned, value)
}

/// Validates a module's `PluginResult` and maps it onto [`HandlerResult`].
fn to_result(method: &str, returned: &str, value: Value) -> Result<HandlerResult, String> {
    const SHAPE: &str = "{ok, modify, cancel, message, notices}";
    let mut obj = match value {
        Value::Object(o) if returned == "object" => o,
        _ => {
            let what = match returned {
                "undefined" => "nothing (undefined)".to_owned(),
                "null" => "null".to_owned(),
                "array" => "an array".to_owned(),
                other => format!("a {other}"),
            };
            return Err(format!(
                "{method} returned {what}; it must return a PluginResult {SHAPE}"
            ));
        }
    };
    let field = |name: &str, expected: &str, got: &Value| {
        format!(
            "{method} returned a PluginResult whose {name:?} is {} ({}); it must be {expected}",
            kind_of(got),
            cut(&got.to_string())
        )
    };
    let ok = match obj.remove("ok") {
        Some(Value::Bool(b)) => b,
        None => {
            return Err(format!(
                "{method} returned a PluginResult without \"ok\"; it must return {SHAPE} with ok true or false"
            ));
        }
        Some(other) => return Err(field("ok", "true or false", &other)),
    };
    let modify = match obj.remove("modify") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => return Err(field("modify", "an object of payload fields", &other)),
    };
    let cancel = match obj.remove("cancel") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(other) => return Err(field("cancel", "true or false", &other)),
    };
    let message = match obj.remove("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => return Err(field("message", "a string", &other)),
    };
    let notices = match obj.remove("notices") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, n)| notice(method, i, n))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(field("notices", "an array of notices", &other)),
    };
    // Dexto: `{ok: false, cancel: true}` blocks with the plugin's message when
    // the plugin is blocking; the modification of a failed result is dropped.
    if !ok && cancel {
        return Ok(HandlerResult {
            ok: true,
            modify: None,
            cancel: true,
            message,
            notices,
        });
    }
    Ok(HandlerResult {
        ok,
        modify,
        cancel,
        message,
        notices,
    })
}

fn notice(method: &str, i: usize, n: Value) -> Result<Notice, String> {
    let bad = |what: &str| {
        format!(
            "{method} returned notices[{i}] {what}; a notice is {{kind: \"allow\"|\"block\"|\"warn\"|\"info\", code?, message, details?}}"
        )
    };
    let Value::Object(mut n) = n else {
        return Err(bad(&format!("that is {}", kind_of(&n))));
    };
    let kind = match n.get("kind").and_then(Value::as_str) {
        Some("allow") => NoticeKind::Allow,
        Some("block") => NoticeKind::Block,
        Some("warn") => NoticeKind::Warn,
        Some("info") => NoticeKind::Info,
        _ => {
            let got = n
                .get("kind")
                .map_or("missing".to_owned(), |k| k.to_string());
            return Err(bad(&format!("with kind {}", cut(&got))));
        }
    };
    let code = match n.remove("code") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => return Err(bad(&format!("with a code that is {}", kind_of(&other)))),
    };
    let message = match n.remove("message") {
        Some(Value::String(s)) => s,
        _ => return Err(bad("without a string message")),
    };
    let details = match n.remove("details") {
        None | Some(Value::Null) => None,
        Some(d @ Value::Object(_)) => Some(d),
        Some(other) => return Err(bad(&format!("with details that are {}", kind_of(&other)))),
    };
    Ok(Notice {
        kind,
        code,
        message,
        details,
        handler: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelling_failed_result_blocks_with_the_plugins_message() {
        let r = to_result(
            "beforeLLMRequest",
            "object",
            json!({"ok": false, "cancel": true, "message": "over quota",
                   "notices": [{"kind": "block", "code": "QUOTA_EXCEEDED", "message": "m", "details": {"used": 1}}]}),
        )
        .unwrap();
        assert!(r.ok && r.cancel);
        assert_eq!(r.message.as_deref(), Some("over quota"));
        assert_eq!(r.notices[0].code.as_deref(), Some("QUOTA_EXCEEDED"));
    }

    #[test]
    fn wrong_types_are_named() {
        let e = to_result("beforeToolCall", "string", json!("yes")).unwrap_err();
        assert!(e.contains("beforeToolCall returned a string"), "{e}");
        let e = to_result("beforeToolCall", "object", json!({"ok": "yes"})).unwrap_err();
        assert!(e.contains("\"ok\" is a string"), "{e}");
        let e = to_result(
            "beforeToolCall",
            "object",
            json!({"ok": true, "modify": [1]}),
        )
        .unwrap_err();
        assert!(e.contains("\"modify\" is an array"), "{e}");
        let e = to_result(
            "beforeToolCall",
            "object",
            json!({"ok": true, "notices": [{"kind": "loud", "message": "x"}]}),
        )
        .unwrap_err();
        assert!(e.contains("notices[0] with kind \"loud\""), "{e}");
        let e = to_result("beforeToolCall", "undefined", Value::Null).unwrap_err();
        assert!(e.contains("returned nothing (undefined)"), "{e}");
    }

    #[test]
    fn context_uses_dexto_field_names() {
        let ctx = HookContext {
            session_id: Some("s".into()),
            tenant_id: Some("t".into()),
            user_id: Some("u".into()),
            ..HookContext::default()
        };
        assert_eq!(
            context_json(&ctx),
            json!({"sessionId": "s", "tenantId": "t", "userId": "u"})
        );
    }

    #[test]
    fn relative_template_hint_renders() {
        let e = DextoError::NotAbsolute {
            module: "plugins/x.js".into(),
        };
        assert!(
            e.to_string()
                .contains("\"${{dexto.agent_dir}}/plugins/<file>.js\""),
            "{e}"
        );
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::json_with;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "skipped", "returned", "value", "ok", "modify", "cancel", "message", "notices", "kind",
        "code", "details", "level", "method", "data",
    ];
    const STRINGS: &[&str] = &[
        "object",
        "undefined",
        "null",
        "array",
        "string",
        "allow",
        "block",
        "warn",
        "info",
        "error",
        "debug",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn reply_validation_never_panics(v in json_with(KEYS, STRINGS), returned in proptest::sample::select(STRINGS)) {
            let _ = reply_result("beforeLLMRequest", v.clone());
            let _ = to_result("beforeResponse", returned, v.clone());
            let _ = reply_result("beforeToolCall", json!({"returned": "object", "value": v}));
        }

        #[test]
        fn log_notifications_never_panic(params in prop::option::of(json_with(KEYS, STRINGS))) {
            let events = HostEvents { handler: "h".into(), module: "m".into(), services: AgentServices::default(), bridge: Default::default() };
            events.notification("log".into(), params);
        }
    }
}
