//! The journal writer: one thread with one connection of its own that
//! appends the two append-only journals (the audit trail and the
//! invocation records) in batches, both in the same transaction, off the
//! request path.
//!
//! Before, each journal had its own thread and connection. A tool call
//! through the HTTP API writes one entry to each, so the two writers took
//! turns at SQLite's single write lock (one waiting in the busy handler
//! while the other committed) and every call paid for two commits, two
//! sets of rewritten B-tree pages and two sets of WAL frames. One writer
//! commits both in one transaction: one commit, one lock, one wake-up.
//!
//! **Nothing is dropped.** The queue is bounded ([`QUEUE`]); when it is full
//! (the writer is that far behind) or the thread could not start, the
//! caller writes its entry itself on the store's shared connection. An
//! entry that cannot be written at all is logged and counted
//! ([`Store::journal_unwritten`]). [`Store::flush_journal`] waits until
//! everything queued before it is written; dropping the [`Store`] writes
//! what is queued before it returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use plugd_control::invocations::{InvocationRecord, StoredInvocation};
use rusqlite::{Connection, Transaction, params};

use crate::error::StoreError;
use crate::store::Store;
use crate::tokens::{PendingAudit, Role};

/// Entries queued for the writer; beyond, the caller writes its own.
pub const QUEUE: usize = 8192;

/// Most entries written in one transaction.
const BATCH: usize = 1024;

/// How long the writer lets a burst gather after the first entry before
/// it writes: one transaction (and one wake-up of the thread) for many
/// requests.
pub const LINGER: Duration = Duration::from_millis(2);

/// One entry on its way to the database.
#[derive(Debug)]
pub(crate) enum Entry {
    Audit(PendingAudit),
    Invocation(Box<InvocationRecord>),
}

enum Msg {
    Entry(Entry),
    Flush(SyncSender<()>),
}

/// Entries that could not be written, by journal.
#[derive(Debug, Default)]
struct Unwritten {
    audit: AtomicU64,
    invocations: AtomicU64,
}

/// The writer thread and its queue (see the module docs).
#[derive(Debug)]
pub(crate) struct Journal {
    tx: Mutex<Option<SyncSender<Msg>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    unwritten: std::sync::Arc<Unwritten>,
}

