//! The microapp dialect's manifest form: nexo microapp entries of `extensions.yaml` (seed 001).

use std::path::Path;

use serde::Serialize;

use crate::{LoadOptions, ManifestError, PluginSpec};

/// The microapp-specific rest of a plugin declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct MicroappSpec {
    /// The declaration as read (placeholder until the loader lands).
    pub raw: serde_json::Value,
}

/// The file this dialect is declared in.
pub const EXTENSIONS_FILE: &str = "extensions.yaml";

/// Reads `extensions.yaml` in `workspace`, one result per entry (a bad entry does not
/// hide the good ones). `Ok(vec![])` when the file does not exist; `Err` when
/// the file as a whole cannot be read or parsed.
pub fn load_extensions(
    workspace: &Path,
    opts: &LoadOptions,
) -> Result<Vec<Result<PluginSpec, crate::EntryError>>, ManifestError> {
    let _ = opts;
    let path = workspace.join(EXTENSIONS_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    Err(ManifestError::Invalid {
        path,
        field: String::new(),
        message: "this dialect is not supported by this build yet".into(),
    })
}
