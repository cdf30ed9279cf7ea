//! The microapp dialect's manifest form: the `entries` of the workspace's `extensions.yaml` (seed 001).
//!
//! ```yaml
//! entries:
//!   agent-creator:
//!     path: extensions/agent-creator/main.py   # relative to the workspace
//!     config: {default_model: small}           # opaque, sent in `initialize`
//!     timeout_secs: 10                         # per-call timeout, default 30
//!     capabilities: [agents_crud]              # what the microapp may ask for
//! ```
//!
//! The file is parsed with `serde-saphyr` (duplicate keys are errors, alias
//! bombs are bounded by its budget). The document as a whole must be a
//! mapping with only `entries`; each entry is then validated by hand so that
//! every error names the entry, the dotted key and its line, and one bad entry
//! never hides the good ones ([`load_extensions`] returns one result per entry).
//!
//! An entry becomes a [`PluginSpec`] whose `id` is the entry name, whose
//! `dir` is the canonical directory holding `path` (the child's working
//! directory and the files the approval digest covers), and whose `pinned`
//! value is the entry itself, so changing `config` or `capabilities` needs a
//! new approval.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::Spanned;

use crate::error::quote;
use crate::{
    CommandSpec, Dialect, EntryError, LoadOptions, MAX_MANIFEST_BYTES, ManifestError, PluginSpec,
    StartMode, SupervisorSpec,
};

/// The file this dialect is declared in.
pub const EXTENSIONS_FILE: &str = "extensions.yaml";

/// Default per-call timeout of a microapp (seed: "30 seconds").
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a microapp has to answer `shutdown` (seed: "within 5 s").
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Grace after the `shutdown` deadline before SIGKILL (seed: "SIGKILL after
/// 10 s regardless", i.e. 5 s after the 5 s reply window).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Largest accepted `timeout_secs` (one hour).
pub const MAX_TIMEOUT_SECS: u64 = 3600;

/// Longest entry id.
pub const MAX_ID_LEN: usize = 64;

/// Keys of one entry; any other key is an error.
pub const ENTRY_KEYS: &[&str] = &["path", "config", "timeout_secs", "capabilities"];

/// A capability an operator grants a microapp in `entries.<id>.capabilities`
/// (seed: "Methods (microapp → daemon)" and the notification table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Capability {
    /// `nexo/dispatch`: send a message through a channel.
    DispatchOutbound,
    /// `nexo/admin/agents/*` and `nexo/admin/reload`.
    AgentsCrud,
    /// `nexo/admin/credentials/*`; receives `nexo/notify/token_rotated`.
    CredentialsCrud,
    /// `nexo/admin/pairing/*`; receives `nexo/notify/pairing_status_changed`.
    PairingInitiate,
    /// `nexo/admin/llm_providers/*` (and `llm_keys/*`).
    LlmKeysCrud,
    /// `nexo/admin/channels/*`.
    ChannelsCrud,
    /// `nexo/admin/transcripts/*`; receives `nexo/notify/transcript_appended`
    /// and `nexo/notify/agent_event`.
    TranscriptsSubscribe,
}

impl Capability {
    /// Every capability, in the order they are listed in errors.
    pub const ALL: [Capability; 7] = [
        Capability::DispatchOutbound,
        Capability::AgentsCrud,
        Capability::CredentialsCrud,
        Capability::PairingInitiate,
        Capability::LlmKeysCrud,
        Capability::ChannelsCrud,
        Capability::TranscriptsSubscribe,
    ];

    /// The name as written in `extensions.yaml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::DispatchOutbound => "dispatch_outbound",
            Capability::AgentsCrud => "agents_crud",
            Capability::CredentialsCrud => "credentials_crud",
            Capability::PairingInitiate => "pairing_initiate",
            Capability::LlmKeysCrud => "llm_keys_crud",
            Capability::ChannelsCrud => "channels_crud",
            Capability::TranscriptsSubscribe => "transcripts_subscribe",
        }
    }

    /// The capability named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The microapp-specific rest of a plugin declaration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MicroappSpec {
    /// The entry name (`entries.<id>`), sent as `initialize.extension_id`.
    pub extension_id: String,
    /// The prefix every advertised tool must carry: the id with `-` read as
    /// `_`, then `_` (`agent-creator` → `agent_creator_`).
    pub tool_prefix: String,
    /// `path` as written.
    pub path: String,
    /// The canonical file `path` resolves to (inside the workspace).
    pub entry_file: PathBuf,
    /// `config`: opaque JSON sent as `initialize.config`; `{}` when absent.
    pub config: Value,
    /// `timeout_secs`, when given (else [`DEFAULT_CALL_TIMEOUT`]).
    pub timeout_secs: Option<u64>,
    /// `capabilities`, deduplicated and sorted.
    pub capabilities: Vec<Capability>,
}

