//! Invocation records of every tool call, whatever its dialect: the
//! [`Recorder`] that [`Runtime::call_tool_approved_by`](crate::Runtime::call_tool_approved_by)
//! (the one path the CLI, the HTTP API, the MCP gateway and the agent turn
//! all take) feeds, the status an outcome maps to, the counters `/metrics`
//! shows, and the `invocations:` setting of plugd.yaml (retention).
//!
//! **Off the call's path**: a call only builds its record and queues it
//! on the store's journal writer ([`plugd_store::journal`]), which gathers
//! records (and the audit trail's entries) for up to
//! [`LINGER`](plugd_store::journal::LINGER) and writes them in one
//! transaction on its own connection. When the queue is full (the writer
//! is [`QUEUE`](plugd_store::journal::QUEUE) entries behind) the caller
//! writes its own record, so nothing is dropped; a record that cannot be
//! written is logged and counted ([`InvocationStats::unwritten`]), and the
//! call's own outcome never depends on it. The counters `/metrics` shows
//! are kept as records are taken.
//!
//! Every record names the surface the call came in by and its trace id
//! (the caller's, else a new one; see [`crate::governed`]).
//!
//! A call through a binding ([`crate::bindings_rt`]) fills binding,
//! package and version from its context ([`fill_from_binding`]); chain and
//! run (agent chains) stay empty until agent chains exist.
//!
//! The record's `payload` ([`crate::record_payload`]) holds the error of a
//! call that did not succeed, the decisions the governed path took on it
//! (hooks, the risk approval, policy), and, only when plugd.yaml's
//! `records.keep_bodies` is on, its arguments and result, masked and
//! cut.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use plugd_control::invocations::{InvocationRecord, TerminalStatus, rfc3339_ms};
use plugd_host::CallToolError;
use plugd_host::dialect::CallContext;
use plugd_host::model::ToolError;
use plugd_host::peer::CallError;
use plugd_manifest::PluginSpec;
use plugd_store::StateStore;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{RuntimeError, ToolEntry};

/// How often `plugd serve` applies the retention (and once at start).
pub const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// `invocations:` in plugd.yaml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvocationsConfig {
    /// Days a record is kept, counted from its start (default 30, at least 1).
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
    /// Whether records keep the call's arguments and result (`payload.args`,
    /// `payload.result`), masked and cut (default `false`): plugd.yaml's
    /// `records.keep_bodies` (issue 30 names it so), not a key of
    /// `invocations:`.
    #[serde(skip)]
    pub keep_bodies: bool,
}

/// `records:` in plugd.yaml: what an invocation record keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordsConfig {
    /// Keep each call's arguments and result, masked and cut.
    #[serde(default)]
    pub keep_bodies: bool,
}

fn default_retention_days() -> u32 {
    30
}

impl Default for InvocationsConfig {
    fn default() -> Self {
        InvocationsConfig {
            retention_days: default_retention_days(),
            keep_bodies: false,
        }
    }
}

/// Calls and summed durations of one plugin and status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Invocations that ended so.
    pub calls: u64,
    /// Their durations, summed, in milliseconds.
    pub duration_ms: u64,
}

/// What `/metrics` shows of the records.
#[derive(Debug)]
pub struct InvocationStats {
    by: Mutex<BTreeMap<(String, TerminalStatus), Counts>>,
    store: Arc<dyn StateStore>,
}

