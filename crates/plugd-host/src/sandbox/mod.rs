//! Containment of a plugin process: the sandbox plan and resource limits the
//! runtime decided for one start, and how spawn applies them.
//!
//! The runtime puts a [`Containment`] into every [`crate::Launch`];
//! [`crate::spawn::spawn`] applies it:
//!
//! * a [`SandboxPlan`] runs the plugin under bubblewrap ([`bwrap`]: the argv of
//!   seed 000 §2.2), or, when bwrap is missing and the operator allowed the
//!   fallback, under Landlock filesystem rules plus a seccomp filter applied in
//!   the child before `exec` ([`fallback`]); bwrap missing without that
//!   permission refuses the start (fail closed);
//! * [`Limits`] become `setrlimit` calls in the child before `exec`
//!   ([`limits`]), and an exit under a limit is explained by
//!   [`describe_exit`] instead of looking like a mystery crash;
//! * without a [`SandboxPlan`], a [`BaselinePlan`] runs the plugin in the
//!   view ([`view`]: a bubblewrap mount namespace that shows the host but
//!   not plugd), or, where the view cannot be built, under the Landlock
//!   baseline ([`baseline`]).
//!
//! **Architecture invariant**: every path bound into a sandbox is re-checked
//! against the hard denylist ([`plugd_manifest::check_sandbox_path`]) on its
//! canonical form right before the spawn, whatever was checked at load.

pub mod baseline;
pub mod bwrap;
pub mod egress;
pub mod fallback;
pub mod limits;
pub mod view;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use serde::Serialize;

pub use baseline::BaselinePlan;
pub use egress::EgressPlan;
pub use limits::Limits;

/// Environment variable naming the bubblewrap binary (default: `bwrap` in `PATH`).
pub const BWRAP_ENV: &str = "PLUGD_BWRAP";

/// Environment variable with which the operator allows the fallback when
/// bubblewrap is missing (`landlock`), like plugd.yaml `sandbox.fallback`.
pub const FALLBACK_ENV: &str = "PLUGD_SANDBOX_FALLBACK";

/// Host directories every sandbox sees read-only (seed §2.2), bound with
/// `--ro-bind-try` (absent ones are skipped).
pub const SYSTEM_RO_PATHS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc/ssl"];

/// What the runtime decided about isolating one start of a plugin.
/// `Default` is no containment at all (a plain child, no limits).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Containment {
    /// The sandbox; `None` runs the plugin as a plain child.
    pub sandbox: Option<SandboxPlan>,
    /// Resource limits, applied with or without a sandbox.
    pub limits: Limits,
    /// The baseline that hides plugd from a plugin without a sandbox
    /// ([`baseline`]); ignored when a sandbox applies (it already shows
    /// nothing of plugd). `None`: the operator opted this plugin out.
    pub baseline: Option<baseline::BaselinePlan>,
    /// Where spawn records the started process group so that a later plugd
    /// can kill what a crashed one left ([`crate::procs`]); `None`: not
    /// recorded.
    pub records: Option<PathBuf>,
}

/// Network inside a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// No network (bwrap `--unshare-net`; fallback: Landlock TCP rules and a
    /// seccomp filter allowing only `AF_UNIX` sockets).
    #[default]
    Deny,
    /// The host's network.
    Host,
    /// No network of its own (bwrap `--unshare-net`) but a way out through
    /// plugd's egress proxy, which allows only [`SandboxPlan::egress`]
    /// ([`egress`]). Needs bwrap: the Landlock fallback refuses it.
    Proxy,
}

impl Network {
    /// `deny`, `host` or `proxy`.
    pub fn name(self) -> &'static str {
        match self {
            Network::Deny => "deny",
            Network::Host => "host",
            Network::Proxy => "proxy",
        }
    }
}

/// Which fallback the operator allows when bubblewrap is missing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// None: a missing bwrap refuses the start (fail closed).
    #[default]
    None,
    /// Landlock filesystem rules plus a seccomp filter.
    Landlock,
}

