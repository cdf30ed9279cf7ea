//! plugd's agent side, over the plugin core of `plugd-runtime`: the agent
//! turn (LLM ↔ tools through the hook pipeline, sessions and transcripts)
//! and the compaction of a session's chain.
//!
//! **API boundary**: this crate uses the runtime only through its public
//! API; every tool call of a turn goes through the runtime's one governed
//! path ([`plugd_runtime::governed`]), so the tool hooks and the risk gate
//! run as for every other surface. The runtime reaches the turn (a message
//! in on a channel) only through the trait it defines,
//! [`plugd_runtime::channels::ChannelTurn`], which [`agent::Agent`] implements.

pub mod agent;
pub mod compaction;
