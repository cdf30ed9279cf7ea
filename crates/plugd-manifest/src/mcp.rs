//! The mcp dialect's manifest form: MCP server entries of `.mcp.json`.
//!
//! The file has the form most MCP clients share:
//!
//! ```json
//! {"mcpServers": {"everything": {"command": "node", "args": ["server.js", "stdio"], "env": {"K": "v"}}}}
//! ```
//!
//! Each entry becomes one [`PluginSpec`] whose id is the server name. An
//! entry is only a command line, so the approval digest covers the entry
//! itself (`pinned`), not a directory (`pin_dir = false`); the working
//! directory is the workspace.
//!
//! A remote server is declared the way Claude Code, Cursor and VS Code
//! declare it: a `url` (with `"type": "http"`, or no type), optional
//! `headers`, and optional `oauth` client settings:
//!
//! ```json
//! {"mcpServers": {"docs": {"type": "http", "url": "https://mcp.example.com/mcp",
//!   "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"},
//!   "oauth": {"clientId": "plugd", "scope": "docs:read"}}}}
//! ```
//!
//! `${NAME}` in a header value (or in `oauth.clientSecret`) names a secret
//! in plugd's secret store (`plugd secrets set DOCS_TOKEN`), never an
//! environment variable: the file holds no secret, and the approval of the
//! entry covers which secrets it sends where. The legacy HTTP+SSE transport (`"type": "sse"`) is refused
//! with a message saying so.
//!
//! **Why one file** (~850 product lines): one `.mcp.json` entry form, local
//! and remote; the remote half (`parse_remote`: URL, headers, OAuth client
//! settings, `${NAME}` placeholders) is most of it and shares the entry's
//! field reader and error paths with the local half.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::quote;
use crate::{
    CommandSpec, Dialect, EntryError, LoadOptions, MAX_MANIFEST_BYTES, ManifestError, PluginSpec,
    SupervisorSpec, resolve_path,
};

/// The mcp-specific rest of a plugin declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct McpSpec {
    /// The server's name: its key in `mcpServers`, also the plugin id and
    /// the prefix of its tool names (`<server>/<tool>`).
    pub server: String,
    /// The transport: `"stdio"` or `"http"` (Streamable HTTP).
    pub transport: String,
    /// The remote server's MCP endpoint (`"http"` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent with every request, `${NAME}` placeholders unexpanded.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// OAuth client settings (`oauth`), if the entry has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oauth: Option<McpOAuth>,
}

impl McpSpec {
    /// Whether this is a remote (Streamable HTTP) server.
    pub fn is_remote(&self) -> bool {
        self.transport == "http"
    }

    /// The secret settings the entry refers to (`${NAME}` in header values
    /// and `oauth.clientSecret`), each once, in order of appearance.
    pub fn secret_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        let sources = self
            .headers
            .values()
            .chain(self.oauth.iter().filter_map(|o| o.client_secret.as_ref()));
        for v in sources {
            for n in placeholders(v) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        names
    }
}

/// An entry's `oauth` settings (all optional; names as Claude Code spells them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct McpOAuth {
    /// `clientId`: a client registered at the authorization server.
    pub client_id: Option<String>,
    /// `clientSecret`: its secret, a `${NAME}` placeholder.
    pub client_secret: Option<String>,
    /// `clientMetadataUrl`: an HTTPS URL of a client metadata document.
    pub client_metadata_url: Option<String>,
    /// `scope`: the scopes to ask instead of the discovered ones.
    pub scope: Option<String>,
    /// `callbackPort`: the loopback port of the redirect (default: any).
    pub callback_port: Option<u16>,
}

/// Keys accepted in an entry's `oauth` object.
pub const OAUTH_KEYS: &[&str] = &[
    "clientId",
    "clientSecret",
    "clientMetadataUrl",
    "scope",
    "callbackPort",
];

/// Keys accepted in a remote server's entry.
pub const REMOTE_KEYS: &[&str] = &["type", "transport", "url", "headers", "oauth"];

/// The `${NAME}` placeholders of `value` (`NAME`: a secret name, letters,
/// digits, `_ . - /`, not starting with `.` or `/`; at most 128).
pub fn placeholders(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(i) = rest.find("${") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find('}') else { break };
        let name = &rest[..end];
        if is_placeholder_name(name) {
            out.push(name.to_owned());
        }
        rest = &rest[end + 1..];
    }
    out
}

