//! The risk policy: every tool's risk level, per-tool enable/disable, and the
//! gate every tool call passes through ([`Runtime::call_tool_with`]).
//!
//! * A tool's **risk** is `low`, `medium`, `high` or `critical`: the level
//!   plugd.yaml's `risk.tools` gives it, else the level its plugin declares
//!   (Salmex `risk_level`), else `medium`.
//! * `low` runs. `medium` runs and is noticed: a log line and a
//!   `tool.risk_notice` outbox event (and a notice in the agent turn); the
//!   event is recorded at most once per tool per minute and process, with
//!   the number of calls it covers, so most calls write nothing.
//!   `high` and `critical` run only when the runtime's [`Approver`] approves
//!   that one call; with no approver the call is denied, never run.
//! * A **disabled** tool (`plugd tool disable NAME`, kept in the state store)
//!   is hidden from [`Runtime::tools`] (the agent's tool list and
//!   `GET /v1/tools`) and refused by every call path; its plugin's other tools
//!   are unaffected.
//!
//! Approvers: the CLI asks on the terminal; `plugd serve` uses the
//! [`ApprovalQueue`], which records a pending approval in the store (with
//! who asks: the caller, the surface, the session and the agent) and waits
//! until an operator decides it (`POST /v1/approvals/{id}:approve|deny`,
//! `plugd approvals approve|deny ID`) or `risk.approval_timeout_secs` passes,
//! which denies.
//!
//! **Architecture invariant**: a call that is refused here never reaches the
//! plugin: the gate runs after argument validation and before the plugin's
//! connection is asked for.
//!
//! Why one file: the gate, the approval queue it waits on and the per-tool
//! switches share one state (`RiskState`: the policy, the approver, the
//! disabled tools as last read, the notice windows, the `decided` notifier)
//! and make one decision on every call.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use plugd_host::dialect::CallContext;
use plugd_store::StateStore;
pub use plugd_store::tool_state::{ApprovalState, CallApproval};
use plugd_store::tool_state::{Decide, NewCallApproval};
use serde::{Serialize, Serializer};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::config::PlugdConfig;
use crate::hooks::{Notice, NoticeKind};
use crate::outbox::OutboxExt;
use crate::record_payload::CallDecision;
pub use crate::risk_config::{
    DEFAULT_APPROVAL_TIMEOUT_SECS, MAX_APPROVAL_TIMEOUT_SECS, RawRisk, RiskConfig, RiskLevel,
    RiskSource, parse_config,
};
use crate::{Runtime, RuntimeError, ToolEntry};

/// The outbox event type a `medium` call records.
pub const NOTICE_EVENT: &str = "tool.risk_notice";

/// A medium tool's `tool.risk_notice` events are at most one per this
/// window per process; each says how many calls it covers.
pub const NOTICE_WINDOW: Duration = Duration::from_secs(60);

/// Disabled (plugin, tool) pairs.
type DisabledSet = std::collections::HashSet<(String, String)>;

/// Longest argument preview kept in an approval record or a prompt.
pub const MAX_ARGS_PREVIEW: usize = 2_000;

/// How often a waiting call re-reads its approval record (decisions made by
/// another process, e.g. `plugd approvals approve`).
const POLL: Duration = Duration::from_millis(250);

/// One call an [`Approver`] is asked about.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalRequest {
    /// The tool's registry name.
    pub tool: String,
    /// Its plugin.
    pub plugin: String,
    /// Its effective risk (`high` or `critical`).
    pub risk: RiskLevel,
    /// The arguments, validated against the tool's schema.
    pub args: Value,
    /// The agent the call is made for, if any.
    pub agent_id: Option<String>,
    /// The session the call is made in, if any.
    pub session_id: Option<String>,
    /// Who asks, as invocation records name it (`token:NAME`, `cli:USER`,
    /// `agent:ID`), if known.
    pub caller: Option<String>,
    /// The door the call came in by (`http`, `mcp`, `cli`, `agent`,
    /// `binding`, …).
    pub surface: Option<String>,
}

impl ApprovalRequest {
    /// The arguments as compact JSON, cut at [`MAX_ARGS_PREVIEW`] characters.
    pub fn args_preview(&self) -> String {
        let text = self.args.to_string();
        if text.chars().count() > MAX_ARGS_PREVIEW {
            format!(
                "{}…",
                text.chars().take(MAX_ARGS_PREVIEW).collect::<String>()
            )
        } else {
            text
        }
    }
}

