//! The settings of compaction (`agent.compactor` of plugd.yaml): which VAI
//! compactor export compacts a session's chain, and when. The compaction
//! itself (`compactor.compact`, seed 003: the projection sent, the derived
//! chain made from the returned `seed_blocks`, the compaction record and the
//! durable `chain.compacted` event) is `plugd-agent`'s `compaction`.
//!
//! `plugd.yaml`:
//!
//! ```yaml
//! agent:
//!   compactor:
//!     export: acme/devkit/coder_window   # PACKAGE/EXPORT: a workspace VAI plugin, else an installed package
//!     max_input_tokens: 32000            # compact when the head chain's estimate exceeds it
//!     target_model: gpt-5.4              # passed on as `target.target_model`
//!     retain_system: true                # `policy.retain_system` (default true)
//!     retain_open_tasks: true            # `policy.retain_open_tasks` (default true)
//!     inline_max_bytes: 1048576          # larger projections go as a file in the scratch dir
//!     on_failure: continue               # or `fail`: the turn fails when the compactor does
//!     timeout_secs: 120                  # default: the export's default_timeout_ms, else 120
//! ```

use serde::{Deserialize, Serialize};

/// Default `inline_max_bytes`: projections up to 1 MiB travel inline.
pub const DEFAULT_INLINE_MAX_BYTES: usize = 1024 * 1024;

/// What to do when the compactor fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Keep the chain as it was, go on with a notice (default).
    #[default]
    Continue,
    /// Fail the turn.
    Fail,
}

/// `agent.compactor` of plugd.yaml.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactorConfig {
    /// `PACKAGE/EXPORT` of a compactor export.
    pub export: String,
    /// The budget: compact when the head chain's estimate exceeds it.
    pub max_input_tokens: u64,
    /// `target.target_model`.
    #[serde(default)]
    pub target_model: Option<String>,
    /// `policy.retain_system`.
    #[serde(default = "yes")]
    pub retain_system: bool,
    /// `policy.retain_open_tasks`.
    #[serde(default = "yes")]
    pub retain_open_tasks: bool,
    /// Projections larger than this (bytes of JSON) go as a file.
    #[serde(default = "default_inline_max")]
    pub inline_max_bytes: usize,
    /// What a failure does to the turn.
    #[serde(default)]
    pub on_failure: OnFailure,
    /// Deadline of one compaction.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

fn yes() -> bool {
    true
}

fn default_inline_max() -> usize {
    DEFAULT_INLINE_MAX_BYTES
}

/// The outbox event type of a compaction started asynchronously
/// (`POST /v1/compactions` with `async: true`): one delivery to the
/// compactor export, which any node's outbox worker runs (at least once,
/// under the delivery's lease; its `delivery_id` is the job's id).
pub const COMPACTION_JOB: &str = "compaction.requested";

/// A compaction job recorded: its id, and the event a worker runs.
#[derive(Debug, Clone)]
pub struct CompactionJob {
    /// The job's id: its outbox delivery's `delivery_id`.
    pub job_id: String,
}

/// The compaction id prefix of job `job_id`: each attempt's compaction id
/// starts with it, so a re-attempt finds an earlier attempt's success.
pub fn job_compaction_prefix(job_id: &str) -> String {
    format!("cmp_{}_", job_id.trim_start_matches("del_"))
}

/// Records a compaction of `session_id` with `cfg` for any node's worker
/// to run, and wakes this process's worker.
pub async fn enqueue_compaction(
    rt: &crate::Runtime,
    session_id: &str,
    run_id: Option<&str>,
    cfg: &CompactorConfig,
) -> Result<CompactionJob, plugd_store::StoreError> {
    use plugd_store::outbox::{NewEvent, Subscriber};
    let (plugin, export) = cfg.export.rsplit_once('/').unwrap_or(("", &cfg.export));
    let event = NewEvent {
        event_type: COMPACTION_JOB.to_owned(),
        subject: serde_json::json!({"kind": "session", "id": session_id}),
        summary: serde_json::json!({
            "session_id": session_id,
            "run_id": run_id,
            "compactor": cfg,
        }),
    };
    let subscriber = Subscriber {
        plugin_id: plugin.to_owned(),
        export_id: export.to_owned(),
    };
    let queued = rt.state().outbox_enqueue(&event, &[subscriber]).await?;
    crate::outbox::woke(&queued);
    let job_id = queued
        .deliveries
        .first()
        .map(|d| d.0.clone())
        .unwrap_or_default();
    Ok(CompactionJob { job_id })
}
