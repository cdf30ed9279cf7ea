//! A plugin's stderr: forwarded to `tracing` with the plugin id, the last
//! lines kept for crash reports.
//!
//! Lines starting with `[INFO]`, `[WARN]`/`[WARNING]`, `[ERROR]`, `[DEBUG]` or
//! `[TRACE]` are logged at that level (prefix stripped); others at `info`.
//! Lines are cut at [`MAX_LINE`] bytes, so a flood cannot exhaust memory.
//! Known secret values ([`crate::Launch::redact`]) are replaced by `••••`
//! before a line is logged or kept, so crash reports never carry them.
//!
//! Forwarding is rate limited per plugin ([`LogBudget`]): beyond the budget of
//! lines per interval, lines are still kept in the tail but not logged, and
//! one summary line per interval says how many were suppressed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use plugd_wire::{Frame, FrameDecoder, Framing};
use tokio::io::AsyncRead;
use tokio::sync::watch;
use tokio_util::codec::FramedRead;

/// Default number of stderr lines kept for diagnostics.
pub const DEFAULT_TAIL: usize = 32;

/// Longest stderr line kept; longer lines are cut with a marker.
pub const MAX_LINE: usize = 4096;

/// Default lines of one plugin's stderr logged per [`BUDGET_INTERVAL`].
pub const DEFAULT_LOG_BUDGET: u64 = 1000;

/// The interval the stderr log budget covers.
pub const BUDGET_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How many stderr lines of one plugin are logged per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBudget {
    /// Lines logged per interval; beyond them lines are counted, not logged.
    pub lines: u64,
    /// The interval.
    pub interval: std::time::Duration,
}

impl LogBudget {
    /// `PLUGD_STDERR_LOG_LINES` lines (default [`DEFAULT_LOG_BUDGET`]) per
    /// [`BUDGET_INTERVAL`], read once per process. An unparsable value is
    /// warned about and the default used.
    pub fn from_env() -> LogBudget {
        static BUDGET: std::sync::OnceLock<LogBudget> = std::sync::OnceLock::new();
        *BUDGET.get_or_init(|| {
            let lines = match std::env::var("PLUGD_STDERR_LOG_LINES") {
                Ok(v) => v.trim().parse::<u64>().unwrap_or_else(|_| {
                    tracing::warn!(
                        "PLUGD_STDERR_LOG_LINES={v:?} is not a number; using {DEFAULT_LOG_BUDGET}"
                    );
                    DEFAULT_LOG_BUDGET
                }),
                Err(_) => DEFAULT_LOG_BUDGET,
            };
            LogBudget {
                lines,
                interval: BUDGET_INTERVAL,
            }
        })
    }
}

/// The per-interval accounting of one stream.
struct Meter {
    budget: LogBudget,
    window: tokio::time::Instant,
    logged: u64,
    suppressed: u64,
    suppressed_total: Arc<std::sync::atomic::AtomicU64>,
}

impl Meter {
    /// Whether this line may be logged; counts it otherwise.
    fn admit(&mut self, plugin: &str) -> bool {
        if self.window.elapsed() >= self.budget.interval {
            self.report(plugin);
            self.window = tokio::time::Instant::now();
            self.logged = 0;
        }
        if self.logged < self.budget.lines {
            self.logged += 1;
            true
        } else {
            self.suppressed += 1;
            self.suppressed_total
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            crate::log_stats::stderr_line_suppressed();
            false
        }
    }

    /// The summary of the current window, if lines were suppressed in it.
    fn report(&mut self, plugin: &str) {
        if self.suppressed > 0 {
            tracing::warn!(
                target: "plugd::plugin",
                plugin,
                suppressed = self.suppressed,
                "suppressed {} stderr lines in the last {} s (more than {} per {} s; PLUGD_STDERR_LOG_LINES); the last ones stay in the crash report",
                self.suppressed,
                self.window.elapsed().as_secs().max(1),
                self.budget.lines,
                self.budget.interval.as_secs()
            );
            self.suppressed = 0;
        }
    }

    /// When the current window's summary is due, if one is.
    fn due(&self) -> Option<tokio::time::Instant> {
        (self.suppressed > 0).then(|| self.window + self.budget.interval)
    }
}

/// The last lines of a plugin's stderr, and whether the stream has ended.
#[derive(Debug, Clone)]
pub struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    done: watch::Receiver<bool>,
    cap: usize,
    redact: SharedRedact,
    suppressed: Arc<std::sync::atomic::AtomicU64>,
    /// The operator's log of the plugin, fed every kept line.
    ring: Option<crate::log_ring::LogRing>,
}

