//! The one audited way plugd starts a child process.
//!
//! **Architecture invariant**: every plugin process is started here (a clippy
//! `disallowed-methods` rule keeps `Command::new` out of the rest of the
//! workspace). A child started here
//!
//! * leads its own process group, so the whole tree can be killed at once;
//! * gets `SIGKILL` if the plugd thread that spawned it dies (`PR_SET_PDEATHSIG`);
//! * runs in its plugin directory with a cleared environment plus an explicit
//!   allowlist ([`ENV_ALLOWLIST`]) and the manifest's own variables;
//! * is watched through a pidfd, so its exit is noticed at once (no polling)
//!   and signals can never reach a recycled PID;
//! * has its group killed and the leader reaped on drop, so no orphan or
//!   zombie outlives its handle;
//! * is contained as [`SpawnSpec::containment`] says: resource limits set
//!   before `exec`, and a sandbox (bubblewrap, or the Landlock + seccomp
//!   fallback) when one was asked for (see [`crate::sandbox`]); without a
//!   sandbox, the view that hides plugd itself ([`crate::sandbox::view`]:
//!   bwrap is the child then), or where it cannot be built the Landlock
//!   baseline ([`crate::sandbox::baseline`]);
//! * is tracked with its descendants ([`crate::procs`]): recorded under
//!   `.plugd/procs/` when asked, and killed with them when it stops; when
//!   plugd runs with cgroup v2, it enters its own cgroup before `exec`
//!   ([`crate::cgroup`]), and the whole cgroup is killed when it stops.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::io::unix::AsyncFd;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use crate::sandbox::{self, Containment, Mechanism};

/// Host variables a child inherits when set (everything else is cleared).
pub const ENV_ALLOWLIST: &[&str] = &["PATH", "HOME", "LANG"];

/// Variables the host always sets for children: Python plugins must not write
/// `__pycache__` into their (digest-pinned) plugin directory, and should not
/// hold replies in a block buffer.
pub const HOST_ENV: &[(&str, &str)] =
    &[("PYTHONDONTWRITEBYTECODE", "1"), ("PYTHONUNBUFFERED", "1")];

/// What to start.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// The plugin id, for error messages.
    pub plugin_id: String,
    /// The program as the manifest gives it: absolute, or a bare name to look
    /// up in `PATH` and then next to the plugd executable.
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Working directory (the plugin directory).
    pub cwd: PathBuf,
    /// Extra variables from the manifest (already validated).
    pub env: BTreeMap<String, String>,
    /// Sandbox and resource limits ([`Containment::default`]: none).
    pub containment: Containment,
}

