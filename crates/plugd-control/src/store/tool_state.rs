//! Disabled tools and per-call approvals: the records and the [`ToolStateStore`] trait.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// One disabled tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisabledTool {
    /// The plugin that serves it.
    pub plugin_id: String,
    /// Its registry name.
    pub tool: String,
    /// Who disabled it.
    pub disabled_by: String,
    /// When (RFC 3339).
    pub disabled_at: String,
}

/// The state of a call approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for an operator.
    Pending,
    /// Approved: the call runs.
    Approved,
    /// Denied by an operator: the call fails and never reaches the plugin.
    Denied,
    /// Nobody decided in time: denied.
    TimedOut,
}

impl ApprovalState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::TimedOut => "timed_out",
        }
    }

    /// The value `as_str` names, as a backend stores it.
    pub fn parse(s: &str) -> Option<ApprovalState> {
        [
            ApprovalState::Pending,
            ApprovalState::Approved,
            ApprovalState::Denied,
            ApprovalState::TimedOut,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// What a new call approval records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewCallApproval {
    /// The tool's registry name.
    pub tool: String,
    /// Its plugin.
    pub plugin_id: String,
    /// Its effective risk level (`high` or `critical`).
    pub risk: String,
    /// The arguments, shortened for people.
    pub args_preview: String,
    /// When it stops waiting (ms since the epoch).
    pub expires_at_ms: i64,
    /// Who asks, as invocation records name it (`token:NAME`, `cli:USER`,
    /// `agent:ID`).
    pub caller: Option<String>,
    /// The door the call came in by (`http`, `mcp`, `cli`, `agent`,
    /// `binding`, …).
    pub surface: Option<String>,
    /// The session the call is made in.
    pub session_id: Option<String>,
    /// The agent the call is made for.
    pub agent_id: Option<String>,
}

/// A stored call approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallApproval {
    /// Its id (`apr_` and 16 hex digits).
    pub id: String,
    /// The tool's registry name.
    pub tool: String,
    /// Its plugin.
    pub plugin: String,
    /// Its effective risk level.
    pub risk: String,
    /// The arguments, shortened.
    pub args_preview: String,
    /// When it was requested (RFC 3339).
    pub requested_at: String,
    /// When it stops waiting (RFC 3339).
    pub expires_at: String,
    /// Its state.
    pub state: ApprovalState,
    /// Who decided (`timeout` for timeouts).
    pub decided_by: Option<String>,
    /// When (RFC 3339).
    pub decided_at: Option<String>,
    /// Why, when denied.
    pub reason: Option<String>,
    /// Who asks (`token:NAME`, `cli:USER`, `agent:ID`); `None` when the
    /// call did not say (and in approvals of older plugds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// The door the call came in by (`http`, `mcp`, `cli`, `agent`,
    /// `binding`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface: Option<String>,
    /// The session the call is made in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The agent the call is made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// The result of [`ToolStateStore::call_approval_decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decide {
    /// The decision was recorded; the approval as it is now.
    Decided(CallApproval),
    /// No approval with that id.
    Unknown,
    /// It was decided already (or timed out); the approval as it is.
    AlreadyDecided(CallApproval),
}

/// Tools an operator disabled, and calls waiting for a person's approval.
#[async_trait]
pub trait ToolStateStore: Send + Sync {
    /// Disables `tool` of `plugin_id`; whether it was enabled.
    async fn tool_disable(&self, plugin_id: &str, tool: &str, by: &str)
    -> Result<bool, StoreError>;
    /// Enables `tool` of `plugin_id` again; whether it was disabled.
    async fn tool_enable(&self, plugin_id: &str, tool: &str) -> Result<bool, StoreError>;
    /// Every disabled tool.
    async fn disabled_tools(&self) -> Result<Vec<DisabledTool>, StoreError>;
    /// Whether `tool` of `plugin_id` is disabled.
    async fn tool_disabled(&self, plugin_id: &str, tool: &str) -> Result<bool, StoreError>;
    /// Records a call waiting for approval.
    async fn call_approval_request(&self, a: &NewCallApproval) -> Result<CallApproval, StoreError>;
    /// The call approval `id`.
    async fn call_approval(&self, id: &str) -> Result<Option<CallApproval>, StoreError>;
    /// Every call approval still pending.
    async fn call_approvals_pending(&self) -> Result<Vec<CallApproval>, StoreError>;
    /// Decides a pending call approval, once.
    async fn call_approval_decide(
        &self,
        id: &str,
        state: ApprovalState,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Decide, StoreError>;
}
