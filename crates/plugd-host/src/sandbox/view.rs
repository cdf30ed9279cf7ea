//! The containment view: the mount namespace (built with bubblewrap) every
//! plugin without a sandbox section runs in by default, so that it sees the
//! host as it is except plugd itself.
//!
//! The view is the host filesystem bound whole (`--bind / /`, host network,
//! host `/tmp`) with, mounted over it in this order:
//!
//! * a fresh `/dev`, and a `/proc` of its own PID namespace (`--unshare-pid`),
//!   so plugd's `/proc/<pid>` (its environment, memory, descriptors) does
//!   not exist for the plugin; bwrap makes `/proc/sys` (with `sysrq-trigger`,
//!   `irq`, `bus`) read-only itself, and `/sys` is bound read-only (so a
//!   root plugin cannot move itself out of its cgroup);
//! * each hidden directory ([`super::BaselinePlan::deny`]: the workspace's
//!   `.plugd/` and `.plugins/`, the master key file's directory) replaced by
//!   an empty tmpfs, a hidden file by `/dev/null`; serve's socket
//!   (`.plugd/serve.sock`) therefore does not exist;
//! * inside those, the plugin's own exceptions: its code (its pin or its
//!   `.plugins/<id>`, its working directory) read-only, its state directory
//!   read-write; then each tmpfs is remounted read-only;
//! * the policy files ([`super::BaselinePlan::read_only`]: `plugd.yaml`,
//!   `.mcp.json`) read-only when they exist (an absent one is not created,
//!   so a plugin may create it: the live-config approval covers that).
//!
//! When plugd runs as root, the plugin loses [`DROPPED_CAPS`] (bwrap
//! `--cap-drop`; bwrap also sets `no_new_privs`, so an `exec` does not give
//! them back): the capabilities that reach past the view. As another user,
//! bwrap runs in an unprivileged user namespace with the same uid mapped and
//! no capabilities at all. Mounts copied into a nested user namespace are
//! locked, so a plugin cannot unmount the tmpfs there either.
//!
//! Whether the view can be built is probed once per process ([`choose`]):
//! bwrap missing, or a kernel or container that refuses its namespaces
//! (AppArmor-restricted user namespaces, seccomp'd containers), falls back
//! to the Landlock baseline ([`super::baseline`]) with a warning, or refuses
//! the start under `sandbox.baseline: require`. [`BASELINE_ENV`]`=landlock`
//! forces the fallback.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Serialize;

use super::BaselinePlan;

/// Environment variable that chooses the baseline's mechanism: `view` (the
/// default: the mount namespace when it can be built, else Landlock) or
/// `landlock` (the Landlock baseline, even when the view could be built).
pub const BASELINE_ENV: &str = "PLUGD_BASELINE";

/// Capabilities a plugin in the view does not get when plugd runs as root,
/// because they reach past the view: unmounting or remounting it
/// (`SYS_ADMIN`), reading other processes (`SYS_PTRACE`, `PERFMON`, `BPF`),
/// opening files by handle past the mounts (`DAC_READ_SEARCH`:
/// `open_by_handle_at`), raw disks and kernel memory (`SYS_RAWIO`, `MKNOD`,
/// `SYS_MODULE`), the machine itself (`SYS_BOOT`, `SYS_TIME`), the host's
/// network configuration that plugd's own listener shares (`NET_ADMIN`: the
/// view keeps the host network, and a plugin that is root must not reroute
/// or firewall it), and the security modules and audit (`MAC_ADMIN`,
/// `MAC_OVERRIDE`, `AUDIT_CONTROL`, `SYSLOG`). Ordinary file work as root
/// (`CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `SETUID`, binding low ports...) keeps
/// working.
pub const DROPPED_CAPS: &[&str] = &[
    "CAP_SYS_ADMIN",
    "CAP_SYS_PTRACE",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_DAC_READ_SEARCH",
    "CAP_SYS_RAWIO",
    "CAP_MKNOD",
    "CAP_SYS_MODULE",
    "CAP_SYS_BOOT",
    "CAP_SYS_TIME",
    "CAP_NET_ADMIN",
    "CAP_MAC_ADMIN",
    "CAP_MAC_OVERRIDE",
    "CAP_AUDIT_CONTROL",
    "CAP_SYSLOG",
];

