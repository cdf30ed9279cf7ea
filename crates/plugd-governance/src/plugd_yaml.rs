//! The file `DIR/plugd.yaml` itself: its name, its size bound, how it is
//! parsed (YAML 1.2 booleans, positions in errors) and [`ConfigError`], so
//! each section's parser (signing, sandbox, marketplace here; the agent's,
//! the risk policy's and the others' in plugd-runtime) reads it alike.
//!
//! Every reader takes the file's text from [`read_text`]. In a process that
//! gates the file (`plugd serve`, see plugd-runtime's `config_gate`), that is
//! the text *in force* ([`set_in_force`]), not what is on disk: a change that
//! widens a plugin's reach is held until an operator approves it, so no
//! section parser can pick it up early.
//!
//! **Architecture invariant**: no code reads `plugd.yaml` from disk except
//! through [`read_text`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

/// The file name inside the workspace.
pub const CONFIG_FILE: &str = "plugd.yaml";

/// Largest `plugd.yaml` read (1 MiB).
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Why `plugd.yaml` was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read it: {reason}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The YAML does not parse or does not have the expected shape
    /// (unknown keys, wrong types).
    #[error("{}: {message} (line {line}, column {column}); see docs/plugd.schema.json for the format", path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// 1-based line (0 when unknown).
        line: u64,
        /// 1-based column (0 when unknown).
        column: u64,
        /// The parser's message.
        message: String,
    },
    /// A value is invalid.
    #[error("{}: {field}: {message} (line {line})", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The dotted field, e.g. `plugins.custom[1].module`.
        field: String,
        /// 1-based line.
        line: u64,
        /// What is wrong and what to do.
        message: String,
    },
}

/// `plugd.yaml`'s parse error `e` as a [`ConfigError`] with its position,
/// in the words the rest of the file's errors use.
pub fn yaml_error(path: &Path, e: &serde_saphyr::Error) -> ConfigError {
    let message = e.to_string();
    let mut message = message.lines().next().unwrap_or("").trim().to_owned();
    if let Some(at) = message.rfind(" at line ") {
        message.truncate(at);
    }
    let mut message = message.replace(", set DuplicateKeyPolicy in Options if acceptable", "");
    if message.starts_with("unknown field") {
        message.push_str("; remove it or fix its spelling");
    }
    let (line, column) = e
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((0, 0));
    ConfigError::Yaml {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

/// How `plugd.yaml` is read: YAML 1.2 booleans only (`off` is a string),
/// no source snippets in errors.
pub fn yaml_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    options.strict_booleans = true;
    options
}

/// The texts in force per workspace, for processes that gate `plugd.yaml`.
type InForce = RwLock<HashMap<PathBuf, Arc<Option<String>>>>;

fn in_force() -> &'static InForce {
    static IN_FORCE: OnceLock<InForce> = OnceLock::new();
    IN_FORCE.get_or_init(InForce::default)
}

fn key(workspace: &Path) -> PathBuf {
    std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf())
}

/// From now on, [`read_text`] of `workspace` in this process answers `text`
/// (`None`: no file) instead of reading the disk.
pub fn set_in_force(workspace: &Path, text: Option<String>) {
    in_force()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key(workspace), Arc::new(text));
}

/// Stops gating `workspace` in this process: [`read_text`] reads the disk again.
pub fn clear_in_force(workspace: &Path) {
    in_force()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key(workspace));
}

/// Whether this process gates `workspace`'s `plugd.yaml`.
pub fn is_gated(workspace: &Path) -> bool {
    let map = in_force().read().unwrap_or_else(|p| p.into_inner());
    !map.is_empty() && map.contains_key(&key(workspace))
}

/// The text of `workspace/plugd.yaml` as it is on disk: `None` when there
/// is no file; an error when it cannot be read, is over
/// [`MAX_CONFIG_BYTES`] or is not UTF-8.
pub fn read_disk(workspace: &Path) -> Result<Option<String>, ConfigError> {
    use std::io::Read as _;
    let path = workspace.join(CONFIG_FILE);
    let read = |reason: String| ConfigError::Read {
        path: path.clone(),
        reason,
    };
    let file = match std::fs::File::open(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read(e.to_string())),
        Ok(f) => f,
    };
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| read(e.to_string()))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(read(format!(
            "it is over the {MAX_CONFIG_BYTES}-byte limit; shorten it"
        )));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| read(format!("{e}; it must be UTF-8 text")))
}

/// The text of `workspace/plugd.yaml` every section parser reads: the text
/// in force when this process gates the workspace ([`set_in_force`]), else
/// [`read_disk`].
pub fn read_text(workspace: &Path) -> Result<Option<String>, ConfigError> {
    {
        let map = in_force().read().unwrap_or_else(|p| p.into_inner());
        if !map.is_empty()
            && let Some(text) = map.get(&key(workspace))
        {
            return Ok(text.as_ref().clone());
        }
    }
    read_disk(workspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gated_workspace_reads_the_text_in_force_not_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        assert_eq!(read_text(ws).unwrap(), None);
        std::fs::write(ws.join(CONFIG_FILE), "risk: {}\n").unwrap();
        assert_eq!(read_text(ws).unwrap().as_deref(), Some("risk: {}\n"));
        set_in_force(ws, Some("eager: []\n".into()));
        assert!(is_gated(ws));
        assert_eq!(read_text(ws).unwrap().as_deref(), Some("eager: []\n"));
        assert_eq!(read_disk(ws).unwrap().as_deref(), Some("risk: {}\n"));
        clear_in_force(ws);
        assert!(!is_gated(ws));
        assert_eq!(read_text(ws).unwrap().as_deref(), Some("risk: {}\n"));
        std::fs::write(
            ws.join(CONFIG_FILE),
            vec![b'#'; MAX_CONFIG_BYTES as usize + 1],
        )
        .unwrap();
        let err = read_disk(ws).unwrap_err().to_string();
        assert!(err.contains("byte limit"), "{err}");
    }
}
