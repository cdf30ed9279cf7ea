//! The VAI dialect's manifest form: reading and validating a VAI gateway package's `vai-plugin.toml` (seed 003).
//!
//! A package lives in `DIR/.plugins/<name>/` with `vai-plugin.toml` at its
//! root, its binaries and its JSON schema files. The package id (`acme/devkit`)
//! is the plugd plugin id; every `kind = "tool"` export becomes a
//! [`DeclaredTool`] named `<package_id>/<export_id>` whose wire name is the
//! export id. Hook, compactor and harness exports are kept in [`VaiSpec`].
//!
//! Like the native loader, the TOML is walked by hand so every error names the
//! dotted field (`exports[1].tool.input_schema`). Unknown keys are refused in
//! every section except the top level, where they are tolerated with a
//! warning. Every file the manifest names (schemas, the entrypoint) must
//! resolve inside the package after `..` and symlinks are resolved.
//!
//! **Why one file** (~1,150 product lines): the VAI manifest model
//! (`VaiSpec`, exports, permissions, execution classes, process roles) and
//! its field-by-field reader (`Cx`) change together: every model field has
//! exactly one reader with its dotted-path error, and both follow the seed's
//! one section. The shared reading helpers are already apart
//! (`toml_fields.rs`, `read.rs`, `guarded.rs`).

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use toml::Table;

use crate::error::quote;
use crate::toml_fields::{Fields, Unknown, join, syntax_error};
use crate::{
    CommandSpec, DeclaredTool, Dialect, LoadOptions, MAX_MANIFEST_BYTES, ManifestError, PluginSpec,
    SupervisorSpec, resolve_path,
};

/// The file this dialect is declared in.
pub const VAI_MANIFEST_FILE: &str = "vai-plugin.toml";
/// The only `api_version` understood.
pub const VAI_API_VERSION: &str = "vai.plugin.v1";
/// The only `[runtime] protocol` understood.
pub const VAI_PROTOCOL: &str = "vai.rpc.v1";
/// The only `[runtime] transport` understood.
pub const VAI_TRANSPORT: &str = "stdio";
/// Largest schema file read (1 MiB).
pub const MAX_SCHEMA_BYTES: u64 = 1024 * 1024;
/// Most exports in one package.
pub const MAX_EXPORTS: usize = 256;
/// Largest `max_concurrency`.
pub const MAX_CONCURRENCY: u32 = 1024;

const ROOT_KEYS: &[&str] = &[
    "api_version",
    "package_id",
    "version",
    "name",
    "description",
    "license",
    "source",
    "runtime",
    "exports",
];
const RUNTIME_KEYS: &[&str] = &["protocol", "transport", "entrypoint", "os", "arch"];
const EXPORT_KEYS: &[&str] = &[
    "id",
    "kind",
    "display_name",
    "description",
    "execution_class",
    "default_timeout_ms",
    "max_concurrency",
    "config_schema",
    "permissions",
    "tool",
    "hook",
    "compactor",
    "harness",
];
const PERMISSION_KEYS: &[&str] = &[
    "network",
    "filesystem",
    "gateway_api_scopes",
    "secret_slots",
];
const TOOL_KEYS: &[&str] = &["effect_class", "streaming", "input_schema", "output_schema"];
const HOOK_KEYS: &[&str] = &["subscribes_to"];
const COMPACTOR_KEYS: &[&str] = &["target_context", "supports_pinned_items"];
const HARNESS_KEYS: &[&str] = &["mode", "fidelity", "supports"];

/// The VAI-specific rest of a package declaration: everything in
/// `vai-plugin.toml` that has no dialect-neutral home in [`PluginSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct VaiSpec {
    /// `api_version`: always [`VAI_API_VERSION`].
    pub api_version: String,
    /// `package_id`, e.g. `acme/devkit` (also [`PluginSpec::id`]).
    pub package_id: String,
    /// `license`, an SPDX expression as written.
    pub license: Option<String>,
    /// `source`, e.g. `oci://ghcr.io/acme/devkit:0.1.0`.
    pub source: Option<String>,
    /// `[runtime]`.
    pub runtime: VaiRuntime,
    /// `[[exports]]`, in manifest order.
    pub exports: Vec<VaiExport>,
    /// Which of the package's processes this spec starts (set by the host
    /// for each process group it runs, never read from the manifest); `None`
    /// is the package's `worker` process.
    #[serde(skip)]
    pub process: Option<ProcessRole>,
}

impl VaiSpec {
    /// The export with id `id`.
    pub fn export(&self, id: &str) -> Option<&VaiExport> {
        self.exports.iter().find(|e| e.id == id)
    }
}

/// The process group a process of a VAI package runs as: `worker` (the
/// package's shared process), or `isolated:<export>` (one export alone),
/// optionally for one invocation only, whose scratch directory is then the
/// only writable one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessRole {
    /// `worker` or `isolated:<export>`.
    pub group: String,
    /// The one invocation's scratch directory, for a process started for a
    /// single invocation; `None` for a long-lived process.
    pub scratch: Option<PathBuf>,
}

/// The name of a package's shared process group.
pub const WORKER_GROUP: &str = "worker";

/// The prefix of an isolated export's process group (`isolated:<export>`).
pub const ISOLATED_PREFIX: &str = "isolated:";

impl ProcessRole {
    /// The package's shared `worker` process.
    pub fn worker() -> ProcessRole {
        ProcessRole {
            group: WORKER_GROUP.to_owned(),
            scratch: None,
        }
    }

    /// The isolated export this process serves alone, if it does.
    pub fn isolated_export(&self) -> Option<&str> {
        self.group.strip_prefix(ISOLATED_PREFIX)
    }
}

impl PluginSpec {
    /// The process group this spec starts (`None`: not a VAI package).
    pub fn process_role(&self) -> Option<ProcessRole> {
        let v = self.vai.as_ref()?;
        Some(v.process.clone().unwrap_or_else(ProcessRole::worker))
    }

    /// This spec as started for `role` (a VAI package's process group).
    pub fn for_process(&self, role: ProcessRole) -> PluginSpec {
        let mut out = self.clone();
        if let Some(v) = out.vai.as_mut() {
            v.process = Some(role);
        }
        out
    }
}

/// `[runtime]`: how the package runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct VaiRuntime {
    /// `protocol`: always [`VAI_PROTOCOL`].
    pub protocol: String,
    /// `transport`: always [`VAI_TRANSPORT`].
    pub transport: String,
    /// `entrypoint`: the program (a path inside the package or a bare
    /// program name) and its arguments, as written.
    pub entrypoint: Vec<String>,
    /// `os`: Go-style OS names the package is built for (`linux`, `darwin`);
    /// empty = any.
    pub os: Vec<String>,
    /// `arch`: Go-style architectures (`amd64`, `arm64`); empty = any.
    pub arch: Vec<String>,
}

/// What an export is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportKind {
    /// An orchestration program (`harness.run`).
    Harness,
    /// A result-producing function (`tool.invoke`).
    Tool,
    /// An async event handler (`hook.handle`).
    Hook,
    /// A chain-seed transform (`compactor.compact`).
    Compactor,
}

