//! Bindings: the seed's Binding Record (one export of one installed package
//! bound to an org, or to a project of it, with config, secret slots,
//! rollout and status), the checks a binding must pass against its export's
//! contract, deterministic rollout selection, and the [`BindingStore`]
//! trait that keeps them.
//!
//! Checks ([`check`]) report every problem at once, each with the JSON
//! Pointer (RFC 6901) of the offending value in the binding document:
//! `/config/max_results` for a config value the export's `config_schema`
//! refuses (the schema's own instance path under `/config`),
//! `/secrets/jira_token` for a slot or reference, `/rollout/traffic_percent`.
//!
//! Rollout ([`select`]): the bucket of a session is the first 8 bytes of
//! `SHA-256(export_id ‖ 0x00 ‖ session_key)` read as a big-endian `u64`,
//! modulo the sum of the candidates' `traffic_percent`; candidates are
//! taken in `binding_id` order and the first whose running sum exceeds the
//! bucket wins. The same session therefore lands on the same binding
//! across calls, restarts and machines, and splits follow the percentages
//! (normalized when they do not add up to 100).

use crate::store::{Invalid, StoreError};
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// `secret://` — the scheme of a secret reference.
pub const SECRET_SCHEME: &str = "secret://";

/// Longest org, project or secret name.
pub const MAX_NAME: usize = 64;

/// Where a binding applies: an org, or one project of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// The org (`org_123`).
    pub org_id: String,
    /// The project, when the binding applies to one project only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
}

/// `org_123`, or `org_123/proj_1` for one project of it.
impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.project_id {
            Some(p) => write!(f, "{}/{p}", self.org_id),
            None => f.write_str(&self.org_id),
        }
    }
}

/// Whether a binding takes traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingStatus {
    /// Calls in its scope may resolve to it.
    Active,
    /// Kept, but never chosen.
    Disabled,
}

impl BindingStatus {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            BindingStatus::Active => "active",
            BindingStatus::Disabled => "disabled",
        }
    }
}

impl std::str::FromStr for BindingStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<BindingStatus, String> {
        match s {
            "active" => Ok(BindingStatus::Active),
            "disabled" => Ok(BindingStatus::Disabled),
            _ => Err(format!("unknown status {s:?}; use active or disabled")),
        }
    }
}

/// How much of its scope's traffic a binding takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    /// 0 to 100.
    pub traffic_percent: u8,
}

impl Default for Rollout {
    fn default() -> Rollout {
        Rollout {
            traffic_percent: 100,
        }
    }
}

/// The seed's Binding Record, plus when and by whom it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    /// `bind_` and 16 hex digits.
    pub binding_id: String,
    /// The package's id (`acme/devkit`).
    pub package_id: String,
    /// The installed version it binds.
    pub package_version: String,
    /// The export it binds (`jira_search`).
    pub export_id: String,
    /// Where it applies.
    pub scope: Scope,
    /// Config values, checked against the export's `config_schema`.
    pub config: Value,
    /// Secret slot → `secret://ORG/NAME`.
    pub secrets: BTreeMap<String, String>,
    /// Active or disabled.
    pub status: BindingStatus,
    /// Its share of the scope's traffic.
    pub rollout: Rollout,
    /// When it was made (RFC 3339 UTC).
    pub created_at: String,
    /// When it last changed (RFC 3339 UTC).
    pub updated_at: String,
    /// Who made it (`token:NAME`, a Unix user name).
    pub created_by: String,
    /// A policy override (seed 003): the delegated gateway scopes this
    /// binding allows its export at most; `None`: what the export asks for.
    /// Narrows, never widens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_api_scopes: Option<Vec<String>>,
}

/// What a caller may change of a binding (`PATCH`); absent fields stay.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingPatch {
    /// Another installed version of the same package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_version: Option<String>,
    /// The whole config (replaces the old one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// The whole slot map (replaces the old one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<BTreeMap<String, String>>,
    /// Active or disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<BindingStatus>,
    /// A new share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// The delegated scopes the export gets at most (replaces the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_api_scopes: Option<Vec<String>>,
}

