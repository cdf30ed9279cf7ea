//! Sessions, chains, runs and compactions in SQLite: the
//! [`ChainStore`](plugd_control::chains::ChainStore) of seed 003's model.
//!
//! Migration 16 turns every stored transcript into its session's first
//! chain (`ch_<session id>`), one block per entry (`user` → `input`,
//! `assistant` → `output`, `tool` → `tool_result`, `system` notes →
//! `system` with `note: true`), and drops the transcript table. Blocks are
//! numbered from 1 per chain and never updated; a compaction inserts a new
//! chain and moves the session's head in one transaction.

use plugd_control::chains::{
    Block, BlockKind, Chain, ChainStatus, Compaction, NewBlock, Run, RunKind, RunPatch, RunStatus,
    ScopeFilter, SessionInfo,
};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use serde_json::{Map, Value};

use plugd_control::store::transcripts::check_session_id;

use crate::error::StoreError;
use crate::outbox::{Enqueued, Reporter, Subscriber, check_event, enqueue_in};
use crate::store::Store;

/// Schema step 16: chains, blocks, runs, compactions; transcripts become chains.
pub(crate) const MIGRATION: &str = "
    ALTER TABLE sessions ADD COLUMN org_id TEXT;
    ALTER TABLE sessions ADD COLUMN project_id TEXT;
    ALTER TABLE sessions ADD COLUMN head_chain_id TEXT;
    CREATE TABLE chains (
        id              TEXT PRIMARY KEY NOT NULL,
        session_id      TEXT NOT NULL REFERENCES sessions (id),
        parent_chain_id TEXT REFERENCES chains (id),
        compaction_id   TEXT,
        status          TEXT NOT NULL,
        created_at      TEXT NOT NULL
    ) STRICT;
    CREATE INDEX chains_by_session ON chains (session_id, created_at);
    CREATE TABLE chain_blocks (
        chain_id   TEXT NOT NULL REFERENCES chains (id),
        seq        INTEGER NOT NULL,
        kind       TEXT NOT NULL,
        body       TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_by TEXT,
        PRIMARY KEY (chain_id, seq)
    ) STRICT, WITHOUT ROWID;
    CREATE TABLE runs (
        id            TEXT PRIMARY KEY NOT NULL,
        session_id    TEXT NOT NULL,
        chain_id      TEXT,
        parent_run_id TEXT,
        depth         INTEGER NOT NULL,
        kind          TEXT NOT NULL,
        harness       TEXT,
        mode          TEXT,
        status        TEXT NOT NULL,
        input         TEXT NOT NULL,
        checkpoint    TEXT NOT NULL,
        summary       TEXT NOT NULL,
        artifacts     TEXT NOT NULL,
        error         TEXT,
        created_by    TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        ended_at      TEXT
    ) STRICT;
    CREATE INDEX runs_by_session ON runs (session_id, created_at);
    CREATE INDEX runs_by_parent ON runs (parent_run_id);
    CREATE TABLE compactions (
        id               TEXT PRIMARY KEY NOT NULL,
        session_id       TEXT NOT NULL,
        source_chain_id  TEXT NOT NULL,
        derived_chain_id TEXT,
        compactor        TEXT NOT NULL,
        status           TEXT NOT NULL,
        token_estimate   INTEGER NOT NULL,
        summary          TEXT NOT NULL,
        diagnostics      TEXT NOT NULL,
        error            TEXT,
        run_id           TEXT,
        created_at       TEXT NOT NULL
    ) STRICT;
    CREATE INDEX compactions_by_session ON compactions (session_id, created_at);
    INSERT INTO chains (id, session_id, status, created_at)
        SELECT 'ch_' || id, id, 'active', created_at FROM sessions;
    UPDATE sessions SET head_chain_id = 'ch_' || id;
    INSERT INTO chain_blocks (chain_id, seq, kind, body, created_at, created_by)
        SELECT 'ch_' || t.session_id,
               ROW_NUMBER() OVER (PARTITION BY t.session_id ORDER BY t.id),
               CASE json_extract(t.body, '$.role')
                   WHEN 'user' THEN 'input'
                   WHEN 'assistant' THEN 'output'
                   WHEN 'tool' THEN 'tool_result'
                   ELSE 'system' END,
               json_patch(
                   json_object('content', json_array(json_object(
                       'type', 'text', 'text', COALESCE(json_extract(t.body, '$.content'), '')))),
                   json_object(
                       'tool_calls', json_extract(t.body, '$.tool_calls'),
                       'call_id', json_extract(t.body, '$.tool_call_id'),
                       'note', CASE WHEN json_extract(t.body, '$.role') = 'system'
                                    THEN json('true') END)),
               COALESCE(json_extract(t.body, '$.at'), s.created_at),
               'agent'
        FROM transcript_entries t JOIN sessions s ON s.id = t.session_id;
    DROP TABLE transcript_entries;