impl ExportKind {
    /// The kind as written in the manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportKind::Harness => "harness",
            ExportKind::Tool => "tool",
            ExportKind::Hook => "hook",
            ExportKind::Compactor => "compactor",
        }
    }

    /// The seed's default execution class: isolated for harnesses and tools,
    /// worker for hooks and compactors.
    pub fn default_class(self) -> ExecutionClass {
        match self {
            ExportKind::Harness | ExportKind::Tool => ExecutionClass::Isolated,
            ExportKind::Hook | ExportKind::Compactor => ExecutionClass::Worker,
        }
    }
}

/// Where an export runs (`execution_class`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionClass {
    /// Trusted first-party or tightly reviewed code.
    Inline,
    /// Background on gateway workers.
    Worker,
    /// The isolated execution plane.
    Isolated,
}

/// `[exports.permissions] network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPermission {
    /// No network (the default).
    #[default]
    None,
    /// Outbound network.
    Egress,
}

/// `[exports.permissions] filesystem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FilesystemPermission {
    /// No filesystem access (the default).
    #[default]
    None,
    /// Write access inside the invocation scratch directory only.
    Scratch,
    /// Read-only package assets.
    AssetsRo,
}

/// `[exports.permissions]`: what the export asks for (the host may grant less).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Permissions {
    /// `network`; default none.
    pub network: NetworkPermission,
    /// `filesystem`; default none.
    pub filesystem: FilesystemPermission,
    /// `gateway_api_scopes`: delegated API scopes, `resource:action`.
    pub gateway_api_scopes: Vec<String>,
    /// `secret_slots`: operator-bindable secret names.
    pub secret_slots: Vec<String>,
}

/// `[exports.tool] effect_class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EffectClass {
    /// No side effects.
    ReadOnly,
    /// Writes that are safe to repeat.
    IdempotentWrite,
    /// Writes that are not safe to repeat.
    NonIdempotentWrite,
    /// Not declared (the default).
    #[default]
    Unknown,
}

/// `[exports.tool]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolExport {
    /// `effect_class`; default unknown.
    pub effect_class: EffectClass,
    /// `streaming`; default false.
    pub streaming: bool,
    /// `input_schema`: the schema file as written (`None`: any object).
    pub input_schema: Option<String>,
    /// `output_schema`: the schema file as written.
    pub output_schema: Option<String>,
    /// The output schema itself (read from that file when the manifest was
    /// loaded): what `structured_output` must match, and the tool's MCP
    /// `outputSchema` in the gateway.
    #[serde(skip)]
    pub output_schema_json: Option<serde_json::Value>,
}

/// `[exports.hook]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookExport {
    /// `subscribes_to`: semantic event types, e.g. `run.completed`.
    pub subscribes_to: Vec<String>,
}

/// `[exports.compactor]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct CompactorExport {
    /// `target_context`, e.g. `coding`.
    pub target_context: Option<String>,
    /// `supports_pinned_items`; default false.
    pub supports_pinned_items: bool,
}

/// `[exports.harness] fidelity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fidelity {
    /// Full replay.
    Lossless,
    /// Resume from checkpoints.
    Checkpoint,
    /// Replay the prompts.
    PromptReplay,
    /// Reseed from a summary.
    SummaryReseed,
}

/// `[exports.harness]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HarnessExport {
    /// `mode`, e.g. `composite`.
    pub mode: Option<String>,
    /// `fidelity`.
    pub fidelity: Option<Fidelity>,
    /// `supports`: operations, e.g. `continue`, `branch_session`.
    pub supports: Vec<String>,
}

/// One `[[exports]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VaiExport {
    /// `id`, unique in the package (the wire name of a tool).
    pub id: String,
    /// `kind`.
    pub kind: ExportKind,
    /// `display_name`.
    pub display_name: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// `execution_class`; defaults per kind ([`ExportKind::default_class`]).
    pub execution_class: ExecutionClass,
    /// `default_timeout_ms`: the invocation deadline unless the caller's is
    /// shorter; `None` = the host's.
    #[serde(rename = "default_timeout_ms", serialize_with = "ser_opt_ms")]
    pub default_timeout: Option<Duration>,
    /// `max_concurrency`: invocations of this export at once; `None` = no limit.
    pub max_concurrency: Option<u32>,
    /// `config_schema`: the schema file as written (checked to exist and be JSON).
    pub config_schema: Option<String>,
    /// `[exports.permissions]`.
    pub permissions: Permissions,
    /// `[exports.tool]` (kind tool only).
    pub tool: Option<ToolExport>,
    /// `[exports.hook]` (kind hook only).
    pub hook: Option<HookExport>,
    /// `[exports.compactor]` (kind compactor only).
    pub compactor: Option<CompactorExport>,
    /// `[exports.harness]` (kind harness only).
    pub harness: Option<HarnessExport>,
}

fn ser_opt_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

/// This host's OS in the manifest's (Go-style) vocabulary: Rust's `macos`
/// is `darwin`.
pub fn host_os() -> &'static str {
    go_os(std::env::consts::OS)
}

/// This host's architecture in the manifest's vocabulary: Rust's `x86_64`
/// is `amd64`, `aarch64` is `arm64`.
pub fn host_arch() -> &'static str {
    go_arch(std::env::consts::ARCH)
}

