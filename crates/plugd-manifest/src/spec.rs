//! The normalized, dialect-agnostic plugin model ([`PluginSpec`]) every manifest parser produces.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// The literal token in `[plugin.sandbox] fs_write_paths` that the host
/// expands to the plugin's per-instance state directory (seed §2.2).
pub const STATE_DIR_TOKEN: &str = "${state_dir}";

/// The five `[plugin.extends]` lists, in manifest order (seed §2.1, §4.1.1).
///
/// The set is closed on purpose: adding a capability surface is a change to
/// this crate, and unknown keys in `[plugin.extends]` are errors.
pub const EXTENDS_SECTIONS: [&str; 5] = [
    "channels",
    "llm_providers",
    "memory_backends",
    "hooks",
    "tools",
];

/// Which manifest format a [`PluginSpec`] was read from.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// The nexo Plugin Contract manifest, `nexo-plugin.toml`.
    Native,
    /// A nexo microapp, declared in the workspace's `extensions.yaml`.
    Microapp,
    /// A Salmex I/O plugin, `plugin.json`.
    Salmex,
    /// A VAI gateway package, `vai-plugin.toml`.
    Vai,
    /// An MCP server over stdio, declared in the workspace's `.mcp.json`.
    Mcp,
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dialect::Native => "native",
            Dialect::Microapp => "microapp",
            Dialect::Salmex => "salmex",
            Dialect::Vai => "vai",
            Dialect::Mcp => "mcp",
        })
    }
}

/// One plugin, normalized and validated, whatever dialect it came from.
#[derive(Debug, Clone, Serialize)]
pub struct PluginSpec {
    /// Plugin id, `^[a-z][a-z0-9_]{0,31}$` (native: `plugin.id`). The host
    /// checks the child echoes this id in its `initialize` reply.
    pub id: String,
    /// Plugin version, validated as semver (native: `plugin.version`).
    pub version: String,
    /// Human-readable name (native: `plugin.name`).
    pub name: Option<String>,
    /// One-line description (native: `plugin.description`).
    pub description: Option<String>,
    /// The manifest format this spec was read from.
    pub dialect: Dialect,
    /// Canonical plugin directory (the directory holding the manifest).
    pub dir: PathBuf,
    /// Path of the manifest file the spec was read from.
    pub manifest_path: PathBuf,
    /// What to run (native: `[plugin.entrypoint]`).
    pub command: CommandSpec,
    /// Tool names the plugin declares (native: `[plugin.extends] tools`).
    /// Every name is in the plugin's namespace, see [`crate::tool_in_namespace`].
    pub declared_tools: Vec<String>,
    /// Start/restart/timeout policy (native: `[plugin.supervisor]`).
    pub supervisor: SupervisorSpec,
    /// Sandbox policy; `Some` only when `[plugin.sandbox] enabled = true`.
    pub sandbox: Option<SandboxSpec>,
    /// Resource limits (native: `[plugin.limits]`); all `None` when unset.
    pub limits: LimitsSpec,
    /// The nexo-specific rest of a native manifest; `None` for other dialects.
    pub native: Option<NativeSpec>,
    /// Whether the approval digest covers the files of [`PluginSpec::dir`]
    /// (false for MCP servers, whose `dir` is only their working directory).
    pub pin_dir: bool,
    /// Declaration data outside `dir` that the approval digest also covers
    /// (the `extensions.yaml` / `.mcp.json` entry); `Null` when none.
    pub pinned: serde_json::Value,
    /// Tools the manifest itself defines with their schemas (Salmex
    /// `capabilities.tools`, VAI tool exports); empty when tools are only
    /// known from the handshake.
    pub tools: Vec<DeclaredTool>,
    /// Salmex-specific rest of `plugin.json`.
    pub salmex: Option<crate::salmex::SalmexSpec>,
    /// VAI-specific rest of `vai-plugin.toml`.
    pub vai: Option<crate::vai::VaiSpec>,
    /// Microapp-specific rest of the `extensions.yaml` entry.
    pub microapp: Option<crate::microapp::MicroappSpec>,
    /// MCP-specific rest of the `.mcp.json` entry.
    pub mcp: Option<crate::mcp::McpSpec>,
    /// Non-fatal findings (e.g. tolerated unknown keys), shown by
    /// `plugd plugin show`. Each is a lower-case sentence naming the field.
    pub warnings: Vec<String>,
}

