//! `plugd.yaml`'s `mcp:` section: what plugd offers the MCP servers it hosts
//! (the `roots` each server may see; none unless configured here) and the
//! profiles (views of the catalog) its MCP gateway serves.
//!
//! ```yaml
//! mcp:
//!   servers:
//!     filesystem:
//!       roots: [/srv/shared, data]   # relative paths are under the workspace
//!   profiles:
//!     readonly:                      # plugd mcp --profile readonly, or /mcp/readonly
//!       tools: ["*_read*", "everything/*"]   # globs over plugd tool names
//!       plugins: [everything, hello_python]  # and/or whole plugins
//!     everything:
//!       plugins: [everything]
//!       bare_names: true             # echo, not everything__echo
//!     big:
//!       tools: ["*"]
//!       discovery: search            # tools/list offers search_tools only;
//!                                    # found tools are loaded on demand
//!   http:                            # the gateway on plugd serve's /mcp
//!     max_sessions_per_identity: 64  # open sessions one token / user may hold
//!     stream_close_after_ms: 60000   # an SSE connection is closed after this
//!     stream_retry_ms: 1000          #   long; the client resumes after this
//!     max_batch_items: 32            # JSON-RPC batches (2025-03-26 only):
//!     max_batch_bytes: 262144        #   most messages and body bytes of one
//!     legacy_sse: false              # GET /sse + POST /messages (2024-11-05)
//!     cors_allowed_origins: []       # browser origins let in, with CORS headers
//! ```
//!
//! `resources: false` under a server refuses every resource request to it
//! (list, templates, read, subscribe; see [`crate::mcp_features`]);
//! resources are allowed otherwise, as in MCP.
//!
//! `sampling: true` under a server lets its `sampling/createMessage`
//! requests reach the LLM provider of plugd.yaml's `llm:` section (see
//! [`crate::mcp_requests`]); off by default, because each one spends the
//! operator's tokens on text the server chose. `sampling_max_tokens` bounds
//! the `maxTokens` such a request may ask for (default
//! [`DEFAULT_SAMPLING_MAX_TOKENS`], at most [`MAX_SAMPLING_MAX_TOKENS`]); a
//! bigger request is cut down to it. During a call made through plugd's MCP
//! gateway, a client that supports sampling is asked instead, whatever this
//! says.
//!
//! ```yaml
//! mcp:
//!   servers:
//!     summarizer:
//!       sampling: true
//!       sampling_max_tokens: 512
//! ```
//!
//! A server with no `roots` entry is not offered the `roots` capability at
//! all, and a `roots/list` it sends anyway is answered `-32601`: plugd never
//! hands a server the workspace (which holds `.mcp.json`, `plugd.yaml` and
//! `.plugd/`) on its own initiative.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use plugd_governance::plugd_yaml::ConfigError;

/// Most roots configured for one server.
pub const MAX_ROOTS: usize = 64;

/// What one hosted MCP server is offered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct McpServerConfig {
    /// Absolute directories answered to `roots/list`, in order.
    pub roots: Vec<PathBuf>,
    /// `stateless`: `Some(true)` tries the stateless revision 2026-07-28
    /// first (`server/discover`, as the official SDKs' clients do),
    /// `Some(false)` never speaks it; unset: the `initialize` handshake
    /// first, `server/discover` when the server refuses it.
    pub stateless: Option<bool>,
    /// `resources`: `Some(false)` refuses reading the server's resources;
    /// unset or `true` allows it.
    pub resources: Option<bool>,
    /// `sampling`: the server's `sampling/createMessage` may use the
    /// configured LLM provider (default `false`).
    pub sampling: bool,
    /// `sampling_max_tokens`: the most tokens one sampling request gets.
    pub sampling_max_tokens: u32,
    /// `accept_new_tools`: a tool the server adds after its approval is
    /// pinned and offered as first seen, instead of waiting for
    /// re-approval (default `false`; see [`crate::tool_pins`]). A changed
    /// definition is withheld either way.
    pub accept_new_tools: bool,
    /// `upstream_auth`: each caller's call reaches the (remote) server with
    /// that caller's own token (see [`UpstreamAuth`]); `None`: the
    /// server's own credentials, as before.
    pub upstream_auth: Option<UpstreamAuth>,
}

/// `mcp.servers.NAME.upstream_auth`: how the server gets each user's own
/// credential (off by default).
///
/// ```yaml
/// mcp:
///   servers:
///     notes:
///       upstream_auth:
///         token_exchange:
///           issuer: https://idp.example        # one of auth.issuers
///           audience: https://notes.example/mcp
///           scope: "notes:read"                # optional
///           client_id: plugd-exchange
///           client_secret: ${NOTES_EXCHANGE}   # plugd secrets set NOTES_EXCHANGE
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamAuth {
    /// `token_exchange`: RFC 8693 at the caller's issuer.
    pub token_exchange: Option<TokenExchange>,
    /// `user_grants`: a user's own OAuth grant at the server, stored by
    /// `plugd mcp login NAME --user SUBJECT`, is used for that user's
    /// calls (before any exchange).
    pub user_grants: bool,
}