impl InvocationStats {
    /// Counts per plugin and status, sorted.
    pub fn by_plugin(&self) -> Vec<((String, TerminalStatus), Counts)> {
        let by = self.by.lock().unwrap_or_else(|p| p.into_inner());
        by.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Records that could not be written.
    pub fn unwritten(&self) -> u64 {
        self.store.journal_unwritten().1
    }

    fn count(&self, r: &InvocationRecord) {
        let mut by = self.by.lock().unwrap_or_else(|p| p.into_inner());
        let c = match by.get_mut(&(r.plugin_id.clone(), r.status)) {
            Some(c) => c,
            None => by.entry((r.plugin_id.clone(), r.status)).or_default(),
        };
        c.calls += 1;
        c.duration_ms += r.duration_ms;
    }
}

/// Takes invocation records; see the module docs.
pub struct Recorder {
    store: Arc<dyn StateStore>,
    /// Live surfaces: each record as it is taken ([`crate::events`]).
    events: Option<tokio::sync::broadcast::Sender<crate::events::RtEvent>>,
    stats: Arc<InvocationStats>,
    /// `records.keep_bodies`: 0 not read yet, 1 off, 2 on.
    keep_bodies: std::sync::atomic::AtomicU8,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder into the database of `store` (written by its journal
    /// writer).
    pub fn start(store: &Arc<dyn StateStore>) -> Recorder {
        Recorder {
            store: store.clone(),
            events: None,
            stats: Arc::new(InvocationStats {
                by: Mutex::default(),
                store: store.clone(),
            }),
            keep_bodies: std::sync::atomic::AtomicU8::new(0),
        }
    }

    /// Sends every record taken from now on to `events` too.
    pub(crate) fn with_events(
        mut self,
        events: tokio::sync::broadcast::Sender<crate::events::RtEvent>,
    ) -> Recorder {
        self.events = Some(events);
        self
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<InvocationStats> {
        &self.stats
    }

    /// Starts the record of a call of `entry` (served by `spec`); finish it
    /// with [`Pending::finish`], or drop it for `cancelled`.
    pub(crate) fn begin<'a>(
        &'a self,
        entry: &'a ToolEntry,
        spec: Option<&'a PluginSpec>,
        ctx: &'a CallContext,
        surface: crate::governed::Surface,
    ) -> Pending<'a> {
        let invocation_id = ctx.invocation_id.clone().unwrap_or_else(fresh_id);
        Pending {
            recorder: self,
            entry,
            spec,
            ctx,
            surface,
            invocation_id,
            started: Instant::now(),
            started_ms: now_ms(),
            done: false,
        }
    }

    fn submit(&self, record: Box<InvocationRecord>) {
        if let Some(events) = &self.events
            && events.receiver_count() > 0
        {
            let _ = events.send(crate::events::RtEvent::Invocation(Arc::new(
                (*record).clone(),
            )));
        }
        self.stats.count(&record);
        self.store.journal_invocation(record);
    }

    /// Waits until every record queued so far is written (a CLI command
    /// before it exits).
    pub fn flush(&self) {
        self.store.flush_journal();
    }

    /// Deletes the records older than `days`; how many.
    pub async fn prune(&self, days: u32) -> Result<u64, plugd_store::StoreError> {
        let before = now_ms() - i64::from(days) * 86_400_000;
        self.store.delete_invocations_before(before).await
    }

    /// [`Recorder::prune`] as the cluster's one retention job: under the
    /// [`RETENTION_LEASE`] taken for `holder`, the delete fenced by it (a
    /// holder that lost the lease meanwhile deletes nothing) and the lease
    /// given up after. `None` while another holder has it.
    pub async fn prune_singleton(
        &self,
        days: u32,
        holder: &str,
    ) -> Result<Option<u64>, plugd_store::StoreError> {
        let Some(lease) = self
            .store
            .lease_acquire(RETENTION_LEASE, holder, RETENTION_LEASE_TTL_MS)
            .await?
        else {
            return Ok(None);
        };
        let before = now_ms() - i64::from(days) * 86_400_000;
        let fence = lease.fence();
        let deleted = self
            .store
            .delete_invocations_before_fenced(before, &fence)
            .await;
        if let Err(e) = self.store.lease_release(&fence).await {
            tracing::warn!("cannot give the retention lease up (it runs out by itself): {e}");
        }
        deleted.map(Some)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
    }
}

/// A call under way; its record is written when it is finished or dropped.
pub(crate) struct Pending<'a> {
    recorder: &'a Recorder,
    entry: &'a ToolEntry,
    spec: Option<&'a PluginSpec>,
    ctx: &'a CallContext,
    surface: crate::governed::Surface,
    invocation_id: String,
    started: Instant,
    started_ms: i64,
    done: bool,
}

