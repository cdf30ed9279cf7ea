//! The hook handlers of the agent side and the building of the pipeline
//! from `plugd.yaml`: the built-ins ([`builtin`]), Dexto JavaScript modules
//! run unmodified in a Node host ([`dexto`], with the `context.agent` it
//! serves in [`dexto_agent`]), and handlers served by plugins of any dialect
//! ([`remote`]); [`build`] assembles them.
//!
//! The hook model and the pipeline that runs them (points, contexts,
//! notices, outcomes, the [`Pipeline`] every tool call passes) are the
//! runtime's (`plugd_runtime::hooks`) and re-exported here; the runtime
//! builds a pipeline through [`plugd_runtime::agent_seam::AgentParts`].

pub mod build;
pub mod builtin;
pub mod dexto;
pub mod dexto_agent;
pub mod dexto_package;
pub mod remote;

pub use plugd_runtime::hooks::{
    HandlerResult, HandlerSpec, HookContext, HookError, HookFuture, HookHandler, HookPoint, Notice,
    NoticeKind, OnError, Outcome, OutcomeKind, Pipeline, PipelineError, merge,
};