/// `upstream_auth.token_exchange`: the caller's access token (validated by
/// plugd, from `auth.issuers`) is exchanged at `issuer`'s token endpoint
/// for a token of `audience`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenExchange {
    /// The issuer (exactly one of `auth.issuers`).
    pub issuer: String,
    /// The upstream's resource identifier (sent as RFC 8707 `resource` and
    /// RFC 8693 `audience`).
    pub audience: String,
    /// `scope` of the exchanged token, when set.
    pub scope: Option<String>,
    /// plugd's client id at the issuer.
    pub client_id: String,
    /// The name of the operator's secret holding the client secret
    /// (`client_secret: ${NAME}`); `None`: a public client.
    pub client_secret: Option<String>,
    /// The line of `token_exchange` in plugd.yaml, for messages.
    #[serde(skip)]
    pub line: u64,
}

impl Default for McpServerConfig {
    fn default() -> Self {
        McpServerConfig {
            roots: Vec::new(),
            resources: None,
            stateless: None,
            sampling: false,
            sampling_max_tokens: DEFAULT_SAMPLING_MAX_TOKENS,
            accept_new_tools: false,
            upstream_auth: None,
        }
    }
}

/// `sampling_max_tokens` when unset.
pub const DEFAULT_SAMPLING_MAX_TOKENS: u32 = 4096;

/// The largest `sampling_max_tokens`.
pub const MAX_SAMPLING_MAX_TOKENS: u32 = 131_072;

/// Most profiles, and most patterns in one profile.
pub const MAX_PROFILES: usize = 256;

/// One view of the catalog the MCP gateway serves (`mcp.profiles.NAME`): a
/// tool is in it when it matches one of `tools` or belongs to one of
/// `plugins`; a profile naming neither holds nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct McpProfile {
    /// Globs over plugd tool names (`*`, `?`, `[...]`; `/` is an ordinary
    /// character).
    pub tools: Vec<String>,
    /// Plugin ids whose every tool is in the view.
    pub plugins: Vec<String>,
    /// Serve each tool under the name its plugin gave it (an MCP server's
    /// tool name, a Salmex tool, a VAI export id) instead of plugd's
    /// namespaced one, for a view that fronts one server; a name two tools
    /// of the view share is withheld.
    pub bare_names: bool,
    /// How a client finds the view's tools: `list` (every tool in
    /// `tools/list`) or `search` (`tools/list` offers `search_tools`, and
    /// what a search finds joins the session's list).
    pub discovery: Discovery,
}

/// `mcp.profiles.NAME.discovery`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Discovery {
    /// `tools/list` holds every tool of the view (the default).
    #[default]
    List,
    /// `tools/list` holds `search_tools` and the tools a search of this
    /// session found; calls reach every tool of the view either way.
    Search,
}

impl McpProfile {
    /// The matcher of this profile (its globs were checked when parsed).
    pub fn matcher(&self) -> ProfileMatcher {
        let mut b = globset::GlobSetBuilder::new();
        for g in &self.tools {
            if let Ok(g) = globset::GlobBuilder::new(g)
                .literal_separator(false)
                .build()
            {
                b.add(g);
            }
        }
        ProfileMatcher {
            globs: b.build().unwrap_or_else(|_| globset::GlobSet::empty()),
            plugins: self.plugins.iter().cloned().collect(),
            bare_names: self.bare_names,
            discovery: self.discovery,
        }
    }
}

/// Whether a tool is in a profile, compiled once per profile.
#[derive(Debug, Clone)]
pub struct ProfileMatcher {
    globs: globset::GlobSet,
    plugins: std::collections::BTreeSet<String>,
    /// [`McpProfile::bare_names`].
    pub bare_names: bool,
    /// [`McpProfile::discovery`].
    pub discovery: Discovery,
}

impl ProfileMatcher {
    /// Whether tool `name` of plugin `plugin` is in the view.
    pub fn matches(&self, plugin: &str, name: &str) -> bool {
        self.plugins.contains(plugin) || self.globs.is_match(name)
    }
}

/// `mcp:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct McpConfig {
    /// Server name (its `.mcp.json` key) → what it is offered.
    pub servers: BTreeMap<String, McpServerConfig>,
    /// Profile name → the view of the catalog it serves.
    pub profiles: BTreeMap<String, McpProfile>,
    /// `mcp.http`: the gateway's Streamable HTTP transport on `plugd serve`.
    pub http: McpHttpConfig,
}

/// Default of [`McpHttpConfig::max_sessions_per_identity`].
pub const DEFAULT_SESSIONS_PER_IDENTITY: usize = 64;
/// Default of [`McpHttpConfig::stream_close_after_ms`].
pub const DEFAULT_STREAM_CLOSE_AFTER_MS: u64 = 60_000;
/// Default of [`McpHttpConfig::stream_retry_ms`].
pub const DEFAULT_STREAM_RETRY_MS: u64 = 1_000;

/// Default of [`McpHttpConfig::max_batch_items`].
pub const DEFAULT_MAX_BATCH_ITEMS: usize = 32;
/// Default of [`McpHttpConfig::max_batch_bytes`] (256 KiB).
pub const DEFAULT_MAX_BATCH_BYTES: usize = 256 * 1024;
/// The most [`McpHttpConfig::max_batch_items`] may be.
pub const MAX_BATCH_ITEMS_CEILING: usize = 1024;