/// What an [`Approver`] decided about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run it.
    Approved {
        /// Who approved (a user, `--yes`, `http`).
        by: String,
    },
    /// Do not run it.
    Denied {
        /// Who denied.
        by: String,
        /// Why.
        reason: String,
    },
    /// Nobody decided within the timeout: do not run it.
    TimedOut {
        /// The timeout.
        after: Duration,
        /// The approval record, if one was made.
        id: Option<String>,
    },
    /// Nobody can be asked (no terminal): do not run it.
    Unavailable {
        /// Why, and how to approve instead.
        reason: String,
    },
}

/// A boxed future of a [`Decision`].
pub type DecisionFuture<'a> = Pin<Box<dyn Future<Output = Decision> + Send + 'a>>;

/// Who decides `high` and `critical` calls; the embedding sets one with
/// [`Runtime::set_approver`]. Without one, such calls are denied.
pub trait Approver: Send + Sync {
    /// Decides one call. Must not run the call itself.
    fn decide<'a>(&'a self, request: &'a ApprovalRequest) -> DecisionFuture<'a>;
}

/// Why the gate refused a call (the plugin was not called).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The tool is disabled.
    #[error("tool {tool:?} of plugin {plugin:?} is disabled; run `plugd tool enable {tool}`")]
    Disabled {
        /// The tool.
        tool: String,
        /// Its plugin.
        plugin: String,
    },
    /// Someone denied the call.
    #[error(
        "the call of tool {tool:?} (plugin {plugin:?}, risk {risk}) was denied by {by}: {reason}"
    )]
    Denied {
        /// The tool.
        tool: String,
        /// Its plugin.
        plugin: String,
        /// Its risk.
        risk: RiskLevel,
        /// Who denied.
        by: String,
        /// Why.
        reason: String,
    },
    /// Nobody approved in time.
    #[error(
        "the call of tool {tool:?} (plugin {plugin:?}, risk {risk}) was denied: nobody approved it within {} s{}; approve pending calls with `plugd approvals approve ID` or POST /v1/approvals/ID:approve, or raise risk.approval_timeout_secs in plugd.yaml",
        .after.as_secs(),
        .id.as_ref().map(|i| format!(" (approval {i})")).unwrap_or_default()
    )]
    TimedOut {
        /// The tool.
        tool: String,
        /// Its plugin.
        plugin: String,
        /// Its risk.
        risk: RiskLevel,
        /// The timeout.
        after: Duration,
        /// The approval record.
        id: Option<String>,
    },
    /// Nobody could be asked.
    #[error(
        "the call of tool {tool:?} (plugin {plugin:?}, risk {risk}) was denied: {risk}-risk tools need an approval for each call and {reason}"
    )]
    NoApprover {
        /// The tool.
        tool: String,
        /// Its plugin.
        plugin: String,
        /// Its risk.
        risk: RiskLevel,
        /// Why nobody could be asked, and what to do.
        reason: String,
    },
    /// plugd.yaml's risk policy could not be read, so nothing runs.
    #[error("no tool runs while the risk policy cannot be read: {0}")]
    Policy(String),
}

/// Why an approval could not be decided.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DecideError {
    /// No approval with that id.
    #[error("no approval {0:?}; `plugd approvals list` (GET /v1/approvals) shows the pending ones")]
    Unknown(String),
    /// It was decided (or timed out) already.
    #[error("approval {} was already decided: {}{}", .0.id, .0.state.as_str(), .0.decided_by.as_ref().map(|b| format!(" by {b}")).unwrap_or_default())]
    AlreadyDecided(Box<CallApproval>),
    /// The store failed.
    #[error("{0}")]
    Store(String),
    /// The answer does not fit the question (an MCP server's elicitation:
    /// content that does not match its requested schema); nothing changed.
    #[error("{0}")]
    Invalid(String),
}

/// A tool as `plugd tool list` and `GET /v1/tools` show it: the registry
/// entry plus its effective risk and whether it is enabled.
#[derive(Debug, Clone)]
pub struct ToolView {
    /// The registry entry.
    pub entry: Arc<ToolEntry>,
    /// Effective risk.
    pub risk: RiskLevel,
    /// Where the risk comes from.
    pub risk_source: RiskSource,
    /// `false` when disabled.
    pub enabled: bool,
}

impl Serialize for ToolView {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Row<'a> {
            #[serde(flatten)]
            entry: &'a ToolEntry,
            risk: RiskLevel,
            risk_source: RiskSource,
            enabled: bool,
        }
        Row {
            entry: &self.entry,
            risk: self.risk,
            risk_source: self.risk_source,
            enabled: self.enabled,
        }
        .serialize(s)
    }
}

