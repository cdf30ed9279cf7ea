//! cgroup v2 containment of plugin processes: the exact mechanism behind
//! [`crate::procs`] when a writable cgroup2 hierarchy is available.
//!
//! * [`init`] (called by [`crate::procs::init_daemon`]) finds the cgroup2
//!   mount (`/proc/self/mountinfo`) and plugd's own cgroup (the `0::PATH`
//!   line of `/proc/self/cgroup`), and creates
//!   `<mount><own>/plugd-<pid>-<start>/`. Without cgroup2, without write
//!   access, or with `PLUGD_CGROUP=off`, it logs once and plugd keeps to the
//!   `/proc` tracking alone. A process that never called [`init`] (a
//!   library embedder, the test binaries) uses `/proc` only.
//! * Each plugin start gets its own child cgroup
//!   `plugd-<pid>-<start>/<sanitized id>-<n>` ([`PluginCgroup::create`]);
//!   the forked child writes `0` to its `cgroup.procs` before `exec`
//!   ([`PluginCgroup::enter_in_child`]), so everything it ever forks,
//!   `setsid` or not, is in it.
//! * Stopping a plugin writes `1` to `cgroup.kill` (or, before Linux 5.14,
//!   `SIGKILL`s every pid in `cgroup.procs`), waits until the cgroup is
//!   empty and removes it. [`shutdown`] does the same for the whole
//!   `plugd-<pid>-<start>` cgroup at exit.
//! * After a `kill -9` of plugd, the next plugd in the same workspace kills
//!   and removes the plugin cgroups the workspace's records under
//!   `.plugd/procs/` name ([`remove_stale`], from
//!   [`crate::procs::cleanup_stale`]), and removes the `plugd-*-*` siblings
//!   of gone plugds that are empty by then ([`cleanup_stale`]).
//!   **Architecture invariant**: a plugd never kills the processes of
//!   another workspace's plugd, even a dead one: those wait for the next
//!   plugd in their own workspace (as with the `/proc` records).
//!
//! The `/proc` tracking stays on in every case as the backstop.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a stop waits for a killed cgroup to become empty.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// The environment variable that turns cgroup tracking off (`off`).
pub const ENV_KNOB: &str = "PLUGD_CGROUP";

static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();

/// The cgroup2 mount point in a `/proc/self/mountinfo` text.
fn parse_mountinfo(text: &str) -> Option<PathBuf> {
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        // Fields: id parent major:minor root mount-point ...
        let mount = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_octal(mount)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The unified-hierarchy path (`0::PATH`) in a `/proc/self/cgroup` text.
fn parse_own(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end_matches(" (deleted)").to_owned())
}

/// The directory plugd's own cgroup is in (where `plugd-*-*` cgroups are
/// created); `None` without cgroup2 or with `PLUGD_CGROUP=off`.
pub fn base() -> Option<PathBuf> {
    if std::env::var(ENV_KNOB).is_ok_and(|v| v == "off") {
        return None;
    }
    let mount = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)?;
    let own = parse_own(&std::fs::read_to_string("/proc/self/cgroup").ok()?)?;
    let dir = mount.join(own.trim_start_matches('/'));
    dir.join("cgroup.procs").exists().then_some(dir)
}

/// Sets cgroup tracking up for this process (see the module docs); returns
/// plugd's cgroup when it is in use. Called once; later calls return the
/// first answer.
pub fn init() -> Option<&'static Path> {
    ROOT.get_or_init(|| {
        if std::env::var(ENV_KNOB).is_ok_and(|v| v == "off") {
            tracing::info!("{ENV_KNOB}=off: plugin processes are tracked through /proc only");
            return None;
        }
        let Some(base) = base() else {
            tracing::info!(
                "no cgroup v2 hierarchy found: plugin processes are tracked through /proc only"
            );
            return None;
        };
        let (pid, start) = crate::procs::me();
        let dir = base.join(format!("plugd-{pid}-{start}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                tracing::debug!("plugin processes are tracked in cgroup {}", dir.display());
                Some(dir)
            }
            Err(e) => {
                tracing::info!(
                    "cannot create cgroup {}: {e}; plugin processes are tracked through /proc only",
                    dir.display()
                );
                None
            }
        }
    })
    .as_deref()
}

/// plugd's own `plugd-<pid>-<start>` cgroup, when [`init`] set one up.
pub fn root() -> Option<&'static Path> {
    ROOT.get().and_then(|r| r.as_deref())
}

/// A plugin id as a cgroup name: `[A-Za-z0-9_.-]`, at most 64 bytes, no
/// leading dot.
fn sanitize(id: &str) -> String {
    let mut s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s
}

