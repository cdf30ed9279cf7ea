//! Sessions, chains, runs and compactions (seed 003): the agent runtime's
//! history as the VAI model, and the [`ChainStore`] trait that keeps it.
//!
//! * A **session** holds chains; its *head* chain is the one turns and
//!   harnesses append to.
//! * A **chain** is an ordered, append-only list of [`Block`]s (`system`,
//!   `input`, `output`, `tool_call`, `tool_result`). Nothing rewrites a
//!   block: a compaction creates a *derived* chain whose first blocks are
//!   the compactor's seed blocks, linked to its source
//!   (`parent_chain_id`, `compaction_id`), and makes it the head; the source
//!   stays readable and is marked `superseded`.
//! * A **run** is one execution (an agent turn, a harness run, or a run a
//!   harness records itself) with its status and outputs (`checkpoint`,
//!   `summary`, `artifacts`); a run started by another is its child
//!   (`parent_run_id`, `depth`).
//! * A **compaction** records which compactor turned which chain into which.
//!
//! Scope: sessions carry the org and project they belong to (`None` for the
//! workspace); chains, runs and compactions inherit their session's.

use crate::store::StoreError;
use crate::store::outbox::{Enqueued, Reporter, Subscriber};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Most blocks one append may carry.
pub const MAX_APPEND_BLOCKS: usize = 256;

/// Largest serialized block accepted from a client (bytes).
pub const MAX_BLOCK_BYTES: usize = 256 * 1024;

/// The kind of a chain block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// Instructions (a system prompt, or a note when `note` is set).
    System,
    /// What the user (or a trigger) said.
    Input,
    /// What the model said.
    Output,
    /// A tool call the model made (`call_id`, `tool`, `arguments`).
    ToolCall,
    /// A tool's result (`call_id`).
    ToolResult,
}

impl BlockKind {
    /// Every kind.
    pub const ALL: [BlockKind; 5] = [
        BlockKind::System,
        BlockKind::Input,
        BlockKind::Output,
        BlockKind::ToolCall,
        BlockKind::ToolResult,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockKind::System => "system",
            BlockKind::Input => "input",
            BlockKind::Output => "output",
            BlockKind::ToolCall => "tool_call",
            BlockKind::ToolResult => "tool_result",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<BlockKind> {
        BlockKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One block of a chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// Its position in the chain, from 1.
    pub seq: u64,
    /// Its kind.
    pub kind: BlockKind,
    /// Content parts (`{"type": "text", "text": …}` and others).
    pub content: Vec<Value>,
    /// Everything else the block carries (`call_id`, `tool`, `arguments`,
    /// `note`, `pinned`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    /// When it was appended (RFC 3339).
    pub created_at: String,
    /// Who appended it (`agent`, `token:NAME`, `delegated:INVOCATION`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

impl Block {
    /// The block's text parts, joined with newlines.
    pub fn text(&self) -> String {
        text_of(&self.content)
    }
}

/// The text parts of `content`, joined with newlines.
pub fn text_of(content: &[Value]) -> String {
    content
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A block to append, before the store numbers it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBlock {
    /// Its kind.
    pub kind: BlockKind,
    /// Content parts.
    pub content: Vec<Value>,
    /// Other fields.
    pub extra: Map<String, Value>,
}

impl NewBlock {
    /// A block with one text part.
    pub fn text(kind: BlockKind, text: impl Into<String>) -> NewBlock {
        NewBlock {
            kind,
            content: vec![serde_json::json!({"type": "text", "text": text.into()})],
            extra: Map::new(),
        }
    }

    /// `self` with `key` set to `value`.
    pub fn with(mut self, key: &str, value: Value) -> NewBlock {
        self.extra.insert(key.to_owned(), value);
        self
    }

    /// The stored body: `content` and the extra fields (not the kind).
    pub fn body(&self) -> Value {
        let mut body = self.extra.clone();
        body.insert("content".into(), Value::Array(self.content.clone()));
        Value::Object(body)
    }

    /// A block from a client's JSON (`{"kind", "content", …}`), checked:
    /// a known kind, `content` an array of objects each with a string
    /// `type` (a string is taken as one text part), at most
    /// [`MAX_BLOCK_BYTES`], no field named like the store's own (`seq`,
    /// `created_at`, `created_by`).
    pub fn from_json(index: usize, v: &Value) -> Result<NewBlock, String> {
        let Value::Object(map) = v else {
            return Err(format!("blocks[{index}] is not an object"));
        };
        let size = v.to_string().len();
        if size > MAX_BLOCK_BYTES {
            return Err(format!(
                "blocks[{index}] is {size} bytes; the limit is {MAX_BLOCK_BYTES}"
            ));
        }
        let kind = match map.get("kind") {
            Some(Value::String(k)) => BlockKind::parse(k).ok_or_else(|| {
                format!(
                    "blocks[{index}].kind {k:?} is not one of {}",
                    BlockKind::ALL.map(BlockKind::as_str).join(", ")
                )
            })?,
            _ => return Err(format!("blocks[{index}].kind is missing or not a string")),
        };
        let content = match map.get("content") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![serde_json::json!({"type": "text", "text": s})],
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    if !p.get("type").is_some_and(Value::is_string) {
                        return Err(format!(
                            "blocks[{index}].content[{j}] is not an object with a string \"type\""
                        ));
                    }
                }
                parts.clone()
            }
            Some(_) => {
                return Err(format!(
                    "blocks[{index}].content must be an array of parts (or a string)"
                ));
            }
        };
        let mut extra = Map::new();
        for (k, val) in map {
            match k.as_str() {
                "kind" | "content" => {}
                "seq" | "created_at" | "created_by" => {
                    return Err(format!("blocks[{index}].{k} is set by plugd; leave it out"));
                }
                _ => {
                    extra.insert(k.clone(), val.clone());
                }
            }
        }
        Ok(NewBlock {
            kind,
            content,
            extra,
        })
    }
}

/// Whether a chain is the head of its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainStatus {
    /// The session's head: turns and harnesses append here.
    Active,
    /// A compaction derived another chain from it; kept for reading.
    Superseded,
}