/// A tool's risk and state as `plugin show` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolRisk {
    /// Effective risk.
    pub risk: RiskLevel,
    /// Where it comes from.
    pub source: RiskSource,
    /// `false` when disabled.
    pub enabled: bool,
}

/// The runtime's risk state: the policy (read from plugd.yaml on first use
/// unless set), the approver, and the wake-up of waiting calls.
#[derive(Default)]
pub(crate) struct RiskState {
    policy: RwLock<Option<Arc<RiskConfig>>>,
    approver: RwLock<Option<Arc<dyn Approver>>>,
    pub(crate) decided: Arc<Notify>,
    /// The disabled tools as last read, with the number of the read (a
    /// read that began earlier never replaces a later one); `None` before
    /// the first read and after a read failed (nothing is listed then).
    disabled: std::sync::Mutex<Option<(u64, Arc<DisabledSet>)>>,
    /// Numbers the reads of the disabled tools.
    disabled_reads: std::sync::atomic::AtomicU64,
    /// Per medium tool: when its last notice event was recorded and how
    /// many calls happened since.
    notices: std::sync::Mutex<std::collections::HashMap<String, (Instant, u64)>>,
}

impl RiskState {
    /// `Some(calls)` when a notice event of `tool` is due: its first call
    /// in this process, or the first call after [`NOTICE_WINDOW`]; `calls`
    /// counts the calls it covers (this one included).
    fn notice_due(&self, tool: &str) -> Option<u64> {
        let mut map = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match map.get_mut(tool) {
            None => {
                map.insert(tool.to_owned(), (now, 0));
                Some(1)
            }
            Some((last, since)) => {
                *since += 1;
                if now.duration_since(*last) < NOTICE_WINDOW {
                    return None;
                }
                let calls = *since;
                *last = now;
                *since = 0;
                Some(calls)
            }
        }
    }
}

fn lock_read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn lock_write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// The effective risk of `entry` under `policy`.
pub fn effective_risk(entry: &ToolEntry, policy: &RiskConfig) -> (RiskLevel, RiskSource) {
    if let Some(level) = policy.tools.get(&entry.name) {
        return (*level, RiskSource::Config);
    }
    if let Some(level) = entry.risk_level.as_deref().and_then(RiskLevel::parse) {
        return (level, RiskSource::Declared);
    }
    match entry.meta.as_deref().and_then(annotation_risk) {
        Some(level) => (level, RiskSource::Annotations),
        // An unknown declared level cannot lower the risk below the default.
        None => (RiskLevel::Medium, RiskSource::Default),
    }
}

/// The risk MCP tool annotations imply, when they say something:
///
/// | annotations | risk |
/// |---|---|
/// | `readOnlyHint: true` | `low` |
/// | `destructiveHint: true` (and not read-only) | `high` |
/// | `destructiveHint: false` (and not read-only) | `medium` |
/// | neither hint | `None` (the default, `medium`) |
///
/// Annotations are the server's own claims: they may raise a tool to `high`
/// but never lower it below `medium` unless the server says the tool only
/// reads; plugd.yaml `risk.tools` overrides either way. `destructiveHint`
/// defaults to true in MCP, but an unannotated tool stays `medium`: an
/// absent hint is not a claim.
pub fn annotation_risk(meta: &plugd_host::model::ToolMeta) -> Option<RiskLevel> {
    if meta.hint("readOnlyHint") == Some(true) {
        return Some(RiskLevel::Low);
    }
    match meta.hint("destructiveHint") {
        Some(true) => Some(RiskLevel::High),
        Some(false) => Some(RiskLevel::Medium),
        None => None,
    }
}

impl Runtime {
    /// Sets the risk policy (what `plugd serve` read from plugd.yaml);
    /// without it, the runtime reads plugd.yaml's `risk:` on first use.
    pub fn set_risk_config(&self, config: RiskConfig) {
        *lock_write(&self.inner.risk.policy) = Some(Arc::new(config));
    }

    /// Sets who approves `high` and `critical` calls.
    pub fn set_approver(&self, approver: Arc<dyn Approver>) {
        *lock_write(&self.inner.risk.approver) = Some(approver);
    }

    /// The approver set, if any.
    pub(crate) fn approver_now(&self) -> Option<Arc<dyn Approver>> {
        lock_read(&self.inner.risk.approver).clone()
    }