impl StderrTail {
    /// Lines not logged because the plugin exceeded its [`LogBudget`].
    pub fn suppressed(&self) -> u64 {
        self.suppressed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A snapshot of the kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Waits (at most `limit`) for the stream to end, so a crash report
    /// includes the last words.
    pub async fn settle(&self, limit: std::time::Duration) {
        let mut done = self.done.clone();
        let _ = tokio::time::timeout(limit, done.wait_for(|d| *d)).await;
    }

    /// The configured capacity.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Adds values to hide from now on (e.g. secrets sent in
    /// `config/changed`), and scrubs the lines already kept.
    pub fn redact_more(&self, values: &[String]) {
        let all = {
            let mut r = self.redact.write().unwrap_or_else(|p| p.into_inner());
            for v in values {
                if !v.is_empty() && !r.contains(v) {
                    r.push(v.clone());
                }
            }
            r.clone()
        };
        let mut l = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        for line in l.iter_mut() {
            *line = crate::launch::scrub(line, &all);
        }
        if let Some(ring) = &self.ring {
            ring.redact(&all);
        }
    }
}

/// Secret values to hide, shared by everything that echoes plugin text
/// (stderr tail, Salmex `log.*`) and extended when `config/changed` sends
/// new ones.
pub type SharedRedact = Arc<std::sync::RwLock<Vec<String>>>;

/// Spawns the task that drains `stderr`.
pub fn collect<R: AsyncRead + Unpin + Send + 'static>(
    plugin: Arc<str>,
    stderr: R,
    cap: usize,
) -> StderrTail {
    collect_redacted(plugin, stderr, cap, Vec::new())
}

/// Like [`collect`], replacing every value of `redact` by `••••` in each
/// line before it is logged or kept.
pub fn collect_redacted<R: AsyncRead + Unpin + Send + 'static>(
    plugin: Arc<str>,
    stderr: R,
    cap: usize,
    redact: Vec<String>,
) -> StderrTail {
    collect_shared(
        plugin,
        stderr,
        cap,
        Arc::new(std::sync::RwLock::new(redact)),
    )
}

/// Like [`collect_redacted`] with a list shared with other consumers.
pub fn collect_shared<R: AsyncRead + Unpin + Send + 'static>(
    plugin: Arc<str>,
    stderr: R,
    cap: usize,
    redact: SharedRedact,
) -> StderrTail {
    collect_budgeted(plugin, stderr, cap, redact, LogBudget::from_env())
}

/// Like [`collect_shared`], also feeding every line (cut and scrubbed) to
/// `ring`, the plugin's log that outlives this run.
pub fn collect_logged<R: AsyncRead + Unpin + Send + 'static>(
    plugin: Arc<str>,
    stderr: R,
    cap: usize,
    redact: SharedRedact,
    ring: crate::log_ring::LogRing,
) -> StderrTail {
    collect_inner(
        plugin,
        stderr,
        cap,
        redact,
        LogBudget::from_env(),
        Some(ring),
    )
}

/// Like [`collect_shared`] with an explicit [`LogBudget`].
pub fn collect_budgeted<R: AsyncRead + Unpin + Send + 'static>(
    plugin: Arc<str>,
    stderr: R,
    cap: usize,
    redact: SharedRedact,
    budget: LogBudget,
) -> StderrTail {
    collect_inner(plugin, stderr, cap, redact, budget, None)
}

fn collect_inner<R: AsyncRead + Unpin + Send + 'static>(
    plugin: Arc<str>,
    stderr: R,
    cap: usize,
    redact: SharedRedact,
    budget: LogBudget,
    ring: Option<crate::log_ring::LogRing>,
) -> StderrTail {
    let lines = Arc::new(Mutex::new(VecDeque::with_capacity(cap)));
    let (done_tx, done) = watch::channel(false);
    let suppressed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tail = StderrTail {
        lines: lines.clone(),
        done,
        cap,
        redact: redact.clone(),
        suppressed: suppressed.clone(),
        ring: ring.clone(),
    };
    tokio::spawn(async move {
        let mut frames = FramedRead::new(stderr, FrameDecoder::new(Framing::Lines, MAX_LINE));
        let mut meter = Meter {
            budget,
            window: tokio::time::Instant::now(),
            logged: 0,
            suppressed: 0,
            suppressed_total: suppressed,
        };
        loop {
            // A summary is due even when the plugin falls silent.
            let frame = match meter.due() {
                Some(at) => tokio::select! {
                    f = frames.next() => f,
                    () = tokio::time::sleep_until(at) => {
                        meter.report(&plugin);
                        meter.window = tokio::time::Instant::now();
                        meter.logged = 0;
                        continue;
                    }
                },
                None => frames.next().await,
            };
            let Some(frame) = frame else { break };
            let line = match frame {
                Ok(Frame::Data(b)) => String::from_utf8_lossy(&b).into_owned(),
                Ok(Frame::Oversized { len, prefix }) => {
                    format!(
                        "{}… [line of {len} bytes cut]",
                        String::from_utf8_lossy(&prefix)
                    )
                }
                Err(_) => break,
            };
            let line = {
                let r = redact.read().unwrap_or_else(|p| p.into_inner());
                if r.is_empty() && !line.contains("vai_dlg_") {
                    line
                } else {
                    crate::launch::scrub(&line, &r)
                }
            };
            if meter.admit(&plugin) {
                emit(&plugin, &line);
            }
            if let Some(ring) = &ring {
                ring.push(&line);
            }
            if cap > 0 {
                let mut l = lines.lock().unwrap_or_else(|p| p.into_inner());
                if l.len() == cap {
                    l.pop_front();
                }
                l.push_back(line);
            }
        }
        meter.report(&plugin);
        let _ = done_tx.send(true);
    });
    tail
}

