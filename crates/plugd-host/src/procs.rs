//! No plugin process outlives plugd: plugd as child subreaper, the tracking
//! of every plugin's descendants (also those that left its process group
//! with `setsid`), records of started process groups under
//! `<workspace>/.plugd/procs/`, and the clean-up a later plugd does after a
//! `kill -9` of the previous one.
//!
//! With a writable cgroup v2 hierarchy every plugin start also runs in its
//! own cgroup ([`crate::cgroup`]), which is exact: a stop kills the whole
//! cgroup, and a later plugd kills the cgroups of a plugd that is gone. The
//! `/proc` tracking below runs in every case as the backstop (and is all
//! there is without cgroup v2, or with `PLUGD_CGROUP=off`):
//!
//! * [`init_daemon`] makes plugd a child subreaper (`PR_SET_CHILD_SUBREAPER`),
//!   so orphaned grandchildren come back to plugd instead of PID 1, turns
//!   `PR_SET_DUMPABLE` off (its `/proc/<pid>/environ`, `mem` and `fd/` are
//!   then root-only), and starts a tracker thread that every
//!   [`TICK`] scans `/proc` once: it records each live plugin leader's
//!   descendants (pid and start time) and reaps orphaned zombies that are not
//!   a leader some [`crate::spawn::Reaper`] waits for.
//! * Each started leader gets a record file `.plugd/procs/<pid>.<start>`:
//!   the owning plugd (pid and start time), the plugin id, then one
//!   `proc PID START` line per process (the leader first). It is removed when
//!   the leader is reaped.
//! * When a plugin stops, its group is killed and so is every tracked
//!   descendant whose start time still matches.
//! * [`cleanup_stale`] (run when a runtime opens) reads records whose owner
//!   is gone and kills what they name: the leader's group (members started
//!   no earlier than the leader, and only if the leader's PID is not now
//!   another process) and each tracked process whose start time matches.
//!   A start time that does not match means a recycled PID: never killed.
//!
//! Not covered: a descendant that exits its group and whose parent dies
//! within one tick is attributed to no plugin while plugd runs (it is
//! reaped by plugd and killed when plugd's own children are, not when its
//! plugin stops); a process that double-forks away between two ticks right
//! before a `kill -9` of plugd is not in any record.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How often the tracker scans `/proc`.
pub const TICK: Duration = Duration::from_millis(500);

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Process id.
    pub pid: i32,
    /// Parent process id.
    pub ppid: i32,
    /// Process group id.
    pub pgrp: i32,
    /// State letter (`Z` for a zombie).
    pub state: char,
    /// Start time in clock ticks after boot (field 22).
    pub start: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when the process does not exist.
pub fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

