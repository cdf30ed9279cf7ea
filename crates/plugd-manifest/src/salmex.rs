//! The salmex dialect's manifest form: Salmex I/O `plugin.json` (seed 004).

use std::path::Path;

use serde::Serialize;

use crate::{LoadOptions, ManifestError, PluginSpec};

/// The salmex-specific rest of a plugin declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct SalmexSpec {
    /// The declaration as read (placeholder until the loader lands).
    pub raw: serde_json::Value,
}

/// The file this dialect is declared in.
pub const SALMEX_MANIFEST_FILE: &str = "plugin.json";

/// Reads and validates `plugin.json` at `manifest_path` into a [`PluginSpec`].
pub fn load_salmex(manifest_path: &Path, opts: &LoadOptions) -> Result<PluginSpec, ManifestError> {
    let _ = opts;
    Err(ManifestError::Invalid {
        path: manifest_path.to_path_buf(),
        field: String::new(),
        message: "this dialect is not supported by this build yet".into(),
    })
}
