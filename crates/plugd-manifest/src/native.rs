//! The native dialect: reading and validating `nexo-plugin.toml` (seed §2, §2.1, §2.2, §4.1.1).
//!
//! The manifest is parsed into a generic TOML table and walked by hand rather
//! than through `#[derive(Deserialize)]` structs: the walk gives every error
//! the exact dotted field (`plugin.extends.tools[2]`), and lets `[plugin]` and
//! `[plugin.supervisor]` tolerate unknown keys with a warning while every
//! other section rejects them (the effect of `serde(deny_unknown_fields)`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Table;

use crate::LoadOptions;
use crate::error::ManifestError;
use crate::error::quote;
use crate::ids::{is_valid_plugin_id, tool_in_namespace};
use crate::read::MAX_MANIFEST_BYTES;
use crate::sandbox::{SandboxPathError, check_sandbox_path, resolve_path};
use crate::spec::{
    ChannelRegistration, CommandSpec, Dialect, EXTENDS_SECTIONS, Extends, LimitsSpec, NativeSpec,
    PluginSpec, Requires, STATE_DIR_TOKEN, SandboxNetwork, SandboxSpec, StartMode, SupervisorSpec,
};
use crate::toml_fields::{Fields, Unknown, join, syntax_error};

/// File name of the native manifest.
pub const NATIVE_MANIFEST_FILE: &str = "nexo-plugin.toml";

/// The nexo daemon version plugd presents: sent as `initialize.params.nexo_version`
/// (§4.1, where it is the daemon's version, e.g. "0.1.5") and matched against
/// a manifest's `min_nexo_version`. It is the daemon line that ships contract
/// [`NEXO_CONTRACT_VERSION`].
pub const NEXO_HOST_VERSION: &str = "0.1.5";

/// The nexo Plugin Contract version plugd implements.
pub const NEXO_CONTRACT_VERSION: &str = "1.10.0";

/// The host services plugd provides, by the names `[plugin.requires]
/// nexo_capabilities` uses; a plugin requiring anything else is refused.
pub const PROVIDED_CAPABILITIES: &[&str] = &["broker", "memory", "llm"];

/// Keys known in `[plugin]`; others are tolerated with a warning.
const PLUGIN_KEYS: &[&str] = &[
    "id",
    "version",
    "name",
    "description",
    "min_nexo_version",
    "contract_version",
    "requires",
    "entrypoint",
    "extends",
    "channels",
    "supervisor",
    "sandbox",
    "limits",
    "config_schema",
];
const ENTRYPOINT_KEYS: &[&str] = &["command", "args", "env"];
const REQUIRES_KEYS: &[&str] = &["nexo_capabilities"];
const CHANNELS_KEYS: &[&str] = &["register"];
const REGISTER_KEYS: &[&str] = &["kind", "adapter"];
/// Keys known in `[plugin.supervisor]`; others are tolerated with a warning.
const SUPERVISOR_KEYS: &[&str] = &[
    "start",
    "restart_attempts",
    "backoff_base_ms",
    "backoff_max_ms",
    "stable_after_ms",
    "init_timeout_ms",
    "call_timeout_ms",
    "shutdown_timeout_ms",
    "shutdown_grace_ms",
];
const LIMITS_KEYS: &[&str] = &["address_space_mb", "open_files", "processes", "cpu_seconds"];
const SANDBOX_KEYS: &[&str] = &[
    "enabled",
    "network",
    "fs_read_paths",
    "fs_write_paths",
    "drop_user",
];
/// Env-key prefixes reserved for the host (compared ASCII case-insensitively).
const RESERVED_ENV_PREFIXES: &[&str] = &["NEXO_", "PLUGD_"];