fn parse_stat(pid: i32, text: &str) -> Option<Stat> {
    // The command name is in parentheses and may contain anything.
    let rest = text.get(text.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): state=0 ppid=1 pgrp=2 ... starttime=19.
    Some(Stat {
        pid,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// Every process visible in `/proc`.
pub fn all() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

/// `true` when `pid` runs and started at `start` (so it is the same process).
pub fn is_same(pid: i32, start: u64) -> bool {
    stat(pid).is_some_and(|s| s.start == start && s.state != 'Z')
}

/// This process's pid and start time.
pub fn me() -> (i32, u64) {
    static ME: OnceLock<(i32, u64)> = OnceLock::new();
    *ME.get_or_init(|| {
        let pid = std::process::id() as i32;
        (pid, stat(pid).map_or(0, |s| s.start))
    })
}

/// A leader spawned by [`crate::spawn::spawn`] and what was seen below it.
#[derive(Debug)]
pub struct Tracked {
    plugin: String,
    leader: i32,
    leader_start: u64,
    seen: Mutex<HashSet<(i32, u64)>>,
    record: Option<PathBuf>,
    cgroup: Option<crate::cgroup::PluginCgroup>,
}

impl Tracked {
    fn note(&self, found: &[(i32, u64)]) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<(i32, u64)> = found.iter().filter(|p| seen.insert(**p)).copied().collect();
        drop(seen);
        if let (false, Some(path)) = (new.is_empty(), &self.record)
            && let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path)
        {
            let lines: String = new.iter().map(|(p, s)| format!("proc {p} {s}\n")).collect();
            let _ = f.write_all(lines.as_bytes());
        }
    }

    /// The cgroup the leader runs in, when it was moved into one.
    pub fn cgroup(&self) -> Option<&Path> {
        self.cgroup.as_ref().map(|c| c.dir())
    }

    /// Kills every descendant seen so far that still is the same process,
    /// after one last look below the leader; with a cgroup, everything in it.
    pub fn kill_descendants(&self) {
        if let Some(c) = &self.cgroup {
            c.kill();
        }
        self.note(&descendants_by_children_files(self.leader));
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for &(pid, start) in seen.iter() {
            if pid != self.leader && is_same(pid, start) {
                // SAFETY: plain kill(2) on a pid whose start time was just checked.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }

    /// Forgets the leader (it was reaped) and removes its record and its
    /// cgroup (after killing what is left in it).
    pub fn finish(&self) {
        if let Some(c) = &self.cgroup {
            c.remove();
        }
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.leader);
        if let Some(r) = &self.record {
            let _ = std::fs::remove_file(r);
        }
    }
}

fn registry() -> &'static Mutex<HashMap<i32, Arc<Tracked>>> {
    static R: OnceLock<Mutex<HashMap<i32, Arc<Tracked>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The lock [`crate::spawn::spawn`] holds from fork until the leader is
/// registered, so the orphan reaper never reaps a leader before it is known.
pub fn spawn_lock() -> std::sync::MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers a freshly spawned leader; with `records`, writes its record
/// file there (errors only logged: tracking is best effort). `cgroup` is the
/// leader's own cgroup, if it entered one before `exec`.
pub fn register(
    leader: i32,
    plugin: &str,
    records: Option<&Path>,
    cgroup: Option<crate::cgroup::PluginCgroup>,
) -> Arc<Tracked> {
    let leader_start = stat(leader).map_or(0, |s| s.start);
    let record = records.and_then(|dir| {
        let path = dir.join(format!("{leader}.{leader_start}"));
        let (pid, start) = me();
        let mut text =
            format!("owner {pid} {start}\nplugin {plugin:?}\nproc {leader} {leader_start}\n");
        if let Some(c) = &cgroup {
            text.push_str(&format!("cgroup {}\n", c.dir().display()));
        }
        match std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, text)) {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(plugin, "cannot record the process group in {}: {e}; a plugd killed with -9 may leave its processes behind", dir.display());
                None
            }
        }
    });
    let t = Arc::new(Tracked {
        plugin: plugin.to_owned(),
        leader,
        leader_start,
        seen: Mutex::new(HashSet::from([(leader, leader_start)])),
        record,
        cgroup,
    });
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(leader, t.clone());
    t
}

/// The descendants of `root` (pid and start time), by parent links.
fn descendants(procs: &[Stat], root: i32) -> Vec<(i32, u64)> {
    let mut children: HashMap<i32, Vec<&Stat>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for c in children.get(&p).into_iter().flatten() {
            if c.pid != root && out.len() < 100_000 {
                out.push((c.pid, c.start));
                stack.push(c.pid);
            }
        }
    }
    out
}

/// The descendants of `root` through `/proc/<pid>/task/<tid>/children`
/// (no full `/proc` scan, so stopping a plugin stays cheap with many).
fn descendants_by_children_files(root: i32) -> Vec<(i32, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in text
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if let Some(st) = stat(c)
                    && out.len() < 100_000
                {
                    out.push((c, st.start));
                    stack.push(c);
                }
            }
        }
    }
    out
}

/// A process found to belong to a plugin (see [`plugin_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginProcess {
    /// The plugin's id, when plugd can tell it (a plugin cgroup's name
    /// gives its sanitized id; an orphan this plugd never saw gives none).
    pub plugin: Option<String>,
    /// How it was recognised, for logs and messages.
    pub how: String,
}