impl MicroappSpec {
    /// Whether the operator granted `cap`.
    pub fn has(&self, cap: Capability) -> bool {
        self.capabilities.contains(&cap)
    }
}

/// The tool prefix of extension `id`: `-` read as `_`, then `_`.
///
/// ```
/// assert_eq!(plugd_manifest::microapp::tool_prefix("agent-creator"), "agent_creator_");
/// ```
pub fn tool_prefix(id: &str) -> String {
    format!("{}_", id.replace('-', "_"))
}

/// Whether `tool` is in the namespace of extension `id`: it is
/// `<prefix><suffix>` with a non-empty suffix.
///
/// ```
/// use plugd_manifest::microapp::tool_in_extension;
/// assert!(tool_in_extension("agent-creator", "agent_creator_create"));
/// assert!(tool_in_extension("hello", "hello_world_greet"));
/// assert!(!tool_in_extension("agent-creator", "create"));
/// assert!(!tool_in_extension("agent-creator", "agent-creator/create"));
/// assert!(!tool_in_extension("agent-creator", "agent_creator_"));
/// ```
pub fn tool_in_extension(id: &str, tool: &str) -> bool {
    tool.strip_prefix(&tool_prefix(id))
        .is_some_and(|rest| !rest.is_empty())
}

/// Whether `id` is a valid entry id: 1-64 characters of `a-z`, `0-9`, `-`
/// and `_`, starting with a letter.
pub fn is_valid_extension_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_')
}

/// Reads `extensions.yaml` in `workspace`, one result per entry (a bad entry
/// does not hide the good ones), in the order of the entry names. `Ok(vec![])`
/// when the file does not exist; `Err` when the file as a whole cannot be
/// read or parsed.
pub fn load_extensions(
    workspace: &Path,
    opts: &LoadOptions,
) -> Result<Vec<Result<PluginSpec, EntryError>>, ManifestError> {
    let _ = opts;
    let path = workspace.join(EXTENSIONS_FILE);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ManifestError::Io { path, source }),
    };
    let text = crate::read::read_limited(&path, &meta)?;
    let workspace = workspace
        .canonicalize()
        .map_err(|source| ManifestError::Io {
            path: path.clone(),
            source,
        })?;
    let path = workspace.join(EXTENSIONS_FILE);
    parse_extensions(&text, &path, &workspace)
}

/// Parses and validates `extensions.yaml` text. `path` is used in errors and
/// as each spec's `manifest_path`; `workspace` must be canonical (entry paths
/// are resolved against it and must stay inside it).
// `EntryError` is the shared per-entry error type of every entry loader.
#[allow(clippy::result_large_err)]
pub fn parse_extensions(
    text: &str,
    path: &Path,
    workspace: &Path,
) -> Result<Vec<Result<PluginSpec, EntryError>>, ManifestError> {
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge {
            path: path.to_path_buf(),
            size: text.len() as u64,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    options.strict_booleans = true;
    let doc: Option<Document> =
        serde_saphyr::from_str_with_options(text, options).map_err(|e| yaml_error(path, &e))?;
    let Some(doc) = doc else {
        return Ok(Vec::new()); // an empty file declares nothing
    };
    let entries = match doc.entries {
        None => return Ok(Vec::new()),
        Some(e) => e,
    };
    let mut results: Vec<Result<PluginSpec, EntryError>> = entries
        .into_iter()
        .map(|(name, node)| {
            check_entry(&name, &node, path, workspace).map_err(|error| EntryError { name, error })
        })
        .collect();
    refuse_prefix_clashes(&mut results, path);
    Ok(results)
}

/// Two ids that differ only by `-` / `_` share a tool prefix; both are refused.
fn refuse_prefix_clashes(results: &mut [Result<PluginSpec, EntryError>], path: &Path) {
    let mut by_prefix: HashMap<String, Vec<String>> = HashMap::new();
    for spec in results.iter().flatten() {
        by_prefix
            .entry(tool_prefix(&spec.id))
            .or_default()
            .push(spec.id.clone());
    }
    for r in results.iter_mut() {
        let Ok(spec) = r else { continue };
        let prefix = tool_prefix(&spec.id);
        let ids = &by_prefix[&prefix];
        if ids.len() > 1 {
            let others: Vec<String> = ids
                .iter()
                .filter(|i| **i != spec.id)
                .map(|i| quote(i))
                .collect();
            *r = Err(EntryError {
                name: spec.id.clone(),
                error: ManifestError::Invalid {
                    path: path.to_path_buf(),
                    field: format!("entries.{}", spec.id),
                    message: format!(
                        "shares the tool prefix {} with {}; rename one of them",
                        quote(&prefix),
                        others.join(", ")
                    ),
                },
            });
        }
    }
}

fn yaml_error(path: &Path, e: &serde_saphyr::Error) -> ManifestError {
    let message = e.to_string();
    let mut message = message.lines().next().unwrap_or("").trim().to_owned();
    // The position goes into the field; the library's own advice is dropped.
    if let Some(at) = message.rfind(" at line ") {
        message.truncate(at);
    }
    let message = message.replace(", set DuplicateKeyPolicy in Options if acceptable", "");
    let field = match e.location() {
        Some(l) => format!("line {}, column {}", l.line(), l.column()),
        None => "(document)".to_owned(),
    };
    ManifestError::Invalid {
        path: path.to_path_buf(),
        field,
        message: format!(
            "invalid extensions.yaml: {message}; the file must be a mapping with one key, \"entries\", mapping ids to {{path, config, timeout_secs, capabilities}}"
        ),
    }
}

/// The document: only `entries` is allowed at the top.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(default)]
    entries: Option<BTreeMap<String, Spanned<Node>>>,
}