    /// Uses an [`ApprovalQueue`] over this runtime's store as its approver
    /// (what `plugd serve` does).
    pub fn use_approval_queue(&self) {
        let queue = ApprovalQueue {
            store: self.inner.state.clone(),
            decided: self.inner.risk.decided.clone(),
            runtime_policy: PolicyHandle(Arc::downgrade(&self.inner)),
        };
        self.set_approver(Arc::new(queue));
    }

    /// The risk policy: the one set, else plugd.yaml's `risk:` (read once;
    /// an unreadable file is an error every time, so nothing runs under a
    /// policy plugd could not read).
    pub fn risk_config(&self) -> Result<Arc<RiskConfig>, GateError> {
        if let Some(p) = lock_read(&self.inner.risk.policy).as_ref() {
            return Ok(p.clone());
        }
        let config = PlugdConfig::load(self.dir()).map_err(|e| GateError::Policy(e.to_string()))?;
        let policy = Arc::new(config.risk);
        *lock_write(&self.inner.risk.policy) = Some(policy.clone());
        Ok(policy)
    }

    /// Every tool of the approved plugins with its effective risk and
    /// state, disabled ones included, sorted by name.
    pub fn tool_views(&self) -> Result<Vec<ToolView>, RuntimeError> {
        let tools = crate::read(&self.inner.registry).list();
        self.views_of(tools)
    }

    /// [`Runtime::tool_views`] of plugin `id` only (O(its tools), so a
    /// per-plugin report stays cheap with many plugins).
    pub fn plugin_tool_views(&self, id: &str) -> Result<Vec<ToolView>, RuntimeError> {
        let tools = crate::read(&self.inner.registry).plugin_tools(id);
        self.views_of(tools)
    }

    fn views_of(&self, tools: Vec<Arc<ToolEntry>>) -> Result<Vec<ToolView>, RuntimeError> {
        let policy = self.risk_config()?;
        let disabled = self.disabled_set()?;
        Ok(tools
            .into_iter()
            .map(|entry| {
                let (risk, risk_source) = effective_risk(&entry, &policy);
                let enabled = !disabled.contains(&(entry.plugin.clone(), entry.name.clone()));
                ToolView {
                    entry,
                    risk,
                    risk_source,
                    enabled,
                }
            })
            .collect())
    }

    /// The risk and state of each tool of plugin `id` (empty when the
    /// policy cannot be read; the error is logged).
    pub fn tool_risks(&self, id: &str) -> BTreeMap<String, ToolRisk> {
        match self.plugin_tool_views(id) {
            Ok(views) => views
                .into_iter()
                .map(|v| {
                    (
                        v.entry.name.clone(),
                        ToolRisk {
                            risk: v.risk,
                            source: v.risk_source,
                            enabled: v.enabled,
                        },
                    )
                })
                .collect(),
            Err(e) => {
                tracing::warn!(plugin = id, error = %e, "cannot compute tool risks");
                BTreeMap::new()
            }
        }
    }

    /// Reads the disabled (plugin, tool) pairs from the store into the
    /// cache the calls and listings use.
    pub(crate) async fn refresh_disabled(&self) -> Result<(), RuntimeError> {
        let risk = &self.inner.risk;
        let n = risk
            .disabled_reads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let read = self.inner.state.disabled_tools().await;
        let mut cache = risk.disabled.lock().unwrap_or_else(|p| p.into_inner());
        if cache.as_ref().is_some_and(|(m, _)| *m > n) {
            return Ok(()); // a later read already answered
        }
        match read {
            Ok(rows) => {
                let set: DisabledSet = rows.into_iter().map(|d| (d.plugin_id, d.tool)).collect();
                *cache = Some((n, Arc::new(set)));
                Ok(())
            }
            Err(e) => {
                *cache = None;
                Err(e.into())
            }
        }
    }

    /// The disabled (plugin, tool) pairs as last read (see
    /// [`Runtime::refresh_disabled`]; [`crate::consent`] re-reads them
    /// when the control epoch moves).
    fn disabled_set(&self) -> Result<Arc<DisabledSet>, RuntimeError> {
        let cache = self
            .inner
            .risk
            .disabled
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match cache.as_ref() {
            Some((_, set)) => Ok(set.clone()),
            None => Err(RuntimeError::Workspace(
                "the disabled tools could not be read from the state store".to_owned(),
            )),
        }
    }

