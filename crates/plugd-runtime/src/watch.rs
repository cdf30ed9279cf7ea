//! Under `plugd serve`: notices changes to plugin directories (inotify) and
//! withholds an approved plugin whose files no longer match its approval.
//!
//! Every directory of every plugin that keeps its code in its directory gets
//! an inotify watch (symlinks are never followed; directories created or
//! moved in later are watched as they appear). An event marks the plugin;
//! after a short debounce (100 ms, so an editor's write-tmp-then-rename is
//! one check) [`Runtime::recheck`] hashes the directory exactly: if it no
//! longer matches the approval the plugin is stopped, its tools leave the
//! registry and every call of them fails naming the changed, added or
//! removed files and `plugd plugin approve ID`; if it matches again (the
//! change was undone) its tools come back.
//!
//! Bounds: at most [`WatchOptions::max_dirs`] watched directories per plugin
//! (`PLUGD_WATCH_MAX_DIRS`, default 1024). A plugin with more directories,
//! or one whose watch fails because the kernel's `fs.inotify.max_user_watches`
//! is used up, is instead polled once a second by metadata (size, mtime,
//! ctime, inode, mode of every entry; logged once at WARN). If inotify
//! cannot be set up at all, every plugin is polled.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plugd_host::ToolDef;
use plugd_manifest::PluginSpec;
use plugd_store::digest::{DigestLimits, Stamp, plugin_stamps};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::changes::{self, Withheld};
use crate::{Runtime, read, spec_digest, write};

/// How long after the first event of a burst the plugin is checked.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The watcher's bounds.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Most directories watched per plugin before it is polled instead.
    pub max_dirs: usize,
    /// How often a polled plugin's metadata is compared.
    pub poll_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            max_dirs: 1024,
            poll_interval: Duration::from_secs(1),
        }
    }
}

impl WatchOptions {
    /// The defaults, with `PLUGD_WATCH_MAX_DIRS` (a number) if set.
    pub fn from_env() -> WatchOptions {
        let mut o = WatchOptions::default();
        if let Some(n) = std::env::var("PLUGD_WATCH_MAX_DIRS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
        {
            o.max_dirs = n;
        }
        o
    }
}

/// The running watcher; [`Watcher::shutdown`] stops it.
#[derive(Debug)]
pub struct Watcher {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Stops watching and waits for the task to end.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Runtime {
    /// Starts watching every plugin directory (see the module docs). Must be
    /// called inside a Tokio runtime.
    pub fn watch(&self, options: WatchOptions) -> Watcher {
        let (stop, stopped) = oneshot::channel();
        let rt = self.clone();
        let task = tokio::spawn(async move { run(rt, options, stopped).await });
        Watcher {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Hashes plugin `id`'s directory now and acts on the result: a plugin
    /// approved at another digest is stopped and its tools withheld (calls
    /// name the files that differ); one that matches its approval again gets
    /// its tools back. Updates what `plugin list` shows either way.
    pub async fn recheck(&self, id: &str) {
        let Some(sup) = self.inner.plugins.get(id) else {
            return;
        };
        let spec = sup.spec().clone();
        let digest = hash(&spec).await;
        self.set_digest(id, digest.clone());
        let approval = match self.inner.state.approval(id).await {
            Ok(Some(a)) => a,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(plugin = id, error = %e, "cannot read the approval to check a change");
                return;
            }
        };
        if digest.as_ref().is_ok_and(|d| *d == approval.digest) {
            if self.inner.withheld.remove(id) {
                self.restore_tools(id, &approval.catalog);
                // Stopped when it was withheld: re-armed (an eager plugin starts).
                sup.reset().await;
                tracing::info!(
                    plugin = id,
                    "files match the approval again; its tools are back"
                );
            }
            return;
        }
        let state_dir = self.inner.dir.join(".plugd");
        let files = {
            let spec = spec.clone();
            let approved = approval.digest.clone();
            tokio::task::spawn_blocking(move || changes::describe(&spec, &approved, &state_dir))
                .await
                .unwrap_or_else(|e| format!("the change could not be described: {e}"))
        };
        let mut tools: Vec<String> = read(&self.inner.registry)
            .plugin_tools(id)
            .iter()
            .map(|t| t.name.clone())
            .collect();
        if tools.is_empty() {
            tools = changes::catalog_names(&approval);
        }
        let already = self.inner.withheld.get(id).is_some();
        self.inner.withheld.insert(
            id,
            Withheld {
                tools,
                files: files.clone(),
            },
        );
        write(&self.inner.registry).remove_plugin(id);
        if !already {
            tracing::warn!(
                plugin = id,
                "files changed since approval ({files}); stopped, its tools are withheld until `plugd plugin approve {id}`"
            );
        }
        sup.stop().await;
        // An approval that landed while this ran covers the files as they
        // are: undo the withholding instead of stopping a fresh approval.
        if let (Ok(Some(now)), Ok(d)) = (self.inner.state.approval(id).await, &digest)
            && now.digest == *d
            && now.approved_at != approval.approved_at
        {
            self.inner.withheld.remove(id);
            self.restore_tools(id, &now.catalog);
            sup.reset().await;
        }
    }

    fn restore_tools(&self, id: &str, catalog: &serde_json::Value) {
        let tools: Vec<ToolDef> = serde_json::from_value(catalog.clone()).unwrap_or_default();
        write(&self.inner.registry).set_plugin_tools(id, &tools);
    }
}

async fn hash(spec: &Arc<PluginSpec>) -> Result<String, String> {
    let spec = spec.clone();
    tokio::task::spawn_blocking(move || spec_digest(&spec))
        .await
        .unwrap_or_else(|e| Err(format!("the digest task failed: {e}")))
}

/// The inotify side: watch descriptors and what they watch.
struct Inotify {
    fd: AsyncFd<OwnedFd>,
    /// Watch descriptor → (plugin id, directory).
    wds: HashMap<i32, (String, PathBuf)>,
    /// Watches per plugin.
    count: HashMap<String, usize>,
}

fn watch_flags() -> WatchFlags {
    WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

/// Why a plugin is polled instead of watched.
enum Fallback {
    TooManyDirs,
    KernelLimit(rustix::io::Errno),
}

impl Inotify {
    fn new() -> std::io::Result<Inotify> {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
        // SAFETY: `fd` is an `OwnedFd` moved into the `AsyncFd`, which keeps
        // it open and unchanged until the `AsyncFd` is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Inotify {
            fd,
            wds: HashMap::new(),
            count: HashMap::new(),
        })
    }

