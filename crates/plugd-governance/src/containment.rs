//! The effective containment of a plugin: its manifest's sandbox and limits,
//! VAI permissions, the operator's `sandbox:` policy in `plugd.yaml` and the
//! operator's environment knobs, combined into the
//! [`plugd_host::sandbox::Containment`] the next start uses and the
//! "effective permissions" `plugd plugin show` prints.
//!
//! `plugd.yaml`:
//!
//! ```yaml
//! sandbox:
//!   fallback: landlock          # when bwrap is missing (default: refuse)
//!   plugins:
//!     hello_salmex:             # any dialect
//!       enabled: true           # default true
//!       network: deny           # deny | host
//!       fs_read_paths: [/usr/share/dict]
//!       fs_write_paths: ["${state_dir}"]
//!       drop_user: true
//!       limits: {cpu_seconds: 10, address_space_mb: 1024, open_files: 256, processes: 64}
//!       egress_allow: [api.example.com, "*.example.org"]  # network only through plugd's proxy
//!       grants:                 # VAI packages: per export, at most what it requests
//!         summarize: {network: none, filesystem: none}
//!         fetch: {egress_allow: [api.example.com:443]}
//!       trusted: true           # VAI packages: honour `execution_class = "inline"`
//! ```
//!
//! Rules: the operator's policy sandboxes a plugin that has no sandbox of its
//! own, and only narrows one that has (network `deny` wins, path lists are
//! intersected, `drop_user` can only be switched on, limits take the tighter
//! value). A VAI package is sandboxed from its exports' granted permissions
//! (requested, narrowed by `grants`) by default: its permissions are a
//! request for containment; `sandbox.plugins.<id>: {enabled: false}` turns
//! that off. A package runs as process groups ([`plugd_host::groups`]):
//! the `worker` process gets the union of the granted permissions of its
//! exports alone (`worker` exports, and `inline` ones when the package is
//! `trusted`), each `isolated:<export>` process those of its export only,
//! and a per-invocation process of an export granted `scratch` can write
//! that invocation's scratch directory and nothing else. The spec of each
//! start says which group it is ([`plugd_manifest::vai::ProcessRole`]).
//! An egress allowlist (`egress_allow`, per plugin or per VAI export grant)
//! turns a sandbox with the host's network into one whose only way out is
//! plugd's egress proxy ([`plugd_host::sandbox::egress`]); without one,
//! `network = "egress"` stays the host's network (the seed's meaning). A VAI
//! process gets the proxy only when every export of it granted egress has
//! an allowlist (their union), else the host's network.
//! `NEXO_PLUGIN_SANDBOX_REQUIRE=1` refuses
//! every plugin without a sandbox; `network: host` from the operator's
//! policy needs `NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1` like the manifest's.
//!
//! **Why one file** (~1,300 product lines): `plugd.yaml`'s `sandbox:`
//! section, the rules that combine it with a manifest's sandbox, limits and
//! VAI grants, and the report `plugd plugin show` prints are one decision
//! read three ways; keeping the parser (`sandbox_config`), the combination
//! (`effective_with`, `narrow`, `baseline_plan`) and its report
//! (`EffectivePermissions`) in one place is what keeps the printed
//! permissions equal to the enforced ones.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plugd_host::groups::GroupPlan;
use plugd_host::sandbox::{
    self, BaselinePlan, Containment, EgressPlan, Fallback, Limits, Network, SandboxPlan,
};
use plugd_manifest::vai::{
    ExecutionClass, FilesystemPermission, NetworkPermission, ProcessRole, WORKER_GROUP,
};
use plugd_manifest::{LoadOptions, PluginSpec, STATE_DIR_TOKEN, SandboxNetwork};
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::plugd_yaml::{CONFIG_FILE, ConfigError};

/// Operator knob: refuse every plugin that would run without a sandbox.
pub const REQUIRE_ENV: &str = "NEXO_PLUGIN_SANDBOX_REQUIRE";

/// `sandbox:` of `plugd.yaml`, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SandboxConfig {
    /// `fallback`: what to do when bwrap is missing.
    pub fallback: Fallback,
    /// `plugins`: the operator's policy per plugin id.
    pub plugins: BTreeMap<String, OperatorPolicy>,
    /// `baseline: require` (default `best_effort`): refuse to start a plugin
    /// without a sandbox when the kernel cannot apply the containment
    /// baseline (no Landlock).
    pub require_baseline: bool,
}

/// `sandbox.plugins.<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct OperatorPolicy {
    /// `enabled` (default true): sandbox the plugin.
    pub enabled: bool,
    /// `network`.
    pub network: Option<Network>,
    /// `fs_read_paths` (absolute, checked against the denylist).
    pub fs_read_paths: Option<Vec<PathBuf>>,
    /// `fs_write_paths` (absolute, or `${state_dir}[/...]`).
    pub fs_write_paths: Option<Vec<String>>,
    /// `drop_user`.
    pub drop_user: Option<bool>,
    /// `limits`.
    pub limits: Limits,
    /// `grants`: VAI export id → granted permissions.
    pub grants: BTreeMap<String, Grant>,
    /// `egress_allow`: the only hosts the plugin may reach (normalized
    /// [`plugd_host::sandbox::egress::EgressRule`]s); `None`: no allowlist.
    pub egress_allow: Option<Vec<String>>,
    /// `grants.<export>.egress_allow`: a VAI export's own allowlist.
    pub export_egress_allow: BTreeMap<String, Vec<String>>,
    /// `baseline` (default true): run the plugin under the containment
    /// baseline when it has no sandbox; `false` is the explicit opt-out.
    pub baseline: bool,
    /// Whether the entry configures a sandbox at all: an entry that only
    /// says `baseline: false` does not sandbox the plugin.
    pub sandboxes: bool,
    /// `trusted` (default false): a VAI package's `inline` exports run as
    /// inline (in its worker process) instead of isolated.
    pub trusted: bool,
}

/// VAI permissions, as requested or granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Grant {
    /// `none` | `egress`.
    pub network: NetworkPermission,
    /// `none` | `scratch` | `assets_ro`.
    pub filesystem: FilesystemPermission,
}

