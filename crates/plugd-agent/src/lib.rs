//! plugd's agent side, over the plugin core of `plugd-runtime`: the agent
//! turn (LLM ↔ tools through the hook pipeline, sessions and transcripts),
//! the compaction of a session's chain, the LLM providers ([`llm`]), agent
//! memory ([`recall`], [`embed`], [`vector`]) and the services native
//! plugins call that need them ([`host_services`]).
//!
//! **API boundary**: this crate uses the runtime only through its public
//! API; every tool call of a turn goes through the runtime's one governed
//! path ([`plugd_runtime::governed`]), so the tool hooks and the risk gate
//! run as for every other surface. The runtime reaches the agent side only
//! through the traits it defines: [`plugd_runtime::agent_seam::AgentParts`]
//! (implemented by [`host_services::Parts`], installed by [`open`] /
//! [`parts`] wherever a runtime is opened) and
//! [`plugd_runtime::channels::ChannelTurn`] (a message in on a channel),
//! which [`agent::Agent`] implements.

pub mod agent;
pub mod channels;
pub mod compaction;
pub mod embed;
pub mod hooks;
pub mod host_services;
pub mod llm;
pub mod microapp_admin;
pub mod recall;
pub mod sampling;
#[cfg(test)]
use plugd_wire::test_json;
pub mod vector;

use std::path::Path;

use plugd_host::HostConfig;
use plugd_runtime::{Runtime, RuntimeError};

pub use host_services::parts;

/// Opens the workspace at `dir` with the agent side installed: what every
/// product path (serve, the CLI, bench, tests) opens a runtime with.
pub async fn open(dir: &Path, config: HostConfig) -> Result<Runtime, RuntimeError> {
    Runtime::open(dir, config, parts()).await
}