fn is_placeholder_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with(['.', '/'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-/".contains(&b))
}

/// `value` with every `${NAME}` replaced by `lookup(NAME)`; the first name
/// without a value is the error.
pub fn expand(
    value: &str,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find('}') {
            Some(end) if is_placeholder_name(&after[..end]) => {
                let name = &after[..end];
                out.push_str(&lookup(name).ok_or_else(|| name.to_owned())?);
                rest = &after[end + 1..];
            }
            _ => {
                out.push_str("${");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The file this dialect is declared in.
pub const MCP_FILE: &str = ".mcp.json";

/// Keys accepted in one `mcpServers` entry.
pub const ENTRY_KEYS: &[&str] = &["command", "args", "env", "type", "transport"];

/// How long an MCP server gets to exit after SIGTERM before SIGKILL (MCP has
/// no shutdown request; the stdio transport stops with signals).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

const RESERVED_ENV_PREFIXES: &[&str] = &["NEXO_", "PLUGD_"];

/// Version of every MCP plugin spec: an entry declares no version (the
/// server reports its own in `serverInfo` at the handshake).
pub const MCP_SPEC_VERSION: &str = "0.0.0";

/// `true` when `name` matches `^[A-Za-z0-9_-]{1,64}$`.
pub fn is_valid_server_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Reads `.mcp.json` in `workspace`, one result per entry (a bad entry does not
/// hide the good ones). `Ok(vec![])` when the file does not exist; `Err` when
/// the file as a whole cannot be read or parsed.
pub fn load_mcp(
    workspace: &Path,
    opts: &LoadOptions,
) -> Result<Vec<Result<PluginSpec, EntryError>>, ManifestError> {
    let _ = opts;
    let path = workspace.join(MCP_FILE);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ManifestError::Io { path, source }),
    };
    let io_err = |source| ManifestError::Io {
        path: path.clone(),
        source,
    };
    let text = crate::read::read_limited(&path, &meta)?;
    let workspace = std::fs::canonicalize(workspace).map_err(io_err)?;
    parse_mcp(&text, &workspace.join(MCP_FILE), &workspace)
}

/// Parses `.mcp.json` text. `path` is used in errors and copied into each
/// spec; `workspace` (canonical) is every server's working directory and
/// the base of relative commands.
// The entry results' shape is fixed by workspace discovery's loader type.
#[allow(clippy::result_large_err)]
pub fn parse_mcp(
    text: &str,
    path: &Path,
    workspace: &Path,
) -> Result<Vec<Result<PluginSpec, EntryError>>, ManifestError> {
    let invalid = |field: &str, message: String| ManifestError::Invalid {
        path: path.to_path_buf(),
        field: field.to_owned(),
        message,
    };
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge {
            path: path.to_path_buf(),
            size: text.len() as u64,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    let root: Value = serde_json::from_str(text).map_err(|e| {
        invalid(
            &format!("line {} column {}", e.line(), e.column()),
            format!("invalid JSON: {e}; fix the syntax at that position"),
        )
    })?;
    let Value::Object(root) = root else {
        return Err(invalid(
            "(top level)",
            format!(
                "expected an object like {{\"mcpServers\": {{...}}}}, got {}",
                kind(&root)
            ),
        ));
    };
    for key in root.keys() {
        if key != "mcpServers" {
            return Err(ManifestError::UnknownKey {
                path: path.to_path_buf(),
                field: key.clone(),
                expected: vec!["mcpServers".into()],
            });
        }
    }
    let servers = match root.get("mcpServers") {
        None => {
            return Err(ManifestError::MissingField {
                path: path.to_path_buf(),
                field: "mcpServers".into(),
            });
        }
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(invalid(
                "mcpServers",
                format!(
                    "expected an object mapping server names to entries, got {}",
                    kind(other)
                ),
            ));
        }
    };
    Ok(servers
        .iter()
        .map(|(name, entry)| {
            parse_entry(name, entry, path, workspace).map_err(|error| EntryError {
                name: name.clone(),
                error,
            })
        })
        .collect())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Validates one `mcpServers` entry.
fn parse_entry(
    name: &str,
    entry: &Value,
    path: &Path,
    workspace: &Path,
) -> Result<PluginSpec, ManifestError> {
    let base = format!("mcpServers.{}", field_key(name));
    let field = |key: &str| format!("{base}.{key}");
    let invalid = |field: String, message: String| ManifestError::Invalid {
        path: path.to_path_buf(),
        field,
        message,
    };
    if !is_valid_server_name(name) {
        return Err(invalid(
            base.clone(),
            format!(
                "server name {} is not valid; use 1-64 characters of A-Z, a-z, 0-9, _ and - (e.g. \"my-server\")",
                quote(name)
            ),
        ));
    }
    let Value::Object(entry) = entry else {
        return Err(invalid(
            base.clone(),
            format!(
                "expected an object with \"command\" (and optional \"args\", \"env\"), got {}",
                kind(entry)
            ),
        ));
    };
    if entry.contains_key("url") || remote_type(entry) {
        return parse_remote(name, entry, path, workspace);
    }
    for key in entry.keys() {
        if !ENTRY_KEYS.contains(&key.as_str()) {
            return Err(ManifestError::UnknownKey {
                path: path.to_path_buf(),
                field: field(&field_key(key)),
                expected: ENTRY_KEYS.iter().map(|s| (*s).to_owned()).collect(),
            });
        }
    }
    check_transport(
        entry,
        &field,
        path,
        "stdio",
        |s| s == "stdio",
        |s| {
            format!(
                "transport {} is not supported; use \"stdio\" (with \"command\") or \"http\" (with \"url\", Streamable HTTP)",
                quote(s)
            )
        },
    )?;

    let command = match entry.get("command") {
        None => {
            return Err(ManifestError::MissingField {
                path: path.to_path_buf(),
                field: field("command"),
            });
        }
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(invalid(
                field("command"),
                format!(
                    "expected a string (a program on PATH, an absolute path, or a path inside the workspace), got {}",
                    kind(other)
                ),
            ));
        }
    };
    if command.trim().is_empty() {
        return Err(invalid(
            field("command"),
            "command is empty; set it to a program on PATH (e.g. \"node\"), an absolute path, or a path inside the workspace like \"./bin/server\"".into(),
        ));
    }
    if command.contains('\0') {
        return Err(invalid(
            field("command"),
            format!("{} contains a NUL byte; remove it", quote(command)),
        ));
    }
    let program = if command.contains('/') && !Path::new(command).is_absolute() {
        resolve_relative(command, workspace, path, &field("command"))?
    } else {
        command.to_owned()
    };

    let mut args = Vec::new();
    match entry.get("args") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let f = format!("{}[{i}]", field("args"));
                match item {
                    Value::String(s) if s.contains('\0') => {
                        return Err(invalid(
                            f,
                            format!("{} contains a NUL byte; remove it", quote(s)),
                        ));
                    }
                    Value::String(s) => args.push(s.clone()),
                    other => {
                        return Err(invalid(
                            f,
                            format!("expected a string, got {}", kind(other)),
                        ));
                    }
                }
            }
        }
        Some(other) => {
            return Err(invalid(
                field("args"),
                format!("expected an array of strings, got {}", kind(other)),
            ));
        }
    }

    let env = parse_env(entry, path, &field("env"))?;

    Ok(PluginSpec {
        id: name.to_owned(),
        version: MCP_SPEC_VERSION.to_owned(),
        dialect: Dialect::Mcp,
        dir: workspace.to_path_buf(),
        manifest_path: path.to_path_buf(),
        command: CommandSpec { program, args, env },
        supervisor: SupervisorSpec {
            shutdown_grace: SHUTDOWN_GRACE,
            ..SupervisorSpec::default()
        },
        pin_dir: false,
        pinned: Value::Object(entry.clone()),
        mcp: Some(McpSpec {
            server: name.to_owned(),
            transport: "stdio".into(),
            ..McpSpec::default()
        }),
        ..PluginSpec::base()
    })
}