impl<'a> Pending<'a> {
    /// This record's invocation id.
    pub(crate) fn id(&self) -> &str {
        &self.invocation_id
    }

    /// The context the plugin gets: for a VAI export, one whose
    /// `invocation_id` is this record's (the only contract that sends it).
    pub(crate) fn context(&self) -> Cow<'a, CallContext> {
        let sends = self.spec.is_some_and(|s| {
            plugd_dialects::of(s.dialect)
                .capabilities()
                .sends_invocation_id
        });
        if sends && self.ctx.invocation_id.is_none() {
            let mut ctx = self.ctx.clone();
            ctx.invocation_id = Some(self.invocation_id.clone());
            Cow::Owned(ctx)
        } else {
            Cow::Borrowed(self.ctx)
        }
    }

    /// Records how the call ended: its status, and the payload of what
    /// `called` says (its error, its decisions, its bodies when `keep_bodies`),
    /// with `secrets` masked.
    pub(crate) fn finish(
        mut self,
        called: &crate::governed::Called,
        secrets: &[String],
        keep_bodies: bool,
    ) {
        let (status, code, message) = match &called.outcome {
            Ok(_) => (TerminalStatus::Succeeded, None, None),
            Err(e) => {
                let (s, c) = classify(e);
                (s, Some(c), Some(e.to_string()))
            }
        };
        let bodies = keep_bodies.then(|| crate::record_payload::Bodies {
            args: &called.args,
            result: called.outcome.as_ref().ok(),
        });
        let payload = crate::record_payload::build(
            code.zip(message.as_deref()),
            &called.decisions,
            bodies,
            secrets,
        );
        self.done = true;
        self.record(status, code, payload);
    }

    fn record(
        &self,
        status: TerminalStatus,
        error_code: Option<&'static str>,
        payload: Option<Value>,
    ) {
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let ctx = self.ctx;
        let mut record = Box::new(InvocationRecord {
            invocation_id: self.invocation_id.clone(),
            export_kind: "tool".to_owned(),
            export_id: self.entry.def.wire().to_owned(),
            tool: self.entry.name.clone(),
            plugin_id: self.entry.plugin.clone(),
            dialect: self.spec.map_or("unknown", dialect_name).to_owned(),
            binding_id: None,
            package_id: None,
            package_version: None,
            execution_class: self.execution_class().map(str::to_owned),
            started_at: rfc3339_ms(self.started_ms),
            ended_at: rfc3339_ms(self.started_ms + duration_ms as i64),
            started_ms: self.started_ms,
            duration_ms,
            status,
            retry_count: 0,
            error_code: error_code.map(str::to_owned),
            caller: caller_of(ctx),
            org_id: ctx.org_id.clone(),
            project_id: ctx.project_id.clone(),
            session_id: ctx.session_id.clone(),
            chain_id: None,
            run_id: None,
            // The call's trace (the governed path gave every call one).
            trace_id: ctx.trace_id.clone().or_else(plugd_telemetry::trace_id),
            execution_id: None,
            surface: Some(self.surface.name().to_owned()),
            payload,
        });
        fill_from_binding(&mut record, ctx);
        self.recorder.submit(record);
    }

    fn execution_class(&self) -> Option<&'static str> {
        let vai = self.spec?.vai.as_ref()?;
        let export = vai.exports.iter().find(|e| e.id == self.entry.def.wire())?;
        Some(match export.execution_class {
            plugd_manifest::vai::ExecutionClass::Inline => "inline",
            plugd_manifest::vai::ExecutionClass::Worker => "worker",
            plugd_manifest::vai::ExecutionClass::Isolated => "isolated",
        })
    }
}

impl Drop for Pending<'_> {
    /// Dropped unfinished: the caller went away (an MCP cancel, a closed
    /// HTTP connection, a deadline of the caller's own).
    fn drop(&mut self) {
        if !self.done {
            let message = "the caller went away before the call ended";
            let payload =
                crate::record_payload::build(Some(("cancelled", message)), &[], None, &[]);
            self.record(TerminalStatus::Cancelled, Some("cancelled"), payload);
        }
    }
}

