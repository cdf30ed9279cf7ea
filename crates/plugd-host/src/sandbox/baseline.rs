//! The containment baseline's Landlock fallback, and the plan both of its
//! mechanisms share: a plugin without a real sandbox runs in the view
//! ([`super::view`], a mount namespace) when bubblewrap can build one, and
//! otherwise under Landlock rules that keep it away from plugd itself (the
//! workspace's `.plugd/`, the master key file, other plugins' directories)
//! while the rest of the machine stays as visible as before.
//!
//! The fallback's limits (why the view is the default): it cannot keep a
//! plugin from writing `plugd.yaml` or `.mcp.json`, nor from connecting to
//! serve's socket (Landlock does not govern `connect()` on a Unix socket),
//! and it breaks ordinary servers, as follows.
//!
//! Landlock only *allows* hierarchies, so "everything except D" is built by
//! walking from `/` down to each denied path and allowing every sibling that
//! is not on the way ([`allowed_paths`]). Consequences, documented for
//! `plugd plugin show` and the README:
//!
//! * an entry created *after* the start beside a denied path's ancestors
//!   (for a workspace under `/tmp`: a new file in `/tmp`) is not reachable,
//!   and nothing new can be created directly in those ancestors;
//! * listing an ancestor directory itself (`ls /tmp`) is refused;
//! * a hard link or bind mount made elsewhere before the start is not
//!   recognised (symlinks are: one that resolves into or above a denied path
//!   is not allowed).
//!
//! Exceptions inside a denied path (the plugin's own run directory, its
//! state directory) are allowed whole.
//!
//! `/proc` is not walked (that would hide `/proc/self` of every process
//! started later). Landlock's ptrace restriction does NOT keep a restricted
//! process from reading `/proc/<plugd>/environ` (checked on Linux 6.18: the
//! read succeeds), so plugd makes itself non-dumpable
//! ([`crate::procs::init_daemon`]) and the baseline drops [`DROPPED_CAPS`]
//! from the plugin (bounding, effective, permitted, inheritable and ambient
//! sets): `CAP_SYS_PTRACE`, and `CAP_SYS_ADMIN` and `CAP_PERFMON`, either of
//! which still passes the `PTRACE_MODE_READ` check (measured: with only
//! `CAP_SYS_PTRACE` dropped, a root plugin still read a non-dumpable
//! process's `environ`). `ptrace_may_access` then refuses `environ`, `mem`,
//! `maps`, `fd/`, `cwd` of plugd, also for a plugin running as root. The
//! capability drop applies even when the kernel has no Landlock. Signals
//! are not scoped (a plugin may still signal plugd, as before).
//!
//! Like [`super::fallback`], the ruleset is built before the fork and only
//! applied in the child ([`Prepared::apply`]).

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, path_beneath_rules,
};
use serde::Serialize;

/// The newest Landlock ABI plugd knows; older kernels get what they support.
const ABI_WANTED: ABI = ABI::V6;

/// What the runtime asks the baseline to hide, and the exceptions inside.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BaselinePlan {
    /// Paths the plugin must not reach (absolute; missing ones are skipped).
    pub deny: Vec<PathBuf>,
    /// Paths inside a denied one that the plugin may read (its plugin
    /// directory: its pin or its `.plugins/<id>`). Spawn adds the working
    /// directory. The view binds them read-only; Landlock allows them whole.
    pub allow: Vec<PathBuf>,
    /// Paths inside a denied one that the plugin may write (its state
    /// directory), created when missing.
    pub writable: Vec<PathBuf>,
    /// Files the view shows read-only when they exist (`plugd.yaml`,
    /// `.mcp.json`); the Landlock fallback cannot protect them.
    pub read_only: Vec<PathBuf>,
    /// Refuse the start when the baseline cannot be applied (`sandbox.baseline:
    /// require` in plugd.yaml): the view cannot be built (unless the operator
    /// forced Landlock), or Landlock is not enforced; otherwise the baseline
    /// is best effort.
    pub require: bool,
}