/// Which mechanism the baseline uses in this process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Choice {
    /// The view, built by this bwrap.
    View {
        /// The bwrap binary.
        bwrap: PathBuf,
    },
    /// The Landlock baseline.
    Landlock {
        /// Why not the view: forced by [`BASELINE_ENV`], or why it cannot be
        /// built.
        why: String,
        /// `true` when the operator forced it; `false` when the view is
        /// unavailable.
        forced: bool,
    },
}

static CHOICE: OnceLock<Choice> = OnceLock::new();

/// Makes this process use the Landlock baseline, as [`BASELINE_ENV`]`=landlock`
/// does, for an embedder that cannot set its own environment (plugd's test
/// suite: most of its tests compare the process ids plugins report with the
/// host's, which a PID namespace changes). Must come before the first start;
/// `false` when the mechanism was already chosen.
pub fn force_landlock(why: &str) -> bool {
    CHOICE
        .set(Choice::Landlock {
            why: format!("forced by {why}"),
            forced: true,
        })
        .is_ok()
}

/// The mechanism of this process, probed once: [`BASELINE_ENV`] first, then
/// whether bwrap can build the view here.
pub fn choose() -> &'static Choice {
    CHOICE.get_or_init(|| {
        if std::env::var(BASELINE_ENV).is_ok_and(|v| v == "landlock") {
            return Choice::Landlock {
                why: format!("forced by {BASELINE_ENV}=landlock"),
                forced: true,
            };
        }
        match super::find_bwrap().and_then(|bwrap| probe(&bwrap).map(|()| bwrap)) {
            Ok(bwrap) => Choice::View { bwrap },
            Err(why) => Choice::Landlock { why, forced: false },
        }
    })
}

/// Builds a view like a plugin's (whole host, own PID namespace and `/proc`,
/// read-only `/sys`, a tmpfs, the capability drop) around `true`.
fn probe(bwrap: &Path) -> Result<(), String> {
    let program = crate::spawn::resolve_program("(view probe)", "true")
        .map_err(|e| format!("cannot probe the view: {e}"))?;
    let tmp = std::env::temp_dir();
    let argv = argv(&View {
        hidden_dirs: std::slice::from_ref(&tmp),
        hidden_files: &[],
        exceptions: &[],
        read_only_files: &[],
        cwd: Path::new("/"),
        program: &program,
        args: &[],
        drop_caps: is_root(),
    });
    #[allow(clippy::disallowed_methods)] // the audited spawn path's own probe
    let out = std::process::Command::new(bwrap)
        .args(argv)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", bwrap.display().to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(format!(
        "{:?} cannot build the view here ({}): {}",
        bwrap.display().to_string(),
        crate::spawn::describe_exit(&out.status),
        stderr.trim()
    ))
}

/// `true` when plugd runs as root (then bwrap keeps capabilities unless told).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// One exception inside a hidden directory, bound at the same path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exception {
    /// The canonical path.
    pub path: PathBuf,
    /// Bound read-write (its state directory) rather than read-only.
    pub writable: bool,
}

/// What the view of one start hides and shows, resolved on the disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Resolved {
    /// Hidden directories (an empty read-only tmpfs each), canonical.
    pub hidden_dirs: Vec<PathBuf>,
    /// Hidden files (`/dev/null` each), canonical.
    pub hidden_files: Vec<PathBuf>,
    /// Exceptions inside the hidden directories, parents first.
    pub exceptions: Vec<Exception>,
    /// Policy files shown read-only (those that exist).
    pub read_only_files: Vec<PathBuf>,
}

/// Resolves `plan` for a start in `cwd`: the existing hidden paths (outermost
/// only), the exceptions strictly inside them (see
/// [`super::baseline::resolve`]), and the existing policy files outside them.
pub fn resolve(plan: &BaselinePlan, cwd: &Path) -> Resolved {
    let (deny, allow) = super::baseline::resolve(plan, Some(cwd));
    let writable: Vec<PathBuf> = plan
        .writable
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let (hidden_dirs, hidden_files) = deny.into_iter().partition(|p| p.is_dir());
    let hidden_dirs: Vec<PathBuf> = hidden_dirs;
    let mut read_only_files: Vec<PathBuf> = plan
        .read_only
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.is_file() && !hidden_dirs.iter().any(|d| p.starts_with(d)))
        .collect();
    read_only_files.sort();
    read_only_files.dedup();
    Resolved {
        exceptions: allow
            .into_iter()
            .map(|path| Exception {
                writable: writable.contains(&path),
                path,
            })
            .collect(),
        hidden_dirs,
        hidden_files,
        read_only_files,
    }
}