/// How this process tracks the processes of `plugin_id`'s starts, for
/// `plugd plugin show`: its cgroup (`<n>` counts the starts) and the
/// `/proc` backstop, or `/proc` alone and why.
pub fn describe(plugin_id: &str) -> String {
    match root() {
        Some(root) => format!(
            "cgroup v2 ({}), /proc as the backstop",
            root.join(format!("{}-<n>", sanitize(plugin_id))).display()
        ),
        None if std::env::var(ENV_KNOB).is_ok_and(|v| v == "off") => {
            format!("/proc only ({ENV_KNOB}=off)")
        }
        None => "/proc only (no writable cgroup v2 hierarchy)".to_owned(),
    }
}

/// One plugin start's cgroup.
#[derive(Debug)]
pub struct PluginCgroup {
    dir: PathBuf,
    procs: CString,
}

impl PluginCgroup {
    /// Creates `<root>/<sanitized id>-<n>`; `None` when cgroups are not in
    /// use or the directory cannot be made (logged).
    pub fn create(plugin_id: &str) -> Option<PluginCgroup> {
        static N: AtomicU64 = AtomicU64::new(1);
        let root = root()?;
        let dir = root.join(format!(
            "{}-{}",
            sanitize(plugin_id),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = std::fs::create_dir(&dir) {
            tracing::warn!(
                plugin = plugin_id,
                "cannot create cgroup {}: {e}; its processes are tracked through /proc only",
                dir.display()
            );
            return None;
        }
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()?;
        Some(PluginCgroup { dir, procs })
    }

    /// The cgroup directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of its `cgroup.procs`, for [`enter_in_child`].
    pub fn procs_path(&self) -> CString {
        self.procs.clone()
    }

    /// `true` when `pid` is in this cgroup (also as a zombie, by its
    /// `/proc/<pid>/cgroup`).
    pub fn contains(&self, pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|t| parse_own(&t))
            .is_some_and(|own| {
                let own = own.trim_start_matches('/');
                !own.is_empty() && self.dir.ends_with(own)
            })
    }

    /// Kills everything in the cgroup (without waiting).
    pub fn kill(&self) {
        kill(&self.dir);
    }

    /// Kills everything in the cgroup, waits until it is empty and removes
    /// it (errors logged).
    pub fn remove(&self) {
        remove_tree(&self.dir);
    }
}

impl Drop for PluginCgroup {
    fn drop(&mut self) {
        remove_tree(&self.dir);
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is
/// `procs`. Runs between `fork` and `exec`: only `open`, `write` and
/// `close` on a path built before the fork, nothing allocated; errors are
/// ignored (the parent checks with [`PluginCgroup::contains`]).
pub fn enter_in_child(procs: &CStr) {
    // SAFETY: raw syscalls on a NUL-terminated path that outlives the call.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            let _ = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
        }
    }
}

/// The pids in a cgroup's `cgroup.procs`.
fn pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Writes `1` to `cgroup.kill` (all processes of the subtree); without
/// it (before Linux 5.14), `SIGKILL`s every pid listed in the subtree.
fn kill(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for d in subtree(dir) {
        for pid in pids(&d) {
            // SAFETY: plain kill(2); a pid listed in the cgroup right now
            // belongs to it (a process leaves only by exiting or moving).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// `dir` and every cgroup below it, deepest first.
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        out.push(d);
    }
    out.reverse();
    out
}

/// `true` when no process is left in the subtree (`cgroup.events` says
/// `populated 0`; a missing directory counts as empty).
fn is_empty(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(t) => t.lines().any(|l| l == "populated 0"),
        Err(_) => !dir.exists(),
    }
}

/// Kills the subtree at `dir`, waits up to [`EMPTY_WAIT`] until it is
/// empty (killing again what was forked meanwhile without `cgroup.kill`)
/// and removes its directories, deepest first. `true` when `dir` is gone.
fn remove_tree(dir: &Path) -> bool {
    if !dir.exists() {
        return true;
    }
    kill(dir);
    let end = Instant::now() + EMPTY_WAIT;
    while !is_empty(dir) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
        kill(dir);
    }
    for d in subtree(dir) {
        if let Err(e) = std::fs::remove_dir(&d)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove cgroup {}: {e}", d.display());
        }
    }
    !dir.exists()
}

/// At plugd's exit: kills and removes its whole `plugd-<pid>-<start>` cgroup.
pub fn shutdown() {
    if let Some(root) = root() {
        remove_tree(root);
    }
}

/// `plugd-<pid>-<start>` parsed from a cgroup name.
fn parse_owner(name: &str) -> Option<(i32, u64)> {
    let (pid, start) = name.strip_prefix("plugd-")?.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// The plugin cgroup `pid` runs in, if any: its unified-hierarchy path
/// (from `/proc/<pid>/cgroup`) when it lies below a `plugd-<pid>-<start>`
/// cgroup (of this plugd or of any other plugd process, a CLI running a
/// plugin itself included), with the name of that child cgroup
/// (`<sanitized id>-<n>`). Plugin starts always live in such a child, and
/// a process cannot leave it without write access to another cgroup, so
/// this holds for every descendant however it forked. An error when the
/// file cannot be read (the caller fails closed).
pub fn plugin_cgroup_of(pid: i32) -> std::io::Result<Option<(String, String)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    Ok(parse_own(&text).and_then(|own| plugin_child(&own).map(|name| (own.clone(), name))))
}

