//! Calls through bindings (seed 003): the export a caller names is resolved
//! to one active binding of the caller's scope, the package version that
//! binding names runs from its read-only install directory, and the call
//! carries the binding's config and secrets as they are at that moment.
//!
//! **Scope rule** ([`plugd_control::bindings::resolve`]): the active
//! bindings (share above zero) of the export scoped to the caller's project
//! when there are any, else the org-wide ones; among several, the rollout
//! selection by session. A call without a session id draws a fresh random
//! key per call (so such calls spread over versions by their shares); its
//! `context.session_id` and record's `session_id` stay empty. No binding,
//! a disabled one, or one of another org: [`RuntimeError::UnknownExport`],
//! the same error whichever it is.
//!
//! **Package processes** ([`PackageProcs`]): one [`Supervised`] per
//! installed digest, made on the first call and shared by every binding on
//! that version, under the same supervisor, dialect, containment and
//! deadlines as a `.plugins/` plugin. Like a `.plugins/` package, a VAI
//! package runs its exports in the processes of their execution classes
//! ([`plugd_host::groups`]: a `worker` process, one per isolated export, one
//! per invocation of an isolated export granted scratch), each with its own
//! sandbox; `plugd.yaml` `sandbox.plugins.<package_id>` (grants, `trusted`)
//! applies to the installed package of that id. Packages installed while `plugd
//! serve` runs become callable at their first call; [`crate::Runtime::shutdown`]
//! stops them all.
//!
//! **Approval**: installing a package is an operator's act (`plugd package
//! pull`, `POST /v1/plugin-packages`, operator role), and it is its
//! approval: the install directory is read-only and named by the OCI
//! manifest digest, and the record keeps the tree digest of that directory
//! as installed. plugd checks it when it first loads the package and before
//! every start, so files changed under it at any time after the install
//! (edited, added, replaced by a symlink) stop it from starting, as a
//! `.plugins/` plugin changed since its approval does; the manifest inside
//! must still declare the package and version of the record. Records
//! without a tree digest (development builds only) are digested at first
//! load, with a warning.
//!
//! **Recovery**: a package process that failed for good (a lying
//! handshake, its restart budget spent, a start refused) stays failed until
//! [`Runtime::restart_package`] (`plugd package restart`, `POST
//! /v1/plugin-packages/{id}:restart`) clears the failure and the budget;
//! its next call starts it again, after the same checks.
//!
//! **Secrets** are decrypted at call time, only for the slots the export
//! declares, and reach the plugin's `context.secrets` only: they are
//! scrubbed (`••••`) from the plugin's stderr (and so its logs and crash
//! reports), from the result and from errors; invocation records never hold
//! arguments, results or secrets.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plugd_control::bindings::{Problem, SecretRef};
use plugd_control::{Binding, BindingFilter, BindingStatus, Package, PackageSelector};
use plugd_host::dialect::{BoundCall, CallContext, HostServices};
use plugd_host::{
    CallToolError, HostConfig, Launch, Observer, PluginError, Supervised, ToolDef, ToolError,
};
use plugd_manifest::{LoadOptions, PluginSpec};
use plugd_store::StateStore;
use plugd_store::digest::{DigestLimits, plugin_digest};
use plugd_store::secrets::{KeySource, StoredValue};
use serde_json::{Map, Value};

use crate::{Runtime, RuntimeError, ToolEntry, containment, risk};

/// How long a call waits for a package's process to come up (native
/// packages, whose catalog comes from the handshake).
const START_WAIT: Duration = Duration::from_secs(30);

/// Who calls an export, and in which scope (from the caller's identity).
#[derive(Debug, Clone, Default)]
pub struct ExportCall {
    /// The caller's org.
    pub org_id: String,
    /// The caller's project, if the call is made for one.
    pub project_id: Option<String>,
    /// The session (rollout key, `context.session_id`).
    pub session_id: Option<String>,
    /// Who asked (`token:NAME`, `cli:USER`), for the record.
    pub caller: Option<String>,
    /// The caller's trace, if any.
    pub trace_id: Option<String>,
}

/// One tool export a scope sees: the binding the scope rule and the
/// rollout chose for the session, and the export's tool entry (its name,
/// description and input schema as the package declares them).
#[derive(Debug, Clone)]
pub struct ScopedExport {
    /// The export id: the tool's name on every surface (as in
    /// `/v1/plugin-tools/{export}:invoke`).
    pub export_id: String,
    /// The binding it resolved to.
    pub binding: Binding,
    /// The package's tool entry.
    pub entry: Arc<ToolEntry>,
}