/// `plugd.yaml` `sandbox:` as written, before [`sandbox_config`] checks it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSandbox {
    #[serde(default)]
    fallback: Option<RawFallback>,
    #[serde(default)]
    plugins: Option<BTreeMap<String, Spanned<RawPolicy>>>,
    #[serde(default)]
    baseline: Option<RawBaselineMode>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawBaselineMode {
    BestEffort,
    Require,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawFallback {
    None,
    Landlock,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawNetwork {
    Deny,
    Host,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    network: Option<RawNetwork>,
    #[serde(default)]
    fs_read_paths: Option<Vec<String>>,
    #[serde(default)]
    fs_write_paths: Option<Vec<String>>,
    #[serde(default)]
    drop_user: Option<bool>,
    #[serde(default)]
    limits: Option<RawLimits>,
    #[serde(default)]
    grants: Option<BTreeMap<String, RawGrant>>,
    #[serde(default)]
    baseline: Option<bool>,
    #[serde(default)]
    trusted: Option<bool>,
    #[serde(default)]
    egress_allow: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default)]
    address_space_mb: Option<u64>,
    #[serde(default)]
    open_files: Option<u64>,
    #[serde(default)]
    processes: Option<u64>,
    #[serde(default)]
    cpu_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    #[serde(default)]
    network: Option<RawVaiNetwork>,
    #[serde(default)]
    filesystem: Option<RawVaiFs>,
    #[serde(default)]
    egress_allow: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawVaiNetwork {
    None,
    Egress,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawVaiFs {
    None,
    Scratch,
    AssetsRo,
}

/// Only the `sandbox:` key of `plugd.yaml` (the rest is ignored here and
/// validated by `plugd_runtime::config::PlugdConfig`).
#[derive(Deserialize)]
struct OnlySandbox {
    #[serde(default)]
    sandbox: Option<RawSandbox>,
}

impl SandboxConfig {
    /// Reads the `sandbox:` key of `workspace/plugd.yaml` (missing file or
    /// key: the empty policy).
    pub fn load(workspace: &Path) -> Result<SandboxConfig, ConfigError> {
        let path = workspace.join(CONFIG_FILE);
        let Some(text) = crate::plugd_yaml::read_text(workspace)? else {
            return Ok(SandboxConfig::default());
        };
        let raw: Option<OnlySandbox> =
            serde_saphyr::from_str_with_options(&text, crate::plugd_yaml::yaml_options())
                .map_err(|e| crate::plugd_yaml::yaml_error(&path, &e))?;
        match raw.and_then(|r| r.sandbox) {
            Some(s) => sandbox_config(&path, s),
            None => Ok(SandboxConfig::default()),
        }
    }
}

/// Validates a parsed `sandbox:` (called by the `plugd.yaml` parser too).
pub fn sandbox_config(path: &Path, raw: RawSandbox) -> Result<SandboxConfig, ConfigError> {
    let invalid = |field: String, line: u64, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        line,
        message,
    };
    let mut out = SandboxConfig {
        fallback: match raw.fallback {
            Some(RawFallback::Landlock) => Fallback::Landlock,
            _ => Fallback::None,
        },
        plugins: BTreeMap::new(),
        require_baseline: matches!(raw.baseline, Some(RawBaselineMode::Require)),
    };
    for (id, p) in raw.plugins.unwrap_or_default() {
        let line = p.referenced.line();
        let p = p.value;
        let sandboxes = p.enabled.is_some()
            || p.network.is_some()
            || p.fs_read_paths.is_some()
            || p.fs_write_paths.is_some()
            || p.drop_user.is_some()
            || p.limits.is_some()
            || p.grants.is_some()
            || p.egress_allow.is_some()
            || p.baseline.is_none();
        let at = |k: &str| format!("sandbox.plugins.{id}.{k}");
        let mut read = None;
        if let Some(list) = p.fs_read_paths {
            let mut v = Vec::new();
            for (i, e) in list.iter().enumerate() {
                plugd_manifest::check_sandbox_path(Path::new(e)).map_err(|err| {
                    invalid(at(&format!("fs_read_paths[{i}]")), line, err.to_string())
                })?;
                v.push(PathBuf::from(e));
            }
            read = Some(v);
        }
        if let Some(list) = &p.fs_write_paths {
            for (i, e) in list.iter().enumerate() {
                let field = at(&format!("fs_write_paths[{i}]"));
                if let Some(rest) = e.strip_prefix(STATE_DIR_TOKEN) {
                    if !(rest.is_empty() || rest.starts_with('/'))
                        || rest.contains("${")
                        || rest.split('/').any(|c| c == "..")
                    {
                        return Err(invalid(
                            field,
                            line,
                            format!(
                                "{e:?}: use \"${{state_dir}}\" alone or followed by a relative path without \"..\""
                            ),
                        ));
                    }
                } else {
                    plugd_manifest::check_sandbox_path(Path::new(e))
                        .map_err(|err| invalid(field, line, err.to_string()))?;
                }
            }
        }
        let limits = p.limits.map_or_else(Limits::default, |l| Limits {
            address_space_mb: l.address_space_mb,
            open_files: l.open_files,
            processes: l.processes,
            cpu_seconds: l.cpu_seconds,
        });
        for (k, v) in [
            ("address_space_mb", limits.address_space_mb),
            ("open_files", limits.open_files),
            ("processes", limits.processes),
            ("cpu_seconds", limits.cpu_seconds),
        ] {
            if v == Some(0) {
                return Err(invalid(
                    at(&format!("limits.{k}")),
                    line,
                    "must be at least 1; leave it out for no limit".into(),
                ));
            }
        }
        let egress_list = |list: &[String], field: String| -> Result<Vec<String>, ConfigError> {
            let mut v = Vec::new();
            for (i, e) in list.iter().enumerate() {
                let rule = plugd_host::sandbox::egress::EgressRule::parse(e)
                    .map_err(|m| invalid(format!("{field}[{i}]"), line, m))?;
                v.push(rule.to_string());
            }
            Ok(v)
        };
        let egress_allow = match &p.egress_allow {
            Some(list) => {
                if matches!(p.network, Some(RawNetwork::Deny)) {
                    return Err(invalid(
                        at("egress_allow"),
                        line,
                        "network: deny allows no egress at all; remove one of network: deny and egress_allow".into(),
                    ));
                }
                Some(egress_list(list, at("egress_allow"))?)
            }
            None => None,
        };
        let mut export_egress_allow = BTreeMap::new();
        for (export, g) in p.grants.iter().flatten() {
            if let Some(list) = &g.egress_allow {
                let field = at(&format!("grants.{export}.egress_allow"));
                if matches!(g.network, Some(RawVaiNetwork::None)) {
                    return Err(invalid(
                        field,
                        line,
                        "network: none grants no egress; remove one of network: none and egress_allow".into(),
                    ));
                }
                export_egress_allow.insert(export.clone(), egress_list(list, field)?);
            }
        }
        let grants = p
            .grants
            .unwrap_or_default()
            .into_iter()
            .map(|(export, g)| {
                (
                    export,
                    Grant {
                        // An allowlist is a grant of egress (to those hosts).
                        network: match (g.network, &g.egress_allow) {
                            (Some(RawVaiNetwork::Egress), _) | (None, Some(_)) => {
                                NetworkPermission::Egress
                            }
                            _ => NetworkPermission::None,
                        },
                        filesystem: match g.filesystem {
                            Some(RawVaiFs::Scratch) => FilesystemPermission::Scratch,
                            Some(RawVaiFs::AssetsRo) => FilesystemPermission::AssetsRo,
                            _ => FilesystemPermission::None,
                        },
                    },
                )
            })
            .collect();
        out.plugins.insert(
            id.clone(),
            OperatorPolicy {
                enabled: p.enabled.unwrap_or(true),
                network: p.network.map(|n| match n {
                    RawNetwork::Deny => Network::Deny,
                    RawNetwork::Host => Network::Host,
                }),
                fs_read_paths: read,
                fs_write_paths: p.fs_write_paths,
                drop_user: p.drop_user,
                limits,
                grants,
                egress_allow,
                export_egress_allow,
                baseline: p.baseline.unwrap_or(true),
                sandboxes,
                trusted: p.trusted.unwrap_or(false),
            },
        );
    }
    Ok(out)
}

/// One VAI export's permissions, requested and granted, and where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportPermissions {
    /// Export id.
    pub export: String,
    /// What `vai-plugin.toml` asks for.
    pub requested: Grant,
    /// What the host grants (the request narrowed by `sandbox.plugins.<id>.grants`).
    pub granted: Grant,
    /// `execution_class` as the manifest asks (or its kind's default).
    pub requested_class: ExecutionClass,
    /// The class plugd runs it with (`inline` of an untrusted package:
    /// `isolated`).
    pub effective_class: ExecutionClass,
    /// Its process group: `worker` or `isolated:<export>`.
    pub group: String,
    /// Whether it gets a process of its own per invocation.
    pub per_invocation: bool,
    /// Why the effective class differs from the requested one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// With egress granted: the hosts it is limited to (`None`: any host).
    pub egress_allow: Option<Vec<String>>,
}

