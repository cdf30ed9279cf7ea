//! LLM providers behind one trait: what the agent turn talks to.
//!
//! Providers (each in its own module): an OpenAI-compatible chat-completions
//! client over HTTP, plugin providers through the native `llm.chat` method,
//! and a deterministic `scripted` provider that replays a file (for demos and
//! tests; it says so). The shapes follow the nexo contract's `llm.chat`
//! (§5.y): text or tool calls, a finish reason, token usage, and streamed
//! deltas.

mod build;
pub mod openai;
pub mod plugin;
pub mod scripted;

pub(crate) use build::api_key;
pub use build::build_provider;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id (echoed in the tool result message).
    pub id: String,
    /// The tool's name as the model sees it.
    pub name: String,
    /// Its arguments (a JSON object).
    pub arguments: Value,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// Its text (empty for an assistant message that only calls tools).
    #[serde(default)]
    pub content: String,
    /// Tool calls (assistant messages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this answers (tool messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with text only.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Its name as the model sees it (provider-safe; see the agent turn's mapping).
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// One request to a provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model; `None` = the provider's configured default.
    pub model: Option<String>,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Output budget.
    pub max_tokens: Option<u32>,
    /// Sampling temperature, forwarded as given (`f64`: an `f32` would turn
    /// 0.7 into 0.699999988079071 on the wire).
    pub temperature: Option<f64>,
    /// A system prompt, sent before the messages.
    pub system_prompt: Option<String>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "reason")]
pub enum FinishReason {
    /// It finished its answer.
    Stop,
    /// It wants tool results.
    ToolUse,
    /// It hit the output budget.
    Length,
    /// Something else, as the provider named it.
    Other(String),
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
}

/// A provider's complete answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The text (possibly empty when the model only calls tools).
    pub content: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
}

/// A piece of a streamed answer (nexo `llm.chat.delta` chunk types).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    /// More text.
    TextDelta {
        /// The text.
        delta: String,
    },
    /// A tool call begins.
    ToolCallStart {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// More of a tool call's arguments (JSON text).
    ToolCallArgsDelta {
        /// Call id.
        id: String,
        /// Argument text.
        delta: String,
    },
    /// A tool call is complete.
    ToolCallEnd {
        /// Call id.
        id: String,
    },
}

/// Why a provider call failed (nexo `-33101..-33105` and transport failures).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// No provider is configured, or the named one does not exist.
    #[error("llm not configured: {0}")]
    NotConfigured(String),
    /// The provider could not be reached (-33101).
    #[error("llm provider {provider:?}: connection failed: {message}")]
    Connection {
        /// Provider name.
        provider: String,
        /// Detail.
        message: String,
    },
    /// The provider refused the credentials (-33102).
    #[error("llm provider {provider:?}: authentication failed: {message}")]
    Authentication {
        /// Provider name.
        provider: String,
        /// Detail.
        message: String,
    },
    /// Rate limited (-33103).
    #[error("llm provider {provider:?}: rate limited{}", retry_after_secs.map(|s| format!("; retry after {s}s")).unwrap_or_default())]
    RateLimited {
        /// Provider name.
        provider: String,
        /// When to retry.
        retry_after_secs: Option<u64>,
    },
    /// Unknown model (-33104).
    #[error("llm provider {provider:?}: model not found: {message}")]
    ModelNotFound {
        /// Provider name.
        provider: String,
        /// Detail.
        message: String,
    },
    /// The conversation does not fit (-33105).
    #[error("llm provider {provider:?}: context overflow: {message}")]
    ContextOverflow {
        /// Provider name.
        provider: String,
        /// Detail.
        message: String,
    },
    /// Anything else: malformed replies, HTTP errors, plugin failures.
    #[error("llm provider {provider:?}: {message}")]
    Other {
        /// Provider name.
        provider: String,
        /// Detail.
        message: String,
    },
}

/// The future a provider returns.
pub type LlmFuture<'a> = Pin<Box<dyn Future<Output = Result<ChatResponse, LlmError>> + Send + 'a>>;

/// An LLM provider. With `deltas`, the provider streams (sending each piece as
/// it arrives) and still returns the complete response at the end.
pub trait LlmProvider: Send + Sync + 'static {
    /// Its configured name.
    fn name(&self) -> &str;
    /// One chat completion.
    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: Option<mpsc::UnboundedSender<Delta>>,
    ) -> LlmFuture<'a>;
}

/// The `llm:` section of `plugd.yaml`: which provider the agent turn uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case", deny_unknown_fields)]
pub enum LlmConfig {
    /// An OpenAI-compatible chat-completions endpoint (any compatible server).
    Openai {
        /// Base URL, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
        base_url: String,
        /// Model name.
        model: String,
        /// Environment variable holding the API key (none for local servers).
        #[serde(default)]
        api_key_env: Option<String>,
        /// Name of the operator secret holding the API key (`plugd secrets
        /// set NAME`, sealed in the state database); exclusive with
        /// `api_key_env`.
        #[serde(default)]
        api_key_secret: Option<String>,
        /// Output budget per request.
        #[serde(default)]
        max_tokens: Option<u32>,
        /// Request timeout in milliseconds (default 60 000; 300 000 when streaming).
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// A plugin provider served through the native `llm.chat` method.
    Plugin {
        /// The plugin id.
        plugin: String,
        /// The provider name it declares in `[plugin.extends].llm_providers`.
        name: String,
        /// Model name.
        model: String,
    },
    /// A deterministic provider replaying a file of responses and tool calls
    /// (for demos and tests; it never calls a model).
    Scripted {
        /// The script file (absolute after `${{workspace_dir}}` expansion).
        script: std::path::PathBuf,
    },
}
