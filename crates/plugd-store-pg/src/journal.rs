//! The journal writer on PostgreSQL: one thread with a connection of its
//! own that appends the audit trail and the invocation records in batches,
//! both in one transaction, off the request path (as `plugd-store`'s
//! `journal.rs` does on SQLite).
//!
//! **Nothing is dropped silently.** The queue is bounded ([`QUEUE`]); a
//! caller that finds it full waits for room (the writer is that far behind).
//! A batch the database refuses because it is unavailable (a restart) is
//! retried for up to [`RETRY_FOR`]; what still cannot be written is logged
//! and counted ([`PgStore::journal_unwritten`]).
//! [`PgStore::flush_journal`] waits until everything queued before it is
//! written; dropping the [`PgStore`] writes what is queued before it
//! returns. Audit times are the database's clock at the write (a few
//! milliseconds after the request).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use deadpool_postgres::GenericClient;
use plugd_control::invocations::InvocationRecord;
use plugd_control::store::tokens::Role;

use crate::clock::NOW_RFC3339;
use crate::invocations::insert_invocations;
use crate::{PgError, PgOptions, PgStore};

/// Entries queued for the writer; beyond, callers wait for room.
pub const QUEUE: usize = 8192;

/// Most entries written in one transaction.
const BATCH: usize = 1024;

/// How long the writer lets a burst gather after the first entry.
pub const LINGER: Duration = Duration::from_millis(2);

/// How long a batch is retried while the database is unavailable.
pub const RETRY_FOR: Duration = Duration::from_secs(10);

/// One audit entry before it is written.
#[derive(Debug)]
struct PendingAudit {
    identity: String,
    role: Role,
    method: String,
    path: String,
    status: u16,
}

enum Msg {
    Audit(PendingAudit),
    Invocation(Box<InvocationRecord>),
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
    unwritten: Arc<Unwritten>,
}