/// A sandbox for one start. Paths are absolute; the plugin directory and the
/// program's directory are added by spawn.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SandboxPlan {
    /// Network policy.
    pub network: Network,
    /// Extra paths visible read-only (`fs_read_paths`, VAI package assets).
    pub read_paths: Vec<PathBuf>,
    /// Paths visible read-write (`fs_write_paths` with `${state_dir}`
    /// expanded, the VAI scratch root). Spawn creates missing ones.
    pub write_paths: Vec<PathBuf>,
    /// Run as nobody (uid/gid 65534) in a user namespace (bwrap only).
    pub drop_user: bool,
    /// What to do when bwrap is missing.
    pub fallback: Fallback,
    /// Do not show the working directory (an MCP server's cwd may be the
    /// whole workspace): bwrap creates it empty, Landlock grants nothing.
    pub hide_cwd: bool,
    /// What the sandbox may reach through plugd's proxy when
    /// [`SandboxPlan::network`] is [`Network::Proxy`] (ignored otherwise).
    pub egress: EgressPlan,
}

impl SandboxPlan {
    /// Lets this sandbox reach plugd's own HTTP listener at `addr` (the
    /// delegated gateway) and returns the base URL the plugin uses for it.
    /// A sandbox without network gets the proxy with this route and nothing
    /// else; one with the proxy keeps its allowlist and gains the route; one
    /// with the host's network reaches `addr` directly.
    pub fn allow_gateway(&mut self, addr: std::net::SocketAddr) -> String {
        match self.network {
            Network::Host => format!("http://{addr}"),
            Network::Deny | Network::Proxy => {
                self.network = Network::Proxy;
                self.egress.gateway = Some(addr);
                format!("http://{}", egress::GATEWAY_HOST)
            }
        }
    }
}

/// The mechanism that will isolate a start, as [`select_mechanism`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mechanism {
    /// No sandbox.
    None,
    /// bubblewrap at this path.
    Bwrap {
        /// The bwrap binary.
        path: PathBuf,
    },
    /// Landlock + seccomp in the child (bwrap missing, fallback allowed).
    LandlockSeccomp,
}

impl Mechanism {
    /// Short name: `none`, `bwrap`, `landlock+seccomp`.
    pub fn name(&self) -> &'static str {
        match self {
            Mechanism::None => "none",
            Mechanism::Bwrap { .. } => "bwrap",
            Mechanism::LandlockSeccomp => "landlock+seccomp",
        }
    }
}