impl PluginSpec {
    /// `[plugin.extends]` of a native plugin; `None` for every other dialect
    /// (only native plugins serve channels, LLM providers, memory backends
    /// and hooks through the nexo methods).
    pub fn native_extends(&self) -> Option<&Extends> {
        self.native
            .as_ref()
            .filter(|_| self.dialect == Dialect::Native)
            .map(|n| &n.extends)
    }

    /// This spec with its plugin directory moved to `run_dir` (the
    /// approval's read-only pin): the directory, the manifest path, the
    /// program, every argument and environment value, read path and
    /// microapp entry file that pointed into [`PluginSpec::dir`] now point
    /// at the same place inside `run_dir`. Relative arguments stay as they
    /// are (they resolve against the working directory, which becomes
    /// `run_dir`). A spec that does not pin its directory (MCP) is returned
    /// unchanged.
    pub fn rebased(&self, run_dir: &Path) -> PluginSpec {
        let mut out = self.clone();
        if !self.pin_dir {
            return out;
        }
        let from = self.dir.as_path();
        let move_path = |p: &Path| -> Option<PathBuf> {
            p.strip_prefix(from).ok().map(|rest| {
                if rest.as_os_str().is_empty() {
                    run_dir.to_path_buf()
                } else {
                    run_dir.join(rest)
                }
            })
        };
        let move_str = |s: &str| -> String {
            let p = Path::new(s);
            if !p.is_absolute() {
                return s.to_owned();
            }
            move_path(p).map_or_else(|| s.to_owned(), |p| p.to_string_lossy().into_owned())
        };
        out.dir = run_dir.to_path_buf();
        if let Some(p) = move_path(&self.manifest_path) {
            out.manifest_path = p;
        }
        out.command.program = move_str(&self.command.program);
        out.command.args = self.command.args.iter().map(|a| move_str(a)).collect();
        for v in out.command.env.values_mut() {
            *v = move_str(v);
        }
        if let Some(sb) = out.sandbox.as_mut() {
            for p in sb.fs_read_paths.iter_mut() {
                if let Some(moved) = move_path(p) {
                    *p = moved;
                }
            }
        }
        if let Some(m) = out.microapp.as_mut()
            && let Some(p) = move_path(&m.entry_file)
        {
            m.entry_file = p;
        }
        out
    }

    /// A spec with every optional part empty, for dialect loaders to fill
    /// with struct-update syntax (`..PluginSpec::base()`). Its id, version,
    /// dir and command are placeholders that every loader sets.
    pub fn base() -> PluginSpec {
        PluginSpec {
            id: String::new(),
            version: String::new(),
            name: None,
            description: None,
            dialect: Dialect::Native,
            dir: PathBuf::new(),
            manifest_path: PathBuf::new(),
            command: CommandSpec::default(),
            declared_tools: Vec::new(),
            supervisor: SupervisorSpec::default(),
            sandbox: None,
            limits: LimitsSpec::default(),
            native: None,
            warnings: Vec::new(),
            pin_dir: true,
            pinned: serde_json::Value::Null,
            tools: Vec::new(),
            salmex: None,
            vai: None,
            microapp: None,
            mcp: None,
        }
    }
}

/// A tool defined in a manifest (rather than only advertised at handshake).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeclaredTool {
    /// The name `plugd tool call` accepts (namespaced, e.g. `hello-node/say_hello`).
    pub name: String,
    /// The name on the wire (e.g. `say_hello`, or a VAI export id).
    pub wire_name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: serde_json::Value,
    /// Risk level (`low`, `medium`, `high`, `critical`) when the manifest says.
    pub risk_level: Option<String>,
}

