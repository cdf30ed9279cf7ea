//! Policy is consent: serve's gate between `plugd.yaml` on disk and the
//! policy in force.
//!
//! While `plugd serve` runs, every reader of `plugd.yaml` in its process sees
//! the text *in force* (`plugd_governance::plugd_yaml::read_text`), which
//! this gate keeps. Once a second ([`ConfigGate::tick`], run by
//! `Runtime::watch_config`) it compares the file on disk with it and
//! [`classify`]s the change:
//!
//! * a change that only **narrows** what plugins may do (a higher risk
//!   level, a removed grant, egress host or host service, a narrower sandbox
//!   or lower limit, the baseline back on, signatures required) or touches
//!   only neutral sections (`agent`, `tenant`, `eager`, `http`,
//!   `invocations`, `limits`) is put in force at once: the risk gate, the signing
//!   policy and every later read take it, and running plugins whose
//!   containment or grants changed are restarted under it;
//! * a change that **widens** any plugin's reach (the baseline off, a wider
//!   sandbox, a lower risk, a new grant or egress host, signatures no longer
//!   required, a new trusted publisher) or that changes a section plugd
//!   cannot rank (hooks, LLM providers, memory, MCP, marketplace) is
//!   **held**: the old text stays in force until an operator approves
//!   exactly this text (`plugd config diff`, `plugd config approve`,
//!   `GET`/`POST /v1/config`); a later edit replaces what is held.
//!
//! A file that does not parse is never put in force; the old text stays and
//! the error is shown. The text in force is remembered in
//! `.plugd/plugd.yaml.in-force` (a directory no plugin's view shows): a
//! `serve` that finds the file changed since the last one stopped starts
//! with the remembered text and classifies the difference like any other
//! change, so an edit made while serve was stopped is held the same way
//! when it widens. The first `serve` of a workspace starts with the file as
//! it is (starting serve is the operator's consent), and a CLI command run
//! without serve reads the disk as before.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::Runtime;
use crate::config::{CONFIG_FILE, ConfigError, PlugdConfig};
use crate::risk::{RiskConfig, RiskLevel};
use plugd_governance::containment::{OperatorPolicy, SandboxConfig};
use plugd_governance::plugd_yaml;

/// Top-level sections whose changes neither widen nor narrow a plugin's
/// reach: they apply at once.
pub const NEUTRAL_SECTIONS: &[&str] = &[
    "agent",
    "tenant",
    "eager",
    "http",
    "invocations",
    "records",
    "tools",
    // Rate limits bound callers, not plugins: applied at once either way.
    "limits",
];

/// Sections ranked field by field by [`classify`].
const RANKED_SECTIONS: &[&str] = &[
    "risk",
    "policy",
    "sandbox",
    "host_services",
    "broker",
    "require_signatures",
    "trusted_publishers",
];

/// What a change of `plugd.yaml` does, each entry one line naming the field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Changes that widen a plugin's reach, or that plugd cannot rank.
    pub widening: Vec<String>,
    /// Changes that narrow it.
    pub narrowing: Vec<String>,
    /// Changes of neutral sections.
    pub neutral: Vec<String>,
    /// Plugins whose containment, broker grants or host services changed
    /// (restarted when the change is put in force); `*` means all.
    pub affected: BTreeSet<String>,
    /// `plugins:` (the hooks) or `tenant:` changed: the pipeline is rebuilt.
    pub hooks_changed: bool,
}

impl Verdict {
    /// Whether the change must wait for an operator.
    pub fn held(&self) -> bool {
        !self.widening.is_empty()
    }
}

/// A change waiting for an operator.
#[derive(Debug, Clone, Serialize)]
pub struct Pending {
    /// `sha256:` of the held text (what `plugd config approve` names).
    pub digest: String,
    /// The change as a unified diff against the text in force.
    pub diff: String,
    /// What it changes.
    pub verdict: Verdict,
    /// When it was first seen (RFC 3339).
    pub seen_at: String,
    #[serde(skip)]
    text: Option<String>,
}

