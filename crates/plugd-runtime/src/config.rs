//! `DIR/plugd.yaml`: the workspace's agent configuration — hook handlers
//! (`plugins:`, Dexto's YAML extended for remote handlers), the LLM provider
//! (`llm:`), eager plugins (`eager:`), tenant context defaults (`tenant:`),
//! the agent turn (`agent:`), the risk policy (`risk:`, parsed in
//! `risk.rs`), broker grants (`broker:`, in `broker_config.rs`) and what
//! hosted MCP servers are offered (`mcp:`, in `mcp_config.rs`). Its JSON Schema is `docs/plugd.schema.json`
//! ([`SCHEMA`]).
//!
//! Rules:
//! * a missing or empty file is the empty configuration;
//! * unknown keys are errors naming the key and its line (serde-saphyr
//!   reports the position, as in the microapp loader);
//! * `${{dexto.agent_dir}}` and `${{workspace_dir}}` expand to the workspace
//!   directory in module paths, module `config` values and `llm.script`;
//!   those paths must be absolute after expansion;
//! * a `plugins.custom` entry has `module:` (a Dexto module: a file path, or
//!   an npm package of the workspace's `node_modules`, see
//!   [`crate::hooks::dexto_package`]) XOR `plugin:` (a plugd plugin of any
//!   dialect), see [`Binding`] for how a plugin entry names its point;
//! * `tools:` is reserved for per-tool overrides: only `{}` is accepted now.
//!
//! Why one file: `plugd.yaml` is one document parsed in one pass, so every
//! error names its field and line; the sections with rules of their own live
//! in their own modules (`risk_config`, `memory_config`, `mcp_config`,
//! `broker_config`, `hook_specs`), and what stays here is the document, its
//! dispatch and the `plugins:` section.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_saphyr::Spanned;

pub use plugd_governance::plugd_yaml::{
    CONFIG_FILE, ConfigError, MAX_CONFIG_BYTES, yaml_error, yaml_options,
};

use crate::hooks::{HandlerSpec, HookContext, HookPoint, OnError};
use crate::llm::LlmConfig;

/// The JSON Schema of `plugd.yaml` (`docs/plugd.schema.json`).
pub const SCHEMA: &str = include_str!("../../../docs/plugd.schema.json");

/// The templates that expand to the workspace directory.
pub const TEMPLATES: [&str; 2] = ["${{dexto.agent_dir}}", "${{workspace_dir}}"];

pub use crate::hooks::MAX_TIMEOUT_MS;

/// Default `agent.max_tool_rounds`.
pub const DEFAULT_MAX_TOOL_ROUNDS: u32 = 8;

/// The whole of `plugd.yaml`, validated, with templates expanded.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PlugdConfig {
    /// The file it was read from (`None`: no file, the empty configuration).
    pub path: Option<PathBuf>,
    /// The workspace directory the templates expanded to.
    pub workspace: PathBuf,
    /// `plugins:`: the hook handlers.
    pub plugins: PluginsConfig,
    /// `llm:`: the LLM provider of the agent turn.
    pub llm: Option<LlmConfig>,
    /// `eager:`: plugin ids `plugd serve` starts at once.
    pub eager: Vec<String>,
    /// `tenant:`: defaults for every hook run's context (a request's own
    /// context fields win).
    pub tenant: HookContext,
    /// `agent:`: the agent turn.
    pub agent: AgentConfig,
    /// `require_signatures:` and `trusted_publishers:` (see [`crate::signing`]).
    pub signing: crate::signing::SigningPolicy,
    /// `risk:`: per-tool risk levels and the approval timeout.
    pub risk: crate::risk_config::RiskConfig,
    /// `limits:`: rate limits and quotas per identity, tool or org
    /// ([`crate::limits`]).
    pub limits: crate::limits::LimitsConfig,
    /// `sandbox:`: sandbox fallback, per-plugin sandbox policy, limits and
    /// VAI grants ([`crate::containment`]).
    pub sandbox: crate::containment::SandboxConfig,
    /// `memory:`: agent memory and semantic recall ([`crate::memory_config`];
    /// what memory does with it is plugd-agent's `recall`).
    pub memory: crate::memory_config::MemoryConfig,
    /// `broker:`: subjects granted to plugins beyond their channels
    /// ([`crate::broker_config`]).
    pub broker: crate::broker_config::BrokerConfig,
    /// `host_services:`: nexo host services denied per plugin
    /// ([`crate::broker_config::HostServicesConfig`]).
    pub host_services: crate::broker_config::HostServicesConfig,
    /// `llm_providers:`: named providers `llm.complete {provider}` reaches
    /// (each in the `llm:` form), beside `llm:` and plugin providers.
    pub llm_providers: std::collections::BTreeMap<String, LlmConfig>,
    /// `http:`: limits of `plugd serve`'s listeners.
    pub http: HttpConfig,
    /// What hosted MCP servers are offered (`mcp:`, in `mcp_config.rs`).
    pub mcp: crate::mcp_config::McpConfig,
    /// `invocations:`: how long invocation records are kept, and (from
    /// `records:`) whether they keep bodies ([`crate::invocations`]).
    pub invocations: crate::invocations::InvocationsConfig,
    /// `marketplace:`: the signed index and its mode
    /// ([`crate::marketplace`]); `None` when not set.
    pub marketplace: Option<crate::marketplace::MarketplaceConfig>,
    /// `state:`: where the state is kept when neither `plugd serve --state`
    /// nor `PLUGD_STATE` says (a `postgres://` URL); `None`: the
    /// workspace's SQLite file. Read when a node or command opens the
    /// store, never live.
    pub state: Option<String>,
    /// `cluster:`: this node's NATS and id when neither flags nor the
    /// environment say; read at start, never live.
    pub cluster: ClusterConfig,
    /// `console:`: where the operator console links out.
    pub console: ConsoleConfig,
    /// `auth:`: OAuth/OIDC issuers whose tokens serve accepts, and group →
    /// role mapping; read at start, never live.
    pub auth: crate::auth_config::AuthConfig,
}

/// `console:` in plugd.yaml.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// A trace viewer's address with `{trace_id}` where a trace id goes
    /// (`https://jaeger.internal/trace/{trace_id}`): an activity record's
    /// trace id links there. `http` or `https` only.
    #[serde(default)]
    pub trace_url: Option<String>,
}

/// `cluster:` of plugd.yaml: how `plugd serve` joins its cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClusterConfig {
    /// `nats:`: the cluster's NATS (`nats://` or `tls://` URLs, comma
    /// separated); `plugd serve --nats` and `PLUGD_NATS` win.
    pub nats: Option<String>,
    /// `node_id:`: this node's id; `--node-id` and `PLUGD_NODE_ID` win.
    pub node_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    #[serde(default)]
    nats: Option<String>,
    #[serde(default)]
    node_id: Option<String>,
}

/// `http:`: how `plugd serve` treats connections, on its Unix socket and
/// on `--listen` alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Seconds a connection may take to send a complete request head,
    /// counted from when it opens or its previous response ended: the
    /// slow-header guard and the keep-alive idle limit (default 10).
    #[serde(default = "default_header_timeout")]
    pub header_timeout_secs: u64,
    /// Seconds a request body may take to arrive (default 30).
    #[serde(default = "default_body_timeout")]
    pub body_timeout_secs: u64,
    /// Seconds a response write may stay blocked on a client that does not
    /// read (default 30).
    #[serde(default = "default_send_timeout")]
    pub send_timeout_secs: u64,
    /// Connections served at once per listener; beyond it a new one gets
    /// `503` and is closed (default 256).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections one peer may hold at once per listener (a uid on the
    /// socket, an address on TCP); beyond it `503` (default 128).
    #[serde(default = "default_max_connections_per_peer")]
    pub max_connections_per_peer: usize,
    /// TCP connections per listener that have not yet shown valid
    /// credentials; beyond it the oldest of them is closed to admit the new
    /// one, so clients without a token cannot starve token holders
    /// (default 32; kept below `max_connections`).
    #[serde(default = "default_max_unauthenticated")]
    pub max_unauthenticated: usize,
    /// Seconds a TCP connection may stay open without a request that
    /// authenticated (default 5).
    #[serde(default = "default_unauthenticated_timeout")]
    pub unauthenticated_timeout_secs: u64,
    /// Extra `Host` names (`name` or `name:port`) accepted on `--listen`
    /// besides its own address and `localhost` (default none).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