fn go_os(rust: &'static str) -> &'static str {
    match rust {
        "macos" => "darwin",
        other => other,
    }
}

fn go_arch(rust: &'static str) -> &'static str {
    match rust {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

/// Reads and validates `vai-plugin.toml` at `manifest_path` into a [`PluginSpec`].
///
/// Refuses files over [`MAX_MANIFEST_BYTES`], non-regular files and non-UTF-8
/// text; the package directory is the manifest's parent, canonicalized.
pub fn load_vai(manifest_path: &Path, opts: &LoadOptions) -> Result<PluginSpec, ManifestError> {
    let (text, dir) = crate::read::read_manifest(manifest_path)?;
    let canonical_manifest = dir.join(VAI_MANIFEST_FILE);
    parse_vai(&text, &canonical_manifest, &dir, opts)
}

/// Parses and validates manifest `text` for the package in `dir` (canonical).
/// Reads the filesystem to resolve the entrypoint and to load schema files.
pub fn parse_vai(
    text: &str,
    manifest_path: &Path,
    dir: &Path,
    opts: &LoadOptions,
) -> Result<PluginSpec, ManifestError> {
    let _ = opts;
    let mut cx = Cx {
        f: Fields::new(manifest_path, true),
        dir,
    };
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge {
            path: manifest_path.to_path_buf(),
            size: text.len() as u64,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    let root: Table = toml::from_str(text).map_err(|e| syntax_error(manifest_path, text, &e))?;
    cx.check_keys(&root, "", ROOT_KEYS, Unknown::Warn)?;

    let api_version = cx.required_string(&root, "", "api_version")?;
    if api_version != VAI_API_VERSION {
        return Err(cx.invalid(
            "api_version",
            format!(
                "{} is not supported; use \"{VAI_API_VERSION}\"",
                quote(api_version)
            ),
        ));
    }
    let package_id = cx.required_string(&root, "", "package_id")?;
    if !is_valid_package_id(package_id) {
        return Err(cx.invalid(
            "package_id",
            format!(
                "{} is not a valid package id; use \"<publisher>/<name>\" with 1-64 characters of a-z, 0-9, '.', '_' and '-' on each side, each starting with a letter or digit (e.g. \"acme/devkit\")",
                quote(package_id)
            ),
        ));
    }
    let version = cx.required_string(&root, "", "version")?;
    if let Err(e) = semver::Version::parse(version) {
        return Err(cx.invalid(
            "version",
            format!(
                "{} is not a semver version ({e}); use MAJOR.MINOR.PATCH, e.g. \"0.1.0\"",
                quote(version)
            ),
        ));
    }
    let name = cx.optional_string(&root, "", "name")?;
    let description = cx.optional_string(&root, "", "description")?;
    let license = cx.optional_string(&root, "", "license")?;
    let source = cx.optional_string(&root, "", "source")?;

    let (runtime, command) = cx.runtime(&root)?;
    let exports = cx.exports(&root)?;

    let mut tools = Vec::new();
    for (i, export) in exports.iter().enumerate() {
        let Some(tool) = &export.tool else { continue };
        let input_schema = match &tool.input_schema {
            Some(file) => {
                let field = format!("exports[{i}].tool.input_schema");
                cx.load_schema(&field, file)?
            }
            None => serde_json::json!({"type": "object"}),
        };
        tools.push(DeclaredTool {
            name: format!("{package_id}/{}", export.id),
            wire_name: export.id.clone(),
            description: export
                .description
                .clone()
                .or_else(|| export.display_name.clone())
                .unwrap_or_default(),
            input_schema,
            risk_level: None,
        });
    }

    Ok(PluginSpec {
        id: package_id.to_owned(),
        version: version.to_owned(),
        name: name.map(str::to_owned),
        description: description.map(str::to_owned),
        dialect: Dialect::Vai,
        dir: dir.to_path_buf(),
        manifest_path: manifest_path.to_path_buf(),
        command,
        supervisor: SupervisorSpec::default(),
        tools,
        vai: Some(VaiSpec {
            api_version: api_version.to_owned(),
            package_id: package_id.to_owned(),
            license: license.map(str::to_owned),
            source: source.map(str::to_owned),
            runtime,
            exports,
            process: None,
        }),
        warnings: std::mem::take(&mut cx.warnings),
        ..PluginSpec::base()
    })
}

/// `true` for `<publisher>/<name>`, each side 1-64 characters of
/// `a-z0-9._-` starting with a letter or digit.
pub fn is_valid_package_id(s: &str) -> bool {
    let part = |p: &str| {
        let b = p.as_bytes();
        !b.is_empty()
            && b.len() <= 64
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && b.iter().all(|&c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
            })
    };
    matches!(s.split_once('/'), Some((a, b)) if part(a) && part(b))
}

/// `true` for an export id: 1-64 characters of `a-z0-9_-`, starting with a letter.
pub fn is_valid_export_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-'))
}

/// Validation context: the manifest's typed field reader and the package
/// directory.
struct Cx<'a> {
    f: Fields<'a>,
    dir: &'a Path,
}

impl<'a> std::ops::Deref for Cx<'a> {
    type Target = Fields<'a>;
    fn deref(&self) -> &Fields<'a> {
        &self.f
    }
}

impl std::ops::DerefMut for Cx<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.f
    }
}