/// Finds bubblewrap: `PLUGD_BWRAP` when set (a path, or a name looked up in
/// `PATH`), else `bwrap` in `PATH`.
pub fn find_bwrap() -> Result<PathBuf, String> {
    let wanted = std::env::var_os(BWRAP_ENV);
    let name = wanted
        .as_deref()
        .map(Path::new)
        .unwrap_or(Path::new("bwrap"));
    if name.components().count() > 1 || name.is_absolute() {
        return if is_executable(name) {
            Ok(name.to_path_buf())
        } else {
            Err(format!(
                "bubblewrap not found at {:?} ({BWRAP_ENV})",
                name.display().to_string()
            ))
        };
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .map(|d| d.join(name))
        .find(|c| is_executable(c))
        .ok_or_else(|| {
            format!(
                "bubblewrap ({:?}) not found in PATH",
                name.display().to_string()
            )
        })
}

/// Which mechanism a start of `plugin` with `containment` uses, or why it
/// must not start (sandbox requested, bwrap missing, no fallback allowed).
pub fn select_mechanism(plugin: &str, containment: &Containment) -> Result<Mechanism, String> {
    if containment.sandbox.is_none() {
        return Ok(Mechanism::None);
    }
    choose(plugin, containment, find_bwrap())
}

/// [`select_mechanism`] with the bwrap look-up already done.
fn choose(
    plugin: &str,
    containment: &Containment,
    bwrap: Result<PathBuf, String>,
) -> Result<Mechanism, String> {
    let Some(plan) = &containment.sandbox else {
        return Ok(Mechanism::None);
    };
    match bwrap {
        Ok(path) => Ok(Mechanism::Bwrap { path }),
        Err(why) if plan.network == Network::Proxy => Err(format!(
            "plugin {plugin:?} may reach the network only through plugd's egress proxy (an egress allowlist) but {why}; the allowlist needs bubblewrap (a network namespace of its own), the Landlock fallback cannot enforce it: install bubblewrap (apt install bubblewrap)"
        )),
        Err(why) => match plan.fallback {
            Fallback::Landlock => Ok(Mechanism::LandlockSeccomp),
            Fallback::None => Err(format!(
                "plugin {plugin:?} asks for a sandbox but {why}; install bubblewrap (apt install bubblewrap), or allow the Landlock+seccomp fallback with `sandbox: {{fallback: landlock}}` in plugd.yaml or {FALLBACK_ENV}=landlock"
            )),
        },
    }
}

/// Resolves the program of a sandboxed plugin to a path the sandbox can
/// show: like [`crate::spawn::resolve_program`], but a candidate whose
/// canonical path touches the denylist (a pyenv shim under `/root`) is
/// skipped; if only such candidates exist, the start is refused naming them.
pub fn resolve_visible_program(plugin: &str, program: &str, cwd: &Path) -> Result<PathBuf, String> {
    let path = Path::new(program);
    let candidates: Vec<PathBuf> = if path.is_absolute() {
        vec![path.to_path_buf()]
    } else if program.contains('/') || program.is_empty() {
        vec![cwd.join(path)]
    } else {
        let path_var = std::env::var_os("PATH").unwrap_or_default();
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        std::env::split_paths(&path_var)
            .chain(exe_dir)
            .map(|d| d.join(program))
            .filter(|c| is_executable(c))
            .collect()
    };
    let mut hidden = Vec::new();
    for c in candidates {
        if !is_executable(&c) {
            continue;
        }
        match plugd_manifest::check_sandbox_path(&c) {
            Ok(_) => return Ok(c),
            Err(e) => hidden.push(e.to_string()),
        }
    }
    if hidden.is_empty() {
        Err(format!(
            "plugin {plugin:?}: command {program:?} not found in PATH; install it or use an absolute path"
        ))
    } else {
        Err(format!(
            "plugin {plugin:?}: command {program:?} resolves only to paths the sandbox cannot show: {}; install it under /usr or give an absolute path outside the denylist",
            hidden.join("; ")
        ))
    }
}

/// Every path a sandboxed start binds, each re-checked against the denylist
/// on its canonical form; `Err` names the path and the denylist entry.
///
/// Read-only: the plugin directory, the program's directory (unless a
/// system path already shows it) and [`SandboxPlan::read_paths`]. Read-write:
/// [`SandboxPlan::write_paths`], created first when missing.
pub fn checked_binds(
    plugin: &str,
    plan: &SandboxPlan,
    plugin_dir: &Path,
    program: &Path,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
    binds(plugin, plan, plugin_dir, program, true)
}

/// [`checked_binds`], creating missing write paths only when `create` is set
/// (`plugd plugin show` must not change the disk).
fn binds(
    plugin: &str,
    plan: &SandboxPlan,
    plugin_dir: &Path,
    program: &Path,
    create: bool,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
    let check = |p: &Path, what: &str| {
        plugd_manifest::check_sandbox_path(p)
            .map_err(|e| format!("plugin {plugin:?}: sandbox {what} {e}"))
    };
    let mut ro = Vec::new();
    if !plan.hide_cwd {
        ro.push(check(plugin_dir, "plugin directory")?);
    }
    if let Some(parent) = program.parent() {
        let canonical = check(parent, "program directory")?;
        let shown = SYSTEM_RO_PATHS
            .iter()
            .any(|s| parent.starts_with(s) || canonical.starts_with(s))
            || ro.iter().any(|r| canonical.starts_with(r));
        if !shown {
            ro.push(canonical);
        }
    }
    for p in &plan.read_paths {
        ro.push(check(p, "read path")?);
    }
    let mut rw = Vec::new();
    for p in &plan.write_paths {
        // Check before creating: never create a directory inside a denied path.
        check(p, "write path")?;
        if !create {
            rw.push(check(p, "write path")?);
            continue;
        }
        std::fs::create_dir_all(p).map_err(|e| {
            format!(
                "plugin {plugin:?}: cannot create the sandbox write path {:?}: {e}",
                p.display().to_string()
            )
        })?;
        rw.push(check(p, "write path")?);
    }
    Ok((ro, rw))
}

/// The full command line a sandboxed start runs under bwrap (`bwrap ARGS --
/// program args`), for `plugd plugin show`; `None` when the start is not
/// under bwrap. Changes nothing on disk.
pub fn bwrap_command_line(
    plugin: &str,
    containment: &Containment,
    program: &str,
    args: &[String],
    cwd: &Path,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<Option<Vec<String>>, String> {
    let Some(plan) = &containment.sandbox else {
        return Ok(None);
    };
    let Mechanism::Bwrap { path } = select_mechanism(plugin, containment)? else {
        return Ok(None);
    };
    let program = resolve_visible_program(plugin, program, cwd)?;
    let (ro, rw) = binds(plugin, plan, cwd, &program, false)?;
    let env = crate::spawn::child_env(env);
    let bridge = match plan.network {
        Network::Proxy => Some(egress_bridge_binary()?),
        _ => None,
    };
    let socket = PathBuf::from("<proxy socket>");
    let argv = bwrap::argv(&bwrap::Wrapped {
        plan,
        env: &env,
        ro: &ro,
        rw: &rw,
        cwd,
        program: &program,
        args,
        egress: bridge.as_deref().map(|bridge| bwrap::Egress {
            bridge,
            socket: &socket,
        }),
    });
    Ok(Some(
        std::iter::once(path.into_os_string())
            .chain(argv)
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    ))
}

/// The binary that runs the egress bridge inside a sandbox:
/// `PLUGD_EGRESS_BRIDGE` when set, else the running executable (plugd).
pub fn egress_bridge_binary() -> Result<PathBuf, String> {
    let path = match std::env::var_os(egress::BRIDGE_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => std::env::current_exe().map_err(|e| {
            format!("cannot find plugd's own executable for the egress bridge: {e}")
        })?,
    };
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    if is_executable(&path) {
        Ok(path)
    } else {
        Err(format!(
            "the egress bridge binary {:?} is not an executable file; set {} to the plugd binary",
            path.display().to_string(),
            egress::BRIDGE_ENV
        ))
    }
}

/// `true` when a start with `containment` may run under bwrap, which reports
/// a signal death of the plugin as exit status 128 + signal: a sandbox, or
/// the baseline in the view.
pub fn wrapped_by_bwrap(containment: &Containment) -> bool {
    containment.sandbox.is_some()
        || (containment.baseline.is_some() && matches!(view::choose(), view::Choice::View { .. }))
}

/// SIGXCPU: the soft CPU limit was reached.
const SIGXCPU: i32 = 24;

/// A human description of a plugin's exit that names the limit it ran into:
/// `killed by signal 24 (SIGXCPU): the plugin exceeded its CPU limit of 2 s
/// (limits.cpu_seconds)`. Under bwrap a signal death of the plugin shows as
/// exit status 128 + signal.
pub fn describe_exit(status: &ExitStatus, containment: &Containment) -> String {
    let bwrap = wrapped_by_bwrap(containment);
    let signal = status
        .signal()
        .or_else(|| status.code().filter(|c| bwrap && *c > 128).map(|c| c - 128));
    let mut base = crate::spawn::describe_exit(status);
    if let (None, Some(sig)) = (status.signal(), signal) {
        base = format!(
            "{base} (the sandboxed program was {})",
            crate::spawn::describe_exit(&ExitStatus::from_raw(sig))
        );
    }
    let limits = &containment.limits;
    if let (Some(SIGXCPU), Some(cpu)) = (signal, limits.cpu_seconds) {
        return format!(
            "{base}: the plugin exceeded its CPU limit of {cpu} s (limits.cpu_seconds)"
        );
    }
    let clean = status.success() || signal == Some(15) || signal == Some(9);
    if !clean && let Some(mb) = limits.address_space_mb {
        return format!(
            "{base}; the address-space limit of {mb} MiB (limits.address_space_mb) was in force, so a failed allocation may be the cause"
        );
    }
    base
}

pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_signal_names_the_limit() {
        let c = Containment {
            limits: Limits {
                cpu_seconds: Some(2),
                ..Limits::default()
            },
            ..Containment::default()
        };
        let s = describe_exit(&ExitStatus::from_raw(SIGXCPU), &c);
        assert_eq!(
            s,
            "killed by signal 24 (SIGXCPU): the plugin exceeded its CPU limit of 2 s (limits.cpu_seconds)"
        );
        // Under bwrap the plugin's signal death is bwrap's exit status 128 + 24.
        let sandboxed = Containment {
            sandbox: Some(SandboxPlan::default()),
            ..c
        };
        let s = describe_exit(&ExitStatus::from_raw(152 << 8), &sandboxed);
        assert!(s.contains("exceeded its CPU limit of 2 s"), "{s}");
    }

    #[test]
    fn address_space_limit_is_mentioned_on_a_crash_only() {
        let c = Containment {
            limits: Limits {
                address_space_mb: Some(64),
                ..Limits::default()
            },
            ..Containment::default()
        };
        let crash = describe_exit(&ExitStatus::from_raw(1 << 8), &c);
        assert!(crash.contains("address-space limit of 64 MiB"), "{crash}");
        assert_eq!(describe_exit(&ExitStatus::from_raw(0), &c), "exit status 0");
    }

    #[test]
    fn binds_refuse_a_denylisted_write_path() {
        let plan = SandboxPlan {
            write_paths: vec![PathBuf::from("/usr/../root/x")],
            ..SandboxPlan::default()
        };
        let err = checked_binds(
            "p",
            &plan,
            Path::new("/usr/share"),
            Path::new("/usr/bin/env"),
        )
        .unwrap_err();
        assert!(err.contains("plugin \"p\": sandbox write path"), "{err}");
        assert!(err.contains("\"/root\""), "{err}");
        assert!(!Path::new("/root/x").exists());
    }

    #[test]
    fn missing_bwrap_fails_closed_unless_the_fallback_is_allowed() {
        let missing =
            || Err("bubblewrap not found at \"/nonexistent/bwrap\" (PLUGD_BWRAP)".to_owned());
        let mut c = Containment {
            sandbox: Some(SandboxPlan::default()),
            ..Containment::default()
        };
        let err = choose("p", &c, missing()).unwrap_err();
        assert!(
            err.contains(
                "plugin \"p\" asks for a sandbox but bubblewrap not found at \"/nonexistent/bwrap\""
            ),
            "{err}"
        );
        assert!(err.contains("fallback: landlock"), "{err}");
        if let Some(plan) = c.sandbox.as_mut() {
            plan.fallback = Fallback::Landlock;
        }
        assert_eq!(choose("p", &c, missing()), Ok(Mechanism::LandlockSeccomp));
        // An egress allowlist needs a network namespace: no fallback for it.
        if let Some(plan) = c.sandbox.as_mut() {
            plan.network = Network::Proxy;
        }
        let err = choose("p", &c, missing()).unwrap_err();
        assert!(
            err.contains("the Landlock fallback cannot enforce it: install bubblewrap"),
            "{err}"
        );
    }

    #[test]
    fn a_gateway_route_gives_a_closed_sandbox_the_proxy_and_nothing_else() {
        let addr: std::net::SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let mut closed = SandboxPlan::default();
        assert_eq!(closed.allow_gateway(addr), "http://plugd.internal");
        assert_eq!(closed.network, Network::Proxy);
        assert!(closed.egress.allow.is_empty());
        assert_eq!(closed.egress.gateway, Some(addr));
        let mut host = SandboxPlan {
            network: Network::Host,
            ..SandboxPlan::default()
        };
        assert_eq!(host.allow_gateway(addr), "http://127.0.0.1:7000");
        assert_eq!(host.network, Network::Host);
    }
}
