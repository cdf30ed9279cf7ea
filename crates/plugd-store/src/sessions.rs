//! Agent sessions and their transcripts: what `plugd run --session` and the HTTP API resume.
//!
//! A session is a row with its id and creation time; since schema 16 its
//! history is a chain of blocks (see `crate::chains`), and its
//! *transcript* is a view of its head chain as the agent turn's entries
//! (`role`, `content`, `tool_calls`, `tool_call_id`, `at`):
//! [`entry_blocks`] and [`block_entries`] convert. Entries of one turn are
//! appended in one transaction, so a crash mid-turn leaves either all of
//! them or none.
//!
//! **API boundary:** plain data in and out ([`SessionRow`], [`serde_json::Value`]
//! entries); nothing SQLite-specific leaks.

use plugd_control::chains::{Block, BlockKind, NewBlock, ScopeFilter};
use serde_json::{Map, Value, json};

use crate::error::StoreError;
use crate::store::Store;

pub use plugd_control::store::transcripts::{MAX_SESSION_ID_LEN, SessionRow, valid_session_id};

/// Schema step 4: sessions and their transcripts.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE sessions (
        id         TEXT PRIMARY KEY NOT NULL,
        created_at TEXT NOT NULL
    ) STRICT;
    CREATE TABLE transcript_entries (
        id         INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        body       TEXT NOT NULL
    ) STRICT;
    CREATE INDEX transcript_by_session ON transcript_entries (session_id, id);
";

/// The blocks one transcript entry is stored as: `user` → `input`,
/// `assistant` → `output` (when it has text or no tool calls) and one
/// `tool_call` per call, `tool` → `tool_result`, `system` (a note for
/// people, never sent to a model) → `system` with `note: true`,
/// `instructions` → `system`.
pub fn entry_blocks(entry: &Value) -> Vec<NewBlock> {
    let mut blocks = role_blocks(entry);
    // The entry's own time, when it says one (the block's `created_at` is
    // when it was stored).
    if let Some(at) = entry.get("at").filter(|a| a.is_string()) {
        for b in &mut blocks {
            b.extra.insert("at".into(), at.clone());
        }
    }
    blocks
}

fn role_blocks(entry: &Value) -> Vec<NewBlock> {
    let role = entry
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("system");
    let text = entry
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let calls = entry
        .get("tool_calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    match role {
        "user" => vec![NewBlock::text(BlockKind::Input, text)],
        "assistant" => {
            let mut out = Vec::new();
            if !text.is_empty() || calls.is_empty() {
                out.push(NewBlock::text(BlockKind::Output, text));
            }
            for c in calls {
                out.push(
                    NewBlock {
                        kind: BlockKind::ToolCall,
                        content: Vec::new(),
                        extra: Map::new(),
                    }
                    .with("call_id", c.get("id").cloned().unwrap_or(Value::Null))
                    .with("tool", c.get("name").cloned().unwrap_or(Value::Null))
                    .with(
                        "arguments",
                        c.get("arguments").cloned().unwrap_or(Value::Null),
                    ),
                );
            }
            out
        }
        "tool" => vec![NewBlock::text(BlockKind::ToolResult, text).with(
            "call_id",
            entry.get("tool_call_id").cloned().unwrap_or(Value::Null),
        )],
        "instructions" => vec![NewBlock::text(BlockKind::System, text)],
        _ => vec![NewBlock::text(BlockKind::System, text).with("note", Value::Bool(true))],
    }
}

