//! Plugin LLM providers: a native plugin's `llm.chat` (nexo §5.y) as an [`LlmProvider`].
//!
//! The plugin is looked up per call through its [`plugd_host::Supervised`],
//! so a restart swaps the connection underneath and the provider keeps
//! working; the plugin starts on first use (it must be approved). The
//! provider name must be one the plugin declares in
//! `[plugin.extends].llm_providers`. Deadlines: 60 s sync, 300 s streaming,
//! `NEXO_PLUGIN_LLM_TIMEOUT_MS` overrides both.

use std::time::{Duration, Instant};

use plugd_host::native_llm::{self, LlmCallError, LlmChunk, LlmFinish, LlmReply};
use tokio::sync::mpsc;

use super::{
    ChatRequest, ChatResponse, Delta, FinishReason, LlmError, LlmFuture, LlmProvider, ToolCall,
    Usage,
};
use plugd_runtime::Runtime;

/// A provider served by a plugin through `llm.chat`.
#[derive(Debug, Clone)]
pub struct PluginProvider {
    runtime: Runtime,
    plugin: String,
    provider: String,
    model: String,
    /// `plugin/provider`, the name in errors and logs.
    label: String,
    sync_timeout: Duration,
    stream_timeout: Duration,
}

impl PluginProvider {
    /// Provider `name` of plugin `plugin`, with the contract's deadlines
    /// (`NEXO_PLUGIN_LLM_TIMEOUT_MS` read now).
    pub fn new(runtime: &Runtime, plugin: &str, name: &str, model: &str) -> Result<Self, LlmError> {
        let env = std::env::var(native_llm::TIMEOUT_ENV).ok();
        let bad_env = |e: String| LlmError::NotConfigured(e);
        let sync = native_llm::llm_timeout(env.as_deref(), false).map_err(bad_env)?;
        let stream = native_llm::llm_timeout(env.as_deref(), true).map_err(bad_env)?;
        Self::with_timeouts(runtime, plugin, name, model, sync, stream)
    }

    /// [`PluginProvider::new`] with explicit deadlines.
    pub fn with_timeouts(
        runtime: &Runtime,
        plugin: &str,
        name: &str,
        model: &str,
        sync_timeout: Duration,
        stream_timeout: Duration,
    ) -> Result<Self, LlmError> {
        let provider = PluginProvider {
            runtime: runtime.clone(),
            plugin: plugin.to_owned(),
            provider: name.to_owned(),
            model: model.to_owned(),
            label: format!("{plugin}/{name}"),
            sync_timeout,
            stream_timeout,
        };
        provider.check_declared()?;
        Ok(provider)
    }

    /// The plugin exists, speaks the native dialect and declares the provider.
    fn check_declared(&self) -> Result<(), LlmError> {
        let sup = self
            .runtime
            .supervised(&self.plugin)
            .map_err(|e| LlmError::NotConfigured(format!("llm plugin provider: {e}")))?;
        let spec = sup.spec();
        let Some(native) = spec.native.as_ref().filter(|_| {
            plugd_dialects::of(spec.dialect)
                .capabilities()
                .nexo_providers
        }) else {
            return Err(LlmError::NotConfigured(format!(
                "plugin {:?} speaks the {} dialect; only native (nexo-plugin.toml) plugins serve llm.chat providers",
                self.plugin, spec.dialect
            )));
        };
        let declared = &native.extends.llm_providers;
        if !declared.iter().any(|p| p == &self.provider) {
            return Err(LlmError::NotConfigured(format!(
                "plugin {:?} does not declare llm provider {:?} in [plugin.extends].llm_providers (it declares {:?}); fix llm.name or the plugin's manifest",
                self.plugin, self.provider, declared
            )));
        }
        Ok(())
    }