/// Why [`plugin_of`] could not decide (the caller fails closed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// No pid, or one not visible in this PID namespace.
    #[error("the peer has no pid visible to plugd (pid {0})")]
    NoPid(i32),
    /// `/proc/<pid>/...` of the process or one of its ancestors was unreadable.
    #[error("cannot read /proc/{pid}/{file}: {source}")]
    Proc {
        /// The process.
        pid: i32,
        /// The file.
        file: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Most parent links [`plugin_of`] follows (a cycle or a deep chain stops
/// there, undecided: an error).
const MAX_ANCESTORS: usize = 4096;

/// Whether process `pid` is a plugin process or a descendant of one, for
/// refusing it plugd's own API (the socket's peer check):
///
/// 1. in a plugin cgroup ([`crate::cgroup::plugin_cgroup_of`]: below a
///    `plugd-<pid>-<start>` cgroup of this or any plugd), exact;
/// 2. else by ancestry through `/proc/<pid>/stat`: it or an ancestor is a
///    leader this process spawned or a descendant the tracker recorded
///    (pid and start time), or this process is an ancestor (plugd is a
///    child subreaper, so a plugin's orphans are re-parented to it; plugd
///    starts no process of its own that would use its API).
///
/// This process itself is not a plugin. An unreadable `/proc` entry is an
/// error, never a "no". Not recognised: a process started outside plugd's
/// tree and cgroup (through another daemon, `at`, `systemd-run`), which is
/// why plugins also run in a view without plugd's socket.
pub fn plugin_of(pid: i32) -> Result<Option<PluginProcess>, LookupError> {
    if pid <= 0 {
        return Err(LookupError::NoPid(pid));
    }
    let (me, _) = me();
    if pid == me {
        return Ok(None);
    }
    let proc_err = |pid, file| move |source| LookupError::Proc { pid, file, source };
    if let Some((path, name)) =
        crate::cgroup::plugin_cgroup_of(pid).map_err(proc_err(pid, "cgroup"))?
    {
        let known = registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|t| {
                t.cgroup()
                    .is_some_and(|d| d.ends_with(path.trim_start_matches('/')))
            })
            .map(|t| t.plugin.clone());
        let plugin = known.unwrap_or_else(|| crate::cgroup::plugin_of_name(&name).to_owned());
        return Ok(Some(PluginProcess {
            plugin: Some(plugin),
            how: format!("in the plugin cgroup {path}"),
        }));
    }
    let leaders: Vec<Arc<Tracked>> = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    let mut cur = pid;
    for _ in 0..MAX_ANCESTORS {
        let text =
            std::fs::read_to_string(format!("/proc/{cur}/stat")).map_err(proc_err(cur, "stat"))?;
        let st = parse_stat(cur, &text).ok_or_else(|| LookupError::Proc {
            pid: cur,
            file: "stat",
            source: std::io::Error::other("unparseable"),
        })?;
        let owner = leaders.iter().find(|t| {
            (t.leader == cur && t.leader_start == st.start)
                || t.seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&(cur, st.start))
        });
        if let Some(t) = owner {
            let how = if cur != pid {
                format!("a descendant of its process {cur}")
            } else if t.leader == pid {
                "the process plugd started for it".to_owned()
            } else {
                "a descendant plugd's process tracker recorded".to_owned()
            };
            return Ok(Some(PluginProcess {
                plugin: Some(t.plugin.clone()),
                how,
            }));
        }
        if st.ppid == me {
            return Ok(Some(PluginProcess {
                plugin: None,
                how: format!("a descendant of plugd (pid {me}) through process {cur}"),
            }));
        }
        if st.ppid <= 1 {
            return Ok(None);
        }
        cur = st.ppid;
    }
    Err(LookupError::Proc {
        pid,
        file: "stat",
        source: std::io::Error::other(format!(
            "more than {MAX_ANCESTORS} ancestors; cannot decide"
        )),
    })
}