/// A chain, without its blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chain {
    /// `ch_…`.
    pub id: String,
    /// Its session.
    pub session_id: String,
    /// The chain it was derived from (lineage).
    pub parent_chain_id: Option<String>,
    /// The compaction that derived it.
    pub compaction_id: Option<String>,
    /// Active or superseded.
    pub status: ChainStatus,
    /// How many blocks it has.
    pub blocks: u64,
    /// When it was created.
    pub created_at: String,
}

/// A session, without its chains' blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Its id.
    pub id: String,
    /// The org it belongs to (`None`: the workspace).
    pub org_id: Option<String>,
    /// The project.
    pub project_id: Option<String>,
    /// Its head chain.
    pub head_chain_id: Option<String>,
    /// When it was created.
    pub created_at: String,
}

/// The org/project a request may see: `None` fields are unrestricted
/// (a workspace identity sees everything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeFilter {
    /// Only this org's.
    pub org_id: Option<String>,
    /// Only these projects (empty: any of the org's).
    pub project_ids: Vec<String>,
    /// With no org: only the workspace's own sessions (a delegation token
    /// of a workspace invocation), not every org's.
    pub workspace_only: bool,
}

impl ScopeFilter {
    /// Whether a session of `org`/`project` is visible.
    pub fn sees(&self, org: Option<&str>, project: Option<&str>) -> bool {
        match &self.org_id {
            None if self.workspace_only => org.is_none(),
            None => true,
            Some(o) => {
                org == Some(o.as_str())
                    && (self.project_ids.is_empty()
                        || project.is_some_and(|p| self.project_ids.iter().any(|x| x == p)))
            }
        }
    }
}

/// What kind of execution a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// One agent turn.
    Turn,
    /// A harness export's `harness.run`.
    Harness,
    /// A run a client (e.g. a harness, through the API) records itself.
    External,
}

/// A run's status: `running`, then one of seed 003's terminal statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Not ended yet.
    Running,
    /// Ended well.
    Succeeded,
    /// Ended badly.
    Failed,
    /// Cancelled.
    Cancelled,
    /// Ended badly, may succeed later.
    RetryableFailure,
}

impl RunStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::RetryableFailure => "retryable_failure",
        }
    }

    /// The status named `s`.
    pub fn parse(s: &str) -> Option<RunStatus> {
        [
            RunStatus::Running,
            RunStatus::Succeeded,
            RunStatus::Failed,
            RunStatus::Cancelled,
            RunStatus::RetryableFailure,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }

    /// Whether the run is over.
    pub fn is_terminal(self) -> bool {
        self != RunStatus::Running
    }
}