impl BindingPatch {
    /// `b` with this patch applied (timestamps untouched).
    pub fn apply(&self, b: &Binding) -> Binding {
        let mut out = b.clone();
        if let Some(v) = &self.package_version {
            out.package_version.clone_from(v);
        }
        if let Some(c) = &self.config {
            out.config = c.clone();
        }
        if let Some(s) = &self.secrets {
            out.secrets = s.clone();
        }
        if let Some(s) = self.status {
            out.status = s;
        }
        if let Some(r) = self.rollout {
            out.rollout = r;
        }
        if let Some(s) = &self.gateway_api_scopes {
            out.gateway_api_scopes = Some(s.clone());
        }
        out
    }
}

/// What an export asks of its bindings, as its package's manifest says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportContract {
    /// The export's `config_schema` (JSON Schema), if it declares one.
    pub config_schema: Option<Value>,
    /// The secret slots it declares (`None`: the manifest form has no
    /// slots, so any slot name is accepted).
    pub secret_slots: Option<Vec<String>>,
}

/// One thing wrong with a binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// JSON Pointer of the bad value in the binding (`/config/max_results`).
    pub path: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{at}: {}", self.message)
    }
}

/// A parsed `secret://ORG/NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRef {
    /// The org that owns the secret.
    pub org_id: String,
    /// Its name inside the org.
    pub name: String,
}