/// Why a child could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// A remote MCP server's transport could not be set up (its URL or a
    /// header value is unusable).
    #[error("plugin {plugin:?}: {message}")]
    Remote {
        /// Plugin id.
        plugin: String,
        /// What is wrong, and what to do.
        message: String,
    },
    /// The program was not found.
    #[error(
        "plugin {plugin:?}: command {program:?} not found (looked in PATH and next to plugd at {exe_dir:?}); install it or use an absolute path"
    )]
    NotFound {
        /// Plugin id.
        plugin: String,
        /// The program as given.
        program: String,
        /// The directory of the plugd executable.
        exe_dir: Option<PathBuf>,
    },
    /// The sandbox could not be set up, or refused the start (bwrap missing
    /// without an allowed fallback, a bind that touches the denylist, a
    /// program only reachable through a denylisted path).
    #[error("{reason}")]
    Sandbox {
        /// Plugin id.
        plugin: String,
        /// Why, naming the plugin, the cause and the fix.
        reason: String,
    },
    /// The OS refused to start it.
    #[error("plugin {plugin:?}: cannot start {program:?}: {source}")]
    Os {
        /// Plugin id.
        plugin: String,
        /// Resolved program path.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// A started child: its pipes, a kill handle and the future of its exit.
#[derive(Debug)]
pub struct Spawned {
    /// The child's stdin.
    pub stdin: ChildStdin,
    /// The child's stdout.
    pub stdout: ChildStdout,
    /// The child's stderr.
    pub stderr: ChildStderr,
    /// Signals the child's process group; safe against PID reuse.
    pub handle: ProcessHandle,
    /// Owns the child; [`Reaper::wait`] resolves at exit.
    pub reaper: Reaper,
}

#[derive(Debug)]
struct Shared {
    pid: Pid,
    /// The leader's descendants as the tracker saw them ([`crate::procs`]).
    tracked: Arc<crate::procs::Tracked>,
    /// `true` once the leader has been reaped: after that its PID (and PGID)
    /// may be reused, so no signal may be sent any more.
    reaped: Mutex<bool>,
}

/// Sends signals to a child's process group, never to a recycled PID; or,
/// for a server plugd reaches over the network, stops its in-process
/// transport ([`ProcessHandle::in_process`]).
#[derive(Debug, Clone)]
pub struct ProcessHandle {
    kind: HandleKind,
}

#[derive(Debug, Clone)]
enum HandleKind {
    Child(Arc<Shared>),
    InProcess(plugd_mcp_http::Control),
}

impl ProcessHandle {
    /// The handle of a remote server's transport, which runs inside plugd:
    /// "terminate" ends its session politely, "kill" drops it at once.
    pub fn in_process(control: plugd_mcp_http::Control) -> ProcessHandle {
        ProcessHandle {
            kind: HandleKind::InProcess(control),
        }
    }

    /// The child's PID (also its process group id); plugd's own for a
    /// transport that runs inside plugd (a remote server has no process here).
    pub fn pid(&self) -> u32 {
        match &self.kind {
            HandleKind::Child(shared) => shared.pid.as_raw_nonzero().get() as u32,
            HandleKind::InProcess(_) => std::process::id(),
        }
    }

    /// Sends `SIGTERM` to the whole process group (MCP's polite stop), unless
    /// the leader is already reaped.
    pub fn terminate_group(&self) {
        match &self.kind {
            HandleKind::Child(shared) => {
                let reaped = shared.reaped.lock().unwrap_or_else(|p| p.into_inner());
                if !*reaped {
                    let _ = rustix::process::kill_process_group(shared.pid, Signal::TERM);
                }
            }
            HandleKind::InProcess(control) => control.terminate(),
        }
    }

    /// Sends `SIGKILL` to the whole process group, unless the leader is
    /// already reaped (then the group is gone too, see [`Reaper::wait`]).
    pub fn kill_group(&self) {
        match &self.kind {
            HandleKind::Child(shared) => {
                let reaped = shared.reaped.lock().unwrap_or_else(|p| p.into_inner());
                if !*reaped {
                    let _ = rustix::process::kill_process_group(shared.pid, Signal::KILL);
                }
            }
            HandleKind::InProcess(control) => control.kill(),
        }
    }
}

/// Owns the child process; reaps it and its group.
#[derive(Debug)]
pub struct Reaper {
    shared: Arc<Shared>,
    child: Option<std::process::Child>,
    pidfd: Option<AsyncFd<OwnedFd>>,
    /// The egress proxy of a sandbox with [`sandbox::Network::Proxy`]; it
    /// stops when the Reaper goes.
    _egress: Option<sandbox::egress::proxy::EgressProxy>,
}

impl Reaper {
    /// Waits for the leader to exit, kills whatever is left of its process
    /// group (while the zombie leader still pins the PGID), then reaps it.
    pub async fn wait(&mut self) -> ExitStatus {
        if let Some(fd) = &self.pidfd {
            // A pidfd becomes readable when the process exits.
            let _ = fd.readable().await;
        }
        self.reap_blocking()
    }

    fn reap_blocking(&mut self) -> ExitStatus {
        let Some(mut child) = self.child.take() else {
            return ExitStatus::from_raw(0);
        };
        let mut reaped = self.shared.reaped.lock().unwrap_or_else(|p| p.into_inner());
        // Descendants that left the group (setsid) go too, by pid and
        // start time, so a recycled pid is never hit.
        self.shared.tracked.kill_descendants();
        // The leader is a zombie or alive, so the PGID cannot have been reused.
        let _ = rustix::process::kill_process_group(self.shared.pid, Signal::KILL);
        let status = match child.wait() {
            Ok(s) => s,
            Err(_) => ExitStatus::from_raw(0),
        };
        *reaped = true;
        self.shared.tracked.finish();
        status
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.reap_blocking();
        }
    }
}