/// Reads, parses and validates the native manifest at `manifest_path`.
///
/// Refuses files over [`MAX_MANIFEST_BYTES`], non-regular files and non-UTF-8
/// text. The plugin directory is the manifest's parent, canonicalized; the
/// returned `manifest_path` is inside that canonical directory.
pub fn load_native(manifest_path: &Path, opts: &LoadOptions) -> Result<PluginSpec, ManifestError> {
    let (text, dir) = crate::read::read_manifest(manifest_path)?;
    let canonical_manifest = match manifest_path.file_name() {
        Some(name) => dir.join(name),
        None => manifest_path.to_path_buf(),
    };
    parse_native(&text, &canonical_manifest, &dir, opts)
}

/// Parses and validates native manifest `text`.
///
/// `manifest_path` is only used in errors and copied into the spec; `dir` is
/// the plugin directory against which a relative entrypoint command is
/// resolved (it is made absolute against the current directory and
/// resolved to its canonical form first). Reads the
/// filesystem only to resolve paths (entrypoint command, sandbox paths).
pub fn parse_native(
    text: &str,
    manifest_path: &Path,
    dir: &Path,
    opts: &LoadOptions,
) -> Result<PluginSpec, ManifestError> {
    let mut cx = Cx(Fields::new(manifest_path, false));
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge {
            path: manifest_path.to_path_buf(),
            size: text.len() as u64,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    let root: Table = toml::from_str(text).map_err(|e| syntax_error(manifest_path, text, &e))?;

    cx.check_keys(&root, "", &["plugin"], Unknown::Error)?;
    let plugin = cx.required_table(&root, "", "plugin")?;
    cx.check_keys(plugin, "plugin", PLUGIN_KEYS, Unknown::Warn)?;

    let id = cx.required_string(plugin, "plugin", "id")?;
    if !is_valid_plugin_id(id) {
        return Err(cx.invalid(
            "plugin.id",
            format!(
                "{} is not a valid plugin id; use 1-32 characters of a-z, 0-9 and _, starting with a letter (e.g. \"my_plugin\")",
                quote(id)
            ),
        ));
    }
    let version = cx.required_string(plugin, "plugin", "version")?;
    if let Err(e) = semver::Version::parse(version) {
        return Err(cx.invalid(
            "plugin.version",
            format!(
                "{} is not a semver version ({e}); use MAJOR.MINOR.PATCH, e.g. \"0.1.0\"",
                quote(version)
            ),
        ));
    }
    let name = cx.optional_string(plugin, "plugin", "name")?;
    let description = cx.optional_string(plugin, "plugin", "description")?;
    let min_nexo_version = cx.optional_string(plugin, "plugin", "min_nexo_version")?;
    if let Some(req) = min_nexo_version
        && let Err(e) = semver::VersionReq::parse(req)
    {
        return Err(cx.invalid(
            "plugin.min_nexo_version",
            format!(
                "{} is not a semver requirement ({e}); use e.g. \">=0.1.0\"",
                quote(req)
            ),
        ));
    }
    if let Some(req) = min_nexo_version
        && let Ok(parsed) = semver::VersionReq::parse(req)
        && let Ok(host) = semver::Version::parse(NEXO_HOST_VERSION)
        && !parsed.matches(&host)
    {
        return Err(cx.invalid(
            "plugin.min_nexo_version",
            format!(
                "the plugin requires nexo {}, but plugd presents nexo {NEXO_HOST_VERSION} (contract {NEXO_CONTRACT_VERSION}); use a plugin release for this nexo version",
                quote(req)
            ),
        ));
    }
    // §10: a plugin targeting a contract major plugd does not speak is refused.
    if let Some(cv) = cx.optional_string(plugin, "plugin", "contract_version")? {
        let host = semver::Version::parse(NEXO_CONTRACT_VERSION).expect("a valid constant");
        match semver::Version::parse(cv) {
            Err(e) => {
                return Err(cx.invalid(
                    "plugin.contract_version",
                    format!(
                        "{} is not a semver version ({e}); use e.g. \"1.10.0\"",
                        quote(cv)
                    ),
                ));
            }
            Ok(v) if v.major != host.major => {
                return Err(cx.invalid(
                    "plugin.contract_version",
                    format!(
                        "the plugin targets nexo contract {}, but plugd implements contract {NEXO_CONTRACT_VERSION} (major {}); contract major {} is not supported",
                        quote(cv),
                        host.major,
                        v.major
                    ),
                ));
            }
            Ok(_) => {}
        }
    }

    let requires = cx.requires(plugin)?;
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().map_or_else(|_| dir.to_path_buf(), |cwd| cwd.join(dir))
    };
    let dir = resolve_path(&dir).unwrap_or(dir);
    let command = cx.entrypoint(plugin, &dir)?;
    let extends = cx.extends(plugin, id)?;
    let channels = cx.channels(plugin)?;
    let supervisor = cx.supervisor(plugin)?;
    let sandbox = cx.sandbox(plugin, opts)?;
    let limits = cx.limits(plugin)?;
    let config_schema = plugin
        .get("config_schema")
        .map(|v| crate::config_schema::load_native(manifest_path, &dir, "plugin.config_schema", v))
        .transpose()?;

    Ok(PluginSpec {
        id: id.to_owned(),
        version: version.to_owned(),
        name: name.map(str::to_owned),
        description: description.map(str::to_owned),
        dialect: Dialect::Native,
        dir,
        manifest_path: manifest_path.to_path_buf(),
        command,
        declared_tools: extends.tools.clone(),
        supervisor,
        sandbox,
        limits,
        native: Some(NativeSpec {
            requires,
            extends,
            channels,
            min_nexo_version: min_nexo_version.map(str::to_owned),
            config_schema,
        }),
        warnings: std::mem::take(&mut cx.warnings),
        ..PluginSpec::base()
    })
}

