//! The seam between the plugin core and the agent side (plugd-agent): the
//! one trait, [`AgentParts`], through which the runtime reaches agent
//! behaviour it does not hold itself.
//!
//! plugd-agent depends on this crate, never the reverse. Where the runtime
//! needs agent behaviour (the hook pipeline built from `plugd.yaml`; an
//! MCP sampling through the LLM provider; the
//! `llm.complete` and `memory.recall` services native plugins call), it asks
//! the [`AgentParts`] it was opened with ([`crate::Runtime::open`]).
//! plugd-agent's `parts()` is the implementation every product path
//! installs. A runtime opened with [`NoAgent`] (the runtime's own unit
//! tests) has none of it: each such request fails with an error naming what
//! is missing, never silently does less.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use plugd_host::native_host::{AdminFuture, ApiFuture, CompleteRequest, Completion, ServiceError};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::Runtime;
use crate::config::PlugdConfig;
use crate::hooks::{HookContext, Pipeline, PipelineError};
use crate::llm::LlmConfig;

/// A pipeline being built ([`AgentParts::build_pipeline`]).
pub type PipelineFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Pipeline, PipelineError>> + Send + 'a>>;

/// A sampling request being answered ([`AgentParts::sample`]).
pub type SampleFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Value, plugd_wire::ErrorObject>> + Send + 'a>>;

/// Why a job the outbox worker ran for the agent side failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFailure {
    /// What went wrong, for the delivery's `last_error`.
    pub message: String,
    /// Whether another attempt may succeed (else a dead letter at once).
    pub retryable: bool,
}

/// A job being run ([`AgentParts::compaction_job`]).
pub type JobFuture = Pin<Box<dyn Future<Output = Result<(), JobFailure>> + Send>>;

/// What the runtime asks of the agent side. One value serves one runtime
/// (it may keep per-runtime state, such as providers built on first use).
pub trait AgentParts: Send + Sync + 'static {
    /// Builds the hook pipeline of `config` over `rt`'s plugins (starting
    /// plugin-served handlers, loading Dexto modules) and installs it in
    /// `rt` ([`Runtime::set_hooks`]): every tool call passes it.
    fn build_pipeline<'a>(&'a self, rt: &'a Runtime, config: &'a PlugdConfig)
    -> PipelineFuture<'a>;

    /// `sampling/createMessage` of hosted MCP server `server`, already
    /// allowed by the operator, with the provider `llm` describes and
    /// `maxTokens` cut to `cap`: the MCP result or the error the server gets.
    fn sample<'a>(
        &'a self,
        rt: &'a Runtime,
        server: &'a str,
        llm: &'a LlmConfig,
        params: &'a Value,
        cap: u32,
    ) -> SampleFuture<'a>;

    /// `nexo/admin/*` method `method` of microapp `plugin` (seed 001): the
    /// result, or the JSON-RPC error the microapp gets.
    fn microapp_admin(
        &self,
        rt: Runtime,
        plugin: String,
        method: String,
        params: Value,
    ) -> AdminFuture;

    /// `memory.recall` of native plugin `plugin` (nexo §5.3): the entries as
    /// the contract shapes them.
    fn memory_recall(
        &self,
        rt: Runtime,
        plugin: &str,
        agent_id: String,
        query: String,
        limit: usize,
    ) -> ApiFuture<Vec<Value>>;

    /// `llm.complete` of native plugin `plugin` (nexo §5.4), streaming text
    /// deltas to `deltas` when given.
    fn llm_complete(
        &self,
        rt: Runtime,
        plugin: &str,
        request: CompleteRequest,
        deltas: Option<mpsc::UnboundedSender<String>>,
    ) -> ApiFuture<Completion>;

    /// Runs compaction job `job` (an outbox delivery of
    /// [`crate::compaction::COMPACTION_JOB`] to a compactor export): done
    /// once the session is compacted, by this attempt or an earlier one.
    fn compaction_job(&self, rt: Runtime, job: plugd_store::outbox::Leased) -> JobFuture;
}

/// No agent side: what a runtime opened without plugd-agent's parts has.
/// Every request for agent behaviour fails, naming what is missing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAgent;

/// Why a [`NoAgent`] runtime refuses `what`.
fn missing(what: &str) -> String {
    format!(
        "{what} not configured: this runtime was opened without the agent parts (plugd_agent::parts()), so it has no {what}"
    )
}

