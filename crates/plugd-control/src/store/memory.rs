//! Long-term agent memory with full-text recall: the record and the [`MemoryStore`] trait.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Invalid, StoreError};

/// Results returned when a caller gives no limit (§5.2).
pub const DEFAULT_RECALL_LIMIT: usize = 10;

/// Hard cap on results, whatever the caller asks (§5.2).
pub const MAX_RECALL_LIMIT: usize = 1000;

/// Longest entry content, in bytes.
pub const MAX_MEMORY_BYTES: usize = 64 * 1024;

/// Most tags on one entry.
pub const MAX_TAGS: usize = 32;

/// Longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 64;

/// Longest agent id.
pub const MAX_AGENT_ID_LEN: usize = 128;

/// One memory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEntry {
    /// Its id (`mem_` and 16 hex digits).
    pub id: String,
    /// The agent it belongs to.
    pub agent_id: String,
    /// What to remember.
    pub content: String,
    /// Free-form labels (also searched).
    pub tags: Vec<String>,
    /// When it was stored (RFC 3339).
    pub created_at: String,
}

/// Whether `id` is an acceptable agent id: 1-128 of `[A-Za-z0-9_.:-]`.
pub fn valid_agent_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_AGENT_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
}

/// Most words of a recall query used for matching (the rest are ignored).
pub const MAX_QUERY_TERMS: usize = 32;

/// The words a recall query matches on: runs of letters and digits (so none
/// is query syntax on either backend), at most [`MAX_QUERY_TERMS`].
pub fn query_words(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_QUERY_TERMS)
        .collect()
}

/// The first 64 characters of `s`, for messages.
pub fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Checks an agent id ([`valid_agent_id`]).
pub fn check_agent(agent_id: &str) -> Result<(), Invalid> {
    if valid_agent_id(agent_id) {
        Ok(())
    } else {
        Err(Invalid::new(
            format!("agent id {:?}", clip(agent_id)),
            "use 1-128 characters of letters, digits, '-', '_', '.' and ':'",
        ))
    }
}

/// Checks a memory about to be stored: its agent, a non-blank content of at
/// most [`MAX_MEMORY_BYTES`] without NUL (PostgreSQL's text holds none, so
/// neither backend takes one), at most [`MAX_TAGS`] tags of 1-[`MAX_TAG_BYTES`] bytes.
pub fn check_memory(agent_id: &str, content: &str, tags: &[String]) -> Result<(), Invalid> {
    check_agent(agent_id)?;
    if content.trim().is_empty() {
        return Err(Invalid::new(
            "memory content",
            "it is empty; say what to remember",
        ));
    }
    if content.len() > MAX_MEMORY_BYTES {
        return Err(Invalid::new(
            format!("memory content of {} bytes", content.len()),
            "it is over the 64 KiB limit; store a shorter text",
        ));
    }
    if content.contains('\0') {
        return Err(Invalid::new(
            "memory content",
            "it contains a NUL character; remove it",
        ));
    }
    if tags.len() > MAX_TAGS {
        return Err(Invalid::new(
            format!("{} tags", tags.len()),
            "at most 32 tags",
        ));
    }
    if let Some(t) = tags
        .iter()
        .find(|t| t.trim().is_empty() || t.len() > MAX_TAG_BYTES)
    {
        return Err(Invalid::new(
            format!("tag {:?}", clip(t)),
            "tags are 1-64 bytes and not blank",
        ));
    }
    Ok(())
}

/// Memories of agents, searched by words.
#[async_trait]
pub trait MemoryStore: Send + Sync {
    /// Stores one memory of `agent_id`.
    async fn memory_add(
        &self,
        agent_id: &str,
        content: &str,
        tags: &[String],
    ) -> Result<MemoryEntry, StoreError>;
    /// The memories of `agent_id` that match `query`, best first.
    async fn memory_search(
        &self,
        agent_id: &str,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryEntry>, StoreError>;
    /// The newest memories of `agent_id`.
    async fn memory_list(
        &self,
        agent_id: &str,
        limit: usize,
    ) -> Result<Vec<MemoryEntry>, StoreError>;
    /// One memory.
    async fn memory_get(&self, id: &str) -> Result<Option<MemoryEntry>, StoreError>;
    /// Deletes one memory; whether it existed.
    async fn memory_delete(&self, id: &str) -> Result<bool, StoreError>;
}