/// Looks `program` up the way plugd documents: absolute paths as they are;
/// bare names in `PATH`, then in the directory of the plugd executable (where
/// `cargo build` puts the Rust example plugins).
pub fn resolve_program(plugin_id: &str, program: &str) -> Result<PathBuf, SpawnError> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let not_found = || SpawnError::NotFound {
        plugin: plugin_id.to_owned(),
        program: program.to_owned(),
        exe_dir: exe_dir.clone(),
    };
    let path = Path::new(program);
    if path.is_absolute() {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(not_found())
        };
    }
    if program.contains('/') || program.is_empty() {
        return Err(not_found());
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .chain(exe_dir.clone())
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(not_found)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The environment a child gets: the allowlisted host variables, the host's
/// own fixed variables, then the manifest's.
pub fn child_env(extra: &BTreeMap<String, String>) -> Vec<(OsString, OsString)> {
    let mut env: BTreeMap<OsString, OsString> = BTreeMap::new();
    for key in ENV_ALLOWLIST {
        if let Some(v) = std::env::var_os(key) {
            env.insert(key.into(), v);
        }
    }
    for (k, v) in HOST_ENV {
        env.insert(k.into(), v.into());
    }
    for (k, v) in extra {
        env.insert(k.into(), v.into());
    }
    env.into_iter().collect()
}

/// Starts a child as described in the module docs. Must be called inside a
/// tokio runtime.
pub fn spawn(spec: &SpawnSpec) -> Result<Spawned, SpawnError> {
    let sandbox_err = |reason: String| SpawnError::Sandbox {
        plugin: spec.plugin_id.clone(),
        reason,
    };
    let containment = &spec.containment;
    let mechanism = sandbox::select_mechanism(&spec.plugin_id, containment).map_err(sandbox_err)?;
    let program = match &containment.sandbox {
        Some(_) => sandbox::resolve_visible_program(&spec.plugin_id, &spec.program, &spec.cwd)
            .map_err(sandbox_err)?,
        None => resolve_program(&spec.plugin_id, &spec.program)?,
    };
    let env = child_env(&spec.env);
    let mut fallback = None;
    let mut baseline = None;
    let mut baseline_required = false;
    // The view: (bwrap, its arguments), run instead of the program.
    let mut view = None;
    if let (Mechanism::None, Some(plan)) = (&mechanism, &containment.baseline) {
        baseline_required = plan.require;
        match sandbox::view::choose() {
            sandbox::view::Choice::View { bwrap } => {
                let (_, argv) =
                    sandbox::view::command(plan, &spec.cwd, &program, &spec.args, true).map_err(
                        |e| {
                            sandbox_err(format!(
                                "plugin {:?}: cannot set up its view: {e}; opt it out with `sandbox: {{plugins: {{{}: {{baseline: false}}}}}}` in plugd.yaml",
                                spec.plugin_id, spec.plugin_id
                            ))
                        },
                    )?;
                view = Some((bwrap.clone(), argv));
            }
            sandbox::view::Choice::Landlock { why, forced } => {
                if !forced {
                    if plan.require {
                        return Err(sandbox_err(format!(
                            "plugin {:?}: the view that hides plugd from it cannot be built ({why}) and plugd.yaml says `sandbox: {{baseline: require}}`; install bubblewrap and allow unprivileged user namespaces, set `baseline: best_effort` to fall back to Landlock, or force it with {}=landlock",
                            spec.plugin_id,
                            sandbox::view::BASELINE_ENV
                        )));
                    }
                    warn_no_view_once(why);
                }
                baseline = Some(landlock_baseline(spec, plan)?);
            }
        }
    }
    // Egress through plugd only: the proxy runs as long as the Reaper.
    let mut egress_proxy = None;
    #[allow(clippy::disallowed_methods)] // this is the audited helper
    let mut cmd = match (&mechanism, &containment.sandbox) {
        (Mechanism::Bwrap { path }, Some(plan)) => {
            let (ro, rw) = sandbox::checked_binds(&spec.plugin_id, plan, &spec.cwd, &program)
                .map_err(sandbox_err)?;
            let mut bridge = None;
            if plan.network == sandbox::Network::Proxy {
                bridge = Some(
                    sandbox::egress_bridge_binary()
                        .map_err(|e| sandbox_err(format!("plugin {:?}: {e}", spec.plugin_id)))?,
                );
                let proxy = sandbox::egress::proxy::EgressProxy::start(
                    &spec.plugin_id,
                    &plan.egress,
                    sandbox::egress::proxy::ProxyLimits::default(),
                )
                .map_err(|e| {
                    sandbox_err(format!(
                        "plugin {:?}: cannot start its egress proxy: {e}",
                        spec.plugin_id
                    ))
                })?;
                egress_proxy = Some(proxy);
            }
            let mut cmd = std::process::Command::new(path);
            cmd.args(sandbox::bwrap::argv(&sandbox::bwrap::Wrapped {
                plan,
                env: &env,
                ro: &ro,
                rw: &rw,
                cwd: &spec.cwd,
                program: &program,
                args: &spec.args,
                egress: bridge
                    .as_deref()
                    .zip(egress_proxy.as_ref())
                    .map(|(bridge, proxy)| sandbox::bwrap::Egress {
                        bridge,
                        socket: proxy.socket(),
                    }),
            }))
            .env_clear();
            cmd
        }
        (Mechanism::LandlockSeccomp, Some(plan)) => {
            let (ro, rw) = sandbox::checked_binds(&spec.plugin_id, plan, &spec.cwd, &program)
                .map_err(sandbox_err)?;
            fallback = Some(sandbox::fallback::prepare(plan, &ro, &rw).map_err(|e| {
                sandbox_err(format!(
                    "plugin {:?}: cannot set up the Landlock+seccomp sandbox: {e}",
                    spec.plugin_id
                ))
            })?);
            let mut cmd = std::process::Command::new(&program);
            cmd.args(&spec.args).env_clear().envs(env);
            cmd
        }
        _ => match view {
            Some((bwrap, argv)) => {
                // bwrap passes its environment on unchanged.
                let mut cmd = std::process::Command::new(bwrap);
                cmd.args(argv).env_clear().envs(env);
                cmd
            }
            None => {
                let mut cmd = std::process::Command::new(&program);
                cmd.args(&spec.args).env_clear().envs(env);
                cmd
            }
        },
    };
    let os_err = |source: io::Error| SpawnError::Os {
        plugin: spec.plugin_id.clone(),
        program: program.clone(),
        source,
    };
    cmd.current_dir(&spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let parent = rustix::process::getpid();
    let limits = containment.limits.plan();
    let cgroup = crate::cgroup::PluginCgroup::create(&spec.plugin_id);
    let cgroup_procs = cgroup.as_ref().map(|c| c.procs_path());
    // SAFETY: the closure only makes raw syscalls (open, write, close,
    // prctl, getppid, exit, setrlimit, landlock_restrict_self, seccomp);
    // everything it uses was built before the fork, and it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // First, so everything the child forks is in its cgroup, and
            // before the sandbox could forbid the write.
            if let Some(p) = &cgroup_procs {
                crate::cgroup::enter_in_child(p);
            }
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The parent may have died before prctl took effect.
            if rustix::process::getppid() != Some(parent) {
                // `_exit` ends the forked child at once, without the atexit
                // handlers and stdio flushing `exit` would run (and that
                // could deadlock on a lock the parent's threads held).
                libc::_exit(1);
            }
            sandbox::limits::apply(&limits)?;
            if let Some(f) = fallback.as_mut() {
                f.apply()?;
            }
            if let Some(b) = baseline.as_mut() {
                b.apply(baseline_required)?;
            }
            Ok(())
        });
    }
    // Held until the leader is registered, so the orphan reaper of
    // `procs::tick` never takes a leader's exit status from its Reaper.
    let spawning = crate::procs::spawn_lock();
    let mut child = cmd.spawn().map_err(os_err)?;
    let raw_pid = child.id() as i32;
    // `spawn` returned after `exec`, so the child has run `pre_exec`.
    let cgroup = cgroup.filter(|c| {
        let entered = c.contains(raw_pid);
        if !entered {
            tracing::info!(
                plugin = %spec.plugin_id,
                "the plugin could not enter cgroup {}; its processes are tracked through /proc only",
                c.dir().display()
            );
        }
        entered
    });
    let tracked = crate::procs::register(
        raw_pid,
        &spec.plugin_id,
        containment.records.as_deref(),
        cgroup,
    );
    drop(spawning);
    let pid = Pid::from_raw(raw_pid).expect("a spawned child has a positive pid");
    let shared = Arc::new(Shared {
        pid,
        tracked,
        reaped: Mutex::new(false),
    });
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty())
        .map_err(io::Error::from)
        .and_then(|fd| {
            // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays
            // open and unchanged for the AsyncFd's whole life.
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .map_err(io::Error::from)
        });
    let mut reaper = Reaper {
        shared: shared.clone(),
        child: None,
        pidfd: None,
        _egress: egress_proxy,
    };
    let pipes = (|| -> io::Result<_> {
        let stdin = ChildStdin::from_std(child.stdin.take().expect("piped"))?;
        let stdout = ChildStdout::from_std(child.stdout.take().expect("piped"))?;
        let stderr = ChildStderr::from_std(child.stderr.take().expect("piped"))?;
        Ok((stdin, stdout, stderr))
    })();
    // From here on the reaper owns the child: an early return kills and reaps it.
    reaper.child = Some(child);
    reaper.pidfd = Some(pidfd.map_err(os_err)?);
    let (stdin, stdout, stderr) = pipes.map_err(os_err)?;
    Ok(Spawned {
        stdin,
        stdout,
        stderr,
        handle: ProcessHandle {
            kind: HandleKind::Child(shared),
        },
        reaper,
    })
}

