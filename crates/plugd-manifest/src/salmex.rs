//! The salmex dialect's manifest form: Salmex I/O `plugin.json` (seed 004).
//!
//! A Salmex plugin lives in `DIR/.plugins/<name>/` with a `plugin.json` at its
//! root. The JSON is walked by hand (like the native loader walks TOML) so that
//! every error names the exact field (`capabilities.tools[1].risk_level`).
//! Unknown keys are tolerated with a warning (forward compatibility); a known
//! key with the wrong type is refused.
//!
//! The plugin's `name` is its id, and its tools are namespaced
//! `<name>/<tool>`: `hello-salmex-node/say_hello` is what `plugd tool list`
//! shows and `plugd tool call` accepts, `say_hello` is what goes on the wire.
//!
//! **Why one file** (~970 product lines): the Salmex model (`SalmexSpec`,
//! `ConfigField`, `SelectOption`) and its field-by-field reader (`Cx`) change
//! together, one field and one dotted-path error at a time, following the
//! seed's one section; most of the length is the settings-schema rules the
//! seed gives (types, `select` options, `show_when`).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::quote;
use crate::sandbox::resolve_path;
use crate::spec::{CommandSpec, DeclaredTool, Dialect, StartMode, SupervisorSpec};
use crate::toml_fields::join;
use crate::{LoadOptions, MAX_MANIFEST_BYTES, ManifestError, PluginSpec};

/// The file this dialect is declared in.
pub const SALMEX_MANIFEST_FILE: &str = "plugin.json";

/// The only protocol version of the Salmex plugin protocol (`protocolVersion`).
pub const SALMEX_PROTOCOL_VERSION: &str = "1.0";

/// Interpreters a manifest may name; `""` means a compiled binary.
pub const SALMEX_INTERPRETERS: &[&str] = &["node", "python3", "deno", "bash", "sh"];

/// Tool risk levels, least to most dangerous.
pub const RISK_LEVELS: &[&str] = &["low", "medium", "high", "critical"];

/// Config field types of the `config` schema.
pub const CONFIG_TYPES: &[&str] = &["string", "secret", "boolean", "integer", "number", "select"];

/// Longest plugin name (id) accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Longest tool name accepted.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// How long the host waits for the process to exit after the `shutdown`
/// notification before it kills the process group.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// How long sending the `shutdown` notification may take (no reply comes).
pub const SHUTDOWN_SEND_TIMEOUT: Duration = Duration::from_millis(200);

const TOP_KEYS: &[&str] = &[
    "name",
    "version",
    "description",
    "author",
    "license",
    "protocolVersion",
    "interpreter",
    "main",
    "eager",
    "capabilities",
    "config",
    "skills",
];
const CAPABILITY_KEYS: &[&str] = &["tools"];
const TOOL_KEYS: &[&str] = &["name", "description", "parameters", "risk_level"];
const CONFIG_KEYS: &[&str] = &["properties"];
const FIELD_KEYS: &[&str] = &[
    "key",
    "type",
    "label",
    "description",
    "default",
    "required",
    "options",
    "group",
    "show_when",
];
const OPTION_KEYS: &[&str] = &["value", "label"];

/// The salmex-specific rest of a `plugin.json` (what [`PluginSpec`] has no
/// dialect-neutral home for). Tools are in [`PluginSpec::tools`].
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct SalmexSpec {
    /// `protocolVersion`; always [`SALMEX_PROTOCOL_VERSION`].
    pub protocol_version: String,
    /// `interpreter`: one of [`SALMEX_INTERPRETERS`], or `None` for a
    /// compiled binary (`""` in the manifest).
    pub interpreter: Option<String>,
    /// `main`: the entrypoint, relative to the plugin directory, after
    /// resolving symlinks (always inside the directory).
    pub main: PathBuf,
    /// `eager`: start right after approval instead of on first use.
    pub eager: bool,
    /// `author`, free text.
    pub author: Option<String>,
    /// `license`, free text (usually an SPDX id).
    pub license: Option<String>,
    /// `config.properties`: the settings the owner provides, in manifest order.
    pub config: Vec<ConfigField>,
    /// `skills`: whether the host should scan the plugin's `.skills/` directory.
    pub skills: bool,
}

impl SalmexSpec {
    /// The configuration sent in `initialize` until owner-provided values
    /// exist: every field's `default`, by key (fields without one are left out).
    pub fn default_config(&self) -> Value {
        Value::Object(
            self.config
                .iter()
                .filter_map(|f| f.default.clone().map(|d| (f.key.clone(), d)))
                .collect(),
        )
    }
}

/// Whether a field with `show_when` is shown (and so, if required, needed)
/// given the effective `config`. A field without `show_when` is always shown.
pub fn show_when_holds(show_when: Option<&Value>, config: &Map<String, Value>) -> bool {
    let Some(Value::Object(cond)) = show_when else {
        return true;
    };
    cond.iter().all(|(k, c)| {
        let v = config.get(k);
        let empty = match v {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Bool(b)) => !b,
            _ => false,
        };
        match c {
            Value::Array(opts) => v.is_some_and(|v| opts.contains(v)),
            Value::Object(op) => match op.iter().next() {
                Some((n, x)) if n == "equals" => v == Some(x),
                Some((n, x)) if n == "not_equals" => v != Some(x),
                Some((n, Value::Array(opts))) if n == "in" => v.is_some_and(|v| opts.contains(v)),
                Some((n, Value::Bool(want))) if n == "not_empty" => *want != empty,
                _ => true,
            },
            lit => v == Some(lit),
        }
    })
}