impl SecretRef {
    /// Parses `secret://ORG/NAME`.
    pub fn parse(s: &str) -> Result<SecretRef, String> {
        let rest = s
            .strip_prefix(SECRET_SCHEME)
            .ok_or_else(|| format!("{s:?} is not a secret reference; write secret://ORG/NAME"))?;
        let (org, name) = rest
            .split_once('/')
            .ok_or_else(|| format!("{s:?} names no secret; write secret://ORG/NAME"))?;
        if !is_valid_name(org) {
            return Err(format!("{s:?}: {org:?} is not an org id; {NAME_RULE}"));
        }
        if !is_valid_secret_name(name) {
            return Err(format!("{s:?}: {name:?} is not a secret name; {NAME_RULE}"));
        }
        Ok(SecretRef {
            org_id: org.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SECRET_SCHEME}{}/{}", self.org_id, self.name)
    }
}

/// What an org, project or secret name may be, for messages.
pub const NAME_RULE: &str =
    "use 1-64 of A-Z a-z 0-9 _ - (and . for secrets), starting with a letter or digit";

/// `true` for 1-64 of `A-Za-z0-9_-` starting with a letter or digit (org
/// and project ids).
pub fn is_valid_name(s: &str) -> bool {
    s.len() <= MAX_NAME
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
}

/// Largest org secret value, in bytes.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// Checks an org secret about to be stored: org id, secret name and a value
/// of 1 byte to [`MAX_SECRET_BYTES`].
pub fn check_org_secret(org_id: &str, name: &str, value: &str) -> Result<(), Invalid> {
    if !is_valid_name(org_id) {
        return Err(Invalid::new(format!("org id {org_id:?}"), NAME_RULE));
    }
    if !is_valid_secret_name(name) {
        return Err(Invalid::new(format!("secret name {name:?}"), NAME_RULE));
    }
    if value.is_empty() || value.len() > MAX_SECRET_BYTES {
        return Err(Invalid::new(
            format!("the value of secret {org_id}/{name}"),
            "a secret value must be 1 byte to 64 KiB",
        ));
    }
    Ok(())
}

/// [`is_valid_name`], `.` allowed after the first character (secret names).
pub fn is_valid_secret_name(s: &str) -> bool {
    s.len() <= MAX_NAME
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// Escapes one JSON Pointer segment.
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Every problem of `b` against `contract`, in document order: scope names,
/// config (every schema error, with its path), secret slots and
/// references (a slot the export does not declare, a reference into
/// another org), rollout. `secret_exists` says whether a referenced secret
/// is stored (a missing one is a problem too).
pub fn check(
    b: &Binding,
    contract: &ExportContract,
    secret_exists: &dyn Fn(&SecretRef) -> bool,
) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut problem = |path: String, message: String| out.push(Problem { path, message });
    if !is_valid_name(&b.scope.org_id) {
        problem(
            "/scope/org_id".into(),
            format!("{:?} is not an org id; {NAME_RULE}", b.scope.org_id),
        );
    }
    if let Some(p) = &b.scope.project_id
        && !is_valid_name(p)
    {
        problem(
            "/scope/project_id".into(),
            format!("{p:?} is not a project id; {NAME_RULE}"),
        );
    }
    for (i, s) in b.gateway_api_scopes.iter().flatten().enumerate() {
        if !crate::delegation::SCOPES.contains(&s.as_str()) {
            problem(
                format!("/gateway_api_scopes/{i}"),
                format!(
                    "{s:?} is not a delegated scope plugd knows; use some of {}",
                    crate::delegation::SCOPES.join(", ")
                ),
            );
        }
    }
    match (&contract.config_schema, &b.config) {
        (_, c) if !c.is_object() => problem(
            "/config".into(),
            "config must be a JSON object of the export's settings".into(),
        ),
        (Some(schema), config) => match jsonschema::validator_for(schema) {
            Ok(v) => {
                for e in v.iter_errors(config) {
                    problem(format!("/config{}", e.instance_path()), e.to_string());
                }
            }
            Err(e) => problem(
                "/config".into(),
                format!(
                    "the export's config_schema is not a usable JSON Schema ({e}); fix the package"
                ),
            ),
        },
        (None, _) => {}
    }
    for (slot, reference) in &b.secrets {
        let path = format!("/secrets/{}", pointer_segment(slot));
        if let Some(declared) = &contract.secret_slots
            && !declared.contains(slot)
        {
            let known = if declared.is_empty() {
                "it declares none".to_owned()
            } else {
                format!("it declares {}", declared.join(", "))
            };
            problem(
                path.clone(),
                format!(
                    "{slot:?} is not a secret slot of export {:?}; {known}",
                    b.export_id
                ),
            );
        }
        match SecretRef::parse(reference) {
            Err(e) => problem(path, e),
            Ok(r) if r.org_id != b.scope.org_id => problem(
                path,
                format!(
                    "{reference:?} names a secret of another org; a binding of org {:?} may only use secret://{}/NAME",
                    b.scope.org_id, b.scope.org_id
                ),
            ),
            Ok(r) if !secret_exists(&r) => problem(
                path,
                format!(
                    "secret {}/{} is not set; store it with `plugd secret set {}/{}` (value on standard input)",
                    r.org_id, r.name, r.org_id, r.name
                ),
            ),
            Ok(_) => {}
        }
    }
    if b.rollout.traffic_percent > 100 {
        problem(
            "/rollout/traffic_percent".into(),
            format!("{} is over 100; use 0 to 100", b.rollout.traffic_percent),
        );
    }
    out
}

/// The bucket of `session_key` for `export_id`: the module's hash, as a
/// `u64`.
pub fn session_hash(export_id: &str, session_key: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(export_id.as_bytes());
    h.update([0u8]);
    h.update(session_key.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_be_bytes(first)
}

/// The binding a session's call goes to, among `candidates` (the bindings of
/// one export visible in one scope): only active ones with a share above
/// zero count; see the module documentation for the hash. `None` when none
/// takes traffic.
pub fn select<'a>(candidates: &'a [Binding], session_key: &str) -> Option<&'a Binding> {
    select_among(candidates.iter().collect(), session_key)
}

/// [`select`] over references.
fn select_among<'a>(candidates: Vec<&'a Binding>, session_key: &str) -> Option<&'a Binding> {
    let mut live: Vec<&Binding> = candidates
        .into_iter()
        .filter(|b| b.status == BindingStatus::Active && b.rollout.traffic_percent > 0)
        .collect();
    live.sort_by(|a, b| a.binding_id.cmp(&b.binding_id));
    let total: u64 = live
        .iter()
        .map(|b| u64::from(b.rollout.traffic_percent))
        .sum();
    let first = live.first()?;
    let bucket = session_hash(&first.export_id, session_key) % total;
    let mut sum = 0u64;
    live.into_iter().find(|b| {
        sum += u64::from(b.rollout.traffic_percent);
        bucket < sum
    })
}

/// The binding a call of `export_id` by a caller in `org_id` (and
/// `project_id`) goes to, for `session_key`, among `bindings` (any list; the
/// rule filters it): the active bindings with a share above zero of that
/// export scoped to the caller's project when there are any, else the
/// org-wide ones (scope without a project), then [`select`]. A binding of
/// another project of the org is never a candidate. `None`: the export
/// does not exist for this caller.
pub fn resolve<'a>(
    bindings: &'a [Binding],
    export_id: &str,
    org_id: &str,
    project_id: Option<&str>,
    session_key: &str,
) -> Option<&'a Binding> {
    select_among(
        candidates(bindings, export_id, org_id, project_id),
        session_key,
    )
}

