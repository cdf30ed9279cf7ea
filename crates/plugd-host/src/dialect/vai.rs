//! The vai dialect (placeholder: not supported yet).

use std::sync::Arc;
use std::time::Duration;

use plugd_manifest::PluginSpec;
use serde_json::Value;

use super::{CallContext, CatalogChanged, HostServices, Setup};
use crate::native::{Handshake, HandshakeError, ToolDef, ToolError};
use crate::peer::{NoHandler, Peer};
use crate::protocol::JsonRpc;
use crate::supervisor::Conn;

/// Envelope and handler.
pub fn setup(
    _spec: &Arc<PluginSpec>,
    _services: &HostServices,
    _catalog_changed: CatalogChanged,
) -> Setup {
    Setup {
        protocol: Arc::new(JsonRpc::LINES),
        handler: Arc::new(NoHandler),
        cancel: None,
        state: None,
    }
}

/// Handshake.
pub async fn handshake(
    _peer: &Peer,
    spec: &PluginSpec,
    _services: &HostServices,
    _timeout: Duration,
) -> Result<Handshake, HandshakeError> {
    Err(super::unsupported(spec))
}

/// Re-reads the catalog.
pub async fn refresh_tools(
    conn: &Conn,
    _spec: &PluginSpec,
    _timeout: Duration,
) -> Result<Vec<ToolDef>, HandshakeError> {
    Ok(conn.handshake.tools.clone())
}

/// Calls a tool.
pub async fn call_tool(
    _conn: &Conn,
    spec: &PluginSpec,
    _tool: &ToolDef,
    _args: Value,
    _ctx: &CallContext,
    _timeout: Duration,
) -> Result<Value, ToolError> {
    Err(ToolError::NotImplemented {
        plugin: spec.id.as_str().into(),
    })
}

/// Shutdown.
pub async fn shutdown(_conn: &Conn, _spec: &PluginSpec, _reply_timeout: Duration) {}
