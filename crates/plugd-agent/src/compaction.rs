//! Compaction of a session's chain by a VAI compactor export
//! (`compactor.compact`, seed 003): the projection sent, the derived chain
//! made from the returned `seed_blocks`, the compaction record and the
//! durable `chain.compacted` event. Its settings are the runtime's
//! ([`plugd_runtime::compaction::CompactorConfig`], plugd.yaml
//! `agent.compactor`).
//!
//! A compaction never rewrites a chain: the store creates the derived chain,
//! makes it the session's head and marks the source superseded in one
//! transaction, so a crash leaves either the old head or the new one. A
//! compactor that fails (or answers seed blocks that are not blocks) changes
//! nothing; the failure is recorded as a compaction with status `failed`.

use std::time::{Duration, Instant};

use plugd_control::chains::{Block, Compaction, NewBlock, RunPatch, fresh_id, token_estimate};
use plugd_dialects::vai;
use plugd_host::dialect::CallContext;
use plugd_manifest::vai::ExportKind;
use plugd_runtime::Runtime;
use plugd_runtime::agent_seam::JobFailure;
use plugd_runtime::compaction::{CompactorConfig, job_compaction_prefix};
use plugd_store::outbox::NewEvent;
use serde_json::{Value, json};

/// The name of the projection file in the invocation's scratch directory.
pub const PROJECTION_FILE: &str = "projection.json";

/// Why a compaction did not happen.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CompactionError {
    /// The compactor cannot be found or is not a compactor.
    #[error("compactor {export:?}: {reason}")]
    Export {
        /// `PACKAGE/EXPORT`.
        export: String,
        /// Why.
        reason: String,
    },
    /// The compactor ran and failed, or answered something unusable.
    #[error("compactor {export:?} failed: {reason}; the chain was left as it was")]
    Failed {
        /// `PACKAGE/EXPORT`.
        export: String,
        /// Why.
        reason: String,
    },
    /// The state store failed.
    #[error("{0}")]
    Store(String),
}

/// A block as the projection shows it.
fn projected(b: &Block) -> Value {
    serde_json::to_value(b).unwrap_or(Value::Null)
}

/// Compacts the head chain of `session_id` with `cfg`'s compactor: the
/// compaction record (its `derived_chain_id` is the session's new head).
/// `run_id` is the run that asked (a turn, a harness).
pub async fn compact_session(
    rt: &Runtime,
    session_id: &str,
    cfg: &CompactorConfig,
    run_id: Option<&str>,
) -> Result<Compaction, CompactionError> {
    compact_session_as(rt, session_id, cfg, run_id, fresh_id("cmp")).await
}