/// What a call through a binding produced, and the binding it took.
#[derive(Debug)]
pub struct ExportCalled {
    /// The governed call.
    pub called: crate::governed::Called,
    /// The binding it went through (`None`: none resolved).
    pub binding_id: Option<String>,
}

/// One installed package version, supervised.
struct PackageProc {
    package: Package,
    sup: Supervised,
    /// Tool entries by export id (their compiled schemas kept).
    entries: Mutex<HashMap<String, Arc<ToolEntry>>>,
}

/// The processes of installed packages, by digest, filled as calls come.
pub struct PackageProcs {
    dir: PathBuf,
    store: Arc<dyn StateStore>,
    config: Arc<HostConfig>,
    services: HostServices,
    procs: Mutex<HashMap<String, Arc<PackageProc>>>,
    delegations: Arc<crate::delegation::Delegations>,
}

impl std::fmt::Debug for PackageProcs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageProcs").finish_non_exhaustive()
    }
}

impl PackageProcs {
    /// Empty, for the workspace at `dir`.
    pub(crate) fn new(
        dir: &Path,
        store: Arc<dyn StateStore>,
        config: Arc<HostConfig>,
        services: HostServices,
        delegations: Arc<crate::delegation::Delegations>,
    ) -> PackageProcs {
        PackageProcs {
            dir: dir.to_owned(),
            store,
            config,
            services,
            procs: Mutex::new(HashMap::new()),
            delegations,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PackageProc>>> {
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process of `pkg`, made (not started) on first use.
    fn get(&self, pkg: &Package) -> Result<Arc<PackageProc>, RuntimeError> {
        let key = pkg.digest.to_string();
        if let Some(p) = self.lock().get(&key) {
            return Ok(p.clone());
        }
        // Digested and loaded outside the lock: one package's walk never
        // holds up calls of the others. The tree is checked before its
        // manifest is even read.
        let broken = |error: String| RuntimeError::Broken {
            name: describe(pkg),
            error,
        };
        let now = plugin_digest(&pkg.path, &DigestLimits::default())
            .map_err(|e| broken(e.to_string()))?;
        let tree = match &pkg.tree_digest {
            Some(expected) => {
                check_tree(pkg, expected, &now).map_err(broken)?;
                expected.clone()
            }
            None => {
                tracing::warn!(package = %describe(pkg),
                    "its record has no tree digest from its install (a development build installed it); its files are pinned as this serve first loads them ({now}), so a change made before now goes unnoticed");
                now
            }
        };
        let spec = load_spec(pkg).map_err(broken)?;
        let observer = Arc::new(PackageObserver {
            workspace: self.dir.clone(),
            store: self.store.clone(),
            package: pkg.clone(),
            tree,
            delegations: self.delegations.clone(),
        });
        let proc = Arc::new(PackageProc {
            package: pkg.clone(),
            sup: Supervised::new(
                Arc::new(spec),
                self.config.clone(),
                observer,
                self.services.clone(),
            ),
            entries: Mutex::new(HashMap::new()),
        });
        Ok(self.lock().entry(key).or_insert(proc).clone())
    }

    /// Clears a failed state and the restart budget of the process of
    /// `pkg`, stopping it if it runs; `false` when it has none yet (its
    /// next call makes one).
    pub(crate) async fn reset(&self, pkg: &Package) -> bool {
        let proc = self.lock().get(pkg.digest.as_str()).cloned();
        match proc {
            Some(p) => {
                p.sup.reset().await;
                true
            }
            None => false,
        }
    }

    /// The processes of `pkg` (one per process group, with the pids
    /// running now); empty when no call made its supervisor yet.
    pub fn processes(&self, pkg: &Package) -> Vec<plugd_host::groups::ProcessInfo> {
        let proc = self.lock().get(pkg.digest.as_str()).cloned();
        proc.map(|p| p.sup.processes()).unwrap_or_default()
    }

    /// Stops every package process and waits until they are reaped.
    pub(crate) async fn stop_all(&self) {
        let all: Vec<Arc<PackageProc>> = self.lock().values().cloned().collect();
        futures_util::future::join_all(all.iter().map(|p| p.sup.stop())).await;
    }
}

/// `package acme/devkit@0.1.0 (sha256:…)`, for messages.
pub(crate) fn describe(pkg: &Package) -> String {
    format!(
        "package {}@{} ({})",
        pkg.package_id, pkg.version, pkg.digest
    )
}

/// The effective permissions of installed `pkg` as its processes in
/// `workspace` get them: every export with its class and process group,
/// every group's sandbox (what `plugd package show` prints).
pub fn package_permissions(
    pkg: &Package,
    workspace: &Path,
) -> Result<containment::EffectivePermissions, String> {
    let spec = load_spec(pkg)?;
    let worker = spec.for_process(plugd_manifest::vai::ProcessRole::worker());
    containment::effective(&worker, workspace).map(|(_, r)| r)
}

/// The plugin spec of an installed package, from its own manifest.
fn load_spec(pkg: &Package) -> Result<PluginSpec, String> {
    let path = pkg.path.join(&pkg.manifest);
    let opts = LoadOptions::from_env();
    let spec = match pkg.manifest.as_str() {
        plugd_manifest::vai::VAI_MANIFEST_FILE => plugd_manifest::vai::load_vai(&path, &opts),
        plugd_manifest::NATIVE_MANIFEST_FILE => plugd_manifest::load_native(&path, &opts),
        other => {
            return Err(format!(
                "its manifest {other:?} is not one plugd runs from a package (vai-plugin.toml, nexo-plugin.toml)"
            ));
        }
    }
    .map_err(|e| e.to_string())?;
    if spec.id != pkg.package_id || spec.version != pkg.version {
        return Err(format!(
            "its manifest now declares {}@{}, not the {}@{} it was installed as",
            spec.id, spec.version, pkg.package_id, pkg.version
        ));
    }
    Ok(spec)
}

/// `Err` naming the package, its digest, both tree digests and the way
/// back when the files of `pkg` (tree digest `now`) are not the `expected`
/// ones.
fn check_tree(pkg: &Package, expected: &str, now: &str) -> Result<(), String> {
    if now == expected {
        return Ok(());
    }
    let (since, restore) = if pkg.tree_digest.is_some() {
        let again = if pkg.source.starts_with("upload:") {
            // Uploaded: no registry to pull from; the same archive or
            // directory, installed again, restores it.
            "install it again (`plugd package install DIR|TAR` or POST /v1/plugin-packages with its archive restores the files of an installed digest)".to_owned()
        } else {
            format!(
                "pull it again (`plugd package pull {}` restores the files of an installed digest)",
                pkg.source
            )
        };
        ("its install", again)
    } else {
        (
            "plugd first loaded them",
            "restore them (its record, from a development build, has no tree digest from its install to restore them by)".to_owned(),
        )
    };
    Err(format!(
        "the installed files of {} changed since {since} (tree digest {expected} expected, {now} found in {}); nothing of it runs until they are restored: {restore}, then `plugd package restart {}` or POST /v1/plugin-packages/{}:restart",
        describe(pkg),
        pkg.path.display(),
        pkg.digest,
        pkg.digest
    ))
}

/// Decides each start of a package process: still installed, its files as
/// installed (as plugd first loaded them, for a record without a tree
/// digest), and the containment of its permissions.
struct PackageObserver {
    workspace: PathBuf,
    store: Arc<dyn StateStore>,
    package: Package,
    tree: String,
    delegations: Arc<crate::delegation::Delegations>,
}

#[async_trait::async_trait]
impl Observer for PackageObserver {
    async fn may_start(&self, spec: &PluginSpec) -> Result<Launch, String> {
        match self.store.package(&self.package.digest).await {
            // Installed here, or on another node and run from the copy
            // taken from the cluster (the same recorded tree).
            Ok(Some(p))
                if p.path == self.package.path
                    || (p.tree_digest.is_some() && p.tree_digest == self.package.tree_digest) => {}
            Ok(_) => {
                return Err(format!(
                    "{} is no longer installed; pull it again",
                    describe(&self.package)
                ));
            }
            Err(e) => return Err(e.to_string()),
        }
        let now = plugin_digest(&spec.dir, &DigestLimits::default()).map_err(|e| e.to_string())?;
        check_tree(&self.package, &self.tree, &now)?;
        let (mut containment, _) = containment::effective(spec, &self.workspace)?;
        self.delegations.route_gateway(spec, &mut containment);
        Ok(Launch {
            containment,
            ..Launch::default()
        })
    }

    fn failed(&self, spec: &PluginSpec, reason: &str) {
        tracing::warn!(plugin = %spec.id, package = %describe(&self.package), "package process failed: {reason}");
    }

    fn process_groups(&self, spec: &PluginSpec) -> plugd_host::groups::GroupPlan {
        containment::group_plan(spec, &self.workspace)
    }
}

/// A random session key for a call without a session.
fn fresh_session_key() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        b[..8].copy_from_slice(&N.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        b[8..].copy_from_slice(
            &(std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64))
            .to_be_bytes(),
        );
    }
    hex::encode(b)
}

/// The secret slots export `export_id` of `spec` declares (`None`: the
/// manifest form has none; nothing is sent).
fn declared_slots<'a>(spec: &'a PluginSpec, export_id: &str) -> Option<&'a [String]> {
    let export = spec
        .vai
        .as_ref()?
        .exports
        .iter()
        .find(|e| e.id == export_id)?;
    Some(export.permissions.secret_slots.as_slice())
}

