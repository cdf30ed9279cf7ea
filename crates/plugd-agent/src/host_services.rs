//! The agent side of the services native plugins call (nexo contract
//! §5.3-§5.4), and [`Parts`], plugd-agent's [`AgentParts`]: long-term
//! memory (keyword or semantic recall, see [`crate::recall`]) and
//! `llm.complete` through a provider registered by name. The runtime keeps
//! the rest of the services (the bus, microapp administration, dispatch)
//! and reaches these through its `agent_seam`.
//!
//! `llm.complete {provider: NAME}` reaches, in this order: the entry `NAME`
//! of `plugd.yaml`'s `llm_providers:`; the single `llm:` section when `NAME`
//! is its kind (`openai`, `scripted`) or its plugin provider name (the
//! back-compatible form); a provider `NAME` an approved native plugin
//! declares in `[plugin.extends].llm_providers`. Anything else is `-32603`
//! naming the registered providers. Providers are built on first use, from
//! the configuration as it is then; a failure is not kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use plugd_host::native_host::{
    ApiFuture, CompleteRequest, CompleteUsage, Completion, ServiceError,
};
use plugd_runtime::Runtime;
use plugd_runtime::agent_seam::AgentParts;
use plugd_runtime::config::PlugdConfig;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::llm::{ChatMessage, ChatRequest, Delta, FinishReason, LlmConfig, LlmProvider, Role};
use crate::recall::{MemoryExt, RecallError};

/// The workspace's LLM provider and the name plugins ask for it by, or why
/// there is none.
type Provider = (Arc<dyn LlmProvider>, String);

/// plugd-agent's side of one runtime: what [`plugd_runtime::Runtime::open`]
/// is given so hooks, LLM providers and memory work. One per runtime: it
/// keeps the providers `llm.complete` built for that runtime.
#[derive(Default)]
pub struct Parts {
    providers: Arc<Providers>,
}

/// The providers `llm.complete` built so far.
#[derive(Default)]
struct Providers {
    llm: tokio::sync::OnceCell<Provider>,
    /// `llm_providers:` entries built so far, by name.
    named: Mutex<HashMap<String, Arc<dyn LlmProvider>>>,
}

/// The agent parts every runtime of the product is opened with.
pub fn parts() -> Arc<dyn AgentParts> {
    Arc::new(Parts::default())
}

impl Providers {
    async fn provider(&self, runtime: &Runtime) -> Result<Provider, ServiceError> {
        let built = self
            .llm
            .get_or_try_init(|| async {
                let config = PlugdConfig::load(runtime.dir())
                    .map_err(|e| format!("llm not configured: {e}"))?;
                let llm = config.llm.as_ref().ok_or_else(|| {
                    format!(
                        "llm not configured: {} has no llm: section",
                        runtime
                            .dir()
                            .join(plugd_runtime::config::CONFIG_FILE)
                            .display()
                    )
                })?;
                let kind = match llm {
                    LlmConfig::Openai { .. } => "openai".to_owned(),
                    LlmConfig::Plugin { name, .. } => name.clone(),
                    LlmConfig::Scripted { .. } => "scripted".to_owned(),
                };
                let provider = crate::llm::build_provider(llm, runtime, runtime.dir())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<Provider, String>((provider, kind))
            })
            .await;
        // A failure is not kept: the next request tries again (the operator
        // may have fixed plugd.yaml meanwhile).
        built.cloned().map_err(ServiceError::NotConfigured)
    }

    /// The provider registered as `name` (see the module docs), with `model`
    /// as the default model of a plugin provider.
    async fn provider_named(
        &self,
        runtime: &Runtime,
        name: &str,
        model: &str,
    ) -> Result<Arc<dyn LlmProvider>, ServiceError> {
        let config = PlugdConfig::load(runtime.dir())
            .map_err(|e| ServiceError::NotConfigured(format!("llm not configured: {e}")))?;
        if let Some(llm) = config.llm_providers.get(name) {
            if let Some(p) = self
                .named
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
            {
                return Ok(p.clone());
            }
            let built = crate::llm::build_provider(llm, runtime, runtime.dir())
                .await
                .map_err(|e| ServiceError::NotConfigured(format!("llm_providers.{name}: {e}")))?;
            self.named
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_owned(), built.clone());
            return Ok(built);
        }
        let legacy = config.llm.as_ref().map(|llm| match llm {
            LlmConfig::Openai { .. } => "openai".to_owned(),
            LlmConfig::Plugin { name, .. } => name.clone(),
            LlmConfig::Scripted { .. } => "scripted".to_owned(),
        });
        if legacy.as_deref() == Some(name) {
            return Ok(self.provider(runtime).await?.0);
        }
        let plugins = plugin_providers(runtime).await;
        if let Some((plugin, _)) = plugins.iter().find(|(_, n)| n == name) {
            let p = crate::llm::plugin::PluginProvider::new(runtime, plugin, name, model)
                .map_err(|e| ServiceError::NotConfigured(e.to_string()))?;
            return Ok(Arc::new(p));
        }
        let mut registered: Vec<String> = config.llm_providers.keys().cloned().collect();
        registered.extend(legacy);
        registered.extend(
            plugins
                .into_iter()
                .map(|(plugin, n)| format!("{n} (plugin {plugin})")),
        );
        Err(ServiceError::NotConfigured(if registered.is_empty() {
            format!(
                "llm not configured: provider {name:?} is not registered and this workspace has no provider; add llm_providers.{name} to {}",
                runtime
                    .dir()
                    .join(plugd_runtime::config::CONFIG_FILE)
                    .display()
            )
        } else {
            format!(
                "llm not configured: provider {name:?} is not registered; registered: {}",
                registered.join(", ")
            )
        }))
    }
}

