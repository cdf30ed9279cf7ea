//! The agent turn: LLM ↔ tools through the hook pipeline, with sessions and
//! transcripts in the state store.
//!
//! A turn: `before_llm_request` → LLM → for each tool call: `before_tool_call`
//! → tool (any dialect) → `after_tool_result` (those two run by the
//! runtime's governed call path, [`plugd_runtime::governed`], as for every surface)
//! → back to the LLM until it
//! answers → `before_response` → reply. The number of tool rounds is bounded
//! (`agent.max_tool_rounds`, default 8). A blocked step ends the turn with the
//! block message and notice codes, never a crash.
//!
//! This module is the contract the CLI (`plugd run`, `plugd chat`) and the
//! HTTP API build on. Tool names are mapped to provider-safe names and back
//! (see `names`); the loop, the stored transcript and the outbox events
//! (`session.created`, `tool.completed`, `run.completed`) are in `turn`.
//!
//! A turn run for an org identity ([`OrgTurn`]: an org token, or an OIDC
//! identity mapped to an org) offers the model the tool exports bound to
//! that org's scope instead of the workspace's tools: the one catalog of
//! `/mcp` and `GET /v1/tools`, listed by [`Runtime::scoped_exports`] and
//! called by [`Runtime::call_export_governed`] (the same resolution,
//! governance and records), named by export id, never another org's.

mod names;
mod turn;

pub use turn::new_session_id;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::llm::{LlmError, LlmProvider, Usage};
use plugd_runtime::Runtime;
use plugd_runtime::channels::{ChannelTurn, InboundTurn, TurnFuture};
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::hooks::{HookContext, HookPoint, Notice, Pipeline, PipelineError};

/// The org scope a turn runs for: its tools are the exports bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgTurn {
    /// The org.
    pub org_id: String,
    /// Its project the caller acts for, if limited to one.
    pub project_id: Option<String>,
    /// Who asks (`token:NAME`, `oidc:HOST/SUB`), for policy and records.
    pub caller: String,
    /// The caller's role (`caller.role` of the per-tool policy).
    pub role: Option<String>,
    /// The caller's groups (`caller.groups`).
    pub groups: Vec<String>,
}

/// How one turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnStatus {
    /// The model answered; the reply passed `before_response`.
    Completed,
    /// A hook blocked a step; `message` and `notices` say which and why.
    Blocked,
}

/// One tool call made during a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The model's call id.
    pub call_id: String,
    /// The tool's registry name (as `plugd tool list` shows it).
    pub tool: String,
    /// The arguments actually sent (after `before_tool_call` modifications).
    pub args: Value,
    /// Whether it succeeded.
    pub ok: bool,
    /// The result (or the error text) the model saw, after `after_tool_result`.
    pub result: Value,
}

/// The result of one turn (`plugd run --json` prints it; the HTTP API returns it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnOutcome {
    /// The session.
    pub session_id: String,
    /// Completed or blocked.
    pub status: TurnStatus,
    /// The reply (completed turns).
    pub reply: Option<String>,
    /// The block message (blocked turns).
    pub message: Option<String>,
    /// The point that blocked (blocked turns).
    pub blocked_at: Option<HookPoint>,
    /// Every notice of every hook run in the turn, in order.
    pub notices: Vec<Notice>,
    /// The tool calls made.
    pub tool_calls: Vec<ToolCallRecord>,
    /// LLM requests made.
    pub rounds: u32,
    /// Token counts summed over the rounds.
    pub usage: Usage,
    /// The run this turn was (`plugd run show ID`).
    #[serde(default)]
    pub run_id: Option<String>,
    /// The chain the turn appended to (the session's head after any
    /// compaction the turn made).
    #[serde(default)]
    pub chain_id: Option<String>,
    /// The compaction this turn made, if the chain outgrew its budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_id: Option<String>,
}