/// The sandbox of one process group of a VAI package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupPermissions {
    /// `worker` or `isolated:<export>`.
    pub group: String,
    /// The exports it serves.
    pub exports: Vec<String>,
    /// Started per invocation.
    pub per_invocation: bool,
    /// `deny`, `host` or `proxy`.
    pub network: String,
    /// Writable paths (for a per-invocation group, the scratch directory
    /// with `<invocation_id>` standing for each invocation's id).
    pub writable: Vec<PathBuf>,
    /// The mechanism (`bwrap`, …) or `refused`.
    pub mechanism: String,
}

/// What `plugd plugin show` reports as a plugin's effective permissions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectivePermissions {
    /// `none`, `bwrap`, `landlock+seccomp`, or `refused` (see `mechanism_detail`).
    pub mechanism: String,
    /// The bwrap path, or why the start would be refused.
    pub mechanism_detail: Option<String>,
    /// Where the sandbox comes from.
    pub source: Vec<String>,
    /// The exact command line under bwrap (`None` without bwrap).
    pub wrapped_command: Option<Vec<String>>,
    /// `deny`, `host` or `proxy` (`host` also without a sandbox).
    pub network: String,
    /// With `proxy`: the hosts plugd's egress proxy lets the plugin reach.
    pub egress_allow: Vec<String>,
    /// Paths visible read-only besides the system paths (`/usr /bin /sbin
    /// /lib /lib64 /etc/ssl`): the plugin directory, then `fs_read_paths`.
    pub read_only: Vec<PathBuf>,
    /// Writable paths (`${state_dir}` expanded).
    pub writable: Vec<PathBuf>,
    /// `nobody (65534)` or `plugd's user`.
    pub user: String,
    /// Resource limits.
    pub limits: Limits,
    /// Names of the environment variables the child gets.
    pub env: Vec<String>,
    /// VAI exports: requested and granted side by side, with their class
    /// and process group.
    pub vai: Vec<ExportPermissions>,
    /// The VAI process group this report is about (`worker` for a
    /// package's own report); `None` for other plugins.
    pub process_group: Option<String>,
    /// Every process group of a VAI package with its own sandbox (filled
    /// in the package's own report).
    pub groups: Vec<GroupPermissions>,
    /// Caveats (fallback differences, root and `processes`, cgroups).
    pub notes: Vec<String>,
    /// The containment baseline (what is hidden from a plugin without a
    /// sandbox, by which mechanism, or why it is off).
    pub baseline: BaselineReport,
    /// What tracks the plugin's processes so none outlives plugd: its
    /// cgroup v2 cgroup, or `/proc` only and why
    /// ([`plugd_host::cgroup::describe`]).
    pub process_tracking: String,
}