/// Who made a call, as records and approvals name it: the context's
/// caller (`token:NAME`, `cli:USER`, a Unix user), else `agent:ID`.
pub(crate) fn caller_of(ctx: &CallContext) -> Option<String> {
    ctx.caller
        .clone()
        .or_else(|| ctx.agent_id.as_ref().map(|a| format!("agent:{a}")))
}

/// Where the binding of a call (its id, package and version) goes into the
/// record; the agent's chain and run will join them once the call context
/// carries them.
fn fill_from_binding(record: &mut InvocationRecord, ctx: &CallContext) {
    if let Some(b) = &ctx.bound {
        record.binding_id = Some(b.binding_id.clone());
        record.package_id = Some(b.package_id.clone());
        record.package_version = Some(b.package_version.clone());
    }
}

/// The terminal status and error code of a failed call: what may succeed
/// when retried (timeouts, crashes, an unreachable or overloaded plugin) is
/// `retryable_failure`; refusals and tool errors are `failed`.
pub fn classify(e: &RuntimeError) -> (TerminalStatus, &'static str) {
    use TerminalStatus::{Failed, RetryableFailure};
    match e {
        RuntimeError::Call(CallToolError::Plugin(_)) => (RetryableFailure, "plugin_unavailable"),
        RuntimeError::Call(CallToolError::Tool(t)) => match t {
            ToolError::Unavailable { .. } => (RetryableFailure, "tool_unavailable"),
            ToolError::Call(CallError::Timeout { .. }) => (RetryableFailure, "timeout"),
            ToolError::Call(CallError::Closed(_)) => (RetryableFailure, "plugin_crashed"),
            ToolError::Call(CallError::FrameTooLarge { .. }) => (Failed, "frame_too_large"),
            ToolError::Call(_) => (Failed, "plugin_error"),
            ToolError::NotFound { .. } => (Failed, "tool_not_found"),
            ToolError::ArgumentInvalid { .. } => (Failed, "invalid_arguments"),
            ToolError::ExecutionFailed { .. } => (Failed, "tool_failed"),
            ToolError::Denied { .. } => (Failed, "tool_denied"),
            ToolError::NotImplemented { .. } => (Failed, "not_implemented"),
            #[allow(unreachable_patterns)]
            _ => (Failed, "tool_error"),
        },
        RuntimeError::Args(_) => (Failed, "invalid_arguments"),
        RuntimeError::Gate(_) => (Failed, "refused"),
        RuntimeError::BlockedByHook { .. } => (Failed, "blocked_by_hook"),
        RuntimeError::RateLimited { .. } => (Failed, "rate_limited"),
        RuntimeError::Stopped { .. } => (Failed, "plugin_stopped"),
        RuntimeError::Broken { .. } => (Failed, "plugin_broken"),
        RuntimeError::NotApproved { .. } | RuntimeError::PluginChanged { .. } => {
            (Failed, "plugin_not_approved")
        }
        RuntimeError::InvalidBinding { .. } => (Failed, "invalid_binding"),
        RuntimeError::UnknownExport { .. } => (Failed, "unknown_export"),
        _ => (Failed, "internal"),
    }
}

fn dialect_name(spec: &PluginSpec) -> &'static str {
    plugd_dialects::of(spec.dialect).name()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `inv_` and 32 hex digits: a UUIDv7 (the time and 74 random bits).
fn fresh_id() -> String {
    plugd_control::id::fresh("inv")
}

/// A new invocation id, for a surface that names the record before the
/// call runs (the HTTP API's `Plugd-Invocation-Id` header): put it in the
/// call context's `invocation_id` and the record takes it.
pub fn fresh_invocation_id() -> String {
    fresh_id()
}