/// Validation context: the manifest's typed field reader plus what only the
/// native loader needs.
struct Cx<'a>(Fields<'a>);

impl<'a> std::ops::Deref for Cx<'a> {
    type Target = Fields<'a>;
    fn deref(&self) -> &Fields<'a> {
        &self.0
    }
}

impl std::ops::DerefMut for Cx<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Cx<'_> {
    fn requires(&mut self, plugin: &Table) -> Result<Requires, ManifestError> {
        let Some(t) = self.optional_table(plugin, "plugin", "requires")? else {
            return Ok(Requires::default());
        };
        self.check_keys(t, "plugin.requires", REQUIRES_KEYS, Unknown::Error)?;
        let mut nexo_capabilities = Vec::new();
        for (field, cap) in self.string_list(t, "plugin.requires", "nexo_capabilities")? {
            if cap.trim().is_empty() || cap.contains('\0') {
                return Err(self.invalid(
                    field,
                    format!("capability {} is empty or contains NUL; use a capability name like \"broker\"", quote(cap)),
                ));
            }
            if !PROVIDED_CAPABILITIES.contains(&cap) {
                return Err(self.invalid(
                    field,
                    format!(
                        "the plugin requires nexo capability {}, which plugd cannot provide (it provides {}); plugd refuses to start it",
                        quote(cap),
                        PROVIDED_CAPABILITIES.join(", ")
                    ),
                ));
            }
            nexo_capabilities.push(cap.to_owned());
        }
        Ok(Requires { nexo_capabilities })
    }

    fn entrypoint(&mut self, plugin: &Table, dir: &Path) -> Result<CommandSpec, ManifestError> {
        const P: &str = "plugin.entrypoint";
        let t = self.required_table(plugin, "plugin", "entrypoint")?;
        self.check_keys(t, P, ENTRYPOINT_KEYS, Unknown::Error)?;

        let command = self.required_string(t, P, "command")?;
        let field = "plugin.entrypoint.command";
        if command.trim().is_empty() {
            return Err(self.invalid(
                field,
                "command is empty; set it to an absolute path, a program on PATH, or a path inside the plugin like \"./bin/plugin\"",
            ));
        }
        if command.contains('\0') {
            return Err(self.invalid(
                field,
                format!("{} contains a NUL byte; remove it", quote(command)),
            ));
        }
        let program = if command.contains('/') && !Path::new(command).is_absolute() {
            self.resolve_relative_command(command, dir)?
        } else {
            command.to_owned()
        };

        let mut args = Vec::new();
        for (field, arg) in self.string_list(t, P, "args")? {
            if arg.contains('\0') {
                return Err(self.invalid(
                    field,
                    format!("{} contains a NUL byte; remove it", quote(arg)),
                ));
            }
            args.push(arg.to_owned());
        }

        let mut env = BTreeMap::new();
        if let Some(env_t) = self.optional_table(t, P, "env")? {
            let env_field = "plugin.entrypoint.env";
            for (key, value) in env_t {
                let key_field = join(env_field, key);
                if key.is_empty() || key.contains('=') || key.contains('\0') {
                    return Err(self.invalid(
                        env_field,
                        format!(
                            "key {} is not a valid environment variable name (empty, or contains '=' or NUL); rename it",
                            quote(key)
                        ),
                    ));
                }
                if RESERVED_ENV_PREFIXES.iter().any(|p| {
                    key.len() >= p.len()
                        && key.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
                }) {
                    return Err(ManifestError::ReservedEnvKey {
                        path: self.path.to_path_buf(),
                        field: env_field.to_owned(),
                        key: key.clone(),
                    });
                }
                let value = self.string(value, &key_field)?;
                if value.contains('\0') {
                    return Err(self.invalid(
                        key_field,
                        format!("{} contains a NUL byte; remove it", quote(value)),
                    ));
                }
                env.insert(key.clone(), value.to_owned());
            }
        }
        Ok(CommandSpec { program, args, env })
    }

    /// Resolves a relative command containing `/` against the plugin
    /// directory; it must stay inside it after resolving symlinks and `..`.
    fn resolve_relative_command(
        &mut self,
        command: &str,
        dir: &Path,
    ) -> Result<String, ManifestError> {
        let field = "plugin.entrypoint.command";
        let joined = dir.join(command);
        let resolved = resolve_path(&joined).ok_or_else(|| {
            self.invalid(
                field,
                format!(
                    "{} follows too many symlinks (a loop?); point it at the real file",
                    quote(command)
                ),
            )
        })?;
        if !resolved.starts_with(dir) || resolved == dir {
            return Err(ManifestError::CommandEscapesPluginDir {
                path: self.path.to_path_buf(),
                field: field.to_owned(),
                command: command.to_owned(),
                resolved,
            });
        }
        match std::fs::metadata(&resolved) {
            Ok(m) if m.is_dir() => {
                return Err(self.invalid(
                    field,
                    format!("{} is a directory; point it at the plugin executable", quote(command)),
                ));
            }
            Ok(m) => {
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    if m.permissions().mode() & 0o111 == 0 {
                        self.warnings.push(format!(
                            "{field}: {} is not executable; run `chmod +x` on it",
                            quote(command)
                        ));
                    }
                }
                #[cfg(not(unix))]
                let _ = m;
            }
            Err(_) => self.warnings.push(format!(
                "{field}: {} does not exist yet (resolved to {}); build the plugin before starting it",
                quote(command),
                quote(&resolved.display().to_string())
            )),
        }
        resolved.into_os_string().into_string().map_err(|_| {
            self.invalid(
                field,
                format!(
                    "{} resolves to a non-UTF-8 path; rename the directory",
                    quote(command)
                ),
            )
        })
    }

    fn extends(&mut self, plugin: &Table, plugin_id: &str) -> Result<Extends, ManifestError> {
        const P: &str = "plugin.extends";
        let mut ext = Extends::default();
        let Some(t) = self.optional_table(plugin, "plugin", "extends")? else {
            return Ok(ext);
        };
        self.check_keys(t, P, &EXTENDS_SECTIONS, Unknown::Error)?;
        // id -> field where it was first seen, across all five lists.
        let mut seen: HashMap<String, String> = HashMap::new();
        for section in EXTENDS_SECTIONS {
            let mut list = Vec::new();
            for (field, id) in self.string_list(t, P, section)? {
                if !is_valid_plugin_id(id) {
                    return Err(self.invalid(
                        field,
                        format!(
                            "{} is not a valid id; use 1-32 characters of a-z, 0-9 and _, starting with a letter",
                            quote(id)
                        ),
                    ));
                }
                if let Some(first) = seen.get(id) {
                    let msg = if first.starts_with(&format!("{P}.{section}[")) {
                        format!(
                            "{} is listed twice (first at {first}); remove the duplicate",
                            quote(id)
                        )
                    } else {
                        format!(
                            "{} is already declared at {first}; an id may appear in only one extends list, remove one",
                            quote(id)
                        )
                    };
                    return Err(self.invalid(field, msg));
                }
                if section == "tools" && !tool_in_namespace(plugin_id, id) {
                    return Err(ManifestError::ToolOutsideNamespace {
                        path: self.path.to_path_buf(),
                        field,
                        tool: id.to_owned(),
                        plugin_id: plugin_id.to_owned(),
                    });
                }
                seen.insert(id.to_owned(), field);
                list.push(id.to_owned());
            }
            *match section {
                "channels" => &mut ext.channels,
                "llm_providers" => &mut ext.llm_providers,
                "memory_backends" => &mut ext.memory_backends,
                "hooks" => &mut ext.hooks,
                _ => &mut ext.tools,
            } = list;
        }
        Ok(ext)
    }

    fn channels(&mut self, plugin: &Table) -> Result<Vec<ChannelRegistration>, ManifestError> {
        const P: &str = "plugin.channels";
        let Some(t) = self.optional_table(plugin, "plugin", "channels")? else {
            return Ok(Vec::new());
        };
        self.check_keys(t, P, CHANNELS_KEYS, Unknown::Error)?;
        let Some(v) = t.get("register") else {
            return Ok(Vec::new());
        };
        let field = "plugin.channels.register";
        let arr = v.as_array().ok_or_else(|| {
            self.wrong_type(
                field,
                "an array of tables ([[plugin.channels.register]])",
                v,
            )
        })?;
        let mut out = Vec::new();
        let mut kinds: HashMap<&str, String> = HashMap::new();
        for (i, item) in arr.iter().enumerate() {
            let prefix = format!("{field}[{i}]");
            let entry = self.table(item, &prefix)?;
            self.check_keys(entry, &prefix, REGISTER_KEYS, Unknown::Error)?;
            let kind = self.required_string(entry, &prefix, "kind")?;
            let kind_field = format!("{prefix}.kind");
            if !is_valid_plugin_id(kind) {
                return Err(self.invalid(
                    kind_field,
                    format!(
                        "{} is not a valid channel kind; use 1-32 characters of a-z, 0-9 and _, starting with a letter",
                        quote(kind)
                    ),
                ));
            }
            if let Some(first) = kinds.get(kind) {
                return Err(self.invalid(
                    kind_field,
                    format!("channel kind {} is registered twice (first at {first}); remove the duplicate", quote(kind)),
                ));
            }
            kinds.insert(kind, kind_field);
            let adapter = self.optional_string(entry, &prefix, "adapter")?;
            out.push(ChannelRegistration {
                kind: kind.to_owned(),
                adapter: adapter.map(str::to_owned),
            });
        }
        Ok(out)
    }

    fn supervisor(&mut self, plugin: &Table) -> Result<SupervisorSpec, ManifestError> {
        const P: &str = "plugin.supervisor";
        let mut sup = SupervisorSpec::default();
        let Some(t) = self.optional_table(plugin, "plugin", "supervisor")? else {
            return Ok(sup);
        };
        self.check_keys(t, P, SUPERVISOR_KEYS, Unknown::Warn)?;
        if let Some(start) = self.optional_string(t, P, "start")? {
            sup.start = match start {
                "lazy" => StartMode::Lazy,
                "eager" => StartMode::Eager,
                other => {
                    return Err(self.invalid(
                        "plugin.supervisor.start",
                        format!(
                            "{} is not a start mode; use \"lazy\" or \"eager\"",
                            quote(other)
                        ),
                    ));
                }
            };
        }
        if let Some(n) = self.integer(
            t,
            P,
            "restart_attempts",
            0,
            i64::from(SupervisorSpec::MAX_RESTART_ATTEMPTS),
        )? {
            sup.restart_attempts =
                u32::try_from(n).unwrap_or(SupervisorSpec::DEFAULT_RESTART_ATTEMPTS);
        }
        let set = |key: &str, slot: &mut Duration| -> Result<(), ManifestError> {
            if let Some(d) = self.duration_ms(t, P, key)? {
                *slot = d;
            }
            Ok(())
        };
        set("backoff_base_ms", &mut sup.backoff_base)?;
        set("backoff_max_ms", &mut sup.backoff_max)?;
        set("stable_after_ms", &mut sup.stable_after)?;
        set("shutdown_timeout_ms", &mut sup.shutdown_timeout)?;
        set("shutdown_grace_ms", &mut sup.shutdown_grace)?;
        sup.init_timeout = self.duration_ms(t, P, "init_timeout_ms")?;
        sup.call_timeout = self.duration_ms(t, P, "call_timeout_ms")?;
        if sup.backoff_base > sup.backoff_max {
            return Err(self.invalid(
                "plugin.supervisor.backoff_base_ms",
                format!(
                    "{} is larger than backoff_max_ms ({}); lower backoff_base_ms or raise backoff_max_ms",
                    sup.backoff_base.as_millis(),
                    sup.backoff_max.as_millis()
                ),
            ));
        }
        Ok(sup)
    }

    /// An optional `*_ms` duration: an integer from 1 ms to one hour.
    fn duration_ms(
        &self,
        t: &Table,
        prefix: &str,
        key: &str,
    ) -> Result<Option<Duration>, ManifestError> {
        let max = i64::try_from(SupervisorSpec::MAX_DURATION.as_millis()).unwrap_or(i64::MAX);
        Ok(self
            .integer(t, prefix, key, 1, max)?
            .map(|ms| Duration::from_millis(ms.unsigned_abs())))
    }

    fn sandbox(
        &mut self,
        plugin: &Table,
        opts: &LoadOptions,
    ) -> Result<Option<SandboxSpec>, ManifestError> {
        const P: &str = "plugin.sandbox";
        let Some(t) = self.optional_table(plugin, "plugin", "sandbox")? else {
            return Ok(None);
        };
        self.check_keys(t, P, SANDBOX_KEYS, Unknown::Error)?;
        let enabled = self.optional_bool(t, P, "enabled")?.unwrap_or(false);
        let network = match self.optional_string(t, P, "network")? {
            None | Some("deny") => SandboxNetwork::Deny,
            Some("host") => {
                if !opts.sandbox_host_net_allow {
                    return Err(ManifestError::SandboxHostNetworkWithoutCapability {
                        path: self.path.to_path_buf(),
                        field: "plugin.sandbox.network".to_owned(),
                    });
                }
                SandboxNetwork::Host
            }
            Some(other) => {
                return Err(self.invalid(
                    "plugin.sandbox.network",
                    format!(
                        "{} is not a network mode; use \"deny\" or \"host\"",
                        quote(other)
                    ),
                ));
            }
        };

        let mut fs_read_paths = Vec::new();
        for (field, entry) in self.string_list(t, P, "fs_read_paths")? {
            if entry.contains("${") {
                return Err(self.bad_interpolation(
                    field,
                    entry,
                    "interpolation is not allowed in fs_read_paths",
                ));
            }
            self.check_path(&field, entry)?;
            fs_read_paths.push(PathBuf::from(entry));
        }

        let mut fs_write_paths = Vec::new();
        let mut seen_write = HashSet::new();
        for (field, entry) in self.string_list(t, P, "fs_write_paths")? {
            if let Some(rest) = entry.strip_prefix(STATE_DIR_TOKEN) {
                let ok_shape = rest.is_empty() || rest.starts_with('/');
                if !ok_shape {
                    return Err(self.bad_interpolation(
                        field,
                        entry,
                        "\"${state_dir}\" must be the whole entry or be followed by '/'",
                    ));
                }
                if rest.contains("${") {
                    return Err(self.bad_interpolation(
                        field,
                        entry,
                        "only one interpolation is allowed",
                    ));
                }
                if rest.contains('\0') {
                    return Err(self.invalid(
                        field,
                        format!("{} contains a NUL byte; remove it", quote(entry)),
                    ));
                }
                if rest.split('/').any(|c| c == "..") {
                    return Err(self.bad_interpolation(
                        field,
                        entry,
                        "\"..\" would leave the state directory",
                    ));
                }
            } else if entry.contains("${") {
                return Err(self.bad_interpolation(
                    field,
                    entry,
                    "\"${...}\" is only allowed as the leading \"${state_dir}\"",
                ));
            } else {
                self.check_path(&field, entry)?;
            }
            if seen_write.insert(entry) {
                fs_write_paths.push(entry.to_owned());
            }
        }
        let drop_user = self.optional_bool(t, P, "drop_user")?.unwrap_or(true);

        Ok(enabled.then_some(SandboxSpec {
            network,
            fs_read_paths,
            fs_write_paths,
            drop_user,
        }))
    }

    fn limits(&mut self, plugin: &Table) -> Result<LimitsSpec, ManifestError> {
        const P: &str = "plugin.limits";
        let Some(t) = self.optional_table(plugin, "plugin", "limits")? else {
            return Ok(LimitsSpec::default());
        };
        self.check_keys(t, P, LIMITS_KEYS, Unknown::Error)?;
        let get = |key: &str, max: u64| -> Result<Option<u64>, ManifestError> {
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            Ok(self.integer(t, P, key, 1, max)?.map(|n| n.unsigned_abs()))
        };
        Ok(LimitsSpec {
            address_space_mb: get("address_space_mb", LimitsSpec::MAX_ADDRESS_SPACE_MB)?,
            open_files: get("open_files", LimitsSpec::MAX_OPEN_FILES)?,
            processes: get("processes", LimitsSpec::MAX_PROCESSES)?,
            cpu_seconds: get("cpu_seconds", LimitsSpec::MAX_CPU_SECONDS)?,
        })
    }

    fn bad_interpolation(&self, field: String, entry: &str, reason: &str) -> ManifestError {
        ManifestError::SandboxInvalidStateDirInterpolation {
            path: self.path.to_path_buf(),
            field,
            entry: entry.to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// Absolute-path and denylist check for one sandbox allowlist entry.
    fn check_path(&self, field: &str, entry: &str) -> Result<(), ManifestError> {
        if entry.contains('\0') {
            return Err(self.invalid(
                field,
                format!("{} contains a NUL byte; remove it", quote(entry)),
            ));
        }
        match check_sandbox_path(Path::new(entry)) {
            Ok(_) => Ok(()),
            Err(SandboxPathError::Relative { .. }) => Err(ManifestError::SandboxRelativePath {
                path: self.path.to_path_buf(),
                field: field.to_owned(),
                entry: entry.to_owned(),
            }),
            Err(SandboxPathError::Denylisted {
                resolved, denied, ..
            }) => Err(ManifestError::SandboxAllowlistTouchesDenylist {
                path: self.path.to_path_buf(),
                field: field.to_owned(),
                entry: entry.to_owned(),
                resolved,
                denied: denied.to_owned(),
            }),
            Err(e) => Err(self.invalid(field, e.to_string())),
        }
    }
}
