//! The file `DIR/plugd.yaml` itself: its name, its size bound, how it is
//! parsed (YAML 1.2 booleans, positions in errors) and [`ConfigError`], so
//! each section's parser (signing, sandbox, marketplace here; the agent's,
//! the risk policy's and the others' in plugd-runtime) reads it alike.

use std::path::{Path, PathBuf};

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