/// The containment baseline as `plugd plugin show` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BaselineReport {
    /// `on`, `off` (opted out), `sandbox` (the sandbox hides more),
    /// `unavailable` (the plugin runs without it) or `refused` (the start is
    /// refused: `sandbox.baseline: require` and it cannot be applied).
    pub state: String,
    /// `view (bubblewrap mount namespace)` or `landlock (ABI N)` when on
    /// (with why the view is not used); `-` otherwise.
    pub mechanism: String,
    /// What the plugin cannot reach (existing paths, canonical).
    pub hidden: Vec<PathBuf>,
    /// Exceptions inside the hidden paths (its own directories).
    pub allowed: Vec<PathBuf>,
    /// What the view shows read-only: the exceptions that are not its
    /// state directory, and the policy files (`plugd.yaml`, `.mcp.json`)
    /// that exist. Empty under Landlock (it cannot).
    pub read_only: Vec<PathBuf>,
    /// Why it is off, or what it does not cover.
    pub detail: String,
}

/// What the view stops, for `plugd plugin show` and the README.
const VIEW_DETAIL: &str = "a mount namespace of its own (bubblewrap): the host as it is, with the hidden paths empty (serve's socket in .plugd/ does not exist there), its own directories bound inside them, plugd.yaml and .mcp.json read-only when they exist (an absent one can be created: the live-config approval covers that), its own PID namespace and /proc (plugd's /proc/<pid> does not exist), /sys read-only; as root it loses CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_PERFMON, CAP_BPF, CAP_DAC_READ_SEARCH, CAP_SYS_RAWIO, CAP_MKNOD, CAP_SYS_MODULE, CAP_SYS_BOOT, CAP_SYS_TIME, CAP_NET_ADMIN, CAP_MAC_ADMIN, CAP_MAC_OVERRIDE, CAP_AUDIT_CONTROL and CAP_SYSLOG; not covered: the network, signals to processes it can name, and what the rest of the host lets its user do";

/// What the Landlock fallback does not cover.
const LANDLOCK_LIMITS: &str = "also plugd's /proc/<pid>/environ, mem, maps and fd (plugd is not dumpable; the plugin loses CAP_SYS_PTRACE, CAP_SYS_ADMIN and CAP_PERFMON); not covered: writes to plugd.yaml and .mcp.json, connect() to serve's socket .plugd/serve.sock (Landlock does not govern Unix sockets), new entries beside the hidden paths' ancestors (e.g. a new file in the workspace root) cannot be created or reached, listing those ancestors is refused, hard links and bind mounts made elsewhere are not recognised, signals and the network are not restricted";

impl BaselineReport {
    fn compute(c: &Containment, mechanism: &str, plugin: &str, cwd: &Path) -> BaselineReport {
        let off = |state: &str, detail: String| BaselineReport {
            state: state.to_owned(),
            mechanism: "-".to_owned(),
            hidden: Vec::new(),
            allowed: Vec::new(),
            read_only: Vec::new(),
            detail,
        };
        let Some(plan) = &c.baseline else {
            return off(
                "off",
                format!(
                    "opted out: plugd.yaml sandbox.plugins.{plugin}.baseline is false; the plugin can read .plugd/ (state.db, keys, sockets), the master key file, other plugins and plugd's environment"
                ),
            );
        };
        if c.sandbox.is_some() {
            return off(
                "sandbox",
                format!("the {mechanism} sandbox shows only its own paths, so nothing of plugd"),
            );
        }
        let (why, forced) = match sandbox::view::choose() {
            sandbox::view::Choice::View { .. } => {
                let r = sandbox::view::resolve(plan, cwd);
                return BaselineReport {
                    state: "on".to_owned(),
                    mechanism: "view (bubblewrap mount namespace)".to_owned(),
                    hidden: r.hidden_dirs.into_iter().chain(r.hidden_files).collect(),
                    allowed: r.exceptions.iter().map(|e| e.path.clone()).collect(),
                    read_only: r
                        .exceptions
                        .into_iter()
                        .filter(|e| !e.writable)
                        .map(|e| e.path)
                        .chain(r.read_only_files)
                        .collect(),
                    detail: VIEW_DETAIL.to_owned(),
                };
            }
            sandbox::view::Choice::Landlock { why, forced } => (why.as_str(), *forced),
        };
        let (hidden, allowed) = sandbox::baseline::resolve(plan, Some(cwd));
        if !forced && plan.require {
            return BaselineReport {
                hidden,
                allowed,
                ..off(
                    "refused",
                    format!(
                        "the view cannot be built ({why}) and plugd.yaml says sandbox.baseline: require"
                    ),
                )
            };
        }
        let abi = sandbox::baseline::landlock_abi();
        if abi == 0 {
            let what = if plan.require {
                "the start is refused (sandbox.baseline: require)"
            } else {
                "the plugin runs WITHOUT it (best effort; set sandbox.baseline: require to refuse)"
            };
            return BaselineReport {
                hidden,
                allowed,
                ..off(
                    "unavailable",
                    format!(
                        "the view cannot be used ({why}) and the kernel has no Landlock: {what}"
                    ),
                )
            };
        }
        BaselineReport {
            state: "on".to_owned(),
            mechanism: format!("landlock (ABI {abi}), fallback: {why}"),
            hidden,
            allowed,
            read_only: Vec::new(),
            detail: LANDLOCK_LIMITS.to_owned(),
        }
    }
}

/// The state directory of `spec` (what `${state_dir}` expands to).
pub fn state_dir(workspace: &Path, spec: &PluginSpec) -> PathBuf {
    workspace
        .join(".plugd")
        .join("state")
        .join(spec.id.replace('/', "__"))
}