/// The Landlock ABI version of the running kernel; 0 when Landlock is
/// missing or disabled.
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query: no attribute pointer, size 0.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

fn canonical(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok()
}

/// The canonical denied paths that exist, and the canonical exceptions that
/// lie strictly inside one of them (an exception that contains a denied path
/// would grant it, so it is dropped: the walk already shows its other parts).
pub fn resolve(plan: &BaselinePlan, cwd: Option<&Path>) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut deny: Vec<PathBuf> = plan.deny.iter().filter_map(|p| canonical(p)).collect();
    deny.sort();
    deny.dedup();
    // A denied path inside another denied path adds nothing.
    let outer: Vec<PathBuf> = deny
        .iter()
        .filter(|d| !deny.iter().any(|o| o != *d && d.starts_with(o)))
        .cloned()
        .collect();
    let mut allow: Vec<PathBuf> = plan
        .allow
        .iter()
        .chain(&plan.writable)
        .map(PathBuf::as_path)
        .chain(cwd)
        .filter_map(canonical)
        .filter(|a| {
            outer.iter().any(|d| a.starts_with(d) && a != d)
                && !deny.iter().any(|d| d.starts_with(a))
        })
        .collect();
    allow.sort();
    allow.dedup();
    (outer, allow)
}

/// Every path the baseline allows (whole hierarchies): the siblings of each
/// denied path's ancestors, from `/` down, that are neither on the way to a
/// denied path nor resolve into or above one; then the exceptions.
pub fn allowed_paths(deny: &[PathBuf], allow: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if !deny.is_empty() {
        walk(Path::new("/"), deny, &mut out);
    }
    out.extend(allow.iter().cloned());
    out
}

fn walk(dir: &Path, deny: &[PathBuf], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    names.sort();
    for p in names {
        if deny.contains(&p) {
            continue;
        }
        if deny.iter().any(|d| d.starts_with(&p)) {
            // On the way to a denied path (canonical, so a real directory).
            walk(&p, deny, out);
            continue;
        }
        match canonical(&p) {
            // A symlink (or mount alias) into or above a denied path.
            Some(c) if deny.iter().any(|d| c.starts_with(d) || d.starts_with(&c)) => {}
            // A dangling symlink grants nothing; skip it.
            None => {}
            Some(_) => out.push(p),
        }
    }
}

/// The baseline, ready to apply in the child.
#[derive(Debug)]
pub struct Prepared {
    /// `None` when the kernel has no Landlock or nothing is to be denied.
    ruleset: Option<RulesetCreated>,
}

/// Capabilities a plugin under the baseline loses (linux/capability.h):
/// `CAP_SYS_PTRACE` (19), `CAP_SYS_ADMIN` (21), `CAP_PERFMON` (38).
pub const DROPPED_CAPS: &[u32] = &[19, 21, 38];

/// The baseline without Landlock (the kernel has none): only the
/// capability drop.
pub fn prepare_without_landlock() -> Prepared {
    Prepared { ruleset: None }
}

/// Creates the missing exceptions inside a denied path (the plugin's state
/// directory), so the plugin can use them.
pub fn create_exceptions(plan: &BaselinePlan) -> Result<(), String> {
    for a in plan.allow.iter().chain(&plan.writable) {
        if !a.exists() && plan.deny.iter().any(|d| a.starts_with(d)) {
            std::fs::create_dir_all(a)
                .map_err(|e| format!("cannot create {:?}: {e}", a.display().to_string()))?;
        }
    }
    Ok(())
}