    /// Watches `dir` and every directory below it (symlinks not followed,
    /// except `dir` itself when `follow_root`), up to `max` watches for `plugin`.
    fn add_tree(
        &mut self,
        plugin: &str,
        dir: &Path,
        max: usize,
        follow_root: bool,
    ) -> Result<(), Fallback> {
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            if self.count.get(plugin).copied().unwrap_or(0) >= max {
                return Err(Fallback::TooManyDirs);
            }
            let mut flags = watch_flags();
            // The plugin root may be reached through a symlink; nothing below it is.
            if !(follow_root && d == dir) {
                flags |= WatchFlags::DONT_FOLLOW;
            }
            match inotify::add_watch(self.fd.get_ref(), &d, flags) {
                Ok(wd) => {
                    if self
                        .wds
                        .insert(wd, (plugin.to_owned(), d.clone()))
                        .is_none()
                    {
                        *self.count.entry(plugin.to_owned()).or_default() += 1;
                    }
                }
                Err(e) if e == rustix::io::Errno::NOSPC || e == rustix::io::Errno::NOMEM => {
                    return Err(Fallback::KernelLimit(e));
                }
                // Gone or not a directory any more: the check that follows
                // the event sees it.
                Err(_) => continue,
            }
            if let Ok(entries) = std::fs::read_dir(&d) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(entry.path());
                    }
                }
            }
        }
        Ok(())
    }

    /// Drops every watch of `plugin`.
    fn remove_plugin(&mut self, plugin: &str) {
        let wds: Vec<i32> = self
            .wds
            .iter()
            .filter(|(_, (p, _))| p == plugin)
            .map(|(wd, _)| *wd)
            .collect();
        for wd in wds {
            let _ = inotify::remove_watch(self.fd.get_ref(), wd);
            self.wds.remove(&wd);
        }
        self.count.remove(plugin);
    }

    /// Reads every queued event.
    fn drain(&self) -> std::io::Result<Vec<(i32, ReadFlags, Option<OsString>)>> {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = inotify::Reader::new(self.fd.get_ref(), &mut buf);
        let mut out = Vec::new();
        loop {
            match reader.next() {
                Ok(ev) => out.push((
                    ev.wd(),
                    ev.events(),
                    ev.file_name()
                        .map(|n| std::ffi::OsStr::from_bytes(n.to_bytes()).to_owned()),
                )),
                Err(rustix::io::Errno::AGAIN) => return Ok(out),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

struct Polled {
    dir: PathBuf,
    last: Option<Vec<(String, Stamp)>>,
}

async fn stamps(dir: &Path) -> Option<Vec<(String, Stamp)>> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || plugin_stamps(&dir, &DigestLimits::default()).ok())
        .await
        .ok()
        .flatten()
}

async fn run(rt: Runtime, options: WatchOptions, mut stopped: oneshot::Receiver<()>) {
    let specs: Vec<(String, PathBuf)> = rt
        .inner
        .plugins
        .iter()
        .filter(|(_, s)| s.spec().pin_dir)
        .map(|(id, s)| (id.clone(), s.spec().dir.clone()))
        .collect();
    let mut ino = match Inotify::new() {
        Ok(i) => Some(i),
        Err(e) => {
            tracing::warn!(error = %e, "cannot set up inotify; polling every plugin directory every {:?} instead", options.poll_interval);
            None
        }
    };
    let mut polled: BTreeMap<String, Polled> = BTreeMap::new();
    let fall_back = |polled: &mut BTreeMap<String, Polled>, id: &str, dir: &Path, why: Fallback| {
        let why = match why {
            Fallback::TooManyDirs => format!(
                "it has more than {} directories (PLUGD_WATCH_MAX_DIRS)",
                options.max_dirs
            ),
            Fallback::KernelLimit(e) => format!(
                "the kernel refused another inotify watch ({e}; raise fs.inotify.max_user_watches)"
            ),
        };
        tracing::warn!(
            plugin = id,
            "not watching {} with inotify because {why}; polling it every {:?} instead",
            dir.display(),
            options.poll_interval
        );
        polled.insert(
            id.to_owned(),
            Polled {
                dir: dir.to_owned(),
                last: None,
            },
        );
    };
    for (id, dir) in &specs {
        match ino.as_mut() {
            Some(i) => {
                if let Err(why) = i.add_tree(id, dir, options.max_dirs, true) {
                    i.remove_plugin(id);
                    fall_back(&mut polled, id, dir, why);
                }
            }
            None => {
                polled.insert(
                    id.clone(),
                    Polled {
                        dir: dir.clone(),
                        last: None,
                    },
                );
            }
        }
    }
    for p in polled.values_mut() {
        p.last = stamps(&p.dir).await;
    }
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut due: Option<Instant> = None;
    let mut tick = tokio::time::interval(options.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let debounce = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let readable = async {
            match ino.as_ref() {
                Some(i) => i.fd.readable().await.map(|mut g| g.clear_ready()),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stopped => break,
            r = readable => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "inotify failed; polling every plugin directory instead");
                    ino = None;
                    for (id, dir) in &specs {
                        polled.entry(id.clone()).or_insert_with(|| Polled { dir: dir.clone(), last: None });
                    }
                    pending.extend(specs.iter().map(|(id, _)| id.clone()));
                } else if let Some(i) = ino.as_mut() {
                    let events = match i.drain() {
                        Ok(events) => events,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read inotify events; checking every plugin");
                            pending.extend(specs.iter().map(|(id, _)| id.clone()));
                            Vec::new()
                        }
                    };
                    for (wd, flags, name) in events {
                        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                            tracing::warn!("inotify queue overflowed; checking every plugin");
                            pending.extend(specs.iter().map(|(id, _)| id.clone()));
                            continue;
                        }
                        let Some((id, dir)) = i.wds.get(&wd).cloned() else { continue };
                        if flags.contains(ReadFlags::IGNORED) {
                            i.wds.remove(&wd);
                            if let Some(c) = i.count.get_mut(&id) {
                                *c = c.saturating_sub(1);
                            }
                        }
                        if flags.contains(ReadFlags::ISDIR)
                            && flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
                            && let Some(name) = name
                            && !polled.contains_key(&id)
                            && let Err(why) = i.add_tree(&id, &dir.join(name), options.max_dirs, false)
                        {
                            i.remove_plugin(&id);
                            let root = specs.iter().find(|(p, _)| *p == id).map(|(_, d)| d.clone()).unwrap_or(dir);
                            fall_back(&mut polled, &id, &root, why);
                        }
                        pending.insert(id);
                    }
                }
                if !pending.is_empty() && due.is_none() {
                    due = Some(Instant::now() + DEBOUNCE);
                }
            }
            _ = debounce => {
                due = None;
                for id in std::mem::take(&mut pending) {
                    rt.recheck(&id).await;
                }
            }
            _ = tick.tick(), if !polled.is_empty() => {
                for (id, p) in polled.iter_mut() {
                    let now = stamps(&p.dir).await;
                    if now != p.last {
                        p.last = now;
                        pending.insert(id.clone());
                    }
                }
                if !pending.is_empty() && due.is_none() {
                    due = Some(Instant::now() + DEBOUNCE);
                }
            }
        }
    }
}