/// `mcp.http`: limits and timing of `/mcp` on `plugd serve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpHttpConfig {
    /// MCP sessions one identity (a token, a Unix user) may hold open at
    /// once; `initialize` beyond it is refused with `429` (default 64).
    #[serde(default = "default_sessions")]
    pub max_sessions_per_identity: usize,
    /// Milliseconds an SSE connection of a 2025-11-25 session stays open
    /// before plugd closes it (the stream goes on: the client resumes it
    /// with `GET` + `Last-Event-ID`, SEP-1699); 0: never (default 60000).
    #[serde(default = "default_close_after")]
    pub stream_close_after_ms: u64,
    /// The SSE `retry` plugd sends: how long a client waits before it
    /// resumes a closed stream, in milliseconds (default 1000).
    #[serde(default = "default_retry")]
    pub stream_retry_ms: u64,
    /// Most messages in one JSON-RPC batch (batches exist in the 2025-03-26
    /// revision only; later ones are refused with `400`); a bigger batch is
    /// refused whole with `400` (default 32, at most 1024).
    #[serde(default = "default_batch_items")]
    pub max_batch_items: usize,
    /// Most bytes of one batch's body; a bigger batch is refused whole with
    /// `400` before any of it runs (default 262144; the API's body limit
    /// still applies to every request).
    #[serde(default = "default_batch_bytes")]
    pub max_batch_bytes: usize,
    /// Serve the deprecated HTTP+SSE transport of MCP 2024-11-05 as well
    /// (`GET /sse` + `POST /messages?sessionId=…`, and `/sse/{profile}`),
    /// with `/mcp`'s authentication, profiles and limits (default off:
    /// those paths answer `404`).
    #[serde(default)]
    pub legacy_sse: bool,
    /// Browser origins (`https://host[:port]`) let in on the MCP paths
    /// (`/mcp`, `/sse`, `/messages`) despite being another site: their
    /// preflights are answered and their responses carry CORS headers.
    /// Any other origin is refused as before (default none: no CORS).
    #[serde(default)]
    pub cors_allowed_origins: Vec<String>,
}

/// Whether `origin` is a plain browser origin `http(s)://host[:port]` (no
/// path, query, userinfo, wildcard), as `cors_allowed_origins` needs.
pub fn is_plain_origin(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '@', '?', '#', ' ', '*'])
}

fn default_sessions() -> usize {
    DEFAULT_SESSIONS_PER_IDENTITY
}
fn default_close_after() -> u64 {
    DEFAULT_STREAM_CLOSE_AFTER_MS
}
fn default_retry() -> u64 {
    DEFAULT_STREAM_RETRY_MS
}
fn default_batch_items() -> usize {
    DEFAULT_MAX_BATCH_ITEMS
}
fn default_batch_bytes() -> usize {
    DEFAULT_MAX_BATCH_BYTES
}

impl Default for McpHttpConfig {
    fn default() -> Self {
        McpHttpConfig {
            max_sessions_per_identity: DEFAULT_SESSIONS_PER_IDENTITY,
            stream_close_after_ms: DEFAULT_STREAM_CLOSE_AFTER_MS,
            stream_retry_ms: DEFAULT_STREAM_RETRY_MS,
            max_batch_items: DEFAULT_MAX_BATCH_ITEMS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            legacy_sse: false,
            cors_allowed_origins: Vec::new(),
        }
    }
}

impl McpConfig {
    /// Server name → its `stateless` setting, for the servers that set it.
    pub fn stateless(&self) -> BTreeMap<String, bool> {
        self.servers
            .iter()
            .filter_map(|(name, s)| Some((name.clone(), s.stateless?)))
            .collect()
    }