fn default_header_timeout() -> u64 {
    10
}
fn default_body_timeout() -> u64 {
    30
}
fn default_send_timeout() -> u64 {
    30
}
fn default_max_connections() -> usize {
    256
}
fn default_max_connections_per_peer() -> usize {
    128
}
fn default_max_unauthenticated() -> usize {
    32
}
fn default_unauthenticated_timeout() -> u64 {
    5
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_timeout_secs: default_header_timeout(),
            body_timeout_secs: default_body_timeout(),
            send_timeout_secs: default_send_timeout(),
            max_connections: default_max_connections(),
            max_connections_per_peer: default_max_connections_per_peer(),
            max_unauthenticated: default_max_unauthenticated(),
            unauthenticated_timeout_secs: default_unauthenticated_timeout(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// `agent:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Most LLM ↔ tool rounds in one turn (default 8, at least 1).
    #[serde(default = "default_rounds")]
    pub max_tool_rounds: u32,
    /// The system prompt of every turn.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Skills (`PLUGIN/NAME`, see `plugd skill list`) appended to the system
    /// prompt, each under a `## Skill PLUGIN/NAME` heading; one that cannot
    /// be read (plugin revoked, changed, skill too large) is left out with a
    /// warning.
    #[serde(default)]
    pub skills: Vec<String>,
    /// `compactor`: the VAI compactor export that compacts a session's
    /// chain when it outgrows its budget (none by default).
    #[serde(default)]
    pub compactor: Option<crate::compaction::CompactorConfig>,
}

fn default_rounds() -> u32 {
    DEFAULT_MAX_TOOL_ROUNDS
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            max_tool_rounds: DEFAULT_MAX_TOOL_ROUNDS,
            system_prompt: None,
            skills: Vec::new(),
            compactor: None,
        }
    }
}

/// `plugins:`: the two built-ins by name and the custom handlers.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PluginsConfig {
    /// `contentPolicy`.
    pub content_policy: Option<BuiltinConfig<ContentPolicySettings>>,
    /// `responseSanitizer`.
    pub response_sanitizer: Option<BuiltinConfig<ResponseSanitizerSettings>>,
    /// `custom`, in file order.
    pub custom: Vec<CustomEntry>,
}

/// A built-in's common fields and its own settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuiltinConfig<T> {
    /// Lower runs first.
    pub priority: i64,
    /// `false` skips it.
    pub enabled: bool,
    /// Whether its cancel stops the chain (content policy: default `true`;
    /// response sanitizer: default `false`, as in Dexto's registry).
    pub blocking: bool,
    /// Its settings.
    pub settings: T,
}

/// `contentPolicy` settings (the handler is plugd-agent's `ContentPolicy`).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ContentPolicySettings {
    /// `maxInputChars`.
    pub max_input_chars: Option<usize>,
    /// `redactEmails`.
    pub redact_emails: bool,
    /// `redactApiKeys`.
    pub redact_api_keys: bool,
}

/// `responseSanitizer` settings (the handler is plugd-agent's `ResponseSanitizer`).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ResponseSanitizerSettings {
    /// `redactEmails`.
    pub redact_emails: bool,
    /// `redactApiKeys`.
    pub redact_api_keys: bool,
    /// `maxResponseLength`.
    pub max_response_length: Option<usize>,
}

/// One `plugins.custom` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CustomEntry {
    /// `name`: unique among all handlers.
    pub name: String,
    /// `enabled` (default `true`); disabled entries are skipped and exempt
    /// from the priority uniqueness.
    pub enabled: bool,
    /// `blocking` (default `true`, as in Dexto).
    pub blocking: bool,
    /// `priority`: lower runs first.
    pub priority: i64,
    /// `on_error`; default `block` for blocking handlers, `continue` otherwise.
    pub on_error: Option<OnError>,
    /// `timeout_ms` (default 5 s).
    pub timeout: Duration,
    /// Where the handler comes from.
    pub source: Source,
    /// The line of the entry in the file (for messages).
    pub line: u64,
}

impl CustomEntry {
    /// The points the entry handles: a plugin entry's one point; for a
    /// Dexto module, the four Dexto points (the module's methods decide
    /// which it implements; the others pass).
    pub fn points(&self) -> Vec<HookPoint> {
        match &self.source {
            Source::Module { .. } | Source::Package { .. } => HookPoint::ALL
                .into_iter()
                .filter(|p| p.dexto_method().is_some())
                .collect(),
            Source::Plugin { binding, .. } => vec![binding.point()],
        }
    }

    /// The pipeline's view of the entry.
    pub fn spec(&self) -> HandlerSpec {
        HandlerSpec {
            name: self.name.clone(),
            points: self.points(),
            priority: self.priority,
            blocking: self.blocking,
            on_error: self.on_error,
            timeout: self.timeout,
        }
    }
}

/// Where a custom handler comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `module:`: a Dexto plugin module (absolute path) and its `config`.
    Module {
        /// The module file, absolute.
        module: PathBuf,
        /// `config`, passed to the module's `initialize`.
        config: Value,
    },
    /// `module:` naming an npm package (`@scope/name`, `name/sub/path`),
    /// resolved in the workspace's `node_modules` when the pipeline is
    /// built (see [`crate::hooks::dexto_package`]), and its `config`.
    Package {
        /// The specifier as written (its grammar checked).
        package: String,
        /// `config`, passed to the module's `initialize`.
        config: Value,
    },
    /// `plugin:`: a handler served by a plugd plugin.
    Plugin {
        /// The plugin id.
        plugin: String,
        /// How the entry binds to the plugin.
        binding: Binding,
    },
}

/// How a `plugin:` entry names its point and what it calls.
///
/// The rule:
/// * `tool: NAME` binds a tool (any dialect) as the handler; the point is
///   `point:`, or `hook:` when it is a point name.
/// * Otherwise `hook: NAME` is what the plugin serves: native plugins get
///   `hook.on_hook` with `hook_name: NAME` (NAME must be declared in
///   `[plugin.extends].hooks`), microapps get `hooks/NAME`. The point is
///   `point:`, or NAME itself when it is a point name
///   (`hook: before_message`).
/// * Salmex, VAI and MCP plugins have no hook method: they need `tool:`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Binding {
    /// The plugin's own hook method (native `hook.on_hook`, microapp `hooks/<hook>`).
    Hook {
        /// The hook name sent to the plugin.
        hook: String,
        /// The point.
        point: HookPoint,
    },
    /// A tool called with `{point, payload, context}`.
    Tool {
        /// The tool: its registry name or its name on the wire.
        tool: String,
        /// The point.
        point: HookPoint,
    },
}

impl Binding {
    /// The point the handler runs at.
    pub fn point(&self) -> HookPoint {
        match self {
            Binding::Hook { point, .. } | Binding::Tool { point, .. } => *point,
        }
    }
}

