//! plugd.yaml's `llm:` section ([`LlmConfig`]) and what it adds to every
//! request ([`RequestOptions`], checked when plugd.yaml loads). The LLM
//! model (messages, requests, replies, the `LlmProvider` trait) and the
//! providers are plugd-agent's `llm`.

use serde::{Deserialize, Serialize};

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