    /// The servers with `accept_new_tools: true`.
    pub fn accept_new_tools(&self) -> std::collections::BTreeSet<String> {
        self.servers
            .iter()
            .filter(|(_, s)| s.accept_new_tools)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Server name → its `upstream_auth`, for the servers that set it.
    pub fn upstream_auth(&self) -> BTreeMap<String, UpstreamAuth> {
        self.servers
            .iter()
            .filter_map(|(name, s)| Some((name.clone(), s.upstream_auth.clone()?)))
            .collect()
    }

    /// Server name → roots, for the servers that have any.
    pub fn roots(&self) -> BTreeMap<String, Vec<PathBuf>> {
        self.servers
            .iter()
            .filter(|(_, s)| !s.roots.is_empty())
            .map(|(name, s)| (name.clone(), s.roots.clone()))
            .collect()
    }
}

/// `mcp:` as read from the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMcp {
    #[serde(default)]
    servers: Option<BTreeMap<String, Spanned<RawServer>>>,
    #[serde(default)]
    profiles: Option<BTreeMap<String, Spanned<RawProfile>>>,
    #[serde(default)]
    http: Option<Spanned<McpHttpConfig>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default)]
    tools: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    plugins: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    bare_names: Option<bool>,
    #[serde(default)]
    discovery: Option<Discovery>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default)]
    roots: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    resources: Option<bool>,
    #[serde(default)]
    sampling: Option<bool>,
    #[serde(default)]
    sampling_max_tokens: Option<Spanned<u64>>,
    #[serde(default)]
    stateless: Option<bool>,
    #[serde(default)]
    accept_new_tools: Option<bool>,
    #[serde(default)]
    upstream_auth: Option<Spanned<RawUpstreamAuth>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstreamAuth {
    #[serde(default)]
    token_exchange: Option<Spanned<RawTokenExchange>>,
    #[serde(default)]
    user_grants: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTokenExchange {
    issuer: String,
    audience: String,
    #[serde(default)]
    scope: Option<String>,
    client_id: String,
    #[serde(default)]
    client_secret: Option<String>,
}

/// Checks `upstream_auth` of server `name` on its own (the issuer is
/// checked against `auth.issuers` by [`check_upstream_issuers`]).
fn parse_upstream_auth(
    name: &str,
    raw: Spanned<RawUpstreamAuth>,
    invalid: &dyn Fn(String, u64, String) -> ConfigError,
) -> Result<UpstreamAuth, ConfigError> {
    let user_grants = raw.value.user_grants.unwrap_or(false);
    let Some(tx) = raw.value.token_exchange else {
        if !user_grants {
            return Err(invalid(
                format!("mcp.servers.{name}.upstream_auth"),
                raw.referenced.line(),
                "names no way to get a user's credential; give token_exchange, or user_grants: true (grants stored by `plugd mcp login SERVER --user SUBJECT`)".into(),
            ));
        }
        return Ok(UpstreamAuth {
            token_exchange: None,
            user_grants,
        });
    };
    let line = tx.referenced.line();
    let field = |f: &str| format!("mcp.servers.{name}.upstream_auth.token_exchange.{f}");
    let tx = tx.value;
    let issuer = url::Url::parse(tx.issuer.trim()).map_err(|e| {
        invalid(
            field("issuer"),
            line,
            format!(
                "{:?} is not a URL ({e}); give the issuer exactly as in auth.issuers",
                tx.issuer
            ),
        )
    })?;
    if !plugd_mcp_http::oauth::secure_enough(&issuer) {
        return Err(invalid(
            field("issuer"),
            line,
            format!(
                "{:?} is plain http to a host that is not loopback: the caller's token would cross the network in clear; use https",
                tx.issuer
            ),
        ));
    }
    let audience = tx.audience.trim();
    if audience.is_empty() || audience.contains(char::is_whitespace) {
        return Err(invalid(
            field("audience"),
            line,
            "give the upstream's resource identifier (its MCP URL, as its tokens' aud), without spaces".into(),
        ));
    }
    if let Ok(u) = url::Url::parse(audience)
        && u.scheme() == "http"
        && !plugd_mcp_http::oauth::secure_enough(&u)
    {
        return Err(invalid(
            field("audience"),
            line,
            format!(
                "{audience:?} is plain http to a host that is not loopback; the upstream's tokens would cross the network in clear; use https"
            ),
        ));
    }
    if tx.client_id.trim().is_empty() {
        return Err(invalid(
            field("client_id"),
            line,
            "give plugd's client id at the issuer".into(),
        ));
    }
    if tx.scope.as_deref().is_some_and(|s| s.trim().is_empty()) {
        return Err(invalid(
            field("scope"),
            line,
            "an empty scope; leave it out or name the scopes".into(),
        ));
    }
    let client_secret = match tx.client_secret {
        None => None,
        Some(text) => {
            let name = text
                .trim()
                .strip_prefix("${")
                .and_then(|r| r.strip_suffix('}'))
                .filter(|n| crate::host_secrets::valid_name(n))
                .ok_or_else(|| {
                    invalid(
                        field("client_secret"),
                        line,
                        "must name one of the operator's secrets as ${NAME} (store it with `plugd secrets set NAME`), never the secret itself".into(),
                    )
                })?;
            Some(name.to_owned())
        }
    };
    Ok(UpstreamAuth {
        token_exchange: Some(TokenExchange {
            issuer: tx.issuer.trim().to_owned(),
            audience: audience.to_owned(),
            scope: tx.scope,
            client_id: tx.client_id.trim().to_owned(),
            client_secret,
            line,
        }),
        user_grants,
    })
}

/// Every `upstream_auth` issuer must be one of `issuers` (plugd validated
/// the caller's token with it, so it is the one that can exchange it).
pub(crate) fn check_upstream_issuers(
    mcp: &McpConfig,
    issuers: &[crate::auth_config::IssuerConfig],
    path: &Path,
) -> Result<(), ConfigError> {
    let same = |a: &str, b: &str| a.trim_end_matches('/') == b.trim_end_matches('/');
    for (name, auth) in mcp.upstream_auth() {
        let Some(tx) = &auth.token_exchange else {
            continue;
        };
        if !issuers.iter().any(|i| same(&i.issuer, &tx.issuer)) {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field: format!("mcp.servers.{name}.upstream_auth.token_exchange.issuer"),
                line: tx.line,
                message: format!(
                    "{:?} is not one of auth.issuers: plugd exchanges only tokens it validated, so the issuer must be one it trusts; add it under auth.issuers or name one of those",
                    tx.issuer
                ),
            });
        }
    }
    Ok(())
}