/// The containment of the next start of `spec` and its report, or why the
/// plugin must not start (`NEXO_PLUGIN_SANDBOX_REQUIRE=1` and no sandbox,
/// operator `network: host` without the capability, a bad `plugd.yaml`).
///
/// For a VAI package the containment is that of the process group the
/// spec's role names (`worker` when it names none); the report of the
/// `worker` role also lists every group's sandbox ([`GroupPermissions`]).
pub fn effective(
    spec: &PluginSpec,
    workspace: &Path,
) -> Result<(Containment, EffectivePermissions), String> {
    let config = SandboxConfig::load(workspace).map_err(|e| e.to_string())?;
    let (containment, mut report) = effective_with(spec, workspace, &config)?;
    if let Some(role) = spec.process_role()
        && role.group == WORKER_GROUP
    {
        let plan = plan_with(spec, workspace, &config);
        let sd = state_dir(workspace, spec);
        for (group, exports, per_invocation) in plan.groups() {
            let role = ProcessRole {
                scratch: per_invocation.then(|| sd.join("scratch").join("<invocation_id>")),
                group: group.clone(),
            };
            let (mechanism, network, writable) =
                match effective_with(&spec.for_process(role), workspace, &config) {
                    Ok((_, r)) => (r.mechanism, r.network, r.writable),
                    Err(why) => (format!("refused: {why}"), "-".to_owned(), Vec::new()),
                };
            report.groups.push(GroupPermissions {
                group,
                exports,
                per_invocation,
                network,
                writable,
                mechanism,
            });
        }
    }
    Ok((containment, report))
}

/// Which process group serves each export of VAI package `spec`, by the
/// operator's policy in `workspace/plugd.yaml`: `trusted` honours
/// `inline`; an isolated export granted `scratch` runs per invocation. A
/// `plugd.yaml` that does not load trusts nothing.
pub fn group_plan(spec: &PluginSpec, workspace: &Path) -> GroupPlan {
    let config = SandboxConfig::load(workspace).unwrap_or_default();
    plan_with(spec, workspace, &config)
}

fn plan_with(spec: &PluginSpec, workspace: &Path, config: &SandboxConfig) -> GroupPlan {
    let _ = workspace;
    let policy = config.plugins.get(&spec.id);
    let trusted = policy.is_some_and(|p| p.trusted);
    let grants = policy.filter(|p| p.enabled && p.sandboxes);
    GroupPlan::compute(spec, trusted, &|e| {
        let requested = Grant {
            network: e.permissions.network,
            filesystem: e.permissions.filesystem,
        };
        let granted = match grants.and_then(|p| p.grants.get(&e.id)) {
            Some(g) => narrow(requested, *g),
            None => requested,
        };
        granted.filesystem == FilesystemPermission::Scratch
    })
}