/// One tracker pass: note every registered leader's descendants; reap
/// zombies among plugd's children that no spawn handle waits for.
pub fn tick() {
    let procs = all();
    let leaders: Vec<Arc<Tracked>> = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    for t in &leaders {
        // The leader itself is alive (or a zombie whose children were
        // already reparented): its subtree, plus its group.
        let mut found = descendants(&procs, t.leader);
        found.extend(
            procs
                .iter()
                .filter(|p| p.pgrp == t.leader && p.start >= t.leader_start)
                .map(|p| (p.pid, p.start)),
        );
        t.note(&found);
    }
    let (me, _) = me();
    let zombies: Vec<i32> = procs
        .iter()
        .filter(|p| p.ppid == me && p.state == 'Z')
        .map(|p| p.pid)
        .collect();
    if zombies.is_empty() {
        return;
    }
    let _spawning = spawn_lock();
    let known = registry().lock().unwrap_or_else(|p| p.into_inner());
    for z in zombies {
        if !known.contains_key(&z) {
            // SAFETY: waitpid on one of our own zombie children that no
            // Reaper owns; WNOHANG never blocks.
            unsafe { libc::waitpid(z, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

/// Makes this process (plugd serve or the CLI) the keeper of its plugins:
/// not dumpable, child subreaper, its cgroup when cgroup v2 is writable
/// ([`crate::cgroup::init`]), and the tracker thread. Errors are logged;
/// the rest still applies.
pub fn init_daemon() {
    crate::cgroup::init();
    // SAFETY: prctl with integer arguments only.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            tracing::warn!(
                "prctl(PR_SET_DUMPABLE, 0) failed: {}",
                std::io::Error::last_os_error()
            );
        }
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            tracing::warn!(
                "prctl(PR_SET_CHILD_SUBREAPER) failed: {}; orphaned plugin processes go to PID 1",
                std::io::Error::last_os_error()
            );
        }
    }
    let _ = std::thread::Builder::new()
        .name("plugd-procs".into())
        .spawn(|| {
            loop {
                tick();
                std::thread::sleep(TICK);
            }
        });
}

/// At shutdown: kills and removes plugd's cgroup ([`crate::cgroup::shutdown`])
/// and every process of plugd's own that the tracker or subreaping brought
/// back to it (orphans no plugin is waiting for).
pub fn kill_orphans() {
    crate::cgroup::shutdown();
    let (me, _) = me();
    let known = registry().lock().unwrap_or_else(|p| p.into_inner());
    for p in all() {
        if p.ppid == me && p.state != 'Z' && !known.contains_key(&p.pid) {
            // SAFETY: plain kill(2) of our own child (it cannot be recycled
            // before we reap it).
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
    }
}

/// One record file, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The plugd that wrote it (pid, start time).
    pub owner: (i32, u64),
    /// The plugin.
    pub plugin: String,
    /// The leader first, then its tracked descendants.
    pub procs: Vec<(i32, u64)>,
    /// The plugin's cgroup, when it ran in one.
    pub cgroup: Option<PathBuf>,
}

fn parse_record(text: &str) -> Option<Record> {
    let mut owner = None;
    let mut plugin = String::new();
    let mut procs = Vec::new();
    let mut cgroup = None;
    for line in text.lines() {
        let mut w = line.splitn(3, ' ');
        match (w.next(), w.next(), w.next()) {
            (Some("owner"), Some(p), Some(s)) => owner = Some((p.parse().ok()?, s.parse().ok()?)),
            (Some("plugin"), Some(_), _) => {
                plugin = line["plugin ".len()..].trim_matches('"').to_owned();
            }
            (Some("proc"), Some(p), Some(s)) => {
                if let (Ok(p), Ok(s)) = (p.parse(), s.parse()) {
                    procs.push((p, s));
                }
            }
            (Some("cgroup"), Some(_), _) => {
                cgroup = Some(PathBuf::from(&line["cgroup ".len()..]));
            }
            _ => {}
        }
    }
    Some(Record {
        owner: owner?,
        plugin,
        procs,
        cgroup,
    })
}

/// What [`cleanup_stale`] did for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleaned {
    /// The plugin.
    pub plugin: String,
    /// Processes killed.
    pub killed: Vec<i32>,
}

/// Kills what plugd processes that are gone left behind (see the module
/// docs), their recorded cgroups included, and removes their records;
/// records of a live owner are kept. Then removes the empty cgroups of
/// gone plugds ([`crate::cgroup::cleanup_stale`]).
pub fn cleanup_stale(records: &Path) -> Vec<Cleaned> {
    let out = cleanup_records(records);
    crate::cgroup::cleanup_stale();
    out
}