/// The component after the first `plugd-<pid>-<start>` component of a
/// cgroup path, if there is one.
fn plugin_child(path: &str) -> Option<String> {
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    parts.find(|p| parse_owner(p).is_some())?;
    parts.next().map(str::to_owned)
}

/// The plugin id part of a plugin cgroup's name (`<sanitized id>-<n>`).
pub fn plugin_of_name(name: &str) -> &str {
    name.rsplit_once('-')
        .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .map_or(name, |(id, _)| id)
}

/// Kills and removes a plugin cgroup `dir` a gone plugd (`owner`)
/// recorded, then its `plugd-<pid>-<start>` parent if that is empty by
/// then; returns the pids that were still in it. Only a directory whose
/// parent is named after `owner` and lies beside plugd's own cgroup is
/// touched.
pub fn remove_stale(dir: &Path, owner: (i32, u64)) -> Vec<i32> {
    let Some(base) = base() else {
        return Vec::new();
    };
    let Some(parent) = dir.parent() else {
        return Vec::new();
    };
    let named = parent
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_owner);
    if parent.parent() != Some(base.as_path())
        || named != Some(owner)
        || dir.file_name().is_none_or(|n| n == "..")
    {
        tracing::warn!(
            "ignoring cgroup {} in a record of plugd {}: not one of its cgroups",
            dir.display(),
            owner.0
        );
        return Vec::new();
    }
    let left: Vec<i32> = subtree(dir).iter().flat_map(|d| pids(d)).collect();
    remove_tree(dir);
    if is_empty(parent) {
        remove_tree(parent);
    }
    left
}

/// Removes the `plugd-<pid>-<start>` cgroups beside plugd's own whose owner
/// (pid and start time) is gone and that are empty: what a killed plugd's
/// stopped plugins left. Populated ones are left to the next plugd in
/// their workspace ([`remove_stale`]). Returns how many were removed.
pub fn cleanup_stale() -> usize {
    let Some(base) = base() else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&base) else {
        return 0;
    };
    let me = crate::procs::me();
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(owner) = name.to_str().and_then(parse_owner) else {
            continue;
        };
        let dir = e.path();
        if owner == me || crate::procs::is_same(owner.0, owner.1) || !is_empty(&dir) {
            continue;
        }
        if remove_tree(&dir) {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_and_own_cgroup_parse() {
        let info = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                    40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n\
                    41 31 0:38 / /sys/fs/cgroup/un\\040ified rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_mountinfo(info),
            Some(PathBuf::from("/sys/fs/cgroup/un ified"))
        );
        assert_eq!(
            parse_mountinfo("31 23 0:28 / /x rw - tmpfs tmpfs rw\n"),
            None
        );
        assert_eq!(
            parse_own("1:cpu:/\n0::/user.slice/a.scope\n").as_deref(),
            Some("/user.slice/a.scope")
        );
        assert_eq!(parse_own("1:cpu:/\n"), None);
    }

    #[test]
    fn names_are_sanitized_and_owners_parse() {
        assert_eq!(sanitize("acme/tool x"), "acme_tool_x");
        assert_eq!(sanitize(".."), "_..");
        assert_eq!(sanitize(""), "_");
        assert_eq!(sanitize(&"a".repeat(100)).len(), 64);
        assert_eq!(parse_owner("plugd-12-345"), Some((12, 345)));
        assert_eq!(parse_owner("plugd-12"), None);
        assert_eq!(parse_owner("other-1-2"), None);
    }

    #[test]
    fn plugin_cgroups_are_recognised_below_any_plugd_cgroup() {
        assert_eq!(
            plugin_child("/user.slice/plugd-12-345/acme_tool-3").as_deref(),
            Some("acme_tool-3")
        );
        assert_eq!(
            plugin_child("/plugd-1-2/p-1/deeper").as_deref(),
            Some("p-1")
        );
        // plugd's own cgroup, and one merely named like it, are not a plugin's.
        assert_eq!(plugin_child("/user.slice/plugd-12-345"), None);
        assert_eq!(plugin_child("/"), None);
        assert_eq!(plugin_child("/plugd-x-2/p-1"), None);
        assert_eq!(plugin_of_name("acme_tool-3"), "acme_tool");
        assert_eq!(plugin_of_name("with-dash-12"), "with-dash");
        assert_eq!(plugin_of_name("odd"), "odd");
        // This test process runs in no plugin cgroup.
        assert_eq!(
            plugin_cgroup_of(std::process::id() as i32).ok().flatten(),
            None
        );
        assert!(plugin_cgroup_of(-5).is_err());
    }
}