/// One run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// `run_…`.
    pub id: String,
    /// Its session.
    pub session_id: String,
    /// The chain it worked on.
    pub chain_id: Option<String>,
    /// The run that started it.
    pub parent_run_id: Option<String>,
    /// 0 for a top-level run, parent's + 1 for a child.
    pub depth: u32,
    /// Turn, harness or external.
    pub kind: RunKind,
    /// The harness (`PACKAGE/EXPORT`) of a harness run.
    pub harness: Option<String>,
    /// `start` or `continue` (harness runs).
    pub mode: Option<String>,
    /// Running or terminal.
    pub status: RunStatus,
    /// What started it (the trigger, or the turn's input).
    pub input: Value,
    /// The harness's checkpoint.
    pub checkpoint: Value,
    /// The summary (`{"text": …}`).
    pub summary: Value,
    /// Artifacts.
    pub artifacts: Value,
    /// Why it failed.
    pub error: Option<String>,
    /// Who started it.
    pub created_by: String,
    /// Started (RFC 3339).
    pub created_at: String,
    /// Ended.
    pub ended_at: Option<String>,
}

/// A change to a run (`PATCH /v1/runs/{id}`, the end of a turn).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPatch {
    /// New status (a terminal one ends the run; a run that ended stays ended).
    pub status: Option<RunStatus>,
    /// Checkpoint.
    pub checkpoint: Option<Value>,
    /// Summary.
    pub summary: Option<Value>,
    /// Artifacts.
    pub artifacts: Option<Value>,
    /// Error text.
    pub error: Option<String>,
    /// The chain it works on now (after a compaction).
    pub chain_id: Option<String>,
}

/// One compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// `cmp_…`.
    pub id: String,
    /// The session.
    pub session_id: String,
    /// The chain compacted.
    pub source_chain_id: String,
    /// The chain derived (`None` when the compactor failed).
    pub derived_chain_id: Option<String>,
    /// The compactor (`PACKAGE/EXPORT`).
    pub compactor: String,
    /// `succeeded` or `failed`.
    pub status: String,
    /// The source's token estimate.
    pub token_estimate: u64,
    /// The compactor's summary.
    pub summary: Value,
    /// Its diagnostics.
    pub diagnostics: Value,
    /// Why it failed.
    pub error: Option<String>,
    /// The run that asked for it.
    pub run_id: Option<String>,
    /// When.
    pub created_at: String,
}

/// Where sessions, chains, runs and compactions are kept. Implemented by
/// plugd-store's SQLite `Store`; a PostgreSQL backend implements the same.
#[async_trait::async_trait]
pub trait ChainStore: Send + Sync {
    /// Stores session `id` in `org`/`project` unless it exists, with an
    /// empty head chain; returns it and whether this call created it.
    async fn session_open(
        &self,
        id: &str,
        org: Option<&str>,
        project: Option<&str>,
    ) -> Result<(SessionInfo, bool), StoreError>;

    /// The session `id`.
    async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, StoreError>;

    /// Sessions `scope` sees, newest first, at most `limit`, created before
    /// the session `before` (paging).
    async fn sessions(
        &self,
        scope: &ScopeFilter,
        limit: usize,
        before: Option<&str>,
    ) -> Result<Vec<SessionInfo>, StoreError>;

    /// The chains of session `id`, oldest first.
    async fn session_chains(&self, id: &str) -> Result<Vec<Chain>, StoreError>;

    /// The chain `id`.
    async fn chain(&self, id: &str) -> Result<Option<Chain>, StoreError>;

