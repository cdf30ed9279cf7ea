//! A plugin's recent stderr for operators (`GET /v1/plugins/{id}/logs`): a
//! bounded ring of timestamped lines that outlives each run of the plugin,
//! and a broadcast channel for followers.
//!
//! The ring is owned by the plugin's [`crate::Supervised`], so after a crash
//! it still holds the previous run's last lines. Lines reach it already cut
//! at [`crate::stderr::MAX_LINE`] bytes and scrubbed of known secrets (the
//! same text the crash report tail keeps); [`LogRing::redact`] scrubs the
//! kept lines again when new secrets become known.
//!
//! Bounds: at most [`RING_LINES`] lines and [`RING_BYTES`] bytes of text per
//! plugin; older lines are dropped (and counted). Followers get a
//! [`tokio::sync::broadcast`] receiver of [`FOLLOW_QUEUE`] lines: one that
//! falls behind skips lines (it is told how many), it never holds the
//! plugin's stderr back or grows without bound.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

/// Most lines kept per plugin.
pub const RING_LINES: usize = 1000;

/// Most bytes of line text kept per plugin.
pub const RING_BYTES: usize = 512 * 1024;

/// Lines a follower may lag behind before it skips some.
pub const FOLLOW_QUEUE: usize = 256;

/// One stderr line and when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The line (cut, secrets masked).
    pub line: Arc<str>,
}

#[derive(Debug, Default)]
struct Ring {
    lines: VecDeque<LogLine>,
    bytes: usize,
    dropped: u64,
}

/// The ring and its followers. Cheap to clone; every clone is the same ring.
#[derive(Debug, Clone)]
pub struct LogRing {
    ring: Arc<Mutex<Ring>>,
    follow: broadcast::Sender<LogLine>,
}

impl Default for LogRing {
    fn default() -> Self {
        LogRing {
            ring: Arc::default(),
            follow: broadcast::channel(FOLLOW_QUEUE).0,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl LogRing {
    /// Keeps `line` (dropping the oldest beyond the bounds) and hands it to
    /// the followers.
    pub fn push(&self, line: &str) {
        let entry = LogLine {
            at_ms: now_ms(),
            line: Arc::from(line),
        };
        {
            let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            r.bytes += entry.line.len();
            r.lines.push_back(entry.clone());
            while r.lines.len() > RING_LINES || (r.bytes > RING_BYTES && r.lines.len() > 1) {
                if let Some(old) = r.lines.pop_front() {
                    r.bytes -= old.line.len();
                    r.dropped += 1;
                }
            }
        }
        // No follower is not an error.
        let _ = self.follow.send(entry);
    }

    /// The last `limit` lines, oldest first, and how many lines the ring has
    /// dropped since it was made.
    pub fn tail(&self, limit: usize) -> (Vec<LogLine>, u64) {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let skip = r.lines.len().saturating_sub(limit);
        (r.lines.iter().skip(skip).cloned().collect(), r.dropped)
    }

    /// The tail and a receiver of every later line, taken together so no
    /// line falls between them.
    pub fn follow(&self, limit: usize) -> (Vec<LogLine>, broadcast::Receiver<LogLine>) {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let rx = self.follow.subscribe();
        let skip = r.lines.len().saturating_sub(limit);
        (r.lines.iter().skip(skip).cloned().collect(), rx)
    }

    /// Replaces every value of `values` in the kept lines by `••••` (new
    /// secrets became known).
    pub fn redact(&self, values: &[String]) {
        if values.iter().all(String::is_empty) {
            return;
        }
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut bytes = 0;
        for l in &mut r.lines {
            let scrubbed = crate::launch::scrub(&l.line, values);
            if *scrubbed != *l.line {
                l.line = Arc::from(scrubbed);
            }
            bytes += l.line.len();
        }
        r.bytes = bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_lines_within_both_bounds() {
        let ring = LogRing::default();
        for i in 0..(RING_LINES + 10) {
            ring.push(&format!("line {i}"));
        }
        let (lines, dropped) = ring.tail(usize::MAX);
        assert_eq!(lines.len(), RING_LINES);
        assert_eq!(dropped, 10);
        assert_eq!(&*lines[0].line, "line 10");
        let (last, _) = ring.tail(2);
        assert_eq!(
            last.iter().map(|l| &*l.line).collect::<Vec<_>>(),
            ["line 1008", "line 1009"]
        );
        let big = "x".repeat(4096);
        for _ in 0..RING_LINES {
            ring.push(&big);
        }
        let (lines, _) = ring.tail(usize::MAX);
        let bytes: usize = lines.iter().map(|l| l.line.len()).sum();
        assert!(bytes <= RING_BYTES, "{bytes}");
        assert_eq!(lines.len(), RING_BYTES / 4096);
    }

    #[tokio::test]
    async fn followers_get_new_lines_and_lag_instead_of_growing() {
        let ring = LogRing::default();
        ring.push("before");
        let (tail, mut rx) = ring.follow(10);
        assert_eq!(tail.len(), 1);
        ring.push("after");
        assert_eq!(&*rx.recv().await.unwrap().line, "after");
        for i in 0..(FOLLOW_QUEUE * 4) {
            ring.push(&format!("{i}"));
        }
        match rx.recv().await {
            Err(broadcast::error::RecvError::Lagged(n)) => {
                assert_eq!(n as usize, FOLLOW_QUEUE * 3)
            }
            other => panic!("expected a lag, got {other:?}"),
        }
    }

    #[test]
    fn redact_scrubs_kept_lines() {
        let ring = LogRing::default();
        ring.push("key=hunter2");
        ring.redact(&["hunter2".to_owned()]);
        assert_eq!(&*ring.tail(1).0[0].line, "key=••••");
    }
}