fn effective_with(
    spec: &PluginSpec,
    workspace: &Path,
    config: &SandboxConfig,
) -> Result<(Containment, EffectivePermissions), String> {
    let config = config.clone();
    let state_dir = state_dir(workspace, spec);
    let expand = |e: &str| match e.strip_prefix(STATE_DIR_TOKEN) {
        Some("") => state_dir.clone(),
        Some(rest) => state_dir.join(rest.trim_start_matches('/')),
        None => PathBuf::from(e),
    };
    let policy = config
        .plugins
        .get(&spec.id)
        .filter(|p| p.enabled && p.sandboxes);
    let mut source = Vec::new();
    let mut plan: Option<SandboxPlan> = None;
    if let Some(sb) = &spec.sandbox {
        source.push("manifest [plugin.sandbox]".to_owned());
        plan = Some(SandboxPlan {
            network: match sb.network {
                SandboxNetwork::Host => Network::Host,
                _ => Network::Deny,
            },
            read_paths: sb.fs_read_paths.clone(),
            write_paths: sb.fs_write_paths.iter().map(|e| expand(e)).collect(),
            drop_user: sb.drop_user,
            fallback: Fallback::None,
            hide_cwd: false,
            egress: EgressPlan::default(),
        });
    }
    let egress_plan = |allow: Vec<String>, vai: bool| EgressPlan {
        allow,
        gateway: None,
        config_key: if vai {
            format!(
                "sandbox.plugins.{}.egress_allow (or sandbox.plugins.{}.grants.<export>.egress_allow)",
                spec.id, spec.id
            )
        } else {
            format!("sandbox.plugins.{}.egress_allow", spec.id)
        },
        socket_dir: Some(workspace.join(".plugd").join("egress")),
    };
    let mut vai = Vec::new();
    let mut vai_unenforced = false;
    let role = spec.process_role();
    if let (Some(v), Some(role)) = (&spec.vai, &role) {
        let groups = plan_with(spec, workspace, &config);
        for e in &v.exports {
            let requested = Grant {
                network: e.permissions.network,
                filesystem: e.permissions.filesystem,
            };
            let granted = match policy.and_then(|p| p.grants.get(&e.id)) {
                Some(g) => narrow(requested, *g),
                None => requested,
            };
            let placed = groups.placement(&e.id);
            let egress_allow = (granted.network == NetworkPermission::Egress)
                .then(|| {
                    policy.and_then(|p| {
                        p.export_egress_allow
                            .get(&e.id)
                            .or(p.egress_allow.as_ref())
                            .cloned()
                    })
                })
                .flatten();
            vai.push(ExportPermissions {
                export: e.id.clone(),
                requested,
                granted,
                requested_class: e.execution_class,
                effective_class: placed.map_or(e.execution_class, |p| p.effective),
                group: placed.map(|p| p.group.clone()).unwrap_or_default(),
                per_invocation: placed.is_some_and(|p| p.per_invocation),
                note: placed.and_then(|p| p.note.clone()),
                egress_allow,
            });
        }
        // The exports this process serves: its own export for an isolated
        // group (whatever the plan says now), the plan's worker exports
        // for the worker. A process whose role the plan no longer gives
        // an export gets nothing of it.
        let members: Vec<&ExportPermissions> = match role.isolated_export() {
            Some(export) => vai.iter().filter(|e| e.export == export).collect(),
            None => vai.iter().filter(|e| e.group == WORKER_GROUP).collect(),
        };
        let egress = members
            .iter()
            .any(|e| e.granted.network == NetworkPermission::Egress);
        let scratch = members
            .iter()
            .any(|e| e.granted.filesystem == FilesystemPermission::Scratch);
        let write_paths = match (&role.scratch, role.isolated_export()) {
            // One invocation's directory, and nothing else.
            (Some(dir), Some(_)) if scratch => vec![dir.clone()],
            (_, None) if scratch => vec![state_dir.join("scratch").join(WORKER_GROUP)],
            // A long-lived isolated process never writes scratch: an export
            // granted it runs per invocation.
            _ => Vec::new(),
        };
        // A package's permissions are a request for containment: enforced by
        // default, unless the operator turns the sandbox off for it.
        if config.plugins.get(&spec.id).is_some_and(|p| !p.enabled) {
            vai_unenforced = true;
        } else {
            source.push(format!(
                "VAI permissions of process group {} (the union of its exports' grants)",
                role.group
            ));
            // The proxy only when every export of this process granted
            // egress is limited to an allowlist (their union).
            let egress_exports: Vec<&&ExportPermissions> = members
                .iter()
                .filter(|e| e.granted.network == NetworkPermission::Egress)
                .collect();
            let limited = egress_exports.iter().all(|e| e.egress_allow.is_some());
            let mut allow: Vec<String> = egress_exports
                .iter()
                .flat_map(|e| e.egress_allow.iter().flatten().cloned())
                .collect();
            allow.sort();
            allow.dedup();
            let network = match (egress, limited) {
                (false, _) => Network::Deny,
                (true, true) => Network::Proxy,
                (true, false) => Network::Host,
            };
            plan = Some(SandboxPlan {
                egress: if network == Network::Proxy {
                    egress_plan(allow, true)
                } else {
                    EgressPlan::default()
                },
                network,
                read_paths: Vec::new(),
                write_paths,
                drop_user: true,
                fallback: Fallback::None,
                hide_cwd: false,
            });
        }
    }
    if let Some(p) = policy {
        source.push(format!("plugd.yaml sandbox.plugins.{}", spec.id));
        let write = p
            .fs_write_paths
            .as_ref()
            .map(|l| l.iter().map(|e| expand(e)).collect::<Vec<_>>());
        plan = Some(match plan {
            None => {
                if p.network == Some(Network::Host)
                    && p.egress_allow.is_none()
                    && !LoadOptions::from_env().sandbox_host_net_allow
                {
                    return Err(format!(
                        "plugd.yaml sandbox.plugins.{}.network: \"host\" needs the operator capability {}=1; use network: deny or set it",
                        spec.id,
                        LoadOptions::HOST_NET_ALLOW_ENV
                    ));
                }
                let (network, egress) = match &p.egress_allow {
                    Some(allow) => (Network::Proxy, egress_plan(allow.clone(), false)),
                    None => (p.network.unwrap_or_default(), EgressPlan::default()),
                };
                SandboxPlan {
                    network,
                    egress,
                    read_paths: p.fs_read_paths.clone().unwrap_or_default(),
                    write_paths: write.unwrap_or_default(),
                    drop_user: p.drop_user.unwrap_or(true),
                    fallback: Fallback::None,
                    hide_cwd: false,
                }
            }
            Some(mut own) => {
                if p.network == Some(Network::Deny) {
                    own.network = Network::Deny;
                }
                // An allowlist narrows the host's network to plugd's proxy.
                if let (Some(allow), Network::Host) = (&p.egress_allow, own.network) {
                    own.network = Network::Proxy;
                    own.egress = egress_plan(allow.clone(), spec.vai.is_some());
                }
                if let Some(allowed) = &p.fs_read_paths {
                    own.read_paths.retain(|r| allowed.contains(r));
                }
                if let Some(allowed) = &write {
                    own.write_paths.retain(|w| allowed.contains(w));
                }
                own.drop_user |= p.drop_user.unwrap_or(false);
                own
            }
        });
    }
    let fallback = match std::env::var(sandbox::FALLBACK_ENV).ok().as_deref() {
        None | Some("") => config.fallback,
        Some("landlock") => Fallback::Landlock,
        Some("none") => Fallback::None,
        Some(other) => {
            return Err(format!(
                "{}={other:?} is not a sandbox fallback; use \"landlock\" or \"none\"",
                sandbox::FALLBACK_ENV
            ));
        }
    };
    if let Some(p) = plan.as_mut() {
        p.fallback = fallback;
        // Where the proxy's socket goes if this sandbox gets one (an
        // allowlist, or a gateway route added by the runtime with
        // `SandboxPlan::allow_gateway`): under .plugd/, hidden from plugins.
        if p.egress.socket_dir.is_none() {
            p.egress = egress_plan(Vec::new(), spec.vai.is_some());
        }
        // An MCP server's working directory is not its own code (it may be
        // the whole workspace): never show it.
        p.hide_cwd = !spec.pin_dir;
    }
    if plan.is_none() && std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
        return Err(format!(
            "it runs without a sandbox and the operator requires one ({REQUIRE_ENV}=1); enable [plugin.sandbox] in its manifest or sandbox it in plugd.yaml under sandbox.plugins.{}",
            spec.id
        ));
    }
    let limits = Limits {
        address_space_mb: spec.limits.address_space_mb,
        open_files: spec.limits.open_files,
        processes: spec.limits.processes,
        cpu_seconds: spec.limits.cpu_seconds,
    };
    let limits = match policy {
        Some(p) => limits.narrowed_by(&p.limits),
        // Limits alone (without a sandbox) apply too.
        None => match config.plugins.get(&spec.id) {
            Some(p) => limits.narrowed_by(&p.limits),
            None => limits,
        },
    };
    let baseline = match config.plugins.get(&spec.id) {
        Some(p) if !p.baseline => None,
        _ => Some(baseline_plan(
            spec,
            workspace,
            &state_dir,
            config.require_baseline,
        )),
    };
    let containment = Containment {
        sandbox: plan,
        limits,
        baseline,
        records: Some(workspace.join(".plugd").join("procs")),
    };
    let mut report = report(spec, &containment, source, vai);
    report.process_group = role.map(|r| r.group);
    if vai_unenforced {
        report.notes.push(format!(
            "VAI permissions are NOT enforced: plugd.yaml sandbox.plugins.{}.enabled is false",
            spec.id
        ));
    }
    Ok((containment, report))
}