/// The pool [`resolve`] selects from: the active bindings with a share
/// above zero of `export_id` scoped to `project_id` when there are any,
/// else the org-wide ones. A binding a session chose earlier still applies
/// to it while it is in this pool (an MCP session keeps its choice).
pub fn candidates<'a>(
    bindings: &'a [Binding],
    export_id: &str,
    org_id: &str,
    project_id: Option<&str>,
) -> Vec<&'a Binding> {
    let live = |b: &&Binding| {
        b.export_id == export_id
            && b.scope.org_id == org_id
            && b.status == BindingStatus::Active
            && b.rollout.traffic_percent > 0
    };
    let of_project =
        |b: &&Binding| project_id.is_some() && b.scope.project_id.as_deref() == project_id;
    let mut pool: Vec<&Binding> = bindings.iter().filter(live).filter(of_project).collect();
    if pool.is_empty() {
        pool = bindings
            .iter()
            .filter(live)
            .filter(|b| b.scope.project_id.is_none())
            .collect();
    }
    pool
}

/// Which bindings a listing returns; `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BindingFilter {
    /// Only this org's.
    pub org_id: Option<String>,
    /// Only this export's.
    pub export_id: Option<String>,
    /// Only this package's.
    pub package_id: Option<String>,
    /// Only with this status.
    pub status: Option<BindingStatus>,
}

impl BindingFilter {
    /// Whether `b` passes.
    pub fn matches(&self, b: &Binding) -> bool {
        self.org_id.as_ref().is_none_or(|o| *o == b.scope.org_id)
            && self.export_id.as_ref().is_none_or(|e| *e == b.export_id)
            && self.package_id.as_ref().is_none_or(|p| *p == b.package_id)
            && self.status.is_none_or(|s| s == b.status)
    }
}

/// Keeps bindings. `plugd-store` implements it on SQLite; a PostgreSQL
/// backend implements the same.
#[async_trait::async_trait]
pub trait BindingStore: Send + Sync {
    /// Records a new binding (its `binding_id` must be new).
    async fn insert_binding(&self, b: &Binding) -> Result<(), StoreError>;

    /// The binding `binding_id`.
    async fn binding(&self, binding_id: &str) -> Result<Option<Binding>, StoreError>;

    /// The bindings `filter` passes, by org, export, then id.
    async fn bindings(&self, filter: &BindingFilter) -> Result<Vec<Binding>, StoreError>;

    /// Replaces the stored binding of `b.binding_id`; `false` when there is
    /// none.
    async fn update_binding(&self, b: &Binding) -> Result<bool, StoreError>;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    pub(crate) fn binding(id: &str, org: &str, percent: u8) -> Binding {
        Binding {
            binding_id: id.to_owned(),
            package_id: "acme/devkit".into(),
            package_version: "0.1.0".into(),
            export_id: "jira_search".into(),
            scope: Scope {
                org_id: org.to_owned(),
                project_id: Some("proj_123".into()),
            },
            config: json!({"base_url": "https://acme.atlassian.net", "max_results": 10}),
            secrets: BTreeMap::from([(
                "jira_token".to_owned(),
                format!("secret://{org}/jira_token"),
            )]),
            status: BindingStatus::Active,
            rollout: Rollout {
                traffic_percent: percent,
            },
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
            created_by: "test".into(),
            gateway_api_scopes: None,
        }
    }