impl Journal {
    /// Starts the writer thread, with its own runtime and its own
    /// single-connection pool on `store`'s database.
    fn start(store: &PgStore) -> Journal {
        let unwritten = Arc::new(Unwritten::default());
        let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(QUEUE);
        let config = store.config.clone();
        let opts = PgOptions {
            pool_size: 1,
            timeout: store.timeout,
            op_timeout: store.op_timeout,
        };
        let counts = unwritten.clone();
        let thread = std::thread::Builder::new()
            .name("plugd-pg-journal".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let store = PgStore::from_config(config, &opts);
                match (runtime, store) {
                    (Ok(rt), Ok(store)) => write_loop(&rx, &rt, &store, &counts),
                    (Err(e), _) => fail_all(&rx, &counts, &e.to_string()),
                    (_, Err(e)) => fail_all(&rx, &counts, &e.to_string()),
                }
            });
        match thread {
            Ok(thread) => Journal {
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                unwritten,
            },
            Err(e) => {
                tracing::error!("cannot start the journal writer thread: {e}");
                Journal {
                    tx: Mutex::new(None),
                    thread: Mutex::new(None),
                    unwritten,
                }
            }
        }
    }

    fn sender(&self) -> Option<SyncSender<Msg>> {
        self.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Queues `msg`, waiting for room when the queue is full; counts the
    /// entry as unwritten when there is no writer.
    fn queue(&self, msg: Msg) {
        let counter = match &msg {
            Msg::Audit(_) => &self.unwritten.audit,
            Msg::Invocation(_) => &self.unwritten.invocations,
            Msg::Flush(_) => return,
        };
        if self.sender().is_none_or(|tx| tx.send(msg).is_err()) {
            counter.fetch_add(1, Ordering::Relaxed);
            tracing::error!("the journal writer is gone; an entry was not written");
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

/// Counts everything queued as unwritten (the writer could not start).
fn fail_all(rx: &Receiver<Msg>, unwritten: &Unwritten, why: &str) {
    tracing::error!(
        "the journal writer cannot start ({why}); audit entries and invocation records are not written"
    );
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Audit(_) => {
                unwritten.audit.fetch_add(1, Ordering::Relaxed);
            }
            Msg::Invocation(_) => {
                unwritten.invocations.fetch_add(1, Ordering::Relaxed);
            }
            Msg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn write_loop(
    rx: &Receiver<Msg>,
    rt: &tokio::runtime::Runtime,
    store: &PgStore,
    unwritten: &Unwritten,
) {
    let mut audit = Vec::with_capacity(BATCH);
    let mut records = Vec::with_capacity(BATCH);
    let mut flushes = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        if !matches!(next, Some(Msg::Flush(_))) {
            std::thread::sleep(LINGER);
        }
        while let Some(msg) = next.take() {
            match msg {
                Msg::Audit(a) => audit.push(a),
                Msg::Invocation(r) => records.push(*r),
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
            rt.block_on(write_or_count(store, &audit, &records, unwritten));
            audit.clear();
            records.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Writes both in one transaction, retrying while the database is
/// unavailable (up to [`RETRY_FOR`]); when that fails, each journal on its
/// own, and counts what still could not be written.
async fn write_or_count(
    store: &PgStore,
    audit: &[PendingAudit],
    records: &[InvocationRecord],
    unwritten: &Unwritten,
) {
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        match write(store, audit, records).await {
            Ok(()) => return,
            Err(PgError::Unavailable { .. }) if started.elapsed() < RETRY_FOR => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(_) => break,
        }
    }
    for (a, r) in [(audit, &[][..]), (&[][..], records)] {
        if a.is_empty() && r.is_empty() {
            continue;
        }
        if let Err(e) = write(store, a, r).await {
            unwritten.audit.fetch_add(a.len() as u64, Ordering::Relaxed);
            unwritten
                .invocations
                .fetch_add(r.len() as u64, Ordering::Relaxed);
            tracing::error!(
                "cannot write {} audit entries and {} invocation records: {e}",
                a.len(),
                r.len()
            );
        }
    }
}

/// Both journals' entries in one transaction.
async fn write(
    store: &PgStore,
    audit: &[PendingAudit],
    records: &[InvocationRecord],
) -> Result<(), PgError> {
    let stored = store.stored_invocations(records)?;
    let action = || {
        format!(
            "record {} audit entries and {} invocations",
            audit.len(),
            records.len()
        )
    };
    let err = |e| store.query_error(action(), e);
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(err)?;
    if !audit.is_empty() {
        let identities: Vec<&str> = audit.iter().map(|a| a.identity.as_str()).collect();
        let roles: Vec<&str> = audit.iter().map(|a| a.role.as_str()).collect();
        let methods: Vec<&str> = audit.iter().map(|a| a.method.as_str()).collect();
        let paths: Vec<&str> = audit.iter().map(|a| a.path.as_str()).collect();
        let statuses: Vec<i64> = audit.iter().map(|a| i64::from(a.status)).collect();
        let stmt = tx
            .prepare_cached(&format!(
                "INSERT INTO audit (at, identity, role, method, path, status)
                 SELECT {NOW_RFC3339}, u.identity, u.role, u.method, u.path, u.status
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[])
                      WITH ORDINALITY AS u(identity, role, method, path, status, n)
                 ORDER BY u.n"
            ))
            .await
            .map_err(err)?;
        tx.execute(&stmt, &[&identities, &roles, &methods, &paths, &statuses])
            .await
            .map_err(err)?;
    }
    insert_invocations(&tx, &stored).await.map_err(err)?;
    tx.commit().await.map_err(err)
}

impl PgStore {
    fn journal(&self) -> &Journal {
        self.journal.get_or_init(|| Journal::start(self))
    }

    /// Queues one state-changing request for the audit trail (written by
    /// the journal's thread, batched; never dropped silently).
    pub fn journal_audit(&self, identity: &str, role: Role, method: &str, path: &str, status: u16) {
        self.journal().queue(Msg::Audit(PendingAudit {
            identity: identity.to_owned(),
            role,
            method: method.to_owned(),
            path: path.to_owned(),
            status,
        }));
    }

    /// Queues one invocation record for the journal's thread.
    pub fn journal_invocation(&self, record: Box<InvocationRecord>) {
        self.journal().queue(Msg::Invocation(record));
    }

    /// Waits until everything queued before this call is written (or
    /// counted as unwritten). Blocks the calling thread: call it where
    /// blocking is allowed (shutdown, tests, `spawn_blocking`).
    pub fn flush_journal(&self) {
        let Some(journal) = self.journal.get() else {
            return;
        };
        if let Some(tx) = journal.sender() {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            if tx.send(Msg::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }

    /// How many audit entries and invocation records could not be written.
    pub fn journal_unwritten(&self) -> (u64, u64) {
        self.journal.get().map_or((0, 0), |j| {
            (
                j.unwritten.audit.load(Ordering::Relaxed),
                j.unwritten.invocations.load(Ordering::Relaxed),
            )
        })
    }
}