/// What the containment baseline hides from `spec` (see
/// [`plugd_host::sandbox::view`] and [`plugd_host::sandbox::baseline`]): the
/// workspace's `.plugd/` and `.plugins/`, every place the master key file
/// may be (`$PLUGD_KEY_FILE`, `$XDG_CONFIG_HOME/plugd/master.key`,
/// `~/.config/plugd/master.key`) with its directory unless that directory is
/// shared (`/`, a sticky temporary directory, `$HOME`, or one that holds the
/// workspace); the exceptions are the plugin's own directory (read-only)
/// and its state directory (read-write); the workspace's `plugd.yaml` and
/// `.mcp.json` are read-only.
pub fn baseline_plan(
    spec: &PluginSpec,
    workspace: &Path,
    state_dir: &Path,
    require: bool,
) -> BaselinePlan {
    let mut deny = vec![workspace.join(".plugd"), workspace.join(".plugins")];
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let ws = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    for key in plugd_store::secrets::KeySource::file_candidates() {
        let dir = key.parent().map(Path::to_path_buf);
        deny.push(key);
        let Some(dir) = dir else { continue };
        let Ok(canon) = std::fs::canonicalize(&dir) else {
            continue;
        };
        let sticky = {
            use std::os::unix::fs::PermissionsExt;
            canon
                .metadata()
                .is_ok_and(|m| m.permissions().mode() & 0o1000 != 0)
        };
        let shared = canon == Path::new("/")
            || sticky
            || ws.starts_with(&canon)
            || home
                .as_deref()
                .and_then(|h| std::fs::canonicalize(h).ok())
                .is_some_and(|h| h == canon);
        if !shared {
            deny.push(dir);
        }
    }
    BaselinePlan {
        deny,
        allow: vec![spec.dir.clone()],
        writable: vec![state_dir.to_path_buf()],
        read_only: vec![
            workspace.join(crate::plugd_yaml::CONFIG_FILE),
            workspace.join(plugd_manifest::mcp::MCP_FILE),
        ],
        require,
    }
}

/// The program a start of `spec` runs, as `plugd plugin show` prints it: for
/// a sandboxed plugin the path visible inside the sandbox (not a shim under
/// a denylisted directory), else the plain `PATH` look-up.
pub fn program_path(spec: &PluginSpec, workspace: &Path) -> String {
    let sandboxed = matches!(effective(spec, workspace), Ok((c, _)) if c.sandbox.is_some());
    let found = if sandboxed {
        sandbox::resolve_visible_program(&spec.id, &spec.command.program, &spec.dir).ok()
    } else {
        plugd_host::spawn::resolve_program(&spec.id, &spec.command.program).ok()
    };
    found.map_or_else(|| spec.command.program.clone(), |p| p.display().to_string())
}

fn narrow(requested: Grant, granted: Grant) -> Grant {
    let network = if requested.network == NetworkPermission::Egress
        && granted.network == NetworkPermission::Egress
    {
        NetworkPermission::Egress
    } else {
        NetworkPermission::None
    };
    let filesystem = if requested.filesystem == granted.filesystem {
        requested.filesystem
    } else {
        FilesystemPermission::None
    };
    Grant {
        network,
        filesystem,
    }
}

fn report(
    spec: &PluginSpec,
    c: &Containment,
    source: Vec<String>,
    vai: Vec<ExportPermissions>,
) -> EffectivePermissions {
    let mut env: Vec<String> = plugd_host::spawn::child_env(&spec.command.env)
        .into_iter()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    let proxied = c.sandbox.as_ref().filter(|p| p.network == Network::Proxy);
    if proxied.is_some() {
        env.extend(
            plugd_host::sandbox::egress::proxy_env()
                .into_iter()
                .map(|(k, _)| k),
        );
    }
    let mut notes = Vec::new();
    let (mechanism, detail) = match sandbox::select_mechanism(&spec.id, c) {
        Ok(m @ sandbox::Mechanism::Bwrap { .. }) => {
            let detail = match &m {
                sandbox::Mechanism::Bwrap { path } => Some(path.display().to_string()),
                _ => None,
            };
            (m.name().to_owned(), detail)
        }
        Ok(sandbox::Mechanism::LandlockSeccomp) => {
            notes.push("bubblewrap is missing: Landlock + seccomp fallback (no private /tmp, /proc or namespaces; the user is not changed)".to_owned());
            (
                "landlock+seccomp".to_owned(),
                Some("bubblewrap not found; fallback allowed by the operator".to_owned()),
            )
        }
        Ok(m) => (m.name().to_owned(), None),
        Err(why) => ("refused".to_owned(), Some(why)),
    };
    if c.limits.processes.is_some() {
        notes.push("limits.processes counts every process of the user and is not enforced when plugd runs as root".to_owned());
    }
    if !c.limits.is_empty() {
        notes.push("limits are setrlimit per process; cgroup v2 is not used".to_owned());
    }
    let (network, read_only, writable, user) = match &c.sandbox {
        Some(p) => (
            p.network.name().to_owned(),
            (!p.hide_cwd)
                .then(|| spec.dir.clone())
                .into_iter()
                .chain(p.read_paths.iter().cloned())
                .collect(),
            p.write_paths.clone(),
            if p.drop_user && mechanism == "bwrap" {
                "nobody (65534)".to_owned()
            } else {
                "plugd's user".to_owned()
            },
        ),
        None => (
            "host".to_owned(),
            vec![PathBuf::from("/")],
            vec![PathBuf::from("/")],
            "plugd's user".to_owned(),
        ),
    };
    let wrapped_command = sandbox::bwrap_command_line(
        &spec.id,
        c,
        &spec.command.program,
        &spec.command.args,
        &spec.dir,
        &spec.command.env,
    )
    .unwrap_or_else(|why| {
        notes.push(format!("the sandbox cannot start: {why}"));
        None
    });
    let baseline = BaselineReport::compute(c, &mechanism, &spec.id, &spec.dir);
    EffectivePermissions {
        baseline,
        process_tracking: plugd_host::cgroup::describe(&spec.id),
        mechanism,
        mechanism_detail: detail,
        source,
        wrapped_command,
        network,
        egress_allow: proxied.map(|p| p.egress.allow.clone()).unwrap_or_default(),
        read_only,
        writable,
        user,
        limits: c.limits,
        env,
        vai,
        process_group: None,
        groups: Vec::new(),
        notes,
    }
}