fn parse_env(
    entry: &Map<String, Value>,
    path: &Path,
    env_field: &str,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let invalid = |field: String, message: String| ManifestError::Invalid {
        path: path.to_path_buf(),
        field,
        message,
    };
    let mut env = BTreeMap::new();
    let table = match entry.get("env") {
        None => return Ok(env),
        Some(Value::Object(t)) => t,
        Some(other) => {
            return Err(invalid(
                env_field.to_owned(),
                format!("expected an object of string values, got {}", kind(other)),
            ));
        }
    };
    for (key, value) in table {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(invalid(
                env_field.to_owned(),
                format!(
                    "key {} is not a valid environment variable name (empty, or contains '=' or NUL); rename it",
                    quote(key)
                ),
            ));
        }
        if RESERVED_ENV_PREFIXES.iter().any(|p| {
            key.len() >= p.len() && key.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
        }) {
            return Err(ManifestError::ReservedEnvKey {
                path: path.to_path_buf(),
                field: env_field.to_owned(),
                key: key.clone(),
            });
        }
        let key_field = format!("{env_field}.{}", field_key(key));
        match value {
            Value::String(s) if s.contains('\0') => {
                return Err(invalid(
                    key_field,
                    format!("{} contains a NUL byte; remove it", quote(s)),
                ));
            }
            Value::String(s) => {
                env.insert(key.clone(), s.clone());
            }
            other => {
                return Err(invalid(
                    key_field,
                    format!("expected a string, got {}; quote the value", kind(other)),
                ));
            }
        }
    }
    Ok(env)
}