/// `(plugin, provider)` for each provider an approved native plugin declares
/// in `[plugin.extends].llm_providers`, sorted by plugin id.
async fn plugin_providers(runtime: &Runtime) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (id, sup) in runtime.supervised_plugins() {
        let spec = sup.spec();
        let Some(native) = spec.native.as_ref() else {
            continue;
        };
        if native.extends.llm_providers.is_empty()
            || !matches!(runtime.state().approval(&id).await, Ok(Some(_)))
        {
            continue;
        }
        for name in &native.extends.llm_providers {
            out.push((id.clone(), name.clone()));
        }
    }
    out
}

fn role(name: &str) -> Role {
    match name {
        "system" => Role::System,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => Role::User,
    }
}

fn finish(reason: &FinishReason) -> String {
    match reason {
        FinishReason::Stop => "stop".into(),
        FinishReason::Length => "length".into(),
        FinishReason::ToolUse => "tool_use".into(),
        FinishReason::Other(r) => format!("other:{r}"),
    }
}

impl AgentParts for Parts {
    fn compaction_job(
        &self,
        rt: Runtime,
        job: plugd_store::outbox::Leased,
    ) -> plugd_runtime::agent_seam::JobFuture {
        Box::pin(async move { crate::compaction::run_job(&rt, &job).await })
    }

    fn microapp_admin(
        &self,
        rt: Runtime,
        plugin: String,
        method: String,
        params: Value,
    ) -> plugd_host::native_host::AdminFuture {
        Box::pin(async move { crate::microapp_admin::admin(&rt, &plugin, &method, params).await })
    }

    fn build_pipeline<'a>(
        &'a self,
        rt: &'a Runtime,
        config: &'a plugd_runtime::config::PlugdConfig,
    ) -> plugd_runtime::agent_seam::PipelineFuture<'a> {
        Box::pin(crate::hooks::build::build_pipeline(config, rt))
    }

    fn sample<'a>(
        &'a self,
        rt: &'a Runtime,
        server: &'a str,
        llm: &'a LlmConfig,
        params: &'a Value,
        cap: u32,
    ) -> plugd_runtime::agent_seam::SampleFuture<'a> {
        Box::pin(crate::sampling::sample(rt, server, llm, params, cap))
    }

    fn memory_recall(
        &self,
        runtime: Runtime,
        plugin: &str,
        agent_id: String,
        query: String,
        limit: usize,
    ) -> ApiFuture<Vec<Value>> {
        let plugin = plugin.to_owned();
        Box::pin(async move {
            // Keyword or semantic recall as plugd.yaml's `memory:` says
            // (crate::recall); a failure is never hidden by a fallback.
            let entries = runtime
                .memory_recall(&agent_id, &query, Some(limit))
                .await
                .map_err(|e| match e {
                    RecallError::Store(plugd_store::StoreError::Invalid { .. }) => {
                        ServiceError::InvalidParams(format!("memory.recall: {e}"))
                    }
                    RecallError::Disabled { .. } => ServiceError::NotConfigured(e.to_string()),
                    other => {
                        tracing::warn!(%plugin, error = %other, "memory.recall failed");
                        ServiceError::Failed(format!("memory backend error: {other}"))
                    }
                })?;
            Ok(entries
                .into_iter()
                .map(|e| {
                    json!({
                        "id": e.id,
                        "agent_id": e.agent_id,
                        "content": e.content,
                        "tags": e.tags,
                        "concept_tags": [],
                        "created_at": e.created_at,
                        "memory_type": null,
                    })
                })
                .collect())
        })
    }

    fn llm_complete(
        &self,
        runtime: Runtime,
        plugin: &str,
        request: CompleteRequest,
        deltas: Option<mpsc::UnboundedSender<String>>,
    ) -> ApiFuture<Completion> {
        let plugin = plugin.to_owned();
        // The provider is resolved inside the future, from the cache the
        // runtime's parts share.
        let providers = self.providers.clone();
        Box::pin(async move {
            let provider = providers
                .provider_named(&runtime, &request.provider, &request.model)
                .await?;
            let mut messages: Vec<ChatMessage> = request
                .messages
                .iter()
                .map(|m| ChatMessage::text(role(&m.role), m.content.clone()))
                .collect();
            messages.retain(|m| !(m.role == Role::System && m.content.is_empty()));
            let chat = ChatRequest {
                model: Some(request.model.clone()),
                messages,
                tools: Vec::new(),
                max_tokens: Some(request.max_tokens),
                temperature: Some(request.temperature),
                system_prompt: request.system_prompt.clone(),
                ..ChatRequest::default()
            };
            let (tx, mut rx) = mpsc::unbounded_channel::<Delta>();
            let streaming = deltas.is_some();
            let forward = async move {
                while let Some(d) = rx.recv().await {
                    if let (Delta::TextDelta { delta }, Some(out)) = (d, deltas.as_ref())
                        && !delta.is_empty()
                    {
                        let _ = out.send(delta);
                    }
                }
            };
            let call = provider.chat(&chat, streaming.then_some(tx));
            let (reply, ()) = tokio::join!(call, forward);
            let reply = reply.map_err(|e| {
                tracing::warn!(%plugin, error = %e, "llm.complete failed");
                ServiceError::Failed(e.to_string())
            })?;
            if reply.content.is_empty() && !reply.tool_calls.is_empty() {
                return Err(ServiceError::ToolCallsOnly);
            }
            Ok(Completion {
                content: reply.content,
                finish_reason: finish(&reply.finish_reason),
                usage: CompleteUsage {
                    prompt_tokens: reply.usage.prompt_tokens,
                    completion_tokens: reply.usage.completion_tokens,
                },
            })
        })
    }
}