impl Journal {
    /// A journal for `store`: a thread with a connection of its own when
    /// the store is a file, else none (entries are then written by their
    /// callers, on the store's connection).
    pub(crate) fn start(store: &Store) -> Journal {
        let unwritten = std::sync::Arc::new(Unwritten::default());
        let Some(conn) = store.writer_connection() else {
            return Journal {
                tx: Mutex::new(None),
                thread: Mutex::new(None),
                unwritten,
            };
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(QUEUE);
        let label = store.label().to_owned();
        let counts = unwritten.clone();
        let thread = std::thread::Builder::new()
            .name("plugd-journal".into())
            .spawn(move || write_loop(&rx, conn, &label, &counts));
        match thread {
            Ok(thread) => Journal {
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                unwritten,
            },
            Err(e) => {
                tracing::warn!(
                    "cannot start the journal writer thread ({e}); requests write their audit entries and invocation records themselves"
                );
                Journal {
                    tx: Mutex::new(None),
                    thread: Mutex::new(None),
                    unwritten,
                }
            }
        }
    }

    /// Queues `entry`; gives it back when the caller must write it itself.
    fn queue(&self, entry: Entry) -> Option<Entry> {
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(tx) = tx else {
            return Some(entry);
        };
        match tx.try_send(Msg::Entry(entry)) {
            Ok(()) => None,
            Err(TrySendError::Full(Msg::Entry(e)) | TrySendError::Disconnected(Msg::Entry(e))) => {
                Some(e)
            }
            Err(_) => None,
        }
    }

    fn flush(&self) {
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(tx) = tx {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            if tx.send(Msg::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }
}

impl Drop for Journal {
    /// Writes what is queued, then returns.
    fn drop(&mut self) {
        drop(
            self.tx
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(t) = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

fn write_loop(rx: &Receiver<Msg>, mut conn: Connection, label: &str, unwritten: &Unwritten) {
    let mut audit = Vec::with_capacity(BATCH);
    let mut records = Vec::with_capacity(BATCH);
    let mut flushes = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        // A flush alone is answered at once; entries let a burst gather
        // (sleeping, not waiting on the channel: senders then wake nobody).
        if matches!(next, Some(Msg::Entry(_))) {
            std::thread::sleep(LINGER);
        }
        while let Some(msg) = next.take() {
            match msg {
                Msg::Entry(Entry::Audit(a)) => audit.push(a),
                Msg::Entry(Entry::Invocation(r)) => records.push(*r),
                Msg::Flush(done) => {
                    flushes.push(done);
                    break;
                }
            }
            if audit.len() + records.len() >= BATCH {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !audit.is_empty() || !records.is_empty() {
            write_or_count(&mut conn, label, &audit, &records, unwritten);
            audit.clear();
            records.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Writes both in one transaction; when that fails, each journal on its
/// own (one journal's failure does not cost the other its entries), and
/// counts what still could not be written.
fn write_or_count(
    conn: &mut Connection,
    label: &str,
    audit: &[PendingAudit],
    records: &[InvocationRecord],
    unwritten: &Unwritten,
) {
    if write(conn, label, audit, records).is_ok() {
        return;
    }
    if !audit.is_empty()
        && let Err(e) = write(conn, label, audit, &[])
    {
        count_unwritten(unwritten, audit, &[], &e);
    }
    if !records.is_empty()
        && let Err(e) = write(conn, label, &[], records)
    {
        count_unwritten(unwritten, &[], records, &e);
    }
}

fn count_unwritten(
    unwritten: &Unwritten,
    audit: &[PendingAudit],
    records: &[InvocationRecord],
    e: &StoreError,
) {
    unwritten
        .audit
        .fetch_add(audit.len() as u64, Ordering::Relaxed);
    unwritten
        .invocations
        .fetch_add(records.len() as u64, Ordering::Relaxed);
    tracing::error!(
        "cannot write {} audit entries and {} invocation records: {e}",
        audit.len(),
        records.len()
    );
}

/// Both journals' entries in one transaction.
pub(crate) fn write(
    conn: &mut Connection,
    label: &str,
    audit: &[PendingAudit],
    records: &[InvocationRecord],
) -> Result<(), StoreError> {
    let stored = records
        .iter()
        .map(|r| {
            StoredInvocation::from_record(r).map_err(|e| StoreError::Damaged {
                db: label.to_owned(),
                what: format!("invocation {}", r.invocation_id),
                detail: format!("cannot encode its record: {e}"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let run = |conn: &mut Connection| -> rusqlite::Result<()> {
        let tx = conn.transaction()?;
        insert_audit(&tx, audit)?;
        crate::invocations::insert(&tx, &stored)?;
        tx.commit()
    };
    run(conn).map_err(|e| StoreError::Query {
        db: label.to_owned(),
        action: format!(
            "record {} audit entries and {} invocations",
            audit.len(),
            records.len()
        ),
        source: crate::BackendError::new(e),
    })
}

fn insert_audit(tx: &Transaction<'_>, entries: &[PendingAudit]) -> rusqlite::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut st = tx.prepare_cached(
        "INSERT INTO audit (at, identity, role, method, path, status)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for e in entries {
        st.execute(params![
            e.at,
            e.identity,
            e.role.as_str(),
            e.method,
            e.path,
            e.status
        ])?;
    }
    Ok(())
}

impl Store {
    fn journal(&self) -> &Journal {
        self.journal.get_or_init(|| Journal::start(self))
    }

    /// Queues one state-changing request for the audit trail (written by
    /// the journal's thread, batched; never dropped).
    pub fn journal_audit(&self, identity: &str, role: Role, method: &str, path: &str, status: u16) {
        let entry = PendingAudit {
            at: crate::now_rfc3339(),
            identity: identity.to_owned(),
            role,
            method: method.to_owned(),
            path: path.to_owned(),
            status,
        };
        if let Some(Entry::Audit(entry)) = self.journal().queue(Entry::Audit(entry)) {
            self.write_now(std::slice::from_ref(&entry), &[]);
        }
    }

    /// Queues one invocation record (written by the journal's thread,
    /// batched; never dropped).
    pub fn journal_invocation(&self, record: Box<InvocationRecord>) {
        if let Some(Entry::Invocation(r)) = self.journal().queue(Entry::Invocation(record)) {
            self.write_now(&[], std::slice::from_ref(&*r));
        }
    }

    /// Waits until every entry queued so far is written (a CLI command
    /// before it exits, a test before it reads).
    pub fn flush_journal(&self) {
        if let Some(j) = self.journal.get() {
            j.flush();
        }
    }

    /// Audit entries and invocation records that could not be written.
    pub fn journal_unwritten(&self) -> (u64, u64) {
        self.journal.get().map_or((0, 0), |j| {
            (
                j.unwritten.audit.load(Ordering::Relaxed),
                j.unwritten.invocations.load(Ordering::Relaxed),
            )
        })
    }

    /// Writes entries on the store's own connection (the queue was full,
    /// or there is no writer thread).
    fn write_now(&self, audit: &[PendingAudit], records: &[InvocationRecord]) {
        let unwritten = &self.journal().unwritten;
        write_or_count(&mut self.lock(), self.label(), audit, records, unwritten);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use plugd_control::invocations::{InvocationFilter, TerminalStatus};

    use super::*;

    fn record(i: usize) -> Box<InvocationRecord> {
        Box::new(crate::invocations::tests::rec(
            i,
            i as i64,
            "p",
            TerminalStatus::Succeeded,
        ))
    }

    fn count(store: &Store, table: &str) -> i64 {
        store
            .lock()
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    /// Four threads queue both kinds well past the queue's bound: every
    /// entry is written exactly once, those queued before a flush are
    /// visible after it, and the rest are written when the store drops.
    #[test]
    fn both_journals_lose_nothing_past_the_queue_and_drop_writes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join(".plugd");
        let store = Arc::new(Store::open(&state).unwrap());
        let n = QUEUE + 1500;
        std::thread::scope(|s| {
            for t in 0..4 {
                let store = &store;
                s.spawn(move || {
                    for i in (t..n).step_by(4) {
                        store.journal_invocation(record(i));
                        store.journal_audit(
                            "token:ci",
                            Role::Agent,
                            "POST",
                            &format!("/v1/x/{i}"),
                            200,
                        );
                    }
                });
            }
        });
        store.flush_journal();
        assert_eq!(count(&store, "invocations"), n as i64);
        assert_eq!(count(&store, "audit"), n as i64);
        // Queued, not flushed: dropping the store writes them.
        for i in n..n + 100 {
            store.journal_invocation(record(i));
            store.journal_audit("token:ci", Role::Agent, "POST", "/v1/late", 201);
        }
        assert_eq!(store.journal_unwritten(), (0, 0));
        drop(Arc::into_inner(store).expect("the only handle"));
        let again = Store::open(&state).unwrap();
        assert_eq!(count(&again, "invocations"), n as i64 + 100);
        assert_eq!(count(&again, "audit"), n as i64 + 100);
        let page = again
            .list_invocations(&InvocationFilter {
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(page.invocations.len(), 10);
    }

    /// When one journal cannot be written (its table is gone: a damaged
    /// database), the other's entries of the same batch still are, and
    /// what was lost is counted, not silently dropped.
    #[test]
    fn one_journal_failing_costs_the_other_nothing_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join(".plugd");
        let store = Store::open(&state).unwrap();
        store.lock().execute_batch("DROP TABLE audit").unwrap();
        for i in 0..50 {
            store.journal_invocation(record(i));
            store.journal_audit("token:ci", Role::Agent, "POST", "/v1/x", 200);
        }
        store.flush_journal();
        assert_eq!(count(&store, "invocations"), 50);
        assert_eq!(store.journal_unwritten(), (50, 0));
    }

    /// An in-memory store has no writer thread: entries are written at
    /// once by their callers.
    #[test]
    fn an_in_memory_store_writes_at_once() {
        let store = Store::open_in_memory().unwrap();
        store.journal_invocation(record(1));
        store.journal_audit("local", Role::Admin, "POST", "/v1/y", 204);
        assert_eq!(count(&store, "invocations"), 1);
        assert_eq!(count(&store, "audit"), 1);
        assert_eq!(store.invocation("inv_0001").unwrap().unwrap().started_ms, 1);
    }
}