/// What happens during a turn, as it happens (`plugd chat`, SSE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TurnEvent {
    /// Streamed reply text.
    Delta {
        /// The text.
        text: String,
    },
    /// The model asked for a tool (after `before_tool_call`).
    ToolCall {
        /// Call id.
        call_id: String,
        /// Registry name.
        tool: String,
        /// Arguments.
        args: Value,
    },
    /// A tool returned (after `after_tool_result`).
    ToolResult {
        /// Call id.
        call_id: String,
        /// Registry name.
        tool: String,
        /// Success.
        ok: bool,
        /// Result or error text.
        result: Value,
    },
    /// A hook notice.
    Notice {
        /// The point.
        point: HookPoint,
        /// The notice.
        notice: Notice,
    },
    /// The turn is over (the last event).
    Done {
        /// The outcome.
        outcome: Box<TurnOutcome>,
    },
}

/// One transcript entry of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptEntry {
    /// `user`, `assistant`, `tool` or `system`.
    pub role: String,
    /// Text content.
    pub content: String,
    /// Tool calls (assistant entries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::llm::ToolCall>,
    /// The call answered (tool entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// When (RFC 3339).
    pub at: String,
}

/// A stored session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// Its id.
    pub id: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// Its transcript, oldest first.
    pub transcript: Vec<TranscriptEntry>,
}

/// Why a turn could not run at all (a blocked turn is not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No `llm:` section in plugd.yaml, or the provider cannot be built.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// A hook handler failed to load.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The model kept calling tools past the limit.
    #[error(
        "the model made more than {limit} rounds of tool calls in one turn; raise agent.max_tool_rounds in plugd.yaml or check the model"
    )]
    TooManyRounds {
        /// The limit.
        limit: u32,
    },
    /// A session id that is not acceptable.
    #[error("invalid session id {0:?}: use 1-128 characters of letters, digits, '-', '_' and '.'")]
    BadSession(String),
    /// The state store failed.
    #[error("{0}")]
    Store(String),
    /// The compactor failed and `agent.compactor.on_failure` is `fail`.
    #[error("{0}")]
    Compaction(String),
}

/// Turn settings (`agent:` in plugd.yaml).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// Most tool rounds per turn.
    pub max_tool_rounds: u32,
    /// System prompt.
    pub system_prompt: Option<String>,
    /// Default hook context (`tenant:`), overlaid by each turn's context.
    pub defaults: HookContext,
    /// The compactor of the session's chain (`agent.compactor`).
    pub compactor: Option<plugd_runtime::compaction::CompactorConfig>,
}

/// Runs turns. Cheap to clone.
#[derive(Clone)]
pub struct Agent {
    runtime: Runtime,
    pipeline: Arc<Pipeline>,
    llm: Arc<dyn LlmProvider>,
    settings: Arc<AgentSettings>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("llm", &self.llm.name())
            .finish()
    }
}

impl Agent {
    /// An agent over explicit parts.
    pub fn new(
        runtime: Runtime,
        pipeline: Arc<Pipeline>,
        llm: Arc<dyn LlmProvider>,
        settings: AgentSettings,
    ) -> Agent {
        Agent {
            runtime,
            pipeline,
            llm,
            settings: Arc::new(settings),
        }
    }

