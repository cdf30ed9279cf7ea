//! Runs: harness exports started with `harness.run` (seed 003), child runs
//! a harness records through its delegated token, and the limits a run's
//! policy sets on them.
//!
//! A harness run: the session is opened (or created) in the caller's
//! scope, a `running` run is stored, the harness gets a delegation token
//! for its own run (children it starts hang below it), its `event` frames
//! reach the caller as progress, and its terminal status, `checkpoint`,
//! `summary` and `artifacts` are stored on the run, which then emits a
//! durable `run.completed`. A `continue` of a harness whose manifest does
//! not list `continue` in `supports` is refused before anything is sent.

use std::time::{Duration, Instant};

use plugd_control::chains::{Run, RunKind, RunPatch, RunStatus, fresh_id};
use plugd_dialects::vai::{self, InvokeError};
use plugd_host::Supervised;
use plugd_host::dialect::CallContext;
use plugd_manifest::vai::ExportKind;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::Runtime;
use crate::outbox::OutboxExt;
use plugd_store::outbox::NewEvent;

/// Default deadline of a harness run whose export names none (30 min).
pub const DEFAULT_HARNESS_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// `policy` of `harness.run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPolicy {
    /// Deepest child run below this one.
    pub max_depth: u32,
    /// Most child runs this run may start.
    pub max_child_runs: u32,
    /// Whether the harness may ask for compactions.
    pub allow_compaction: bool,
}

impl Default for RunPolicy {
    fn default() -> RunPolicy {
        RunPolicy {
            max_depth: 4,
            max_child_runs: 12,
            allow_compaction: true,
        }
    }
}

/// What starts a harness run.
#[derive(Debug, Clone, Default)]
pub struct HarnessStart {
    /// `PACKAGE/EXPORT`.
    pub harness: String,
    /// The session (created when new).
    pub session_id: String,
    /// `start` or `continue`.
    pub mode: String,
    /// The user's text (`trigger.input`).
    pub input: Option<String>,
    /// `trigger.type` (default `user_request`).
    pub trigger_type: Option<String>,
    /// The policy.
    pub policy: RunPolicy,
    /// The run that started this one (a harness's child).
    pub parent_run_id: Option<String>,
    /// Org and project (from the caller's token).
    pub org_id: Option<String>,
    /// Project.
    pub project_id: Option<String>,
    /// Who asked.
    pub created_by: String,
    /// The scopes of the delegation token that started this run (a
    /// harness's child harness): the child's are never more.
    pub scope_ceiling: Option<Vec<String>>,
}

/// Why a run did not start, or a child run was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Bad request: unknown harness, wrong kind, unsupported mode, bad ids.
    #[error("{0}")]
    Invalid(String),
    /// The run's policy forbids it (depth, child count).
    #[error("{0}")]
    Policy(String),
    /// A session or run that does not exist (or the caller may not see).
    #[error("{0}")]
    NotFound(String),
    /// The state store failed.
    #[error("{0}")]
    Store(String),
}

fn store_err(e: plugd_store::StoreError) -> RunError {
    RunError::Store(e.to_string())
}

impl Runtime {
    /// The supervisor and export id of `name` (`PACKAGE/EXPORT`), which must
    /// be a VAI export of `kind` of an approved workspace plugin or, when the
    /// workspace has no plugin of that id, of an installed package (its
    /// highest version).
    pub async fn resolve_export(
        &self,
        name: &str,
        kind: ExportKind,
    ) -> Result<(Supervised, String), String> {
        let Some((plugin, export)) = name.rsplit_once('/') else {
            return Err(format!(
                "{name:?} is not PACKAGE/EXPORT (e.g. acme/devkit/triage)"
            ));
        };
        let sup = match self.supervised(plugin) {
            Ok(sup) => sup.clone(),
            Err(workspace) => match self.installed_package(plugin).await {
                Ok(Some(sup)) => sup,
                Ok(None) => {
                    return Err(format!(
                        "{workspace}; no package {plugin:?} is installed either (`plugd package list`)"
                    ));
                }
                Err(e) => return Err(e.to_string()),
            },
        };
        let spec = sup.spec();
        let Some(found) = spec.vai.as_ref().and_then(|v| v.export(export)) else {
            return Err(format!(
                "plugin {plugin:?} has no VAI export {export:?}; `plugd plugin show {plugin}` lists its exports"
            ));
        };
        if found.kind != kind {
            return Err(format!(
                "export {export:?} of {plugin:?} is a {}, not a {}",
                found.kind.as_str(),
                kind.as_str()
            ));
        }
        Ok((sup, export.to_owned()))
    }

