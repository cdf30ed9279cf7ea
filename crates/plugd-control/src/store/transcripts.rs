//! Agent sessions' transcripts as the agent turn reads and writes them: the record and the [`TranscriptStore`] trait.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Invalid, StoreError};

/// Longest session id accepted.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Whether `id` is an acceptable session id: 1-128 of `[A-Za-z0-9_.-]`.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SESSION_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// One stored session (without its transcript).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    /// Its id.
    pub id: String,
    /// When it was first stored (RFC 3339).
    pub created_at: String,
}

/// Checks a session id ([`valid_session_id`]).
pub fn check_session_id(id: &str) -> Result<(), Invalid> {
    if valid_session_id(id) {
        Ok(())
    } else {
        Err(Invalid::new(
            format!("session id {id:?}"),
            "use 1-128 characters of letters, digits, '-', '_' and '.'",
        ))
    }
}

/// Sessions seen as transcripts of role entries (over their head chains).
#[async_trait]
pub trait TranscriptStore: Send + Sync {
    /// The session `id`.
    async fn session_get(&self, id: &str) -> Result<Option<SessionRow>, StoreError>;
    /// The session `id`, created when missing; whether this call created it.
    async fn session_ensure(&self, id: &str) -> Result<(SessionRow, bool), StoreError>;
    /// Appends entries to the session's transcript.
    async fn session_append(&self, id: &str, entries: &[Value]) -> Result<(), StoreError>;
    /// Sessions, newest first.
    async fn session_list(&self, limit: usize) -> Result<Vec<SessionRow>, StoreError>;
    /// The entry count and the last `limit` entries.
    async fn session_tail(&self, id: &str, limit: usize)
    -> Result<(usize, Vec<Value>), StoreError>;
    /// Every entry of the transcript.
    async fn session_transcript(&self, id: &str) -> Result<Vec<Value>, StoreError>;
    /// The id of the session's head chain.
    async fn session_head(&self, id: &str) -> Result<String, StoreError>;
}
