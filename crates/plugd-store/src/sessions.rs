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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_round_trip_and_ids_are_checked() {
        let store = Store::open_in_memory().unwrap();
        let (row, created) = store.session_ensure("s_1").unwrap();
        assert!(created);
        assert_eq!(row.id, "s_1");
        let (again, created) = store.session_ensure("s_1").unwrap();
        assert!(!created);
        assert_eq!(again, row);
        store
            .session_append(
                "s_1",
                &[serde_json::json!({"role": "user", "content": "hi"})],
            )
            .unwrap();
        store
            .session_append(
                "s_1",
                &[serde_json::json!({"role": "assistant", "content": "yo"})],
            )
            .unwrap();
        let t = store.session_transcript("s_1").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1]["content"], "yo");
        assert!(store.session_transcript("other").unwrap().is_empty());
        assert!(store.session_get("nope").unwrap().is_none());
        for bad in ["", "a/b", "has space", &"x".repeat(129)] {
            assert!(matches!(
                store.session_ensure(bad),
                Err(StoreError::Invalid { .. })
            ));
        }
        assert!(valid_session_id(&"x".repeat(128)));
    }

    #[test]
    fn sessions_list_newest_first_and_tails_are_bounded() {
        let store = Store::open_in_memory().unwrap();
        assert!(store.session_list(10).unwrap().is_empty());
        for id in ["a", "b", "c"] {
            store.session_ensure(id).unwrap();
        }
        let ids: Vec<String> = store
            .session_list(2)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        // Same second: the id breaks the tie, newest (largest) first.
        assert_eq!(ids.len(), 2);
        let entries: Vec<Value> = (0..5)
            .map(|i| serde_json::json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        store.session_append("b", &entries).unwrap();
        let (total, tail) = store.session_tail("b", 2).unwrap();
        assert_eq!(total, 5);
        let texts: Vec<&str> = tail
            .iter()
            .map(|e| e["content"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["m3", "m4"]);
        assert_eq!(store.session_tail("zz", 2).unwrap(), (0, Vec::new()));
        assert!(store.session_tail("a/b", 2).is_err());
    }

    #[test]
    fn entries_round_trip_through_blocks() {
        let entries = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "name": "a/t", "arguments": {"x": 1}},
                {"id": "c2", "name": "a/u", "arguments": {}}]}),
            json!({"role": "tool", "content": "r1", "tool_call_id": "c1"}),
            json!({"role": "tool", "content": "r2", "tool_call_id": "c2"}),
            json!({"role": "assistant", "content": "thinking", "tool_calls": [
                {"id": "c3", "name": "a/t", "arguments": {}}]}),
            json!({"role": "tool", "content": "r3", "tool_call_id": "c3"}),
            json!({"role": "assistant", "content": "done"}),
            json!({"role": "system", "content": "turn blocked"}),
        ];
        let store = Store::open_in_memory().unwrap();
        store.session_ensure("rt").unwrap();
        store.session_append("rt", &entries).unwrap();
        let back = store.session_transcript("rt").unwrap();
        assert_eq!(back.len(), entries.len());
        for (a, b) in entries.iter().zip(&back) {
            assert_eq!(a["role"], b["role"]);
            assert_eq!(a["content"], b["content"]);
            assert_eq!(a.get("tool_calls"), b.get("tool_calls"), "{b}");
            assert_eq!(a.get("tool_call_id"), b.get("tool_call_id"));
        }
        let head = store.session_head("rt").unwrap();
        let kinds: Vec<&str> = store
            .chain_blocks(&head, 0, 100)
            .unwrap()
            .iter()
            .map(|b| b.kind.as_str())
            .collect();
        assert_eq!(
            kinds,
            [
                "input",
                "tool_call",
                "tool_call",
                "tool_result",
                "tool_result",
                "output",
                "tool_call",
                "tool_result",
                "output",
                "system"
            ]
        );
    }
}
