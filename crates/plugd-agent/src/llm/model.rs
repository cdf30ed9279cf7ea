//! The LLM model: messages, requests, replies and the [`LlmProvider`] trait
//! the providers implement. The shapes follow the nexo contract's
//! `llm.chat` (§5.y): text or tool calls, a finish reason, token usage, and
//! streamed deltas. plugd.yaml's `llm:` (`LlmConfig`, [`RequestOptions`])
//! is the runtime's (`plugd_runtime::llm`).

use std::future::Future;
use std::pin::Pin;

use plugd_runtime::llm::{RequestOptions, ToolChoiceSetting};
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

/// Which tool the model may or must call: nexo §5.y's `tool_choice`, on
/// the wire `{"kind": "auto"|"any"|"none"|"specific", "name"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the default).
    Auto,
    /// The model must call some tool.
    Any,
    /// The model must not call tools.
    None,
    /// The model must call this tool (its model-facing name).
    Specific {
        /// The tool.
        name: String,
    },
}

/// `name` as providers accept a tool name: every character but ASCII
/// letters, digits, `_` and `-` becomes `_` (`guard/chatty` → `guard_chatty`).
pub fn provider_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Fills what `request` leaves unset with `options`. A `specific` tool is matched
/// against the request's tools by name or by its provider-safe form
/// (`guard/chatty` → `guard_chatty`); one the request does not offer is
/// left out (the provider's default, auto), since no provider accepts a
/// choice of a tool it was not given.
pub fn apply_options(options: &RequestOptions, request: &mut ChatRequest) {
    if request.stop_sequences.is_empty() {
        request.stop_sequences = options.stop_sequences.clone();
    }
    request.cache_tools |= options.cache_tools;
    if request.tool_choice.is_some() {
        return;
    }
    request.tool_choice = match &options.tool_choice {
        None => None,
        Some(ToolChoiceSetting::Auto) => Some(ToolChoice::Auto),
        Some(ToolChoiceSetting::Any) => Some(ToolChoice::Any),
        Some(ToolChoiceSetting::None) => Some(ToolChoice::None),
        Some(ToolChoiceSetting::Specific(name)) => {
            let safe = provider_safe(name);
            let offered = request
                .tools
                .iter()
                .find(|t| t.name == *name || t.name == safe)
                .map(|t| t.name.clone());
            if offered.is_none() {
                tracing::debug!(tool = %name, "llm.tool_choice names a tool this request does not offer; left to the provider");
            }
            offered.map(|name| ToolChoice::Specific { name })
        }
    };
}

/// A provider with plugd.yaml's [`RequestOptions`] applied to every request.
pub struct WithRequestOptions {
    inner: std::sync::Arc<dyn LlmProvider>,
    options: RequestOptions,
}

impl WithRequestOptions {
    /// `inner`, its requests completed with `options`.
    pub fn new(inner: std::sync::Arc<dyn LlmProvider>, options: RequestOptions) -> Self {
        WithRequestOptions { inner, options }
    }
}

impl LlmProvider for WithRequestOptions {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: Option<mpsc::UnboundedSender<Delta>>,
    ) -> LlmFuture<'a> {
        let mut request = request.clone();
        apply_options(&self.options, &mut request);
        Box::pin(async move { self.inner.chat(&request, deltas).await })
    }
}

/// One request to a provider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Sequences that end the reply (nexo `stop_sequences`, OpenAI `stop`).
    #[serde(default)]
    pub stop_sequences: Vec<String>,
    /// Which tool the model may or must call; `None`: the provider's
    /// default (auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Ask the provider to cache the tool definitions (nexo `cache_tools`,
    /// Anthropic-style prompt caching; providers without it ignore it).
    #[serde(default)]
    pub cache_tools: bool,
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

/// A piece of a streamed answer (nexo `llm.chat.delta` chunk types): the one
/// type every provider streams, a plugin provider's chunks as they come.
pub use plugd_host::native_llm::Delta;

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
