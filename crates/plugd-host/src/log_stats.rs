//! Process-wide counters of log output plugd chose not to write, for
//! `GET /metrics`: lines serve's log writer dropped because its stderr did
//! not keep up, and plugin stderr lines beyond their log budget.

use std::sync::atomic::{AtomicU64, Ordering};

static LOG_LINES_DROPPED: AtomicU64 = AtomicU64::new(0);
static STDERR_LINES_SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Counts one log line the log writer dropped.
pub fn log_line_dropped() {
    LOG_LINES_DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// Log lines dropped so far in this process.
pub fn log_lines_dropped() -> u64 {
    LOG_LINES_DROPPED.load(Ordering::Relaxed)
}

pub(crate) fn stderr_line_suppressed() {
    STDERR_LINES_SUPPRESSED.fetch_add(1, Ordering::Relaxed);
}

/// Plugin stderr lines not logged (beyond their budget) so far, all plugins.
pub fn stderr_lines_suppressed() -> u64 {
    STDERR_LINES_SUPPRESSED.load(Ordering::Relaxed)
}