// ---- the file as read ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    #[serde(default)]
    plugins: Option<RawPlugins>,
    #[serde(default)]
    llm: Option<Spanned<LlmConfig>>,
    #[serde(default)]
    eager: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    tenant: Option<HookContext>,
    #[serde(default)]
    agent: Option<Spanned<AgentConfig>>,
    #[serde(default)]
    tools: Option<ToolsReserved>,
    #[serde(default)]
    require_signatures: Option<bool>,
    #[serde(default)]
    trusted_publishers: Option<Vec<Spanned<crate::signing::RawPublisher>>>,
    risk: Option<Spanned<crate::risk_config::RawRisk>>,
    #[serde(default)]
    policy: Option<Vec<Spanned<crate::tool_policy::RawRule>>>,
    limits: Option<Vec<Spanned<crate::limits::RawLimit>>>,
    sandbox: Option<crate::containment::RawSandbox>,
    memory: Option<Spanned<crate::memory_config::RawMemory>>,
    #[serde(default)]
    broker: Option<Spanned<crate::broker_config::RawBroker>>,
    #[serde(default)]
    host_services: Option<Spanned<crate::broker_config::RawHostServices>>,
    #[serde(default)]
    llm_providers: Option<std::collections::BTreeMap<String, Spanned<LlmConfig>>>,
    #[serde(default)]
    http: Option<Spanned<HttpConfig>>,
    #[serde(default)]
    mcp: Option<Spanned<crate::mcp_config::RawMcp>>,
    #[serde(default)]
    invocations: Option<Spanned<crate::invocations::InvocationsConfig>>,
    #[serde(default)]
    records: Option<Spanned<crate::invocations::RecordsConfig>>,
    #[serde(default)]
    marketplace: Option<Spanned<crate::marketplace::RawMarketplace>>,
    #[serde(default)]
    state: Option<Spanned<String>>,
    #[serde(default)]
    cluster: Option<Spanned<RawCluster>>,
    #[serde(default)]
    console: Option<Spanned<ConsoleConfig>>,
    #[serde(default)]
    auth: Option<Spanned<crate::auth_config::RawAuth>>,
}

