//! Dexto plugin modules (seed 002), run unmodified in a small Node host
//! process that ships with plugd (placeholder until the host lands).

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::{HookHandler, PipelineError};

/// Loads the Dexto module at `module` (an absolute path) under `name`,
/// validates its shape as Dexto's loader does, and calls its `initialize`
/// with `config`; fails fast with a message naming the handler.
pub async fn load(
    name: &str,
    module: &Path,
    config: &Value,
    workspace: &Path,
) -> Result<Arc<dyn HookHandler>, PipelineError> {
    let _ = (config, workspace);
    Err(PipelineError::Init {
        name: name.to_owned(),
        reason: format!(
            "cannot load {}: Dexto modules are not supported by this build yet",
            module.display()
        ),
    })
}