impl AgentParts for NoAgent {
    /// An empty pipeline when `config` names no handler; a config with hook
    /// handlers is refused (never run without them).
    fn build_pipeline<'a>(
        &'a self,
        rt: &'a Runtime,
        config: &'a PlugdConfig,
    ) -> PipelineFuture<'a> {
        Box::pin(async move {
            if let Some(first) = crate::hook_specs::specs(config).into_iter().next() {
                return Err(PipelineError::Init {
                    name: first.name,
                    reason: missing("hook handlers"),
                });
            }
            let pipeline = Pipeline::new(Vec::new())?;
            rt.set_hooks(
                Arc::new(pipeline.clone()),
                config.context(&HookContext::default()),
            );
            Ok(pipeline)
        })
    }

    fn sample<'a>(
        &'a self,
        _rt: &'a Runtime,
        _server: &'a str,
        _llm: &'a LlmConfig,
        _params: &'a Value,
        _cap: u32,
    ) -> SampleFuture<'a> {
        Box::pin(async {
            Err(plugd_wire::ErrorObject::new(
                plugd_wire::codes::INTERNAL_ERROR,
                format!("sampling failed: {}", missing("llm")),
            ))
        })
    }

    fn microapp_admin(
        &self,
        _rt: Runtime,
        _plugin: String,
        method: String,
        _params: Value,
    ) -> AdminFuture {
        Box::pin(async move {
            Err(plugd_wire::ErrorObject::new(
                plugd_wire::codes::METHOD_NOT_FOUND,
                format!("{method}: {}", missing("microapp admin")),
            ))
        })
    }

    fn memory_recall(
        &self,
        _rt: Runtime,
        _plugin: &str,
        _agent_id: String,
        _query: String,
        _limit: usize,
    ) -> ApiFuture<Vec<Value>> {
        Box::pin(async { Err(ServiceError::NotConfigured(missing("memory"))) })
    }

    fn llm_complete(
        &self,
        _rt: Runtime,
        _plugin: &str,
        _request: CompleteRequest,
        _deltas: Option<mpsc::UnboundedSender<String>>,
    ) -> ApiFuture<Completion> {
        Box::pin(async { Err(ServiceError::NotConfigured(missing("llm"))) })
    }

    fn compaction_job(&self, _rt: Runtime, _job: plugd_store::outbox::Leased) -> JobFuture {
        Box::pin(async {
            Err(JobFailure {
                message: missing("compaction jobs"),
                retryable: true,
            })
        })
    }
}

/// The parts of a runtime that has no agent side ([`NoAgent`]).
pub fn no_agent() -> Arc<dyn AgentParts> {
    Arc::new(NoAgent)
}

#[cfg(test)]
mod tests {
    use plugd_host::HostConfig;
    use serde_json::json;

    use super::*;
    use crate::hooks::HookPoint;

    /// A runtime over a workspace whose plugd.yaml is `yaml`, opened with
    /// no agent side.
    async fn open(yaml: &str) -> (tempfile::TempDir, Runtime, PlugdConfig) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plugd.yaml"), yaml).unwrap();
        let rt = Runtime::open(dir.path(), HostConfig::default(), no_agent())
            .await
            .unwrap();
        let config = PlugdConfig::load(dir.path()).unwrap();
        (dir, rt, config)
    }

    #[tokio::test]
    async fn a_runtime_without_the_agent_side_refuses_hook_handlers_naming_them() {
        let (_dir, rt, config) = open("plugins:\n  contentPolicy:\n    priority: 10\n").await;
        let err = rt
            .agent_parts()
            .build_pipeline(&rt, &config)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("content_policy") && text.contains("without the agent parts"),
            "{text}"
        );
        // Nothing was installed: no tool call runs a half-built pipeline.
        assert!(rt.hooks().is_none());
    }

    #[tokio::test]
    async fn without_hook_handlers_an_empty_pipeline_is_installed() {
        let (_dir, rt, config) = open("tenant:\n  agent_id: a1\n").await;
        let pipeline = rt.agent_parts().build_pipeline(&rt, &config).await.unwrap();
        assert!(pipeline.chain(HookPoint::BeforeToolCall).is_empty());
        assert!(rt.hooks().is_some());
    }

    #[tokio::test]
    async fn sampling_admin_and_services_are_refused_naming_what_is_missing() {
        let (_dir, rt, _config) = open("tenant:\n  agent_id: a1\n").await;
        let llm = LlmConfig::Scripted {
            script: "/nonexistent".into(),
        };
        let parts = rt.agent_parts().clone();
        let e = parts
            .sample(&rt, "srv", &llm, &json!({"messages": []}), 16)
            .await
            .unwrap_err();
        assert!(
            e.message.contains("without the agent parts"),
            "{}",
            e.message
        );
        let e = parts
            .microapp_admin(
                rt.clone(),
                "app".into(),
                "nexo/admin/agents/list".into(),
                json!({}),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, plugd_wire::codes::METHOD_NOT_FOUND);
        assert!(
            e.message.contains("without the agent parts"),
            "{}",
            e.message
        );
        let e = parts
            .memory_recall(rt.clone(), "p", "a".into(), "q".into(), 3)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("memory"), "{e}");
    }
}
