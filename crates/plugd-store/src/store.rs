//! The SQLite-backed [`Store`]: opening, schema migrations, approvals and failures.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use plugd_control::store::approvals::check_plugin_id;

use crate::error::{BackendError, StoreError};

pub use plugd_control::store::approvals::{Approval, Failure};

/// Name of the database file inside the state directory.
pub const STATE_DB_FILE: &str = "state.db";

/// The schema version this build writes, kept in SQLite's `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a writer waits for another process holding the database lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema steps; step `i` takes the database from version `i` to `i + 1`.
///
/// Append only: never edit a step that has shipped, add a new one instead.
///
/// Every schema change from now on is a pair (this SQLite step + a PostgreSQL
/// step in `plugd-store-pg`'s `migrations.rs`) and the shape test
/// (`crates/plugd-store-pg/tests/it/shape.rs`, snapshot `schema-shape.txt`)
/// must stay green.
const MIGRATIONS: &[&str] = &[
    // 1: approvals pinned to a content digest, with the cached tool catalog.
    "CREATE TABLE approvals (
        plugin_id   TEXT PRIMARY KEY NOT NULL,
        digest      TEXT NOT NULL,
        approved_by TEXT NOT NULL,
        approved_at TEXT NOT NULL,
        catalog     TEXT NOT NULL DEFAULT '[]'
    ) STRICT;",
    // 2: plugins the supervisor gave up on, until `plugd plugin restart`.
    "CREATE TABLE failures (
        plugin_id TEXT PRIMARY KEY NOT NULL,
        reason    TEXT NOT NULL,
        at        TEXT NOT NULL
    ) STRICT;",
    // 3: the durable outbox of semantic events and their hook deliveries
    // (see `crate::outbox`).
    crate::outbox::MIGRATION,
    // 4: agent sessions and their transcripts (see `crate::sessions`).
    crate::sessions::MIGRATION,
    // 5: long-term agent memory with its FTS5 index (see `crate::memory`).
    crate::memory::MIGRATION,
    // 6: the built-in vector index (see `crate::vectors`).
    crate::vectors::MIGRATION,
    // 7: disabled tools and per-call approvals (see `crate::tool_state`).
    crate::tool_state::MIGRATION,
    // 8: per-plugin configuration values, secrets sealed (see `crate::secrets`).
    crate::secrets::MIGRATION,
    // 9: API tokens (hashes only) and the audit trail (see `crate::tokens`).
    crate::tokens::MIGRATION,
    // 10: the agent's key-value storage (see `crate::kv`).
    crate::kv::MIGRATION,
    // 11: API tokens limited to MCP gateway profiles (see `crate::tokens`).
    crate::tokens::PROFILES_MIGRATION,
    // 12: installed plugin packages (see `crate::packages`).
    crate::packages::MIGRATION,
    // 13: plugin bindings, and API tokens bound to an org (see `crate::bindings`).
    crate::bindings::MIGRATION,
    // 14: invocation records of every tool call (see `crate::invocations`).
    crate::invocations::MIGRATION,
    // 15: the tree digest of each installed package as installed (see `crate::packages`).
    crate::packages::TREE_DIGEST_MIGRATION,
    // 16: sessions hold chains of blocks; runs and compactions; transcripts
    // become each session's first chain (see `crate::chains`).
    crate::chains::MIGRATION,
    // 17: live MCP and console sessions, login codes, and the control epoch
    // with its triggers (see `crate::live`).
    crate::live::MIGRATION,
    // 18: leases of singleton jobs, with fencing numbers (see `crate::leases`).
    crate::leases::MIGRATION,
    // 19: the nodes serving this state, and live sessions that end moving
    // the control epoch (see `crate::nodes`).
    crate::nodes::MIGRATION,
    // 20: who asks for a call approval: caller, surface, session, agent
    // (see `crate::tool_state`).
    crate::tool_state::ASKER_MIGRATION,
    // 21: the token buckets of plugd.yaml's `limits:` rules (see
    // `crate::limits`).
    crate::limits::MIGRATION,
    // 22: approved plugins' pinned tool definitions and withheld tools,
    // cleared by a revocation or a re-approval (see `crate::tool_pins`).
    crate::tool_pins::MIGRATION,
    // 23: invocation records as columns and a JSON object of the rare
    // fields, no longer one JSON document each (see `crate::invocations`).
    crate::invocations::COMPACT_MIGRATION,
];

