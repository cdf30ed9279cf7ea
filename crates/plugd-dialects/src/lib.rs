//! plugd's plugin contracts: one module per dialect, each a
//! [`plugd_host::Dialect`], and [`table`], the one place a contract of the
//! manifest ([`plugd_manifest::Dialect`]) is turned into its dialect.
//!
//! | dialect | envelope | module |
//! |---|---|---|
//! | native (nexo contract) | JSON-RPC, lines | [`native`] |
//! | microapp | JSON-RPC, lines | [`microapp`] |
//! | Salmex | JSON-RPC, Content-Length | [`salmex`] |
//! | VAI | `vai.rpc.v1` frames, Content-Length | [`vai`] |
//! | MCP | JSON-RPC, lines | [`mcp`] |
//!
//! The model they share (tool definitions, handshakes, typed tool errors)
//! is `plugd_host::model`; the trait and what the host hands a dialect are
//! `plugd_host::dialect`. Adding a contract is one module here and one arm
//! in [`table`].
//!
//! Server features beyond tools (resources, resource templates, prompts,
//! completion) exist only in MCP ([`mcp_features`]); [`features`] is their
//! one entry, and a dialect without them answers
//! [`FeatureError::NotSupported`] naming it.

pub mod mcp;
pub mod mcp_features;
pub mod mcp_tasks;
pub mod microapp;
pub mod native;
pub mod salmex;
#[cfg(test)]
use plugd_wire::test_json;
pub mod vai;

use plugd_host::dialect::{Dialect, Dialects};
use plugd_host::supervisor::Conn;
use plugd_manifest::PluginSpec;

pub use mcp_features::{FeatureError, Features};

/// The dialect of contract `d`: the only `match` on the manifest's dialect.
pub fn of(d: plugd_manifest::Dialect) -> &'static dyn Dialect {
    match d {
        plugd_manifest::Dialect::Microapp => &microapp::Microapp,
        plugd_manifest::Dialect::Salmex => &salmex::Salmex,
        plugd_manifest::Dialect::Vai => &vai::Vai,
        plugd_manifest::Dialect::Mcp => &mcp::Mcp,
        _ => &native::Native,
    }
}

/// Every contract's dialect, as the runtime hands them to the host
/// (`HostServices::dialects`).
pub fn table() -> Dialects {
    Dialects(of)
}

/// Refuses, before any start, a plugin whose dialect has no `feature`
/// (resources, prompts, completion): only MCP servers have them.
pub fn features_supported(spec: &PluginSpec, feature: &'static str) -> Result<(), FeatureError> {
    if of(spec.dialect).capabilities().server_features {
        Ok(())
    } else {
        Err(FeatureError::NotSupported {
            plugin: spec.id.clone(),
            dialect: spec.dialect.to_string(),
            feature,
        })
    }
}

/// The resources, prompts and completion of a running plugin: an MCP
/// server's [`Features`]; any other dialect is [`FeatureError::NotSupported`].
pub fn features<'a>(
    conn: &'a Conn,
    spec: &PluginSpec,
    feature: &'static str,
) -> Result<Features<'a>, FeatureError> {
    features_supported(spec, feature)?;
    Features::of(conn)
}