fn emit(plugin: &str, line: &str) {
    let (level, text) = split_level(line);
    match level {
        tracing::Level::ERROR => tracing::error!(target: "plugd::plugin", plugin, "{text}"),
        tracing::Level::WARN => tracing::warn!(target: "plugd::plugin", plugin, "{text}"),
        tracing::Level::DEBUG => tracing::debug!(target: "plugd::plugin", plugin, "{text}"),
        tracing::Level::TRACE => tracing::trace!(target: "plugd::plugin", plugin, "{text}"),
        _ => tracing::info!(target: "plugd::plugin", plugin, "{text}"),
    }
}

/// Maps a `[LEVEL]` prefix to a tracing level and strips it.
pub fn split_level(line: &str) -> (tracing::Level, &str) {
    for (prefix, level) in [
        ("[ERROR]", tracing::Level::ERROR),
        ("[WARN]", tracing::Level::WARN),
        ("[WARNING]", tracing::Level::WARN),
        ("[INFO]", tracing::Level::INFO),
        ("[DEBUG]", tracing::Level::DEBUG),
        ("[TRACE]", tracing::Level::TRACE),
    ] {
        if let Some(rest) = line.strip_prefix(prefix) {
            return (level, rest.trim_start());
        }
    }
    (tracing::Level::INFO, line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn levels() {
        assert_eq!(
            split_level("[WARN] disk low"),
            (tracing::Level::WARN, "disk low")
        );
        assert_eq!(split_level("[ERROR]x"), (tracing::Level::ERROR, "x"));
        assert_eq!(split_level("plain"), (tracing::Level::INFO, "plain"));
    }

    #[tokio::test]
    async fn keeps_the_last_lines_and_cuts_long_ones() {
        let (mut w, r) = tokio::io::duplex(1 << 16);
        let tail = collect("p".into(), r, 3);
        for i in 0..10 {
            w.write_all(format!("[INFO] line {i}\n").as_bytes())
                .await
                .unwrap();
        }
        w.write_all(&vec![b'x'; MAX_LINE * 3]).await.unwrap();
        w.write_all(b"\n").await.unwrap();
        drop(w);
        tail.settle(std::time::Duration::from_secs(5)).await;
        let lines = tail.lines();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "[INFO] line 8");
        assert!(
            lines[2].ends_with("[line of 12288 bytes cut]"),
            "{}",
            lines[2]
        );
        assert!(lines[2].len() < 400);
    }

    #[tokio::test]
    async fn lines_beyond_the_budget_are_counted_and_still_kept() {
        let (mut w, r) = tokio::io::duplex(1 << 16);
        let budget = LogBudget {
            lines: 5,
            interval: std::time::Duration::from_secs(3600),
        };
        let tail = collect_budgeted("p".into(), r, 4, SharedRedact::default(), budget);
        for i in 0..100 {
            w.write_all(format!("line {i}\n").as_bytes()).await.unwrap();
        }
        drop(w);
        tail.settle(std::time::Duration::from_secs(5)).await;
        assert_eq!(tail.suppressed(), 95);
        assert_eq!(
            tail.lines(),
            vec!["line 96", "line 97", "line 98", "line 99"],
            "the crash tail keeps suppressed lines"
        );
    }

    #[tokio::test]
    async fn secrets_are_scrubbed_before_they_are_kept() {
        let (mut w, r) = tokio::io::duplex(1 << 16);
        let tail = collect_redacted("p".into(), r, 8, vec!["hunter2".to_owned()]);
        w.write_all(b"token=hunter2 failed\n").await.unwrap();
        w.flush().await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while tail.lines().is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        tail.redact_more(&["failed".to_owned()]);
        w.write_all(b"new failed secret\n").await.unwrap();
        drop(w);
        tail.settle(std::time::Duration::from_secs(5)).await;
        assert_eq!(tail.lines(), vec!["token=•••• ••••", "new •••• secret"]);
    }
}