/// What `GET /v1/config` shows.
#[derive(Debug, Clone, Serialize)]
pub struct GateView {
    /// `sha256:` of the text in force (of the empty text when there is no file).
    pub in_force: String,
    /// The held change, if any.
    pub pending: Option<Pending>,
    /// Why the file on disk is not in force although nothing is held (it
    /// does not parse), if so.
    pub error: Option<String>,
}

/// Why an approval was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateError {
    /// Nothing is held.
    #[error("no plugd.yaml change is waiting for approval")]
    NothingHeld,
    /// The operator approved another text than the one held.
    #[error(
        "the held plugd.yaml change is {held}, not {given}; review it again with `plugd config diff`"
    )]
    Stale {
        /// The digest held.
        held: String,
        /// The digest given.
        given: String,
    },
    /// The file changed again after it was held.
    #[error(
        "plugd.yaml changed again since the change {held} was held; review it again with `plugd config diff`"
    )]
    ChangedAgain {
        /// The digest held.
        held: String,
    },
    /// The file cannot be read.
    #[error("{0}")]
    Read(String),
}

#[derive(Default)]
struct GateState {
    in_force: Option<String>,
    pending: Option<Pending>,
    error: Option<String>,
    /// The last disk text looked at, so an unchanged file costs one read.
    last_disk: Option<Option<String>>,
}

/// serve's gate over one workspace's `plugd.yaml`.
pub struct ConfigGate {
    rt: Runtime,
    state: Mutex<GateState>,
}

impl std::fmt::Debug for ConfigGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigGate")
            .field("workspace", &self.rt.dir())
            .finish()
    }
}

/// `sha256:<hex>` of a text (`None`: the empty text).
pub fn text_digest(text: Option<&str>) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(text.unwrap_or("").as_bytes()))
    )
}