/// What [`argv`] builds.
#[derive(Debug)]
pub struct View<'a> {
    /// Directories replaced by an empty tmpfs (read-only once the exceptions
    /// are bound).
    pub hidden_dirs: &'a [PathBuf],
    /// Files replaced by `/dev/null`.
    pub hidden_files: &'a [PathBuf],
    /// Exceptions inside the hidden directories, parents first.
    pub exceptions: &'a [Exception],
    /// Files bound read-only over themselves.
    pub read_only_files: &'a [PathBuf],
    /// Working directory.
    pub cwd: &'a Path,
    /// The program (resolved) and its arguments.
    pub program: &'a Path,
    /// Arguments.
    pub args: &'a [String],
    /// Drop [`DROPPED_CAPS`] (plugd runs as root).
    pub drop_caps: bool,
}

/// bwrap's arguments (everything after `bwrap`). Order matters: bwrap mounts
/// in argument order, so the whole host comes first, the hidden paths over
/// it, the exceptions inside them, and the read-only remounts last. The
/// environment is the bwrap process's own (spawn clears it and sets the
/// allowlist), which bwrap passes on unchanged.
pub fn argv(v: &View<'_>) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(OsString::from));
    push(&["--die-with-parent", "--new-session", "--unshare-pid"]);
    if v.drop_caps {
        for cap in DROPPED_CAPS {
            push(&["--cap-drop", cap]);
        }
    }
    push(&[
        "--bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--ro-bind",
        "/sys",
        "/sys",
    ]);
    let mut op = |flag: &str, src: &Path, dest: Option<&Path>| {
        a.push(flag.into());
        a.push(src.into());
        if let Some(d) = dest {
            a.push(d.into());
        }
    };
    for d in v.hidden_dirs {
        op("--tmpfs", d, None);
    }
    for f in v.hidden_files {
        op("--ro-bind", Path::new("/dev/null"), Some(f));
    }
    for e in v.exceptions {
        let flag = if e.writable { "--bind" } else { "--ro-bind" };
        op(flag, &e.path, Some(&e.path));
    }
    for d in v.hidden_dirs {
        op("--remount-ro", d, None);
    }
    for f in v.read_only_files {
        op("--ro-bind", f, Some(f));
    }
    op("--chdir", v.cwd, None);
    a.push("--".into());
    a.push(v.program.into());
    a.extend(v.args.iter().map(OsString::from));
    a
}