/// [`compact_session`] under the compaction id `compaction_id`.
async fn compact_session_as(
    rt: &Runtime,
    session_id: &str,
    cfg: &CompactorConfig,
    run_id: Option<&str>,
    compaction_id: String,
) -> Result<Compaction, CompactionError> {
    let store = rt.state();
    let serr = |e: plugd_store::StoreError| CompactionError::Store(e.to_string());
    let info = store
        .session_info(session_id)
        .await
        .map_err(serr)?
        .ok_or_else(|| CompactionError::Store(format!("session {session_id:?} does not exist")))?;
    let source = info
        .head_chain_id
        .clone()
        .ok_or_else(|| CompactionError::Store(format!("session {session_id:?} has no chain")))?;
    let blocks = store
        .chain_blocks(&source, 0, usize::MAX)
        .await
        .map_err(serr)?;
    let estimate = token_estimate(&blocks);
    let (sup, export_id) = rt
        .resolve_export(&cfg.export, ExportKind::Compactor)
        .await
        .map_err(|reason| CompactionError::Export {
            export: cfg.export.clone(),
            reason,
        })?;
    let invocation_id = fresh_id("inv");
    let pinned: Vec<Value> = blocks
        .iter()
        .filter(|b| b.extra.get("pinned").and_then(Value::as_bool) == Some(true))
        .map(projected)
        .collect();
    let inline: Vec<Value> = blocks.iter().map(projected).collect();
    let inline_json = serde_json::to_string(&inline).unwrap_or_default();
    let by_file = inline_json.len() > cfg.inline_max_bytes;
    let mut projection = json!({
        "transport": if by_file { "artifact" } else { "inline" },
        "pinned_items": pinned,
        "token_estimate": estimate,
    });
    if !by_file {
        projection["blocks"] = Value::Array(inline);
    }
    let mut request = vai::CompactRequest {
        compaction_id: compaction_id.clone(),
        source: json!({"chain_id": source, "projection": projection}),
        target: json!({"max_input_tokens": cfg.max_input_tokens, "target_model": cfg.target_model}),
        policy: json!({"retain_system": cfg.retain_system, "retain_open_tasks": cfg.retain_open_tasks}),
    };
    let timeout = Duration::from_secs(cfg.timeout_secs.unwrap_or(120).max(1));
    let ctx = CallContext {
        session_id: Some(session_id.to_owned()),
        chain_id: Some(source.clone()),
        run_id: run_id.map(str::to_owned),
        org_id: info.org_id.clone(),
        project_id: info.project_id.clone(),
        invocation_id: Some(invocation_id),
        ..CallContext::default()
    };
    let minted = rt.delegate(sup.spec(), &export_id, &ctx, timeout);
    let ctx = CallContext {
        gateway: minted.as_ref().map(|m| m.grant.clone()),
        ..ctx
    };
    let deadline = Instant::now() + timeout;
    let outcome = async {
        // The process of the compactor's execution class.
        let conn = sup
            .export_connection(&export_id, &ctx, deadline)
            .await
            .map_err(|e| e.to_string())?;
        let ctx = conn.context();
        if by_file {
            // The invocation's scratch directory: the dialect finds it
            // there, and removes it with the file when the call ends.
            let dir = vai::scratch_dir(
                &conn.spec,
                &conn.services.state_dir(&conn.spec.id),
                ctx.invocation_id.as_deref().unwrap_or("inv"),
            );
            let path = dir.join(PROJECTION_FILE);
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&path, &inline_json))
                .map_err(|e| format!("cannot write the projection to {}: {e}", path.display()))?;
            request.source["projection"]["artifact"] = json!({
                "path": path.display().to_string(),
                "format": "json",
                "bytes": inline_json.len(),
            });
        }
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        vai::compact(&conn, &export_id, request, ctx, left)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    drop(minted);
    let mut record = Compaction {
        id: compaction_id,
        session_id: session_id.to_owned(),
        source_chain_id: source.clone(),
        derived_chain_id: None,
        compactor: cfg.export.clone(),
        status: "succeeded".into(),
        token_estimate: estimate,
        summary: Value::Null,
        diagnostics: Value::Null,
        error: None,
        run_id: run_id.map(str::to_owned),
        created_at: plugd_store::now_rfc3339(),
    };
    let seed = outcome.and_then(|result| {
        record.summary = result.get("summary").cloned().unwrap_or(Value::Null);
        record.diagnostics = result.get("diagnostics").cloned().unwrap_or(Value::Null);
        let list = result
            .get("seed_blocks")
            .and_then(Value::as_array)
            .ok_or("the result has no \"seed_blocks\" array")?;
        if list.len() > plugd_control::chains::MAX_APPEND_BLOCKS * 16 {
            return Err(format!("{} seed blocks is too many", list.len()));
        }
        list.iter()
            .enumerate()
            .map(|(i, b)| NewBlock::from_json(i, b).map_err(|e| format!("seed_{e}")))
            .collect::<Result<Vec<_>, String>>()
    });
    let seed = match seed {
        Ok(seed) => seed,
        Err(reason) => {
            record.status = "failed".into();
            record.error = Some(reason.clone());
            if let Err(e) = store.compaction_failed(&record).await {
                tracing::warn!(error = %e, "could not record a failed compaction");
            }
            return Err(CompactionError::Failed {
                export: cfg.export.clone(),
                reason,
            });
        }
    };
    // The derived chain and its `chain.compacted` are one transaction: a
    // crash between them cannot lose the event.
    let subscribers = plugd_runtime::outbox::OutboxExt::subscribers(rt, "chain.compacted");
    let report = |derived: &plugd_control::chains::Chain| NewEvent {
        event_type: "chain.compacted".to_owned(),
        subject: json!({"kind": "chain", "id": derived.id}),
        summary: json!({
            "session_id": session_id,
            "source_chain_id": source,
            "derived_chain_id": derived.id,
            "compaction_id": record.id,
            "compactor": cfg.export,
            "token_estimate": estimate,
            "seed_blocks": seed.len(),
            "summary": record.summary,
        }),
    };
    let (derived, queued) = store
        .chain_derive_reporting(&source, &seed, &record, &report, &subscribers)
        .await
        .map_err(serr)?;
    plugd_runtime::outbox::woke(&queued);
    record.derived_chain_id = Some(derived.id.clone());
    if let Some(run) = run_id {
        let patch = RunPatch {
            chain_id: Some(derived.id.clone()),
            ..RunPatch::default()
        };
        if let Err(e) = store.run_update(run, &patch).await {
            tracing::warn!(run, error = %e, "could not move the run to the derived chain");
        }
    }
    Ok(record)
}

/// Runs compaction job `job` ([`plugd_runtime::compaction::COMPACTION_JOB`],
/// recorded by `POST /v1/compactions` with `async: true`) on this node: the
/// session named in the job, with the compactor settings recorded with it.
/// An earlier attempt that succeeded (this node or another, before its
/// lease ran out) makes this one a no-op: the job compacts once.
pub async fn run_job(rt: &Runtime, job: &plugd_store::outbox::Leased) -> Result<(), JobFailure> {
    let d = &job.delivery;
    let summary = job.event.get("summary").cloned().unwrap_or(Value::Null);
    let invalid = |why: String| JobFailure {
        message: format!("compaction job {}: {why}", d.delivery_id),
        retryable: false,
    };
    let session_id = summary
        .get("session_id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("no session_id".into()))?
        .to_owned();
    let run_id = summary.get("run_id").and_then(Value::as_str);
    let cfg: CompactorConfig =
        serde_json::from_value(summary.get("compactor").cloned().unwrap_or(Value::Null))
            .map_err(|e| invalid(format!("its compactor settings: {e}")))?;
    let prefix = job_compaction_prefix(&d.delivery_id.0);
    let done = rt
        .state()
        .compactions(&session_id)
        .await
        .map_err(|e| JobFailure {
            message: e.to_string(),
            retryable: true,
        })?
        .into_iter()
        .find(|c| c.id.starts_with(&prefix) && c.status == "succeeded");
    if let Some(c) = done {
        tracing::info!(job = %d.delivery_id, session = %session_id, compaction = %c.id, "compaction job already done by an earlier attempt");
        return Ok(());
    }
    let id = format!("{prefix}{}", d.attempt);
    match compact_session_as(rt, &session_id, &cfg, run_id, id).await {
        Ok(c) => {
            tracing::info!(job = %d.delivery_id, session = %session_id, compaction = %c.id, node = rt.node_id(), "compaction job done");
            Ok(())
        }
        Err(e) => Err(JobFailure {
            message: e.to_string(),
            retryable: true,
        }),
    }
}