impl ConfigGate {
    /// Puts the file as it is now in force for this process and returns the
    /// gate. A file that does not load is an error (serve does not start).
    /// When an earlier serve left the text it had in force
    /// ([`REMEMBERED_FILE`]) and the file differs from it, that text is put
    /// in force instead and the first [`ConfigGate::tick`] classifies the
    /// difference.
    pub fn start(rt: &Runtime) -> Result<Arc<ConfigGate>, ConfigError> {
        let disk = plugd_yaml::read_disk(rt.dir())?;
        parse(rt.dir(), disk.as_deref())?;
        let remembered = remembered(rt.dir())
            .filter(|r| *r != disk)
            .and_then(|r| parse(rt.dir(), r.as_deref()).ok().map(|c| (r, c)));
        let text = match remembered {
            Some((text, config)) => {
                tracing::warn!(
                    in_force = %text_digest(text.as_deref()),
                    on_disk = %text_digest(disk.as_deref()),
                    "plugd.yaml changed while serve was stopped; serve starts with the policy the last serve had in force and weighs the change now (a change that widens what plugins may do waits for plugd config approve)"
                );
                plugd_yaml::set_in_force(rt.dir(), text.clone());
                rt.set_risk_config(config.risk.clone());
                rt.set_signing_policy(config.signing.clone());
                rt.set_invocations_config(&config.invocations);
                rt.set_limits_config(config.limits.clone());
                rt.apply_mcp_config(&config.mcp);
                text
            }
            None => {
                plugd_yaml::set_in_force(rt.dir(), disk.clone());
                remember(rt.dir(), disk.as_deref());
                disk.clone()
            }
        };
        let last_disk = (text == disk).then_some(disk);
        Ok(Arc::new(ConfigGate {
            rt: rt.clone(),
            state: Mutex::new(GateState {
                in_force: text,
                last_disk,
                ..GateState::default()
            }),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is in force and what is held.
    pub fn view(&self) -> GateView {
        let st = self.lock();
        GateView {
            in_force: text_digest(st.in_force.as_deref()),
            pending: st.pending.clone(),
            error: st.error.clone(),
        }
    }

    /// Looks at the file once: puts a narrowing or neutral change in force,
    /// holds a widening one. Returns whether the policy in force changed.
    pub async fn tick(&self) -> bool {
        let disk = match plugd_yaml::read_disk(self.rt.dir()) {
            Ok(t) => t,
            Err(e) => {
                let mut st = self.lock();
                let msg = e.to_string();
                if st.error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!("plugd.yaml cannot be read ({msg}); the policy in force stays");
                    st.error = Some(msg);
                }
                return false;
            }
        };
        let in_force = {
            let mut st = self.lock();
            if st.last_disk.as_ref() == Some(&disk) {
                return false;
            }
            st.last_disk = Some(disk.clone());
            if disk == st.in_force {
                if st.pending.take().is_some() {
                    tracing::info!("plugd.yaml is back to the text in force; nothing is held");
                }
                st.error = None;
                return false;
            }
            st.in_force.clone()
        };
        let new = match parse(self.rt.dir(), disk.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                let mut st = self.lock();
                tracing::warn!(
                    "plugd.yaml changed but does not load ({e}); the policy in force stays"
                );
                st.error = Some(e.to_string());
                st.pending = None;
                return false;
            }
        };
        let old = parse(self.rt.dir(), in_force.as_deref()).unwrap_or_default();
        let verdict = classify(&old, &new, in_force.as_deref(), disk.as_deref(), &|tool| {
            self.rt.declared_risk(tool)
        });
        if verdict.held() {
            let digest = text_digest(disk.as_deref());
            let diff = unified_diff(in_force.as_deref(), disk.as_deref());
            tracing::warn!(
                digest = %digest,
                widening = ?verdict.widening,
                "plugd.yaml changed in a way that widens what plugins may do; the change is held until an operator approves it (plugd config diff; plugd config approve {digest}), the policy in force stays"
            );
            let mut st = self.lock();
            st.error = None;
            st.pending = Some(Pending {
                digest,
                diff,
                verdict,
                seen_at: plugd_store::now_rfc3339(),
                text: disk,
            });
            return false;
        }
        tracing::info!(
            narrowing = ?verdict.narrowing,
            neutral = ?verdict.neutral,
            "plugd.yaml changed; the change narrows or is neutral and is in force now"
        );
        self.put_in_force(disk, &new, &verdict, "plugd.yaml watcher")
            .await;
        true
    }

    /// Puts the held change `digest` in force, if the file still holds it.
    pub async fn approve(&self, digest: &str, by: &str) -> Result<GateView, GateError> {
        let pending = {
            let st = self.lock();
            let Some(p) = st.pending.clone() else {
                return Err(GateError::NothingHeld);
            };
            if p.digest != digest {
                return Err(GateError::Stale {
                    held: p.digest,
                    given: digest.to_owned(),
                });
            }
            p
        };
        let disk =
            plugd_yaml::read_disk(self.rt.dir()).map_err(|e| GateError::Read(e.to_string()))?;
        if disk != pending.text {
            return Err(GateError::ChangedAgain {
                held: pending.digest,
            });
        }
        let new =
            parse(self.rt.dir(), disk.as_deref()).map_err(|e| GateError::Read(e.to_string()))?;
        tracing::info!(digest = %digest, by = %by, widening = ?pending.verdict.widening, "held plugd.yaml change approved; in force now");
        self.put_in_force(disk, &new, &pending.verdict, by).await;
        Ok(self.view())
    }

    async fn put_in_force(
        &self,
        text: Option<String>,
        new: &PlugdConfig,
        verdict: &Verdict,
        by: &str,
    ) {
        plugd_yaml::set_in_force(self.rt.dir(), text.clone());
        remember(self.rt.dir(), text.as_deref());
        {
            let mut st = self.lock();
            st.in_force = text.clone();
            st.last_disk = Some(text);
            st.pending = None;
            st.error = None;
        }
        self.rt.set_risk_config(new.risk.clone());
        self.rt.set_signing_policy(new.signing.clone());
        self.rt.set_invocations_config(&new.invocations);
        self.rt.set_limits_config(new.limits.clone());
        let told = self.rt.apply_mcp_config(&new.mcp);
        if !told.is_empty() {
            tracing::info!(servers = ?told, "MCP roots changed: roots/list_changed sent");
        }
        // Hooks or their context defaults changed: every tool call's path
        // takes the rebuilt pipeline (a pipeline that fails to build leaves
        // the old one in force, as at start-up nothing half-built serves).
        if verdict.hooks_changed {
            match self.rt.agent_parts().build_pipeline(&self.rt, new).await {
                Ok(_) => tracing::info!(
                    "plugd.yaml hooks changed: the tool call path runs the new pipeline"
                ),
                Err(e) => {
                    tracing::error!(error = %e, "plugd.yaml hooks changed but the new pipeline does not build; the old one stays")
                }
            }
        }
        // Running plugins whose containment, grants or services changed
        // restart under the policy now in force.
        let all = verdict.affected.contains("*");
        for (id, sup) in self.rt.inner.plugins.iter() {
            if !(all || verdict.affected.contains(&id)) {
                continue;
            }
            if matches!(sup.status(), plugd_host::Status::Running { .. }) {
                tracing::info!(plugin = %id, by = %by, "restarting under the changed plugd.yaml policy");
                if let Err(e) = self.rt.restart(&id).await {
                    tracing::warn!(plugin = %id, error = %e, "restart under the changed policy failed; stopping it");
                    sup.stop().await;
                }
            }
        }
    }
}

/// Where serve remembers the `plugd.yaml` text in force, under `.plugd/`:
/// `{"text": "..."}`, `{"text": null}` when there is no file.
pub const REMEMBERED_FILE: &str = "plugd.yaml.in-force";

/// The text the last serve had in force (`Some(None)`: no file), `None`
/// when no serve remembered one or the record is unreadable.
fn remembered(workspace: &Path) -> Option<Option<String>> {
    let bytes = std::fs::read(workspace.join(".plugd").join(REMEMBERED_FILE)).ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    match v.get("text")? {
        Value::Null => Some(None),
        Value::String(s) => Some(Some(s.clone())),
        _ => None,
    }
}

/// Records `text` as the text in force (written whole, then renamed over
/// the old record). A failure is logged: the gate still works for this
/// serve; the next one would start from the file.
fn remember(workspace: &Path, text: Option<&str>) {
    let dir = workspace.join(".plugd");
    let body = serde_json::json!({ "text": text, "digest": text_digest(text) }).to_string();
    let tmp = dir.join(format!("{REMEMBERED_FILE}.tmp"));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, body))
        .and_then(|()| std::fs::rename(&tmp, dir.join(REMEMBERED_FILE)));
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not remember the plugd.yaml text in force in .plugd/{REMEMBERED_FILE}");
    }
}