/// The transcript entries `blocks` read as (the inverse of
/// [`entry_blocks`]): consecutive `tool_call` blocks after an `output`
/// join that assistant entry; a `system` block without `note` is
/// `instructions` (it reaches the model).
pub fn block_entries(blocks: &[Block]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(blocks.len());
    let mut joinable = false;
    for b in blocks {
        let text = b.text();
        let at = b
            .extra
            .get("at")
            .filter(|a| a.is_string())
            .cloned()
            .unwrap_or_else(|| Value::String(b.created_at.clone()));
        match b.kind {
            BlockKind::ToolCall => {
                let call = json!({
                    "id": b.extra.get("call_id").cloned().unwrap_or(Value::Null),
                    "name": b.extra.get("tool").cloned().unwrap_or(Value::Null),
                    "arguments": b.extra.get("arguments").cloned().unwrap_or_else(|| json!({})),
                });
                match out.last_mut() {
                    Some(last) if joinable => {
                        if let Some(list) = last
                            .as_object_mut()
                            .map(|o| o.entry("tool_calls").or_insert_with(|| json!([])))
                            .and_then(Value::as_array_mut)
                        {
                            list.push(call);
                        }
                    }
                    _ => out.push(
                        json!({"role": "assistant", "content": "", "tool_calls": [call], "at": at}),
                    ),
                }
                joinable = true;
            }
            BlockKind::Output => {
                let mut e = json!({"role": "assistant", "content": text, "at": at});
                // Transcripts from before chains kept the calls on the entry.
                if let Some(calls) = b.extra.get("tool_calls").filter(|c| c.is_array()) {
                    e["tool_calls"] = calls.clone();
                }
                out.push(e);
                joinable = true;
            }
            BlockKind::Input => {
                out.push(json!({"role": "user", "content": text, "at": at}));
                joinable = false;
            }
            BlockKind::ToolResult => {
                let mut e = json!({"role": "tool", "content": text, "at": at});
                if let Some(id) = b.extra.get("call_id").filter(|v| !v.is_null()) {
                    e["tool_call_id"] = id.clone();
                }
                out.push(e);
                joinable = false;
            }
            BlockKind::System => {
                let note = b.extra.get("note").and_then(Value::as_bool) == Some(true);
                let role = if note { "system" } else { "instructions" };
                out.push(json!({"role": role, "content": text, "at": at}));
                joinable = false;
            }
        }
    }
    out
}

impl Store {
    /// The session `id`, if stored.
    pub fn session_get(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        Ok(self.session_info(id)?.map(|s| SessionRow {
            id: s.id,
            created_at: s.created_at,
        }))
    }

    /// Stores session `id` (with its first chain) unless it exists.
    /// Returns the row and whether it was created by this call.
    pub fn session_ensure(&self, id: &str) -> Result<(SessionRow, bool), StoreError> {
        let (s, created) = self.session_open(id, None, None)?;
        Ok((
            SessionRow {
                id: s.id,
                created_at: s.created_at,
            },
            created,
        ))
    }

    /// Appends `entries` (transcript entries, see [`entry_blocks`]) to the
    /// head chain of session `id`, in one transaction.
    pub fn session_append(&self, id: &str, entries: &[Value]) -> Result<(), StoreError> {
        let head = self.session_head(id)?;
        let blocks: Vec<NewBlock> = entries.iter().flat_map(entry_blocks).collect();
        self.chain_append(&head, &blocks, "agent").map(|_| ())
    }

    /// The stored sessions, newest first (by creation time, then id),
    /// at most `limit`.
    pub fn session_list(&self, limit: usize) -> Result<Vec<SessionRow>, StoreError> {
        Ok(self
            .sessions(&ScopeFilter::default(), limit, None)?
            .into_iter()
            .map(|s| SessionRow {
                id: s.id,
                created_at: s.created_at,
            })
            .collect())
    }

    /// How many transcript entries the head chain of session `id` reads
    /// as, and its last `limit` entries, oldest first (`0` and none when
    /// unknown).
    pub fn session_tail(&self, id: &str, limit: usize) -> Result<(usize, Vec<Value>), StoreError> {
        let all = self.session_transcript(id)?;
        let total = all.len();
        let skip = total.saturating_sub(limit);
        Ok((total, all.into_iter().skip(skip).collect()))
    }

    /// The transcript of session `id`: its head chain read as entries
    /// ([`block_entries`]), oldest first (empty when unknown).
    pub fn session_transcript(&self, id: &str) -> Result<Vec<Value>, StoreError> {
        let Some(info) = self.session_info(id)? else {
            return Ok(Vec::new());
        };
        let Some(head) = info.head_chain_id else {
            return Ok(Vec::new());
        };
        let blocks = self.chain_blocks(&head, 0, usize::MAX)?;
        Ok(block_entries(&blocks))
    }
}