/// The view's command line for a start of `program args` in `cwd` under
/// `plan`, without the bwrap binary; `plan`'s missing exceptions inside a
/// hidden directory are created first when `create` is set (spawn), never
/// otherwise (`plugd plugin show`).
pub fn command(
    plan: &BaselinePlan,
    cwd: &Path,
    program: &Path,
    args: &[String],
    create: bool,
) -> Result<(Resolved, Vec<OsString>), String> {
    if create {
        super::baseline::create_exceptions(plan)?;
    }
    let r = resolve(plan, cwd);
    let argv = argv(&View {
        hidden_dirs: &r.hidden_dirs,
        hidden_files: &r.hidden_files,
        exceptions: &r.exceptions,
        read_only_files: &r.read_only_files,
        cwd,
        program,
        args,
        drop_caps: is_root(),
    });
    Ok((r, argv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(v: &View<'_>) -> String {
        argv(v)
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn the_host_comes_first_then_the_hidden_paths_then_their_exceptions() {
        let dirs = [PathBuf::from("/ws/.plugd"), PathBuf::from("/ws/.plugins")];
        let files = [PathBuf::from("/home/u/.config/plugd/master.key")];
        let exceptions = [
            Exception {
                path: PathBuf::from("/ws/.plugd/pins/ab"),
                writable: false,
            },
            Exception {
                path: PathBuf::from("/ws/.plugd/state/p"),
                writable: true,
            },
        ];
        let ro = [PathBuf::from("/ws/plugd.yaml")];
        let args = vec!["main.py".to_owned()];
        let v = View {
            hidden_dirs: &dirs,
            hidden_files: &files,
            exceptions: &exceptions,
            read_only_files: &ro,
            cwd: Path::new("/ws/.plugd/pins/ab"),
            program: Path::new("/usr/bin/python3"),
            args: &args,
            drop_caps: false,
        };
        assert_eq!(
            line(&v),
            "--die-with-parent --new-session --unshare-pid \
             --bind / / --dev /dev --proc /proc --ro-bind /sys /sys \
             --tmpfs /ws/.plugd --tmpfs /ws/.plugins \
             --ro-bind /dev/null /home/u/.config/plugd/master.key \
             --ro-bind /ws/.plugd/pins/ab /ws/.plugd/pins/ab \
             --bind /ws/.plugd/state/p /ws/.plugd/state/p \
             --remount-ro /ws/.plugd --remount-ro /ws/.plugins \
             --ro-bind /ws/plugd.yaml /ws/plugd.yaml \
             --chdir /ws/.plugd/pins/ab -- /usr/bin/python3 main.py"
        );
        // No environment on the command line: bwrap passes its own on.
        assert!(!line(&v).contains("--setenv") && !line(&v).contains("--clearenv"));
    }

    #[test]
    fn as_root_the_capabilities_that_reach_past_the_view_are_dropped_before_any_mount() {
        let v = View {
            hidden_dirs: &[],
            hidden_files: &[],
            exceptions: &[],
            read_only_files: &[],
            cwd: Path::new("/"),
            program: Path::new("/bin/true"),
            args: &[],
            drop_caps: true,
        };
        let l = line(&v);
        for cap in [
            "CAP_SYS_ADMIN",
            "CAP_SYS_PTRACE",
            "CAP_PERFMON",
            "CAP_DAC_READ_SEARCH",
            "CAP_SYS_MODULE",
            "CAP_SYS_RAWIO",
            "CAP_MKNOD",
            "CAP_BPF",
            "CAP_SYS_BOOT",
            "CAP_NET_ADMIN",
        ] {
            assert!(l.contains(&format!("--cap-drop {cap} ")), "{cap}: {l}");
        }
        assert!(
            !l.contains("CAP_DAC_OVERRIDE") && !l.contains("CAP_CHOWN"),
            "{l}"
        );
        assert!(
            l.find("--cap-drop").unwrap() < l.find("--bind / /").unwrap(),
            "{l}"
        );
    }

    #[test]
    fn resolve_hides_what_exists_and_binds_exceptions_with_their_mode() {
        let t = std::env::temp_dir().join(format!("plugd-view-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        for d in [".plugd/pins/ab", ".plugd/state/p", ".plugins/p", "keys"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        std::fs::write(t.join("plugd.yaml"), "eager: []\n").unwrap();
        std::fs::write(t.join("master.key"), "k").unwrap();
        let t = t.canonicalize().unwrap();
        let plan = BaselinePlan {
            deny: vec![
                t.join(".plugd"),
                t.join(".plugins"),
                t.join("master.key"),
                t.join("missing"),
            ],
            allow: vec![t.join(".plugd/pins/ab")],
            writable: vec![t.join(".plugd/state/p")],
            read_only: vec![t.join("plugd.yaml"), t.join(".mcp.json")],
            require: false,
        };
        let r = resolve(&plan, &t.join(".plugd/pins/ab"));
        assert_eq!(r.hidden_dirs, vec![t.join(".plugd"), t.join(".plugins")]);
        assert_eq!(r.hidden_files, vec![t.join("master.key")]);
        assert_eq!(
            r.exceptions,
            vec![
                Exception {
                    path: t.join(".plugd/pins/ab"),
                    writable: false
                },
                Exception {
                    path: t.join(".plugd/state/p"),
                    writable: true
                },
            ]
        );
        // An absent .mcp.json is not shown (and not created).
        assert_eq!(r.read_only_files, vec![t.join("plugd.yaml")]);
        assert!(!t.join(".mcp.json").exists());
        // A working directory that contains a hidden path (an MCP server
        // started in the workspace) is no exception.
        let r = resolve(&plan, &t);
        assert!(!r.exceptions.iter().any(|e| e.path == t), "{r:?}");
        std::fs::remove_dir_all(&t).unwrap();
    }
}