/// Validates `mcp:` (`path` names the file in errors; relative roots are
/// resolved under `workspace`).
pub fn parse_config(
    raw: Spanned<RawMcp>,
    path: &Path,
    workspace: &Path,
) -> Result<McpConfig, ConfigError> {
    let invalid = |field: String, line: u64, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        line,
        message,
    };
    let mut config = McpConfig::default();
    for (name, server) in raw.value.servers.unwrap_or_default() {
        let line = server.referenced.line();
        if !plugd_manifest::mcp::is_valid_server_name(&name) {
            return Err(invalid(
                "mcp.servers".into(),
                line,
                format!(
                    "{:?} is not an MCP server name (1-64 of A-Z a-z 0-9 _ -, as the key in .mcp.json)",
                    name.chars().take(80).collect::<String>()
                ),
            ));
        }
        let roots = server.value.roots.unwrap_or_default();
        if roots.len() > MAX_ROOTS {
            return Err(invalid(
                format!("mcp.servers.{name}.roots"),
                line,
                format!("{} roots; at most {MAX_ROOTS}", roots.len()),
            ));
        }
        let mut out = McpServerConfig {
            stateless: server.value.stateless,
            resources: server.value.resources,
            sampling: server.value.sampling.unwrap_or(false),
            accept_new_tools: server.value.accept_new_tools.unwrap_or(false),
            ..McpServerConfig::default()
        };
        if let Some(ua) = server.value.upstream_auth {
            out.upstream_auth = Some(parse_upstream_auth(&name, ua, &invalid)?);
        }
        if let Some(max) = server.value.sampling_max_tokens {
            out.sampling_max_tokens = u32::try_from(max.value)
                .ok()
                .filter(|n| (1..=MAX_SAMPLING_MAX_TOKENS).contains(n))
                .ok_or_else(|| {
                    invalid(
                        format!("mcp.servers.{name}.sampling_max_tokens"),
                        max.referenced.line(),
                        format!(
                            "{} is out of range; give 1 to {MAX_SAMPLING_MAX_TOKENS}",
                            max.value
                        ),
                    )
                })?;
        }
        for (i, root) in roots.into_iter().enumerate() {
            let field = format!("mcp.servers.{name}.roots[{i}]");
            let text = root.value.trim();
            if text.is_empty() || text.contains('\0') {
                return Err(invalid(
                    field,
                    root.referenced.line(),
                    "an empty path; name a directory the server may work in".into(),
                ));
            }
            let p = Path::new(text);
            let p = if p.is_absolute() {
                p.to_path_buf()
            } else {
                workspace.join(p)
            };
            // Canonical when it exists, so the root names the real directory
            // (a symlink is resolved once, here, and shown as its target).
            out.roots.push(p.canonicalize().unwrap_or(p));
        }
        config.servers.insert(name, out);
    }
    let profiles = raw.value.profiles.unwrap_or_default();
    if profiles.len() > MAX_PROFILES {
        return Err(invalid(
            "mcp.profiles".into(),
            raw.referenced.line(),
            format!("{} profiles; at most {MAX_PROFILES}", profiles.len()),
        ));
    }
    for (name, profile) in profiles {
        let line = profile.referenced.line();
        if !plugd_manifest::mcp::is_valid_server_name(&name) {
            return Err(invalid(
                "mcp.profiles".into(),
                line,
                format!(
                    "{:?} is not a profile name (1-64 of A-Z a-z 0-9 _ -; it appears in the URL /mcp/NAME)",
                    name.chars().take(80).collect::<String>()
                ),
            ));
        }
        let mut out = McpProfile::default();
        let tools = profile.value.tools.unwrap_or_default();
        let plugins = profile.value.plugins.unwrap_or_default();
        if tools.len() > MAX_PROFILES || plugins.len() > MAX_PROFILES {
            return Err(invalid(
                format!("mcp.profiles.{name}"),
                line,
                format!("more than {MAX_PROFILES} tools or plugins; use globs"),
            ));
        }
        for (i, glob) in tools.into_iter().enumerate() {
            if let Err(e) = globset::GlobBuilder::new(&glob.value).build() {
                return Err(invalid(
                    format!("mcp.profiles.{name}.tools[{i}]"),
                    glob.referenced.line(),
                    format!("{:?} is not a glob: {e}", glob.value),
                ));
            }
            out.tools.push(glob.value);
        }
        out.plugins = plugins.into_iter().map(|p| p.value).collect();
        out.bare_names = profile.value.bare_names.unwrap_or(false);
        out.discovery = profile.value.discovery.unwrap_or_default();
        config.profiles.insert(name, out);
    }
    if let Some(http) = raw.value.http {
        let line = http.referenced.line();
        let h = http.value;
        if h.max_sessions_per_identity == 0 {
            return Err(invalid(
                "mcp.http.max_sessions_per_identity".into(),
                line,
                "must be at least 1".into(),
            ));
        }
        if h.stream_retry_ms > 3_600_000 {
            return Err(invalid(
                "mcp.http.stream_retry_ms".into(),
                line,
                "at most 3600000 (an hour)".into(),
            ));
        }
        if h.max_batch_items == 0 || h.max_batch_items > MAX_BATCH_ITEMS_CEILING {
            return Err(invalid(
                "mcp.http.max_batch_items".into(),
                line,
                format!("must be 1 to {MAX_BATCH_ITEMS_CEILING}"),
            ));
        }
        if h.max_batch_bytes < 1024 {
            return Err(invalid(
                "mcp.http.max_batch_bytes".into(),
                line,
                "must be at least 1024".into(),
            ));
        }
        if let Some(bad) = h.cors_allowed_origins.iter().find(|o| !is_plain_origin(o)) {
            return Err(invalid(
                "mcp.http.cors_allowed_origins".into(),
                line,
                format!(
                    "{bad:?} is not an origin; write http://host[:port] or https://host[:port], without a path or wildcard"
                ),
            ));
        }
        config.http = h;
    }
    Ok(config)
}