";

/// A block row as read: seq, kind, body, created_at, created_by.
type RawBlock = (i64, String, String, String, Option<String>);

fn corrupt(store: &Store, what: &str, detail: String) -> StoreError {
    StoreError::Corrupt {
        db: store.label().to_owned(),
        plugin_id: what.to_owned(),
        detail,
    }
}

fn json_text(v: &Value) -> String {
    v.to_string()
}

fn parse_json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

fn session_row(r: &Row<'_>) -> rusqlite::Result<SessionInfo> {
    Ok(SessionInfo {
        id: r.get(0)?,
        created_at: r.get(1)?,
        org_id: r.get(2)?,
        project_id: r.get(3)?,
        head_chain_id: r.get(4)?,
    })
}

const SESSION_COLS: &str = "id, created_at, org_id, project_id, head_chain_id";

const CHAIN_COLS: &str =
    "c.id, c.session_id, c.parent_chain_id, c.compaction_id, c.status, c.created_at,
     (SELECT COUNT(*) FROM chain_blocks b WHERE b.chain_id = c.id)";

fn chain_row(r: &Row<'_>) -> rusqlite::Result<Chain> {
    let status: String = r.get(4)?;
    Ok(Chain {
        id: r.get(0)?,
        session_id: r.get(1)?,
        parent_chain_id: r.get(2)?,
        compaction_id: r.get(3)?,
        status: if status == "superseded" {
            ChainStatus::Superseded
        } else {
            ChainStatus::Active
        },
        created_at: r.get(5)?,
        blocks: r.get::<_, i64>(6)?.max(0) as u64,
    })
}

const RUN_COLS: &str =
    "id, session_id, chain_id, parent_run_id, depth, kind, harness, mode, status,
     input, checkpoint, summary, artifacts, error, created_by, created_at, ended_at";

fn run_row(r: &Row<'_>) -> rusqlite::Result<Run> {
    let kind: String = r.get(5)?;
    let status: String = r.get(8)?;
    Ok(Run {
        id: r.get(0)?,
        session_id: r.get(1)?,
        chain_id: r.get(2)?,
        parent_run_id: r.get(3)?,
        depth: r.get::<_, i64>(4)?.clamp(0, i64::from(u32::MAX)) as u32,
        kind: match kind.as_str() {
            "turn" => RunKind::Turn,
            "harness" => RunKind::Harness,
            _ => RunKind::External,
        },
        harness: r.get(6)?,
        mode: r.get(7)?,
        status: RunStatus::parse(&status).unwrap_or(RunStatus::Failed),
        input: parse_json(&r.get::<_, String>(9)?),
        checkpoint: parse_json(&r.get::<_, String>(10)?),
        summary: parse_json(&r.get::<_, String>(11)?),
        artifacts: parse_json(&r.get::<_, String>(12)?),
        error: r.get(13)?,
        created_by: r.get(14)?,
        created_at: r.get(15)?,
        ended_at: r.get(16)?,
    })
}

const COMPACTION_COLS: &str =
    "id, session_id, source_chain_id, derived_chain_id, compactor, status,
     token_estimate, summary, diagnostics, error, run_id, created_at";

fn compaction_row(r: &Row<'_>) -> rusqlite::Result<Compaction> {
    Ok(Compaction {
        id: r.get(0)?,
        session_id: r.get(1)?,
        source_chain_id: r.get(2)?,
        derived_chain_id: r.get(3)?,
        compactor: r.get(4)?,
        status: r.get(5)?,
        token_estimate: r.get::<_, i64>(6)?.max(0) as u64,
        summary: parse_json(&r.get::<_, String>(7)?),
        diagnostics: parse_json(&r.get::<_, String>(8)?),
        error: r.get(9)?,
        run_id: r.get(10)?,
        created_at: r.get(11)?,
    })
}