fn parse(workspace: &Path, text: Option<&str>) -> Result<PlugdConfig, ConfigError> {
    match text {
        None => Ok(PlugdConfig {
            workspace: workspace.to_path_buf(),
            ..PlugdConfig::default()
        }),
        Some(t) => PlugdConfig::parse(t, &workspace.join(CONFIG_FILE), workspace),
    }
}

/// The top-level sections of a text as generic values (empty when it does
/// not parse as a mapping).
fn sections(text: Option<&str>) -> BTreeMap<String, Value> {
    let Some(text) = text else {
        return BTreeMap::new();
    };
    match serde_saphyr::from_str_with_options::<Option<Value>>(text, plugd_yaml::yaml_options()) {
        Ok(Some(Value::Object(map))) => map.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// What the change from `old` to `new` does. `declared` gives a tool's risk
/// without plugd.yaml (its declaration, annotations or the default), `None`
/// for a tool plugd does not know.
pub fn classify(
    old: &PlugdConfig,
    new: &PlugdConfig,
    old_text: Option<&str>,
    new_text: Option<&str>,
    declared: &dyn Fn(&str) -> Option<RiskLevel>,
) -> Verdict {
    let mut v = Verdict::default();
    risk(&old.risk, &new.risk, declared, &mut v);
    let (narrowing, widening) = crate::tool_policy::classify(&old.risk.rules, &new.risk.rules);
    v.narrowing.extend(narrowing);
    v.widening.extend(widening);
    sandbox(&old.sandbox, &new.sandbox, &mut v);
    // Host services: a service no longer denied widens.
    for id in keys(&old.host_services.deny, &new.host_services.deny) {
        let was: BTreeSet<_> = old.host_services.denied(id).into_iter().collect();
        let now: BTreeSet<_> = new.host_services.denied(id).into_iter().collect();
        for s in was.difference(&now) {
            v.widening
                .push(format!("host_services.deny.{id}: {s} no longer denied"));
            v.affected.insert(id.clone());
        }
        for s in now.difference(&was) {
            v.narrowing
                .push(format!("host_services.deny.{id}: {s} denied"));
            v.affected.insert(id.clone());
        }
    }
    // Broker grants: a subject granted widens.
    for id in keys(&old.broker.grants, &new.broker.grants) {
        let get = |c: &PlugdConfig| c.broker.grants.get(id).cloned().unwrap_or_default();
        let (was, now) = (get(old), get(new));
        for (what, a, b) in [
            ("publish", &was.publish, &now.publish),
            ("subscribe", &was.subscribe, &now.subscribe),
        ] {
            let (a, b): (BTreeSet<_>, BTreeSet<_>) = (a.iter().collect(), b.iter().collect());
            for s in b.difference(&a) {
                v.widening
                    .push(format!("broker.grants.{id}.{what}: {s:?} granted"));
                v.affected.insert(id.clone());
            }
            for s in a.difference(&b) {
                v.narrowing
                    .push(format!("broker.grants.{id}.{what}: {s:?} withdrawn"));
                v.affected.insert(id.clone());
            }
        }
    }
    // Signatures.
    match (
        old.signing.require_signatures,
        new.signing.require_signatures,
    ) {
        (true, false) => v
            .widening
            .push("require_signatures: no longer required".into()),
        (false, true) => v.narrowing.push("require_signatures: required".into()),
        _ => {}
    }
    let pubs = |c: &PlugdConfig| -> BTreeSet<(String, String)> {
        c.signing
            .trusted_publishers
            .iter()
            .map(|p| (p.name.clone(), p.key_id.clone()))
            .collect()
    };
    let (was, now) = (pubs(old), pubs(new));
    for (name, key) in now.difference(&was) {
        v.widening
            .push(format!("trusted_publishers: {name} ({key}) trusted"));
    }
    for (name, key) in was.difference(&now) {
        v.narrowing.push(format!(
            "trusted_publishers: {name} ({key}) no longer trusted"
        ));
    }
    // Every other section: neutral ones apply, the rest is held.
    let (a, b) = (sections(old_text), sections(new_text));
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for name in names {
        if RANKED_SECTIONS.contains(&name.as_str()) || a.get(name) == b.get(name) {
            continue;
        }
        if name == "plugins" || name == "tenant" {
            v.hooks_changed = true;
        }
        if NEUTRAL_SECTIONS.contains(&name.as_str()) {
            v.neutral.push(format!("{name}: changed"));
        } else {
            v.widening.push(format!(
                "{name}: changed (plugd cannot tell whether it narrows, so an operator approves it)"
            ));
        }
    }
    v
}

fn keys<'a, T>(a: &'a BTreeMap<String, T>, b: &'a BTreeMap<String, T>) -> BTreeSet<&'a String> {
    a.keys().chain(b.keys()).collect()
}

fn risk(
    old: &RiskConfig,
    new: &RiskConfig,
    declared: &dyn Fn(&str) -> Option<RiskLevel>,
    v: &mut Verdict,
) {
    for tool in keys(&old.tools, &new.tools) {
        let (a, b) = (old.tools.get(tool).copied(), new.tools.get(tool).copied());
        if a == b {
            continue;
        }
        let base = declared(tool);
        let show =
            |l: Option<RiskLevel>| l.map_or("(declared)".to_owned(), |l| l.as_str().to_owned());
        let line = format!("risk.tools.{tool}: {} -> {}", show(a), show(b));
        match (a.or(base), b.or(base)) {
            (Some(x), Some(y)) if y > x => v.narrowing.push(line),
            (Some(x), Some(y)) if y == x => v.neutral.push(line),
            (Some(_), Some(_)) => v.widening.push(line),
            // A tool plugd does not know: only a raise to critical is sure
            // not to lower anything.
            (_, Some(RiskLevel::Critical)) => v.narrowing.push(line),
            _ => v.widening.push(line),
        }
    }
}

fn sandbox(old: &SandboxConfig, new: &SandboxConfig, v: &mut Verdict) {
    if old.fallback != new.fallback {
        let line =
            format!("sandbox.fallback: {:?} -> {:?}", old.fallback, new.fallback).to_lowercase();
        if new.fallback == plugd_host::sandbox::Fallback::None {
            v.narrowing.push(line);
        } else {
            v.widening.push(line);
        }
        v.affected.insert("*".into());
    }
    match (old.require_baseline, new.require_baseline) {
        (true, false) => v
            .widening
            .push("sandbox.baseline: require -> best_effort".into()),
        (false, true) => v
            .narrowing
            .push("sandbox.baseline: best_effort -> require".into()),
        _ => {}
    }
    if old.require_baseline != new.require_baseline {
        v.affected.insert("*".into());
    }
    let absent = OperatorPolicy {
        enabled: true,
        baseline: true,
        ..OperatorPolicy::default()
    };
    for id in keys(&old.plugins, &new.plugins) {
        let a = old.plugins.get(id).unwrap_or(&absent);
        let b = new.plugins.get(id).unwrap_or(&absent);
        if a == b {
            continue;
        }
        v.affected.insert(id.clone());
        let before = v.widening.len() + v.narrowing.len();
        policy(id, a, b, v);
        if v.widening.len() + v.narrowing.len() == before {
            v.neutral.push(format!("sandbox.plugins.{id}: changed"));
        }
    }
}

/// Ranks two values where `true` of `wider` means more reach.
fn flag(v: &mut Verdict, field: String, was: bool, now: bool, on_widens: bool) {
    if was == now {
        return;
    }
    let line = format!("{field}: {was} -> {now}");
    if now == on_widens {
        v.widening.push(line);
    } else {
        v.narrowing.push(line);
    }
}

/// A list where a superset widens; `None` means "not limited by the
/// operator" and is wider than any list.
fn list<T: Ord + std::fmt::Debug + Clone>(
    v: &mut Verdict,
    field: String,
    was: Option<&[T]>,
    now: Option<&[T]>,
) {
    match (was, now) {
        (None, None) => {}
        (Some(_), None) => v.widening.push(format!("{field}: limit removed")),
        (None, Some(_)) => v.narrowing.push(format!("{field}: limited")),
        (Some(a), Some(b)) => {
            let (a, b): (BTreeSet<&T>, BTreeSet<&T>) = (a.iter().collect(), b.iter().collect());
            let added: Vec<_> = b.difference(&a).collect();
            let removed: Vec<_> = a.difference(&b).collect();
            if !added.is_empty() {
                v.widening.push(format!("{field}: {added:?} added"));
            }
            if !removed.is_empty() {
                v.narrowing.push(format!("{field}: {removed:?} removed"));
            }
        }
    }
}

fn policy(id: &str, a: &OperatorPolicy, b: &OperatorPolicy, v: &mut Verdict) {
    let f = |name: &str| format!("sandbox.plugins.{id}.{name}");
    flag(v, f("baseline"), a.baseline, b.baseline, false);
    flag(v, f("enabled"), a.enabled, b.enabled, false);
    // An operator sandbox added narrows; removed widens.
    flag(v, f("(sandbox)"), a.sandboxes, b.sandboxes, false);
    flag(v, f("trusted"), a.trusted, b.trusted, true);
    flag(
        v,
        f("drop_user"),
        a.drop_user.unwrap_or(false),
        b.drop_user.unwrap_or(false),
        false,
    );
    // network: deny < (the manifest's) < host.
    let rank = |n: Option<plugd_host::sandbox::Network>| match n {
        Some(plugd_host::sandbox::Network::Deny) => 0,
        None => 1,
        Some(plugd_host::sandbox::Network::Proxy) => 1,
        Some(plugd_host::sandbox::Network::Host) => 2,
    };
    let (x, y) = (rank(a.network), rank(b.network));
    if a.network != b.network {
        let line = format!("{}: {:?} -> {:?}", f("network"), a.network, b.network);
        if y > x || (y == x && b.network.is_none()) {
            v.widening.push(line);
        } else {
            v.narrowing.push(line);
        }
    }
    list(
        v,
        f("fs_read_paths"),
        a.fs_read_paths.as_deref(),
        b.fs_read_paths.as_deref(),
    );
    list(
        v,
        f("fs_write_paths"),
        a.fs_write_paths.as_deref(),
        b.fs_write_paths.as_deref(),
    );
    list(
        v,
        f("egress_allow"),
        a.egress_allow.as_deref(),
        b.egress_allow.as_deref(),
    );
    for export in keys(&a.export_egress_allow, &b.export_egress_allow) {
        list(
            v,
            f(&format!("grants.{export}.egress_allow")),
            a.export_egress_allow.get(export).map(Vec::as_slice),
            b.export_egress_allow.get(export).map(Vec::as_slice),
        );
    }
    for (name, x, y) in [
        (
            "address_space_mb",
            a.limits.address_space_mb,
            b.limits.address_space_mb,
        ),
        ("open_files", a.limits.open_files, b.limits.open_files),
        ("processes", a.limits.processes, b.limits.processes),
        ("cpu_seconds", a.limits.cpu_seconds, b.limits.cpu_seconds),
    ] {
        let line = format!("{}: {x:?} -> {y:?}", f(&format!("limits.{name}")));
        match (x, y) {
            (x, y) if x == y => {}
            (Some(x), Some(y)) if y < x => v.narrowing.push(line),
            (None, Some(_)) => v.narrowing.push(line),
            _ => v.widening.push(line),
        }
    }
    for export in keys(&a.grants, &b.grants) {
        let line = |what: &str| format!("{}: {what}", f(&format!("grants.{export}")));
        match (a.grants.get(export), b.grants.get(export)) {
            (None, Some(_)) => v.widening.push(line("granted")),
            (Some(_), None) => v.narrowing.push(line("withdrawn")),
            (Some(x), Some(y)) if x != y => {
                use plugd_manifest::vai::{FilesystemPermission as Fs, NetworkPermission as Net};
                let net_wider = x.network == Net::None && y.network == Net::Egress;
                let fs_wider = y.filesystem != x.filesystem && y.filesystem != Fs::None;
                if net_wider || fs_wider {
                    v.widening.push(line("widened"));
                } else {
                    v.narrowing.push(line("narrowed"));
                }
            }
            _ => {}
        }
    }
}

/// A unified diff of two texts (`None`: no file), for people.
pub fn unified_diff(old: Option<&str>, new: Option<&str>) -> String {
    similar::TextDiff::from_lines(old.unwrap_or(""), new.unwrap_or(""))
        .unified_diff()
        .context_radius(3)
        .header("plugd.yaml (in force)", "plugd.yaml (on disk)")
        .to_string()
}

impl Runtime {
    /// Whether this process gates the workspace's plugd.yaml (serve): then
    /// [`PlugdConfig::load`] gives the text in force, which a surface that
    /// cached the configuration at start-up reads again where it matters.
    pub fn config_gated(&self) -> bool {
        plugd_yaml::is_gated(self.dir())
    }

    /// A tool's risk without plugd.yaml's override (its declaration, its
    /// annotations or the default); `None` for a tool not in the registry.
    pub fn declared_risk(&self, tool: &str) -> Option<RiskLevel> {
        let entry = crate::read(&self.inner.registry).get(tool)?;
        Some(crate::risk::effective_risk(&entry, &RiskConfig::default()).0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> PlugdConfig {
        PlugdConfig::parse(text, Path::new("/w/plugd.yaml"), Path::new("/w")).unwrap()
    }

    fn verdict(a: &str, b: &str) -> Verdict {
        let declared = |t: &str| (t == "p_add").then_some(RiskLevel::Medium);
        classify(&cfg(a), &cfg(b), Some(a), Some(b), &declared)
    }

    #[test]
    fn a_higher_risk_narrows_and_a_lower_one_widens() {
        let v = verdict("", "risk:\n  tools:\n    p_add: critical\n");
        assert!(!v.held(), "{v:?}");
        assert_eq!(v.narrowing, ["risk.tools.p_add: (declared) -> critical"]);
        let v = verdict("risk:\n  tools:\n    p_add: critical\n", "");
        assert!(v.held(), "{v:?}");
        let v = verdict("", "risk:\n  tools:\n    p_add: low\n");
        assert!(v.held(), "{v:?}");
        // A tool plugd does not know: only critical is sure to narrow.
        assert!(!verdict("", "risk:\n  tools:\n    ghost: critical\n").held());
        assert!(verdict("", "risk:\n  tools:\n    ghost: high\n").held());
    }

    #[test]
    fn the_baseline_off_widens_and_back_on_narrows() {
        let off = "sandbox:\n  plugins:\n    p:\n      baseline: false\n";
        let v = verdict("", off);
        assert!(v.held(), "{v:?}");
        assert_eq!(v.widening, ["sandbox.plugins.p.baseline: true -> false"]);
        assert!(v.affected.contains("p"));
        let v = verdict(off, "");
        assert!(!v.held(), "{v:?}");
        assert_eq!(v.narrowing, ["sandbox.plugins.p.baseline: false -> true"]);
    }

    #[test]
    fn egress_hosts_and_limits_rank_by_inclusion_and_size() {
        let a = "sandbox:\n  plugins:\n    p:\n      egress_allow: [a.example, b.example]\n      limits: {cpu_seconds: 10}\n";
        let narrower = "sandbox:\n  plugins:\n    p:\n      egress_allow: [a.example]\n      limits: {cpu_seconds: 5}\n";
        let wider = "sandbox:\n  plugins:\n    p:\n      egress_allow: [a.example, b.example, c.example]\n      limits: {cpu_seconds: 10}\n";
        assert!(!verdict(a, narrower).held(), "{:?}", verdict(a, narrower));
        let v = verdict(a, wider);
        assert!(v.held());
        assert!(v.widening[0].contains("c.example"), "{v:?}");
        assert!(verdict(narrower, a).held());
    }

    #[test]
    fn neutral_sections_apply_and_unranked_ones_are_held() {
        let v = verdict("", "eager: [p]\n");
        assert!(!v.held(), "{v:?}");
        assert_eq!(v.neutral, ["eager: changed"]);
        let v = verdict("", "mcp:\n  servers:\n    s:\n      roots: [/tmp]\n");
        assert!(v.held(), "{v:?}");
        assert!(v.widening[0].starts_with("mcp: changed"), "{v:?}");
    }

    #[test]
    fn grants_and_services_widen_when_added() {
        let v = verdict(
            "host_services:\n  deny:\n    p: [llm]\n",
            "host_services:\n  deny:\n    p: []\n",
        );
        assert!(v.held(), "{v:?}");
        let v = verdict("", "host_services:\n  deny:\n    p: [llm]\n");
        assert!(!v.held(), "{v:?}");
        let v = verdict(
            "",
            "broker:\n  grants:\n    p:\n      publish: [\"plugin.x\"]\n",
        );
        assert!(v.held(), "{v:?}");
    }

    #[test]
    fn the_diff_names_both_sides() {
        let d = unified_diff(Some("a: 1\n"), Some("a: 2\n"));
        assert!(d.contains("--- plugd.yaml (in force)"), "{d}");
        assert!(d.contains("-a: 1") && d.contains("+a: 2"), "{d}");
    }
}