    /// Blocks of chain `id` with `seq > after`, at most `limit`, in order.
    async fn chain_blocks(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Block>, StoreError>;

    /// Appends `blocks` to chain `id` in one transaction; the new blocks'
    /// seqs. Refused when the chain is superseded.
    async fn chain_append(
        &self,
        id: &str,
        blocks: &[NewBlock],
        by: &str,
    ) -> Result<Vec<u64>, StoreError>;

    /// Creates a chain derived from `source` by `compaction`, seeded with
    /// `seed`, makes it its session's head and marks `source` superseded,
    /// and records the compaction, in one transaction. Refused when
    /// `source` is no longer the head (another compaction won).
    async fn chain_derive(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
    ) -> Result<Chain, StoreError>;

    /// [`ChainStore::chain_derive`], and the event `report` makes of the
    /// derived chain (`chain.compacted`) recorded for `subscribers` in the
    /// same transaction: both are written or neither.
    async fn chain_derive_reporting(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
        report: &Reporter<'_, Chain>,
        subscribers: &[Subscriber],
    ) -> Result<(Chain, Enqueued), StoreError>;

    /// Records a compaction that derived nothing (it failed).
    async fn compaction_failed(&self, compaction: &Compaction) -> Result<(), StoreError>;

    /// The compactions of session `id`, newest first.
    async fn compactions(&self, session: &str) -> Result<Vec<Compaction>, StoreError>;

    /// Stores a new run.
    async fn run_create(&self, run: &Run) -> Result<(), StoreError>;

    /// The run `id`.
    async fn run(&self, id: &str) -> Result<Option<Run>, StoreError>;

    /// Applies `patch` to run `id`; the run after it. A terminal status
    /// sets `ended_at`; a run already ended keeps its status.
    async fn run_update(&self, id: &str, patch: &RunPatch) -> Result<Option<Run>, StoreError>;

    /// [`ChainStore::run_update`], and the event `report` makes of the run
    /// after it (`run.completed`) recorded for `subscribers` in the same
    /// transaction: a run's final status and its event are both written or
    /// neither. `None` when there is no run `id` (and no event).
    async fn run_finish(
        &self,
        id: &str,
        patch: &RunPatch,
        report: &Reporter<'_, Run>,
        subscribers: &[Subscriber],
    ) -> Result<Option<(Run, Enqueued)>, StoreError>;

    /// Runs of session `session` (any when `None`) that `scope` sees,
    /// newest first, at most `limit`.
    async fn runs(
        &self,
        scope: &ScopeFilter,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError>;

    /// How many runs have `parent` as their parent.
    async fn child_runs(&self, parent: &str) -> Result<u64, StoreError>;
}

/// A fresh id with `prefix`: a UUIDv7 ([`crate::id::fresh`]), unique
/// across processes and nodes; never used as a secret.
pub fn fresh_id(prefix: &str) -> String {
    crate::id::fresh(prefix)
}

/// A rough token estimate of `blocks`: a quarter of their JSON length, the
/// rule of thumb for English text and JSON with common tokenizers.
pub fn token_estimate<'a>(blocks: impl IntoIterator<Item = &'a Block>) -> u64 {
    blocks
        .into_iter()
        .map(|b| {
            let len = serde_json::to_string(&b.content).map_or(0, |s| s.len())
                + b.extra.get("arguments").map_or(0, |a| a.to_string().len());
            (len as u64).div_ceil(4)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn client_blocks_are_checked() {
        let b = NewBlock::from_json(
            0,
            &json!({"kind": "input", "content": "hi", "pinned": true}),
        )
        .unwrap();
        assert_eq!(b.kind, BlockKind::Input);
        assert_eq!(b.content, [json!({"type": "text", "text": "hi"})]);
        assert_eq!(b.extra["pinned"], true);
        for (bad, why) in [
            (json!([]), "not an object"),
            (json!({"content": "x"}), "kind is missing"),
            (json!({"kind": "sermon"}), "is not one of system, input"),
            (json!({"kind": "input", "content": 3}), "must be an array"),
            (
                json!({"kind": "input", "content": [{"text": "x"}]}),
                "string \"type\"",
            ),
            (json!({"kind": "input", "seq": 3}), "set by plugd"),
            (
                json!({"kind": "input", "content": "x".repeat(MAX_BLOCK_BYTES)}),
                "the limit is",
            ),
        ] {
            let e = NewBlock::from_json(2, &bad).unwrap_err();
            assert!(e.contains(why) && e.contains("blocks[2]"), "{bad}: {e}");
        }
    }

    #[test]
    fn scope_filters_see_their_own() {
        let all = ScopeFilter::default();
        assert!(all.sees(None, None) && all.sees(Some("o"), Some("p")));
        let org = ScopeFilter {
            org_id: Some("o".into()),
            ..ScopeFilter::default()
        };
        let ws = ScopeFilter {
            workspace_only: true,
            ..ScopeFilter::default()
        };
        assert!(ws.sees(None, None) && !ws.sees(Some("o"), None));
        assert!(org.sees(Some("o"), None) && org.sees(Some("o"), Some("p")));
        assert!(!org.sees(None, None) && !org.sees(Some("x"), None));
        let proj = ScopeFilter {
            org_id: Some("o".into()),
            project_ids: vec!["p".into()],
            workspace_only: false,
        };
        assert!(proj.sees(Some("o"), Some("p")) && !proj.sees(Some("o"), Some("q")));
        assert!(!proj.sees(Some("o"), None));
    }

    #[test]
    fn ids_differ_and_estimates_grow() {
        let a = fresh_id("run");
        let b = fresh_id("run");
        assert!(a.starts_with("run_") && a != b);
        let block = |t: &str| Block {
            seq: 1,
            kind: BlockKind::Input,
            content: vec![json!({"type": "text", "text": t})],
            extra: Map::new(),
            created_at: String::new(),
            created_by: None,
        };
        let small = token_estimate([&block("hi")]);
        let big = token_estimate([&block(&"word ".repeat(400))]);
        assert!(small > 0 && big > 400 && big > small);
    }
}
