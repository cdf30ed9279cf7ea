//! The LLM model: messages, requests, replies, the [`LlmProvider`] trait
//! and plugd.yaml's `llm:` section ([`LlmConfig`]). The providers behind the
//! trait (OpenAI-compatible, plugin, scripted) are plugd-agent's `llm`.
//!
//! The shapes follow the nexo contract's `llm.chat`
//! (§5.y): text or tool calls, a finish reason, token usage, and streamed
//! deltas.

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

/// `tool_choice` as plugd.yaml's `llm:` writes it: `auto`, `any`, `none`
/// or `{specific: TOOL}` (TOOL as `plugd tool list` or the model names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceSetting {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Any,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Specific(String),
}

/// Most `stop_sequences` plugd.yaml may set.
pub const MAX_STOP_SEQUENCES: usize = 16;

/// Longest stop sequence, in bytes.
pub const MAX_STOP_SEQUENCE: usize = 256;

/// What plugd.yaml's `llm:` (or an `llm_providers` entry) adds to every
/// request sent to that provider: nexo §5.y's `stop_sequences`,
/// `tool_choice` and `cache_tools`. A request that sets one keeps its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// `stop_sequences`.
    pub stop_sequences: Vec<String>,
    /// `tool_choice`.
    pub tool_choice: Option<ToolChoiceSetting>,
    /// `cache_tools`.
    pub cache_tools: bool,
}

impl RequestOptions {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == RequestOptions::default()
    }

    /// Checks the bounds; the message names the field and what to do.
    pub fn check(&self) -> Result<(), String> {
        if self.stop_sequences.len() > MAX_STOP_SEQUENCES {
            return Err(format!(
                "llm.stop_sequences has {} entries; at most {MAX_STOP_SEQUENCES}",
                self.stop_sequences.len()
            ));
        }
        if let Some(s) = self
            .stop_sequences
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_STOP_SEQUENCE)
        {
            return Err(format!(
                "llm.stop_sequences entry {:?} is not 1-{MAX_STOP_SEQUENCE} bytes; fix or remove it",
                s.chars().take(40).collect::<String>()
            ));
        }
        if let Some(ToolChoiceSetting::Specific(name)) = &self.tool_choice
            && name.trim().is_empty()
        {
            return Err(
                "llm.tool_choice.specific is empty; name a tool as `plugd tool list` shows it"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// Fills what `request` leaves unset. A `specific` tool is matched
    /// against the request's tools by name or by its provider-safe form
    /// (`guard/chatty` → `guard_chatty`); one the request does not offer is
    /// left out (the provider's default, auto), since no provider accepts a
    /// choice of a tool it was not given.
    pub fn apply(&self, request: &mut ChatRequest) {
        if request.stop_sequences.is_empty() {
            request.stop_sequences = self.stop_sequences.clone();
        }
        request.cache_tools |= self.cache_tools;
        if request.tool_choice.is_some() {
            return;
        }
        request.tool_choice = match &self.tool_choice {
            None => None,
            Some(ToolChoiceSetting::Auto) => Some(ToolChoice::Auto),
            Some(ToolChoiceSetting::Any) => Some(ToolChoice::Any),
            Some(ToolChoiceSetting::None) => Some(ToolChoice::None),
            Some(ToolChoiceSetting::Specific(name)) => {
                let safe: String = name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
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
        self.options.apply(&mut request);
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
        /// Stop sequences sent with every request (OpenAI `stop`).
        #[serde(default)]
        stop_sequences: Vec<String>,
        /// `auto`, `any` (OpenAI `required`), `none` or `{specific: TOOL}`.
        #[serde(default)]
        tool_choice: Option<ToolChoiceSetting>,
        /// Ask for the tool list to be cached (no OpenAI equivalent: ignored there).
        #[serde(default)]
        cache_tools: bool,
    },
    /// A plugin provider served through the native `llm.chat` method.
    Plugin {
        /// The plugin id.
        plugin: String,
        /// The provider name it declares in `[plugin.extends].llm_providers`.
        name: String,
        /// Model name.
        model: String,
        /// `stop_sequences` of every `llm.chat` request.
        #[serde(default)]
        stop_sequences: Vec<String>,
        /// `tool_choice` of every `llm.chat` request: `auto`, `any`, `none` or
        /// `{specific: TOOL}`.
        #[serde(default)]
        tool_choice: Option<ToolChoiceSetting>,
        /// `cache_tools` of every `llm.chat` request.
        #[serde(default)]
        cache_tools: bool,
    },
    /// A deterministic provider replaying a file of responses and tool calls
    /// (for demos and tests; it never calls a model).
    Scripted {
        /// The script file (absolute after `${{workspace_dir}}` expansion).
        script: std::path::PathBuf,
    },
}

impl LlmConfig {
    /// The [`RequestOptions`] this provider's requests carry.
    pub fn request_options(&self) -> RequestOptions {
        match self {
            LlmConfig::Openai {
                stop_sequences,
                tool_choice,
                cache_tools,
                ..
            }
            | LlmConfig::Plugin {
                stop_sequences,
                tool_choice,
                cache_tools,
                ..
            } => RequestOptions {
                stop_sequences: stop_sequences.clone(),
                tool_choice: tool_choice.clone(),
                cache_tools: *cache_tools,
            },
            LlmConfig::Scripted { .. } => RequestOptions::default(),
        }
    }
}