impl crate::Runtime {
    /// Sets plugd.yaml's `invocations:` in force (what serve's config gate
    /// does when the file changes); without it, the runtime reads
    /// plugd.yaml on first use.
    pub fn set_invocations_config(&self, config: &InvocationsConfig) {
        let v = if config.keep_bodies { 2 } else { 1 };
        self.inner
            .invocations
            .keep_bodies
            .store(v, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether records keep the call's arguments and result
    /// (`records.keep_bodies`); off when plugd.yaml cannot be read.
    pub(crate) fn keep_bodies(&self) -> bool {
        use std::sync::atomic::Ordering;
        match self.inner.invocations.keep_bodies.load(Ordering::Relaxed) {
            // Read once; a file that does not load is read again next time.
            0 => match crate::config::PlugdConfig::load(self.dir()) {
                Ok(c) => {
                    self.set_invocations_config(&c.invocations);
                    c.invocations.keep_bodies
                }
                Err(_) => false,
            },
            v => v == 2,
        }
    }
}

/// The lease the retention job holds while it deletes: one node of a
/// cluster at a time.
pub const RETENTION_LEASE: &str = "retention";

/// How long the retention lease lasts unless given up (a node that dies
/// while deleting holds it no longer than this).
pub const RETENTION_LEASE_TTL_MS: i64 = 5 * 60 * 1000;

/// The retention task of `plugd serve`; stopped when dropped.
#[derive(Debug)]
pub struct Retention(tokio::task::JoinHandle<()>);

impl Drop for Retention {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies the retention of `days` now and every [`RETENTION_EVERY`] (what
/// `plugd serve` runs), until the returned handle is dropped.
pub fn spawn_retention(rt: &crate::Runtime, days: u32) -> Retention {
    Retention(tokio::spawn(retention_task(rt.clone(), days)))
}

async fn retention_task(rt: crate::Runtime, days: u32) {
    let holder = format!("{}/retention", rt.node_id());
    let mut every = tokio::time::interval(RETENTION_EVERY);
    loop {
        every.tick().await;
        match rt.invocations().prune_singleton(days, &holder).await {
            Ok(None) => tracing::debug!("another node applies the invocation retention now"),
            Ok(Some(0)) => {}
            Ok(Some(n)) => tracing::info!("deleted {n} invocation records older than {days} days"),
            Err(e) => tracing::warn!("cannot apply the invocation retention: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_sort_by_time() {
        let a = fresh_id();
        let b = fresh_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), "inv_".len() + 32);
    }

    #[test]
    fn the_writer_loses_nothing_past_its_queue_and_counts_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = Arc::new(plugd_store::Store::open(&dir.path().join(".plugd")).unwrap());
        let rec = Recorder::start(&(sqlite.clone() as Arc<dyn StateStore>));
        let store = sqlite;
        let n = plugd_store::journal::QUEUE + 500;
        std::thread::scope(|s| {
            for t in 0..4 {
                let rec = &rec;
                s.spawn(move || {
                    for i in (t..n).step_by(4) {
                        rec.submit(Box::new(record(i)));
                    }
                });
            }
        });
        rec.flush();
        let page = store
            .list_invocations(&plugd_control::InvocationFilter {
                limit: 500,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(page.invocations.len(), 500);
        let counts = rec.stats().by_plugin();
        assert_eq!(counts.len(), 1);
        assert_eq!(counts[0].1.calls, n as u64);
        assert_eq!(counts[0].1.duration_ms, n as u64 * 3);
        assert_eq!(rec.stats().unwritten(), 0);
        assert_eq!(store.delete_invocations_before(i64::MAX).unwrap(), n as u64);
    }

    #[tokio::test]
    async fn retention_runs_only_under_its_lease_and_gives_it_up() {
        let dir = tempfile::tempdir().unwrap();
        let state: Arc<dyn StateStore> =
            Arc::new(plugd_store::Store::open(&dir.path().join(".plugd")).unwrap());
        let rec = Recorder::start(&state);
        for i in 0..10 {
            rec.submit(Box::new(record(i)));
        }
        rec.flush();
        // Another node holds the retention lease: this one deletes nothing.
        let other = state
            .lease_acquire(RETENTION_LEASE, "other-node", 60_000)
            .await
            .unwrap()
            .unwrap();
        let kept = || async {
            let filter = plugd_control::InvocationFilter {
                limit: 50,
                ..Default::default()
            };
            state
                .list_invocations(&filter)
                .await
                .unwrap()
                .invocations
                .len()
        };
        assert_eq!(rec.prune_singleton(1, "this-node").await.unwrap(), None);
        assert_eq!(kept().await, 10);
        assert!(state.lease_release(&other.fence()).await.unwrap());
        // Free: this node takes it, deletes the old records, gives it up.
        assert_eq!(rec.prune_singleton(1, "this-node").await.unwrap(), Some(10));
        assert_eq!(kept().await, 0);
        assert_eq!(state.lease_holder(RETENTION_LEASE).await.unwrap(), None);
    }

    fn record(i: usize) -> InvocationRecord {
        InvocationRecord {
            invocation_id: format!("inv_{i}"),
            export_kind: "tool".into(),
            export_id: "echo".into(),
            tool: "p/echo".into(),
            plugin_id: "p".into(),
            dialect: "native".into(),
            binding_id: None,
            package_id: None,
            package_version: None,
            execution_class: None,
            started_at: rfc3339_ms(i as i64),
            ended_at: rfc3339_ms(i as i64 + 3),
            started_ms: i as i64,
            duration_ms: 3,
            status: TerminalStatus::Succeeded,
            retry_count: 0,
            error_code: None,
            caller: None,
            org_id: None,
            project_id: None,
            session_id: None,
            chain_id: None,
            run_id: None,
            trace_id: None,
            execution_id: None,
            surface: None,
            payload: None,
        }
    }

    #[test]
    fn timeouts_and_crashes_may_be_retried_tool_errors_not() {
        let tool = |t: ToolError| RuntimeError::Call(CallToolError::Tool(t));
        let failed = tool(ToolError::ExecutionFailed {
            plugin: "p".into(),
            tool: "t".into(),
            message: "boom".into(),
        });
        assert_eq!(classify(&failed), (TerminalStatus::Failed, "tool_failed"));
        let busy = tool(ToolError::Unavailable {
            plugin: "p".into(),
            tool: "t".into(),
            message: "busy".into(),
            retry_after_ms: Some(10),
        });
        assert_eq!(
            classify(&busy),
            (TerminalStatus::RetryableFailure, "tool_unavailable")
        );
        assert_eq!(
            classify(&RuntimeError::UnknownTool("x".into())),
            (TerminalStatus::Failed, "internal")
        );
    }

    #[test]
    fn retention_defaults_to_30_days_and_refuses_unknown_keys() {
        assert_eq!(InvocationsConfig::default().retention_days, 30);
        let c: InvocationsConfig = serde_json::from_str(r#"{"retention_days": 7}"#).unwrap();
        assert_eq!(c.retention_days, 7);
        assert!(serde_json::from_str::<InvocationsConfig>(r#"{"days": 7}"#).is_err());
        let parse = |text: &str| {
            crate::config::PlugdConfig::parse(
                text,
                std::path::Path::new("/w/plugd.yaml"),
                std::path::Path::new("/w"),
            )
        };
        let text = "invocations:\n  retention_days: 7\n";
        assert_eq!(parse(text).unwrap().invocations.retention_days, 7);
        assert_eq!(
            crate::config::schema_violations(text).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(parse("").unwrap().invocations.retention_days, 30);
        // Bodies are kept only when asked for.
        assert!(!parse("").unwrap().invocations.keep_bodies);
        let text = "records:\n  keep_bodies: true\n";
        let c = parse(text).unwrap().invocations;
        assert!(c.keep_bodies && c.retention_days == 30, "{c:?}");
        assert_eq!(
            crate::config::schema_violations(text).unwrap(),
            Vec::<String>::new()
        );
        assert!(
            !crate::config::schema_violations("records: {keep_bodies: 1}\n")
                .unwrap()
                .is_empty()
        );
        let zero = parse("invocations:\n  retention_days: 0\n")
            .unwrap_err()
            .to_string();
        assert!(zero.contains("invocations.retention_days"), "{zero}");
        assert!(parse("invocations:\n  keep: 7\n").is_err());
        assert!(
            !crate::config::schema_violations("invocations: {keep: 7}\n")
                .unwrap()
                .is_empty()
        );
    }
}