/// The child process to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct CommandSpec {
    /// Program to execute (native: `plugin.entrypoint.command`). Either an
    /// absolute path, a bare name the host looks up in `PATH`, or — when the
    /// manifest gave a relative path containing `/` — the resolved absolute
    /// path inside the plugin directory.
    pub program: String,
    /// Arguments (native: `plugin.entrypoint.args`).
    pub args: Vec<String>,
    /// Extra environment (native: `plugin.entrypoint.env`). Keys never start
    /// with `NEXO_` or `PLUGD_`, which belong to the host.
    pub env: BTreeMap<String, String>,
}

/// When the host starts the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StartMode {
    /// Start on first use (a tool call or event). The default.
    #[default]
    Lazy,
    /// Start when the host starts.
    Eager,
}

/// Supervisor policy (native: `[plugin.supervisor]`). Durations serialize as
/// integer milliseconds, like the manifest keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SupervisorSpec {
    /// `start = "lazy" | "eager"`; default lazy.
    pub start: StartMode,
    /// `restart_attempts`: restarts allowed before the plugin is marked
    /// failed; default 3, at most 100.
    pub restart_attempts: u32,
    /// `backoff_base_ms`: first restart delay, doubling per attempt; default 1 s.
    #[serde(rename = "backoff_base_ms", serialize_with = "ser_ms")]
    pub backoff_base: Duration,
    /// `backoff_max_ms`: cap on the restart delay; default 60 s.
    #[serde(rename = "backoff_max_ms", serialize_with = "ser_ms")]
    pub backoff_max: Duration,
    /// `stable_after_ms`: uptime after which the restart budget resets;
    /// default 60 s.
    #[serde(rename = "stable_after_ms", serialize_with = "ser_ms")]
    pub stable_after: Duration,
    /// `init_timeout_ms`: how long to wait for the `initialize` reply;
    /// `None` = host default (5 s, or `NEXO_PLUGIN_INIT_TIMEOUT_MS`).
    #[serde(rename = "init_timeout_ms", serialize_with = "ser_opt_ms")]
    pub init_timeout: Option<Duration>,
    /// `call_timeout_ms`: how long to wait for a call reply; `None` = host
    /// default (60 s, or the host's env override).
    #[serde(rename = "call_timeout_ms", serialize_with = "ser_opt_ms")]
    pub call_timeout: Option<Duration>,
    /// `shutdown_timeout_ms`: how long to wait for the `shutdown` reply;
    /// default 2 s.
    #[serde(rename = "shutdown_timeout_ms", serialize_with = "ser_ms")]
    pub shutdown_timeout: Duration,
    /// `shutdown_grace_ms`: after the reply, how long to wait for the process
    /// to exit before SIGKILL; default 1 s.
    #[serde(rename = "shutdown_grace_ms", serialize_with = "ser_ms")]
    pub shutdown_grace: Duration,
}

impl SupervisorSpec {
    /// Default `restart_attempts`.
    pub const DEFAULT_RESTART_ATTEMPTS: u32 = 3;
    /// Largest accepted `restart_attempts`.
    pub const MAX_RESTART_ATTEMPTS: u32 = 100;
    /// Largest accepted duration (any `*_ms` key): one hour.
    pub const MAX_DURATION: Duration = Duration::from_secs(3600);
}