    /// The enabled tools (what the agent and `GET /v1/tools` see). When the
    /// store cannot be read nothing is listed (fail closed).
    pub(crate) fn enabled_tools(&self) -> Vec<Arc<ToolEntry>> {
        let all = crate::read(&self.inner.registry).list();
        match self.disabled_set() {
            Ok(d) if d.is_empty() => all,
            Ok(d) => all
                .into_iter()
                .filter(|t| !d.contains(&(t.plugin.clone(), t.name.clone())))
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read which tools are disabled; listing none");
                Vec::new()
            }
        }
    }

    /// Enables or disables tool `name` (`by` is recorded when disabling);
    /// returns the tool as it is now and whether anything changed.
    pub async fn set_tool_enabled(
        &self,
        name: &str,
        enabled: bool,
        by: &str,
    ) -> Result<(ToolView, bool), RuntimeError> {
        let entry = crate::read(&self.inner.registry)
            .get(name)
            .ok_or_else(|| RuntimeError::UnknownTool(name.to_owned()))?;
        let store = &self.inner.state;
        let changed = if enabled {
            store.tool_enable(&entry.plugin, &entry.name).await?
        } else {
            store.tool_disable(&entry.plugin, &entry.name, by).await?
        };
        // The next call sees the change: the cache is read again now.
        self.refresh_disabled().await?;
        if changed {
            crate::read(&self.inner.registry).touch();
        }
        let view = self
            .tool_views()?
            .into_iter()
            .find(|v| v.entry.name == name)
            .ok_or_else(|| RuntimeError::UnknownTool(name.to_owned()))?;
        Ok((view, changed))
    }

    /// The notice the agent turn shows for a call of `name`: `Some` for
    /// `medium` tools.
    pub fn risk_notice(&self, name: &str) -> Option<Notice> {
        let entry = crate::read(&self.inner.registry).get(name)?;
        let policy = self.risk_config().ok()?;
        let (risk, _) = effective_risk(&entry, &policy);
        (risk == RiskLevel::Medium).then(|| {
            let mut n = Notice::new(
                NoticeKind::Info,
                Some("MEDIUM_RISK_TOOL"),
                format!(
                    "called medium-risk tool {name:?} of plugin {:?}",
                    entry.plugin
                ),
            );
            n.details = Some(json!({"tool": name, "plugin": entry.plugin, "risk": risk}));
            n
        })
    }

    /// Pending call approvals (not decided, not expired), oldest first.
    pub async fn pending_approvals(&self) -> Result<Vec<CallApproval>, RuntimeError> {
        Ok(self.inner.state.call_approvals_pending().await?)
    }

    /// Approves or denies the pending call approval `id`; the waiting call
    /// (in this process or another on the same store) resumes.
    pub async fn decide_approval(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        reason: Option<&str>,
    ) -> Result<CallApproval, DecideError> {
        // An MCP server's question: `reason` of an approval is its content.
        if let Ok(Some(a)) = self.inner.state.call_approval(id).await
            && crate::mcp_requests::is_elicitation(&a)
        {
            return crate::mcp_requests::decide(self, &a, approve, by, reason).await;
        }
        let state = if approve {
            ApprovalState::Approved
        } else {
            ApprovalState::Denied
        };
        let out = self
            .inner
            .state
            .call_approval_decide(id, state, by, reason)
            .await
            .map_err(|e| DecideError::Store(e.to_string()))?;
        match out {
            Decide::Decided(a) => {
                self.inner.risk.decided.notify_waiters();
                tracing::info!(approval = %a.id, tool = %a.tool, state = a.state.as_str(), by, "call approval decided");
                Ok(a)
            }
            Decide::Unknown => Err(DecideError::Unknown(id.to_owned())),
            Decide::AlreadyDecided(a) => Err(DecideError::AlreadyDecided(Box::new(a))),
        }
    }
}

/// Who is asked about a call, and the door it came in by (named in the
/// approval request).
#[derive(Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// Decides instead of the runtime's own approver (the MCP gateway
    /// asking its client's user).
    pub(crate) approver: Option<&'a dyn Approver>,
    /// The door.
    pub(crate) surface: crate::governed::Surface,
}

/// Refuses a call of a disabled tool (before its arguments are checked).
pub(crate) fn check_enabled(rt: &Runtime, entry: &ToolEntry) -> Result<(), RuntimeError> {
    let disabled = rt.disabled_set()?;
    if disabled.contains(&(entry.plugin.clone(), entry.name.clone())) {
        return Err(GateError::Disabled {
            tool: entry.name.clone(),
            plugin: entry.plugin.clone(),
        }
        .into());
    }
    Ok(())
}

