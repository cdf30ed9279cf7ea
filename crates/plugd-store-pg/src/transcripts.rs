//! Agent sessions read and written as transcripts on PostgreSQL: a view of
//! each session's head chain, as `plugd-store`'s `sessions.rs` (the same
//! entry ↔ block mapping, `entry_blocks` and `block_entries`).

use plugd_control::chains::{NewBlock, ScopeFilter};
use plugd_control::store::transcripts::SessionRow;
// The entry <-> block mapping is plugd-store's (shared with SQLite).
use plugd_store::sessions::{block_entries, entry_blocks};
use serde_json::Value;

use crate::{PgError, PgStore};

impl PgStore {
    /// The session `id`, if stored.
    pub async fn session_get(&self, id: &str) -> Result<Option<SessionRow>, PgError> {
        Ok(self.session_info(id).await?.map(|s| SessionRow {
            id: s.id,
            created_at: s.created_at,
        }))
    }

    /// Stores session `id` (with its first chain) unless it exists; the row
    /// and whether this call created it.
    pub async fn session_ensure(&self, id: &str) -> Result<(SessionRow, bool), PgError> {
        let (s, created) = self.session_open(id, None, None).await?;
        Ok((
            SessionRow {
                id: s.id,
                created_at: s.created_at,
            },
            created,
        ))
    }

    /// Appends `entries` to the head chain of session `id`, in one
    /// transaction. A compaction that moves the head between reading it and
    /// appending (another node) is followed once: the entries land on the
    /// new head.
    pub async fn session_append(&self, id: &str, entries: &[Value]) -> Result<(), PgError> {
        let blocks: Vec<NewBlock> = entries.iter().flat_map(entry_blocks).collect();
        let mut tries = 0;
        loop {
            let head = self.session_head(id).await?;
            match self.chain_append(&head, &blocks, "agent").await {
                Err(PgError::Invalid { .. }) if tries == 0 => tries += 1,
                other => return other.map(|_| ()),
            }
        }
    }

    /// The stored sessions, newest first, at most `limit`.
    pub async fn session_list(&self, limit: usize) -> Result<Vec<SessionRow>, PgError> {
        Ok(self
            .sessions(&ScopeFilter::default(), limit, None)
            .await?
            .into_iter()
            .map(|s| SessionRow {
                id: s.id,
                created_at: s.created_at,
            })
            .collect())
    }

    /// How many entries the transcript of session `id` has, and its last
    /// `limit` entries, oldest first.
    pub async fn session_tail(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<(usize, Vec<Value>), PgError> {
        let all = self.session_transcript(id).await?;
        let total = all.len();
        let skip = total.saturating_sub(limit);
        Ok((total, all.into_iter().skip(skip).collect()))
    }

    /// The transcript of session `id` (its head chain as entries), oldest
    /// first; empty when unknown.
    pub async fn session_transcript(&self, id: &str) -> Result<Vec<Value>, PgError> {
        let Some(head) = self.session_info(id).await?.and_then(|i| i.head_chain_id) else {
            return Ok(Vec::new());
        };
        let blocks = self.chain_blocks(&head, 0, usize::MAX).await?;
        Ok(block_entries(&blocks))
    }
}