/// `tools:` is reserved; only an empty mapping is accepted.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsReserved {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPlugins {
    #[serde(default)]
    content_policy: Option<RawContentPolicy>,
    #[serde(default)]
    response_sanitizer: Option<RawResponseSanitizer>,
    #[serde(default)]
    custom: Option<Vec<Spanned<RawCustom>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawContentPolicy {
    priority: i64,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    blocking: Option<bool>,
    #[serde(default)]
    max_input_chars: Option<usize>,
    #[serde(default)]
    redact_emails: Option<bool>,
    #[serde(default)]
    redact_api_keys: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawResponseSanitizer {
    priority: i64,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    blocking: Option<bool>,
    #[serde(default)]
    redact_emails: Option<bool>,
    #[serde(default)]
    redact_api_keys: Option<bool>,
    #[serde(default)]
    max_response_length: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCustom {
    name: String,
    priority: i64,
    #[serde(default)]
    module: Option<Spanned<String>>,
    #[serde(default)]
    plugin: Option<String>,
    #[serde(default)]
    hook: Option<Spanned<String>>,
    #[serde(default)]
    point: Option<HookPoint>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    blocking: Option<bool>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    on_error: Option<OnError>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

struct Cx<'a> {
    path: &'a Path,
    workspace: &'a str,
}

impl Cx<'_> {
    fn invalid(
        &self,
        field: impl Into<String>,
        line: u64,
        message: impl fmt::Display,
    ) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            field: field.into(),
            line,
            message: message.to_string(),
        }
    }

    /// Expands the templates in `s`; any other `${{…}}` is an error message.
    fn expand(&self, s: &str) -> Result<String, String> {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(at) = rest.find("${{") {
            out.push_str(&rest[..at]);
            let after = &rest[at..];
            let Some(end) = after.find("}}") else {
                return Err(format!(
                    "unterminated template in {s:?}; write {} or {}",
                    TEMPLATES[0], TEMPLATES[1]
                ));
            };
            let template = &after[..end + 2];
            if !TEMPLATES.contains(&template) {
                return Err(format!(
                    "unknown template {template} in {s:?}; the templates are {} and {} (both the workspace directory)",
                    TEMPLATES[0], TEMPLATES[1]
                ));
            }
            out.push_str(self.workspace);
            rest = &after[end + 2..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Expands `raw` and requires an absolute path.
    fn absolute(&self, field: &str, line: u64, raw: &str) -> Result<PathBuf, ConfigError> {
        let expanded = self.expand(raw).map_err(|m| self.invalid(field, line, m))?;
        let p = PathBuf::from(&expanded);
        if !p.is_absolute() {
            let rel = expanded.trim_start_matches("./");
            return Err(self.invalid(
                field,
                line,
                format!(
                    "{raw:?} is a relative path; paths must be absolute after expansion: write \"{}/{rel}\"",
                    TEMPLATES[0]
                ),
            ));
        }
        Ok(p)
    }

    fn expand_value(&self, v: &mut Value) -> Result<(), String> {
        match v {
            Value::String(s) => *s = self.expand(s)?,
            Value::Array(items) => {
                for i in items {
                    self.expand_value(i)?;
                }
            }
            Value::Object(map) => {
                for (_, i) in map.iter_mut() {
                    self.expand_value(i)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn point_names() -> String {
    HookPoint::ALL.map(HookPoint::name).join(", ")
}

impl PlugdConfig {
    /// Reads `workspace/plugd.yaml`; a missing file is the empty configuration.
    pub fn load(workspace: &Path) -> Result<PlugdConfig, ConfigError> {
        let path = workspace.join(CONFIG_FILE);
        let Some(text) = plugd_governance::plugd_yaml::read_text(workspace)? else {
            return Ok(PlugdConfig {
                workspace: workspace.to_path_buf(),
                ..PlugdConfig::default()
            });
        };
        PlugdConfig::parse(&text, &path, workspace)
    }

    /// Parses and validates `plugd.yaml` text; `path` names the file in
    /// errors and `workspace` is what the templates expand to.
    pub fn parse(text: &str, path: &Path, workspace: &Path) -> Result<PlugdConfig, ConfigError> {
        let raw: Option<RawDoc> = serde_saphyr::from_str_with_options(text, yaml_options())
            .map_err(|e| yaml_error(path, &e))?;
        let mut config = PlugdConfig {
            path: Some(path.to_path_buf()),
            workspace: workspace.to_path_buf(),
            ..PlugdConfig::default()
        };
        let Some(raw) = raw else {
            return Ok(config);
        };
        let ws = workspace.to_string_lossy();
        let cx = Cx {
            path,
            workspace: &ws,
        };
        let _ = raw.tools;
        if let Some(plugins) = raw.plugins {
            config.plugins = plugins_config(&cx, plugins)?;
        }
        if let Some(llm) = raw.llm {
            let line = llm.referenced.line();
            let mut llm = llm.value;
            if let LlmConfig::Scripted { script } = &mut llm {
                *script = cx.absolute("llm.script", line, &script.to_string_lossy())?;
            }
            llm.request_options()
                .check()
                .map_err(|m| cx.invalid("llm", line, m))?;
            config.llm = Some(llm);
        }
        for (i, id) in raw.eager.unwrap_or_default().into_iter().enumerate() {
            if id.value.trim().is_empty() {
                return Err(cx.invalid(
                    format!("eager[{i}]"),
                    id.referenced.line(),
                    "an empty plugin id; list the ids of plugins `plugd serve` starts at once",
                ));
            }
            config.eager.push(id.value);
        }
        if let Some(sandbox) = raw.sandbox {
            config.sandbox = crate::containment::sandbox_config(path, sandbox)?;
        }
        config.tenant = raw.tenant.unwrap_or_default();
        if let Some(agent) = raw.agent {
            if agent.value.max_tool_rounds == 0 {
                return Err(cx.invalid(
                    "agent.max_tool_rounds",
                    agent.referenced.line(),
                    "must be at least 1 (the default is 8)",
                ));
            }
            config.agent = agent.value;
        }
        config.signing = crate::signing::SigningPolicy::from_raw(
            path,
            raw.require_signatures,
            raw.trusted_publishers,
        )?;
        if let Some(risk) = raw.risk {
            config.risk = crate::risk_config::parse_config(risk, path)?;
        }
        if let Some(rules) = raw.policy {
            config.risk.rules = crate::tool_policy::parse_config(rules, path)?;
        }
        if let Some(limits) = raw.limits {
            config.limits = crate::limits::parse_config(limits, path)?;
        }
        if let Some(broker) = raw.broker {
            config.broker = crate::broker_config::parse_config(broker, path)?;
        }
        if let Some(mcp) = raw.mcp {
            config.mcp = crate::mcp_config::parse_config(mcp, path, workspace)?;
        }
        if let Some(services) = raw.host_services {
            config.host_services = crate::broker_config::parse_host_services(services, path)?;
        }
        for (name, llm) in raw.llm_providers.unwrap_or_default() {
            let line = llm.referenced.line();
            let mut llm = llm.value;
            if !crate::broker_config::provider_name_ok(&name) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field: format!("llm_providers.{name}"),
                    line,
                    message: format!(
                        "{name:?} is not a provider name; use ^[a-z][a-z0-9_]{{0,31}}$ as nexo does"
                    ),
                });
            }
            if let LlmConfig::Scripted { script } = &mut llm {
                *script = cx.absolute(
                    &format!("llm_providers.{name}.script"),
                    line,
                    &script.to_string_lossy(),
                )?;
            }
            llm.request_options()
                .check()
                .map_err(|m| cx.invalid(format!("llm_providers.{name}"), line, m))?;
            config.llm_providers.insert(name, llm);
        }
        if let Some(memory) = raw.memory {
            config.memory = crate::memory_config::parse_config(memory, path)?;
        }
        if let Some(http) = raw.http {
            let line = http.referenced.line();
            let h = http.value;
            for (field, v) in [
                ("http.header_timeout_secs", h.header_timeout_secs),
                ("http.body_timeout_secs", h.body_timeout_secs),
                ("http.send_timeout_secs", h.send_timeout_secs),
                ("http.max_connections", h.max_connections as u64),
            ] {
                if v == 0 {
                    return Err(cx.invalid(field, line, "must be at least 1"));
                }
            }
            config.http = h;
        }
        if let Some(inv) = raw.invocations {
            if inv.value.retention_days == 0 {
                let line = inv.referenced.line();
                return Err(cx.invalid("invocations.retention_days", line, "must be at least 1"));
            }
            config.invocations = inv.value;
        }
        if let Some(r) = raw.records {
            config.invocations.keep_bodies = r.value.keep_bodies;
        }
        if let Some(c) = raw.console {
            if let Some(url) = &c.value.trace_url {
                let web = url.starts_with("https://") || url.starts_with("http://");
                if !web || !url.contains("{trace_id}") {
                    let line = c.referenced.line();
                    return Err(cx.invalid(
                        "console.trace_url",
                        line,
                        "must be an http(s) URL with {trace_id} where the trace id goes",
                    ));
                }
            }
            config.console = c.value;
        }
        if let Some(a) = raw.auth {
            config.auth = crate::auth_config::parse_config(a, path)?;
        }
        if let Some(m) = raw.marketplace {
            config.marketplace = Some(crate::marketplace::parse_config(m, path, workspace)?);
        }
        if let Some(url) = raw.state {
            if !is_state_url(&url.value) {
                return Err(cx.invalid(
                    "state",
                    url.referenced.line(),
                    "a postgres:// (or postgresql://) URL; leave `state:` out for the workspace's SQLite file",
                ));
            }
            config.state = Some(url.value);
        }
        if let Some(c) = raw.cluster {
            let line = c.referenced.line();
            let RawCluster { nats, node_id } = c.value;
            if let Some(n) = &nats
                && !plugd_control::cluster::is_nats_url(n)
            {
                return Err(cx.invalid(
                    "cluster.nats",
                    line,
                    "nats:// or tls:// URLs, comma separated",
                ));
            }
            if let Some(id) = &node_id
                && !plugd_control::cluster::is_node_id(id)
            {
                return Err(cx.invalid(
                    "cluster.node_id",
                    line,
                    "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                ));
            }
            config.cluster = ClusterConfig { nats, node_id };
        }
        crate::mcp_config::check_upstream_issuers(&config.mcp, &config.auth.issuers, path)?;
        Ok(config)
    }

    /// The built-in and custom handler names, for messages.
    pub fn handler_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        if self.plugins.content_policy.is_some() {
            names.push(CONTENT_POLICY.to_owned());
        }
        if self.plugins.response_sanitizer.is_some() {
            names.push(RESPONSE_SANITIZER.to_owned());
        }
        names.extend(self.plugins.custom.iter().map(|c| c.name.clone()));
        names
    }

    /// `tenant` defaults overlaid with the fields `ctx` sets.
    pub fn context(&self, ctx: &HookContext) -> HookContext {
        self.tenant.overlaid(ctx)
    }
}

/// Checks `plugd.yaml` text against [`SCHEMA`] alone (shapes and types, not
/// the rules only plugd enforces); returns the violations, each naming its
/// JSON pointer. `Err` when the text is not YAML.
pub fn schema_violations(text: &str) -> Result<Vec<String>, String> {
    let schema: Value = serde_json::from_str(SCHEMA).map_err(|e| format!("the schema: {e}"))?;
    let doc: Value =
        serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| e.to_string())?;
    let validator = jsonschema::validator_for(&schema).map_err(|e| format!("the schema: {e}"))?;
    Ok(validator
        .iter_errors(&doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect())
}

/// The pipeline name of the `contentPolicy` built-in.
pub const CONTENT_POLICY: &str = "content_policy";
/// The pipeline name of the `responseSanitizer` built-in.
pub const RESPONSE_SANITIZER: &str = "response_sanitizer";

fn plugins_config(cx: &Cx<'_>, raw: RawPlugins) -> Result<PluginsConfig, ConfigError> {
    let mut out = PluginsConfig::default();
    if let Some(cp) = raw.content_policy {
        out.content_policy = Some(BuiltinConfig {
            priority: cp.priority,
            enabled: cp.enabled.unwrap_or(true),
            blocking: cp.blocking.unwrap_or(true),
            settings: ContentPolicySettings {
                max_input_chars: cp.max_input_chars,
                redact_emails: cp.redact_emails.unwrap_or(false),
                redact_api_keys: cp.redact_api_keys.unwrap_or(false),
            },
        });
    }
    if let Some(rs) = raw.response_sanitizer {
        out.response_sanitizer = Some(BuiltinConfig {
            priority: rs.priority,
            enabled: rs.enabled.unwrap_or(true),
            blocking: rs.blocking.unwrap_or(false),
            settings: ResponseSanitizerSettings {
                redact_emails: rs.redact_emails.unwrap_or(false),
                redact_api_keys: rs.redact_api_keys.unwrap_or(false),
                max_response_length: rs.max_response_length,
            },
        });
    }
    let mut names: BTreeSet<String> = [CONTENT_POLICY, RESPONSE_SANITIZER]
        .map(str::to_owned)
        .into();
    // Seed 002: "Priority must be unique across all enabled plugins" (the
    // built-ins included), whatever points they serve.
    let mut priorities: std::collections::BTreeMap<i64, String> = std::collections::BTreeMap::new();
    if let Some(cp) = out.content_policy.as_ref().filter(|c| c.enabled) {
        priorities.insert(cp.priority, "contentPolicy".to_owned());
    }
    if let Some(rs) = out.response_sanitizer.as_ref().filter(|c| c.enabled)
        && let Some(other) = priorities.insert(rs.priority, "responseSanitizer".to_owned())
    {
        return Err(cx.invalid(
            "plugins.responseSanitizer.priority",
            0,
            format!(
                "priority {} is also {other}'s; priorities must be unique across all enabled plugins (lower runs first)",
                rs.priority
            ),
        ));
    }
    for (i, entry) in raw.custom.unwrap_or_default().into_iter().enumerate() {
        let line = entry.referenced.line();
        let e = custom_entry(cx, i, line, entry.value)?;
        if e.enabled
            && let Some(other) = priorities.insert(e.priority, e.name.clone())
        {
            return Err(cx.invalid(
                format!("plugins.custom[{i}].priority"),
                line,
                format!(
                    "{:?} has priority {}, as {other:?} does; priorities must be unique across all enabled plugins, built-ins included (lower runs first)",
                    e.name, e.priority
                ),
            ));
        }
        if !names.insert(e.name.clone()) {
            return Err(cx.invalid(
                format!("plugins.custom[{i}].name"),
                line,
                format!(
                    "the name {:?} is already used by another handler; names must be unique",
                    e.name
                ),
            ));
        }
        out.custom.push(e);
    }
    Ok(out)
}

fn custom_entry(
    cx: &Cx<'_>,
    i: usize,
    line: u64,
    raw: RawCustom,
) -> Result<CustomEntry, ConfigError> {
    let at = |k: &str| format!("plugins.custom[{i}].{k}");
    let name = raw.name.trim().to_owned();
    if name.is_empty() {
        return Err(cx.invalid(
            at("name"),
            line,
            "the name is empty; give the handler a name for logs and errors",
        ));
    }
    let ctx_of = |k: &str| format!("{} ({name:?})", at(k));
    let timeout = match raw.timeout_ms {
        None => HandlerSpec::DEFAULT_TIMEOUT,
        Some(ms) if ms == 0 || ms > MAX_TIMEOUT_MS => {
            return Err(cx.invalid(
                ctx_of("timeout_ms"),
                line,
                format!(
                    "{ms} is out of range; use 1 to {MAX_TIMEOUT_MS} milliseconds (default 5000)"
                ),
            ));
        }
        Some(ms) => Duration::from_millis(ms),
    };
    let source = match (raw.module, raw.plugin) {
        (Some(_), Some(_)) => {
            return Err(cx.invalid(
                ctx_of("module"),
                line,
                "both module and plugin are set; a handler is either a Dexto module (module:) or a plugd plugin (plugin:), remove one",
            ));
        }
        (None, None) => {
            return Err(cx.invalid(
                ctx_of("module"),
                line,
                "neither module nor plugin is set; give module: \"${{dexto.agent_dir}}/plugins/NAME.js\" for a Dexto module or plugin: ID for a plugd plugin",
            ));
        }
        (Some(module), None) => {
            for (key, set) in [
                ("hook", raw.hook.is_some()),
                ("point", raw.point.is_some()),
                ("tool", raw.tool.is_some()),
            ] {
                if set {
                    return Err(cx.invalid(
                        ctx_of(key),
                        line,
                        format!("{key} is for plugin: entries; a Dexto module's methods (beforeToolCall, …) decide its points, remove {key}"),
                    ));
                }
            }
            let module_line = module.referenced.line();
            let package = crate::hooks::dexto_package::is_package_form(
                &module.value,
                Path::new(cx.workspace),
            );
            let package = if package {
                crate::hooks::dexto_package::parse(&module.value)
                    .map_err(|m| cx.invalid(ctx_of("module"), module_line, m))?;
                Some(module.value.clone())
            } else {
                None
            };
            let module = match package {
                Some(_) => PathBuf::new(),
                None => cx.absolute(&ctx_of("module"), module_line, &module.value)?,
            };
            let mut config = raw
                .config
                .unwrap_or_else(|| Value::Object(Default::default()));
            if config.is_null() {
                config = Value::Object(Default::default());
            }
            if !config.is_object() {
                return Err(cx.invalid(
                    ctx_of("config"),
                    line,
                    "config must be a mapping (it is passed to the module's initialize)",
                ));
            }
            cx.expand_value(&mut config)
                .map_err(|m| cx.invalid(ctx_of("config"), line, m))?;
            match package {
                Some(package) => Source::Package { package, config },
                None => Source::Module { module, config },
            }
        }
        (None, Some(plugin)) => {
            if raw.config.is_some() {
                return Err(cx.invalid(
                    ctx_of("config"),
                    line,
                    "config is for module: entries; a plugin is configured in its own manifest, remove config",
                ));
            }
            let plugin = plugin.trim().to_owned();
            if plugin.is_empty() {
                return Err(cx.invalid(
                    ctx_of("plugin"),
                    line,
                    "the plugin id is empty; `plugd plugin list` shows the ids",
                ));
            }
            let binding = binding(cx, &ctx_of, line, raw.hook, raw.point, raw.tool)?;
            Source::Plugin { plugin, binding }
        }
    };
    Ok(CustomEntry {
        name,
        enabled: raw.enabled.unwrap_or(true),
        blocking: raw.blocking.unwrap_or(true),
        priority: raw.priority,
        on_error: raw.on_error,
        timeout,
        source,
        line,
    })
}

fn binding(
    cx: &Cx<'_>,
    ctx_of: &dyn Fn(&str) -> String,
    line: u64,
    hook: Option<Spanned<String>>,
    point: Option<HookPoint>,
    tool: Option<String>,
) -> Result<Binding, ConfigError> {
    let hook_line = hook.as_ref().map(|h| h.referenced.line()).unwrap_or(line);
    let hook = hook.map(|h| h.value.trim().to_owned());
    match (tool, hook, point) {
        (Some(_), Some(_), Some(_)) => Err(cx.invalid(
            ctx_of("hook"),
            hook_line,
            "with tool: the point is point:, so hook is not used; remove hook",
        )),
        (Some(tool), hook, point) => {
            let point = match (point, hook) {
                (Some(p), _) => p,
                (None, Some(h)) => HookPoint::parse(&h).ok_or_else(|| {
                    cx.invalid(
                        ctx_of("hook"),
                        hook_line,
                        format!("{h:?} is not a hook point; name the point with point: (one of: {})", point_names()),
                    )
                })?,
                (None, None) => {
                    return Err(cx.invalid(
                        ctx_of("point"),
                        line,
                        format!("a tool bound as a hook needs point: (one of: {})", point_names()),
                    ));
                }
            };
            let tool = tool.trim().to_owned();
            if tool.is_empty() {
                return Err(cx.invalid(ctx_of("tool"), line, "the tool name is empty; `plugd tool list` shows the names"));
            }
            Ok(Binding::Tool { tool, point })
        }
        (None, Some(hook), point) => {
            if hook.is_empty() {
                return Err(cx.invalid(ctx_of("hook"), hook_line, "the hook name is empty"));
            }
            let point = match point.or_else(|| HookPoint::parse(&hook)) {
                Some(p) => p,
                None => {
                    return Err(cx.invalid(
                        ctx_of("hook"),
                        hook_line,
                        format!(
                            "{hook:?} is not a hook point; keep hook: {hook} (the name the plugin serves) and add point: (one of: {})",
                            point_names()
                        ),
                    ));
                }
            };
            Ok(Binding::Hook { hook, point })
        }
        (None, None, _) => Err(cx.invalid(
            ctx_of("hook"),
            line,
            "a plugin entry needs hook: (a point name, or the hook the plugin serves plus point:) or tool: (a tool bound as a hook, plus point:)",
        )),
    }
}

/// Whether `url` names a PostgreSQL database (`postgres://` or
/// `postgresql://`), the one shared backend.
pub fn is_state_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Where the state of the workspace whose configuration is `config` is
/// kept: `flag` (`plugd serve --state`), else `PLUGD_STATE`, else
/// plugd.yaml's `state:`; `None`: the workspace's SQLite file.
pub fn state_url(flag: Option<&str>, config: Option<&PlugdConfig>) -> Option<String> {
    flag.map(str::to_owned)
        .or_else(|| std::env::var("PLUGD_STATE").ok().filter(|v| !v.is_empty()))
        .or_else(|| config.and_then(|c| c.state.clone()))
}

/// How `plugd serve` joins its cluster: (NATS URL, node id), each from its
/// flag (`--nats`, `--node-id`, which clap fills from `PLUGD_NATS` and
/// `PLUGD_NODE_ID`), else plugd.yaml's `cluster:`.
pub fn cluster_settings(
    nats_flag: Option<&str>,
    node_flag: Option<&str>,
    config: Option<&PlugdConfig>,
) -> (Option<String>, Option<String>) {
    let from = |flag: Option<&str>, yaml: fn(&ClusterConfig) -> Option<String>| {
        flag.map(str::to_owned)
            .or_else(|| config.and_then(|c| yaml(&c.cluster)))
    };
    (
        from(nats_flag, |c| c.nats.clone()),
        from(node_flag, |c| c.node_id.clone()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: &str = "/srv/agent";

    fn parse(text: &str) -> Result<PlugdConfig, ConfigError> {
        PlugdConfig::parse(text, Path::new("/srv/agent/plugd.yaml"), Path::new(WS))
    }

    fn err(text: &str) -> String {
        let e = parse(text).expect_err("expected an error").to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    /// Every configuration these tests accept must also satisfy the schema.
    fn valid(text: &str) -> PlugdConfig {
        let config = parse(text).unwrap_or_else(|e| panic!("{e}"));
        schema_accepts(text);
        config
    }

    #[test]
    fn console_trace_url_needs_a_web_address_with_the_trace_id() {
        let c = valid("console:\n  trace_url: https://jaeger.internal/trace/{trace_id}\n");
        assert_eq!(
            c.console.trace_url.as_deref(),
            Some("https://jaeger.internal/trace/{trace_id}")
        );
        assert_eq!(valid("").console.trace_url, None);
        for bad in [
            "console:\n  trace_url: https://jaeger.internal/trace/\n",
            "console:\n  trace_url: javascript:alert(1)//{trace_id}\n",
            "console:\n  trace_url: file:///etc/{trace_id}\n",
        ] {
            let e = err(bad);
            assert!(e.contains("console.trace_url"), "{bad}: {e}");
        }
        assert!(err("console:\n  trace: x\n").contains("trace"));
    }

    #[test]
    fn state_names_a_postgres_url_and_nothing_else() {
        let c = valid("state: postgres://plugd@/plugd?host=/run/postgresql\n");
        assert_eq!(
            c.state.as_deref(),
            Some("postgres://plugd@/plugd?host=/run/postgresql")
        );
        assert_eq!(valid("eager: []\n").state, None);
        let e = err("state: sqlite:///tmp/x.db\n");
        assert!(e.contains("state") && e.contains("postgres://"), "{e}");
        // The flag wins, then PLUGD_STATE (unset here), then the file.
        assert_eq!(
            state_url(Some("postgres://a/b"), Some(&c)).as_deref(),
            Some("postgres://a/b")
        );
        if std::env::var_os("PLUGD_STATE").is_none() {
            assert_eq!(state_url(None, Some(&c)), c.state);
            assert_eq!(state_url(None, None), None);
        }
    }

    #[test]
    fn cluster_names_the_nats_and_the_node_and_flags_win() {
        let c = valid("cluster:\n  nats: nats://n1:4222,tls://n2:4222\n  node_id: eu-1\n");
        assert_eq!(
            c.cluster.nats.as_deref(),
            Some("nats://n1:4222,tls://n2:4222")
        );
        assert_eq!(c.cluster.node_id.as_deref(), Some("eu-1"));
        assert_eq!(valid("eager: []\n").cluster, ClusterConfig::default());
        for (bad, field) in [
            ("cluster:\n  nats: http://x\n", "cluster.nats"),
            ("cluster:\n  node_id: a/b\n", "cluster.node_id"),
        ] {
            let e = err(bad);
            assert!(e.contains(field), "{e}");
            assert!(
                !schema_violations(bad).unwrap().is_empty(),
                "schema accepts {bad}"
            );
        }
        assert!(err("cluster:\n  peers: 3\n").contains("peers"));
        assert_eq!(
            cluster_settings(Some("nats://flag:1"), None, Some(&c)),
            (Some("nats://flag:1".into()), Some("eu-1".into()))
        );
        assert_eq!(cluster_settings(None, None, None), (None, None));
    }

    fn schema_accepts(text: &str) {
        let errors = schema_violations(text).unwrap();
        assert!(errors.is_empty(), "schema rejects {text}: {errors:?}");
    }

    fn schema_rejects(text: &str) {
        assert!(
            !schema_violations(text).unwrap().is_empty(),
            "schema accepts {text}"
        );
    }

    const ISSUE_EXAMPLE: &str = r#"plugins:
  contentPolicy: {priority: 10, maxInputChars: 10000, redactEmails: true, redactApiKeys: true}
  responseSanitizer: {priority: 900, redactEmails: true, redactApiKeys: true, maxResponseLength: 50000}
  custom:
    - name: tenant-auth                 # a Dexto plugin module
      module: "${{dexto.agent_dir}}/plugins/tenant-auth.js"
      enabled: true
      blocking: true
      priority: 100
      config: {enforceQuota: true}
    - name: pii-guard                   # a handler served by an approved plugin of any dialect
      plugin: compliance
      hook: before_message
      priority: 50
      blocking: true
      on_error: block
      timeout_ms: 2000
"#;

    #[test]
    fn the_issue_example_reads_as_written() {
        let c = valid(ISSUE_EXAMPLE);
        let cp = c.plugins.content_policy.as_ref().unwrap();
        assert_eq!((cp.priority, cp.enabled, cp.blocking), (10, true, true));
        assert_eq!(
            cp.settings,
            ContentPolicySettings {
                max_input_chars: Some(10000),
                redact_emails: true,
                redact_api_keys: true
            }
        );
        let rs = c.plugins.response_sanitizer.as_ref().unwrap();
        assert_eq!((rs.priority, rs.blocking), (900, false));
        assert_eq!(rs.settings.max_response_length, Some(50000));
        let [auth, pii] = &c.plugins.custom[..] else {
            panic!("two entries")
        };
        assert_eq!(
            auth.source,
            Source::Module {
                module: PathBuf::from("/srv/agent/plugins/tenant-auth.js"),
                config: serde_json::json!({"enforceQuota": true})
            }
        );
        assert_eq!(auth.points().len(), 4, "the four Dexto points");
        assert_eq!(auth.line, 5);
        assert_eq!(
            pii.source,
            Source::Plugin {
                plugin: "compliance".into(),
                binding: Binding::Hook {
                    hook: "before_message".into(),
                    point: HookPoint::BeforeMessage
                }
            }
        );
        assert_eq!(pii.on_error, Some(OnError::Block));
        assert_eq!(pii.timeout, Duration::from_millis(2000));
        assert_eq!(c.agent.max_tool_rounds, 8);
    }

    #[test]
    fn missing_and_empty_files_are_the_empty_config() {
        let dir = tempfile::tempdir().unwrap();
        let c = PlugdConfig::load(dir.path()).unwrap();
        assert_eq!(c.path, None);
        assert!(c.plugins.custom.is_empty() && c.llm.is_none());
        for text in [
            "",
            "# nothing\n",
            "plugins: {}\n",
            "plugins:\n  custom: []\n",
        ] {
            let c = valid(text);
            assert!(c.plugins.custom.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn every_section() {
        let c = valid(
            r#"llm: {provider: scripted, script: "${{workspace_dir}}/turns.yaml"}
eager: [compliance, guard]
tenant: {tenant_id: acme, user_id: ana, agent_id: support}
agent: {max_tool_rounds: 3, system_prompt: "be brief"}
tools: {}
"#,
        );
        assert_eq!(
            c.llm,
            Some(LlmConfig::Scripted {
                script: PathBuf::from("/srv/agent/turns.yaml")
            })
        );
        assert_eq!(c.eager, ["compliance", "guard"]);
        assert_eq!(c.agent.max_tool_rounds, 3);
        let ctx = c.context(&HookContext {
            user_id: Some("bo".into()),
            ..HookContext::default()
        });
        assert_eq!(ctx.tenant_id.as_deref(), Some("acme"));
        assert_eq!(
            ctx.user_id.as_deref(),
            Some("bo"),
            "the request's fields win"
        );
        valid(
            "llm:\n  provider: openai\n  base_url: http://127.0.0.1:8080/v1\n  model: m\n  api_key_env: KEY\n",
        );
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let e = err("plugins:\n  contentPolicy: {priority: 1}\nextras: 1\n");
        assert!(e.contains("extras") && e.contains("line 3"), "{e}");
        let e = err("plugins:\n  contentPolicy:\n    priority: 1\n    maxInputChar: 5\n");
        assert!(e.contains("maxInputChar") && e.contains("line 4"), "{e}");
        let e = err(
            "plugins:\n  custom:\n    - name: a\n      plugin: p\n      hook: before_message\n      priority: 1\n      timeout: 5\n",
        );
        assert!(e.contains("`timeout`") && e.contains("line 7"), "{e}");
        let e = err("agent:\n  rounds: 2\n");
        assert!(e.contains("rounds") && e.contains("line 2"), "{e}");
        let e = err("tenant:\n  tenant: x\n");
        assert!(e.contains("tenant") && e.contains("line 2"), "{e}");
        let e = err("llm:\n  provider: scripted\n  script: /x\n  speed: 2\n");
        assert!(e.contains("speed"), "{e}");
        let e = err("tools:\n  calc: {risk: low}\n");
        assert!(e.contains("calc") && e.contains("line 2"), "{e}");
        schema_rejects("tools:\n  calc: {risk: low}\n");
        schema_rejects("extras: 1\n");
    }

    #[test]
    fn wrong_types_and_bad_points_have_lines() {
        let e = err(
            "plugins:\n  custom:\n    - name: a\n      plugin: p\n      point: before_lunch\n      hook: x\n      priority: 1\n",
        );
        assert!(e.contains("before_lunch") && e.contains("line 5"), "{e}");
        let e = err(
            "plugins:\n  custom:\n    - name: a\n      plugin: p\n      hook: x\n      priority: high\n",
        );
        assert!(e.contains("line 6"), "{e}");
        let e = err("plugins:\n  responseSanitizer: {redactEmails: true}\n");
        assert!(e.contains("priority"), "{e}");
    }

    #[test]
    fn relative_module_paths_are_refused_with_the_template() {
        let e = err(
            "plugins:\n  custom:\n    - name: audit\n      priority: 1\n      module: ./plugins/audit.js\n",
        );
        assert!(
            e.contains(r#""./plugins/audit.js" is a relative path"#)
                && e.contains(r#"write "${{dexto.agent_dir}}/plugins/audit.js""#)
                && e.contains("plugins.custom[0].module (\"audit\")")
                && e.contains("line 5"),
            "{e}"
        );
        let e = err(
            "plugins:\n  custom:\n    - {name: a, priority: 1, module: \"${{agent_dir}}/a.js\"}\n",
        );
        assert!(e.contains("unknown template ${{agent_dir}}"), "{e}");
        let e = err("llm: {provider: scripted, script: turns.yaml}\n");
        assert!(
            e.contains("llm.script") && e.contains("${{dexto.agent_dir}}/turns.yaml"),
            "{e}"
        );
        let c = valid(
            "plugins:\n  custom:\n    - {name: a, priority: 1, module: /opt/a.js, config: {log: \"${{workspace_dir}}/audit.log\"}}\n",
        );
        let Source::Module { config, .. } = &c.plugins.custom[0].source else {
            panic!()
        };
        assert_eq!(config["log"], "/srv/agent/audit.log");
    }

    #[test]
    fn a_module_naming_an_npm_package_is_a_package_source_and_traversal_is_refused() {
        let c = valid(
            "plugins:\n  custom:\n    - {name: t, priority: 1, module: \"@mycompany/dexto-tenant-plugin\", config: {dir: \"${{dexto.agent_dir}}\"}}\n",
        );
        assert_eq!(
            c.plugins.custom[0].source,
            Source::Package {
                package: "@mycompany/dexto-tenant-plugin".into(),
                config: serde_json::json!({"dir": "/srv/agent"}),
            }
        );
        assert_eq!(c.plugins.custom[0].points().len(), 4);
        let e = err(
            "plugins:\n  custom:\n    - {name: t, priority: 1, module: \"@acme/pkg/../../../etc/passwd\"}\n",
        );
        assert!(
            e.contains("escapes its package") && e.contains("plugins.custom[0].module (\"t\")"),
            "{e}"
        );
    }

    #[test]
    fn llm_request_options_parse_and_are_bounded() {
        let c = valid(
            "llm: {provider: plugin, plugin: mm, name: minimax, model: m, stop_sequences: [\"\\nUser:\"], tool_choice: {specific: guard/chatty}, cache_tools: true}\n",
        );
        let o = c.llm.unwrap().request_options();
        assert_eq!(o.stop_sequences, ["\nUser:"]);
        assert_eq!(
            o.tool_choice,
            Some(crate::llm::ToolChoiceSetting::Specific(
                "guard/chatty".into()
            ))
        );
        assert!(o.cache_tools);
        for (word, want) in [
            ("auto", crate::llm::ToolChoiceSetting::Auto),
            ("any", crate::llm::ToolChoiceSetting::Any),
            ("none", crate::llm::ToolChoiceSetting::None),
        ] {
            let c = valid(&format!(
                "llm: {{provider: openai, base_url: \"http://127.0.0.1:1/v1\", model: m, tool_choice: {word}}}\n"
            ));
            assert_eq!(c.llm.unwrap().request_options().tool_choice, Some(want));
        }
        let many: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
        let e = err(&format!(
            "llm: {{provider: plugin, plugin: mm, name: minimax, model: m, stop_sequences: [{}]}}\n",
            many.join(", ")
        ));
        assert!(
            e.contains("llm.stop_sequences has 17 entries; at most 16"),
            "{e}"
        );
        let e = err(
            "llm: {provider: plugin, plugin: mm, name: minimax, model: m, stop_sequences: [\"\"]}\n",
        );
        assert!(e.contains("is not 1-256 bytes"), "{e}");
    }

    #[test]
    fn module_xor_plugin() {
        let both = "plugins:\n  custom:\n    - name: x\n      priority: 1\n      module: /opt/x.js\n      plugin: p\n      hook: before_message\n";
        let e = err(both);
        assert!(
            e.contains("both module and plugin are set") && e.contains("line 3"),
            "{e}"
        );
        schema_rejects(both);
        let neither = "plugins:\n  custom:\n    - {name: x, priority: 1}\n";
        assert!(err(neither).contains("neither module nor plugin"));
        schema_rejects(neither);
        let e = err(
            "plugins:\n  custom:\n    - {name: x, priority: 1, module: /x.js, hook: before_message}\n",
        );
        assert!(e.contains("hook is for plugin: entries"), "{e}");
        let e = err(
            "plugins:\n  custom:\n    - {name: x, priority: 1, plugin: p, hook: before_message, config: {}}\n",
        );
        assert!(e.contains("config is for module: entries"), "{e}");
    }

    #[test]
    fn the_hook_point_tool_rule() {
        let entry = |rest: &str| {
            format!("plugins:\n  custom:\n    - {{name: x, priority: 1, plugin: p, {rest}}}\n")
        };
        let binding = |rest: &str| match valid(&entry(rest)).plugins.custom[0].source.clone() {
            Source::Plugin { binding, .. } => binding,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            binding("hook: pii_redact, point: before_message"),
            Binding::Hook {
                hook: "pii_redact".into(),
                point: HookPoint::BeforeMessage
            }
        );
        assert_eq!(
            binding("hook: before_tool_call"),
            Binding::Hook {
                hook: "before_tool_call".into(),
                point: HookPoint::BeforeToolCall
            }
        );
        assert_eq!(
            binding("tool: check, point: before_llm_request"),
            Binding::Tool {
                tool: "check".into(),
                point: HookPoint::BeforeLlmRequest
            }
        );
        assert_eq!(
            binding("tool: check, hook: after_tool_result"),
            Binding::Tool {
                tool: "check".into(),
                point: HookPoint::AfterToolResult
            }
        );
        let e = err(&entry("hook: pii_redact"));
        assert!(
            e.contains("\"pii_redact\" is not a hook point") && e.contains("point:"),
            "{e}"
        );
        let e = err(&entry("tool: check"));
        assert!(e.contains("needs point:"), "{e}");
        let e = err(&entry("tool: check, hook: x, point: before_message"));
        assert!(e.contains("remove hook"), "{e}");
        let e = err(&entry("point: before_message"));
        assert!(e.contains("needs hook:"), "{e}");
        schema_rejects(&entry("point: before_message"));
    }

    #[test]
    fn priorities_are_unique_across_all_enabled_plugins_built_ins_included() {
        let e = err(
            "plugins:\n  contentPolicy: {priority: 10}\n  custom:\n    - {name: a, plugin: p, hook: h, point: before_message, priority: 10}\n",
        );
        assert!(
            e.contains("plugins.custom[0].priority") && e.contains("\"contentPolicy\""),
            "{e}"
        );
        // Different points do not matter; a disabled entry is exempt.
        let e = err(
            "plugins:\n  custom:\n    - {name: a, plugin: p, hook: h, point: before_message, priority: 5}\n    - {name: b, plugin: p, hook: h, point: before_tool_call, priority: 5}\n",
        );
        assert!(e.contains("\"b\" has priority 5, as \"a\" does"), "{e}");
        parse(
            "plugins:\n  contentPolicy: {priority: 10}\n  custom:\n    - {name: a, plugin: p, hook: h, point: before_message, priority: 10, enabled: false}\n",
        )
        .unwrap();
    }

    #[test]
    fn names_are_unique_and_values_in_range() {
        let e = err(
            "plugins:\n  custom:\n    - {name: a, priority: 1, module: /a.js}\n    - {name: a, priority: 2, module: /b.js}\n",
        );
        assert!(
            e.contains("\"a\" is already used") && e.contains("line 4"),
            "{e}"
        );
        let e =
            err("plugins:\n  custom:\n    - {name: content_policy, priority: 1, module: /a.js}\n");
        assert!(e.contains("already used"), "{e}");
        let e = err(
            "plugins:\n  custom:\n    - {name: a, priority: 1, module: /a.js, timeout_ms: 0}\n",
        );
        assert!(
            e.contains("timeout_ms") && e.contains("out of range"),
            "{e}"
        );
        let e = err("agent: {max_tool_rounds: 0}\n");
        assert!(e.contains("at least 1"), "{e}");
    }

    #[test]
    fn disabled_entries_are_kept_but_skipped_by_specs() {
        let c = valid(
            "plugins:\n  contentPolicy: {priority: 5, enabled: false}\n  custom:\n    - {name: a, priority: 5, plugin: p, hook: before_llm_request, enabled: false}\n    - {name: b, priority: 5, plugin: p, hook: before_llm_request}\n",
        );
        let names: Vec<String> = crate::hook_specs::specs(&c)
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn the_example_workspace_config_is_valid() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workspace/plugd.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = valid(&text);
        assert!(c.plugins.content_policy.is_some() && c.plugins.response_sanitizer.is_some());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"plugins:
  contentPolicy: {priority: 10, maxInputChars: 10000, redactEmails: true, redactApiKeys: true}
  responseSanitizer: {priority: 900, redactEmails: true, redactApiKeys: true, maxResponseLength: 50000}
  custom:
    - name: tenant-auth
      module: "${{dexto.agent_dir}}/plugins/tenant-auth.js"
      enabled: true
      blocking: true
      priority: 100
      config: {enforceQuota: true}
    - name: pii-guard
      plugin: compliance
      hook: before_message
      priority: 50
      on_error: block
      timeout_ms: 2000
llm: {provider: scripted, script: "${{workspace_dir}}/turns.yaml"}
eager: [compliance, guard]
tenant: {tenant_id: acme, user_id: ana, agent_id: support}
agent: {max_tool_rounds: 3, system_prompt: "be brief"}
tools: {}
"#;

    fn parse(text: &str) -> Result<PlugdConfig, ConfigError> {
        PlugdConfig::parse(
            text,
            Path::new("/srv/agent/plugd.yaml"),
            Path::new("/srv/agent"),
        )
    }

    /// Insert, delete or replace at a position (char boundaries kept).
    fn mutation() -> impl Strategy<Value = (usize, u8, String)> {
        let s = prop_oneof![
            Just(String::new()),
            Just(":".to_owned()),
            Just("- ".to_owned()),
            Just("  ".to_owned()),
            Just("\n".to_owned()),
            Just("{".to_owned()),
            Just("}".to_owned()),
            Just("[".to_owned()),
            Just("\"".to_owned()),
            Just("${{".to_owned()),
            Just("}}".to_owned()),
            Just("&a ".to_owned()),
            Just("*a".to_owned()),
            Just("!!str ".to_owned()),
            Just("é".to_owned()),
            "[ -~]{0,8}",
            any::<String>(),
        ];
        (any::<usize>(), 0u8..3, s)
    }

    fn apply(text: &mut String, (pos, op, s): &(usize, u8, String)) {
        let mut at = pos % (text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let mut end = (at + s.len().max(usize::from(*op == 1))).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        match op {
            0 => text.insert_str(at, s),
            1 => text.replace_range(at..end, ""),
            _ => text.replace_range(at..end, s),
        }
    }

    #[test]
    fn the_base_document_is_valid() {
        parse(EXAMPLE).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn parse_never_panics_on_arbitrary_strings(s in any::<String>()) {
            let _ = parse(&s).map_err(|e| e.to_string());
        }

        #[test]
        fn parse_never_panics_on_mutated_documents(muts in proptest::collection::vec(mutation(), 1..6)) {
            let mut text = EXAMPLE.to_owned();
            for m in &muts {
                apply(&mut text, m);
            }
            if let Err(e) = parse(&text) {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "{msg}");
            }
        }
    }
}
