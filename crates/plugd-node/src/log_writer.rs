//! serve's log writer: bounded and non-blocking, so a stderr nobody reads can
//! never stall serve. Formatted lines go into a queue of [`QUEUE_LINES`]; one
//! thread writes them to stderr. When the queue is full a line is dropped and
//! counted ([`dropped`]); serve reports the count every interval and at exit.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Lines the queue holds before new ones are dropped.
pub const QUEUE_LINES: usize = 8192;

struct Shared {
    dropped: AtomicU64,
    /// Lines queued and not yet written.
    pending: AtomicU64,
}

static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();

/// A `MakeWriter` for `tracing_subscriber::fmt` that never blocks.
#[derive(Clone)]
pub struct LogWriter {
    tx: SyncSender<Vec<u8>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter").finish_non_exhaustive()
    }
}

impl LogWriter {
    /// Starts the writing thread; the process's one log writer.
    pub fn start() -> std::io::Result<LogWriter> {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE_LINES);
        let shared = SHARED
            .get_or_init(|| {
                Arc::new(Shared {
                    dropped: AtomicU64::new(0),
                    pending: AtomicU64::new(0),
                })
            })
            .clone();
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("plugd-log".into())
            .spawn(move || drain(&rx, &worker))?;
        Ok(LogWriter { tx, shared })
    }
}

fn drain(rx: &Receiver<Vec<u8>>, shared: &Shared) {
    let stderr = std::io::stderr();
    while let Ok(line) = rx.recv() {
        // Blocks only this thread when stderr is a full pipe.
        let _ = stderr.lock().write_all(&line);
        shared.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One event's text, queued whole when dropped.
pub struct Line {
    buf: Vec<u8>,
    writer: LogWriter,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        let shared = &self.writer.shared;
        shared.pending.fetch_add(1, Ordering::Relaxed);
        match self.writer.tx.try_send(buf) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                shared.pending.fetch_sub(1, Ordering::Relaxed);
                shared.dropped.fetch_add(1, Ordering::Relaxed);
                plugd_host::log_stats::log_line_dropped();
            }
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line {
            buf: Vec::with_capacity(256),
            writer: self.clone(),
        }
    }
}

/// Lines dropped so far because stderr did not keep up (0 before [`LogWriter::start`]).
pub fn dropped() -> u64 {
    SHARED
        .get()
        .map_or(0, |s| s.dropped.load(Ordering::Relaxed))
}

/// Waits up to `limit` for the queued lines to reach stderr (before exit).
pub fn flush(limit: Duration) {
    let Some(shared) = SHARED.get() else { return };
    let end = Instant::now() + limit;
    while shared.pending.load(Ordering::Relaxed) > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How often serve reports the lines the writer dropped (when there were any).
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// The running drop report; dropping it stops the report and logs the total.
#[derive(Debug)]
pub struct Reporter(tokio::task::JoinHandle<()>);

/// Starts [`report_drops`] on the current runtime.
pub fn spawn_reporter() -> Reporter {
    Reporter(tokio::spawn(report_drops()))
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.0.abort();
        let total = dropped();
        if total > 0 {
            tracing::warn!(
                dropped_total = total,
                "the log writer dropped {total} lines in all because serve's stderr was not read fast enough"
            );
        }
    }
}

/// Reports, every [`REPORT_EVERY`], how many log lines were dropped since the
/// last report. Runs until the task is dropped.
pub async fn report_drops() {
    let mut last = 0;
    let mut tick = tokio::time::interval(REPORT_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = dropped();
        if now > last {
            tracing::warn!(
                dropped = now - last,
                dropped_total = now,
                "the log writer dropped {} lines in the last {} s: serve's stderr is not read fast enough",
                now - last,
                REPORT_EVERY.as_secs()
            );
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        // A writer whose thread never drains: the queue fills, then drops.
        let (tx, _rx) = sync_channel::<Vec<u8>>(4);
        let shared = Arc::new(Shared {
            dropped: AtomicU64::new(0),
            pending: AtomicU64::new(0),
        });
        let w = LogWriter {
            tx,
            shared: shared.clone(),
        };
        for _ in 0..10 {
            let mut line = w.make_writer();
            line.write_all(b"x\n").unwrap();
        }
        assert_eq!(shared.dropped.load(Ordering::Relaxed), 6);
        assert_eq!(shared.pending.load(Ordering::Relaxed), 4);
    }
}
