//! Sessions, chains of blocks, runs and compactions on PostgreSQL
//! (`plugd-control`'s `ChainStore` operations).
//!
//! Same rows and meaning as `plugd-store`'s `chains.rs`. The transactions
//! that rely on SQLite's single writer there take row locks here:
//! - appending locks the chain row (`FOR UPDATE`), so appends to one chain
//!   queue and each batch gets consecutive numbers after the last;
//! - deriving (a compaction) locks the session row, checks that the source
//!   is still its head, locks the source chain (waiting for appends in
//!   flight), then inserts the derived chain, supersedes the source, moves
//!   the head and records the compaction: of two compactions of one head
//!   exactly one wins;
//! - opening a session inserts it `ON CONFLICT DO NOTHING` and locks it
//!   before giving it its first chain;
//! - updating a run locks it, so its end is recorded once.
//!
//! Times written here (sessions, chains, blocks, a run's end) are the
//! database's.

use deadpool_postgres::GenericClient;
use plugd_control::chains::{
    Block, BlockKind, Chain, ChainStatus, Compaction, NewBlock, Run, RunKind, RunPatch, RunStatus,
    ScopeFilter, SessionInfo,
};
use plugd_control::store::outbox::{Enqueued, Reporter, Subscriber};
use plugd_control::store::transcripts::check_session_id;
use serde_json::{Map, Value};
use tokio_postgres::Row;

use crate::clock::NOW_RFC3339;
use crate::{PgError, PgStore};

const SESSION_COLS: &str = "id, created_at, org_id, project_id, head_chain_id";

const CHAIN_COLS: &str =
    "c.id, c.session_id, c.parent_chain_id, c.compaction_id, c.status, c.created_at,
     (SELECT count(*) FROM chain_blocks b WHERE b.chain_id = c.id)";

const RUN_COLS: &str =
    "id, session_id, chain_id, parent_run_id, depth, kind, harness, mode, status,
     input, checkpoint, summary, artifacts, error, created_by, created_at, ended_at";

const COMPACTION_COLS: &str =
    "id, session_id, source_chain_id, derived_chain_id, compactor, status,
     token_estimate, summary, diagnostics, error, run_id, created_at";

/// Why a write to a superseded chain was refused.
const SUPERSEDED: &str = "was compacted into a newer chain and is kept read-only; append to the session's head chain (GET /v1/sessions/ID says which)";

/// The scope rule of [`ScopeFilter::sees`] in SQL over `org` and `project`
/// columns, with `$1` the org, `$2` workspace-only and `$3` the projects.
fn scope_sql(org: &str, project: &str) -> String {
    format!(
        "(($1::text IS NULL AND (NOT $2::bool OR {org} IS NULL))
          OR ({org} = $1 AND (cardinality($3::text[]) = 0 OR {project} = ANY($3))))"
    )
}

fn parse_json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

fn session_row(r: &Row) -> SessionInfo {
    SessionInfo {
        id: r.get(0),
        created_at: r.get(1),
        org_id: r.get(2),
        project_id: r.get(3),
        head_chain_id: r.get(4),
    }
}

fn chain_row(r: &Row) -> Chain {
    let status: &str = r.get(4);
    Chain {
        id: r.get(0),
        session_id: r.get(1),
        parent_chain_id: r.get(2),
        compaction_id: r.get(3),
        status: if status == "superseded" {
            ChainStatus::Superseded
        } else {
            ChainStatus::Active
        },
        created_at: r.get(5),
        blocks: r.get::<_, i64>(6).max(0) as u64,
    }
}

fn run_row(r: &Row) -> Run {
    let kind: &str = r.get(5);
    let status: &str = r.get(8);
    Run {
        id: r.get(0),
        session_id: r.get(1),
        chain_id: r.get(2),
        parent_run_id: r.get(3),
        depth: r.get::<_, i64>(4).clamp(0, i64::from(u32::MAX)) as u32,
        kind: match kind {
            "turn" => RunKind::Turn,
            "harness" => RunKind::Harness,
            _ => RunKind::External,
        },
        harness: r.get(6),
        mode: r.get(7),
        status: RunStatus::parse(status).unwrap_or(RunStatus::Failed),
        input: parse_json(r.get(9)),
        checkpoint: parse_json(r.get(10)),
        summary: parse_json(r.get(11)),
        artifacts: parse_json(r.get(12)),
        error: r.get(13),
        created_by: r.get(14),
        created_at: r.get(15),
        ended_at: r.get(16),
    }
}