    /// Checks whether `parent` may have one more child run: its depth + 1
    /// within its policy's `max_depth`, and fewer than `max_child_runs`
    /// children so far. Returns the child's depth.
    pub async fn check_child(&self, parent: &Run) -> Result<u32, RunError> {
        let policy: RunPolicy = parent
            .input
            .get("policy")
            .and_then(|p| serde_json::from_value(p.clone()).ok())
            .unwrap_or_default();
        let depth = parent.depth + 1;
        if depth > policy.max_depth {
            return Err(RunError::Policy(format!(
                "run {} is at depth {} and its policy's max_depth is {}; no deeper child run may start",
                parent.id, parent.depth, policy.max_depth
            )));
        }
        let children = self
            .state()
            .child_runs(&parent.id)
            .await
            .map_err(store_err)?;
        if children >= u64::from(policy.max_child_runs) {
            return Err(RunError::Policy(format!(
                "run {} has started {children} child runs, its policy's max_child_runs",
                parent.id
            )));
        }
        Ok(depth)
    }

    /// Starts a harness run and waits for its end: the stored run. Events
    /// the harness sends go to `progress` as they come. A harness that
    /// fails still yields its run (status `failed`, `retryable_failure` or
    /// `cancelled`, and `error`); `Err` is for a run that could not start.
    pub async fn run_harness(
        &self,
        start: HarnessStart,
        progress: Option<mpsc::UnboundedSender<Value>>,
    ) -> Result<Run, RunError> {
        let (sup, export_id) = self
            .resolve_export(&start.harness, ExportKind::Harness)
            .await
            .map_err(RunError::Invalid)?;
        let spec = sup.spec().clone();
        let export = spec
            .vai
            .as_ref()
            .and_then(|v| v.export(&export_id))
            .cloned()
            .ok_or_else(|| RunError::Invalid(format!("no export {export_id:?}")))?;
        let supports = export
            .harness
            .as_ref()
            .map(|h| h.supports.clone())
            .unwrap_or_default();
        match start.mode.as_str() {
            "start" => {}
            "continue" if supports.iter().any(|s| s == "continue") => {}
            "continue" => {
                return Err(RunError::Invalid(format!(
                    "harness {} does not support \"continue\" (its manifest's supports: [{}]); start a new run with mode start",
                    start.harness,
                    supports.join(", ")
                )));
            }
            other => {
                return Err(RunError::Invalid(format!(
                    "mode {other:?} is not start or continue"
                )));
            }
        }
        let store = self.state();
        let (session, _) = store
            .session_open(
                &start.session_id,
                start.org_id.as_deref(),
                start.project_id.as_deref(),
            )
            .await
            .map_err(|e| RunError::Invalid(e.to_string()))?;
        if session.org_id != start.org_id
            || (start.project_id.is_some() && session.project_id != start.project_id)
        {
            return Err(RunError::NotFound(format!(
                "session {:?} belongs to another scope",
                start.session_id
            )));
        }
        let depth = match &start.parent_run_id {
            None => 0,
            Some(p) => {
                let parent = store
                    .run(p)
                    .await
                    .map_err(store_err)?
                    .ok_or_else(|| RunError::NotFound(format!("run {p:?} does not exist")))?;
                self.check_child(&parent).await?
            }
        };
        let trigger = json!({
            "type": start.trigger_type.clone().unwrap_or_else(|| "user_request".into()),
            "input": start.input.as_ref().map_or_else(Vec::new, |t| vec![json!({"type": "text", "text": t})]),
        });
        let run = Run {
            id: fresh_id("run"),
            session_id: session.id.clone(),
            chain_id: session.head_chain_id.clone(),
            parent_run_id: start.parent_run_id.clone(),
            depth,
            kind: RunKind::Harness,
            harness: Some(start.harness.clone()),
            mode: Some(start.mode.clone()),
            status: RunStatus::Running,
            input: json!({"trigger": trigger, "policy": start.policy}),
            checkpoint: Value::Null,
            summary: Value::Null,
            artifacts: json!([]),
            error: None,
            created_by: start.created_by.clone(),
            created_at: plugd_store::now_rfc3339(),
            ended_at: None,
        };
        store.run_create(&run).await.map_err(store_err)?;
        let timeout = export.default_timeout.unwrap_or(DEFAULT_HARNESS_TIMEOUT);
        let ctx = CallContext {
            session_id: Some(session.id.clone()),
            chain_id: session.head_chain_id.clone(),
            run_id: Some(run.id.clone()),
            org_id: session.org_id.clone(),
            project_id: session.project_id.clone(),
            invocation_id: Some(fresh_id("inv")),
            progress,
            caller: Some(start.created_by.clone()),
            ..CallContext::default()
        };
        let minted = self.delegate_within(
            &spec,
            &export_id,
            &ctx,
            timeout,
            start.scope_ceiling.as_deref(),
        );
        let ctx = CallContext {
            gateway: minted.as_ref().map(|m| m.grant.clone()),
            ..ctx
        };
        let request = vai::HarnessRequest {
            mode: start.mode.clone(),
            target: json!({
                "session_id": session.id,
                "chain_id": session.head_chain_id,
                "execution_id": run.id,
            }),
            trigger,
            policy: serde_json::to_value(start.policy).unwrap_or(Value::Null),
        };
        let deadline = Instant::now() + timeout;
        let outcome: Result<Value, (RunStatus, String)> = async {
            // The process of the harness's execution class (per invocation
            // for an isolated harness granted scratch).
            let conn = sup
                .export_connection(&export_id, &ctx, deadline)
                .await
                .map_err(|e| (RunStatus::RetryableFailure, e.to_string()))?;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            vai::run_harness(&conn, &export_id, request, conn.context(), left)
                .await
                .map_err(|e| {
                    let status = match &e {
                        InvokeError::Failed { status, .. } => {
                            RunStatus::parse(status).unwrap_or(RunStatus::Failed)
                        }
                        InvokeError::Call(plugd_host::peer::CallError::Timeout { .. })
                        | InvokeError::Busy { .. }
                        | InvokeError::QueueTimeout { .. } => RunStatus::RetryableFailure,
                        _ => RunStatus::Failed,
                    };
                    (status, e.to_string())
                })
        }
        .await;
        // The harness's token dies with its invocation.
        drop(minted);
        let patch = match &outcome {
            Ok(result) => RunPatch {
                status: Some(RunStatus::Succeeded),
                checkpoint: result.get("checkpoint").cloned(),
                summary: result.get("summary").cloned(),
                artifacts: result.get("artifacts").cloned(),
                ..RunPatch::default()
            },
            Err((status, message)) => RunPatch {
                status: Some(*status),
                error: Some(message.clone()),
                ..RunPatch::default()
            },
        };
        // The run's end and its `run.completed` are one transaction: a crash
        // between them cannot lose the event.
        let subscribers = self.subscribers("run.completed");
        let report = |ended: &plugd_control::chains::Run| NewEvent {
            event_type: "run.completed".to_owned(),
            subject: json!({"kind": "run", "id": ended.id}),
            summary: json!({
                "session_id": ended.session_id,
                "harness": start.harness,
                "status": ended.status.as_str(),
                "task": start.input,
                "output": ended.summary.get("text"),
            }),
        };
        let (ended, queued) = store
            .run_finish(&run.id, &patch, &report, &subscribers)
            .await
            .map_err(store_err)?
            .ok_or_else(|| RunError::Store(format!("run {} vanished", run.id)))?;
        crate::outbox::woke(&queued);
        Ok(ended)
    }
}