/// The binding's secrets for the slots `declared`, decrypted; every slot
/// that cannot be resolved is a problem at `/secrets/SLOT` (never with its
/// value).
/// The stored (sealed) values of the org secrets `b` refers to, by owner
/// and name, read before the call's record opens: [`resolve_secrets`]
/// decrypts them without touching the store.
async fn read_secrets(store: &dyn StateStore, b: &Binding) -> StoredSecrets {
    let mut out = StoredSecrets::new();
    for reference in b.secrets.values() {
        let Ok(r) = SecretRef::parse(reference) else {
            continue;
        };
        let owner = plugd_store::bindings::org_secret_owner(&r.org_id);
        let value = store
            .config_value(&owner, &r.name)
            .await
            .map_err(|e| e.to_string());
        out.insert((owner, r.name.clone()), value);
    }
    out
}

/// What [`read_secrets`] read: a stored value (or `None`) or why it could
/// not be read, by (owner, name).
type StoredSecrets = HashMap<(String, String), Result<Option<StoredValue>, String>>;

fn resolve_secrets(
    stored: &StoredSecrets,
    b: &Binding,
    declared: &[String],
) -> Result<Map<String, Value>, Vec<Problem>> {
    let mut out = Map::new();
    let mut problems = Vec::new();
    let mut master = None;
    for (slot, reference) in &b.secrets {
        if !declared.contains(slot) {
            continue;
        }
        let path = format!("/secrets/{}", slot.replace('~', "~0").replace('/', "~1"));
        let mut problem = |message: String| {
            problems.push(Problem {
                path: path.clone(),
                message,
            })
        };
        let r = match SecretRef::parse(reference) {
            Ok(r) if r.org_id == b.scope.org_id => r,
            Ok(_) => {
                problem(format!(
                    "slot {slot:?} names a secret of another org; use secret://{}/NAME",
                    b.scope.org_id
                ));
                continue;
            }
            Err(e) => {
                problem(e);
                continue;
            }
        };
        let owner = plugd_store::bindings::org_secret_owner(&r.org_id);
        let read = stored
            .get(&(owner.clone(), r.name.clone()))
            .cloned()
            .unwrap_or(Ok(None));
        let sealed = match read {
            Ok(Some(StoredValue::Secret(s))) => s,
            Ok(Some(StoredValue::Plain(_))) | Ok(None) => {
                problem(format!(
                    "slot {slot:?}: secret {}/{} is not set; store it with `plugd secret set {}/{}` (value on standard input) or point the slot at another secret",
                    r.org_id, r.name, r.org_id, r.name
                ));
                continue;
            }
            Err(e) => {
                problem(format!("slot {slot:?}: secret {r} cannot be read: {e}"));
                continue;
            }
        };
        if master.is_none() {
            match KeySource::from_env().and_then(|s| s.require()) {
                Ok(k) => master = Some(k),
                Err(e) => {
                    problem(format!(
                        "slot {slot:?}: secret {r} cannot be decrypted: {e}"
                    ));
                    continue;
                }
            }
        }
        let Some(key) = &master else { continue };
        let plain =
            key.open(&owner, &r.name, &sealed)
                .or_else(|e| match crate::plugin_config::staged_key(&sealed.key_id) {
                    Some(staged) => staged.open(&owner, &r.name, &sealed),
                    None => Err(e),
                });
        match plain {
            Ok(v) => {
                out.insert(slot.clone(), Value::String(v.as_str().to_owned()));
            }
            Err(e) => problem(format!(
                "slot {slot:?}: secret {r} cannot be decrypted: {e}"
            )),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// `v` with every string holding one of `secrets` masked.
pub(crate) fn scrub_value(v: &mut Value, secrets: &[String]) {
    match v {
        Value::String(s) if secrets.iter().any(|x| s.contains(x.as_str())) => {
            *s = plugd_host::launch::scrub(s, secrets);
        }
        Value::Array(a) => a.iter_mut().for_each(|x| scrub_value(x, secrets)),
        Value::Object(o) => o.values_mut().for_each(|x| scrub_value(x, secrets)),
        _ => {}
    }
}

/// `e` with every secret masked: a plugin's message keeps its class; any
/// other error that would show a secret becomes a tool failure with its
/// text masked.
pub(crate) fn scrub_error(e: RuntimeError, entry: &ToolEntry, secrets: &[String]) -> RuntimeError {
    let text = e.to_string();
    if !secrets.iter().any(|s| text.contains(s.as_str())) {
        return e;
    }
    let scrub = |s: &str| plugd_host::launch::scrub(s, secrets);
    let tool = match e {
        RuntimeError::Call(CallToolError::Tool(t)) => match t {
            ToolError::NotFound {
                plugin,
                tool,
                message,
            } => ToolError::NotFound {
                plugin,
                tool,
                message: scrub(&message),
            },
            ToolError::ArgumentInvalid {
                plugin,
                tool,
                message,
                mut details,
            } => {
                if let Some(d) = &mut details {
                    scrub_value(d, secrets);
                }
                ToolError::ArgumentInvalid {
                    plugin,
                    tool,
                    message: scrub(&message),
                    details,
                }
            }
            ToolError::ExecutionFailed {
                plugin,
                tool,
                message,
            } => ToolError::ExecutionFailed {
                plugin,
                tool,
                message: scrub(&message),
            },
            ToolError::Unavailable {
                plugin,
                tool,
                message,
                retry_after_ms,
            } => ToolError::Unavailable {
                plugin,
                tool,
                message: scrub(&message),
                retry_after_ms,
            },
            ToolError::Denied {
                plugin,
                tool,
                message,
            } => ToolError::Denied {
                plugin,
                tool,
                message: scrub(&message),
            },
            other => masked(entry, &scrub(&other.to_string())),
        },
        _ => masked(entry, &scrub(&text)),
    };
    RuntimeError::Call(CallToolError::Tool(tool))
}

/// A package process that cannot serve, named by its package and digest
/// (`plugd plugin restart`, which a workspace plugin's failure suggests,
/// does not apply to it).
fn package_error(e: RuntimeError, pkg: &Package) -> RuntimeError {
    match e {
        RuntimeError::Call(CallToolError::Plugin(p)) => RuntimeError::Broken {
            name: describe(pkg),
            error: match p {
                PluginError::Failed { reason, .. } => format!(
                    "{reason}; its process stays failed until `plugd package restart {}` (POST /v1/plugin-packages/{}:restart)",
                    pkg.digest, pkg.digest
                ),
                other => other.to_string(),
            },
        },
        other => other,
    }
}

fn masked(entry: &ToolEntry, message: &str) -> ToolError {
    ToolError::ExecutionFailed {
        plugin: entry.plugin.as_str().into(),
        tool: entry.name.clone(),
        message: message.to_owned(),
    }
}

impl Runtime {
    /// The processes of installed packages.
    pub fn package_procs(&self) -> &PackageProcs {
        &self.inner.packages
    }

    /// The supervisor of installed package `package_id` (its highest
    /// version), made on first use; `None` when no version is installed.
    /// The tamper check runs before its first start, as for calls through
    /// bindings.
    pub async fn installed_package(
        &self,
        package_id: &str,
    ) -> Result<Option<Supervised>, RuntimeError> {
        let Some(pkg) = self
            .inner
            .state
            .find_package(&PackageSelector::Latest(package_id.to_owned()))
            .await?
        else {
            return Ok(None);
        };
        let pkg = self.package_here(pkg).await?;
        Ok(Some(self.inner.packages.get(&pkg)?.sup.clone()))
    }

    /// Clears a failed state and the restart budget of the process of
    /// installed `pkg` (see the module docs): its next call starts it again,
    /// after the tamper check. `false` when it has no process yet.
    pub async fn restart_package(&self, pkg: &Package) -> bool {
        self.inner.packages.reset(pkg).await
    }

    /// Calls tool export `export_id` for `call`'s scope through the binding
    /// the scope rule and the rollout choose (see the module docs): the same
    /// governed path as every tool call (enabled, arguments, hooks, risk
    /// gate; [`crate::governed`]), one
    /// invocation record with the binding, package, version and execution
    /// class, the result with the binding's secrets masked.
    pub async fn call_export(
        &self,
        export_id: &str,
        args: Value,
        call: &ExportCall,
        approver: Option<&dyn risk::Approver>,
    ) -> Result<Value, RuntimeError> {
        let gov = crate::governed::Governed {
            approver,
            ..crate::governed::Governed::new(crate::governed::Surface::Binding)
        };
        self.call_export_governed(export_id, args, call, CallContext::default(), &gov, None)
            .await
            .called
            .outcome
    }

    /// [`Runtime::call_export`] for a surface with its own call context
    /// (progress, the MCP client) and its own [`crate::governed::Governed`]
    /// (the MCP surface, an approver): `base` gives what the surface has;
    /// the scope, caller, session and trace come from `call`. `pin` is the
    /// binding the caller's session took before: it is taken again while
    /// it is still in the scope's pool (active, a share above zero, the
    /// same scope), so a session keeps one rollout choice for its
    /// lifetime; otherwise the rule chooses anew.
    pub async fn call_export_governed(
        &self,
        export_id: &str,
        args: Value,
        call: &ExportCall,
        base: CallContext,
        gov: &crate::governed::Governed<'_>,
        pin: Option<&str>,
    ) -> ExportCalled {
        let failed = |args, e| ExportCalled {
            called: crate::governed::Called {
                args,
                outcome: Err(e),
                notices: Vec::new(),
                decisions: Vec::new(),
            },
            binding_id: None,
        };
        let resolved = match self.resolve_bound(export_id, call, pin).await {
            Ok(r) => r,
            Err(e) => return failed(args, e),
        };
        let (binding, pkg, proc, entry) = resolved;
        let subject = || plugd_telemetry::Subject {
            plugin: Some(entry.plugin.as_str()),
            export: Some(export_id),
            binding: Some(binding.binding_id.as_str()),
            ..plugd_telemetry::Subject::default()
        };
        let mut called = None;
        let run = async {
            let mut c = self
                .call_bound(&proc, &entry, &binding, args, call, base, gov)
                .await;
            c.outcome = std::mem::replace(&mut c.outcome, Ok(Value::Null))
                .map_err(|e| package_error(e, &pkg));
            let out = match &c.outcome {
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            called = Some(c);
            out
        };
        let _ = plugd_telemetry::in_span("tool call", subject, run).await;
        ExportCalled {
            called: called.unwrap_or_else(|| unreachable!("the call future ran to its end")),
            binding_id: Some(binding.binding_id),
        }
    }

    /// The binding, package, process and tool entry a call of `export_id`
    /// by `call` goes to (`pin`: see [`Runtime::call_export_governed`]).
    async fn resolve_bound(
        &self,
        export_id: &str,
        call: &ExportCall,
        pin: Option<&str>,
    ) -> Result<(Binding, Package, Arc<PackageProc>, Arc<ToolEntry>), RuntimeError> {
        let not_found = || RuntimeError::UnknownExport {
            export: export_id.to_owned(),
            org: call.org_id.clone(),
        };
        let store = &self.inner.state;
        let bindings = store
            .bindings(&BindingFilter {
                org_id: Some(call.org_id.clone()),
                export_id: Some(export_id.to_owned()),
                package_id: None,
                status: Some(BindingStatus::Active),
            })
            .await?;
        let pool = plugd_control::bindings::candidates(
            &bindings,
            export_id,
            &call.org_id,
            call.project_id.as_deref(),
        );
        let pinned = pin.and_then(|p| pool.iter().find(|b| b.binding_id == p).copied());
        let binding = match pinned {
            Some(b) => b,
            None => {
                let key = call.session_id.clone().unwrap_or_else(fresh_session_key);
                plugd_control::bindings::resolve(
                    &bindings,
                    export_id,
                    &call.org_id,
                    call.project_id.as_deref(),
                    &key,
                )
                .ok_or_else(not_found)?
            }
        }
        .clone();
        let (pkg, proc, entry) = self.bound_entry(&binding).await?;
        Ok((binding, pkg, proc, entry))
    }

    /// The installed package, process and tool entry of `binding`'s
    /// export; `UnknownExport` when its package does not offer it as a
    /// tool.
    async fn bound_entry(
        &self,
        binding: &Binding,
    ) -> Result<(Package, Arc<PackageProc>, Arc<ToolEntry>), RuntimeError> {
        let export_id = binding.export_id.as_str();
        let sel = PackageSelector::Version {
            package_id: binding.package_id.clone(),
            version: binding.package_version.clone(),
        };
        let Some(pkg) = self.inner.state.find_package(&sel).await? else {
            return Err(RuntimeError::InvalidBinding {
                binding_id: binding.binding_id.clone(),
                problems: vec![Problem {
                    path: "/package_version".into(),
                    message: format!(
                        "package {sel} is not installed; pull it again or point the binding at an installed version"
                    ),
                }],
            });
        };
        if !pkg
            .exports
            .iter()
            .any(|e| e.id == export_id && e.kind == "tool")
        {
            return Err(RuntimeError::UnknownExport {
                export: export_id.to_owned(),
                org: binding.scope.org_id.clone(),
            });
        }
        let pkg = self.package_here(pkg).await?;
        let proc = self.inner.packages.get(&pkg)?;
        let entry = self
            .package_entry(&proc, export_id)
            .await
            .map_err(|e| package_error(e, &pkg))?;
        Ok((pkg, proc, entry))
    }

    /// The tool exports bound to `call`'s scope (its org, and its project
    /// when it names one), one per export id, each with the binding the
    /// scope rule and rollout choose for `call`'s session (a fresh key
    /// without one) or the one `pins` names while it still applies; sorted
    /// by export id. An export whose package cannot describe it (not
    /// installed here, its files changed, a native package that does not
    /// start) is left out with a warning: a listing never fails because of
    /// one package. What plugd.yaml's `policy:` hides from `caller` is left
    /// out too (the same rule refuses its calls).
    pub async fn scoped_exports(
        &self,
        call: &ExportCall,
        pins: &HashMap<String, String>,
        caller: &crate::tool_policy::PolicyCaller,
    ) -> Result<Vec<ScopedExport>, RuntimeError> {
        let bindings = self
            .inner
            .state
            .bindings(&BindingFilter {
                org_id: Some(call.org_id.clone()),
                export_id: None,
                package_id: None,
                status: Some(BindingStatus::Active),
            })
            .await?;
        let exports: std::collections::BTreeSet<&str> =
            bindings.iter().map(|b| b.export_id.as_str()).collect();
        let key = call.session_id.clone().unwrap_or_else(fresh_session_key);
        let mut out = Vec::new();
        for export_id in exports {
            let pool = plugd_control::bindings::candidates(
                &bindings,
                export_id,
                &call.org_id,
                call.project_id.as_deref(),
            );
            let pinned = pins
                .get(export_id)
                .and_then(|p| pool.iter().find(|b| b.binding_id == *p).copied());
            let chosen = pinned.or_else(|| {
                plugd_control::bindings::resolve(
                    &bindings,
                    export_id,
                    &call.org_id,
                    call.project_id.as_deref(),
                    &key,
                )
            });
            let Some(binding) = chosen else { continue };
            match self.bound_entry(binding).await {
                Ok((_, _, entry)) => {
                    if self.policy_hides(caller, &entry) {
                        continue;
                    }
                    out.push(ScopedExport {
                        export_id: export_id.to_owned(),
                        binding: binding.clone(),
                        entry,
                    });
                }
                Err(RuntimeError::UnknownExport { .. }) => {}
                Err(e) => {
                    tracing::warn!(export = export_id, binding = %binding.binding_id, error = %e,
                        "a bound export is left out of its scope's tool list: its package cannot describe it");
                }
            }
        }
        Ok(out)
    }

    /// The tool entry of `export_id` in `proc`: from the manifest for a VAI
    /// package, from the handshake for a native one (which starts it).
    async fn package_entry(
        &self,
        proc: &PackageProc,
        export_id: &str,
    ) -> Result<Arc<ToolEntry>, RuntimeError> {
        let cached = proc
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(export_id)
            .cloned();
        if let Some(e) = cached {
            return Ok(e);
        }
        let spec = proc.sup.spec();
        let dialect = plugd_dialects::of(spec.dialect);
        let def: Option<ToolDef> = if dialect.capabilities().catalog_in_manifest {
            spec.tools
                .iter()
                .find(|t| t.wire_name == export_id)
                .and_then(|t| dialect.declared_tool(spec, t))
        } else {
            let conn = proc
                .sup
                .connection(Instant::now() + START_WAIT)
                .await
                .map_err(|e| RuntimeError::Call(CallToolError::Plugin(e)))?;
            conn.handshake
                .tools
                .iter()
                .find(|t| t.wire() == export_id)
                .cloned()
        };
        let def = def.ok_or_else(|| {
            RuntimeError::Call(CallToolError::Tool(ToolError::NotFound {
                plugin: spec.id.as_str().into(),
                tool: export_id.to_owned(),
                message: format!(
                    "{} lists export {export_id:?} but its plugin does not offer it as a tool",
                    describe(&proc.package)
                ),
            }))
        })?;
        let entry = Arc::new(ToolEntry::new(&spec.id, &def));
        let mut entries = proc.entries.lock().unwrap_or_else(|p| p.into_inner());
        Ok(entries.entry(export_id.to_owned()).or_insert(entry).clone())
    }

    /// The call once its binding and entry are known: its record opens
    /// first, so a binding whose secret is gone fails with a record too.
    #[allow(clippy::too_many_arguments)]
    async fn call_bound(
        &self,
        proc: &PackageProc,
        entry: &ToolEntry,
        binding: &Binding,
        args: Value,
        call: &ExportCall,
        base: CallContext,
        gov: &crate::governed::Governed<'_>,
    ) -> crate::governed::Called {
        let spec = proc.sup.spec();
        let mut bound = BoundCall {
            binding_id: binding.binding_id.clone(),
            package_id: binding.package_id.clone(),
            package_version: binding.package_version.clone(),
            config: binding.config.clone(),
            secrets: Map::new(),
            gateway_api_scopes: binding.gateway_api_scopes.clone(),
        };
        let mut ctx = CallContext {
            session_id: call.session_id.clone(),
            org_id: Some(call.org_id.clone()),
            project_id: call.project_id.clone(),
            caller: call.caller.clone(),
            trace_id: call.trace_id.clone(),
            bound: Some(Arc::new(bound.clone())),
            ..base
        };
        ctx.trace_id = crate::governed::traced(&ctx).trace_id.clone();
        // The sealed values are read first (no decryption yet), so the
        // synchronous `prepare` below does not wait on the store.
        let stored_secrets = read_secrets(&*self.inner.state, binding).await;
        // The record opens first; then the binding's secrets are resolved
        // (a native package has no per-call context: they are not
        // decrypted for it) and masked before `after_tool_result` sees the
        // result.
        let prepare = |mut call_ctx: CallContext| {
            let declared = declared_slots(spec, entry.def.wire()).unwrap_or_default();
            bound.secrets =
                resolve_secrets(&stored_secrets, binding, declared).map_err(|problems| {
                    RuntimeError::InvalidBinding {
                        binding_id: binding.binding_id.clone(),
                        problems,
                    }
                })?;
            let values = bound.secret_values();
            call_ctx.bound = Some(Arc::new(bound));
            Ok((call_ctx, values))
        };
        self.recorded(&proc.sup, entry, args, &ctx, gov, prepare)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASK: &str = "••••";

    #[test]
    fn results_and_errors_lose_their_secrets() {
        let secrets = vec!["hunter2".to_owned()];
        let mut v =
            serde_json::json!({"a": ["x hunter2 y", 1], "b": {"c": "hunter2"}, "d": "fine"});
        scrub_value(&mut v, &secrets);
        assert_eq!(
            v,
            serde_json::json!({"a": ["x •••• y", 1], "b": {"c": "••••"}, "d": "fine"})
        );
        let entry = ToolEntry::new(
            "acme/kit",
            &ToolDef::new("acme/kit/t", "", serde_json::json!({})),
        );
        let e = RuntimeError::Call(CallToolError::Tool(ToolError::ExecutionFailed {
            plugin: "acme/kit".into(),
            tool: "t".into(),
            message: "token hunter2 refused".into(),
        }));
        let text = scrub_error(e, &entry, &secrets).to_string();
        assert!(!text.contains("hunter2") && text.contains(MASK), "{text}");
        let other = RuntimeError::Workspace("hunter2".into());
        let text = scrub_error(other, &entry, &secrets).to_string();
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn fresh_session_keys_differ() {
        assert_ne!(fresh_session_key(), fresh_session_key());
        assert_eq!(fresh_session_key().len(), 32);
    }
}