fn cleanup_records(records: &Path) -> Vec<Cleaned> {
    let Ok(dir) = std::fs::read_dir(records) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut procs: Option<Vec<Stat>> = None;
    for entry in dir.flatten() {
        let path = entry.path();
        let Some(rec) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| parse_record(&t))
        else {
            continue;
        };
        if is_same(rec.owner.0, rec.owner.1) {
            continue;
        }
        let procs = procs.get_or_insert_with(all);
        let mut killed = Vec::new();
        if let Some(&(leader, leader_start)) = rec.procs.first() {
            // The group id is the leader's pid; if that pid is now another
            // process, the number was recycled: leave that group alone.
            let recycled = procs
                .iter()
                .any(|p| p.pid == leader && p.start != leader_start);
            for p in procs.iter() {
                let in_group = !recycled && p.pgrp == leader && p.start >= leader_start;
                let tracked = rec.procs.contains(&(p.pid, p.start));
                if (in_group || tracked) && p.state != 'Z' {
                    // SAFETY: kill(2) of a process identified by pid and
                    // start time read just now.
                    unsafe { libc::kill(p.pid, libc::SIGKILL) };
                    killed.push(p.pid);
                }
            }
        }
        if let Some(c) = &rec.cgroup {
            for pid in crate::cgroup::remove_stale(c, rec.owner) {
                if !killed.contains(&pid) {
                    killed.push(pid);
                }
            }
        }
        let _ = std::fs::remove_file(&path);
        if !killed.is_empty() {
            tracing::warn!(plugin = %rec.plugin, killed = ?killed, "killed processes a previous plugd (pid {}) left behind", rec.owner.0);
        }
        out.push(Cleaned {
            plugin: rec.plugin,
            killed,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let text =
            "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        let s = parse_stat(42, text).unwrap();
        assert_eq!((s.ppid, s.pgrp, s.state, s.start), (1, 42, 'S', 987654));
        let me = stat(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(me.start > 0);
    }

    #[test]
    fn plugin_processes_and_their_descendants_are_recognised() {
        assert!(matches!(plugin_of(0), Err(LookupError::NoPid(0))));
        assert!(
            plugin_of(i32::MAX - 7).is_err(),
            "no such process: fails closed"
        );
        assert_eq!(plugin_of(me().0).unwrap(), None, "plugd itself");
        // The test runner's parent is not below this process.
        let parent = stat(me().0).unwrap().ppid;
        assert_eq!(plugin_of(parent).unwrap(), None);
        // A "plugin" leader with a child of its own in another session.
        #[allow(clippy::disallowed_methods)] // a test's own child, killed below
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(leader.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let lpid = leader.id() as i32;
        // Not registered yet: still a child of this process.
        let found = plugin_of(grandchild).unwrap().expect("below this process");
        assert_eq!(found.plugin, None);
        assert!(found.how.contains("a descendant of plugd"), "{found:?}");
        let tracked = register(lpid, "probe-plugin", None, None);
        for pid in [lpid, grandchild] {
            let found = plugin_of(pid).unwrap().expect("a plugin's process");
            assert_eq!(found.plugin.as_deref(), Some("probe-plugin"), "{found:?}");
        }
        tracked.kill_descendants();
        let _ = leader.kill();
        let _ = leader.wait();
        tracked.finish();
    }

    #[test]
    fn records_round_trip_and_a_live_owner_is_left_alone() {
        let r = parse_record(
            "owner 10 20\nplugin \"a b\"\nproc 11 21\nproc 12 22\ncgroup /c g/plugd-10-20/a-1\n",
        )
        .unwrap();
        assert_eq!(r.cgroup, Some(PathBuf::from("/c g/plugd-10-20/a-1")));
        assert_eq!(r.owner, (10, 20));
        assert_eq!(r.plugin, "a b");
        assert_eq!(r.procs, vec![(11, 21), (12, 22)]);
        assert!(parse_record("plugin \"x\"\n").is_none());
        let dir = std::env::temp_dir().join(format!("plugd-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pid, start) = me();
        // Owned by this live process: kept, nothing killed.
        std::fs::write(
            dir.join("x"),
            format!("owner {pid} {start}\nplugin \"p\"\nproc {pid} {start}\n"),
        )
        .unwrap();
        assert!(cleanup_records(&dir).is_empty());
        assert!(dir.join("x").exists());
        // A dead owner, and a leader pid that is now this process with another
        // start time: recycled, so nothing may be killed.
        std::fs::write(
            dir.join("y"),
            format!(
                "owner 999999999 1\nplugin \"p\"\nproc {pid} {}\n",
                start + 1
            ),
        )
        .unwrap();
        let cleaned = cleanup_records(&dir);
        assert_eq!(
            cleaned,
            vec![Cleaned {
                plugin: "p".into(),
                killed: vec![]
            }]
        );
        assert!(!dir.join("y").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