/// The risk gate of one call with validated arguments.
///
/// What it decided, when a person (or the approver standing in for one)
/// was asked, goes to `decisions` (the invocation record's
/// `payload.decisions`).
pub(crate) async fn gate(
    rt: &Runtime,
    entry: &ToolEntry,
    args: &Value,
    ctx: &CallContext,
    asked: Asked<'_>,
    decisions: &mut Vec<CallDecision>,
) -> Result<(), GateError> {
    let override_approver = asked.approver;
    let policy = rt.risk_config()?;
    let (risk, source) = effective_risk(entry, &policy);
    let tool = entry.name.clone();
    let plugin = entry.plugin.clone();
    match risk {
        RiskLevel::Low => Ok(()),
        RiskLevel::Medium => {
            tracing::info!(tool = %tool, plugin = %plugin, risk = %risk, "calling a medium-risk tool");
            // One event per tool per window keeps a store write off most calls.
            let Some(calls) = rt.inner.risk.notice_due(&tool) else {
                return Ok(());
            };
            let summary = json!({
                "tool": tool,
                "plugin": plugin,
                "risk": risk,
                "risk_source": source,
                "agent_id": ctx.agent_id,
                "session_id": ctx.session_id,
                "calls": calls,
            });
            if let Err(e) = rt
                .emit(NOTICE_EVENT, json!({"kind": "tool", "id": tool}), summary)
                .await
            {
                tracing::warn!(tool = %tool, error = %e, "could not record the risk notice in the outbox");
            }
            Ok(())
        }
        RiskLevel::High | RiskLevel::Critical => {
            let own = lock_read(&rt.inner.risk.approver).clone();
            let approver: Option<&dyn Approver> = override_approver.or(own.as_deref());
            let Some(approver) = approver else {
                return Err(GateError::NoApprover {
                    tool,
                    plugin,
                    risk,
                    reason: "this runtime has no approver; call it from `plugd tool call` on a terminal or through `plugd serve` (POST /v1/approvals/ID:approve)".into(),
                });
            };
            let request = ApprovalRequest {
                tool: tool.clone(),
                plugin: plugin.clone(),
                risk,
                args: args.clone(),
                agent_id: ctx.agent_id.clone(),
                session_id: ctx.session_id.clone(),
                caller: crate::invocations::caller_of(ctx),
                surface: Some(asked.surface.name().to_owned()),
            };
            let asked_at = Instant::now();
            let decision = approver.decide(&request).await;
            decisions.push(CallDecision::approval(risk, &decision, asked_at.elapsed()));
            match decision {
                Decision::Approved { by } => {
                    tracing::info!(tool = %tool, plugin = %plugin, risk = %risk, by = %by, "call approved");
                    Ok(())
                }
                Decision::Denied { by, reason } => {
                    tracing::warn!(tool = %tool, plugin = %plugin, risk = %risk, by = %by, "call denied");
                    Err(GateError::Denied {
                        tool,
                        plugin,
                        risk,
                        by,
                        reason,
                    })
                }
                Decision::TimedOut { after, id } => {
                    tracing::warn!(tool = %tool, plugin = %plugin, risk = %risk, "call approval timed out");
                    Err(GateError::TimedOut {
                        tool,
                        plugin,
                        risk,
                        after,
                        id,
                    })
                }
                Decision::Unavailable { reason } => Err(GateError::NoApprover {
                    tool,
                    plugin,
                    risk,
                    reason,
                }),
            }
        }
    }
}

/// Reads the approval timeout from the runtime's policy at request time
/// (weakly: the runtime owns its approver).
struct PolicyHandle(std::sync::Weak<crate::RtInner>);

impl PolicyHandle {
    fn timeout(&self) -> Duration {
        self.0
            .upgrade()
            .and_then(|inner| Runtime { inner }.risk_config().ok())
            .map(|p| p.approval_timeout)
            .unwrap_or(Duration::from_secs(DEFAULT_APPROVAL_TIMEOUT_SECS))
    }
}

/// The approver of `plugd serve`: each call gets a pending record in the
/// store and waits until it is decided or times out (then it is denied).
pub struct ApprovalQueue {
    store: Arc<dyn StateStore>,
    decided: Arc<Notify>,
    runtime_policy: PolicyHandle,
}

impl fmt::Debug for ApprovalQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalQueue").finish_non_exhaustive()
    }
}