impl crate::Runtime {
    /// Applies `config`'s MCP roots to the running runtime: the roots each
    /// server's next `roots/list` gets, and `notifications/roots/list_changed`
    /// to every running server offered roots at its start whose roots
    /// changed. A server that had no roots when it started learns of new ones
    /// at its next start (the capability is declared at `initialize`).
    /// Returns the servers told.
    pub fn apply_mcp_config(&self, config: &McpConfig) -> Vec<String> {
        self.inner.mcp_features.set_config(config);
        self.inner.mcp_stateless.replace(config.stateless());
        (self.inner.observer.accept_new).replace(config.accept_new_tools());
        self.apply_upstream_auth(config.upstream_auth());
        let changed = self.inner.mcp_roots.replace(config.roots());
        let mut told = Vec::new();
        for server in changed {
            let Ok(sup) = self.supervised(&server) else {
                continue;
            };
            let Some(conn) = sup.current() else { continue };
            if plugd_dialects::mcp::offered_roots(&conn) {
                conn.peer.notify("notifications/roots/list_changed", None);
                told.push(server);
            } else {
                tracing::info!(plugin = %server, "roots configured for an MCP server that started without them; they are offered from its next start");
            }
        }
        told
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PlugdConfig;

    fn parse(text: &str) -> Result<PlugdConfig, ConfigError> {
        PlugdConfig::parse(text, Path::new("/ws/plugd.yaml"), Path::new("/ws"))
    }

    #[test]
    fn upstream_auth_is_off_by_default_and_refused_when_it_cannot_work() {
        let auth = "auth:\n  issuers:\n    - {issuer: 'https://idp.example', audience: plugd}\n";
        let c = parse(&format!("{auth}mcp:\n  servers:\n    notes: {{}}\n")).unwrap();
        assert!(c.mcp.servers["notes"].upstream_auth.is_none());
        assert!(c.mcp.upstream_auth().is_empty());
        let server = |tx: &str| {
            format!(
                "{auth}mcp:\n  servers:\n    notes:\n      upstream_auth:\n        token_exchange: {{{tx}}}\n"
            )
        };
        let c = parse(&server(
            "issuer: 'https://idp.example/', audience: 'https://notes.example/mcp', scope: 'notes:read', client_id: plugd-x, client_secret: '${notes-x}'",
        ))
        .unwrap();
        let ua = &c.mcp.upstream_auth()["notes"];
        assert!(!ua.user_grants);
        let tx = ua.token_exchange.as_ref().unwrap();
        assert_eq!(tx.audience, "https://notes.example/mcp");
        assert_eq!(tx.client_secret.as_deref(), Some("notes-x"));
        assert_eq!(tx.scope.as_deref(), Some("notes:read"));
        let grants = format!(
            "{auth}mcp:\n  servers:\n    notes:\n      upstream_auth: {{user_grants: true}}\n"
        );
        let c = parse(&grants).unwrap();
        assert!(c.mcp.upstream_auth()["notes"].user_grants);
        let e = parse(&format!(
            "{auth}mcp:\n  servers:\n    notes:\n      upstream_auth: {{user_grants: false}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("mcp.servers.notes.upstream_auth") && e.contains("no way"),
            "{e}"
        );
        for (tx, field, why) in [
            (
                "issuer: 'https://other.example', audience: a, client_id: c",
                "token_exchange.issuer",
                "not one of auth.issuers",
            ),
            (
                "issuer: 'http://idp.example', audience: a, client_id: c",
                "token_exchange.issuer",
                "plain http",
            ),
            (
                "issuer: 'https://idp.example', audience: 'http://notes.example/mcp', client_id: c",
                "token_exchange.audience",
                "plain http",
            ),
            (
                "issuer: 'https://idp.example', audience: ' ', client_id: c",
                "token_exchange.audience",
                "resource identifier",
            ),
            (
                "issuer: 'https://idp.example', audience: a, client_id: ''",
                "token_exchange.client_id",
                "client id",
            ),
            (
                "issuer: 'https://idp.example', audience: a, client_id: c, client_secret: hunter2",
                "token_exchange.client_secret",
                "never the secret itself",
            ),
            (
                "issuer: 'https://idp.example', audience: a, client_id: c, client_secret: '${../x}'",
                "token_exchange.client_secret",
                "${NAME}",
            ),
            (
                "issuer: 'https://idp.example', audience: a, client_id: c, extra: 1",
                "extra",
                "",
            ),
        ] {
            let e = parse(&server(tx)).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(why), "{tx}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn legacy_sse_and_cors_are_off_unless_set_and_origins_are_checked() {
        let c = parse("mcp: {}\n").unwrap();
        assert!(!c.mcp.http.legacy_sse);
        assert!(c.mcp.http.cors_allowed_origins.is_empty());
        let c = parse(
            "mcp:\n  http:\n    legacy_sse: true\n    cors_allowed_origins: [\"https://app.example\", \"http://localhost:5173\"]\n",
        )
        .unwrap();
        assert!(c.mcp.http.legacy_sse);
        assert_eq!(c.mcp.http.cors_allowed_origins.len(), 2);
        for bad in [
            "\"*\"",
            "\"https://a.example/path\"",
            "\"ftp://a\"",
            "\"null\"",
        ] {
            let e = parse(&format!(
                "mcp:\n  http:\n    cors_allowed_origins: [{bad}]\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("cors_allowed_origins"), "{bad}: {e}");
        }
        let e = parse("mcp:\n  http:\n    legacy_sse_on: true\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("legacy_sse_on"), "{e}");
    }

    #[test]
    fn roots_are_per_server_and_relative_ones_sit_under_the_workspace() {
        let c = parse(
            "mcp:\n  servers:\n    fs:\n      roots: [/nonexistent/a, data]\n    other: {}\n",
        )
        .unwrap();
        assert_eq!(
            c.mcp.servers["fs"].roots,
            vec![PathBuf::from("/nonexistent/a"), PathBuf::from("/ws/data")]
        );
        let roots = c.mcp.roots();
        assert_eq!(roots.len(), 1, "a server without roots is offered none");
        assert!(!roots.contains_key("other"));
    }

    #[test]
    fn profiles_match_by_glob_or_plugin_and_bad_globs_are_named() {
        let c = parse(
            "mcp:\n  profiles:\n    ro:\n      tools: [\"*_read*\", \"everything/*\"]\n      plugins: [hello]\n    none: {}\n",
        )
        .unwrap();
        let ro = c.mcp.profiles["ro"].matcher();
        assert!(ro.matches("fs", "fs_read_file"));
        assert!(ro.matches("everything", "everything/echo"));
        assert!(ro.matches("hello", "hello_greet"));
        assert!(!ro.matches("fs", "fs_write_file"));
        assert!(!c.mcp.profiles["none"].matcher().matches("fs", "fs_read"));
        let e = parse("mcp:\n  profiles:\n    p:\n      tools: [\"[\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mcp.profiles.p.tools[0]") && e.contains("line 4"),
            "{e}"
        );
        let e = parse("mcp:\n  profiles:\n    \"a/b\": {}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mcp.profiles") && e.contains("a/b"), "{e}");
    }

    #[test]
    fn discovery_is_list_unless_search_and_nothing_else() {
        let c = parse(
            "mcp:\n  profiles:\n    big:\n      tools: [\"*\"]\n      discovery: search\n    plain:\n      tools: [\"*\"]\n    listed:\n      tools: [\"*\"]\n      discovery: list\n",
        )
        .unwrap();
        assert_eq!(c.mcp.profiles["big"].matcher().discovery, Discovery::Search);
        assert_eq!(c.mcp.profiles["plain"].discovery, Discovery::List);
        assert_eq!(c.mcp.profiles["listed"].discovery, Discovery::List);
        for bad in ["find", "SEARCH", "[search]", "1"] {
            let text = format!("mcp:\n  profiles:\n    p:\n      discovery: {bad}\n");
            assert!(parse(&text).is_err(), "{bad}");
            let v = crate::config::schema_violations(&text).unwrap();
            assert!(!v.is_empty(), "the schema refuses {bad}");
        }
        let ok = "mcp:\n  profiles:\n    p:\n      discovery: search\n";
        assert!(crate::config::schema_violations(ok).unwrap().is_empty());
    }

    #[test]
    fn no_section_means_no_roots_for_anyone() {
        assert!(parse("").unwrap().mcp.roots().is_empty());
        assert!(parse("mcp: {}\n").unwrap().mcp.roots().is_empty());
    }

    #[test]
    fn bad_names_paths_and_keys_are_named_with_their_line() {
        let e = parse("mcp:\n  servers:\n    \"bad name\":\n      roots: [/a]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mcp.servers") && e.contains("bad name"), "{e}");
        let e = parse("mcp:\n  servers:\n    fs:\n      roots: [\"\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mcp.servers.fs.roots[0]") && e.contains("line 4"),
            "{e}"
        );
        let e = parse("mcp:\n  servers:\n    fs:\n      rootz: [/a]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rootz"), "{e}");
        let many: Vec<String> = (0..=MAX_ROOTS).map(|i| format!("/r{i}")).collect();
        let e = parse(&format!(
            "mcp:\n  servers:\n    fs:\n      roots: [{}]\n",
            many.join(", ")
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("at most 64"), "{e}");
    }

    #[test]
    fn the_stateless_revision_may_be_turned_off_per_server() {
        let c = parse("mcp:\n  servers:\n    fixture:\n      stateless: false\n    other: {}\n")
            .unwrap();
        assert_eq!(c.mcp.servers["fixture"].stateless, Some(false));
        assert_eq!(c.mcp.servers["other"].stateless, None);
        assert_eq!(c.mcp.stateless(), [("fixture".to_owned(), false)].into());
        assert!(parse("mcp:\n  servers:\n    f:\n      stateless: maybe\n").is_err());
        let c =
            parse("mcp:\n  servers:\n    fixture:\n      accept_new_tools: true\n    other: {}\n")
                .unwrap();
        assert!(c.mcp.servers["fixture"].accept_new_tools);
        assert!(!c.mcp.servers["other"].accept_new_tools);
        assert_eq!(c.mcp.accept_new_tools(), ["fixture".to_owned()].into());
        assert!(
            crate::config::schema_violations(
                "mcp:\n  servers:\n    f:\n      accept_new_tools: true\n"
            )
            .unwrap()
            .is_empty()
        );
        assert!(
            crate::config::schema_violations("mcp:\n  servers:\n    f:\n      stateless: false\n")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn resources_may_be_denied_per_server() {
        let c =
            parse("mcp:\n  servers:\n    fs:\n      resources: false\n    other: {}\n").unwrap();
        assert_eq!(c.mcp.servers["fs"].resources, Some(false));
        assert_eq!(c.mcp.servers["other"].resources, None);
        assert!(
            c.mcp.roots().is_empty(),
            "denying resources offers no roots"
        );
        let e = parse("mcp:\n  servers:\n    fs:\n      resources: maybe\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("boolean") && e.contains("line 4"), "{e}");
        assert!(
            crate::config::schema_violations("mcp:\n  servers:\n    fs:\n      resources: false\n")
                .unwrap()
                .is_empty()
        );
        assert!(
            !crate::config::schema_violations("mcp:\n  servers:\n    fs:\n      resources: 1\n")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn sampling_is_off_unless_allowed_and_its_tokens_are_bounded() {
        let c = parse(
            "mcp:\n  servers:\n    s:\n      sampling: true\n      sampling_max_tokens: 100\n    other: {}\n",
        )
        .unwrap();
        assert!(c.mcp.servers["s"].sampling);
        assert_eq!(c.mcp.servers["s"].sampling_max_tokens, 100);
        assert!(!c.mcp.servers["other"].sampling, "off by default");
        assert_eq!(
            c.mcp.servers["other"].sampling_max_tokens,
            DEFAULT_SAMPLING_MAX_TOKENS
        );
        for (bad, field) in [("0", true), ("131073", true), ("-1", false)] {
            let e = parse(&format!(
                "mcp:\n  servers:\n    s:\n      sampling_max_tokens: {bad}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("line 4"), "{bad}: {e}");
            assert_eq!(
                e.contains("mcp.servers.s.sampling_max_tokens"),
                field,
                "{bad}: {e}"
            );
        }
        let e = parse("mcp:\n  servers:\n    s:\n      sampling: yes please\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4"), "{e}");
        let ok = "mcp:\n  servers:\n    s:\n      sampling: true\n      sampling_max_tokens: 64\n";
        assert!(crate::config::schema_violations(ok).unwrap().is_empty());
        let bad = "mcp:\n  servers:\n    s:\n      sampling: 1\n";
        assert!(!crate::config::schema_violations(bad).unwrap().is_empty());
    }

    #[test]
    fn the_schema_knows_the_section() {
        let text = "mcp:\n  servers:\n    fs:\n      roots: [/srv]\n";
        assert!(crate::config::schema_violations(text).unwrap().is_empty());
        let bad = "mcp:\n  servers:\n    fs:\n      roots: /srv\n";
        assert!(!crate::config::schema_violations(bad).unwrap().is_empty());
    }

    #[test]
    fn the_http_transport_has_defaults_and_checked_settings() {
        let d = parse("").unwrap().mcp.http;
        assert_eq!(d.max_sessions_per_identity, DEFAULT_SESSIONS_PER_IDENTITY);
        assert_eq!(d.stream_close_after_ms, DEFAULT_STREAM_CLOSE_AFTER_MS);
        let text = "mcp:\n  http:\n    max_sessions_per_identity: 3\n    stream_close_after_ms: 0\n    stream_retry_ms: 10\n";
        let h = parse(text).unwrap().mcp.http;
        assert_eq!(
            (
                h.max_sessions_per_identity,
                h.stream_close_after_ms,
                h.stream_retry_ms
            ),
            (3, 0, 10)
        );
        assert!(crate::config::schema_violations(text).unwrap().is_empty());
        let e = parse("mcp:\n  http:\n    max_sessions_per_identity: 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mcp.http.max_sessions_per_identity") && e.contains("at least 1"),
            "{e}"
        );
        let e = parse("mcp:\n  http:\n    max_session: 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_session"), "{e}");
        let e = parse("mcp:\n  http:\n    stream_retry_ms: 99999999\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mcp.http.stream_retry_ms"), "{e}");
        assert_eq!(
            (d.max_batch_items, d.max_batch_bytes),
            (DEFAULT_MAX_BATCH_ITEMS, DEFAULT_MAX_BATCH_BYTES)
        );
        let text = "mcp:\n  http:\n    max_batch_items: 4\n    max_batch_bytes: 4096\n";
        let h = parse(text).unwrap().mcp.http;
        assert_eq!((h.max_batch_items, h.max_batch_bytes), (4, 4096));
        assert!(crate::config::schema_violations(text).unwrap().is_empty());
        for bad in [
            "max_batch_items: 0",
            "max_batch_items: 5000",
            "max_batch_bytes: 10",
        ] {
            let e = parse(&format!("mcp:\n  http:\n    {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(bad.split(':').next().unwrap()), "{e}");
        }
    }
}