/// One entry as read: its keys with their lines, or what it was instead of
/// a mapping (so a non-mapping entry is an error of that entry only).
enum Node {
    Map(Vec<(Spanned<String>, Spanned<Value>)>),
    Other(&'static str),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an extension entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            let value = map.next_value::<Spanned<Value>>()?;
            out.push((key, value));
        }
        Ok(Node::Map(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Node::Other("a list"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Other("a boolean"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Other("a string"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Other("null"))
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Other("null"))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

fn type_str(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Validation of one entry: errors name `entries.<id>.<key>` and the line.
struct Cx<'a> {
    path: &'a Path,
    id: &'a str,
}

impl Cx<'_> {
    fn field(&self, key: &str) -> String {
        if key.is_empty() {
            format!("entries.{}", self.id)
        } else {
            format!("entries.{}.{key}", self.id)
        }
    }

    fn invalid(&self, key: &str, line: u64, message: impl fmt::Display) -> ManifestError {
        ManifestError::Invalid {
            path: self.path.to_path_buf(),
            field: self.field(key),
            message: format!("{message} (line {line})"),
        }
    }

    fn wrong_type(&self, key: &str, line: u64, expected: &str, v: &Value) -> ManifestError {
        self.invalid(
            key,
            line,
            format!(
                "expected {expected}, found {}; change the value's type",
                type_str(v)
            ),
        )
    }
}

fn check_entry(
    id: &str,
    node: &Spanned<Node>,
    path: &Path,
    workspace: &Path,
) -> Result<PluginSpec, ManifestError> {
    let cx = Cx { path, id };
    let entry_line = node.referenced.line();
    if !is_valid_extension_id(id) {
        return Err(ManifestError::Invalid {
            path: path.to_path_buf(),
            field: format!("entries.{}", quote(id)),
            message: format!(
                "{} is not a valid extension id; use 1-{MAX_ID_LEN} characters of a-z, 0-9, - and _, starting with a letter (e.g. \"agent-creator\") (line {entry_line})",
                quote(id)
            ),
        });
    }
    let keys = match &node.value {
        Node::Map(keys) => keys,
        Node::Other(kind) => {
            return Err(cx.invalid(
                "",
                entry_line,
                format!(
                    "expected a mapping with \"path\" (and optionally config, timeout_secs, capabilities), found {kind}"
                ),
            ));
        }
    };
    let mut raw = serde_json::Map::new();
    let mut lines: HashMap<&str, u64> = HashMap::new();
    for (key, value) in keys {
        let name = key.value.as_str();
        if !ENTRY_KEYS.contains(&name) {
            return Err(cx.invalid(
                &quote_key(name),
                key.referenced.line(),
                format!(
                    "unknown key {}; remove it or fix its spelling (expected one of: {})",
                    quote(name),
                    ENTRY_KEYS.join(", ")
                ),
            ));
        }
        lines.insert(name, value.referenced.line());
        raw.insert(name.to_owned(), value.value.clone());
    }
    let line = |k: &str| lines.get(k).copied().unwrap_or(entry_line);

    // path
    let rel = match raw.get("path") {
        None => {
            return Err(ManifestError::MissingField {
                path: path.to_path_buf(),
                field: cx.field("path"),
            });
        }
        Some(Value::String(s)) => s.as_str(),
        Some(v) => return Err(cx.wrong_type("path", line("path"), "a string", v)),
    };
    let entry_file = resolve_entry_path(&cx, rel, line("path"), workspace)?;
    let dir = entry_file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| workspace.to_path_buf());
    let command = command_for(&cx, rel, line("path"), &entry_file)?;

    // config
    let config = match raw.get("config") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(v) => v.clone(),
    };

    // timeout_secs
    let timeout_secs = match raw.get("timeout_secs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_TIMEOUT_SECS).contains(&n) => Some(n),
            Some(n) => {
                return Err(cx.invalid(
                    "timeout_secs",
                    line("timeout_secs"),
                    format!("{n} is out of range; use 1 to {MAX_TIMEOUT_SECS} seconds"),
                ));
            }
            None if v.is_number() => {
                return Err(cx.invalid(
                    "timeout_secs",
                    line("timeout_secs"),
                    format!("{v} is not a whole number of seconds; use 1 to {MAX_TIMEOUT_SECS}"),
                ));
            }
            None => {
                return Err(cx.wrong_type(
                    "timeout_secs",
                    line("timeout_secs"),
                    "a whole number of seconds",
                    v,
                ));
            }
        },
    };