    /// An agent from plugd.yaml: builds the pipeline (fail fast) and the
    /// provider of its `llm:` section.
    pub async fn from_config(runtime: &Runtime, config: &PlugdConfig) -> Result<Agent, AgentError> {
        let llm_config = config.llm.as_ref().ok_or_else(|| {
            LlmError::NotConfigured(format!(
                "{} has no llm: section; add one (provider: openai | plugin | scripted)",
                runtime
                    .dir()
                    .join(plugd_runtime::config::CONFIG_FILE)
                    .display()
            ))
        })?;
        let llm = crate::llm::build_provider(llm_config, runtime, runtime.dir()).await?;
        let pipeline = crate::hooks::build::build_pipeline(config, runtime).await?;
        Ok(Agent::new(
            runtime.clone(),
            Arc::new(pipeline),
            llm,
            AgentSettings {
                max_tool_rounds: config.agent.max_tool_rounds.max(1),
                system_prompt: runtime
                    .system_prompt_with_skills(
                        config.agent.system_prompt.as_deref(),
                        &config.agent.skills,
                    )
                    .await,
                defaults: config.tenant.clone(),
                compactor: config.agent.compactor.clone(),
            },
        ))
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The hook pipeline.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// The LLM provider.
    pub fn llm(&self) -> &Arc<dyn LlmProvider> {
        &self.llm
    }

    /// The settings.
    pub fn settings(&self) -> &AgentSettings {
        &self.settings
    }

    /// Runs one turn of `session_id` with the user's `input`. Events (deltas,
    /// tool calls, notices, and finally `Done`) go to `events` as they happen.
    pub async fn turn(
        &self,
        session_id: &str,
        input: &str,
        ctx: &HookContext,
        events: Option<mpsc::UnboundedSender<TurnEvent>>,
    ) -> Result<TurnOutcome, AgentError> {
        let turn = self.run_turn(session_id, input, ctx, None, None, events);
        plugd_telemetry::in_span("agent turn", Default::default, turn).await
    }

    /// [`Agent::turn`] for an org identity: the model is offered the tool
    /// exports bound to `org`'s scope (not the workspace's tools), and its
    /// calls go through those bindings. The caller checks that the session
    /// belongs to the org.
    pub async fn turn_for_org(
        &self,
        session_id: &str,
        input: &str,
        ctx: &HookContext,
        org: &OrgTurn,
        events: Option<mpsc::UnboundedSender<TurnEvent>>,
    ) -> Result<TurnOutcome, AgentError> {
        let turn = self.run_turn(session_id, input, ctx, None, Some(org), events);
        plugd_telemetry::in_span("agent turn", Default::default, turn).await
    }

    /// [`Agent::turn`] for a message that came in on a channel: `inbound`
    /// (the seed 001 inbound message reference) goes with every microapp
    /// `tools/call` of the turn.
    pub async fn turn_inbound(
        &self,
        session_id: &str,
        input: &str,
        ctx: &HookContext,
        inbound: Value,
        events: Option<mpsc::UnboundedSender<TurnEvent>>,
    ) -> Result<TurnOutcome, AgentError> {
        let turn = self.run_turn(session_id, input, ctx, Some(inbound), None, events);
        plugd_telemetry::in_span("agent turn", Default::default, turn).await
    }

    /// The stored session `id`, if any.
    pub async fn session(&self, id: &str) -> Result<Option<Session>, AgentError> {
        if !plugd_store::sessions::valid_session_id(id) {
            return Err(AgentError::BadSession(id.to_owned()));
        }
        let row = self
            .runtime
            .state()
            .session_get(id)
            .await
            .map_err(|e| AgentError::Store(e.to_string()))?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Session {
            id: row.id,
            created_at: row.created_at,
            transcript: self.load(id).await?,
        }))
    }
}

/// The turn of a message in on a channel (the runtime's channels call it).
impl ChannelTurn for Agent {
    fn defaults(&self) -> &HookContext {
        &self.settings.defaults
    }

    fn turn_inbound<'a>(
        &'a self,
        session_id: &'a str,
        input: &'a str,
        ctx: &'a HookContext,
        inbound: Value,
    ) -> TurnFuture<'a> {
        Box::pin(async move {
            let out = Agent::turn_inbound(self, session_id, input, ctx, inbound, None)
                .await
                .map_err(|e| e.to_string())?;
            Ok(match out.status {
                TurnStatus::Blocked => InboundTurn::Blocked {
                    at: out.blocked_at,
                    message: out.message,
                },
                TurnStatus::Completed => InboundTurn::Completed { reply: out.reply },
            })
        })
    }
}