/// Checks an entry's `type` and `transport` (either may be absent): each
/// must be a string `accepts`; `refusal` words the error for another one.
fn check_transport(
    entry: &Map<String, Value>,
    field: &dyn Fn(&str) -> String,
    path: &Path,
    expected: &str,
    accepts: impl Fn(&str) -> bool,
    refusal: impl Fn(&str) -> String,
) -> Result<(), ManifestError> {
    for key in ["type", "transport"] {
        let message = match entry.get(key) {
            None => continue,
            Some(Value::String(s)) if accepts(s) => continue,
            Some(Value::String(s)) => refusal(s),
            Some(other) => format!("expected the string \"{expected}\", got {}", kind(other)),
        };
        return Err(ManifestError::Invalid {
            path: path.to_path_buf(),
            field: field(key),
            message,
        });
    }
    Ok(())
}

/// Whether the entry's `type`/`transport` names Streamable HTTP.
fn remote_type(entry: &Map<String, Value>) -> bool {
    ["type", "transport"]
        .iter()
        .any(|k| matches!(entry.get(*k), Some(Value::String(s)) if is_http_type(s)))
}

fn is_http_type(s: &str) -> bool {
    matches!(
        s,
        "http" | "streamable-http" | "streamableHttp" | "streamable_http"
    )
}

/// Validates a remote server's entry (`url`, `headers`, `oauth`).
fn parse_remote(
    name: &str,
    entry: &Map<String, Value>,
    path: &Path,
    workspace: &Path,
) -> Result<PluginSpec, ManifestError> {
    let base = format!("mcpServers.{}", field_key(name));
    let field = |key: &str| format!("{base}.{key}");
    let invalid = |field: String, message: String| ManifestError::Invalid {
        path: path.to_path_buf(),
        field,
        message,
    };
    for key in entry.keys() {
        if matches!(key.as_str(), "command" | "args" | "env") {
            return Err(invalid(
                field(key),
                format!(
                    "a remote server (\"url\") has no {}; remove it, or remove \"url\" to run a local server",
                    quote(key)
                ),
            ));
        }
        if !REMOTE_KEYS.contains(&key.as_str()) {
            return Err(ManifestError::UnknownKey {
                path: path.to_path_buf(),
                field: field(&field_key(key)),
                expected: REMOTE_KEYS.iter().map(|s| (*s).to_owned()).collect(),
            });
        }
    }
    check_transport(entry, &field, path, "http", is_http_type, |s| {
        if s == "sse" {
            "the legacy HTTP+SSE transport (\"sse\", protocol 2024-11-05) is not supported; plugd speaks Streamable HTTP: set it to \"http\" if the server offers it".into()
        } else {
            format!(
                "transport {} does not go with \"url\"; use \"http\" (Streamable HTTP)",
                quote(s)
            )
        }
    })?;
    let url = match entry.get("url") {
        Some(Value::String(u)) => u.trim().to_owned(),
        Some(other) => {
            return Err(invalid(
                field("url"),
                format!(
                    "expected a string (an http:// or https:// URL), got {}",
                    kind(other)
                ),
            ));
        }
        None => {
            return Err(ManifestError::MissingField {
                path: path.to_path_buf(),
                field: field("url"),
            });
        }
    };
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') => {}
        _ => {
            return Err(invalid(
                field("url"),
                format!(
                    "{} is not an http:// or https:// URL with a host",
                    quote(&url)
                ),
            ));
        }
    }
    if url.len() > 2048 || url.chars().any(|c| c.is_control() || c == ' ') {
        return Err(invalid(
            field("url"),
            "the URL is over 2048 characters or contains spaces or control characters".into(),
        ));
    }
    let mut headers = BTreeMap::new();
    match entry.get("headers") {
        None => {}
        Some(Value::Object(t)) => {
            if t.len() > 64 {
                return Err(invalid(
                    field("headers"),
                    format!("{} headers; at most 64", t.len()),
                ));
            }
            for (k, v) in t {
                let f = format!("{}.{}", field("headers"), field_key(k));
                let token = !k.is_empty()
                    && k.len() <= 256
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !token {
                    return Err(invalid(
                        f,
                        format!("{} is not a valid HTTP header name", quote(k)),
                    ));
                }
                let lk = k.to_ascii_lowercase();
                if matches!(
                    lk.as_str(),
                    "mcp-session-id"
                        | "mcp-protocol-version"
                        | "content-type"
                        | "accept"
                        | "content-length"
                        | "host"
                        | "last-event-id"
                ) {
                    return Err(invalid(
                        f,
                        format!("{} is set by plugd's transport; remove it", quote(k)),
                    ));
                }
                match v {
                    Value::String(s)
                        if s.len() <= 8192
                            && !s.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) =>
                    {
                        headers.insert(k.clone(), s.clone());
                    }
                    Value::String(_) => {
                        return Err(invalid(
                            f,
                            "the value is over 8192 bytes or contains CR, LF or NUL".into(),
                        ));
                    }
                    other => {
                        return Err(invalid(
                            f,
                            format!("expected a string, got {}; quote the value", kind(other)),
                        ));
                    }
                }
            }
        }
        Some(other) => {
            return Err(invalid(
                field("headers"),
                format!("expected an object of string values, got {}", kind(other)),
            ));
        }
    }
    let oauth = match entry.get("oauth") {
        None => None,
        Some(Value::Object(o)) => {
            let of = |k: &str| format!("{}.{k}", field("oauth"));
            for k in o.keys() {
                if !OAUTH_KEYS.contains(&k.as_str()) {
                    return Err(ManifestError::UnknownKey {
                        path: path.to_path_buf(),
                        field: of(&field_key(k)),
                        expected: OAUTH_KEYS.iter().map(|s| (*s).to_owned()).collect(),
                    });
                }
            }
            let text = |k: &str| -> Result<Option<String>, ManifestError> {
                match o.get(k) {
                    None => Ok(None),
                    Some(Value::String(s))
                        if !s.is_empty() && s.len() <= 2048 && !s.chars().any(char::is_control) =>
                    {
                        Ok(Some(s.clone()))
                    }
                    Some(other) => Err(invalid(
                        of(k),
                        format!(
                            "expected a non-empty string without control characters, got {}",
                            kind(other)
                        ),
                    )),
                }
            };
            let client_secret = text("clientSecret")?;
            if let Some(sec) = &client_secret
                && placeholders(sec).is_empty()
            {
                return Err(invalid(
                    of("clientSecret"),
                    "write the secret as a ${NAME} placeholder and store it with `plugd secrets set NAME`; .mcp.json holds no secrets".into(),
                ));
            }
            let callback_port = match o.get("callbackPort") {
                None => None,
                Some(Value::Number(n)) if n.as_u64().is_some_and(|p| (1..=65535).contains(&p)) => {
                    n.as_u64().map(|p| p as u16)
                }
                Some(other) => {
                    return Err(invalid(
                        of("callbackPort"),
                        format!("expected a port number 1-65535, got {}", kind(other)),
                    ));
                }
            };
            Some(McpOAuth {
                client_id: text("clientId")?,
                client_secret,
                client_metadata_url: text("clientMetadataUrl")?,
                scope: text("scope")?,
                callback_port,
            })
        }
        Some(other) => {
            return Err(invalid(
                field("oauth"),
                format!("expected an object, got {}", kind(other)),
            ));
        }
    };
    Ok(PluginSpec {
        id: name.to_owned(),
        version: MCP_SPEC_VERSION.to_owned(),
        dialect: Dialect::Mcp,
        dir: workspace.to_path_buf(),
        manifest_path: path.to_path_buf(),
        command: CommandSpec {
            program: String::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
        },
        supervisor: SupervisorSpec {
            shutdown_grace: SHUTDOWN_GRACE,
            ..SupervisorSpec::default()
        },
        pin_dir: false,
        pinned: Value::Object(entry.clone()),
        mcp: Some(McpSpec {
            server: name.to_owned(),
            transport: "http".into(),
            url: Some(url),
            headers,
            oauth,
        }),
        ..PluginSpec::base()
    })
}