    // capabilities
    let mut capabilities = Vec::new();
    match raw.get("capabilities") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let key = format!("capabilities[{i}]");
                let l = line("capabilities");
                let Some(name) = item.as_str() else {
                    return Err(cx.wrong_type(&key, l, "a capability name (a string)", item));
                };
                let Some(cap) = Capability::parse(name) else {
                    let known: Vec<&str> = Capability::ALL.iter().map(|c| c.as_str()).collect();
                    return Err(cx.invalid(
                        &key,
                        l,
                        format!(
                            "unknown capability {}; known capabilities: {}",
                            quote(name),
                            known.join(", ")
                        ),
                    ));
                };
                if !capabilities.contains(&cap) {
                    capabilities.push(cap);
                }
            }
            capabilities.sort();
        }
        Some(v) => {
            return Err(cx.wrong_type(
                "capabilities",
                line("capabilities"),
                "a list of capability names",
                v,
            ));
        }
    }

    let call_timeout = Duration::from_secs(timeout_secs.unwrap_or(DEFAULT_CALL_TIMEOUT.as_secs()));
    Ok(PluginSpec {
        id: id.to_owned(),
        // A microapp reports its version in `initialize` (server_version).
        version: "0.0.0".to_owned(),
        dialect: Dialect::Microapp,
        dir,
        manifest_path: path.to_path_buf(),
        command,
        supervisor: SupervisorSpec {
            // Seed: "a child process the daemon launches once at boot".
            start: StartMode::Eager,
            call_timeout: Some(call_timeout),
            shutdown_timeout: SHUTDOWN_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
            ..SupervisorSpec::default()
        },
        pin_dir: true,
        pinned: Value::Object(raw.clone()),
        microapp: Some(MicroappSpec {
            extension_id: id.to_owned(),
            tool_prefix: tool_prefix(id),
            path: rel.to_owned(),
            entry_file,
            config,
            timeout_secs,
            capabilities,
        }),
        ..PluginSpec::base()
    })
}

fn quote_key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare { k.to_owned() } else { quote(k) }
}