impl Default for SupervisorSpec {
    fn default() -> Self {
        Self {
            start: StartMode::Lazy,
            restart_attempts: Self::DEFAULT_RESTART_ATTEMPTS,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            stable_after: Duration::from_secs(60),
            init_timeout: None,
            call_timeout: None,
            shutdown_timeout: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

/// Network policy inside the sandbox (`[plugin.sandbox] network`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SandboxNetwork {
    /// `"deny"`: a fresh network namespace (`bwrap --unshare-net`). Default.
    #[default]
    Deny,
    /// `"host"`: share the host network. Only accepted when the operator set
    /// `NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1` ([`crate::LoadOptions`]).
    Host,
}

/// Sandbox policy (native: `[plugin.sandbox]`, seed §2.2).
///
/// Paths were checked against [`crate::SANDBOX_DENYLIST`] at load time; the
/// host should re-run [`crate::check_sandbox_path`] right before binding,
/// since the filesystem may have changed since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxSpec {
    /// `network = "deny" | "host"`; default deny.
    pub network: SandboxNetwork,
    /// `fs_read_paths`: absolute paths bound read-only, as written in the
    /// manifest.
    pub fs_read_paths: Vec<PathBuf>,
    /// `fs_write_paths`: paths bound read-write. Absolute, or
    /// [`STATE_DIR_TOKEN`] alone, or `${state_dir}/relative/path` (no `..`);
    /// the host expands the token.
    pub fs_write_paths: Vec<String>,
    /// `drop_user`: run as nobody (uid/gid 65534) via `--unshare-user`;
    /// default true.
    pub drop_user: bool,
}

/// Resource limits a manifest asks for (native: `[plugin.limits]`); the
/// host applies them with `setrlimit` before `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct LimitsSpec {
    /// `address_space_mb`: `RLIMIT_AS` in MiB (1 ..= 1 048 576).
    pub address_space_mb: Option<u64>,
    /// `open_files`: `RLIMIT_NOFILE` (1 ..= 1 048 576).
    pub open_files: Option<u64>,
    /// `processes`: `RLIMIT_NPROC` (1 ..= 1 000 000).
    pub processes: Option<u64>,
    /// `cpu_seconds`: `RLIMIT_CPU` in seconds (1 ..= 86 400).
    pub cpu_seconds: Option<u64>,
}

impl LimitsSpec {
    /// Largest `address_space_mb` (1 TiB).
    pub const MAX_ADDRESS_SPACE_MB: u64 = 1_048_576;
    /// Largest `open_files`.
    pub const MAX_OPEN_FILES: u64 = 1_048_576;
    /// Largest `processes`.
    pub const MAX_PROCESSES: u64 = 1_000_000;
    /// Largest `cpu_seconds` (a day).
    pub const MAX_CPU_SECONDS: u64 = 86_400;
}

/// The nexo-specific parts of a native manifest that have no dialect-neutral
/// home in [`PluginSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct NativeSpec {
    /// `[plugin.requires]`.
    pub requires: Requires,
    /// `[plugin.extends]`, all five lists.
    pub extends: Extends,
    /// `[[plugin.channels.register]]` entries.
    pub channels: Vec<ChannelRegistration>,
    /// `plugin.min_nexo_version`: a semver requirement (e.g. `">=0.1.0"`),
    /// validated to parse as `semver::VersionReq`.
    pub min_nexo_version: Option<String>,
    /// `plugin.config_schema`: the JSON Schema of the plugin's settings
    /// (inline or read from a JSON file in the plugin), checked by
    /// [`crate::config_schema::check`]. Secrets are `"writeOnly": true`.
    pub config_schema: Option<serde_json::Value>,
}

/// `[plugin.requires]`: host capabilities the plugin needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Requires {
    /// `nexo_capabilities`: capability names, e.g. `["broker"]`.
    pub nexo_capabilities: Vec<String>,
}

/// `[plugin.extends]`: ids the plugin contributes to host registries. Each id
/// is a slug, unique within its list and across all five lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Extends {
    /// `channels`: channel adapter ids.
    pub channels: Vec<String>,
    /// `llm_providers`: LLM provider ids.
    pub llm_providers: Vec<String>,
    /// `memory_backends`: memory backend ids.
    pub memory_backends: Vec<String>,
    /// `hooks`: hook ids.
    pub hooks: Vec<String>,
    /// `tools`: tool names, each in the plugin's namespace
    /// (`<id>_*` or `ext_<id>_*`).
    pub tools: Vec<String>,
}

/// One `[[plugin.channels.register]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChannelRegistration {
    /// `kind`: channel kind slug, unique within the manifest; drives the
    /// broker topic allowlist.
    pub kind: String,
    /// `adapter`: optional adapter name (e.g. `"SlackChannelAdapter"`).
    pub adapter: Option<String>,
}

fn ser_ms<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ser_opt_ms<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_ms(d, s),
        None => s.serialize_none(),
    }
}
