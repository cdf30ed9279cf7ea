//! The mcp dialect's manifest form: MCP server entries of `.mcp.json`.

use std::path::Path;

use serde::Serialize;

use crate::{LoadOptions, ManifestError, PluginSpec};

/// The mcp-specific rest of a plugin declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct McpSpec {
    /// The declaration as read (placeholder until the loader lands).
    pub raw: serde_json::Value,
}

/// The file this dialect is declared in.
pub const MCP_FILE: &str = ".mcp.json";

/// Reads `.mcp.json` in `workspace`, one result per entry (a bad entry does not
/// hide the good ones). `Ok(vec![])` when the file does not exist; `Err` when
/// the file as a whole cannot be read or parsed.
pub fn load_mcp(
    workspace: &Path,
    opts: &LoadOptions,
) -> Result<Vec<Result<PluginSpec, crate::EntryError>>, ManifestError> {
    let _ = opts;
    let path = workspace.join(MCP_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    Err(ManifestError::Invalid {
        path,
        field: String::new(),
        message: "this dialect is not supported by this build yet".into(),
    })
}