/// One field of the `config` schema.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigField {
    /// `key`: the name the plugin receives the value under; unique.
    pub key: String,
    /// `type`: one of [`CONFIG_TYPES`].
    #[serde(rename = "type")]
    pub kind: String,
    /// `label` for the settings form.
    pub label: Option<String>,
    /// `description` for the settings form.
    pub description: Option<String>,
    /// `default`, already checked against `type` (and `options`).
    pub default: Option<Value>,
    /// `required`: the plugin needs a value before its first tool call.
    pub required: bool,
    /// `options` of a `select` field (empty for other types).
    pub options: Vec<SelectOption>,
    /// `group`: the collapsible section the field belongs to.
    pub group: Option<String>,
    /// `show_when`: conditional visibility, kept as written (an object).
    pub show_when: Option<Value>,
}

/// One choice of a `select` config field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SelectOption {
    /// `value` sent to the plugin.
    pub value: String,
    /// `label` shown to the owner (the value when absent).
    pub label: Option<String>,
}

/// Returns true when `s` is a valid Salmex plugin name: 1-64 characters of
/// `a-z`, `0-9` and `-`, starting with a letter or digit, not ending with `-`.
///
/// ```
/// use plugd_manifest::salmex::is_valid_salmex_name;
/// assert!(is_valid_salmex_name("hello-node"));
/// assert!(!is_valid_salmex_name("Hello"));
/// assert!(!is_valid_salmex_name("a/b"));
/// assert!(!is_valid_salmex_name("-x"));
/// ```
pub fn is_valid_salmex_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// Returns true when `s` is a valid tool name: 1-64 characters of ASCII
/// letters, digits, `_`, `-` and `.`, starting with a letter or digit. A `/`
/// is never allowed: it separates the plugin name from the tool name.
pub fn is_valid_tool_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_TOOL_NAME_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
}

/// The name `plugd tool call` accepts for tool `tool` of plugin `plugin`.
pub fn namespaced_tool(plugin: &str, tool: &str) -> String {
    format!("{plugin}/{tool}")
}

/// Reads and validates `plugin.json` at `manifest_path` into a [`PluginSpec`].
///
/// Refuses files over [`MAX_MANIFEST_BYTES`], non-regular files and non-UTF-8
/// text. The plugin directory is the manifest's parent, canonicalized.
pub fn load_salmex(manifest_path: &Path, opts: &LoadOptions) -> Result<PluginSpec, ManifestError> {
    let (text, dir) = crate::read::read_manifest(manifest_path)?;
    let canonical_manifest = dir.join(SALMEX_MANIFEST_FILE);
    parse_salmex(&text, &canonical_manifest, &dir, opts)
}

