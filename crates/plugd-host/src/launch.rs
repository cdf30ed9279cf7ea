//! What the host decides for one start of a plugin, beyond its manifest.
//!
//! The runtime computes a [`Launch`] in [`crate::Observer::may_start`] right
//! before every spawn (approval, signatures, configuration, containment are
//! all checked there), and the supervisor applies it: the spawn gets the
//! containment, the dialect's handshake gets the configuration, and the
//! stderr tail is scrubbed of the secret values. A running connection keeps
//! the launch it was started with ([`crate::Conn::launch`]).

use std::path::Path;
use std::sync::Arc;

use plugd_manifest::PluginSpec;
use serde_json::Value;

/// The host's decisions for one start of a plugin.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// The plugin's effective configuration, secrets decrypted, as the
    /// dialect's handshake sends it (Salmex `initialize.config`). `Null`:
    /// none stored (the dialect falls back to the manifest's defaults).
    pub config: Value,
    /// Values that must never leave the host in clear: scrubbed from stderr
    /// tails, crash reports and logs (the decrypted secrets).
    pub redact: Vec<String>,
    /// Sandbox and resource limits for this start (default: none).
    pub containment: crate::sandbox::Containment,
    /// What this start runs: the plugin's spec rebased onto its approval's
    /// read-only pin (`.plugd/pins/<digest>/`), so the working directory,
    /// the program, the arguments and the sandbox binds all point into the
    /// pin and never at the mutable source directory. `None` runs the spec
    /// the supervisor holds as it is (dialects without a plugin directory,
    /// such as MCP servers, and tests).
    pub run_spec: Option<Arc<PluginSpec>>,
    /// A remote MCP server's headers (placeholders filled from the secret
    /// store) and OAuth credentials; `None` for everything that runs here.
    pub remote: Option<Arc<RemoteLaunch>>,
}

/// What one start of a remote (Streamable HTTP) MCP server needs beyond its
/// spec: values from the secret store.
#[derive(Clone, Default)]
pub struct RemoteLaunch {
    /// Header name → value, `${NAME}` placeholders filled in.
    pub headers: Vec<(String, String)>,
    /// Bearer tokens from `plugd mcp login`, if the server was authorized.
    pub credentials: Option<Arc<dyn plugd_mcp_http::Credentials>>,
}

impl std::fmt::Debug for RemoteLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("RemoteLaunch")
            .field("headers", &names)
            .field("oauth", &self.credentials.is_some())
            .finish()
    }
}

impl Launch {
    /// The one directory this start runs from (its working directory and
    /// the plugin directory a sandbox shows): the pin when there is one.
    /// `None`: the supervisor's own spec's directory.
    pub fn run_dir(&self) -> Option<&Path> {
        self.run_spec.as_deref().map(|s| s.dir.as_path())
    }

    /// `text` with every [`Launch::redact`] value replaced by `••••`.
    pub fn scrub(&self, text: &str) -> String {
        scrub(text, &self.redact)
    }
}

/// `text` with every non-empty value of `secrets` replaced by `••••`
/// (longest first, so a secret that contains another is hidden whole).
pub fn scrub(text: &str, secrets: &[String]) -> String {
    scrub_as(text, secrets, "••••")
}

/// [`scrub`] with `mask` in place of `••••` (invocation records write
/// `***`).
pub fn scrub_as(text: &str, secrets: &[String], mask: &str) -> String {
    let mut sorted: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_owned();
    for s in sorted {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), mask);
        }
    }
    // Delegation tokens (seed 003 `context.gateway`) are hidden whatever the
    // list: `vai_dlg_` and the hex digits after it.
    const DLG: &str = "vai_dlg_";
    if out.contains(DLG) {
        let mut hidden = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(DLG) {
            hidden.push_str(&rest[..i]);
            hidden.push_str(DLG);
            let after = &rest[i + DLG.len()..];
            let n = after.bytes().take_while(u8::is_ascii_hexdigit).count();
            if n > 0 {
                hidden.push_str(mask);
            }
            rest = &after[n..];
        }
        hidden.push_str(rest);
        out = hidden;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_hides_every_secret_longest_first() {
        let secrets = vec!["abc".to_owned(), "abcdef".to_owned(), String::new()];
        assert_eq!(scrub("x abcdef y abc z", &secrets), "x •••• y •••• z");
        assert_eq!(scrub("nothing here", &secrets), "nothing here");
        assert_eq!(
            scrub("token vai_dlg_0a1B2c and vai_dlg_ff.", &[]),
            "token vai_dlg_•••• and vai_dlg_••••."
        );
        assert_eq!(scrub("vai_dlg_ alone", &[]), "vai_dlg_ alone");
    }
}
