//! Long-term agent memory with full-text search (SQLite FTS5): what
//! `memory.recall` (nexo contract §5.2) and `plugd memory` read and write.
//!
//! Entries belong to one agent and are searched only within it. A query is
//! cut into words and matched as "any of them", best match first (BM25), so
//! user text with quotes, operators or punctuation can never be a syntax
//! error.
//!
//! **API boundary:** plain data in and out ([`MemoryEntry`]); nothing
//! SQLite-specific leaks.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use plugd_control::store::memory::{check_agent, check_memory, clip, query_words};

use crate::error::StoreError;
use crate::store::Store;

pub use plugd_control::store::memory::{
    DEFAULT_RECALL_LIMIT, MAX_AGENT_ID_LEN, MAX_MEMORY_BYTES, MAX_RECALL_LIMIT, MAX_TAG_BYTES,
    MAX_TAGS, MemoryEntry, valid_agent_id,
};

/// Schema step: memory entries and their FTS5 index (external content, kept
/// in step by triggers).
pub(crate) const MIGRATION: &str = "
    CREATE TABLE memories (
        seq        INTEGER PRIMARY KEY,
        id         TEXT NOT NULL UNIQUE,
        agent_id   TEXT NOT NULL,
        content    TEXT NOT NULL,
        tags       TEXT NOT NULL DEFAULT '[]',
        created_at TEXT NOT NULL
    ) STRICT;
    CREATE INDEX memories_by_agent ON memories (agent_id, seq);
    CREATE VIRTUAL TABLE memories_fts USING fts5(
        content, tags, content='memories', content_rowid='seq',
        tokenize='unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts (rowid, content, tags) VALUES (new.seq, new.content, new.tags);
    END;
    CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, content, tags)
            VALUES ('delete', old.seq, old.content, old.tags);
    END;
";

/// The FTS5 query for `text`: each word quoted, joined with OR; `None` when
/// the text has no word at all.
fn match_expr(text: &str) -> Option<String> {
    let words: Vec<String> = query_words(text)
        .into_iter()
        .map(|w| format!("\"{w}\""))
        .collect();
    (!words.is_empty()).then(|| words.join(" OR "))
}

fn entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<MemoryEntry> {
    let tags: String = r.get(3)?;
    Ok(MemoryEntry {
        id: r.get(0)?,
        agent_id: r.get(1)?,
        content: r.get(2)?,
        tags: serde_json::from_str(&tags).unwrap_or_default(),
        created_at: r.get(4)?,
    })
}

impl Store {
    /// Stores a memory for `agent_id`.
    pub fn memory_add(
        &self,
        agent_id: &str,
        content: &str,
        tags: &[String],
    ) -> Result<MemoryEntry, StoreError> {
        check_memory(agent_id, content, tags)?;
        let tags_json = serde_json::to_string(tags).unwrap_or_else(|_| "[]".into());
        let now = crate::now_rfc3339();
        let action = || format!("store a memory for agent {agent_id:?}");
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let stored = tx
            .query_row(
                "INSERT INTO memories (id, agent_id, content, tags, created_at)
                 VALUES ('mem_' || lower(hex(randomblob(8))), ?1, ?2, ?3, ?4)
                 RETURNING id, agent_id, content, tags, created_at",
                params![agent_id, content, tags_json, now],
                entry,
            )
            .map_err(|e| self.query_error(action(), e))?;
        tx.commit().map_err(|e| self.query_error(action(), e))?;
        Ok(stored)
    }

    /// The entries of `agent_id` that match any word of `query`, best first;
    /// at most `limit` (default [`DEFAULT_RECALL_LIMIT`], capped at
    /// [`MAX_RECALL_LIMIT`]). A query without words matches nothing.
    pub fn memory_search(
        &self,
        agent_id: &str,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryEntry>, StoreError> {
        check_agent(agent_id)?;
        let limit = limit.unwrap_or(DEFAULT_RECALL_LIMIT).min(MAX_RECALL_LIMIT);
        let Some(expr) = match_expr(query) else {
            return Ok(Vec::new());
        };
        let action = || format!("search the memories of agent {agent_id:?}");
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT m.id, m.agent_id, m.content, m.tags, m.created_at
                 FROM memories_fts f JOIN memories m ON m.seq = f.rowid
                 WHERE memories_fts MATCH ?1 AND m.agent_id = ?2
                 ORDER BY bm25(memories_fts), m.seq DESC
                 LIMIT ?3",
            )
            .map_err(|e| self.query_error(action(), e))?;
        let rows = stmt
            .query_map(params![expr, agent_id, limit as i64], entry)
            .and_then(Iterator::collect)
            .map_err(|e| self.query_error(action(), e))?;
        Ok(rows)
    }

    /// The newest entries of `agent_id`, newest first, at most `limit`
    /// (capped at [`MAX_RECALL_LIMIT`]).
    pub fn memory_list(
        &self,
        agent_id: &str,
        limit: usize,
    ) -> Result<Vec<MemoryEntry>, StoreError> {
        check_agent(agent_id)?;
        let action = || format!("list the memories of agent {agent_id:?}");
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, agent_id, content, tags, created_at FROM memories
                 WHERE agent_id = ?1 ORDER BY seq DESC LIMIT ?2",
            )
            .map_err(|e| self.query_error(action(), e))?;
        let rows = stmt
            .query_map(params![agent_id, limit.min(MAX_RECALL_LIMIT) as i64], entry)
            .and_then(Iterator::collect)
            .map_err(|e| self.query_error(action(), e))?;
        Ok(rows)
    }

    /// Memory `id`, if there is one.
    pub fn memory_get(&self, id: &str) -> Result<Option<MemoryEntry>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, agent_id, content, tags, created_at FROM memories WHERE id = ?1",
            )
            .map_err(|e| self.query_error(format!("read memory {:?}", clip(id)), e))?;
        stmt.query_row(params![id], entry)
            .optional()
            .map_err(|e| self.query_error(format!("read memory {:?}", clip(id)), e))
    }

    /// Deletes memory `id`; `false` when there was none.
    pub fn memory_delete(&self, id: &str) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute("DELETE FROM memories WHERE id = ?1", params![id])
            .map_err(|e| self.query_error(format!("delete memory {:?}", clip(id)), e))?;
        Ok(n > 0)
    }
}