impl Cx<'_> {
    /// An optional array of strings, each non-empty, with duplicates refused.
    fn unique_strings(
        &self,
        t: &Table,
        prefix: &str,
        key: &str,
    ) -> Result<Vec<String>, ManifestError> {
        let mut out: Vec<String> = Vec::new();
        for (f, s) in self.f.string_list(t, prefix, key)? {
            if s.trim().is_empty() {
                return Err(self.invalid(f, "empty string; remove it or fill it in"));
            }
            if out.iter().any(|o| o == s) {
                return Err(self.invalid(
                    f,
                    format!("{} is listed twice; remove the duplicate", quote(s)),
                ));
            }
            out.push(s.to_owned());
        }
        Ok(out)
    }

    /// A string that must be one of `choices`.
    fn choice<'c>(
        &self,
        field: &str,
        value: &str,
        choices: &[&'c str],
    ) -> Result<&'c str, ManifestError> {
        choices
            .iter()
            .find(|c| **c == value)
            .copied()
            .ok_or_else(|| {
                self.invalid(
                    field,
                    format!(
                        "{} is not allowed; use one of: {}",
                        quote(value),
                        choices
                            .iter()
                            .map(|c| format!("\"{c}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    }

    fn runtime(&mut self, root: &Table) -> Result<(VaiRuntime, CommandSpec), ManifestError> {
        const P: &str = "runtime";
        let t = match root.get(P) {
            Some(v) => self.table(v, P)?,
            None => return Err(self.missing(P.to_owned())),
        };
        self.check_keys(t, P, RUNTIME_KEYS, Unknown::Error)?;
        let protocol = self.required_string(t, P, "protocol")?;
        if protocol != VAI_PROTOCOL {
            return Err(self.invalid(
                "runtime.protocol",
                format!(
                    "{} is not supported; use \"{VAI_PROTOCOL}\"",
                    quote(protocol)
                ),
            ));
        }
        let transport = self.required_string(t, P, "transport")?;
        if transport != VAI_TRANSPORT {
            return Err(self.invalid(
                "runtime.transport",
                format!(
                    "{} is not supported; use \"{VAI_TRANSPORT}\" (the package talks over stdin/stdout)",
                    quote(transport)
                ),
            ));
        }
        let os = self.unique_strings(t, P, "os")?;
        if !os.is_empty() && !os.iter().any(|o| o == host_os()) {
            return Err(self.invalid(
                "runtime.os",
                format!(
                    "the package is built for {os:?}, not for this host's \"{}\"; install a build for \"{}\" or add it to runtime.os if the package supports it",
                    host_os(),
                    host_os()
                ),
            ));
        }
        let arch = self.unique_strings(t, P, "arch")?;
        if !arch.is_empty() && !arch.iter().any(|a| a == host_arch()) {
            return Err(self.invalid(
                "runtime.arch",
                format!(
                    "the package is built for {arch:?}, not for this host's \"{}\"; install a build for \"{}\" or add it to runtime.arch if the package supports it",
                    host_arch(),
                    host_arch()
                ),
            ));
        }

        let field = "runtime.entrypoint";
        let Some(v) = t.get("entrypoint") else {
            return Err(self.missing(field.to_owned()));
        };
        let arr = v.as_array().ok_or_else(|| {
            self.wrong_type(field, "an array of strings like [\"./bin/plugin\"]", v)
        })?;
        let mut entrypoint = Vec::new();
        for (i, item) in arr.iter().enumerate() {
            entrypoint.push(self.string(item, &format!("{field}[{i}]"))?.to_owned());
        }
        let Some(program) = entrypoint.first() else {
            return Err(self.invalid(
                field,
                "the array is empty; put the program first, e.g. [\"./bin/plugin\"] or [\"python3\", \"bin/plugin.py\"]",
            ));
        };
        let f0 = "runtime.entrypoint[0]";
        if program.trim().is_empty() {
            return Err(self.invalid(
                f0,
                "the program is empty; use a path inside the package like \"./bin/plugin\" or a program name like \"python3\"",
            ));
        }
        let program = if Path::new(program).is_absolute() {
            return Err(self.invalid(
                f0,
                format!(
                    "{} is an absolute path; use a path inside the package like \"./bin/plugin\" or a bare program name found in PATH",
                    quote(program)
                ),
            ));
        } else if program.contains('/') {
            let resolved = self.inside(f0, program)?;
            match std::fs::metadata(&resolved) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(self.invalid(
                        f0,
                        format!(
                            "{} is not a regular file; point it at the package's executable",
                            quote(program)
                        ),
                    ));
                }
                Err(e) => {
                    return Err(self.invalid(
                        f0,
                        format!(
                            "{} cannot be read ({e}); ship the executable in the package",
                            quote(program)
                        ),
                    ));
                }
            }
            resolved.display().to_string()
        } else {
            program.clone()
        };
        let command = CommandSpec {
            program,
            args: entrypoint[1..].to_vec(),
            env: Default::default(),
        };
        Ok((
            VaiRuntime {
                protocol: protocol.to_owned(),
                transport: transport.to_owned(),
                entrypoint,
                os,
                arch,
            },
            command,
        ))
    }

    /// Resolves `rel` inside the package: relative, and still inside after
    /// `..` and symlinks are resolved.
    fn inside(&self, field: &str, rel: &str) -> Result<PathBuf, ManifestError> {
        if rel.contains('\0') {
            return Err(self.invalid(
                field,
                format!("{} contains a NUL byte; remove it", quote(rel)),
            ));
        }
        if Path::new(rel).is_absolute() {
            return Err(self.invalid(
                field,
                format!(
                    "{} is an absolute path; use a path inside the package like \"schemas/input.json\"",
                    quote(rel)
                ),
            ));
        }
        let resolved = resolve_path(&self.dir.join(rel)).ok_or_else(|| {
            self.invalid(
                field,
                format!(
                    "{} follows too many symlinks (a loop?); point it at the real file",
                    quote(rel)
                ),
            )
        })?;
        if !resolved.starts_with(self.dir) || resolved == self.dir {
            return Err(self.invalid(
                field,
                format!(
                    "{} escapes the package directory (resolves to {:?}); use a path inside the package",
                    quote(rel),
                    resolved.display().to_string()
                ),
            ));
        }
        Ok(resolved)
    }

    /// Loads a schema file named at `field`: inside the package, a regular
    /// file of at most [`MAX_SCHEMA_BYTES`], JSON.
    fn load_schema(&self, field: &str, rel: &str) -> Result<serde_json::Value, ManifestError> {
        let resolved = self.inside(field, rel)?;
        let meta = std::fs::metadata(&resolved).map_err(|e| {
            self.invalid(
                field,
                format!(
                    "schema file {} cannot be read ({e}); add it to the package",
                    quote(rel)
                ),
            )
        })?;
        if !meta.is_file() {
            return Err(self.invalid(
                field,
                format!(
                    "{} is not a regular file; point it at a JSON schema file",
                    quote(rel)
                ),
            ));
        }
        if meta.len() > MAX_SCHEMA_BYTES {
            return Err(self.invalid(
                field,
                format!(
                    "schema file {} is {} bytes, over the {MAX_SCHEMA_BYTES}-byte limit; shrink it",
                    quote(rel),
                    meta.len()
                ),
            ));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(&resolved)
            .and_then(|f| f.take(MAX_SCHEMA_BYTES + 1).read_to_end(&mut bytes))
            .map_err(|e| {
                self.invalid(
                    field,
                    format!("schema file {} cannot be read ({e})", quote(rel)),
                )
            })?;
        if bytes.len() as u64 > MAX_SCHEMA_BYTES {
            return Err(self.invalid(
                field,
                format!(
                    "schema file {} is over the {MAX_SCHEMA_BYTES}-byte limit; shrink it",
                    quote(rel)
                ),
            ));
        }
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            self.invalid(
                field,
                format!(
                    "schema file {} is not valid JSON ({e}); fix the file",
                    quote(rel)
                ),
            )
        })?;
        if !value.is_object() && !value.is_boolean() {
            return Err(self.invalid(
                field,
                format!(
                    "schema file {} holds a JSON {}, not a JSON Schema object; wrap it in {{...}}",
                    quote(rel),
                    json_type(&value)
                ),
            ));
        }
        Ok(value)
    }

    fn exports(&mut self, root: &Table) -> Result<Vec<VaiExport>, ManifestError> {
        let Some(v) = root.get("exports") else {
            return Err(self.missing("exports".to_owned()));
        };
        let arr = v
            .as_array()
            .ok_or_else(|| self.wrong_type("exports", "an array of tables ([[exports]])", v))?;
        if arr.is_empty() {
            return Err(self.invalid(
                "exports",
                "the package exports nothing; add at least one [[exports]] entry",
            ));
        }
        if arr.len() > MAX_EXPORTS {
            return Err(self.invalid(
                "exports",
                format!(
                    "{} exports, more than the {MAX_EXPORTS} allowed; split the package",
                    arr.len()
                ),
            ));
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (i, item) in arr.iter().enumerate() {
            let prefix = format!("exports[{i}]");
            let t = self.table(item, &prefix)?;
            let export = self.export(t, &prefix)?;
            if !seen.insert(export.id.clone()) {
                return Err(self.invalid(
                    format!("{prefix}.id"),
                    format!(
                        "export id {} is used twice; export ids must be unique in the package",
                        quote(&export.id)
                    ),
                ));
            }
            out.push(export);
        }
        Ok(out)
    }

    fn export(&mut self, t: &Table, p: &str) -> Result<VaiExport, ManifestError> {
        self.check_keys(t, p, EXPORT_KEYS, Unknown::Error)?;
        let id = self.required_string(t, p, "id")?;
        if !is_valid_export_id(id) {
            return Err(self.invalid(
                format!("{p}.id"),
                format!(
                    "{} is not a valid export id; use 1-64 characters of a-z, 0-9, '_' and '-', starting with a letter (e.g. \"jira_search\")",
                    quote(id)
                ),
            ));
        }
        let kind_s = self.required_string(t, p, "kind")?;
        let kind = match self.choice(
            &format!("{p}.kind"),
            kind_s,
            &["harness", "tool", "hook", "compactor"],
        )? {
            "harness" => ExportKind::Harness,
            "tool" => ExportKind::Tool,
            "hook" => ExportKind::Hook,
            _ => ExportKind::Compactor,
        };
        let display_name = self.optional_string(t, p, "display_name")?;
        let description = self.optional_string(t, p, "description")?;
        let execution_class = match self.optional_string(t, p, "execution_class")? {
            None => kind.default_class(),
            Some(c) => match self.choice(
                &format!("{p}.execution_class"),
                c,
                &["inline", "worker", "isolated"],
            )? {
                "inline" => ExecutionClass::Inline,
                "worker" => ExecutionClass::Worker,
                _ => ExecutionClass::Isolated,
            },
        };
        let max_ms = i64::try_from(SupervisorSpec::MAX_DURATION.as_millis()).unwrap_or(i64::MAX);
        let default_timeout = self
            .integer(t, p, "default_timeout_ms", 1, max_ms)?
            .map(|ms| Duration::from_millis(ms.unsigned_abs()));
        let max_concurrency = self
            .integer(t, p, "max_concurrency", 1, i64::from(MAX_CONCURRENCY))?
            .and_then(|n| u32::try_from(n).ok());
        let config_schema = self.optional_string(t, p, "config_schema")?;
        if let Some(file) = config_schema {
            self.load_schema(&format!("{p}.config_schema"), file)?;
        }
        let permissions = self.permissions(t, p)?;

        // A kind-specific table must match the kind.
        for other in ["tool", "hook", "compactor", "harness"] {
            if other != kind.as_str() && t.contains_key(other) {
                return Err(self.invalid(
                    join(p, other),
                    format!(
                        "[exports.{other}] belongs to {other} exports, but this export's kind is \"{}\"; remove the table or fix the kind",
                        kind.as_str()
                    ),
                ));
            }
        }
        let mut export = VaiExport {
            id: id.to_owned(),
            kind,
            display_name: display_name.map(str::to_owned),
            description: description.map(str::to_owned),
            execution_class,
            default_timeout,
            max_concurrency,
            config_schema: config_schema.map(str::to_owned),
            permissions,
            tool: None,
            hook: None,
            compactor: None,
            harness: None,
        };
        let empty = Table::new();
        match kind {
            ExportKind::Tool => {
                let tp = join(p, "tool");
                let tt = self.optional_table(t, p, "tool")?.unwrap_or(&empty);
                self.check_keys(tt, &tp, TOOL_KEYS, Unknown::Error)?;
                let effect_class = match self.optional_string(tt, &tp, "effect_class")? {
                    None => EffectClass::Unknown,
                    Some(c) => match self.choice(
                        &format!("{tp}.effect_class"),
                        c,
                        &[
                            "read_only",
                            "idempotent_write",
                            "non_idempotent_write",
                            "unknown",
                        ],
                    )? {
                        "read_only" => EffectClass::ReadOnly,
                        "idempotent_write" => EffectClass::IdempotentWrite,
                        "non_idempotent_write" => EffectClass::NonIdempotentWrite,
                        _ => EffectClass::Unknown,
                    },
                };
                let streaming = self.optional_bool(tt, &tp, "streaming")?.unwrap_or(false);
                let input_schema = self.optional_string(tt, &tp, "input_schema")?;
                let output_schema = self.optional_string(tt, &tp, "output_schema")?;
                if let Some(file) = input_schema {
                    self.load_schema(&format!("{tp}.input_schema"), file)?;
                }
                let output_schema_json = match output_schema {
                    Some(file) => Some(self.load_schema(&format!("{tp}.output_schema"), file)?),
                    None => None,
                };
                export.tool = Some(ToolExport {
                    effect_class,
                    streaming,
                    input_schema: input_schema.map(str::to_owned),
                    output_schema: output_schema.map(str::to_owned),
                    output_schema_json,
                });
            }
            ExportKind::Hook => {
                let hp = join(p, "hook");
                let Some(ht) = self.optional_table(t, p, "hook")? else {
                    return Err(self.missing(format!("{hp}.subscribes_to")));
                };
                self.check_keys(ht, &hp, HOOK_KEYS, Unknown::Error)?;
                if !ht.contains_key("subscribes_to") {
                    return Err(self.missing(format!("{hp}.subscribes_to")));
                }
                let subscribes_to = self.unique_strings(ht, &hp, "subscribes_to")?;
                if subscribes_to.is_empty() {
                    return Err(self.invalid(
                        format!("{hp}.subscribes_to"),
                        "the list is empty; name the events the hook handles, e.g. [\"run.completed\"]",
                    ));
                }
                export.hook = Some(HookExport { subscribes_to });
            }
            ExportKind::Compactor => {
                let cp = join(p, "compactor");
                let ct = self.optional_table(t, p, "compactor")?.unwrap_or(&empty);
                self.check_keys(ct, &cp, COMPACTOR_KEYS, Unknown::Error)?;
                export.compactor = Some(CompactorExport {
                    target_context: self
                        .optional_string(ct, &cp, "target_context")?
                        .map(str::to_owned),
                    supports_pinned_items: self
                        .optional_bool(ct, &cp, "supports_pinned_items")?
                        .unwrap_or(false),
                });
            }
            ExportKind::Harness => {
                let hp = join(p, "harness");
                let ht = self.optional_table(t, p, "harness")?.unwrap_or(&empty);
                self.check_keys(ht, &hp, HARNESS_KEYS, Unknown::Error)?;
                let fidelity = match self.optional_string(ht, &hp, "fidelity")? {
                    None => None,
                    Some(f) => Some(
                        match self.choice(
                            &format!("{hp}.fidelity"),
                            f,
                            &["lossless", "checkpoint", "prompt_replay", "summary_reseed"],
                        )? {
                            "lossless" => Fidelity::Lossless,
                            "checkpoint" => Fidelity::Checkpoint,
                            "prompt_replay" => Fidelity::PromptReplay,
                            _ => Fidelity::SummaryReseed,
                        },
                    ),
                };
                export.harness = Some(HarnessExport {
                    mode: self.optional_string(ht, &hp, "mode")?.map(str::to_owned),
                    fidelity,
                    supports: self.unique_strings(ht, &hp, "supports")?,
                });
            }
        }
        Ok(export)
    }

    fn permissions(&mut self, export: &Table, p: &str) -> Result<Permissions, ManifestError> {
        let pp = join(p, "permissions");
        let Some(t) = self.optional_table(export, p, "permissions")? else {
            return Ok(Permissions::default());
        };
        self.check_keys(t, &pp, PERMISSION_KEYS, Unknown::Error)?;
        let network = match self.optional_string(t, &pp, "network")? {
            None => NetworkPermission::None,
            Some(n) => match self.choice(&format!("{pp}.network"), n, &["none", "egress"])? {
                "egress" => NetworkPermission::Egress,
                _ => NetworkPermission::None,
            },
        };
        let filesystem = match self.optional_string(t, &pp, "filesystem")? {
            None => FilesystemPermission::None,
            Some(f) => match self.choice(
                &format!("{pp}.filesystem"),
                f,
                &["none", "scratch", "assets_ro"],
            )? {
                "scratch" => FilesystemPermission::Scratch,
                "assets_ro" => FilesystemPermission::AssetsRo,
                _ => FilesystemPermission::None,
            },
        };
        let gateway_api_scopes = self.unique_strings(t, &pp, "gateway_api_scopes")?;
        for (i, scope) in gateway_api_scopes.iter().enumerate() {
            let ok = scope.split_once(':').is_some_and(|(r, a)| {
                let part = |s: &str| {
                    !s.is_empty()
                        && s.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                };
                part(r) && part(a)
            });
            if !ok {
                return Err(self.invalid(
                    format!("{pp}.gateway_api_scopes[{i}]"),
                    format!(
                        "{} is not a scope; use \"<resource>:<action>\", e.g. \"chains:read\"",
                        quote(scope)
                    ),
                ));
            }
        }
        let secret_slots = self.unique_strings(t, &pp, "secret_slots")?;
        for (i, slot) in secret_slots.iter().enumerate() {
            if !is_valid_export_id(slot) {
                return Err(self.invalid(
                    format!("{pp}.secret_slots[{i}]"),
                    format!(
                        "{} is not a valid secret slot name; use a-z, 0-9, '_' and '-', starting with a letter (e.g. \"jira_token\")",
                        quote(slot)
                    ),
                ));
            }
        }
        Ok(Permissions {
            network,
            filesystem,
            gateway_api_scopes,
            secret_slots,
        })
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A package directory with the seed's schema files and an executable.
    pub(super) fn package() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::create_dir_all(d.join("bin")).unwrap();
        std::fs::create_dir_all(d.join("schemas")).unwrap();
        std::fs::write(d.join("bin/plugin"), "#!/bin/sh\n").unwrap();
        for f in [
            "triage_config",
            "jira_search_config",
            "jira_search_input",
            "jira_search_output",
            "slack_notify_config",
            "coder_window_config",
        ] {
            std::fs::write(
                d.join(format!("schemas/{f}.json")),
                r#"{"type":"object","properties":{"query":{"type":"string"}}}"#,
            )
            .unwrap();
        }
        tmp
    }

    /// The seed's complete example manifest.
    pub(super) const SEED: &str = r#"
api_version = "vai.plugin.v1"
package_id = "acme/devkit"
version = "0.1.0"
name = "Acme Dev Kit"
description = "Harnesses, tools, hooks, and compaction strategies"
license = "Apache-2.0"
source = "oci://ghcr.io/acme/devkit:0.1.0"

[runtime]
protocol = "vai.rpc.v1"
transport = "stdio"
entrypoint = ["./bin/plugin"]
os = ["linux", "darwin"]
arch = ["amd64", "arm64"]

[[exports]]
id = "triage"
kind = "harness"
display_name = "Triage Harness"
description = "Composite bug triage harness"
execution_class = "isolated"
default_timeout_ms = 1800000
max_concurrency = 4
config_schema = "schemas/triage_config.json"

[exports.permissions]
network = "egress"
filesystem = "scratch"
gateway_api_scopes = ["sessions:read", "chains:read", "chains:write", "runs:write", "compactions:write"]
secret_slots = ["anthropic_key", "openai_key"]

[exports.harness]
mode = "composite"
fidelity = "checkpoint"
supports = ["continue", "branch_session", "compact", "tool"]

[[exports]]
id = "jira_search"
kind = "tool"
display_name = "Jira Search"
execution_class = "isolated"
default_timeout_ms = 20000
config_schema = "schemas/jira_search_config.json"

[exports.permissions]
network = "egress"
filesystem = "none"
gateway_api_scopes = []
secret_slots = ["jira_token"]

[exports.tool]
effect_class = "read_only"
streaming = false
input_schema = "schemas/jira_search_input.json"
output_schema = "schemas/jira_search_output.json"

[[exports]]
id = "slack_notify"
kind = "hook"
display_name = "Slack Notifier"
execution_class = "worker"
default_timeout_ms = 15000
config_schema = "schemas/slack_notify_config.json"

[exports.permissions]
network = "egress"
filesystem = "none"
gateway_api_scopes = ["runs:read"]
secret_slots = ["slack_webhook"]

[exports.hook]
subscribes_to = ["run.completed", "chain.compacted"]

[[exports]]
id = "coder_window"
kind = "compactor"
display_name = "Coder Window"
execution_class = "worker"
default_timeout_ms = 120000
config_schema = "schemas/coder_window_config.json"

[exports.permissions]
network = "none"
filesystem = "scratch"
gateway_api_scopes = []
secret_slots = []

[exports.compactor]
target_context = "coding"
supports_pinned_items = true
"#;

    fn load(dir: &Path, text: &str) -> Result<PluginSpec, ManifestError> {
        std::fs::write(dir.join(VAI_MANIFEST_FILE), text).unwrap();
        load_vai(&dir.join(VAI_MANIFEST_FILE), &LoadOptions::default())
    }

    /// A minimal valid manifest with `export` as its only export table.
    fn minimal(export: &str) -> String {
        format!(
            "api_version = \"vai.plugin.v1\"\npackage_id = \"acme/mini\"\nversion = \"1.0.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = [\"./bin/plugin\"]\n\n[[exports]]\n{export}\n"
        )
    }

    fn err(dir: &Path, text: &str) -> String {
        load(dir, text).unwrap_err().to_string()
    }

    #[test]
    fn the_seed_example_loads_completely() {
        let pkg = package();
        let spec = load(pkg.path(), SEED).unwrap();
        assert_eq!(spec.id, "acme/devkit");
        assert_eq!(spec.version, "0.1.0");
        assert_eq!(spec.dialect, Dialect::Vai);
        assert_eq!(
            spec.command.program,
            pkg.path()
                .canonicalize()
                .unwrap()
                .join("bin/plugin")
                .display()
                .to_string()
        );
        assert!(spec.command.args.is_empty());
        let vai = spec.vai.as_ref().unwrap();
        assert_eq!(vai.exports.len(), 4);
        assert_eq!(vai.license.as_deref(), Some("Apache-2.0"));
        let triage = vai.export("triage").unwrap();
        assert_eq!(triage.kind, ExportKind::Harness);
        assert_eq!(triage.max_concurrency, Some(4));
        assert_eq!(triage.default_timeout, Some(Duration::from_secs(1800)));
        assert_eq!(triage.permissions.network, NetworkPermission::Egress);
        assert_eq!(triage.permissions.filesystem, FilesystemPermission::Scratch);
        assert_eq!(
            triage.permissions.secret_slots,
            ["anthropic_key", "openai_key"]
        );
        let h = triage.harness.as_ref().unwrap();
        assert_eq!(h.fidelity, Some(Fidelity::Checkpoint));
        assert_eq!(h.mode.as_deref(), Some("composite"));
        let hook = vai.export("slack_notify").unwrap();
        assert_eq!(
            hook.hook.as_ref().unwrap().subscribes_to,
            ["run.completed", "chain.compacted"]
        );
        let c = vai.export("coder_window").unwrap();
        assert!(c.compactor.as_ref().unwrap().supports_pinned_items);
        let t = vai.export("jira_search").unwrap();
        assert_eq!(t.tool.as_ref().unwrap().effect_class, EffectClass::ReadOnly);

        // Only the tool export becomes a tool, namespaced by the package id.
        assert_eq!(spec.tools.len(), 1);
        let tool = &spec.tools[0];
        assert_eq!(tool.name, "acme/devkit/jira_search");
        assert_eq!(tool.wire_name, "jira_search");
        assert_eq!(tool.description, "Jira Search");
        assert_eq!(tool.input_schema["properties"]["query"]["type"], "string");
        assert!(spec.warnings.is_empty(), "{:?}", spec.warnings);

        // The whole spec serializes (plugin show --json of the spec).
        let json = serde_json::to_value(vai).unwrap();
        assert_eq!(json["exports"][0]["kind"], "harness");
        assert_eq!(json["exports"][0]["default_timeout_ms"], 1800000);
        assert_eq!(json["exports"][1]["tool"]["effect_class"], "read_only");
    }

    #[test]
    fn execution_class_defaults_per_kind() {
        let pkg = package();
        for (kind, extra, class) in [
            ("tool", "", ExecutionClass::Isolated),
            ("harness", "", ExecutionClass::Isolated),
            (
                "hook",
                "[exports.hook]\nsubscribes_to = [\"run.completed\"]\n",
                ExecutionClass::Worker,
            ),
            ("compactor", "", ExecutionClass::Worker),
        ] {
            let spec = load(
                pkg.path(),
                &minimal(&format!("id = \"x\"\nkind = \"{kind}\"\n{extra}")),
            )
            .unwrap();
            let e = &spec.vai.as_ref().unwrap().exports[0];
            assert_eq!(e.execution_class, class, "{kind}");
        }
        // A class the seed does not know is refused, not guessed.
        let e = err(
            pkg.path(),
            &minimal("id = \"x\"\nkind = \"tool\"\nexecution_class = \"host\""),
        );
        assert!(
            e.contains("exports[0].execution_class") && e.contains("\"host\""),
            "{e}"
        );
        // A tool without [exports.tool] takes any object.
        let spec = load(pkg.path(), &minimal("id = \"x\"\nkind = \"tool\"")).unwrap();
        assert_eq!(
            spec.tools[0].input_schema,
            serde_json::json!({"type":"object"})
        );
    }

    #[test]
    fn host_platform_names_map_to_go_names() {
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_os("macos"), "darwin");
        assert_eq!(go_os("linux"), "linux");
    }

    #[test]
    fn a_package_for_another_platform_is_refused() {
        let pkg = package();
        let text = SEED.replace("os = [\"linux\", \"darwin\"]", "os = [\"plan9\"]");
        let e = err(pkg.path(), &text);
        assert!(
            e.contains("runtime.os: the package is built for [\"plan9\"]"),
            "{e}"
        );
        let text = SEED.replace("arch = [\"amd64\", \"arm64\"]", "arch = [\"riscv64x\"]");
        let e = err(pkg.path(), &text);
        assert!(
            e.contains("runtime.arch: the package is built for [\"riscv64x\"]"),
            "{e}"
        );
        assert!(e.contains(host_arch()), "{e}");
    }

    #[test]
    fn identity_and_protocol_fields_are_checked() {
        let pkg = package();
        let e = err(pkg.path(), &SEED.replace("vai.plugin.v1", "vai.plugin.v9"));
        assert!(
            e.contains("api_version: \"vai.plugin.v9\" is not supported"),
            "{e}"
        );
        let e = err(pkg.path(), &SEED.replace("acme/devkit\"", "Acme Devkit\""));
        assert!(
            e.contains("package_id: \"Acme Devkit\" is not a valid package id"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("package_id = \"acme/devkit\"", "package_id = \"../x\""),
        );
        assert!(e.contains("package_id: \"../x\""), "{e}");
        let e = err(
            pkg.path(),
            &SEED.replace("version = \"0.1.0\"", "version = \"1.0\""),
        );
        assert!(
            e.contains("version: \"1.0\" is not a semver version"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("protocol = \"vai.rpc.v1\"", "protocol = \"jsonrpc\""),
        );
        assert!(
            e.contains("runtime.protocol: \"jsonrpc\" is not supported"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("transport = \"stdio\"", "transport = \"tcp\""),
        );
        assert!(
            e.contains("runtime.transport: \"tcp\" is not supported"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("package_id = \"acme/devkit\"\n", ""),
        );
        assert!(e.contains("package_id: required key is missing"), "{e}");
    }

    #[test]
    fn wrong_types_name_the_field() {
        let pkg = package();
        let e = err(
            pkg.path(),
            &SEED.replace("max_concurrency = 4", "max_concurrency = \"4\""),
        );
        assert!(
            e.contains("exports[0].max_concurrency: expected an integer, found string"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("max_concurrency = 4", "max_concurrency = 0"),
        );
        assert!(
            e.contains("exports[0].max_concurrency: 0 is out of range"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("streaming = false", "streaming = \"no\""),
        );
        assert!(
            e.contains("exports[1].tool.streaming: expected a boolean"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace(
                "entrypoint = [\"./bin/plugin\"]",
                "entrypoint = \"./bin/plugin\"",
            ),
        );
        assert!(
            e.contains("runtime.entrypoint: expected an array of strings"),
            "{e}"
        );
        let e = err(pkg.path(), &minimal("id = \"x\"\nkind = \"widget\""));
        assert!(
            e.contains("exports[0].kind: \"widget\" is not allowed; use one of: \"harness\""),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("network = \"none\"", "network = \"lan\""),
        );
        assert!(
            e.contains("exports[3].permissions.network: \"lan\" is not allowed"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("filesystem = \"none\"", "filesystem = \"rw\""),
        );
        assert!(
            e.contains("exports[1].permissions.filesystem: \"rw\" is not allowed"),
            "{e}"
        );
        let e = err(pkg.path(), &SEED.replace("\"runs:read\"", "\"everything\""));
        assert!(
            e.contains(
                "exports[2].permissions.gateway_api_scopes[0]: \"everything\" is not a scope"
            ),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace("fidelity = \"checkpoint\"", "fidelity = \"perfect\""),
        );
        assert!(
            e.contains("exports[0].harness.fidelity: \"perfect\" is not allowed"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &SEED.replace(
                "effect_class = \"read_only\"",
                "effect_class = \"harmless\"",
            ),
        );
        assert!(
            e.contains("exports[1].tool.effect_class: \"harmless\""),
            "{e}"
        );
        let e = err(
            pkg.path(),
            "api_version = \"vai.plugin.v1\"\npackage_id = \"a/b\"\nversion = \"1.0.0\"\nexports = 3\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = [\"./bin/plugin\"]\n",
        );
        assert!(e.contains("exports: expected an array of tables"), "{e}");
    }

    #[test]
    fn exports_are_unique_and_kind_tables_match() {
        let pkg = package();
        let e = err(
            pkg.path(),
            &SEED.replace("id = \"coder_window\"", "id = \"triage\""),
        );
        assert!(
            e.contains("exports[3].id: export id \"triage\" is used twice"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &minimal("id = \"x\"\nkind = \"tool\"\n[exports.hook]\nsubscribes_to = [\"a\"]"),
        );
        assert!(e.contains("exports[0].hook: [exports.hook] belongs to hook exports, but this export's kind is \"tool\""), "{e}");
        let e = err(pkg.path(), &minimal("id = \"x\"\nkind = \"hook\""));
        assert!(
            e.contains("exports[0].hook.subscribes_to: required key is missing"),
            "{e}"
        );
        let e = err(pkg.path(), &minimal("id = \"Bad Id\"\nkind = \"tool\""));
        assert!(
            e.contains("exports[0].id: \"Bad Id\" is not a valid export id"),
            "{e}"
        );
        let e = err(
            pkg.path(),
            &minimal("id = \"x\"\nkind = \"tool\"\ncolour = \"red\""),
        );
        assert!(e.contains("exports[0].colour: unknown key"), "{e}");
        // Unknown top-level keys are tolerated with a warning.
        let spec = load(
            pkg.path(),
            &format!(
                "homepage = \"x\"\n{}",
                minimal("id = \"x\"\nkind = \"tool\"")
            ),
        )
        .unwrap();
        assert!(
            spec.warnings[0].contains("homepage: unknown key ignored"),
            "{:?}",
            spec.warnings
        );
        // ...but not a top-level key named like a containment section.
        for key in ["permissions", "permision", "sandbox", "limits"] {
            let e = err(
                pkg.path(),
                &format!(
                    "{key} = {{ network = \"egress\" }}\n{}",
                    minimal("id = \"x\"\nkind = \"tool\"")
                ),
            );
            assert!(
                e.contains(&format!("{key}: ")) && e.contains("containment"),
                "{key}: {e}"
            );
        }
        let e = err(
            pkg.path(),
            "api_version = \"vai.plugin.v1\"\npackage_id = \"a/b\"\nversion = \"1.0.0\"\nexports = []\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = [\"./bin/plugin\"]\n",
        );
        assert!(e.contains("exports: the package exports nothing"), "{e}");
    }

    #[test]
    fn schema_paths_must_stay_inside_the_package_and_be_json() {
        let pkg = package();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("s.json"), "{}").unwrap();
        let swap = |to: &str| SEED.replace("schemas/jira_search_input.json", to);

        let e = err(pkg.path(), &swap("../s.json"));
        assert!(
            e.contains("exports[1].tool.input_schema: \"../s.json\" escapes the package directory"),
            "{e}"
        );
        let e = err(pkg.path(), &swap("/etc/passwd"));
        assert!(
            e.contains("exports[1].tool.input_schema: \"/etc/passwd\" is an absolute path"),
            "{e}"
        );
        std::os::unix::fs::symlink(
            outside.path().join("s.json"),
            pkg.path().join("schemas/link.json"),
        )
        .unwrap();
        let e = err(pkg.path(), &swap("schemas/link.json"));
        assert!(
            e.contains("\"schemas/link.json\" escapes the package directory"),
            "{e}"
        );
        // A symlink that stays inside is fine.
        std::os::unix::fs::symlink(
            "jira_search_output.json",
            pkg.path().join("schemas/inner.json"),
        )
        .unwrap();
        load(pkg.path(), &swap("schemas/inner.json")).unwrap();

        let e = err(pkg.path(), &swap("schemas/missing.json"));
        assert!(
            e.contains("schema file \"schemas/missing.json\" cannot be read"),
            "{e}"
        );
        std::fs::write(pkg.path().join("schemas/bad.json"), "{not json").unwrap();
        let e = err(pkg.path(), &swap("schemas/bad.json"));
        assert!(
            e.contains("schema file \"schemas/bad.json\" is not valid JSON"),
            "{e}"
        );
        std::fs::write(pkg.path().join("schemas/list.json"), "[1]").unwrap();
        let e = err(pkg.path(), &swap("schemas/list.json"));
        assert!(
            e.contains("holds a JSON array, not a JSON Schema object"),
            "{e}"
        );
        let e = err(pkg.path(), &swap("schemas"));
        assert!(e.contains("\"schemas\" is not a regular file"), "{e}");
        std::fs::write(
            pkg.path().join("schemas/big.json"),
            format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_SCHEMA_BYTES as usize)),
        )
        .unwrap();
        let e = err(pkg.path(), &swap("schemas/big.json"));
        assert!(e.contains("over the 1048576-byte limit"), "{e}");
        // config_schema is checked the same way.
        let e = err(
            pkg.path(),
            &SEED.replace("schemas/triage_config.json", "../../etc/x.json"),
        );
        assert!(
            e.contains(
                "exports[0].config_schema: \"../../etc/x.json\" escapes the package directory"
            ),
            "{e}"
        );
    }

    #[test]
    fn entrypoints_stay_inside_the_package() {
        let pkg = package();
        let swap = |to: &str| {
            SEED.replace(
                "entrypoint = [\"./bin/plugin\"]",
                &format!("entrypoint = {to}"),
            )
        };
        let e = err(pkg.path(), &swap("[\"../../bin/sh\"]"));
        assert!(
            e.contains("runtime.entrypoint[0]: \"../../bin/sh\" escapes the package directory"),
            "{e}"
        );
        let e = err(pkg.path(), &swap("[\"/bin/sh\"]"));
        assert!(
            e.contains("runtime.entrypoint[0]: \"/bin/sh\" is an absolute path"),
            "{e}"
        );
        let e = err(pkg.path(), &swap("[]"));
        assert!(e.contains("runtime.entrypoint: the array is empty"), "{e}");
        let e = err(pkg.path(), &swap("[\"./bin/nothing\"]"));
        assert!(e.contains("\"./bin/nothing\" cannot be read"), "{e}");
        let e = err(pkg.path(), &swap("[\"./bin\"]"));
        assert!(e.contains("\"./bin\" is not a regular file"), "{e}");
        // A bare program name is looked up in PATH by the host.
        let spec = load(
            pkg.path(),
            &swap("[\"python3\", \"bin/plugin.py\", \"-v\"]"),
        )
        .unwrap();
        assert_eq!(spec.command.program, "python3");
        assert_eq!(spec.command.args, ["bin/plugin.py", "-v"]);
    }

    #[test]
    fn malformed_and_oversized_manifests_are_refused() {
        let pkg = package();
        let e = load(
            pkg.path(),
            "api_version = \"vai.plugin.v1\"\npackage_id = [",
        )
        .unwrap_err();
        assert!(matches!(e, ManifestError::Syntax { line: 2, .. }), "{e}");
        let big = format!("{SEED}\n# {}\n", "x".repeat(MAX_MANIFEST_BYTES as usize));
        let e = load(pkg.path(), &big).unwrap_err();
        assert!(matches!(e, ManifestError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("over the 1048576-byte limit"), "{e}");
        std::fs::write(pkg.path().join(VAI_MANIFEST_FILE), b"package_id = \"\xff\"").unwrap();
        let e = load_vai(&pkg.path().join(VAI_MANIFEST_FILE), &LoadOptions::default()).unwrap_err();
        assert!(
            matches!(e, ManifestError::NotUtf8 { offset: 14, .. }),
            "{e}"
        );
        let e = err(pkg.path(), "");
        assert!(e.contains("api_version: required key is missing"), "{e}");
    }
}

#[cfg(test)]
mod props {
    use super::tests::{SEED, package};
    use super::*;
    use crate::tests::{apply, mutation};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn parse_never_panics_on_arbitrary_strings(s in any::<String>()) {
            let tmp = package();
            let dir = tmp.path().canonicalize().unwrap();
            let _ = parse_vai(&s, &dir.join(VAI_MANIFEST_FILE), &dir, &LoadOptions::default())
                .map_err(|e| e.to_string());
        }

        #[test]
        fn parse_never_panics_on_mutated_documents(muts in proptest::collection::vec(mutation(), 1..6)) {
            let tmp = package();
            let dir = tmp.path().canonicalize().unwrap();
            let mut text = SEED.to_owned();
            for m in &muts {
                text = apply(&text, m);
            }
            if let Err(e) = parse_vai(&text, &dir.join(VAI_MANIFEST_FILE), &dir, &LoadOptions::default()) {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "{msg}");
            }
        }
    }
}
