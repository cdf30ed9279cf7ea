//! Manifest errors: structured, each naming the manifest path and the offending field.

use std::path::PathBuf;

/// Why a manifest was refused.
///
/// Every variant carries the manifest `path`, and every variant about a value
/// carries the `field` as a dotted key with array indexes, e.g.
/// `plugin.extends.tools[2]`. Messages are lower-case, quote the bad input
/// and say how to fix it.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The manifest could not be read.
    #[error("{}: cannot read manifest: {source}; check that the file exists and is readable", path.display())]
    Io {
        /// Manifest path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The manifest is larger than [`crate::MAX_MANIFEST_BYTES`].
    #[error("{}: manifest is {size} bytes, over the {limit}-byte limit; a manifest should be a few KiB, move data elsewhere", path.display())]
    TooLarge {
        /// Manifest path.
        path: PathBuf,
        /// Size found (for a file still growing: at least this much).
        size: u64,
        /// The limit.
        limit: u64,
    },

    /// The manifest is not UTF-8.
    #[error("{}: manifest is not valid UTF-8 (first bad byte at offset {offset}); save it as UTF-8", path.display())]
    NotUtf8 {
        /// Manifest path.
        path: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },

    /// The manifest is not valid TOML.
    #[error("{}:{line}:{column}: invalid TOML: {message}; fix the syntax at that position", path.display())]
    Syntax {
        /// Manifest path.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// The parser's description.
        message: String,
    },

    /// A required key is missing.
    #[error("{}: {field}: required key is missing; add it", path.display())]
    MissingField {
        /// Manifest path.
        path: PathBuf,
        /// Dotted key that is missing, e.g. `plugin.entrypoint.command`.
        field: String,
    },

    /// A key is not part of the schema in a section that does not tolerate
    /// unknown keys.
    #[error("{}: {field}: unknown key; remove it or fix its spelling (expected one of: {})", path.display(), expected.join(", "))]
    UnknownKey {
        /// Manifest path.
        path: PathBuf,
        /// Dotted key of the unknown entry.
        field: String,
        /// Keys accepted in that section.
        expected: Vec<String>,
    },

    /// A value is invalid (wrong type, bad format, out of range, duplicate…).
    #[error("{}: {field}: {message}", path.display())]
    Invalid {
        /// Manifest path.
        path: PathBuf,
        /// Dotted key of the bad value.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },

    /// An entrypoint env key uses a prefix reserved for the host.
    #[error("{}: {field}: key {key:?} is reserved (NEXO_ and PLUGD_ prefixes belong to the host); rename it", path.display())]
    ReservedEnvKey {
        /// Manifest path.
        path: PathBuf,
        /// Always `plugin.entrypoint.env`.
        field: String,
        /// The offending key.
        key: String,
    },

    /// A relative entrypoint command resolves outside the plugin directory.
    #[error("{}: {field}: {command:?} escapes the plugin directory (resolves to {:?}); use a path inside the plugin", path.display(), resolved.display().to_string())]
    CommandEscapesPluginDir {
        /// Manifest path.
        path: PathBuf,
        /// Always `plugin.entrypoint.command`.
        field: String,
        /// The command as written.
        command: String,
        /// Where it resolved to.
        resolved: PathBuf,
    },

    /// A declared tool is outside the plugin's namespace.
    #[error("{}: {field}: tool {tool:?} is outside the namespace of plugin {plugin_id:?}; name it \"{plugin_id}_<name>\" or \"ext_{plugin_id}_<name>\"", path.display())]
    ToolOutsideNamespace {
        /// Manifest path.
        path: PathBuf,
        /// Dotted key, e.g. `plugin.extends.tools[1]`.
        field: String,
        /// The tool name.
        tool: String,
        /// The plugin id.
        plugin_id: String,
    },

    /// A sandbox allowlist entry equals, contains or lies inside a path in
    /// [`crate::SANDBOX_DENYLIST`].
    #[error("{}: {field}: {entry:?} (resolves to {:?}) touches the denylisted path {denied:?}; bind a narrower path that neither contains nor lies inside it", path.display(), resolved.display().to_string())]
    SandboxAllowlistTouchesDenylist {
        /// Manifest path.
        path: PathBuf,
        /// Dotted key, e.g. `plugin.sandbox.fs_read_paths[0]`.
        field: String,
        /// The entry as written.
        entry: String,
        /// Its canonical form.
        resolved: PathBuf,
        /// The denylisted path it touches.
        denied: String,
    },

    /// A sandbox path is not absolute.
    #[error("{}: {field}: {entry:?} is not an absolute path; sandbox binds need absolute paths (or \"${{state_dir}}/...\" in fs_write_paths)", path.display())]
    SandboxRelativePath {
        /// Manifest path.
        path: PathBuf,
        /// Dotted key, e.g. `plugin.sandbox.fs_read_paths[0]`.
        field: String,
        /// The entry as written.
        entry: String,
    },

    /// A sandbox path uses `${...}` other than a leading `${state_dir}`.
    #[error("{}: {field}: {entry:?}: {reason}; the only interpolation allowed is \"${{state_dir}}\" alone or as a prefix \"${{state_dir}}/sub/dir\" in fs_write_paths", path.display())]
    SandboxInvalidStateDirInterpolation {
        /// Manifest path.
        path: PathBuf,
        /// Dotted key, e.g. `plugin.sandbox.fs_write_paths[1]`.
        field: String,
        /// The entry as written.
        entry: String,
        /// What exactly is wrong.
        reason: String,
    },

    /// `network = "host"` without the operator capability.
    #[error("{}: {field}: network \"host\" needs the operator capability NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1; use network = \"deny\" or ask the operator to allow host networking", path.display())]
    SandboxHostNetworkWithoutCapability {
        /// Manifest path.
        path: PathBuf,
        /// Always `plugin.sandbox.network`.
        field: String,
    },
}

impl ManifestError {
    /// The manifest path the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            ManifestError::Io { path, .. }
            | ManifestError::TooLarge { path, .. }
            | ManifestError::NotUtf8 { path, .. }
            | ManifestError::Syntax { path, .. }
            | ManifestError::MissingField { path, .. }
            | ManifestError::UnknownKey { path, .. }
            | ManifestError::Invalid { path, .. }
            | ManifestError::ReservedEnvKey { path, .. }
            | ManifestError::CommandEscapesPluginDir { path, .. }
            | ManifestError::ToolOutsideNamespace { path, .. }
            | ManifestError::SandboxAllowlistTouchesDenylist { path, .. }
            | ManifestError::SandboxRelativePath { path, .. }
            | ManifestError::SandboxInvalidStateDirInterpolation { path, .. }
            | ManifestError::SandboxHostNetworkWithoutCapability { path, .. } => path,
        }
    }

    /// The dotted field the error is about, when it is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            ManifestError::Io { .. }
            | ManifestError::TooLarge { .. }
            | ManifestError::NotUtf8 { .. }
            | ManifestError::Syntax { .. } => None,
            ManifestError::MissingField { field, .. }
            | ManifestError::UnknownKey { field, .. }
            | ManifestError::Invalid { field, .. }
            | ManifestError::ReservedEnvKey { field, .. }
            | ManifestError::CommandEscapesPluginDir { field, .. }
            | ManifestError::ToolOutsideNamespace { field, .. }
            | ManifestError::SandboxAllowlistTouchesDenylist { field, .. }
            | ManifestError::SandboxRelativePath { field, .. }
            | ManifestError::SandboxInvalidStateDirInterpolation { field, .. }
            | ManifestError::SandboxHostNetworkWithoutCapability { field, .. } => Some(field),
        }
    }
}

/// One entry of a multi-plugin declaration file (`extensions.yaml`,
/// `.mcp.json`) that could not be loaded.
#[derive(Debug)]
pub struct EntryError {
    /// The entry's name (its key in the file).
    pub name: String,
    /// Why it was refused.
    pub error: ManifestError,
}

/// Quotes user input for an error message: Rust string escaping (so control
/// characters cannot forge output) and at most 200 characters.
pub(crate) fn quote(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{:?}…", &s[..i]),
        None => format!("{s:?}"),
    }
}
