//! The MCP model plugd shares between its MCP client dialect (hosting MCP
//! servers, `plugd-host`) and its MCP gateway (serving plugd's catalog,
//! `plugd-gateway`): protocol revisions and their negotiation, the `_meta`
//! keys of the stateless revision, and the mapping between plugd's tool
//! names and names every MCP client accepts.
//!
//! Plain data and pure functions: no processes, no I/O.

pub mod names;
pub mod version;

pub use names::{NameTable, mcp_name, registry_name_hint};
pub use version::{
    LATEST_STATEFUL, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_PROTOCOL_VERSION, STATELESS,
    SUPPORTED, negotiate,
};