/// A key as it appears in a dotted field: bare when it is a simple name,
/// else quoted.
fn field_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        key.to_owned()
    } else {
        quote(key)
    }
}

/// Resolves a relative command containing `/` against the workspace; it must
/// stay inside it after resolving symlinks and `..`.
fn resolve_relative(
    command: &str,
    workspace: &Path,
    path: &Path,
    field: &str,
) -> Result<String, ManifestError> {
    let resolved: PathBuf =
        resolve_path(&workspace.join(command)).ok_or_else(|| ManifestError::Invalid {
            path: path.to_path_buf(),
            field: field.to_owned(),
            message: format!(
                "{} follows too many symlinks (a loop?); point it at the real file",
                quote(command)
            ),
        })?;
    if !resolved.starts_with(workspace) || resolved == workspace {
        return Err(ManifestError::CommandEscapesPluginDir {
            path: path.to_path_buf(),
            field: field.to_owned(),
            command: command.to_owned(),
            resolved,
        });
    }
    resolved
        .into_os_string()
        .into_string()
        .map_err(|_| ManifestError::Invalid {
            path: path.to_path_buf(),
            field: field.to_owned(),
            message: format!(
                "{} resolves to a non-UTF-8 path; rename the directory",
                quote(command)
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ws() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn load(dir: &tempfile::TempDir, text: &str) -> Vec<Result<PluginSpec, EntryError>> {
        std::fs::write(dir.path().join(MCP_FILE), text).unwrap();
        load_mcp(dir.path(), &LoadOptions::default()).unwrap()
    }

    fn one_err(text: &str) -> String {
        let dir = ws();
        let mut entries = load(&dir, text);
        assert_eq!(entries.len(), 1);
        entries.pop().unwrap().unwrap_err().error.to_string()
    }

    fn file_err(text: &str) -> String {
        let dir = ws();
        std::fs::write(dir.path().join(MCP_FILE), text).unwrap();
        load_mcp(dir.path(), &LoadOptions::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn no_file_no_servers() {
        let dir = ws();
        assert!(
            load_mcp(dir.path(), &LoadOptions::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_good_entry_becomes_a_spec_pinned_to_the_entry() {
        let dir = ws();
        let entries = load(
            &dir,
            r#"{"mcpServers": {"every-thing_1": {"command": "node", "args": ["s.js", "stdio"], "env": {"A": "1"}, "type": "stdio"}}}"#,
        );
        let spec = entries.into_iter().next().unwrap().unwrap();
        let canon = dir.path().canonicalize().unwrap();
        assert_eq!(spec.id, "every-thing_1");
        assert_eq!(spec.dialect, Dialect::Mcp);
        assert_eq!(spec.dir, canon);
        assert_eq!(spec.manifest_path, canon.join(MCP_FILE));
        assert_eq!(spec.command.program, "node");
        assert_eq!(spec.command.args, ["s.js", "stdio"]);
        assert_eq!(spec.command.env["A"], "1");
        assert!(!spec.pin_dir);
        assert_eq!(
            spec.pinned,
            json!({"command": "node", "args": ["s.js", "stdio"], "env": {"A": "1"}, "type": "stdio"})
        );
        assert_eq!(spec.supervisor.shutdown_grace, SHUTDOWN_GRACE);
        assert_eq!(spec.mcp.unwrap().server, "every-thing_1");
    }

    #[test]
    fn a_bad_entry_does_not_hide_the_good_ones() {
        let dir = ws();
        let entries = load(
            &dir,
            r#"{"mcpServers": {"a": {"command": "x"}, "b": {"command": 3}, "c": {"command": "y"}}}"#,
        );
        let ok: Vec<bool> = entries.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, true]);
        let err = entries[1].as_ref().unwrap_err();
        assert_eq!(err.name, "b");
        assert!(
            err.error
                .to_string()
                .contains("mcpServers.b.command: expected a string"),
            "{}",
            err.error
        );
    }

    #[test]
    fn malformed_json_names_the_position() {
        let e = file_err("{\"mcpServers\": {\"a\": {\"command\": \"x\",}}}");
        assert!(
            e.contains(".mcp.json: line 1 column") && e.contains("invalid JSON"),
            "{e}"
        );
        let e = file_err("[1, 2]");
        assert!(e.contains("expected an object like"), "{e}");
        let e = file_err("{\"servers\": {}}");
        assert!(
            e.contains("servers: unknown key") && e.contains("mcpServers"),
            "{e}"
        );
        let e = file_err("{}");
        assert!(e.contains("mcpServers: required key is missing"), "{e}");
        let e = file_err("{\"mcpServers\": []}");
        assert!(e.contains("mcpServers: expected an object mapping"), "{e}");
    }

    #[test]
    fn wrong_types_and_unknown_fields_are_named() {
        let e = one_err(r#"{"mcpServers": {"s": {"command": "x", "cwd": "/tmp"}}}"#);
        assert!(e.contains("mcpServers.s.cwd: unknown key"), "{e}");
        let e = one_err(r#"{"mcpServers": {"s": {"command": "x", "args": "a b"}}}"#);
        assert!(
            e.contains("mcpServers.s.args: expected an array of strings, got a string"),
            "{e}"
        );
        let e = one_err(r#"{"mcpServers": {"s": {"command": "x", "args": ["a", 1]}}}"#);
        assert!(
            e.contains("mcpServers.s.args[1]: expected a string, got a number"),
            "{e}"
        );
        let e = one_err(r#"{"mcpServers": {"s": {"command": "x", "env": {"K": 1}}}}"#);
        assert!(
            e.contains("mcpServers.s.env.K: expected a string, got a number"),
            "{e}"
        );
        let e = one_err(r#"{"mcpServers": {"s": {"command": "x", "env": []}}}"#);
        assert!(e.contains("mcpServers.s.env: expected an object"), "{e}");
        let e = one_err(r#"{"mcpServers": {"s": {"args": []}}}"#);
        assert!(
            e.contains("mcpServers.s.command: required key is missing"),
            "{e}"
        );
        let e = one_err(r#"{"mcpServers": {"s": {"command": "  "}}}"#);
        assert!(e.contains("command is empty"), "{e}");
        let e = one_err(r#"{"mcpServers": {"s": "node server.js"}}"#);
        assert!(e.contains("mcpServers.s: expected an object"), "{e}");
    }

    #[test]
    fn reserved_env_keys_are_refused() {
        for key in ["NEXO_TOKEN", "PLUGD_X", "plugd_lower"] {
            let e = one_err(&format!(
                r#"{{"mcpServers": {{"s": {{"command": "x", "env": {{"{key}": "v"}}}}}}}}"#
            ));
            assert!(
                e.contains(&format!("key \"{key}\" is reserved")) && e.contains("mcpServers.s.env"),
                "{e}"
            );
        }
    }

    #[test]
    fn bad_names_are_refused() {
        for name in ["", "has space", "a/b", "../x", &"x".repeat(65), "é"] {
            let text = json!({"mcpServers": {name: {"command": "x"}}}).to_string();
            let e = one_err(&text);
            assert!(
                e.contains("is not valid; use 1-64 characters"),
                "{name}: {e}"
            );
        }
        assert!(is_valid_server_name(&"x".repeat(64)));
    }

    #[test]
    fn other_transports_are_refused_clearly() {
        let e = one_err(r#"{"mcpServers": {"s": {"command": "x", "type": "sse"}}}"#);
        assert!(
            e.contains("mcpServers.s.type: transport \"sse\" is not supported; use \"stdio\""),
            "{e}"
        );
        let e =
            one_err(r#"{"mcpServers": {"s": {"url": "https://x.example/mcp", "type": "sse"}}}"#);
        assert!(e.contains("legacy HTTP+SSE transport"), "{e}");
        let e =
            one_err(r#"{"mcpServers": {"s": {"command": "x", "transport": "streamable-http"}}}"#);
        assert!(e.contains("mcpServers.s.command: a remote server"), "{e}");
        let e = one_err(r#"{"mcpServers": {"s": {"command": "x", "type": 1}}}"#);
        assert!(e.contains("expected the string \"stdio\""), "{e}");
    }

    #[test]
    fn remote_servers_are_declared_like_claude_code_and_cursor_do() {
        let dir = ws();
        let entries = load(
            &dir,
            r#"{"mcpServers": {
                "typed": {"type": "http", "url": "https://mcp.example.com/mcp",
                          "headers": {"Authorization": "Bearer ${TOKEN}", "X-Org": "${ORG}-${TOKEN}"},
                          "oauth": {"clientId": "plugd", "clientSecret": "${CS}", "scope": "a b", "callbackPort": 8123}},
                "cursor": {"url": "http://127.0.0.1:9/mcp"}}}"#,
        );
        let typed = entries.iter().flatten().find(|s| s.id == "typed").unwrap();
        let m = typed.mcp.as_ref().unwrap();
        assert!(m.is_remote());
        assert_eq!(m.url.as_deref(), Some("https://mcp.example.com/mcp"));
        assert_eq!(m.secret_names(), vec!["TOKEN", "ORG", "CS"]);
        assert_eq!(m.oauth.as_ref().unwrap().callback_port, Some(8123));
        let cursor = entries.iter().flatten().find(|s| s.id == "cursor").unwrap();
        assert!(cursor.mcp.as_ref().unwrap().is_remote());
        assert!(cursor.command.program.is_empty());
    }

    #[test]
    fn hostile_remote_entries_are_refused_with_the_field() {
        for (text, want) in [
            (
                r#"{"url": "ftp://x/"}"#,
                "is not an http:// or https:// URL",
            ),
            (r#"{"url": "https:///nohost"}"#, "with a host"),
            (r#"{"url": 3}"#, "expected a string"),
            (r#"{"type": "http"}"#, "url"),
            (
                r#"{"url": "https://x/", "headers": {"Bad Name": "v"}}"#,
                "not a valid HTTP header name",
            ),
            (
                r#"{"url": "https://x/", "headers": {"X": "a\r\nInjected: 1"}}"#,
                "CR, LF or NUL",
            ),
            (
                r#"{"url": "https://x/", "headers": {"Mcp-Session-Id": "forged"}}"#,
                "set by plugd's transport",
            ),
            (
                r#"{"url": "https://x/", "oauth": {"clientSecret": "plain-text"}}"#,
                "placeholder",
            ),
            (
                r#"{"url": "https://x/", "oauth": {"callbackPort": 70000}}"#,
                "port number",
            ),
            (
                r#"{"url": "https://x/", "oauth": {"extra": 1}}"#,
                "oauth.extra",
            ),
            (r#"{"url": "https://x/", "env": {}}"#, "a remote server"),
        ] {
            let e = one_err(&format!(r#"{{"mcpServers": {{"s": {text}}}}}"#));
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn placeholders_expand_from_the_lookup_only() {
        assert_eq!(
            placeholders("a ${X} ${acme/gh-token} ${.hidden} ${sp ace} ${Y_1}${"),
            vec!["X", "acme/gh-token", "Y_1"]
        );
        let got = expand("Bearer ${T}/${U}", |n| (n == "T").then(|| "t".to_owned()));
        assert_eq!(got, Err("U".to_owned()));
        let got = expand("x${T}y ${/x} $T", |_| Some("v".into())).unwrap();
        assert_eq!(got, "xvy ${/x} $T");
    }

    #[test]
    fn relative_commands_stay_inside_the_workspace() {
        let dir = ws();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        let entries = load(
            &dir,
            r#"{"mcpServers": {"in": {"command": "./bin/server"}, "out": {"command": "../../bin/sh"}, "abs": {"command": "/bin/sh"}}}"#,
        );
        let canon = dir.path().canonicalize().unwrap();
        let by_name = |n: &str| {
            entries
                .iter()
                .find(|e| match e {
                    Ok(s) => s.id == n,
                    Err(e) => e.name == n,
                })
                .unwrap()
        };
        let spec = by_name("in").as_ref().unwrap();
        assert_eq!(
            spec.command.program,
            canon.join("bin/server").to_str().unwrap()
        );
        let e = by_name("out").as_ref().unwrap_err().error.to_string();
        assert!(
            e.contains("mcpServers.out.command: \"../../bin/sh\" escapes the plugin directory"),
            "{e}"
        );
        assert_eq!(by_name("abs").as_ref().unwrap().command.program, "/bin/sh");
    }

    #[test]
    fn an_oversized_file_is_refused() {
        let dir = ws();
        let big = format!(
            "{{\"mcpServers\": {{}}, \"pad\": \"{}\"}}",
            "x".repeat(MAX_MANIFEST_BYTES as usize)
        );
        std::fs::write(dir.path().join(MCP_FILE), big).unwrap();
        let e = load_mcp(dir.path(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, ManifestError::TooLarge { .. }), "{e:?}");
        assert!(e.to_string().contains("over the 1048576-byte limit"), "{e}");
    }

    #[test]
    fn the_example_workspace_entry_loads() {
        let text = include_str!("../../../examples/workspace/.mcp.json");
        let entries = parse_mcp(text, Path::new("/ws/.mcp.json"), Path::new("/ws")).unwrap();
        let spec = entries.into_iter().next().unwrap().unwrap();
        assert_eq!(spec.id, "everything");
        assert_eq!(spec.command.program, "node");
        assert_eq!(spec.command.args.last().map(String::as_str), Some("stdio"));
    }

    #[test]
    fn non_utf8_is_refused() {
        let dir = ws();
        std::fs::write(
            dir.path().join(MCP_FILE),
            b"{\"mcpServers\": {\"\xff\": {}}}",
        )
        .unwrap();
        let e = load_mcp(dir.path(), &LoadOptions::default()).unwrap_err();
        assert!(
            matches!(e, ManifestError::NotUtf8 { offset: 17, .. }),
            "{e:?}"
        );
    }
}

#[cfg(test)]
const PROP_MCP: &str = r#"{"mcpServers": {
  "every-thing_1": {"command": "node", "args": ["s.js", "stdio"], "env": {"A": "1"}, "type": "stdio"},
  "rel": {"command": "./bin/server", "transport": "stdio"},
  "b": {"command": "x", "env": {"TOKEN": "${TOKEN}"}}
}}"#;

#[cfg(test)]
mod props {
    use super::*;
    use crate::tests::{apply, mutation};
    use proptest::prelude::*;

    #[test]
    fn the_base_document_is_valid() {
        let ws = tempfile::tempdir().unwrap();
        let dir = ws.path().canonicalize().unwrap();
        let entries = parse_mcp(PROP_MCP, &dir.join(MCP_FILE), &dir).unwrap();
        assert!(entries.iter().all(Result::is_ok), "{entries:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn parse_never_panics_on_arbitrary_strings(s in any::<String>()) {
            let ws = tempfile::tempdir().unwrap();
            let dir = ws.path().canonicalize().unwrap();
            let parse = |t: &str| parse_mcp(t, &dir.join(MCP_FILE), &dir);
            if let Err(e) = parse(&s) {
                let _ = e.to_string();
            }
        }

        #[test]
        fn parse_never_panics_on_mutated_documents(
            base in proptest::sample::select(vec![PROP_MCP]),
            muts in proptest::collection::vec(mutation(), 1..6),
        ) {
            let ws = tempfile::tempdir().unwrap();
            let dir = ws.path().canonicalize().unwrap();
            let parse = |t: &str| parse_mcp(t, &dir.join(MCP_FILE), &dir);
            let mut text = base.to_owned();
            for m in &muts {
                text = apply(&text, m);
            }
            if let Err(e) = parse(&text) {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "{msg}");
            }
        }
    }
}