    fn contract() -> ExportContract {
        ExportContract {
            config_schema: Some(json!({
                "type": "object",
                "required": ["base_url"],
                "additionalProperties": false,
                "properties": {
                    "base_url": {"type": "string", "pattern": "^https://"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
                    "labels": {"type": "array", "items": {"type": "string"}}
                }
            })),
            secret_slots: Some(vec!["jira_token".into()]),
        }
    }

    fn all_exist(_: &SecretRef) -> bool {
        true
    }

    #[test]
    fn the_seed_record_round_trips_field_for_field() {
        let seed = json!({
            "binding_id": "bind_123",
            "package_id": "acme/devkit",
            "package_version": "0.1.0",
            "export_id": "jira_search",
            "scope": {"org_id": "org_123", "project_id": "proj_123"},
            "config": {"base_url": "https://acme.atlassian.net", "max_results": 10},
            "secrets": {"jira_token": "secret://org_123/jira_token"},
            "status": "active",
            "rollout": {"traffic_percent": 100},
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "created_by": "test"
        });
        let b: Binding = serde_json::from_value(seed.clone()).unwrap();
        assert_eq!(b, binding("bind_123", "org_123", 100));
        assert_eq!(serde_json::to_value(&b).unwrap(), seed);
    }

    #[test]
    fn a_good_binding_has_no_problems() {
        let b = binding("bind_1", "org_123", 100);
        assert_eq!(check(&b, &contract(), &all_exist), vec![]);
    }

    #[test]
    fn every_config_error_is_reported_with_its_path() {
        let mut b = binding("bind_1", "org_123", 100);
        b.config = json!({"max_results": 99, "labels": ["a", 7], "extra": true});
        let problems = check(&b, &contract(), &all_exist);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        for want in ["/config", "/config/max_results", "/config/labels/1"] {
            assert!(paths.contains(&want), "{want} missing from {problems:?}");
        }
        // required base_url and additionalProperties extra, both at /config.
        assert_eq!(
            paths.iter().filter(|p| **p == "/config").count(),
            2,
            "{problems:?}"
        );
        assert_eq!(problems.len(), 4, "{problems:?}");
        let text = problems[0].to_string();
        assert!(text.starts_with("/config"), "{text}");
        b.config = json!([1]);
        assert_eq!(check(&b, &contract(), &all_exist)[0].path, "/config");
    }

    #[test]
    fn secret_slots_must_be_declared_and_references_stay_in_the_org() {
        let mut b = binding("bind_1", "org_a", 100);
        b.secrets = BTreeMap::from([
            (
                "jira_token".to_owned(),
                "secret://org_b/jira_token".to_owned(),
            ),
            ("other/x".to_owned(), "secret://org_a/x".to_owned()),
            ("bad".to_owned(), "vault://x".to_owned()),
        ]);
        let problems = check(&b, &contract(), &all_exist);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/secrets/bad",
                "/secrets/bad",
                "/secrets/jira_token",
                "/secrets/other~1x"
            ],
            "{problems:?}"
        );
        assert!(problems[2].message.contains("another org"), "{problems:?}");
        // A manifest form without slots accepts any slot name.
        let open = ExportContract {
            config_schema: None,
            secret_slots: None,
        };
        b.secrets = BTreeMap::from([("any".to_owned(), "secret://org_a/x".to_owned())]);
        assert_eq!(check(&b, &open, &all_exist), vec![]);
        // A secret that is not stored is a problem at its slot.
        let none = |_: &SecretRef| false;
        assert_eq!(check(&b, &open, &none)[0].path, "/secrets/any");
    }

    #[test]
    fn scope_names_and_rollout_are_checked() {
        let mut b = binding("bind_1", "org a", 101);
        b.secrets.clear();
        let paths: Vec<String> = check(&b, &contract(), &all_exist)
            .into_iter()
            .map(|p| p.path)
            .collect();
        assert_eq!(paths, ["/scope/org_id", "/rollout/traffic_percent"]);
    }

    #[test]
    fn secret_references_parse_strictly() {
        let r = SecretRef::parse("secret://org_1/jira.token").unwrap();
        assert_eq!(
            (r.org_id.as_str(), r.name.as_str()),
            ("org_1", "jira.token")
        );
        assert_eq!(r.to_string(), "secret://org_1/jira.token");
        for bad in [
            "org_1/x",
            "secret://org_1",
            "secret:///x",
            "secret://org_1/",
            "secret://org_1/a/b",
            "secret://../x",
            "secret://org_1/.x",
        ] {
            assert!(SecretRef::parse(bad).is_err(), "{bad}");
        }
    }

    /// How many of `n` session keys land on each binding.
    fn split(bindings: &[Binding], n: usize) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for i in 0..n {
            let b = select(bindings, &format!("session-{i}")).unwrap();
            *counts.entry(b.binding_id.clone()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn rollout_100_0_sends_every_session_to_one_binding() {
        let both = [binding("bind_a", "o", 100), binding("bind_b", "o", 0)];
        assert_eq!(
            split(&both, 1000),
            BTreeMap::from([("bind_a".into(), 1000)])
        );
    }

    #[test]
    fn rollout_50_50_splits_within_five_points_over_2000_sessions() {
        // Binomial(2000, 0.5): sd ≈ 22; ±100 is over 4 sd.
        let both = [binding("bind_b", "o", 50), binding("bind_a", "o", 50)];
        let counts = split(&both, 2000);
        for id in ["bind_a", "bind_b"] {
            let c = counts[id];
            assert!((900..=1100).contains(&c), "{counts:?}");
        }
        // Deterministic: the same session always gets the same binding, in
        // whatever order the candidates come.
        let reversed = [both[1].clone(), both[0].clone()];
        for i in 0..50 {
            let key = format!("s{i}");
            assert_eq!(
                select(&both, &key).unwrap().binding_id,
                select(&reversed, &key).unwrap().binding_id
            );
        }
    }

    #[test]
    fn the_session_hash_is_pinned() {
        // Changing the hash moves every session: this pins it.
        assert_eq!(session_hash("jira_search", "sess_123"), {
            let d = Sha256::digest(b"jira_search\0sess_123");
            u64::from_be_bytes(d[..8].try_into().unwrap())
        });
        assert_eq!(session_hash("a", "b") % 100, session_hash("a", "b") % 100);
    }

    #[test]
    fn disabled_and_zero_share_bindings_take_no_traffic() {
        let mut a = binding("bind_a", "o", 100);
        a.status = BindingStatus::Disabled;
        let b = binding("bind_b", "o", 0);
        assert_eq!(select(&[a.clone(), b], "s"), None);
        assert_eq!(select(&[], "s"), None);
        a.status = BindingStatus::Active;
        a.rollout.traffic_percent = 30;
        assert_eq!(select(&[a], "s").unwrap().binding_id, "bind_a");
    }

    #[test]
    fn a_project_sees_its_own_bindings_before_the_org_wide_ones() {
        let mut org_wide = binding("bind_o", "o", 100);
        org_wide.scope.project_id = None;
        let mut p1 = binding("bind_p1", "o", 100);
        p1.scope.project_id = Some("p1".into());
        let mut p2 = binding("bind_p2", "o", 100);
        p2.scope.project_id = Some("p2".into());
        let mut other_org = binding("bind_x", "x", 100);
        other_org.scope.project_id = None;
        let all = [org_wide.clone(), p1.clone(), p2, other_org];
        let pick = |project: Option<&str>| {
            resolve(&all, "jira_search", "o", project, "s").map(|b| b.binding_id.as_str())
        };
        assert_eq!(pick(Some("p1")), Some("bind_p1"));
        assert_eq!(pick(Some("p3")), Some("bind_o"));
        assert_eq!(pick(None), Some("bind_o"));
        assert_eq!(resolve(&all, "other", "o", None, "s"), None);
        assert_eq!(resolve(&all, "jira_search", "nobody", None, "s"), None);
        // A disabled project binding leaves the org-wide one in charge; a
        // disabled org-wide one, nothing.
        p1.status = BindingStatus::Disabled;
        let mut off = org_wide;
        let some = [off.clone(), p1.clone()];
        assert_eq!(
            resolve(&some, "jira_search", "o", Some("p1"), "s").map(|b| b.binding_id.as_str()),
            Some("bind_o")
        );
        off.status = BindingStatus::Disabled;
        assert_eq!(
            resolve(&[off, p1], "jira_search", "o", Some("p1"), "s"),
            None
        );
    }

    #[test]
    fn a_patch_changes_only_what_it_names() {
        let b = binding("bind_a", "o", 100);
        let p: BindingPatch = serde_json::from_value(
            json!({"status": "disabled", "rollout": {"traffic_percent": 10}}),
        )
        .unwrap();
        let after = p.apply(&b);
        assert_eq!(after.status, BindingStatus::Disabled);
        assert_eq!(after.rollout.traffic_percent, 10);
        assert_eq!(after.config, b.config);
        assert!(serde_json::from_value::<BindingPatch>(json!({"scope": {}})).is_err());
    }
}