fn insert_compaction(conn: &Connection, c: &Compaction) -> rusqlite::Result<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO compactions ({COMPACTION_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    ))?
    .execute(params![
        c.id,
        c.session_id,
        c.source_chain_id,
        c.derived_chain_id,
        c.compactor,
        c.status,
        i64::try_from(c.token_estimate).unwrap_or(i64::MAX),
        json_text(&c.summary),
        json_text(&c.diagnostics),
        c.error,
        c.run_id,
        c.created_at,
    ])?;
    Ok(())
}

/// Appends `blocks` after the chain's last seq; the new seqs.
fn append_blocks(
    tx: &Connection,
    chain: &str,
    blocks: &[NewBlock],
    by: &str,
    now: &str,
) -> rusqlite::Result<Vec<u64>> {
    let last: i64 = tx.query_row(
        "SELECT COALESCE(MAX(seq), 0) FROM chain_blocks WHERE chain_id = ?1",
        params![chain],
        |r| r.get(0),
    )?;
    let mut stmt = tx.prepare_cached(
        "INSERT INTO chain_blocks (chain_id, seq, kind, body, created_at, created_by)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut seqs = Vec::with_capacity(blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        let seq = last + 1 + i as i64;
        stmt.execute(params![
            chain,
            seq,
            b.kind.as_str(),
            json_text(&b.body()),
            now,
            by
        ])?;
        seqs.push(seq as u64);
    }
    Ok(seqs)
}

/// Why a chain write was refused (mapped to [`StoreError::Invalid`]).
const SUPERSEDED: &str = "was compacted into a newer chain and is kept read-only; append to the session's head chain (GET /v1/sessions/ID says which)";

impl Store {
    fn block_from_row(&self, chain: &str, r: RawBlock) -> Result<Block, StoreError> {
        let (seq, kind, body, created_at, created_by) = r;
        let kind = BlockKind::parse(&kind).ok_or_else(|| {
            corrupt(
                self,
                &format!("chain {chain}"),
                format!("block {seq} has kind {kind:?}"),
            )
        })?;
        let mut body: Map<String, Value> = match serde_json::from_str(&body) {
            Ok(Value::Object(m)) => m,
            _ => {
                return Err(corrupt(
                    self,
                    &format!("chain {chain}"),
                    format!("block {seq} is not a JSON object"),
                ));
            }
        };
        let content = match body.remove("content") {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        };
        // Migrated transcripts carry null for absent fields.
        body.retain(|_, v| !v.is_null());
        Ok(Block {
            seq: seq.max(0) as u64,
            kind,
            content,
            extra: body,
            created_at,
            created_by,
        })
    }

    /// The head chain of session `id`, creating the session (in the
    /// workspace scope) and its chain when missing.
    pub fn session_head(&self, id: &str) -> Result<String, StoreError> {
        let (info, _) = self.session_open(id, None, None)?;
        info.head_chain_id.ok_or_else(|| StoreError::Invalid {
            what: format!("session {id:?}"),
            problem: "has no head chain; retry",
        })
    }
}

impl Store {
    pub fn session_open(
        &self,
        id: &str,
        org: Option<&str>,
        project: Option<&str>,
    ) -> Result<(SessionInfo, bool), StoreError> {
        check_session_id(id)?;
        let now = crate::now_rfc3339();
        let chain = format!("ch_{id}");
        let action = || format!("open session {id:?}");
        let mut conn = self.lock();
        let write = |conn: &mut Connection| -> rusqlite::Result<(SessionInfo, bool)> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let created = tx.execute(
                "INSERT INTO sessions (id, created_at, org_id, project_id) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO NOTHING",
                params![id, now, org, project],
            )? > 0;
            let head: Option<String> = tx.query_row(
                "SELECT head_chain_id FROM sessions WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )?;
            if head.is_none() {
                // A fresh session, or one from before chains with no
                // transcript: its first chain.
                tx.execute(
                    "INSERT INTO chains (id, session_id, status, created_at) VALUES (?1, ?2, 'active', ?3)
                     ON CONFLICT (id) DO NOTHING",
                    params![chain, id, now],
                )?;
                tx.execute(
                    "UPDATE sessions SET head_chain_id = ?1 WHERE id = ?2",
                    params![chain, id],
                )?;
            }
            let info = tx.query_row(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = ?1"),
                params![id],
                session_row,
            )?;
            tx.commit()?;
            Ok((info, created))
        };
        write(&mut conn).map_err(|e| self.query_error(action(), e))
    }

