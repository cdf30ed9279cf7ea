//! Identifier rules shared by every dialect: the plugin-id slug and the per-plugin tool namespace.

/// Maximum length of a slug (plugin id, extends id, channel kind, tool name).
pub(crate) const SLUG_MAX_LEN: usize = 32;

/// Returns true when `s` matches `^[a-z][a-z0-9_]{0,31}$`, the slug used for
/// plugin ids, `[plugin.extends]` ids, channel kinds and tool names.
///
/// ```
/// use plugd_manifest::is_valid_plugin_id;
/// assert!(is_valid_plugin_id("slack"));
/// assert!(is_valid_plugin_id("a1_b"));
/// assert!(!is_valid_plugin_id("1abc"));
/// assert!(!is_valid_plugin_id("Slack"));
/// assert!(!is_valid_plugin_id(""));
/// ```
pub fn is_valid_plugin_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= SLUG_MAX_LEN
        && b[0].is_ascii_lowercase()
        && b[1..]
            .iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

/// Returns true when `tool` lies in the namespace of `plugin_id`: it is
/// `<plugin_id>_<suffix>` or `ext_<plugin_id>_<suffix>` with a non-empty
/// suffix (seed §4.1.1, namespace policy from phase 81.3).
///
/// Only the namespace is checked here; the manifest validator separately
/// requires every tool name to be a slug ([`is_valid_plugin_id`]).
///
/// ```
/// use plugd_manifest::tool_in_namespace;
/// assert!(tool_in_namespace("hello", "hello_x"));
/// assert!(tool_in_namespace("hello", "ext_hello_x"));
/// assert!(!tool_in_namespace("hello", "other_x"));
/// assert!(!tool_in_namespace("hello", "hello_"));
/// assert!(!tool_in_namespace("hello", "hello"));
/// ```
pub fn tool_in_namespace(plugin_id: &str, tool: &str) -> bool {
    if plugin_id.is_empty() {
        return false;
    }
    let has_suffix = |rest: Option<&str>| {
        rest.and_then(|r| r.strip_prefix(plugin_id))
            .and_then(|r| r.strip_prefix('_'))
            .is_some_and(|suffix| !suffix.is_empty())
    };
    has_suffix(Some(tool)) || has_suffix(tool.strip_prefix("ext_"))
}
