//! The vai dialect's manifest form: VAI gateway `vai-plugin.toml` (seed 003).

use std::path::Path;

use serde::Serialize;

use crate::{LoadOptions, ManifestError, PluginSpec};

/// The vai-specific rest of a plugin declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct VaiSpec {
    /// The declaration as read (placeholder until the loader lands).
    pub raw: serde_json::Value,
}

/// The file this dialect is declared in.
pub const VAI_MANIFEST_FILE: &str = "vai-plugin.toml";

/// Reads and validates `vai-plugin.toml` at `manifest_path` into a [`PluginSpec`].
pub fn load_vai(manifest_path: &Path, opts: &LoadOptions) -> Result<PluginSpec, ManifestError> {
    let _ = opts;
    Err(ManifestError::Invalid {
        path: manifest_path.to_path_buf(),
        field: String::new(),
        message: "this dialect is not supported by this build yet".into(),
    })
}