/// Builds the ruleset: all filesystem access handled, everything allowed
/// beneath [`allowed_paths`]. Missing exceptions are created first
/// ([`create_exceptions`]).
pub fn prepare(plan: &BaselinePlan, cwd: &Path) -> Result<Prepared, String> {
    create_exceptions(plan)?;
    let (deny, allow) = resolve(plan, Some(cwd));
    if deny.is_empty() {
        return Ok(Prepared { ruleset: None });
    }
    let paths = allowed_paths(&deny, &allow);
    let ll = |e: landlock::RulesetError| format!("landlock: {e}");
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI_WANTED))
        .map_err(ll)?
        .create()
        .map_err(ll)?
        .add_rules(path_beneath_rules(&paths, AccessFs::from_all(ABI_WANTED)))
        .map_err(ll)?;
    Ok(Prepared {
        ruleset: Some(created),
    })
}

/// Drops [`DROPPED_CAPS`] from every capability set of the calling thread.
/// Raw syscalls only (async-signal-safe). Failures of the bounding-set drop
/// (no `CAP_SETPCAP`: plugd is not root, and then the plugin never had the
/// capabilities) are ignored.
fn drop_capabilities() -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    // SAFETY: prctl and capget/capset with pointers to live, correctly laid
    // out structures (two 32-bit words, as version 3 expects).
    unsafe {
        for &cap in DROPPED_CAPS {
            libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_LOWER as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            );
        }
        let mut hdr = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for &cap in DROPPED_CAPS {
            let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
            data[word].effective &= !bit;
            data[word].permitted &= !bit;
            data[word].inheritable &= !bit;
        }
        if libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Prepared {
    /// Restricts the calling (child) process. Async-signal-safe: no
    /// allocation on the success path. `require`: a kernel that does not
    /// enforce the rules fails the start (`EPERM`) instead of running the
    /// plugin without its baseline.
    pub fn apply(&mut self, require: bool) -> std::io::Result<()> {
        if let Some(ruleset) = self.ruleset.take() {
            match ruleset.restrict_self() {
                Ok(status) if status.ruleset != landlock::RulesetStatus::NotEnforced => {}
                _ if require => return Err(std::io::Error::from_raw_os_error(libc::EPERM)),
                _ => {}
            }
        }
        // After Landlock (whose restrict_self may rely on CAP_SYS_ADMIN).
        drop_capabilities()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_allows_siblings_but_not_the_way_or_the_denied_path() {
        let t = tempfile_dir();
        let ws = t.join("ws");
        for d in [".plugd/state/p", ".plugins/p", ".plugins/q", "src"] {
            std::fs::create_dir_all(ws.join(d)).unwrap();
        }
        std::fs::write(ws.join("README"), "x").unwrap();
        std::os::unix::fs::symlink(ws.join(".plugd"), ws.join("alias")).unwrap();
        std::os::unix::fs::symlink(&ws, t.join("up")).unwrap();
        let plan = BaselinePlan {
            deny: vec![ws.join(".plugd"), ws.join(".plugins"), ws.join("missing")],
            allow: vec![ws.clone()],
            writable: vec![ws.join(".plugd/state/p")],
            read_only: Vec::new(),
            require: false,
        };
        let (deny, allow) = resolve(&plan, Some(&ws.join(".plugins/p")));
        assert_eq!(deny, vec![ws.join(".plugd"), ws.join(".plugins")]);
        // The workspace contains denied paths: it is not an exception.
        assert_eq!(
            allow,
            vec![ws.join(".plugd/state/p"), ws.join(".plugins/p")]
        );
        let paths = allowed_paths(&deny, &allow);
        assert!(paths.contains(&ws.join("README")), "{paths:?}");
        assert!(paths.contains(&ws.join("src")), "{paths:?}");
        assert!(paths.contains(&PathBuf::from("/usr")), "{paths:?}");
        for bad in [
            ws.clone(),
            ws.join(".plugd"),
            ws.join(".plugins"),
            ws.join(".plugins/q"),
            ws.join("alias"),
            t.join("up"),
            t.clone(),
            PathBuf::from("/"),
        ] {
            assert!(!paths.contains(&bad), "{bad:?} in {paths:?}");
        }
        std::fs::remove_dir_all(&t).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let base = std::env::temp_dir().join(format!(
            "plugd-baseline-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        base.canonicalize().unwrap()
    }
}