/// Parses and validates `plugin.json` text. `dir` must be the canonical
/// plugin directory: `main` is resolved against it and must stay inside it.
pub fn parse_salmex(
    text: &str,
    manifest_path: &Path,
    dir: &Path,
    opts: &LoadOptions,
) -> Result<PluginSpec, ManifestError> {
    let _ = opts;
    let mut cx = Cx {
        path: manifest_path,
        warnings: Vec::new(),
    };
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge {
            path: manifest_path.to_path_buf(),
            size: text.len() as u64,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    let root: Value = serde_json::from_str(text).map_err(|e| ManifestError::Invalid {
        path: manifest_path.to_path_buf(),
        field: format!("line {}, column {}", e.line(), e.column()),
        message: format!("invalid JSON: {e}; fix the syntax at that position"),
    })?;
    let root = cx.object(&root, "(top level)")?;
    cx.check_guarded_keys(root, "", TOP_KEYS)?;

    let name = cx.required_string(root, "", "name")?;
    if !is_valid_salmex_name(name) {
        return Err(cx.invalid(
            "name",
            format!(
                "{} is not a valid plugin name; use 1-{MAX_NAME_LEN} characters of a-z, 0-9 and '-', not starting or ending with '-' (e.g. \"hello-node\")",
                quote(name)
            ),
        ));
    }
    if let Some(dir_name) = dir.file_name().and_then(|n| n.to_str())
        && dir_name != name
    {
        cx.warnings.push(format!(
            "name: {} differs from the plugin directory name {}; Salmex expects .plugins/<name>/",
            quote(name),
            quote(dir_name)
        ));
    }
    let version = cx.required_string(root, "", "version")?;
    if let Err(e) = semver::Version::parse(version) {
        return Err(cx.invalid(
            "version",
            format!(
                "{} is not a semver version ({e}); use MAJOR.MINOR.PATCH, e.g. \"0.1.0\"",
                quote(version)
            ),
        ));
    }
    let protocol = cx.required_string(root, "", "protocolVersion")?;
    if protocol != SALMEX_PROTOCOL_VERSION {
        return Err(cx.invalid(
            "protocolVersion",
            format!(
                "{} is not supported; this host speaks protocol \"{SALMEX_PROTOCOL_VERSION}\"",
                quote(protocol)
            ),
        ));
    }
    let description = cx.optional_string(root, "", "description")?;
    let author = cx.optional_string(root, "", "author")?;
    let license = cx.optional_string(root, "", "license")?;
    let interpreter = cx.required_string(root, "", "interpreter")?;
    if !interpreter.is_empty() && !SALMEX_INTERPRETERS.contains(&interpreter) {
        return Err(cx.invalid(
            "interpreter",
            format!(
                "{} is not a supported interpreter; use one of {} or \"\" for a compiled binary",
                quote(interpreter),
                SALMEX_INTERPRETERS
                    .iter()
                    .map(|i| format!("\"{i}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let main_raw = cx.required_string(root, "", "main")?;
    let main = cx.main(main_raw, dir, interpreter.is_empty())?;
    let eager = cx.optional_bool(root, "", "eager")?.unwrap_or(false);
    let skills = cx.optional_bool(root, "", "skills")?.unwrap_or(false);
    if skills && !dir.join(".skills").is_dir() {
        cx.warnings.push(
            "skills: true but the plugin has no .skills/ directory; add one or set skills to false"
                .to_owned(),
        );
    }
    let tools = cx.tools(root, name)?;
    let config = cx.config(root)?;

    let main_arg = main.to_string_lossy().into_owned();
    let command = match interpreter {
        "" => CommandSpec {
            program: dir.join(&main).to_string_lossy().into_owned(),
            ..CommandSpec::default()
        },
        // `deno main.ts` is not a command; Deno scripts run with `deno run`.
        "deno" => CommandSpec {
            program: "deno".to_owned(),
            args: vec!["run".to_owned(), main_arg],
            ..CommandSpec::default()
        },
        other => CommandSpec {
            program: other.to_owned(),
            args: vec![main_arg],
            ..CommandSpec::default()
        },
    };
    let supervisor = SupervisorSpec {
        start: if eager {
            StartMode::Eager
        } else {
            StartMode::Lazy
        },
        shutdown_timeout: SHUTDOWN_SEND_TIMEOUT,
        shutdown_grace: SHUTDOWN_GRACE,
        ..SupervisorSpec::default()
    };

    Ok(PluginSpec {
        id: name.to_owned(),
        version: version.to_owned(),
        name: Some(name.to_owned()),
        description: description.map(str::to_owned),
        dialect: Dialect::Salmex,
        dir: dir.to_path_buf(),
        manifest_path: manifest_path.to_path_buf(),
        command,
        declared_tools: tools.iter().map(|t| t.name.clone()).collect(),
        supervisor,
        tools,
        salmex: Some(SalmexSpec {
            protocol_version: protocol.to_owned(),
            interpreter: (!interpreter.is_empty()).then(|| interpreter.to_owned()),
            main,
            eager,
            author: author.map(str::to_owned),
            license: license.map(str::to_owned),
            config,
            skills,
        }),
        warnings: cx.warnings,
        ..PluginSpec::base()
    })
}

/// Validation context: the manifest path (for errors) and collected warnings.
struct Cx<'a> {
    path: &'a Path,
    warnings: Vec<String>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Cx<'_> {
    fn invalid(&self, field: impl Into<String>, message: impl Into<String>) -> ManifestError {
        ManifestError::Invalid {
            path: self.path.to_path_buf(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn missing(&self, field: String) -> ManifestError {
        ManifestError::MissingField {
            path: self.path.to_path_buf(),
            field,
        }
    }

    fn wrong_type(&self, field: &str, expected: &str, v: &Value) -> ManifestError {
        self.invalid(
            field,
            format!(
                "expected {expected}, found {}; change the value's type",
                type_name(v)
            ),
        )
    }

    /// [`Cx::check_keys`] for a section where a key named like a
    /// containment section (`sandbox`, `limits`, `permissions` or a
    /// misspelling) could be mistaken for one: such a key is refused.
    fn check_guarded_keys(
        &mut self,
        obj: &Map<String, Value>,
        prefix: &str,
        allowed: &[&str],
    ) -> Result<(), ManifestError> {
        for key in obj.keys() {
            if !allowed.contains(&key.as_str())
                && let Some(meant) = crate::guarded::near_containment(key)
            {
                return Err(crate::guarded::refused(
                    self.path,
                    &join(prefix, key),
                    key,
                    meant,
                ));
            }
        }
        self.check_keys(obj, prefix, allowed);
        Ok(())
    }

    /// Unknown keys are warnings: a newer Salmex may add keys.
    fn check_keys(&mut self, obj: &Map<String, Value>, prefix: &str, allowed: &[&str]) {
        for key in obj.keys() {
            if !allowed.contains(&key.as_str()) {
                self.warnings.push(format!(
                    "{}: unknown key ignored (it may be meant for a newer host); remove it or fix its spelling",
                    join(prefix, key)
                ));
            }
        }
    }

    fn object<'v>(
        &self,
        v: &'v Value,
        field: &str,
    ) -> Result<&'v Map<String, Value>, ManifestError> {
        v.as_object()
            .ok_or_else(|| self.wrong_type(field, "an object", v))
    }

    fn string<'v>(&self, v: &'v Value, field: &str) -> Result<&'v str, ManifestError> {
        let s = v
            .as_str()
            .ok_or_else(|| self.wrong_type(field, "a string", v))?;
        if s.contains('\0') {
            return Err(self.invalid(
                field,
                format!("{} contains a NUL byte; remove it", quote(s)),
            ));
        }
        Ok(s)
    }

    fn required_string<'v>(
        &self,
        obj: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v str, ManifestError> {
        let field = join(prefix, key);
        match obj.get(key) {
            Some(v) => self.string(v, &field),
            None => Err(self.missing(field)),
        }
    }

    fn optional_string<'v>(
        &self,
        obj: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v str>, ManifestError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => self.string(v, &join(prefix, key)).map(Some),
        }
    }

    fn optional_bool(
        &self,
        obj: &Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<bool>, ManifestError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong_type(&join(prefix, key), "a boolean", v)),
        }
    }

    /// `main`: relative, inside `dir` after resolving `..` and symlinks, an
    /// existing file (executable when there is no interpreter). Returns the
    /// path relative to `dir`.
    fn main(&self, main: &str, dir: &Path, compiled: bool) -> Result<PathBuf, ManifestError> {
        const F: &str = "main";
        let fix = "use a relative path to a file inside the plugin directory, e.g. \"main.js\"";
        if main.trim().is_empty() {
            return Err(self.invalid(F, format!("main is empty; {fix}")));
        }
        let p = Path::new(main);
        if p.is_absolute() {
            return Err(self.invalid(F, format!("{} is an absolute path; {fix}", quote(main))));
        }
        // Refuse lexical escapes before touching the filesystem.
        let mut depth: i64 = 0;
        for c in p.components() {
            match c {
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => depth = -1,
            }
            if depth < 0 {
                return Err(ManifestError::CommandEscapesPluginDir {
                    path: self.path.to_path_buf(),
                    field: F.to_owned(),
                    command: main.to_owned(),
                    resolved: dir.join(p),
                });
            }
        }
        let joined = dir.join(p);
        let Some(resolved) = resolve_path(&joined) else {
            return Err(self.invalid(F, format!("{} is a symlink loop; {fix}", quote(main))));
        };
        let dir_resolved = resolve_path(dir).unwrap_or_else(|| dir.to_path_buf());
        let Ok(rel) = resolved.strip_prefix(&dir_resolved) else {
            return Err(ManifestError::CommandEscapesPluginDir {
                path: self.path.to_path_buf(),
                field: F.to_owned(),
                command: main.to_owned(),
                resolved,
            });
        };
        let rel = rel.to_path_buf();
        let meta = std::fs::metadata(&resolved)
            .map_err(|e| self.invalid(F, format!("{} cannot be read ({e}); {fix}", quote(main))))?;
        if !meta.is_file() || rel.as_os_str().is_empty() {
            return Err(self.invalid(F, format!("{} is not a file; {fix}", quote(main))));
        }
        if compiled {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o111 == 0 {
                return Err(self.invalid(
                    F,
                    format!(
                        "{} is not executable and no interpreter is set; run `chmod +x {}` or set \"interpreter\"",
                        quote(main),
                        main
                    ),
                ));
            }
        }
        Ok(rel)
    }

    fn tools(
        &mut self,
        root: &Map<String, Value>,
        plugin: &str,
    ) -> Result<Vec<DeclaredTool>, ManifestError> {
        let Some(caps) = root.get("capabilities") else {
            return Err(self.missing("capabilities".to_owned()));
        };
        let caps = self.object(caps, "capabilities")?;
        self.check_guarded_keys(caps, "capabilities", CAPABILITY_KEYS)?;
        let Some(list) = caps.get("tools") else {
            return Err(self.missing("capabilities.tools".to_owned()));
        };
        let list = list.as_array().ok_or_else(|| {
            self.wrong_type("capabilities.tools", "an array of tool objects", list)
        })?;
        let mut out: Vec<DeclaredTool> = Vec::new();
        for (i, item) in list.iter().enumerate() {
            let prefix = format!("capabilities.tools[{i}]");
            let t = self.object(item, &prefix)?;
            self.check_keys(t, &prefix, TOOL_KEYS);
            let name = self.required_string(t, &prefix, "name")?;
            if !is_valid_tool_name(name) {
                return Err(self.invalid(
                    format!("{prefix}.name"),
                    format!(
                        "{} is not a valid tool name; use 1-{MAX_TOOL_NAME_LEN} characters of letters, digits, '_', '-' and '.', starting with a letter or digit (no '/': the host adds \"{plugin}/\")",
                        quote(name)
                    ),
                ));
            }
            if let Some(first) = out.iter().position(|d| d.wire_name == name) {
                return Err(self.invalid(
                    format!("{prefix}.name"),
                    format!(
                        "tool {} is declared twice (first at capabilities.tools[{first}]); remove the duplicate",
                        quote(name)
                    ),
                ));
            }
            let description = self.optional_string(t, &prefix, "description")?;
            let schema = match t.get("parameters") {
                None | Some(Value::Null) => serde_json::json!({"type": "object"}),
                Some(v @ Value::Object(obj)) => {
                    if let Some(ty) = obj.get("type")
                        && ty != "object"
                    {
                        return Err(self.invalid(
                            format!("{prefix}.parameters.type"),
                            format!(
                                "{ty} is not \"object\"; tool arguments are always a JSON object, so the schema must describe one"
                            ),
                        ));
                    }
                    v.clone()
                }
                Some(v) => {
                    return Err(self.wrong_type(
                        &format!("{prefix}.parameters"),
                        "a JSON Schema object",
                        v,
                    ));
                }
            };
            let risk_field = format!("{prefix}.risk_level");
            let risk = match t.get("risk_level") {
                None => return Err(self.missing(risk_field)),
                Some(v) => self.string(v, &risk_field)?,
            };
            if !RISK_LEVELS.contains(&risk) {
                return Err(self.invalid(
                    risk_field,
                    format!(
                        "{} is not a risk level; use \"low\", \"medium\", \"high\" or \"critical\"",
                        quote(risk)
                    ),
                ));
            }
            out.push(DeclaredTool {
                name: namespaced_tool(plugin, name),
                wire_name: name.to_owned(),
                description: description.unwrap_or_default().to_owned(),
                input_schema: schema,
                risk_level: Some(risk.to_owned()),
            });
        }
        Ok(out)
    }

    fn config(&mut self, root: &Map<String, Value>) -> Result<Vec<ConfigField>, ManifestError> {
        let Some(config) = root.get("config") else {
            return Ok(Vec::new());
        };
        if config.is_null() {
            return Ok(Vec::new());
        }
        let config = self.object(config, "config")?;
        self.check_keys(config, "config", CONFIG_KEYS);
        let Some(props) = config.get("properties") else {
            return Ok(Vec::new());
        };
        let props = props.as_array().ok_or_else(|| {
            self.wrong_type("config.properties", "an array of field objects", props)
        })?;
        let mut out: Vec<ConfigField> = Vec::new();
        for (i, item) in props.iter().enumerate() {
            let prefix = format!("config.properties[{i}]");
            let f = self.object(item, &prefix)?;
            self.check_keys(f, &prefix, FIELD_KEYS);
            let key = self.required_string(f, &prefix, "key")?;
            let key_ok = !key.is_empty()
                && key.len() <= 64
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !key_ok {
                return Err(self.invalid(
                    format!("{prefix}.key"),
                    format!(
                        "{} is not a valid config key; use 1-64 characters of letters, digits, '_', '-' and '.'",
                        quote(key)
                    ),
                ));
            }
            if let Some(first) = out.iter().position(|c| c.key == key) {
                return Err(self.invalid(
                    format!("{prefix}.key"),
                    format!(
                        "config key {} is declared twice (first at config.properties[{first}]); remove the duplicate",
                        quote(key)
                    ),
                ));
            }
            let kind = self.required_string(f, &prefix, "type")?;
            if !CONFIG_TYPES.contains(&kind) {
                return Err(self.invalid(
                    format!("{prefix}.type"),
                    format!(
                        "{} is not a config type; use one of {}",
                        quote(kind),
                        CONFIG_TYPES
                            .iter()
                            .map(|t| format!("\"{t}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            let label = self.optional_string(f, &prefix, "label")?;
            let description = self.optional_string(f, &prefix, "description")?;
            let group = self.optional_string(f, &prefix, "group")?;
            let required = self.optional_bool(f, &prefix, "required")?.unwrap_or(false);
            let show_when = match f.get("show_when") {
                None | Some(Value::Null) => None,
                Some(v @ Value::Object(_)) => Some(v.clone()),
                Some(v) => {
                    return Err(self.wrong_type(&format!("{prefix}.show_when"), "an object", v));
                }
            };
            let options = self.options(f, &prefix, kind)?;
            let default = match f.get("default") {
                None | Some(Value::Null) => None,
                Some(v) => Some(self.default_value(v, &prefix, kind, &options)?),
            };
            out.push(ConfigField {
                key: key.to_owned(),
                kind: kind.to_owned(),
                label: label.map(str::to_owned),
                description: description.map(str::to_owned),
                default,
                required,
                options,
                group: group.map(str::to_owned),
                show_when,
            });
        }
        for (i, f) in out.iter().enumerate() {
            if let Some(Value::Object(cond)) = &f.show_when {
                self.check_show_when(i, f, cond, &out)?;
            }
        }
        Ok(out)
    }

    /// `show_when` maps other config keys to a condition: a value (equal
    /// to), an array (one of), or `{"equals": v}`, `{"not_equals": v}`,
    /// `{"in": [..]}`, `{"not_empty": bool}`.
    fn check_show_when(
        &self,
        i: usize,
        f: &ConfigField,
        cond: &Map<String, Value>,
        all: &[ConfigField],
    ) -> Result<(), ManifestError> {
        let prefix = format!("config.properties[{i}].show_when");
        if cond.is_empty() {
            return Err(self.invalid(prefix, "is empty; name the key it depends on or remove it"));
        }
        for (k, c) in cond {
            let field = join(&prefix, k);
            if k == &f.key {
                return Err(self.invalid(
                    field,
                    format!("{} cannot depend on itself; name another key", quote(k)),
                ));
            }
            if !all.iter().any(|o| &o.key == k) {
                return Err(self.invalid(
                    field,
                    format!(
                        "names {}, which is not a config key; use one of {}",
                        quote(k),
                        all.iter()
                            .filter(|o| o.key != f.key)
                            .map(|o| quote(&o.key))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            if let Value::Object(op) = c {
                let ok = op.len() == 1
                    && match op.iter().next() {
                        Some((name, v)) => match name.as_str() {
                            "equals" | "not_equals" => true,
                            "in" => v.is_array(),
                            "not_empty" => v.is_boolean(),
                            _ => false,
                        },
                        None => false,
                    };
                if !ok {
                    return Err(self.invalid(
                        field,
                        "use a value, an array of values, or one of {\"equals\": v}, {\"not_equals\": v}, {\"in\": [..]}, {\"not_empty\": true|false}",
                    ));
                }
            }
        }
        Ok(())
    }

    fn options(
        &mut self,
        f: &Map<String, Value>,
        prefix: &str,
        kind: &str,
    ) -> Result<Vec<SelectOption>, ManifestError> {
        let field = format!("{prefix}.options");
        let Some(v) = f.get("options").filter(|v| !v.is_null()) else {
            if kind == "select" {
                return Err(self.missing(field));
            }
            return Ok(Vec::new());
        };
        if kind != "select" {
            return Err(self.invalid(
                field,
                format!(
                    "options only apply to \"select\" fields, this one is {}; remove them",
                    quote(kind)
                ),
            ));
        }
        let arr = v
            .as_array()
            .ok_or_else(|| self.wrong_type(&field, "an array of {value, label} objects", v))?;
        if arr.is_empty() {
            return Err(self.invalid(field, "a select field needs at least one option; add one"));
        }
        let mut out: Vec<SelectOption> = Vec::new();
        for (i, item) in arr.iter().enumerate() {
            let p = format!("{field}[{i}]");
            let o = self.object(item, &p)?;
            self.check_keys(o, &p, OPTION_KEYS);
            let value = self.required_string(o, &p, "value")?;
            if out.iter().any(|x| x.value == value) {
                return Err(self.invalid(
                    format!("{p}.value"),
                    format!(
                        "option {} is listed twice; remove the duplicate",
                        quote(value)
                    ),
                ));
            }
            let label = self.optional_string(o, &p, "label")?;
            out.push(SelectOption {
                value: value.to_owned(),
                label: label.map(str::to_owned),
            });
        }
        Ok(out)
    }

    fn default_value(
        &self,
        v: &Value,
        prefix: &str,
        kind: &str,
        options: &[SelectOption],
    ) -> Result<Value, ManifestError> {
        let field = format!("{prefix}.default");
        let ok = match kind {
            "secret" => {
                return Err(self.invalid(
                    field,
                    "a secret field cannot have a default (it would ship in plain text); remove it",
                ));
            }
            "string" => v.is_string(),
            "boolean" => v.is_boolean(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "select" => {
                let Some(s) = v.as_str() else {
                    return Err(self.wrong_type(&field, "a string (one of the options)", v));
                };
                if !options.iter().any(|o| o.value == s) {
                    return Err(self.invalid(
                        field,
                        format!(
                            "{} is not one of the options ({}); use one of them",
                            quote(s),
                            options
                                .iter()
                                .map(|o| quote(&o.value))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
                true
            }
            _ => false,
        };
        if !ok {
            let expected = match kind {
                "string" => "a string",
                "boolean" => "a boolean",
                "integer" => "an integer",
                _ => "a number",
            };
            return Err(self.invalid(
                field,
                format!(
                    "expected {expected} for a {kind:?} field, found {}; change the default",
                    type_name(v)
                ),
            ));
        }
        Ok(v.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NODE_JS: &str = "process.stdin.resume();\n";

    /// A plugin directory with `plugin.json` = `manifest` and a `main.js`.
    fn plugin(manifest: &Value) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("hello-node");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.js"), NODE_JS).unwrap();
        let path = dir.join(SALMEX_MANIFEST_FILE);
        std::fs::write(&path, serde_json::to_vec_pretty(manifest).unwrap()).unwrap();
        (tmp, path)
    }

    fn seed() -> Value {
        json!({
            "name": "hello-node",
            "version": "0.1.0",
            "description": "A minimal Node.js plugin",
            "author": "Your Name",
            "license": "MIT",
            "protocolVersion": "1.0",
            "interpreter": "node",
            "main": "main.js",
            "eager": false,
            "capabilities": {"tools": [{
                "name": "say_hello",
                "description": "Greet someone by name",
                "risk_level": "low",
                "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
            }]}
        })
    }

    fn load(m: &Value) -> Result<PluginSpec, ManifestError> {
        let (_tmp, path) = plugin(m);
        load_salmex(&path, &LoadOptions::default())
    }

    fn err(m: &Value) -> String {
        load(m).unwrap_err().to_string()
    }

    fn with(mut m: Value, pointer: &str, v: Value) -> Value {
        *m.pointer_mut(pointer).unwrap() = v;
        m
    }

    #[test]
    fn the_seed_manifest_loads() {
        let spec = load(&seed()).unwrap();
        assert_eq!(spec.id, "hello-node");
        assert_eq!(spec.dialect, Dialect::Salmex);
        assert_eq!(spec.command.program, "node");
        assert_eq!(spec.command.args, ["main.js"]);
        assert_eq!(spec.supervisor.start, StartMode::Lazy);
        assert_eq!(spec.supervisor.shutdown_grace, SHUTDOWN_GRACE);
        assert_eq!(spec.tools.len(), 1);
        let t = &spec.tools[0];
        assert_eq!(t.name, "hello-node/say_hello");
        assert_eq!(t.wire_name, "say_hello");
        assert_eq!(t.risk_level.as_deref(), Some("low"));
        assert_eq!(spec.declared_tools, ["hello-node/say_hello"]);
        let s = spec.salmex.unwrap();
        assert_eq!(s.author.as_deref(), Some("Your Name"));
        assert_eq!(s.interpreter.as_deref(), Some("node"));
        assert!(spec.warnings.is_empty(), "{:?}", spec.warnings);
    }

    #[test]
    fn keys_named_like_containment_sections_are_refused() {
        for key in ["sandbox", "sandbx", "permissions", "permision", "limits"] {
            let mut m = seed();
            m[key] = json!({"enabled": true});
            let e = err(&m);
            assert!(
                e.contains(&format!("{key}: ")) && e.contains("containment"),
                "{key}: {e}"
            );
        }
        let mut m = seed();
        m["capabilities"]["permissions"] = json!(["fs"]);
        assert!(err(&m).contains("capabilities.permissions"));
        // Other unknown keys stay warnings.
        let mut m = seed();
        m["homepage"] = json!("x");
        assert!(load(&m).is_ok());
    }

    #[test]
    fn eager_and_config_schema_are_kept() {
        let mut m = with(seed(), "/eager", json!(true));
        m["config"] = json!({"properties": [
            {"key": "api_key", "type": "secret", "label": "API Key", "required": true},
            {"key": "units", "type": "select", "label": "Units", "default": "metric",
             "options": [{"value": "metric", "label": "Metric"}, {"value": "imperial", "label": "Imperial"}],
             "group": "Display", "show_when": {"api_key": {"not_empty": true}}},
            {"key": "greeting", "type": "string", "default": "Hello"},
            {"key": "retries", "type": "integer", "default": 3}
        ]});
        let spec = load(&m).unwrap();
        assert_eq!(spec.supervisor.start, StartMode::Eager);
        let s = spec.salmex.unwrap();
        assert_eq!(s.config.len(), 4);
        assert!(s.config[0].required);
        assert_eq!(s.config[1].options.len(), 2);
        assert_eq!(s.config[1].group.as_deref(), Some("Display"));
        assert!(s.config[1].show_when.is_some());
        assert_eq!(
            s.default_config(),
            json!({"units": "metric", "greeting": "Hello", "retries": 3})
        );
    }

    #[test]
    fn unknown_keys_warn_but_load() {
        let mut m = seed();
        m["homepage"] = json!("https://example.invalid");
        m["capabilities"]["tools"][0]["annotations"] = json!({});
        let spec = load(&m).unwrap();
        assert!(
            spec.warnings
                .iter()
                .any(|w| w.starts_with("homepage: unknown key")),
            "{:?}",
            spec.warnings
        );
        assert!(
            spec.warnings
                .iter()
                .any(|w| w.starts_with("capabilities.tools[0].annotations: unknown key")),
            "{:?}",
            spec.warnings
        );
    }

    #[test]
    fn malformed_json_names_the_position() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(SALMEX_MANIFEST_FILE);
        std::fs::write(&path, "{\n  \"name\": \"x\",\n  oops\n}").unwrap();
        let e = load_salmex(&path, &LoadOptions::default()).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("line 3, column 3: invalid JSON"), "{text}");
        let e = parse_salmex("[1, 2]", &path, tmp.path(), &LoadOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains("expected an object, found an array"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_are_refused_naming_the_field() {
        for (pointer, value, field, fragment) in [
            (
                "/name",
                json!(3),
                "name",
                "expected a string, found a number",
            ),
            ("/version", json!(1), "version", "expected a string"),
            (
                "/eager",
                json!("yes"),
                "eager",
                "expected a boolean, found a string",
            ),
            (
                "/author",
                json!({"name": "x"}),
                "author",
                "expected a string, found an object",
            ),
            (
                "/capabilities",
                json!([]),
                "capabilities",
                "expected an object",
            ),
            (
                "/capabilities/tools",
                json!({}),
                "capabilities.tools",
                "expected an array",
            ),
            (
                "/capabilities/tools/0/parameters",
                json!("object"),
                "capabilities.tools[0].parameters",
                "expected a JSON Schema object",
            ),
            (
                "/capabilities/tools/0/risk_level",
                json!(1),
                "capabilities.tools[0].risk_level",
                "expected a string",
            ),
            (
                "/capabilities/tools/0/name",
                json!(null),
                "capabilities.tools[0].name",
                "expected a string, found null",
            ),
        ] {
            let e = load(&with(seed(), pointer, value)).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(e.to_string().contains(fragment), "{e}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_a_fix() {
        for (pointer, value, fragment) in [
            ("/name", json!("Hello_Node"), "is not a valid plugin name"),
            ("/name", json!("evil/../x"), "is not a valid plugin name"),
            ("/version", json!("1.0"), "is not a semver version"),
            ("/protocolVersion", json!("2.0"), "\"2.0\" is not supported"),
            (
                "/interpreter",
                json!("ruby"),
                "\"ruby\" is not a supported interpreter",
            ),
            (
                "/capabilities/tools/0/risk_level",
                json!("extreme"),
                "\"extreme\" is not a risk level",
            ),
            (
                "/capabilities/tools/0/name",
                json!("other/say_hello"),
                "is not a valid tool name",
            ),
            (
                "/capabilities/tools/0/parameters/type",
                json!("string"),
                "tool arguments are always a JSON object",
            ),
        ] {
            let text = err(&with(seed(), pointer, value));
            assert!(text.contains(fragment), "{pointer}: {text}");
        }
        let mut m = seed();
        m.as_object_mut().unwrap().remove("interpreter");
        assert!(err(&m).contains("interpreter: required key is missing"));
        let mut m = seed();
        m["capabilities"]["tools"][0]
            .as_object_mut()
            .unwrap()
            .remove("risk_level");
        assert!(err(&m).contains("capabilities.tools[0].risk_level: required key is missing"));
        let mut m = seed();
        let t = m["capabilities"]["tools"][0].clone();
        m["capabilities"]["tools"] = json!([t.clone(), t]);
        assert!(err(&m).contains("declared twice"));
    }

    #[test]
    fn config_schema_errors() {
        for (props, fragment) in [
            (
                json!([{"key": "k", "type": "color"}]),
                "\"color\" is not a config type",
            ),
            (
                json!([{"key": "k", "type": "select"}]),
                "options: required key is missing",
            ),
            (
                json!([{"key": "k", "type": "select", "options": [{"value": "a"}], "default": "b"}]),
                "\"b\" is not one of the options",
            ),
            (
                json!([{"key": "k", "type": "integer", "default": 1.5}]),
                "expected an integer",
            ),
            (
                json!([{"key": "k", "type": "secret", "default": "hunter2"}]),
                "cannot have a default",
            ),
            (
                json!([{"key": "k", "type": "string"}, {"key": "k", "type": "string"}]),
                "declared twice",
            ),
            (
                json!([{"key": "k", "type": "string", "options": []}]),
                "only apply to \"select\"",
            ),
            (
                json!([{"key": "k", "type": "boolean", "required": "yes"}]),
                "config.properties[0].required: expected a boolean",
            ),
            (
                json!([{"key": "k", "type": "string", "show_when": "x"}]),
                "show_when: expected an object",
            ),
            (
                json!([{"key": "k", "type": "string", "show_when": {"mode": "x"}}]),
                "names \"mode\", which is not a config key",
            ),
            (
                json!([{"key": "k", "type": "string", "show_when": {"k": "x"}}]),
                "cannot depend on itself",
            ),
            (
                json!([{"key": "m", "type": "string"},
                       {"key": "k", "type": "string", "show_when": {"m": {"like": "x"}}}]),
                "config.properties[1].show_when.m: use a value",
            ),
        ] {
            let mut m = seed();
            m["config"] = json!({"properties": props});
            let text = err(&m);
            assert!(text.contains(fragment), "{props}: {text}");
        }
    }

    #[test]
    fn main_must_stay_inside_the_plugin_directory() {
        // Traversal.
        let text = err(&with(seed(), "/main", json!("../../bin/sh")));
        assert!(
            text.contains("main: \"../../bin/sh\" escapes the plugin directory"),
            "{text}"
        );
        let text = err(&with(seed(), "/main", json!("sub/../../x.js")));
        assert!(text.contains("escapes the plugin directory"), "{text}");
        // Absolute.
        let text = err(&with(seed(), "/main", json!("/usr/bin/node")));
        assert!(text.contains("is an absolute path"), "{text}");
        // Missing and empty.
        assert!(err(&with(seed(), "/main", json!("nope.js"))).contains("cannot be read"));
        assert!(err(&with(seed(), "/main", json!(""))).contains("main is empty"));
        assert!(err(&with(seed(), "/main", json!("."))).contains("is not a file"));
        // A symlink that escapes.
        let (tmp, path) = plugin(&with(seed(), "/main", json!("link.js")));
        let outside = tmp.path().join("outside.js");
        std::fs::write(&outside, NODE_JS).unwrap();
        std::os::unix::fs::symlink(&outside, path.parent().unwrap().join("link.js")).unwrap();
        let e = load_salmex(&path, &LoadOptions::default()).unwrap_err();
        assert!(
            matches!(e, ManifestError::CommandEscapesPluginDir { .. }),
            "{e}"
        );
        // A symlink that stays inside is fine and resolved.
        let (_tmp, path) = plugin(&with(seed(), "/main", json!("inner.js")));
        std::os::unix::fs::symlink("main.js", path.parent().unwrap().join("inner.js")).unwrap();
        let spec = load_salmex(&path, &LoadOptions::default()).unwrap();
        assert_eq!(spec.command.args, ["main.js"]);
    }

    #[test]
    fn a_compiled_binary_runs_main_itself_and_must_be_executable() {
        let (_tmp, path) = plugin(&with(seed(), "/interpreter", json!("")));
        let e = load_salmex(&path, &LoadOptions::default()).unwrap_err();
        assert!(e.to_string().contains("is not executable"), "{e}");
        use std::os::unix::fs::PermissionsExt;
        let main = path.parent().unwrap().join("main.js");
        std::fs::set_permissions(&main, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spec = load_salmex(&path, &LoadOptions::default()).unwrap();
        assert_eq!(
            spec.command.program,
            main.canonicalize().unwrap().to_string_lossy()
        );
        assert!(spec.command.args.is_empty());
        assert!(spec.salmex.unwrap().interpreter.is_none());
    }

    #[test]
    fn oversized_and_non_utf8_manifests_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(SALMEX_MANIFEST_FILE);
        let mut big = seed();
        big["description"] = json!("x".repeat(MAX_MANIFEST_BYTES as usize));
        std::fs::write(&path, serde_json::to_vec(&big).unwrap()).unwrap();
        let e = load_salmex(&path, &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, ManifestError::TooLarge { .. }), "{e}");
        std::fs::write(&path, b"{\"name\": \"\xff\"}").unwrap();
        let e = load_salmex(&path, &LoadOptions::default()).unwrap_err();
        assert!(
            matches!(e, ManifestError::NotUtf8 { offset: 10, .. }),
            "{e}"
        );
    }

    #[test]
    fn deno_runs_with_deno_run() {
        let spec = load(&with(seed(), "/interpreter", json!("deno"))).unwrap();
        assert_eq!(spec.command.program, "deno");
        assert_eq!(spec.command.args, ["run", "main.js"]);
    }
}

#[cfg(test)]
const PROP_SALMEX: &str = r#"{
  "name": "hello-node",
  "version": "0.1.0",
  "description": "A minimal Node.js plugin",
  "protocolVersion": "1.0",
  "interpreter": "node",
  "main": "main.js",
  "eager": false,
  "config": {"properties": [
    {"key": "units", "type": "select", "label": "Units", "default": "metric",
     "options": [{"value": "metric", "label": "Metric"}]}
  ]},
  "capabilities": {"tools": [{
    "name": "say_hello",
    "description": "Greet someone by name",
    "risk_level": "low",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
  }]}
}"#;

#[cfg(test)]
mod props {
    use super::*;
    use crate::tests::{apply, mutation};
    use proptest::prelude::*;

    #[test]
    fn the_base_document_is_valid() {
        let ws = tempfile::tempdir().unwrap();
        let dir = ws.path().canonicalize().unwrap().join("hello-node");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.js"), "process.stdin.resume();\n").unwrap();
        parse_salmex(
            PROP_SALMEX,
            &dir.join(SALMEX_MANIFEST_FILE),
            &dir,
            &LoadOptions::default(),
        )
        .unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn parse_never_panics_on_arbitrary_strings(s in any::<String>()) {
            let ws = tempfile::tempdir().unwrap();
            let dir = ws.path().canonicalize().unwrap().join("hello-node");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("main.js"), "process.stdin.resume();\n").unwrap();
            let opts = LoadOptions::default();
            let parse = |t: &str| parse_salmex(t, &dir.join(SALMEX_MANIFEST_FILE), &dir, &opts);
            if let Err(e) = parse(&s) {
                let _ = e.to_string();
            }
        }

        #[test]
        fn parse_never_panics_on_mutated_documents(
            base in proptest::sample::select(vec![PROP_SALMEX]),
            muts in proptest::collection::vec(mutation(), 1..6),
        ) {
            let ws = tempfile::tempdir().unwrap();
            let dir = ws.path().canonicalize().unwrap().join("hello-node");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("main.js"), "process.stdin.resume();\n").unwrap();
            let opts = LoadOptions::default();
            let parse = |t: &str| parse_salmex(t, &dir.join(SALMEX_MANIFEST_FILE), &dir, &opts);
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