    async fn run(
        &self,
        request: &ChatRequest,
        deltas: Option<mpsc::UnboundedSender<Delta>>,
    ) -> Result<ChatResponse, LlmError> {
        self.check_declared()?;
        let stream = deltas.is_some();
        let timeout = if stream {
            self.stream_timeout
        } else {
            self.sync_timeout
        };
        let deadline = Instant::now() + timeout;
        let sup = self
            .runtime
            .supervised(&self.plugin)
            .map_err(|e| LlmError::NotConfigured(e.to_string()))?;
        let conn = sup
            .connection(deadline)
            .await
            .map_err(|e| LlmError::Connection {
                provider: self.label.clone(),
                message: e.to_string(),
            })?;
        let model = request.model.clone().unwrap_or_else(|| self.model.clone());
        let mut wire = request.clone();
        wire.model = Some(model.clone());
        let mut wire = serde_json::to_value(&wire).map_err(|e| LlmError::Other {
            provider: self.label.clone(),
            message: format!("cannot encode the request: {e}"),
        })?;
        complete_wire_request(&mut wire);
        let mut forward = |chunk: &LlmChunk| {
            if let (Some(tx), Some(delta)) = (&deltas, to_delta(chunk)) {
                let _ = tx.send(delta);
            }
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let reply = native_llm::chat(
            &conn.peer,
            &self.provider,
            &model,
            &wire,
            stream,
            Some(&mut forward),
            left,
        )
        .await
        .map_err(|e| self.map_error(e))?;
        Ok(to_response(reply))
    }

    fn map_error(&self, e: LlmCallError) -> LlmError {
        let provider = self.label.clone();
        match e {
            LlmCallError::ConnectionFailed { message, .. } => {
                LlmError::Connection { provider, message }
            }
            LlmCallError::AuthenticationFailed { message, .. } => {
                LlmError::Authentication { provider, message }
            }
            LlmCallError::RateLimited {
                retry_after_secs, ..
            } => LlmError::RateLimited {
                provider,
                retry_after_secs,
            },
            LlmCallError::ModelNotFound { message, .. } => {
                LlmError::ModelNotFound { provider, message }
            }
            LlmCallError::ContextOverflow { message, .. } => {
                LlmError::ContextOverflow { provider, message }
            }
            other => LlmError::Other {
                provider,
                message: other.to_string(),
            },
        }
    }
}

/// Fills in the fields of nexo's `ChatRequest` the request leaves unset
/// (§5.y: `stop_sequences`, `tool_choice`, `system_blocks`, `cache_tools`)
/// with their neutral values, so a provider written against the contract's
/// full schema finds every field it reads. `stop_sequences`, `tool_choice`
/// and `cache_tools` carry plugd.yaml's `llm:` values when it sets them
/// (see [`super::RequestOptions`]); `system_blocks` is always `[]`: plugd
/// sends the system prompt as `system_prompt`, and the seed does not define
/// a block's shape.
pub(crate) fn complete_wire_request(wire: &mut serde_json::Value) {
    let Some(obj) = wire.as_object_mut() else {
        return;
    };
    let defaults = [
        ("stop_sequences", serde_json::json!([])),
        ("tool_choice", serde_json::json!({"kind": "auto"})),
        ("system_blocks", serde_json::json!([])),
        ("cache_tools", serde_json::json!(false)),
    ];
    for (key, value) in defaults {
        obj.entry(key).or_insert(value);
    }
}

fn to_delta(chunk: &LlmChunk) -> Option<Delta> {
    match chunk {
        LlmChunk::Delta(d) => Some(d.clone()),
        // Folded into the final response.
        LlmChunk::Meta(_) => None,
    }
}

fn finish(f: &LlmFinish) -> FinishReason {
    match f.kind.as_str() {
        "stop" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolUse,
        "length" => FinishReason::Length,
        "other" => FinishReason::Other(f.reason.clone().unwrap_or_else(|| "other".into())),
        kind => FinishReason::Other(kind.to_owned()),
    }
}

fn to_response(reply: LlmReply) -> ChatResponse {
    ChatResponse {
        content: reply.text,
        finish_reason: finish(&reply.finish_reason),
        tool_calls: reply
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.name,
                arguments: c.arguments,
            })
            .collect(),
        usage: Usage {
            prompt_tokens: reply.usage.prompt_tokens,
            completion_tokens: reply.usage.completion_tokens,
        },
    }
}

impl LlmProvider for PluginProvider {
    fn name(&self) -> &str {
        &self.label
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: Option<mpsc::UnboundedSender<Delta>>,
    ) -> LlmFuture<'a> {
        Box::pin(self.run(request, deltas))
    }
}