/// The Landlock baseline of `spec` (the view's fallback), ready for the child.
fn landlock_baseline(
    spec: &SpawnSpec,
    plan: &sandbox::BaselinePlan,
) -> Result<sandbox::baseline::Prepared, SpawnError> {
    let sandbox_err = |reason: String| SpawnError::Sandbox {
        plugin: spec.plugin_id.clone(),
        reason,
    };
    if sandbox::baseline::landlock_abi() == 0 {
        if plan.require {
            return Err(sandbox_err(format!(
                "plugin {:?}: the kernel has no Landlock, so the containment baseline cannot hide plugd from it and plugd.yaml says `sandbox: {{baseline: require}}`; enable Landlock (lsm=landlock) or set `baseline: best_effort`",
                spec.plugin_id
            )));
        }
        warn_no_landlock_once();
        return Ok(sandbox::baseline::prepare_without_landlock());
    }
    sandbox::baseline::prepare(plan, &spec.cwd).map_err(|e| {
        sandbox_err(format!(
            "plugin {:?}: cannot set up the containment baseline: {e}; opt it out with `sandbox: {{plugins: {{{}: {{baseline: false}}}}}}` in plugd.yaml",
            spec.plugin_id, spec.plugin_id
        ))
    })
}

/// Logs once per process that the view cannot be built, so plugins without
/// a sandbox fall back to the Landlock baseline.
fn warn_no_view_once(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "the containment view cannot be built ({why}): plugins without a sandbox run under the Landlock baseline instead, which hides .plugd/, the master key file and other plugins but does NOT keep them from writing plugd.yaml or .mcp.json or from connecting to serve's socket, and denies new files beside the hidden paths; install bubblewrap and allow unprivileged user namespaces, or set `sandbox: {{baseline: require}}` in plugd.yaml to refuse such starts"
        );
    });
}

/// Logs once per process that Landlock is missing, so the baseline is off.
fn warn_no_landlock_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "the kernel has no Landlock: plugins without a sandbox run WITHOUT the containment baseline (they can read .plugd/, the master key file and other plugins); enable Landlock, or set `sandbox: {{baseline: require}}` in plugd.yaml to refuse such starts"
        );
    });
}

/// A human description of an exit: `exit status 3` or `killed by signal 9 (SIGKILL)`.
pub fn describe_exit(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    match status.signal() {
        Some(sig) => format!("killed by signal {sig} ({})", signal_name(sig)),
        None => "exited".to_owned(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => "signal",
    }
}

/// `true` when a process group still has members (used by tests and
/// diagnostics to prove that no orphan survived).
pub fn process_group_alive(pgid: u32) -> bool {
    match Pid::from_raw(pgid as i32) {
        Some(pid) => rustix::process::test_kill_process_group(pid).is_ok(),
        None => false,
    }
}