/// Resolves `rel` inside `workspace`: relative, no escape (`..` or a
/// symlink), a regular file, not in the workspace root or `.plugd/`.
fn resolve_entry_path(
    cx: &Cx<'_>,
    rel: &str,
    line: u64,
    workspace: &Path,
) -> Result<PathBuf, ManifestError> {
    let p = Path::new(rel);
    if rel.is_empty() {
        return Err(cx.invalid(
            "path",
            line,
            "is empty; give the microapp's file relative to the workspace, e.g. \"extensions/hello/main.py\"",
        ));
    }
    if p.is_absolute() {
        return Err(cx.invalid(
            "path",
            line,
            format!(
                "{} is absolute; give a path relative to the workspace, e.g. \"extensions/hello/main.py\"",
                quote(rel)
            ),
        ));
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(cx.invalid(
            "path",
            line,
            format!(
                "{} uses \"..\"; keep the microapp inside the workspace and give its path from there",
                quote(rel)
            ),
        ));
    }
    let joined = workspace.join(p);
    let resolved = joined.canonicalize().map_err(|e| {
        cx.invalid(
            "path",
            line,
            format!(
                "{} cannot be resolved ({e}); check that the file exists",
                quote(rel)
            ),
        )
    })?;
    if !resolved.starts_with(workspace) {
        return Err(cx.invalid(
            "path",
            line,
            format!(
                "{} escapes the workspace through a symlink (resolves to {}); put the microapp inside the workspace",
                quote(rel),
                quote(&resolved.display().to_string())
            ),
        ));
    }
    if !resolved.is_file() {
        return Err(cx.invalid(
            "path",
            line,
            format!(
                "{} is not a regular file; point it at the microapp's program",
                quote(rel)
            ),
        ));
    }
    let parent = resolved.parent().unwrap_or(workspace);
    if parent == workspace {
        return Err(cx.invalid(
            "path",
            line,
            format!(
                "{} lies directly in the workspace; the approval covers the microapp's whole directory, so give it its own, e.g. \"extensions/{}/{}\"",
                quote(rel),
                cx.id,
                resolved
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
        ));
    }
    if resolved.starts_with(workspace.join(".plugd")) {
        return Err(cx.invalid(
            "path",
            line,
            format!(
                "{} lies in .plugd/, plugd's own state; put the microapp elsewhere",
                quote(rel)
            ),
        ));
    }
    Ok(resolved)
}

/// `.py` → `python3 FILE`, `.js` → `node FILE`, `.sh` → `bash FILE`, anything
/// else must be executable and is run directly.
fn command_for(
    cx: &Cx<'_>,
    rel: &str,
    line: u64,
    file: &Path,
) -> Result<CommandSpec, ManifestError> {
    let interpreter = match file.extension().and_then(|e| e.to_str()) {
        Some("py") => Some("python3"),
        Some("js") => Some("node"),
        Some("sh") => Some("bash"),
        _ => None,
    };
    let file_s = file.display().to_string();
    match interpreter {
        Some(i) => Ok(CommandSpec {
            program: i.to_owned(),
            args: vec![file_s],
            env: BTreeMap::new(),
        }),
        None => {
            let mode = std::fs::metadata(file)
                .map(|m| m.permissions().mode())
                .unwrap_or(0);
            if mode & 0o111 == 0 {
                return Err(cx.invalid(
                    "path",
                    line,
                    format!(
                        "{} is not executable; run `chmod +x` on it, or use a .py, .js or .sh file (run with python3, node or bash)",
                        quote(rel)
                    ),
                ));
            }
            Ok(CommandSpec {
                program: file_s,
                args: Vec::new(),
                env: BTreeMap::new(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Ws {
        tmp: tempfile::TempDir,
    }

    impl Ws {
        fn new() -> Ws {
            let ws = Ws {
                tmp: tempfile::tempdir().unwrap(),
            };
            ws.file("extensions/hello/main.py", "print()\n");
            ws
        }
        fn dir(&self) -> PathBuf {
            self.tmp.path().canonicalize().unwrap()
        }
        fn file(&self, rel: &str, text: &str) {
            let p = self.tmp.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        fn load(&self, yaml: &str) -> Result<Vec<Result<PluginSpec, EntryError>>, ManifestError> {
            self.file(EXTENSIONS_FILE, yaml);
            load_extensions(self.tmp.path(), &LoadOptions::default())
        }
        /// The one entry's error text.
        fn entry_err(&self, yaml: &str) -> String {
            let mut r = self.load(yaml).unwrap();
            assert_eq!(r.len(), 1);
            match r.pop().unwrap() {
                Ok(spec) => panic!("expected an error, got {spec:?}"),
                Err(e) => e.error.to_string(),
            }
        }
    }

    #[test]
    fn a_full_entry_becomes_a_spec() {
        let ws = Ws::new();
        let r = ws
            .load(
                "entries:\n  agent-creator:\n    path: extensions/hello/main.py\n    config: {model: small, n: 2}\n    timeout_secs: 7\n    capabilities: [agents_crud, dispatch_outbound, agents_crud]\n",
            )
            .unwrap();
        let spec = r.into_iter().next().unwrap().unwrap();
        assert_eq!(spec.id, "agent-creator");
        assert_eq!(spec.dialect, Dialect::Microapp);
        assert_eq!(spec.dir, ws.dir().join("extensions/hello"));
        assert_eq!(spec.manifest_path, ws.dir().join(EXTENSIONS_FILE));
        assert_eq!(spec.command.program, "python3");
        assert_eq!(
            spec.command.args,
            [ws.dir()
                .join("extensions/hello/main.py")
                .display()
                .to_string()]
        );
        assert_eq!(spec.supervisor.call_timeout, Some(Duration::from_secs(7)));
        assert_eq!(spec.supervisor.start, StartMode::Eager);
        assert_eq!(spec.supervisor.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(spec.supervisor.shutdown_grace, Duration::from_secs(5));
        assert!(spec.pin_dir);
        assert_eq!(spec.pinned["config"]["model"], "small");
        assert_eq!(spec.pinned["capabilities"][2], "agents_crud");
        let m = spec.microapp.unwrap();
        assert_eq!(m.tool_prefix, "agent_creator_");
        assert_eq!(m.config, serde_json::json!({"model": "small", "n": 2}));
        assert_eq!(
            m.capabilities,
            [Capability::DispatchOutbound, Capability::AgentsCrud]
        );
    }

    #[test]
    fn defaults_and_interpreters() {
        let ws = Ws::new();
        ws.file("extensions/n/app.js", "");
        ws.file("extensions/b/app.sh", "");
        ws.file("extensions/x/app", "#!/bin/sh\n");
        std::fs::set_permissions(
            ws.tmp.path().join("extensions/x/app"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let r = ws
            .load("entries:\n  hello: {path: extensions/hello/main.py}\n  n: {path: extensions/n/app.js}\n  b: {path: ./extensions/b/app.sh}\n  x: {path: extensions/x/app}\n")
            .unwrap();
        let specs: Vec<PluginSpec> = r.into_iter().map(Result::unwrap).collect();
        let by = |id: &str| specs.iter().find(|s| s.id == id).unwrap();
        assert_eq!(
            by("hello").supervisor.call_timeout,
            Some(DEFAULT_CALL_TIMEOUT)
        );
        assert_eq!(
            by("hello").microapp.as_ref().unwrap().config,
            serde_json::json!({})
        );
        assert_eq!(by("n").command.program, "node");
        assert_eq!(by("b").command.program, "bash");
        assert_eq!(
            by("x").command.program,
            ws.dir().join("extensions/x/app").display().to_string()
        );
    }

    #[test]
    fn a_bad_entry_is_reported_by_name_and_the_good_ones_still_load() {
        let ws = Ws::new();
        let r = ws
            .load("entries:\n  good: {path: extensions/hello/main.py}\n  bad: {path: extensions/nope.py}\n  worse: 5\n")
            .unwrap();
        assert_eq!(r.len(), 3);
        let good = r.iter().filter(|e| e.is_ok()).count();
        assert_eq!(good, 1);
        let errs: Vec<&EntryError> = r.iter().filter_map(|e| e.as_ref().err()).collect();
        let bad = errs.iter().find(|e| e.name == "bad").unwrap();
        assert!(
            bad.error.to_string().contains("entries.bad.path"),
            "{}",
            bad.error
        );
        assert!(
            bad.error.to_string().contains("cannot be resolved"),
            "{}",
            bad.error
        );
        let worse = errs.iter().find(|e| e.name == "worse").unwrap();
        let t = worse.error.to_string();
        assert!(
            t.contains("entries.worse") && t.contains("found a number") && t.contains("(line 4)"),
            "{t}"
        );
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let ws = Ws::new();
        let t = ws
            .entry_err("entries:\n  hello:\n    path: extensions/hello/main.py\n    timeout: 3\n");
        assert!(t.contains("entries.hello.timeout"), "{t}");
        assert!(t.contains("unknown key \"timeout\""), "{t}");
        assert!(t.contains("(line 4)"), "{t}");
        assert!(
            t.contains("expected one of: path, config, timeout_secs, capabilities"),
            "{t}"
        );

        // At the top of the document, the whole file is refused with a line.
        let e = ws.load("entries: {}\nextras: 1\n").unwrap_err().to_string();
        assert!(e.contains("extras") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn wrong_types_are_refused() {
        let ws = Ws::new();
        for (yaml, want) in [
            (
                "entries:\n  hello: {path: 5}\n",
                "entries.hello.path: expected a string, found a number",
            ),
            (
                "entries:\n  hello: {path: extensions/hello/main.py, timeout_secs: \"10\"}\n",
                "entries.hello.timeout_secs: expected a whole number of seconds, found a string",
            ),
            (
                "entries:\n  hello: {path: extensions/hello/main.py, timeout_secs: 1.5}\n",
                "1.5 is not a whole number",
            ),
            (
                "entries:\n  hello: {path: extensions/hello/main.py, timeout_secs: 0}\n",
                "0 is out of range",
            ),
            (
                "entries:\n  hello: {path: extensions/hello/main.py, timeout_secs: -3}\n",
                "entries.hello.timeout_secs",
            ),
            (
                "entries:\n  hello: {path: extensions/hello/main.py, capabilities: agents_crud}\n",
                "entries.hello.capabilities: expected a list of capability names, found a string",
            ),
            (
                "entries:\n  hello: {path: extensions/hello/main.py, capabilities: [true]}\n",
                "entries.hello.capabilities[0]: expected a capability name (a string), found a boolean",
            ),
            (
                "entries:\n  hello: [a]\n",
                "entries.hello: expected a mapping",
            ),
            (
                "entries:\n  hello: {}\n",
                "entries.hello.path: required key is missing",
            ),
        ] {
            let t = ws.entry_err(yaml);
            assert!(t.contains(want), "{yaml:?}: {t}");
        }
        // `entries` itself must be a mapping: the file is refused.
        let e = ws.load("entries: [1, 2]\n").unwrap_err().to_string();
        assert!(e.contains("invalid extensions.yaml"), "{e}");
    }

    #[test]
    fn unknown_capabilities_list_the_known_ones() {
        let ws = Ws::new();
        let t = ws.entry_err(
            "entries:\n  hello:\n    path: extensions/hello/main.py\n    capabilities: [agents_crud, root_shell]\n",
        );
        assert!(
            t.contains("entries.hello.capabilities[1]: unknown capability \"root_shell\""),
            "{t}"
        );
        assert!(t.contains("known capabilities: dispatch_outbound, agents_crud, credentials_crud, pairing_initiate, llm_keys_crud, channels_crud, transcripts_subscribe"), "{t}");
    }

    #[test]
    fn ids_are_checked() {
        let ws = Ws::new();
        for id in ["Hello", "1abc", "a b", "hé", "-x", &"a".repeat(65)] {
            let t = ws.entry_err(&format!(
                "entries:\n  \"{id}\": {{path: extensions/hello/main.py}}\n"
            ));
            assert!(t.contains("is not a valid extension id"), "{id}: {t}");
        }
        let r = ws
            .load("entries:\n  a-b_1: {path: extensions/hello/main.py}\n")
            .unwrap();
        assert!(r[0].is_ok());
        // Ids that only differ by - and _ would share a tool prefix.
        let r = ws
            .load("entries:\n  a-b: {path: extensions/hello/main.py}\n  a_b: {path: extensions/hello/main.py}\n")
            .unwrap();
        for e in &r {
            let t = e.as_ref().unwrap_err().error.to_string();
            assert!(t.contains("shares the tool prefix \"a_b_\""), "{t}");
        }
    }

    #[test]
    fn traversal_absolute_paths_and_symlinks_out_are_refused() {
        let ws = Ws::new();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("evil.py"), "").unwrap();
        std::fs::create_dir_all(ws.tmp.path().join("extensions/link")).unwrap();
        symlink(
            outside.path().join("evil.py"),
            ws.tmp.path().join("extensions/link/main.py"),
        )
        .unwrap();
        symlink(outside.path(), ws.tmp.path().join("extensions/dirlink")).unwrap();
        ws.file(".plugd/x/app.py", "");
        ws.file("top.py", "");
        let abs = outside.path().join("evil.py").display().to_string();
        for (path, want) in [
            ("../evil.py", "uses \"..\""),
            ("extensions/../../evil.py", "uses \"..\""),
            (abs.as_str(), "is absolute"),
            (
                "extensions/link/main.py",
                "escapes the workspace through a symlink",
            ),
            (
                "extensions/dirlink/evil.py",
                "escapes the workspace through a symlink",
            ),
            ("extensions/hello", "is not a regular file"),
            ("top.py", "lies directly in the workspace"),
            (".plugd/x/app.py", "lies in .plugd/"),
            ("", "is empty"),
        ] {
            let t = ws.entry_err(&format!("entries:\n  hello: {{path: \"{path}\"}}\n"));
            assert!(
                t.contains(want) && t.contains("entries.hello.path"),
                "{path}: {t}"
            );
        }
    }

    #[test]
    fn a_program_without_an_interpreter_must_be_executable() {
        let ws = Ws::new();
        ws.file("extensions/x/app", "");
        let t = ws.entry_err("entries:\n  x: {path: extensions/x/app}\n");
        assert!(t.contains("is not executable; run `chmod +x`"), "{t}");
    }

    #[test]
    fn malformed_yaml_is_refused_with_a_line() {
        let ws = Ws::new();
        let e = ws
            .load("entries:\n  hello: {path: [\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid extensions.yaml") && e.contains("line "),
            "{e}"
        );
        let e = ws
            .load("entries:\n  a: {path: extensions/hello/main.py}\n  a: {path: extensions/hello/main.py}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "duplicate keys are refused: {e}");
        let e = ws.load("- 1\n- 2\n").unwrap_err().to_string();
        assert!(e.contains("invalid extensions.yaml"), "{e}");
        // Empty files and empty entries declare nothing.
        assert!(ws.load("").unwrap().is_empty());
        assert!(ws.load("entries: {}\n").unwrap().is_empty());
        assert!(ws.load("# nothing yet\n").unwrap().is_empty());
    }

    #[test]
    fn oversized_and_non_utf8_files_are_refused() {
        let ws = Ws::new();
        let big = format!(
            "# {}\nentries: {{}}\n",
            "x".repeat(MAX_MANIFEST_BYTES as usize)
        );
        let e = ws.load(&big).unwrap_err();
        assert!(matches!(e, ManifestError::TooLarge { .. }), "{e}");
        std::fs::write(ws.tmp.path().join(EXTENSIONS_FILE), b"entries: \xff\n").unwrap();
        let e = load_extensions(ws.tmp.path(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, ManifestError::NotUtf8 { offset: 9, .. }), "{e}");
    }

    #[test]
    fn alias_bombs_are_bounded() {
        let ws = Ws::new();
        let mut y = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            y.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        y.push_str("entries: {}\n");
        // Refused (unknown top keys or the budget), and quickly.
        let t = std::time::Instant::now();
        assert!(ws.load(&y).is_err());
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn no_file_means_no_entries() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(
            load_extensions(tmp.path(), &LoadOptions::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn tool_prefixes() {
        assert_eq!(tool_prefix("hello"), "hello_");
        assert!(tool_in_extension("hello", "hello_world_greet"));
        assert!(tool_in_extension("hello_world", "hello_world_greet"));
        assert!(tool_in_extension("hello-world", "hello_world_greet"));
        assert!(!tool_in_extension("greeter", "hello_world_greet"));
    }
}

#[cfg(test)]
const PROP_EXTENSIONS: &str = "entries:
  agent-creator:
    path: extensions/hello/main.py
    config: {model: small, n: 2}
    timeout_secs: 7
    capabilities: [agents_crud, dispatch_outbound, agents_crud]
  other:
    path: extensions/hello/main.py
";

#[cfg(test)]
mod props {
    use super::*;
    use crate::tests::{apply, mutation};
    use proptest::prelude::*;

    #[test]
    fn the_base_document_is_valid() {
        let ws = tempfile::tempdir().unwrap();
        let dir = ws.path().canonicalize().unwrap();
        std::fs::create_dir_all(dir.join("extensions/hello")).unwrap();
        std::fs::write(dir.join("extensions/hello/main.py"), "print()\n").unwrap();
        let entries = parse_extensions(PROP_EXTENSIONS, &dir.join(EXTENSIONS_FILE), &dir).unwrap();
        assert!(entries.iter().all(Result::is_ok), "{entries:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn parse_never_panics_on_arbitrary_strings(s in any::<String>()) {
            let ws = tempfile::tempdir().unwrap();
            let dir = ws.path().canonicalize().unwrap();
            std::fs::create_dir_all(dir.join("extensions/hello")).unwrap();
            std::fs::write(dir.join("extensions/hello/main.py"), "print()\n").unwrap();
            let parse = |t: &str| parse_extensions(t, &dir.join(EXTENSIONS_FILE), &dir);
            if let Err(e) = parse(&s) {
                let _ = e.to_string();
            }
        }

        #[test]
        fn parse_never_panics_on_mutated_documents(
            base in proptest::sample::select(vec![PROP_EXTENSIONS]),
            muts in proptest::collection::vec(mutation(), 1..6),
        ) {
            let ws = tempfile::tempdir().unwrap();
            let dir = ws.path().canonicalize().unwrap();
            std::fs::create_dir_all(dir.join("extensions/hello")).unwrap();
            std::fs::write(dir.join("extensions/hello/main.py"), "print()\n").unwrap();
            let parse = |t: &str| parse_extensions(t, &dir.join(EXTENSIONS_FILE), &dir);
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