/// Marks a still-pending record denied when the waiting call goes away
/// (the write goes to a task: `drop` cannot wait).
struct Abandon {
    store: Arc<dyn StateStore>,
    id: String,
    armed: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, id) = (self.store.clone(), std::mem::take(&mut self.id));
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let _ = store
                    .call_approval_decide(
                        &id,
                        ApprovalState::Denied,
                        "plugd",
                        Some("the caller stopped waiting"),
                    )
                    .await;
            });
        }
    }
}

impl Approver for ApprovalQueue {
    fn decide<'a>(&'a self, request: &'a ApprovalRequest) -> DecisionFuture<'a> {
        Box::pin(async move {
            let timeout = self.runtime_policy.timeout();
            let expires = plugd_store::outbox::now_ms()
                + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2);
            let record = match self
                .store
                .call_approval_request(&NewCallApproval {
                    tool: request.tool.clone(),
                    plugin_id: request.plugin.clone(),
                    risk: request.risk.as_str().to_owned(),
                    args_preview: request.args_preview(),
                    expires_at_ms: expires,
                    caller: request.caller.clone(),
                    surface: request.surface.clone(),
                    session_id: request.session_id.clone(),
                    agent_id: request.agent_id.clone(),
                })
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    return Decision::Unavailable {
                        reason: format!("the approval request could not be recorded: {e}"),
                    };
                }
            };
            let id = record.id.clone();
            // Live surfaces (`GET /v1/events`) re-count the pending calls.
            self.decided.notify_waiters();
            tracing::warn!(
                approval = %id, tool = %request.tool, plugin = %request.plugin, risk = %request.risk,
                "call waits for approval: POST /v1/approvals/{id}:approve or :deny (or `plugd approvals approve {id}`)"
            );
            let mut guard = Abandon {
                store: self.store.clone(),
                id: id.clone(),
                armed: true,
            };
            let deadline = Instant::now() + timeout;
            loop {
                let notified = self.decided.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let now = match self.store.call_approval(&id).await {
                    Ok(Some(a)) => a,
                    Ok(None) => {
                        guard.armed = false;
                        return Decision::Unavailable {
                            reason: format!("approval {id} vanished from the store"),
                        };
                    }
                    Err(e) => {
                        tracing::warn!(approval = %id, error = %e, "cannot read the approval; retrying");
                        tokio::time::sleep(POLL).await;
                        if Instant::now() >= deadline {
                            return Decision::TimedOut {
                                after: timeout,
                                id: Some(id),
                            };
                        }
                        continue;
                    }
                };
                let decided = match now.state {
                    ApprovalState::Pending if Instant::now() >= deadline => {
                        match self
                            .store
                            .call_approval_decide(&id, ApprovalState::TimedOut, "timeout", None)
                            .await
                        {
                            Ok(Decide::AlreadyDecided(a)) if a.state != ApprovalState::TimedOut => {
                                Some(a)
                            }
                            _ => {
                                guard.armed = false;
                                return Decision::TimedOut {
                                    after: timeout,
                                    id: Some(id),
                                };
                            }
                        }
                    }
                    ApprovalState::Pending => None,
                    _ => Some(now),
                };
                if let Some(a) = decided {
                    guard.armed = false;
                    let by = a.decided_by.clone().unwrap_or_else(|| "?".into());
                    return match a.state {
                        ApprovalState::Approved => Decision::Approved { by },
                        ApprovalState::TimedOut => Decision::TimedOut {
                            after: timeout,
                            id: Some(id),
                        },
                        _ => Decision::Denied {
                            by,
                            reason: a.reason.unwrap_or_else(|| format!("approval {id} denied")),
                        },
                    };
                }
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(left.min(POLL)) => {}
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{ConfigError, PlugdConfig};

    fn parse(yaml: &str) -> Result<PlugdConfig, ConfigError> {
        PlugdConfig::parse(yaml, Path::new("/w/plugd.yaml"), Path::new("/w"))
    }

    #[test]
    fn risk_section_parses_with_defaults() {
        let c = parse("risk:\n  tools:\n    p_x: critical\n    a/b: low\n").unwrap();
        assert_eq!(c.risk.tools["p_x"], RiskLevel::Critical);
        assert_eq!(c.risk.tools["a/b"], RiskLevel::Low);
        assert_eq!(c.risk.approval_timeout, Duration::from_secs(120));
        let c = parse("risk: {approval_timeout_secs: 5}\n").unwrap();
        assert_eq!(c.risk.approval_timeout, Duration::from_secs(5));
        assert_eq!(parse("").unwrap().risk, RiskConfig::default());
    }

    #[test]
    fn bad_risk_sections_name_the_field_and_line() {
        let e = parse("eager: []\nrisk:\n  tools:\n    p_x: severe\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("risk.tools.p_x") && e.contains("\"severe\"") && e.contains("line 4"),
            "{e}"
        );
        let e = parse("risk:\n  approval_timeout_secs: 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("risk.approval_timeout_secs") && e.contains("line 2"),
            "{e}"
        );
        let e = parse("risk:\n  tool: {}\n").unwrap_err().to_string();
        assert!(e.contains("unknown field") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn notice_events_are_one_per_tool_per_window() {
        let st = RiskState::default();
        assert_eq!(st.notice_due("a"), Some(1));
        assert_eq!(st.notice_due("a"), None);
        assert_eq!(st.notice_due("b"), Some(1), "per tool");
        // Pretend the window passed: the next event covers both later calls.
        if let Some(w) = st.notices.lock().unwrap().get_mut("a") {
            w.0 -= NOTICE_WINDOW;
        }
        assert_eq!(st.notice_due("a"), Some(2));
        assert_eq!(st.notice_due("a"), None);
    }

    #[test]
    fn the_schema_knows_the_risk_section() {
        let ok = "risk:\n  tools: {p_x: high}\n  approval_timeout_secs: 30\n";
        assert_eq!(
            crate::config::schema_violations(ok).unwrap(),
            Vec::<String>::new()
        );
        for bad in [
            "risk: {tools: {p_x: severe}}\n",
            "risk: {approval_timeout_secs: 0}\n",
            "risk: {nope: 1}\n",
        ] {
            assert!(
                !crate::config::schema_violations(bad).unwrap().is_empty(),
                "{bad}"
            );
        }
    }

    #[test]
    fn effective_risk_prefers_config_then_declaration_then_medium() {
        let def = |risk: Option<&str>| {
            let mut d = plugd_host::ToolDef::new("p_x", "", json!({}));
            d.risk_level = risk.map(str::to_owned);
            ToolEntry::new("p", &d)
        };
        let mut policy = RiskConfig::default();
        assert_eq!(
            effective_risk(&def(None), &policy),
            (RiskLevel::Medium, RiskSource::Default)
        );
        assert_eq!(
            effective_risk(&def(Some("high")), &policy),
            (RiskLevel::High, RiskSource::Declared)
        );
        assert_eq!(
            effective_risk(&def(Some("bogus")), &policy),
            (RiskLevel::Medium, RiskSource::Default)
        );
        policy.tools.insert("p_x".into(), RiskLevel::Low);
        assert_eq!(
            effective_risk(&def(Some("critical")), &policy),
            (RiskLevel::Low, RiskSource::Config)
        );
        assert!(RiskLevel::High.needs_approval() && !RiskLevel::Medium.needs_approval());
    }

    #[test]
    fn a_declared_level_beats_annotations_which_beat_the_default() {
        let entry = |risk: Option<&str>, annotations: Value| {
            let mut d = plugd_host::ToolDef::new("p_x", "", json!({}));
            d.risk_level = risk.map(str::to_owned);
            d.meta = Some(Box::new(plugd_host::model::ToolMeta {
                annotations: annotations.as_object().cloned(),
                ..Default::default()
            }));
            ToolEntry::new("p", &d)
        };
        let policy = RiskConfig::default();
        let cases = [
            (
                json!({"readOnlyHint": true, "destructiveHint": true}),
                RiskLevel::Low,
            ),
            (json!({"destructiveHint": true}), RiskLevel::High),
            (
                json!({"readOnlyHint": false, "destructiveHint": false}),
                RiskLevel::Medium,
            ),
        ];
        for (annotations, level) in cases {
            assert_eq!(
                effective_risk(&entry(None, annotations.clone()), &policy),
                (level, RiskSource::Annotations),
                "{annotations}"
            );
        }
        // No hint, or only hints that say nothing about risk: the default.
        for annotations in [json!({}), json!({"openWorldHint": true, "title": "t"})] {
            assert_eq!(
                effective_risk(&entry(None, annotations), &policy),
                (RiskLevel::Medium, RiskSource::Default)
            );
        }
        assert_eq!(
            effective_risk(
                &entry(Some("critical"), json!({"readOnlyHint": true})),
                &policy
            ),
            (RiskLevel::Critical, RiskSource::Declared)
        );
    }
}
