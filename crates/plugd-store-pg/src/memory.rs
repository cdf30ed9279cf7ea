//! Long-term agent memory on PostgreSQL, searched through the generated
//! `tsvector` column `memories.search` (GIN index) instead of SQLite's FTS5.
//!
//! Same operations, limits and meaning as `plugd-store`'s `memory.rs`: a
//! query is cut into words (runs of letters and digits, at most 32), so user
//! text is never query syntax, and any word may match; results best first
//! (`ts_rank`, then newest). Known difference: FTS5's `remove_diacritics`
//! has no counterpart yet (`ümlaut` does not find `umlaut`).

use plugd_control::store::memory::{
    DEFAULT_RECALL_LIMIT, MAX_RECALL_LIMIT, MemoryEntry, check_agent, check_memory, clip,
    query_words,
};

use crate::clock::{NOW_RFC3339, random_hex};
use crate::{PgError, PgStore};

const COLUMNS: &str = "id, agent_id, content, tags, created_at";

/// The `to_tsquery` text for `text`: its words joined with `|`; `None` when
/// it has no word. Words are letters and digits only, so nothing in them is
/// tsquery syntax.
fn query_text(text: &str) -> Option<String> {
    let words = query_words(text);
    (!words.is_empty()).then(|| words.join(" | "))
}

fn entry(r: &tokio_postgres::Row) -> MemoryEntry {
    let tags: &str = r.get(3);
    MemoryEntry {
        id: r.get(0),
        agent_id: r.get(1),
        content: r.get(2),
        tags: serde_json::from_str(tags).unwrap_or_default(),
        created_at: r.get(4),
    }
}

impl PgStore {
    /// Stores a memory for `agent_id`, stamped by the database's clock.
    pub async fn memory_add(
        &self,
        agent_id: &str,
        content: &str,
        tags: &[String],
    ) -> Result<MemoryEntry, PgError> {
        check_memory(agent_id, content, tags)?;
        let tags_json = serde_json::to_string(tags).unwrap_or_else(|_| "[]".into());
        let id = format!("mem_{}", random_hex(8)?);
        let client = self.client().await?;
        let row = client
            .query_one(
                &format!(
                    "INSERT INTO memories (id, agent_id, content, tags, created_at)
                     VALUES ($1, $2, $3, $4, {NOW_RFC3339}) RETURNING {COLUMNS}"
                ),
                &[&id, &agent_id, &content, &tags_json],
            )
            .await
            .map_err(|e| self.query_error(format!("store a memory for agent {agent_id:?}"), e))?;
        Ok(entry(&row))
    }

    /// The entries of `agent_id` that match any word of `query`, best first;
    /// at most `limit` (default [`DEFAULT_RECALL_LIMIT`], capped at
    /// [`MAX_RECALL_LIMIT`]). A query without words matches nothing.
    pub async fn memory_search(
        &self,
        agent_id: &str,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryEntry>, PgError> {
        check_agent(agent_id)?;
        let limit = limit.unwrap_or(DEFAULT_RECALL_LIMIT).min(MAX_RECALL_LIMIT);
        let Some(text) = query_text(query) else {
            return Ok(Vec::new());
        };
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM memories, to_tsquery('simple'::regconfig, $1) AS q
                     WHERE agent_id = $2 AND search @@ q
                     ORDER BY ts_rank(search, q) DESC, seq DESC
                     LIMIT $3"
                ),
                &[&text, &agent_id, &(limit as i64)],
            )
            .await
            .map_err(|e| {
                self.query_error(format!("search the memories of agent {agent_id:?}"), e)
            })?;
        Ok(rows.iter().map(entry).collect())
    }

    /// The newest entries of `agent_id`, newest first, at most `limit`
    /// (capped at [`MAX_RECALL_LIMIT`]).
    pub async fn memory_list(
        &self,
        agent_id: &str,
        limit: usize,
    ) -> Result<Vec<MemoryEntry>, PgError> {
        check_agent(agent_id)?;
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM memories WHERE agent_id = $1 ORDER BY seq DESC LIMIT $2"
                ),
                &[&agent_id, &(limit.min(MAX_RECALL_LIMIT) as i64)],
            )
            .await
            .map_err(|e| self.query_error(format!("list the memories of agent {agent_id:?}"), e))?;
        Ok(rows.iter().map(entry).collect())
    }

    /// Memory `id`, if there is one.
    pub async fn memory_get(&self, id: &str) -> Result<Option<MemoryEntry>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM memories WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(format!("read memory {:?}", clip(id)), e))?;
        Ok(row.as_ref().map(entry))
    }

    /// Deletes memory `id`; `false` when there was none.
    pub async fn memory_delete(&self, id: &str) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute("DELETE FROM memories WHERE id = $1", &[&id])
            .await
            .map_err(|e| self.query_error(format!("delete memory {:?}", clip(id)), e))?;
        Ok(n > 0)
    }
}