/// Writes one approval, replacing the plugin's earlier one.
const UPSERT_APPROVAL: &str =
    "INSERT INTO approvals (plugin_id, digest, approved_by, approved_at, catalog)
     VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (plugin_id) DO UPDATE SET
        digest = excluded.digest,
        approved_by = excluded.approved_by,
        approved_at = excluded.approved_at,
        catalog = excluded.catalog";

/// The trust state of one workspace: approvals and failures.
///
/// `Send + Sync`: one connection behind a mutex, so calls from several threads
/// are serialised. Other processes may open the same file; SQLite's locking
/// (WAL mode, 5 s busy timeout) keeps them consistent.
pub struct Store {
    conn: Mutex<Connection>,
    path: Option<PathBuf>,
    label: String,
    /// Verified-token rows, valid while no other connection committed
    /// (`crate::tokens`).
    pub(crate) token_cache: Mutex<crate::tokens::TokenCache>,
    /// The audit trail's and invocation records' writer, started on first
    /// use (`crate::journal`); dropping the store writes what it queued.
    pub(crate) journal: std::sync::OnceLock<crate::journal::Journal>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("db", &self.label).finish()
    }
}

impl Store {
    /// Opens (creating if needed) `state_dir/state.db`, upgrading its schema.
    ///
    /// `state_dir` (normally `DIR/.plugd`) is created with mode 0700 and the
    /// database file with mode 0600 when they do not exist. A file that is not
    /// a SQLite database gives [`StoreError::NotADatabase`]; one written by a
    /// newer plugd gives [`StoreError::TooNew`].
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        create_private_dir(state_dir)?;
        let path = state_dir.join(STATE_DB_FILE);
        // The marker says a database existed: never let SQLite create a new one.
        let marker = crate::identity::read_marker(state_dir)?;
        if let Some(m) = &marker {
            crate::identity::check_file(state_dir, &path, m)?;
        }
        create_private_file(&path)?;
        let conn = Connection::open(&path).map_err(|e| open_error(&path, e))?;
        configure(&conn, true).map_err(|e| open_error(&path, e))?;
        if let Some(m) = &marker {
            crate::identity::check_db(&conn, state_dir, &path, m)?;
        }
        let label = path.display().to_string();
        let mut conn = conn;
        migrate(&mut conn, &path, &label)?;
        crate::identity::settle(&conn, state_dir, &path, marker.as_ref())?;
        Ok(Store {
            conn: Mutex::new(conn),
            path: Some(path),
            label,
            token_cache: Mutex::default(),
            journal: std::sync::OnceLock::new(),
        })
    }

    /// Opens an empty store that lives in memory only, for tests and dry runs.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let path = PathBuf::from(":memory:");
        let mut conn = Connection::open_in_memory().map_err(|e| open_error(&path, e))?;
        configure(&conn, false).map_err(|e| open_error(&path, e))?;
        let label = ":memory:".to_owned();
        migrate(&mut conn, &path, &label)?;
        Ok(Store {
            conn: Mutex::new(conn),
            path: None,
            label,
            token_cache: Mutex::default(),
            journal: std::sync::OnceLock::new(),
        })
    }

    /// Another connection to the same file, for a writer that should not
    /// hold this store's connection while it commits (the audit trail);
    /// `None` for an in-memory store or when it cannot be opened.
    pub(crate) fn writer_connection(&self) -> Option<Connection> {
        let path = self.path.as_deref()?;
        let conn = Connection::open(path)
            .and_then(|c| configure(&c, true).map(|()| c))
            .map_err(|e| tracing::warn!(db = %self.label, "cannot open a second connection: {e}"))
            .ok()?;
        Some(conn)
    }

    /// The database file, or `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Records an approval, replacing any earlier one for the same plugin.
    pub fn approve(&self, a: &Approval) -> Result<(), StoreError> {
        check_plugin_id(&a.plugin_id)?;
        let catalog = a.catalog.to_string();
        self.lock()
            .execute(
                UPSERT_APPROVAL,
                params![a.plugin_id, a.digest, a.approved_by, a.approved_at, catalog],
            )
            .map_err(|e| self.query_error(format!("approve plugin {:?}", a.plugin_id), e))?;
        Ok(())
    }

    /// Records an approval and forgets the plugin's failure mark, in one
    /// transaction: a concurrent reader sees either neither or both.
    pub fn approve_clearing_failure(&self, a: &Approval) -> Result<(), StoreError> {
        check_plugin_id(&a.plugin_id)?;
        let catalog = a.catalog.to_string();
        let mut conn = self.lock();
        let write = |conn: &mut Connection| -> rusqlite::Result<()> {
            let tx = conn.transaction()?;
            tx.execute(
                UPSERT_APPROVAL,
                params![a.plugin_id, a.digest, a.approved_by, a.approved_at, catalog],
            )?;
            tx.execute(
                "DELETE FROM failures WHERE plugin_id = ?1",
                params![a.plugin_id],
            )?;
            tx.commit()
        };
        write(&mut conn)
            .map_err(|e| self.query_error(format!("approve plugin {:?}", a.plugin_id), e))
    }

    /// Withdraws the approval `a` only if it is still the stored one (same
    /// digest, approver and time), and forgets the failure mark, in one
    /// transaction; `true` if it was withdrawn. An approval's own rollback
    /// uses this so it can never withdraw a newer approval written by
    /// someone else (another process) in the meantime.
    pub fn revoke_exact(&self, a: &Approval) -> Result<bool, StoreError> {
        let mut conn = self.lock();
        let write = |conn: &mut Connection| -> rusqlite::Result<bool> {
            let tx = conn.transaction()?;
            let n = tx.execute(
                "DELETE FROM approvals WHERE plugin_id = ?1 AND digest = ?2
                   AND approved_by = ?3 AND approved_at = ?4",
                params![a.plugin_id, a.digest, a.approved_by, a.approved_at],
            )?;
            if n > 0 {
                tx.execute(
                    "DELETE FROM failures WHERE plugin_id = ?1",
                    params![a.plugin_id],
                )?;
            }
            tx.commit()?;
            Ok(n > 0)
        };
        write(&mut conn).map_err(|e| {
            self.query_error(format!("roll back the approval of {:?}", a.plugin_id), e)
        })
    }

    /// The approval of `plugin_id`, if any.
    pub fn approval(&self, plugin_id: &str) -> Result<Option<Approval>, StoreError> {
        // A cached statement: listing N plugins reads N approvals.
        let row = {
            let conn = self.lock();
            conn.prepare_cached(
                "SELECT plugin_id, digest, approved_by, approved_at, catalog
                 FROM approvals WHERE plugin_id = ?1",
            )
            .and_then(|mut stmt| stmt.query_row(params![plugin_id], raw_approval))
            .optional()
            .map_err(|e| self.query_error(format!("read approval of plugin {plugin_id:?}"), e))?
        };
        row.map(|r| self.decode(r)).transpose()
    }

    /// All approvals, sorted by plugin id (byte order).
    pub fn approvals(&self) -> Result<Vec<Approval>, StoreError> {
        let rows = {
            let conn = self.lock();
            let read = || -> rusqlite::Result<Vec<RawApproval>> {
                let mut stmt = conn.prepare(
                    "SELECT plugin_id, digest, approved_by, approved_at, catalog
                     FROM approvals ORDER BY plugin_id",
                )?;
                stmt.query_map([], raw_approval)?.collect()
            };
            read().map_err(|e| self.query_error("list approvals".to_owned(), e))?
        };
        rows.into_iter().map(|r| self.decode(r)).collect()
    }

    /// Removes the approval of `plugin_id`; `true` if there was one.
    ///
    /// A recorded [`Failure`] is independent and stays.
    pub fn revoke(&self, plugin_id: &str) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "DELETE FROM approvals WHERE plugin_id = ?1",
                params![plugin_id],
            )
            .map_err(|e| self.query_error(format!("revoke plugin {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Replaces the cached tool catalog of `plugin_id`, but only if its stored
    /// approval is for `digest`; `true` if it was updated.
    ///
    /// The check and the write are one statement, so a concurrent re-approval
    /// of other content can never receive a stale catalog.
    pub fn update_catalog(
        &self,
        plugin_id: &str,
        digest: &str,
        catalog: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "UPDATE approvals SET catalog = ?3 WHERE plugin_id = ?1 AND digest = ?2",
                params![plugin_id, digest, catalog.to_string()],
            )
            .map_err(|e| self.query_error(format!("update catalog of plugin {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Records that the supervisor gave up on `plugin_id`, stamped now.
    ///
    /// Replaces an earlier failure of the same plugin. The record persists
    /// until [`clear_failure`](Self::clear_failure).
    pub fn mark_failed(&self, plugin_id: &str, reason: &str) -> Result<(), StoreError> {
        check_plugin_id(plugin_id)?;
        self.lock()
            .execute(
                "INSERT INTO failures (plugin_id, reason, at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (plugin_id) DO UPDATE SET reason = excluded.reason, at = excluded.at",
                params![plugin_id, reason, crate::now_rfc3339()],
            )
            .map_err(|e| self.query_error(format!("mark plugin {plugin_id:?} failed"), e))?;
        Ok(())
    }

    /// The recorded failure of `plugin_id`, if any.
    pub fn failure(&self, plugin_id: &str) -> Result<Option<Failure>, StoreError> {
        self.lock()
            .query_row(
                "SELECT plugin_id, reason, at FROM failures WHERE plugin_id = ?1",
                params![plugin_id],
                |r| {
                    Ok(Failure {
                        plugin_id: r.get(0)?,
                        reason: r.get(1)?,
                        at: r.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.query_error(format!("read failure of plugin {plugin_id:?}"), e))
    }

    /// Forgets the failure of `plugin_id` (`plugd plugin restart ID`); `true` if there was one.
    pub fn clear_failure(&self, plugin_id: &str) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "DELETE FROM failures WHERE plugin_id = ?1",
                params![plugin_id],
            )
            .map_err(|e| self.query_error(format!("clear failure of plugin {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// The database's name in messages: the file's path, or `:memory:`.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-applied write:
        // every write is one statement or one transaction (rolled back when
        // dropped unfinished), atomic in SQLite. So poisoning is ignored.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn query_error(&self, action: String, e: rusqlite::Error) -> StoreError {
        StoreError::Query {
            db: self.label.clone(),
            action,
            source: BackendError::new(e),
        }
    }

    fn decode(&self, r: RawApproval) -> Result<Approval, StoreError> {
        let catalog = serde_json::from_str(&r.catalog).map_err(|e| StoreError::Corrupt {
            db: self.label.clone(),
            plugin_id: r.plugin_id.clone(),
            detail: format!("cached catalog is not JSON ({e})"),
        })?;
        Ok(Approval {
            plugin_id: r.plugin_id,
            digest: r.digest,
            approved_by: r.approved_by,
            approved_at: r.approved_at,
            catalog,
        })
    }
}

/// An approval row before its catalog is parsed (parsing errors are ours, not SQLite's).
struct RawApproval {
    plugin_id: String,
    digest: String,
    approved_by: String,
    approved_at: String,
    catalog: String,
}

fn raw_approval(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawApproval> {
    Ok(RawApproval {
        plugin_id: r.get(0)?,
        digest: r.get(1)?,
        approved_by: r.get(2)?,
        approved_at: r.get(3)?,
        catalog: r.get(4)?,
    })
}

fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|source| StoreError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let meta = fs::metadata(dir).map_err(|source| StoreError::Io {
        path: dir.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(StoreError::Io {
            path: dir.to_owned(),
            source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    Ok(())
}

/// Creates the database file with mode 0600 if missing, so SQLite (which gives
/// its `-wal` and `-shm` files the database's mode) never makes it world-readable.
fn create_private_file(path: &Path) -> Result<(), StoreError> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path).map(drop).map_err(|source| StoreError::Io {
        path: path.to_owned(),
        source,
    })
}

fn configure(conn: &Connection, wal: bool) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Reading the journal mode is the first read of the file: a file that is
    // not SQLite fails here with SQLITE_NOTADB.
    if wal {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(journal_mode = %mode, "state database is not in WAL mode");
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
    }
    conn.pragma_update(None, "foreign_keys", true)?;
    // Every hot query is a cached statement (tokens, audit, bindings,
    // packages, records, secrets…): more than rusqlite's default 16.
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

fn is_not_a_database(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}

fn open_error(path: &Path, e: rusqlite::Error) -> StoreError {
    let path = path.to_owned();
    let not_a_database = is_not_a_database(&e);
    let source = BackendError::new(e);
    if not_a_database {
        StoreError::NotADatabase { path, source }
    } else {
        StoreError::Open { path, source }
    }
}

/// Brings the schema up to [`SCHEMA_VERSION`] in one immediate transaction, so
/// two processes opening a fresh database at once cannot both migrate it.
fn migrate(conn: &mut Connection, path: &Path, label: &str) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| open_error(path, e))?;
    let found: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| open_error(path, e))?;
    if !(0..=SCHEMA_VERSION).contains(&found) {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = step as i64 + 1;
        tx.execute_batch(sql)
            .and_then(|()| tx.pragma_update(None, "user_version", version))
            .map_err(|e| {
                if is_not_a_database(&e) {
                    open_error(path, e)
                } else {
                    StoreError::Migrate {
                        db: label.to_owned(),
                        version,
                        source: BackendError::new(e),
                    }
                }
            })?;
        tracing::debug!(db = label, version, "applied state schema migration");
    }
    tx.commit().map_err(|e| open_error(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_23_keeps_every_field_of_a_record_stored_as_one_document() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..22] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 22).unwrap();
        let mut r = plugd_control::samples::invocation(
            3,
            1_795_000_000_000,
            "p",
            plugd_control::invocations::TerminalStatus::Failed,
        );
        r.retry_count = 1;
        r.session_id = Some("s1".into());
        r.surface = Some("mcp".into());
        r.payload = Some(serde_json::json!({"error": {"code": "tool_failed", "message": "no"}}));
        conn.execute(
            "INSERT INTO invocations (invocation_id, started_ms, plugin_id, tool, export_id,
                status, org_id, project_id, record) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            rusqlite::params![
                r.invocation_id,
                r.started_ms,
                r.plugin_id,
                r.tool,
                r.export_id,
                r.status.as_str(),
                r.org_id,
                r.project_id,
                serde_json::to_string(&r).unwrap()
            ],
        )
        .unwrap();
        migrate(&mut conn, Path::new(":memory:"), ":memory:").unwrap();
        let store = Store {
            conn: Mutex::new(conn),
            path: None,
            label: ":memory:".to_owned(),
            token_cache: Mutex::default(),
            journal: std::sync::OnceLock::new(),
        };
        assert_eq!(store.invocation(&r.invocation_id).unwrap().unwrap(), r);
        let f = plugd_control::invocations::InvocationFilter {
            caller: r.caller.clone(),
            q: Some("TOOL_FAILED".into()),
            ..Default::default()
        };
        assert_eq!(store.list_invocations(&f).unwrap().invocations, [r]);
    }

    #[test]
    fn schema_16_turns_stored_transcripts_into_first_chains() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..15] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 15).unwrap();
        conn.execute_batch(
            r#"INSERT INTO sessions (id, created_at) VALUES ('old', '2026-01-01T00:00:00Z'), ('empty', '2026-01-02T00:00:00Z');
               INSERT INTO transcript_entries (session_id, body) VALUES
                 ('old', '{"role":"user","content":"hi","at":"2026-01-01T00:00:01Z"}'),
                 ('old', '{"role":"assistant","content":"","tool_calls":[{"id":"c1","name":"a/t","arguments":{"x":1}}],"at":"2026-01-01T00:00:02Z"}'),
                 ('old', '{"role":"tool","content":"42","tool_call_id":"c1","at":"2026-01-01T00:00:03Z"}'),
                 ('old', '{"role":"assistant","content":"it is 42","at":"2026-01-01T00:00:04Z"}'),
                 ('old', '{"role":"system","content":"turn blocked"}');"#,
        )
        .unwrap();
        migrate(&mut conn, Path::new(":memory:"), ":memory:").unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let heads: Vec<(String, Option<String>)> = conn
            .prepare("SELECT id, head_chain_id FROM sessions ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            heads,
            [
                ("empty".to_owned(), Some("ch_empty".to_owned())),
                ("old".to_owned(), Some("ch_old".to_owned()))
            ]
        );
        let rows: Vec<(i64, String, String, String)> = conn
            .prepare("SELECT seq, kind, body, created_at FROM chain_blocks WHERE chain_id = 'ch_old' ORDER BY seq")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let kinds: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        assert_eq!(
            kinds,
            ["input", "output", "tool_result", "output", "system"]
        );
        assert_eq!(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        let body = |i: usize| serde_json::from_str::<serde_json::Value>(&rows[i].2).unwrap();
        assert_eq!(body(0)["content"][0]["text"], "hi");
        assert_eq!(body(1)["tool_calls"][0]["name"], "a/t");
        assert_eq!(body(2)["call_id"], "c1");
        assert_eq!(body(4)["note"], true);
        assert_eq!(rows[0].3, "2026-01-01T00:00:01Z");
        assert_eq!(
            rows[4].3, "2026-01-01T00:00:00Z",
            "no `at`: the session's time"
        );
        let gone: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'transcript_entries'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(gone, 0);
    }

    #[test]
    fn store_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Store>();
    }
}