impl EffectivePermissions {
    /// The report of a plugin whose next start would be refused, and why.
    pub fn refused(why: String) -> EffectivePermissions {
        EffectivePermissions {
            mechanism: "refused".to_owned(),
            mechanism_detail: Some(why),
            source: Vec::new(),
            wrapped_command: None,
            network: "-".to_owned(),
            egress_allow: Vec::new(),
            read_only: Vec::new(),
            writable: Vec::new(),
            user: "-".to_owned(),
            limits: Limits::default(),
            env: Vec::new(),
            vai: Vec::new(),
            process_group: None,
            groups: Vec::new(),
            notes: Vec::new(),
            baseline: BaselineReport {
                state: "-".to_owned(),
                mechanism: "-".to_owned(),
                hidden: Vec::new(),
                allowed: Vec::new(),
                read_only: Vec::new(),
                detail: "the start is refused".to_owned(),
            },
            process_tracking: "-".to_owned(),
        }
    }

    /// The report as the text lines `plugd plugin show` prints.
    pub fn text_lines(&self) -> Vec<String> {
        let paths = |v: &[PathBuf]| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                v.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let mut out = vec!["effective permissions:".to_owned()];
        let mech = match &self.mechanism_detail {
            Some(d) => format!("{} ({d})", self.mechanism),
            None => self.mechanism.clone(),
        };
        out.push(format!("  sandbox:   {mech}"));
        if !self.source.is_empty() {
            out.push(format!("  from:      {}", self.source.join("; ")));
        }
        if let Some(cmd) = &self.wrapped_command {
            out.push(format!("  runs as:   {}", cmd.join(" ")));
        }
        if self.network == "proxy" {
            out.push(format!(
                "  network:   proxy (only through plugd's egress proxy) to: {}",
                if self.egress_allow.is_empty() {
                    "nothing".to_owned()
                } else {
                    self.egress_allow.join(", ")
                }
            ));
        } else {
            out.push(format!("  network:   {}", self.network));
        }
        out.push(format!("  read-only: {}", paths(&self.read_only)));
        out.push(format!("  writable:  {}", paths(&self.writable)));
        out.push(format!("  user:      {}", self.user));
        let l = &self.limits;
        let lim = [
            ("address_space_mb", l.address_space_mb),
            ("open_files", l.open_files),
            ("processes", l.processes),
            ("cpu_seconds", l.cpu_seconds),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>();
        out.push(format!(
            "  limits:    {}",
            if lim.is_empty() {
                "-".to_owned()
            } else {
                lim.join(" ")
            }
        ));
        out.push(format!("  env:       {}", self.env.join(" ")));
        if !self.vai.is_empty() {
            if let Some(g) = &self.process_group {
                out.push(format!("  (the lines above: process group {g})"));
            }
            out.push("  vai exports (requested -> granted; class requested -> effective, process group):".to_owned());
            let g = |g: &Grant| {
                let n = match g.network {
                    NetworkPermission::None => "none",
                    NetworkPermission::Egress => "egress",
                };
                let f = match g.filesystem {
                    FilesystemPermission::None => "none",
                    FilesystemPermission::Scratch => "scratch",
                    FilesystemPermission::AssetsRo => "assets_ro",
                };
                format!("network={n} filesystem={f}")
            };
            let class = plugd_host::groups::class_str;
            for e in &self.vai {
                let limited = match &e.egress_allow {
                    Some(l) => format!(" egress_allow=[{}]", l.join(", ")),
                    None => String::new(),
                };
                out.push(format!(
                    "    {}: {} -> {}{limited}; {} -> {}, {}{}",
                    e.export,
                    g(&e.requested),
                    g(&e.granted),
                    class(e.requested_class),
                    class(e.effective_class),
                    e.group,
                    if e.per_invocation {
                        " (a process per invocation)"
                    } else {
                        ""
                    }
                ));
                if let Some(n) = &e.note {
                    out.push(format!("      note: {n}"));
                }
            }
            if !self.groups.is_empty() {
                out.push("  process groups (each its own sandbox):".to_owned());
                for gr in &self.groups {
                    out.push(format!(
                        "    {}{}: exports {}; sandbox {}, network {}, writable {}",
                        gr.group,
                        if gr.per_invocation {
                            " (per invocation)"
                        } else {
                            ""
                        },
                        if gr.exports.is_empty() {
                            "-".to_owned()
                        } else {
                            gr.exports.join(", ")
                        },
                        gr.mechanism,
                        gr.network,
                        paths(&gr.writable)
                    ));
                }
            }
        }
        let b = &self.baseline;
        match b.state.as_str() {
            "on" => {
                out.push(format!("  baseline:  on, {}", b.mechanism));
                out.push(format!("    hidden:  {}", paths(&b.hidden)));
                out.push(format!("    except:  {}", paths(&b.allowed)));
                if !b.read_only.is_empty() {
                    out.push(format!("    read-only: {}", paths(&b.read_only)));
                }
                out.push(format!("    note:    {}", b.detail));
            }
            "unavailable" | "refused" => {
                out.push(format!("  baseline:  {}: {}", b.state, b.detail));
                out.push(format!("    would hide: {}", paths(&b.hidden)));
            }
            state => out.push(format!("  baseline:  {state}: {}", b.detail)),
        }
        out.push(format!("  tracking:  {}", self.process_tracking));
        for n in &self.notes {
            out.push(format!("  note:      {n}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn vai_grants_only_narrow_the_request() {
        let req = Grant {
            network: NetworkPermission::None,
            filesystem: FilesystemPermission::Scratch,
        };
        let wider = Grant {
            network: NetworkPermission::Egress,
            filesystem: FilesystemPermission::AssetsRo,
        };
        assert_eq!(
            narrow(req, wider),
            Grant {
                network: NetworkPermission::None,
                filesystem: FilesystemPermission::None,
            }
        );
        assert_eq!(narrow(req, req), req);
    }
}