fn compaction_row(r: &Row) -> Compaction {
    Compaction {
        id: r.get(0),
        session_id: r.get(1),
        source_chain_id: r.get(2),
        derived_chain_id: r.get(3),
        compactor: r.get(4),
        status: r.get(5),
        token_estimate: r.get::<_, i64>(6).max(0) as u64,
        summary: parse_json(r.get(7)),
        diagnostics: parse_json(r.get(8)),
        error: r.get(9),
        run_id: r.get(10),
        created_at: r.get(11),
    }
}

async fn insert_compaction(
    client: &impl GenericClient,
    c: &Compaction,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            &format!(
                "INSERT INTO compactions ({COMPACTION_COLS})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
            ),
            &[
                &c.id,
                &c.session_id,
                &c.source_chain_id,
                &c.derived_chain_id,
                &c.compactor,
                &c.status,
                &i64::try_from(c.token_estimate).unwrap_or(i64::MAX),
                &c.summary.to_string(),
                &c.diagnostics.to_string(),
                &c.error,
                &c.run_id,
                &c.created_at,
            ],
        )
        .await
}

/// Appends `blocks` after the chain's last seq (the caller holds the
/// chain's row lock); the new seqs.
async fn append_blocks(
    client: &impl GenericClient,
    chain: &str,
    blocks: &[NewBlock],
    by: &str,
) -> Result<Vec<u64>, tokio_postgres::Error> {
    if blocks.is_empty() {
        return Ok(Vec::new());
    }
    let kinds: Vec<&str> = blocks.iter().map(|b| b.kind.as_str()).collect();
    let bodies: Vec<String> = blocks.iter().map(|b| b.body().to_string()).collect();
    let rows = client
        .query(
            &format!(
                "INSERT INTO chain_blocks (chain_id, seq, kind, body, created_at, created_by)
                 SELECT $1, last.seq + b.n, b.kind, b.body, {NOW_RFC3339}, $4
                 FROM (SELECT COALESCE(max(seq), 0) AS seq FROM chain_blocks WHERE chain_id = $1) last,
                      unnest($2::text[], $3::text[]) WITH ORDINALITY AS b(kind, body, n)
                 RETURNING seq"
            ),
            &[&chain, &kinds, &bodies, &by],
        )
        .await?;
    let mut seqs: Vec<u64> = rows
        .iter()
        .map(|r| r.get::<_, i64>(0).max(0) as u64)
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

impl PgStore {
    fn block_from_row(&self, chain: &str, r: &Row) -> Result<Block, PgError> {
        let seq: i64 = r.get(0);
        let damaged = |detail: String| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("chain {chain}"),
            detail,
        };
        let kind: &str = r.get(1);
        let kind = BlockKind::parse(kind)
            .ok_or_else(|| damaged(format!("block {seq} has kind {kind:?}")))?;
        let mut body: Map<String, Value> = match serde_json::from_str(r.get(2)) {
            Ok(Value::Object(m)) => m,
            _ => return Err(damaged(format!("block {seq} is not a JSON object"))),
        };
        let content = match body.remove("content") {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        };
        body.retain(|_, v| !v.is_null());
        Ok(Block {
            seq: seq.max(0) as u64,
            kind,
            content,
            extra: body,
            created_at: r.get(3),
            created_by: r.get(4),
        })
    }

    /// Opens session `id` (created in `org`/`project` when new, with its
    /// first chain); the session and whether it was created.
    pub async fn session_open(
        &self,
        id: &str,
        org: Option<&str>,
        project: Option<&str>,
    ) -> Result<(SessionInfo, bool), PgError> {
        check_session_id(id)?;
        let chain = format!("ch_{id}");
        let action = || format!("open session {id:?}");
        let err = |e| self.query_error(action(), e);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        let created = tx
            .execute(
                &format!(
                    "INSERT INTO sessions (id, created_at, org_id, project_id)
                     VALUES ($1, {NOW_RFC3339}, $2, $3) ON CONFLICT (id) DO NOTHING"
                ),
                &[&id, &org, &project],
            )
            .await
            .map_err(err)?
            > 0;
        let head: Option<String> = tx
            .query_one(
                "SELECT head_chain_id FROM sessions WHERE id = $1 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(err)?
            .get(0);
        if head.is_none() {
            tx.execute(
                &format!(
                    "INSERT INTO chains (id, session_id, status, created_at)
                     VALUES ($1, $2, 'active', {NOW_RFC3339}) ON CONFLICT (id) DO NOTHING"
                ),
                &[&chain, &id],
            )
            .await
            .map_err(err)?;
            tx.execute(
                "UPDATE sessions SET head_chain_id = $1 WHERE id = $2",
                &[&chain, &id],
            )
            .await
            .map_err(err)?;
        }
        let info = tx
            .query_one(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok((session_row(&info), created))
    }

    /// The head chain of session `id`, creating the session (in the
    /// workspace scope) and its chain when missing.
    pub async fn session_head(&self, id: &str) -> Result<String, PgError> {
        let (info, _) = self.session_open(id, None, None).await?;
        info.head_chain_id.ok_or_else(|| PgError::Invalid {
            what: format!("session {id:?}"),
            problem: "has no head chain; retry",
        })
    }

    /// Session `id`, if stored.
    pub async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, PgError> {
        check_session_id(id)?;
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(format!("read session {id:?}"), e))?;
        Ok(row.as_ref().map(session_row))
    }

    /// The sessions `scope` sees, newest first, at most `limit`, older than
    /// session `before` when given.
    pub async fn sessions(
        &self,
        scope: &ScopeFilter,
        limit: usize,
        before: Option<&str>,
    ) -> Result<Vec<SessionInfo>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {SESSION_COLS} FROM sessions
                     WHERE ($4::text IS NULL
                            OR (created_at, id) < (SELECT created_at, id FROM sessions WHERE id = $4))
                       AND {}
                     ORDER BY created_at DESC, id DESC LIMIT $5",
                    scope_sql("org_id", "project_id")
                ),
                &[
                    &scope.org_id,
                    &scope.workspace_only,
                    &scope.project_ids,
                    &before,
                    &i64::try_from(limit).unwrap_or(i64::MAX),
                ],
            )
            .await
            .map_err(|e| self.query_error("list sessions", e))?;
        Ok(rows.iter().map(session_row).collect())
    }

    /// The chains of session `id`, oldest first.
    pub async fn session_chains(&self, id: &str) -> Result<Vec<Chain>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {CHAIN_COLS} FROM chains c WHERE c.session_id = $1
                     ORDER BY c.created_at, c.rowid"
                ),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(format!("list the chains of session {id:?}"), e))?;
        Ok(rows.iter().map(chain_row).collect())
    }

    /// Chain `id`.
    pub async fn chain(&self, id: &str) -> Result<Option<Chain>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {CHAIN_COLS} FROM chains c WHERE c.id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(format!("read chain {id:?}"), e))?;
        Ok(row.as_ref().map(chain_row))
    }

    /// Up to `limit` blocks of chain `id` after seq `after`, in order.
    pub async fn chain_blocks(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Block>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, kind, body, created_at, created_by FROM chain_blocks
                 WHERE chain_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                &[
                    &id,
                    &i64::try_from(after).unwrap_or(i64::MAX),
                    &i64::try_from(limit).unwrap_or(i64::MAX),
                ],
            )
            .await
            .map_err(|e| self.query_error(format!("read the blocks of chain {id:?}"), e))?;
        rows.iter().map(|r| self.block_from_row(id, r)).collect()
    }

    /// Appends `blocks` to the active chain `id`; their seqs.
    pub async fn chain_append(
        &self,
        id: &str,
        blocks: &[NewBlock],
        by: &str,
    ) -> Result<Vec<u64>, PgError> {
        let action = || format!("append to chain {id:?}");
        let err = |e| self.query_error(action(), e);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        let status = tx
            .query_opt("SELECT status FROM chains WHERE id = $1 FOR UPDATE", &[&id])
            .await
            .map_err(err)?;
        let Some(status) = status else {
            return Err(PgError::NotFound {
                what: format!("chain {id:?}"),
            });
        };
        if status.get::<_, &str>(0) != "active" {
            return Err(PgError::Invalid {
                what: format!("chain {id:?}"),
                problem: SUPERSEDED,
            });
        }
        let seqs = append_blocks(&tx, id, blocks, by).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(seqs)
    }

    /// Compacts: derives a new head chain from `source` (seeded with
    /// `seed`), supersedes `source` and records `compaction`, in one
    /// transaction; refused when `source` is no longer the session's head.
    pub async fn chain_derive(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
    ) -> Result<Chain, PgError> {
        Ok(self
            .chain_derive_reporting(source, seed, compaction, None)
            .await?
            .0)
    }

    /// [`PgStore::chain_derive`], and the event `report` makes of the
    /// derived chain recorded for `subscribers` in the same transaction.
    pub async fn chain_derive_reporting(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
        report: Option<(&Reporter<'_, Chain>, &[Subscriber])>,
    ) -> Result<(Chain, Option<Enqueued>), PgError> {
        let derived = match &compaction.derived_chain_id {
            Some(id) => id.clone(),
            None => plugd_control::chains::fresh_id("ch"),
        };
        let action = || format!("derive a chain from {source:?}");
        let err = |e| self.query_error(action(), e);
        let by = format!("compactor:{}", compaction.compactor);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        let head: Option<String> = tx
            .query_opt(
                "SELECT head_chain_id FROM sessions WHERE id = $1 FOR UPDATE",
                &[&compaction.session_id],
            )
            .await
            .map_err(err)?
            .and_then(|r| r.get(0));
        if head.as_deref() != Some(source) {
            return Err(PgError::Invalid {
                what: format!("chain {source:?}"),
                problem: "is no longer its session's head chain (another compaction or a new session state won); nothing was changed",
            });
        }
        // Wait for appends in flight to the source.
        tx.query_opt("SELECT 1 FROM chains WHERE id = $1 FOR UPDATE", &[&source])
            .await
            .map_err(err)?;
        tx.execute(
            &format!(
                "INSERT INTO chains (id, session_id, parent_chain_id, compaction_id, status, created_at)
                 VALUES ($1, $2, $3, $4, 'active', {NOW_RFC3339})"
            ),
            &[&derived, &compaction.session_id, &source, &compaction.id],
        )
        .await
        .map_err(err)?;
        append_blocks(&tx, &derived, seed, &by).await.map_err(err)?;
        tx.execute(
            "UPDATE chains SET status = 'superseded' WHERE id = $1",
            &[&source],
        )
        .await
        .map_err(err)?;
        tx.execute(
            "UPDATE sessions SET head_chain_id = $1 WHERE id = $2",
            &[&derived, &compaction.session_id],
        )
        .await
        .map_err(err)?;
        let mut c = compaction.clone();
        c.derived_chain_id = Some(derived.clone());
        insert_compaction(&tx, &c).await.map_err(err)?;
        let chain = tx
            .query_one(
                &format!("SELECT {CHAIN_COLS} FROM chains c WHERE c.id = $1"),
                &[&derived],
            )
            .await
            .map_err(err)?;
        let chain = chain_row(&chain);
        let queued = match report {
            Some((report, subscribers)) => {
                Some(self.enqueue_in(&tx, &report(&chain), subscribers).await?)
            }
            None => None,
        };
        tx.commit().await.map_err(err)?;
        Ok((chain, queued))
    }

    /// Records a compaction that failed (no chain changed).
    pub async fn compaction_failed(&self, compaction: &Compaction) -> Result<(), PgError> {
        let client = self.client().await?;
        insert_compaction(&client, compaction)
            .await
            .map_err(|e| self.query_error(format!("record compaction {}", compaction.id), e))?;
        Ok(())
    }

    /// The compactions of `session`, newest first.
    pub async fn compactions(&self, session: &str) -> Result<Vec<Compaction>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {COMPACTION_COLS} FROM compactions WHERE session_id = $1
                     ORDER BY created_at DESC, rowid DESC"
                ),
                &[&session],
            )
            .await
            .map_err(|e| self.query_error(format!("list the compactions of {session:?}"), e))?;
        Ok(rows.iter().map(compaction_row).collect())
    }

    /// Records a new run.
    pub async fn run_create(&self, run: &Run) -> Result<(), PgError> {
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO runs ({RUN_COLS}) VALUES
                     ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
                ),
                &[
                    &run.id,
                    &run.session_id,
                    &run.chain_id,
                    &run.parent_run_id,
                    &i64::from(run.depth),
                    &match run.kind {
                        RunKind::Turn => "turn",
                        RunKind::Harness => "harness",
                        RunKind::External => "external",
                    },
                    &run.harness,
                    &run.mode,
                    &run.status.as_str(),
                    &run.input.to_string(),
                    &run.checkpoint.to_string(),
                    &run.summary.to_string(),
                    &run.artifacts.to_string(),
                    &run.error,
                    &run.created_by,
                    &run.created_at,
                    &run.ended_at,
                ],
            )
            .await
            .map_err(|e| self.query_error(format!("record run {}", run.id), e))?;
        Ok(())
    }

    /// Run `id`.
    pub async fn run(&self, id: &str) -> Result<Option<Run>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {RUN_COLS} FROM runs WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(format!("read run {id:?}"), e))?;
        Ok(row.as_ref().map(run_row))
    }

    /// Applies `patch` to run `id` under its row lock: status, error and
    /// chain only while it has not ended (its end, stamped by the
    /// database's clock, is recorded once); outputs always. The run as it is
    /// now.
    pub async fn run_update(&self, id: &str, patch: &RunPatch) -> Result<Option<Run>, PgError> {
        Ok(self.run_finish(id, patch, None).await?.map(|(run, _)| run))
    }

    /// [`PgStore::run_update`], and the event `report` makes of the run
    /// after it recorded for `subscribers` in the same transaction.
    pub async fn run_finish(
        &self,
        id: &str,
        patch: &RunPatch,
        report: Option<(&Reporter<'_, Run>, &[Subscriber])>,
    ) -> Result<Option<(Run, Option<Enqueued>)>, PgError> {
        let action = || format!("update run {id:?}");
        let err = |e| self.query_error(action(), e);
        {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(err)?;
            let status = tx
                .query_opt("SELECT status FROM runs WHERE id = $1 FOR UPDATE", &[&id])
                .await
                .map_err(err)?;
            let Some(status) = status else {
                return Ok(None);
            };
            let ended = RunStatus::parse(status.get(0)).is_some_and(RunStatus::is_terminal);
            if !ended {
                if let Some(s) = patch.status {
                    tx.execute(
                        &format!(
                            "UPDATE runs SET status = $1,
                                ended_at = CASE WHEN $2 THEN {NOW_RFC3339} ELSE ended_at END
                             WHERE id = $3"
                        ),
                        &[&s.as_str(), &s.is_terminal(), &id],
                    )
                    .await
                    .map_err(err)?;
                }
                if let Some(e) = &patch.error {
                    tx.execute("UPDATE runs SET error = $1 WHERE id = $2", &[e, &id])
                        .await
                        .map_err(err)?;
                }
                if let Some(c) = &patch.chain_id {
                    tx.execute("UPDATE runs SET chain_id = $1 WHERE id = $2", &[c, &id])
                        .await
                        .map_err(err)?;
                }
            }
            for (col, v) in [
                ("checkpoint", &patch.checkpoint),
                ("summary", &patch.summary),
                ("artifacts", &patch.artifacts),
            ] {
                if let Some(v) = v {
                    tx.execute(
                        &format!("UPDATE runs SET {col} = $1 WHERE id = $2"),
                        &[&v.to_string(), &id],
                    )
                    .await
                    .map_err(err)?;
                }
            }
            let run = tx
                .query_one(
                    &format!("SELECT {RUN_COLS} FROM runs WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(err)?;
            let run = run_row(&run);
            let queued = match report {
                Some((report, subscribers)) => {
                    Some(self.enqueue_in(&tx, &report(&run), subscribers).await?)
                }
                None => None,
            };
            tx.commit().await.map_err(err)?;
            Ok(Some((run, queued)))
        }
    }

    /// The runs `scope` sees (by their session's scope), of `session` when
    /// given, newest first, at most `limit`.
    pub async fn runs(
        &self,
        scope: &ScopeFilter,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Run>, PgError> {
        let cols = RUN_COLS
            .split(',')
            .map(|c| format!("r.{}", c.trim()))
            .collect::<Vec<_>>()
            .join(", ");
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {cols} FROM runs r LEFT JOIN sessions s ON s.id = r.session_id
                     WHERE ($4::text IS NULL OR r.session_id = $4) AND {}
                     ORDER BY r.created_at DESC, r.rowid DESC LIMIT $5",
                    scope_sql("s.org_id", "s.project_id")
                ),
                &[
                    &scope.org_id,
                    &scope.workspace_only,
                    &scope.project_ids,
                    &session,
                    &i64::try_from(limit).unwrap_or(i64::MAX),
                ],
            )
            .await
            .map_err(|e| self.query_error("list runs", e))?;
        Ok(rows.iter().map(run_row).collect())
    }

    /// How many runs have `parent` as their parent.
    pub async fn child_runs(&self, parent: &str) -> Result<u64, PgError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM runs WHERE parent_run_id = $1",
                &[&parent],
            )
            .await
            .map_err(|e| self.query_error(format!("count the child runs of {parent:?}"), e))?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }
}
