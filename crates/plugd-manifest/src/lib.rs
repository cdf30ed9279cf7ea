//! Plugin manifest model: parses and validates manifests into one normalized [`PluginSpec`].
//!
//! plugd speaks five plugin "dialects", one manifest form each: the native
//! nexo `nexo-plugin.toml` (`native`), Salmex `plugin.json` (`salmex`), VAI
//! `vai-plugin.toml` (`vai`), microapp entries of `extensions.yaml`
//! (`microapp`) and MCP server entries of `.mcp.json` (`mcp`). Each parser
//! produces the same dialect-agnostic [`PluginSpec`], so the host never
//! looks at raw manifest text.
//!
//! **API boundary:** this crate does no process spawning and no I/O beyond
//! reading the manifest and resolving paths (canonicalization, symlinks) for
//! validation. Everything it returns has already been validated: an id is a
//! slug, a version is semver, a relative entrypoint stays inside the plugin
//! directory, sandbox allowlists do not touch [`SANDBOX_DENYLIST`].
//!
//! ```
//! use std::path::Path;
//! use plugd_manifest::{parse_native, LoadOptions};
//!
//! let text = r#"
//! [plugin]
//! id = "hello"
//! version = "0.1.0"
//!
//! [plugin.entrypoint]
//! command = "/usr/bin/hello-plugin"
//!
//! [plugin.extends]
//! tools = ["hello_greet"]
//! "#;
//! let spec = parse_native(text, Path::new("/p/nexo-plugin.toml"), Path::new("/p"), &LoadOptions::default())
//!     .unwrap();
//! assert_eq!(spec.id, "hello");
//! assert_eq!(spec.declared_tools, ["hello_greet"]);
//! ```

#![warn(missing_docs)]

pub mod config_schema;
mod error;
mod guarded;
mod ids;
pub mod mcp;
pub mod microapp;
mod native;
mod read;
pub mod salmex;
mod sandbox;
mod schema;
mod spec;
mod toml_fields;
pub mod vai;

#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod tests;

pub use error::{EntryError, ManifestError};
pub use ids::{is_valid_plugin_id, tool_in_namespace};
pub use native::{
    NATIVE_MANIFEST_FILE, NEXO_CONTRACT_VERSION, NEXO_HOST_VERSION, PROVIDED_CAPABILITIES,
    load_native, parse_native,
};
pub use read::MAX_MANIFEST_BYTES;
pub use sandbox::{SANDBOX_DENYLIST, SandboxPathError, check_sandbox_path, resolve_path};
pub use schema::native_manifest_schema;
pub use spec::{
    ChannelRegistration, CommandSpec, DeclaredTool, Dialect, EXTENDS_SECTIONS, Extends, LimitsSpec,
    NativeSpec, PluginSpec, Requires, STATE_DIR_TOKEN, SandboxNetwork, SandboxSpec, StartMode,
    SupervisorSpec,
};

/// Host-side options that change how a manifest validates.
///
/// These are operator capabilities, not plugin choices: a manifest can ask for
/// something (e.g. `network = "host"`), and the operator decides whether that
/// request is acceptable on this host.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Allow `[plugin.sandbox] network = "host"`. Off by default; set by the
    /// operator with `NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1` (seed §2.2).
    pub sandbox_host_net_allow: bool,
}

impl LoadOptions {
    /// Environment variable that grants [`LoadOptions::sandbox_host_net_allow`].
    pub const HOST_NET_ALLOW_ENV: &'static str = "NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW";

    /// Reads the options from the process environment:
    /// `NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1` sets `sandbox_host_net_allow`
    /// (any other value, or unset, leaves it off).
    pub fn from_env() -> Self {
        Self {
            sandbox_host_net_allow: std::env::var_os(Self::HOST_NET_ALLOW_ENV)
                .is_some_and(|v| v == "1"),
        }
    }
}