    pub fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, StoreError> {
        check_session_id(id)?;
        self.lock()
            .query_row(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = ?1"),
                params![id],
                session_row,
            )
            .optional()
            .map_err(|e| self.query_error(format!("read session {id:?}"), e))
    }

    pub fn sessions(
        &self,
        scope: &ScopeFilter,
        limit: usize,
        before: Option<&str>,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        let conn = self.lock();
        let read = || -> rusqlite::Result<Vec<SessionInfo>> {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {SESSION_COLS} FROM sessions
                 WHERE (?1 IS NULL OR (created_at, id) < (SELECT created_at, id FROM sessions WHERE id = ?1))
                 ORDER BY created_at DESC, id DESC"
            ))?;
            let mut out = Vec::new();
            let mut rows = stmt.query(params![before])?;
            while let Some(r) = rows.next()? {
                let s = session_row(r)?;
                if scope.sees(s.org_id.as_deref(), s.project_id.as_deref()) {
                    out.push(s);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
            Ok(out)
        };
        read().map_err(|e| self.query_error("list sessions".to_owned(), e))
    }

    pub fn session_chains(&self, id: &str) -> Result<Vec<Chain>, StoreError> {
        let conn = self.lock();
        let read = || -> rusqlite::Result<Vec<Chain>> {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {CHAIN_COLS} FROM chains c WHERE c.session_id = ?1 ORDER BY c.created_at, c.rowid"
            ))?;
            stmt.query_map(params![id], chain_row)?.collect()
        };
        read().map_err(|e| self.query_error(format!("list the chains of session {id:?}"), e))
    }

    pub fn chain(&self, id: &str) -> Result<Option<Chain>, StoreError> {
        self.lock()
            .query_row(
                &format!("SELECT {CHAIN_COLS} FROM chains c WHERE c.id = ?1"),
                params![id],
                chain_row,
            )
            .optional()
            .map_err(|e| self.query_error(format!("read chain {id:?}"), e))
    }

    pub fn chain_blocks(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Block>, StoreError> {
        let rows = {
            let conn = self.lock();
            let read = || -> rusqlite::Result<Vec<RawBlock>> {
                let mut stmt = conn.prepare_cached(
                    "SELECT seq, kind, body, created_at, created_by FROM chain_blocks
                     WHERE chain_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                )?;
                stmt.query_map(
                    params![
                        id,
                        i64::try_from(after).unwrap_or(i64::MAX),
                        i64::try_from(limit).unwrap_or(i64::MAX)
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )?
                .collect()
            };
            read().map_err(|e| self.query_error(format!("read the blocks of chain {id:?}"), e))?
        };
        rows.into_iter()
            .map(|r| self.block_from_row(id, r))
            .collect()
    }

    pub fn chain_append(
        &self,
        id: &str,
        blocks: &[NewBlock],
        by: &str,
    ) -> Result<Vec<u64>, StoreError> {
        let now = crate::now_rfc3339();
        let action = || format!("append to chain {id:?}");
        let mut conn = self.lock();
        let write =
            |conn: &mut Connection| -> rusqlite::Result<Option<Result<Vec<u64>, &'static str>>> {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let status: Option<String> = tx
                    .query_row(
                        "SELECT status FROM chains WHERE id = ?1",
                        params![id],
                        |r| r.get(0),
                    )
                    .optional()?;
                let Some(status) = status else {
                    return Ok(None);
                };
                if status != "active" {
                    return Ok(Some(Err(SUPERSEDED)));
                }
                let seqs = append_blocks(&tx, id, blocks, by, &now)?;
                tx.commit()?;
                Ok(Some(Ok(seqs)))
            };
        match write(&mut conn).map_err(|e| self.query_error(action(), e))? {
            None => Err(StoreError::NotFound {
                what: format!("chain {id:?}"),
            }),
            Some(Err(problem)) => Err(StoreError::Invalid {
                what: format!("chain {id:?}"),
                problem,
            }),
            Some(Ok(seqs)) => Ok(seqs),
        }
    }

    pub fn chain_derive(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
    ) -> Result<Chain, StoreError> {
        self.chain_derive_reporting(source, seed, compaction, None)
            .map(|(chain, _)| chain)
    }

    /// [`Store::chain_derive`], and the event `report` makes of the derived
    /// chain recorded for `subscribers` in the same transaction: both or
    /// neither.
    pub fn chain_derive_reporting(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
        report: Option<(&Reporter<'_, Chain>, &[Subscriber])>,
    ) -> Result<(Chain, Option<Enqueued>), StoreError> {
        let now = crate::now_rfc3339();
        let derived = compaction
            .derived_chain_id
            .clone()
            .unwrap_or_else(|| plugd_control::chains::fresh_id("ch"));
        let action = || format!("derive a chain from {source:?}");
        let by = format!("compactor:{}", compaction.compactor);
        {
            let mut conn = self.lock();
            let write = |conn: &mut Connection| -> rusqlite::Result<Result<(Chain, Option<Enqueued>), &'static str>> {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let head: Option<Option<String>> = tx
                    .query_row(
                        "SELECT head_chain_id FROM sessions WHERE id = ?1",
                        params![compaction.session_id],
                        |r| r.get(0),
                    )
                    .optional()?;
                if head.flatten().as_deref() != Some(source) {
                    return Ok(Err(
                        "is no longer its session's head chain (another compaction or a new session state won); nothing was changed",
                    ));
                }
                tx.execute(
                    "INSERT INTO chains (id, session_id, parent_chain_id, compaction_id, status, created_at)
                     VALUES (?1, ?2, ?3, ?4, 'active', ?5)",
                    params![derived, compaction.session_id, source, compaction.id, now],
                )?;
                append_blocks(&tx, &derived, seed, &by, &now)?;
                tx.execute(
                    "UPDATE chains SET status = 'superseded' WHERE id = ?1",
                    params![source],
                )?;
                tx.execute(
                    "UPDATE sessions SET head_chain_id = ?1 WHERE id = ?2",
                    params![derived, compaction.session_id],
                )?;
                let mut c = compaction.clone();
                c.derived_chain_id = Some(derived.clone());
                insert_compaction(&tx, &c)?;
                let chain = tx.query_row(
                    &format!("SELECT {CHAIN_COLS} FROM chains c WHERE c.id = ?1"),
                    params![derived],
                    chain_row,
                )?;
                let queued = match report {
                    Some((report, subscribers)) => {
                        let event = report(&chain);
                        if check_event(&event).is_err() {
                            return Ok(Err(
                                "cannot be derived with an event whose type is not a valid name; nothing was changed",
                            ));
                        }
                        Some(enqueue_in(&tx, &event, subscribers)?)
                    }
                    None => None,
                };
                tx.commit()?;
                Ok(Ok((chain, queued)))
            };
            match write(&mut conn).map_err(|e| self.query_error(action(), e))? {
                Ok(done) => Ok(done),
                Err(problem) => Err(StoreError::Invalid {
                    what: format!("chain {source:?}"),
                    problem,
                }),
            }
        }
    }

    pub fn compaction_failed(&self, compaction: &Compaction) -> Result<(), StoreError> {
        let conn = self.lock();
        insert_compaction(&conn, compaction)
            .map_err(|e| self.query_error(format!("record compaction {}", compaction.id), e))
    }

    pub fn compactions(&self, session: &str) -> Result<Vec<Compaction>, StoreError> {
        let conn = self.lock();
        let read = || -> rusqlite::Result<Vec<Compaction>> {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COMPACTION_COLS} FROM compactions WHERE session_id = ?1 ORDER BY created_at DESC, rowid DESC"
            ))?;
            stmt.query_map(params![session], compaction_row)?.collect()
        };
        read().map_err(|e| self.query_error(format!("list the compactions of {session:?}"), e))
    }

    pub fn run_create(&self, run: &Run) -> Result<(), StoreError> {
        let conn = self.lock();
        conn.prepare_cached(&format!(
            "INSERT INTO runs ({RUN_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
        ))
        .and_then(|mut s| {
            s.execute(params![
                run.id,
                run.session_id,
                run.chain_id,
                run.parent_run_id,
                i64::from(run.depth),
                match run.kind {
                    RunKind::Turn => "turn",
                    RunKind::Harness => "harness",
                    RunKind::External => "external",
                },
                run.harness,
                run.mode,
                run.status.as_str(),
                json_text(&run.input),
                json_text(&run.checkpoint),
                json_text(&run.summary),
                json_text(&run.artifacts),
                run.error,
                run.created_by,
                run.created_at,
                run.ended_at,
            ])
        })
        .map(|_| ())
        .map_err(|e| self.query_error(format!("record run {}", run.id), e))
    }

    pub fn run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        self.lock()
            .query_row(
                &format!("SELECT {RUN_COLS} FROM runs WHERE id = ?1"),
                params![id],
                run_row,
            )
            .optional()
            .map_err(|e| self.query_error(format!("read run {id:?}"), e))
    }

    pub fn run_update(&self, id: &str, patch: &RunPatch) -> Result<Option<Run>, StoreError> {
        self.run_finish(id, patch, None).map(|(run, _)| run)
    }

    /// [`Store::run_update`], and the event `report` makes of the run after
    /// it (`None`: no event) recorded for `subscribers` in the same
    /// transaction: a run's final status and its `run.completed` are both
    /// written or neither.
    pub fn run_finish(
        &self,
        id: &str,
        patch: &RunPatch,
        report: Option<(&Reporter<'_, Run>, &[Subscriber])>,
    ) -> Result<(Option<Run>, Option<Enqueued>), StoreError> {
        let now = crate::now_rfc3339();
        {
            let mut conn = self.lock();
            let write =
                |conn: &mut Connection| -> Result<(Option<Run>, Option<Enqueued>), StoreError> {
                    let sql = |e| self.query_error(format!("update run {id:?}"), e);
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .map_err(sql)?;
                    let status: Option<String> = tx
                        .query_row("SELECT status FROM runs WHERE id = ?1", params![id], |r| {
                            r.get(0)
                        })
                        .optional()
                        .map_err(sql)?;
                    let Some(status) = status else {
                        return Ok((None, None));
                    };
                    let ended = RunStatus::parse(&status).is_some_and(RunStatus::is_terminal);
                    if !ended {
                        if let Some(s) = patch.status {
                            tx.execute(
                            "UPDATE runs SET status = ?1, ended_at = CASE WHEN ?2 THEN ?3 ELSE ended_at END WHERE id = ?4",
                            params![s.as_str(), s.is_terminal(), now, id],
                        ).map_err(sql)?;
                        }
                        if let Some(e) = &patch.error {
                            tx.execute("UPDATE runs SET error = ?1 WHERE id = ?2", params![e, id])
                                .map_err(sql)?;
                        }
                        if let Some(c) = &patch.chain_id {
                            tx.execute(
                                "UPDATE runs SET chain_id = ?1 WHERE id = ?2",
                                params![c, id],
                            )
                            .map_err(sql)?;
                        }
                    }
                    // Outputs may still be recorded on an ended run (a harness's
                    // result lands with its terminal status).
                    for (col, v) in [
                        ("checkpoint", &patch.checkpoint),
                        ("summary", &patch.summary),
                        ("artifacts", &patch.artifacts),
                    ] {
                        if let Some(v) = v {
                            tx.execute(
                                &format!("UPDATE runs SET {col} = ?1 WHERE id = ?2"),
                                params![json_text(v), id],
                            )
                            .map_err(sql)?;
                        }
                    }
                    let run = tx
                        .query_row(
                            &format!("SELECT {RUN_COLS} FROM runs WHERE id = ?1"),
                            params![id],
                            run_row,
                        )
                        .map_err(sql)?;
                    let queued = match report {
                        Some((report, subscribers)) => {
                            let event = report(&run);
                            check_event(&event)?;
                            Some(enqueue_in(&tx, &event, subscribers).map_err(sql)?)
                        }
                        None => None,
                    };
                    tx.commit().map_err(sql)?;
                    Ok((Some(run), queued))
                };
            write(&mut conn)
        }
    }

    pub fn runs(
        &self,
        scope: &ScopeFilter,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let conn = self.lock();
        let read = || -> rusqlite::Result<Vec<Run>> {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {} FROM runs r LEFT JOIN sessions s ON s.id = r.session_id
                 WHERE (?1 IS NULL OR r.session_id = ?1)
                 ORDER BY r.created_at DESC, r.rowid DESC",
                RUN_COLS
                    .split(',')
                    .map(|c| format!("r.{}", c.trim()))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + ", s.org_id, s.project_id"
            ))?;
            let mut rows = stmt.query(params![session])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let org: Option<String> = r.get(17)?;
                let project: Option<String> = r.get(18)?;
                if scope.sees(org.as_deref(), project.as_deref()) {
                    out.push(run_row(r)?);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
            Ok(out)
        };
        read().map_err(|e| self.query_error("list runs".to_owned(), e))
    }

    pub fn child_runs(&self, parent: &str) -> Result<u64, StoreError> {
        self.lock()
            .query_row(
                "SELECT COUNT(*) FROM runs WHERE parent_run_id = ?1",
                params![parent],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.query_error(format!("count the child runs of {parent:?}"), e))
    }
}
