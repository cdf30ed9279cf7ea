//! The binding service: create, update, validate and show Binding Records
//! over a [`StateStore`] (any backend), with the tenancy rules, so `POST /v1/plugin-bindings`
//! and `plugd binding` run the very same code.
//!
//! **Tenancy**: a caller bound to an org ([`Tenancy`]) sees only bindings
//! of its org (and, when it is limited to projects, the org-wide ones and
//! those of its projects); anything else is `unknown_binding`, so it cannot
//! learn what exists. It may write only bindings it sees that are of its
//! projects (or any of its org's, unlimited). Unbound callers are
//! workspace operators: they see every org.
//!
//! Errors ([`ServiceError`]): an unknown or invisible binding →
//! `unknown_binding`; a binding that fails its checks → `invalid_binding`
//! with `details.problems: [{path, message}]` (every problem, each with its
//! JSON Pointer); an unknown package or version → `unknown_package`; an
//! export the package lacks → `unknown_export`.

use std::collections::BTreeMap;

use plugd_control::store::StateStore;
use plugd_control::{
    Binding, BindingFilter, BindingPatch, BindingStatus, Code, PackageSelector, Problem, Rollout,
    Scope, ServiceError,
};
use plugd_store::tokens::Tenancy;
use serde::Deserialize;
use serde_json::{Value, json};

/// Whether `scope` is within `t` (always, unbound): its org, and for a
/// token limited to projects one of them, or the whole org when `org_wide`
/// counts.
fn within(t: Option<&Tenancy>, scope: &Scope, org_wide: bool) -> bool {
    t.is_none_or(|t| {
        t.org_id == scope.org_id
            && (t.project_ids.is_empty()
                || scope
                    .project_id
                    .as_ref()
                    .map_or(org_wide, |p| t.project_ids.contains(p)))
    })
}

/// Whether a caller bound to `t` (or unbound: `None`) sees what is bound in
/// `scope`.
pub fn sees(t: Option<&Tenancy>, scope: &Scope) -> bool {
    within(t, scope, true)
}

/// Whether a caller bound to `t` may create or change a binding in `scope`.
pub fn owns(t: Option<&Tenancy>, scope: &Scope) -> bool {
    within(t, scope, false)
}

/// The body of `POST /v1/plugin-bindings`: the Binding Record without its
/// id and times. `package_version` defaults to the highest installed one.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewBinding {
    /// The package (`acme/devkit`).
    pub package_id: String,
    /// Its installed version (default: the highest).
    #[serde(default)]
    pub package_version: Option<String>,
    /// The export.
    pub export_id: String,
    /// Where it applies.
    pub scope: Scope,
    /// Config values (default `{}`).
    #[serde(default)]
    pub config: Option<Value>,
    /// Slot → `secret://ORG/NAME`.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    /// Default `active`.
    #[serde(default)]
    pub status: Option<BindingStatus>,
    /// Default 100 %.
    #[serde(default)]
    pub rollout: Option<Rollout>,
    /// The delegated scopes the export gets at most (default: what it asks for).
    #[serde(default)]
    pub gateway_api_scopes: Option<Vec<String>>,
}

fn unknown_binding(id: &str) -> ServiceError {
    ServiceError::new(
        Code::UnknownBinding,
        format!("no binding {id:?}; GET /v1/plugin-bindings lists the bindings you can see"),
    )
}

/// `invalid_binding` listing `problems`.
pub fn invalid(problems: &[Problem]) -> ServiceError {
    let list: Vec<String> = problems.iter().map(Problem::to_string).collect();
    ServiceError::new(
        Code::InvalidBinding,
        format!(
            "the binding has {} problem(s): {}",
            problems.len(),
            list.join("; ")
        ),
    )
    .with_details(json!({ "problems": problems }))
}

/// Every problem of `b`: the package version must be installed, the export
/// must be one of it, and [`plugd_control::bindings::check`] must pass.
pub async fn problems(store: &dyn StateStore, b: &Binding) -> Result<Vec<Problem>, ServiceError> {
    let sel = PackageSelector::Version {
        package_id: b.package_id.clone(),
        version: b.package_version.clone(),
    };
    let Some(pkg) = store
        .find_package(&sel)
        .await
        .map_err(ServiceError::store)?
    else {
        return Err(ServiceError::new(
            Code::UnknownPackage,
            format!(
                "package {sel} is not installed; pull it first (POST /v1/plugin-packages or `plugd package pull`)"
            ),
        ));
    };
    let contract = plugd_packages::export_contract(&pkg, &b.export_id)?.ok_or_else(|| {
        let ids: Vec<&str> = pkg.exports.iter().map(|e| e.id.as_str()).collect();
        ServiceError::new(
            Code::UnknownExport,
            format!(
                "package {sel} has no export {:?}; it exports {}",
                b.export_id,
                ids.join(", ")
            ),
        )
    })?;
    // `check` asks synchronously: every secret the binding names is
    // looked up first (a lookup that fails counts as missing).
    let mut present = std::collections::HashSet::new();
    for reference in b.secrets.values() {
        if let Ok(r) = plugd_control::SecretRef::parse(reference)
            && store
                .org_secret_exists(&r.org_id, &r.name)
                .await
                .unwrap_or(false)
        {
            present.insert(r);
        }
    }
    let exists = |r: &plugd_control::SecretRef| present.contains(r);
    Ok(plugd_control::bindings::check(b, &contract, &exists))
}

/// Creates a binding from `req` for `by` (checked first; nothing is stored
/// when a check fails).
pub async fn create(
    store: &dyn StateStore,
    req: NewBinding,
    by: &str,
) -> Result<Binding, ServiceError> {
    let package_version = match req.package_version {
        Some(v) => v,
        None => store
            .find_package(&PackageSelector::Latest(req.package_id.clone()))
            .await
            .map_err(ServiceError::store)?
            .map(|p| p.version)
            .ok_or_else(|| {
                ServiceError::new(
                    Code::UnknownPackage,
                    format!(
                        "package {:?} is not installed; pull it first",
                        req.package_id
                    ),
                )
            })?,
    };
    let now = plugd_store::now_rfc3339();
    let b = Binding {
        binding_id: plugd_store::bindings::new_binding_id().map_err(ServiceError::store)?,
        package_id: req.package_id,
        package_version,
        export_id: req.export_id,
        scope: req.scope,
        config: req.config.unwrap_or_else(|| json!({})),
        secrets: req.secrets,
        status: req.status.unwrap_or(BindingStatus::Active),
        rollout: req.rollout.unwrap_or_default(),
        created_at: now.clone(),
        updated_at: now,
        created_by: by.to_owned(),
        gateway_api_scopes: req.gateway_api_scopes,
    };
    let found = problems(store, &b).await?;
    if !found.is_empty() {
        return Err(invalid(&found));
    }
    store
        .insert_binding(&b)
        .await
        .map_err(ServiceError::store)?;
    Ok(b)
}

/// The binding `id` as `t` may see it (`unknown_binding` otherwise).
pub async fn visible(
    store: &dyn StateStore,
    t: Option<&Tenancy>,
    id: &str,
) -> Result<Binding, ServiceError> {
    store
        .binding(id)
        .await
        .map_err(ServiceError::store)?
        .filter(|b| sees(t, &b.scope))
        .ok_or_else(|| unknown_binding(id))
}

/// Applies `patch` to binding `id` (checked first).
pub async fn update(
    store: &dyn StateStore,
    t: Option<&Tenancy>,
    id: &str,
    patch: &BindingPatch,
) -> Result<Binding, ServiceError> {
    let old = visible(store, t, id).await?;
    if !owns(t, &old.scope) {
        return Err(ServiceError::new(
            Code::Forbidden,
            format!(
                "binding {id} applies to the whole org; only a token not limited to projects may change it"
            ),
        ));
    }
    let mut b = patch.apply(&old);
    b.updated_at = plugd_store::now_rfc3339();
    let found = problems(store, &b).await?;
    if !found.is_empty() {
        return Err(invalid(&found));
    }
    if !store
        .update_binding(&b)
        .await
        .map_err(ServiceError::store)?
    {
        return Err(unknown_binding(id));
    }
    Ok(b)
}

/// `{"binding_id", "valid", "problems"}` for binding `id`, with `patch`
/// tried on it (not stored) when given.
pub async fn validate(
    store: &dyn StateStore,
    t: Option<&Tenancy>,
    id: &str,
    patch: Option<&BindingPatch>,
) -> Result<Value, ServiceError> {
    let old = visible(store, t, id).await?;
    let b = match patch {
        Some(p) => p.apply(&old),
        None => old,
    };
    let found = problems(store, &b).await?;
    Ok(json!({"binding_id": id, "valid": found.is_empty(), "problems": found}))
}

/// Whether the store knows org `org`: a binding (of any status) names it.
/// An org identity whose org the store does not know is refused rather
/// than served an empty catalog (a claim's typo, an org not onboarded).
pub async fn org_known(store: &dyn StateStore, org: &str) -> Result<bool, ServiceError> {
    let filter = BindingFilter {
        org_id: Some(org.to_owned()),
        ..BindingFilter::default()
    };
    Ok(!store
        .bindings(&filter)
        .await
        .map_err(ServiceError::store)?
        .is_empty())
}

/// The bindings `t` sees that `filter` passes.
pub async fn seen(
    store: &dyn StateStore,
    t: Option<&Tenancy>,
    filter: &BindingFilter,
) -> Result<Vec<Binding>, ServiceError> {
    let mut filter = filter.clone();
    if let Some(t) = t {
        if filter.org_id.as_ref().is_some_and(|o| *o != t.org_id) {
            return Ok(Vec::new());
        }
        filter.org_id = Some(t.org_id.clone());
    }
    Ok(store
        .bindings(&filter)
        .await
        .map_err(ServiceError::store)?
        .into_iter()
        .filter(|b| sees(t, &b.scope))
        .collect())
}

/// The exports of `kind` with an active binding the caller sees: one row
/// per package version and export, naming its bindings.
pub async fn discover(
    store: &dyn StateStore,
    t: Option<&Tenancy>,
    kind: &str,
) -> Result<Vec<Value>, ServiceError> {
    let active = BindingFilter {
        status: Some(BindingStatus::Active),
        ..BindingFilter::default()
    };
    let mut rows: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for b in seen(store, t, &active).await? {
        rows.entry((b.package_id, b.package_version, b.export_id))
            .or_default()
            .push(b.binding_id);
    }
    let mut out = Vec::new();
    for ((package_id, version, export_id), binding_ids) in rows {
        let sel = PackageSelector::Version {
            package_id: package_id.clone(),
            version: version.clone(),
        };
        let Some(pkg) = store
            .find_package(&sel)
            .await
            .map_err(ServiceError::store)?
        else {
            continue;
        };
        let Some(e) = pkg
            .exports
            .iter()
            .find(|e| e.id == export_id && e.kind == kind)
        else {
            continue;
        };
        out.push(json!({
            "export_id": e.id,
            "kind": e.kind,
            "display_name": e.display_name,
            "execution_class": e.execution_class,
            "package_id": package_id,
            "package_version": version,
            "digest": pkg.digest,
            "binding_ids": binding_ids,
        }));
    }
    Ok(out)
}

/// The packages a caller bound to `t` sees: those with a binding it sees.
pub async fn packages_in_use(
    store: &dyn StateStore,
    t: &Tenancy,
) -> Result<Vec<(String, String)>, ServiceError> {
    Ok(seen(store, Some(t), &BindingFilter::default())
        .await?
        .into_iter()
        .map(|b| (b.package_id, b.package_version))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(org: &str, project: Option<&str>) -> Scope {
        Scope {
            org_id: org.into(),
            project_id: project.map(str::to_owned),
        }
    }

    #[test]
    fn bound_tokens_see_their_org_and_projects_only() {
        let org_a = Tenancy {
            org_id: "a".into(),
            project_ids: vec![],
        };
        let p1 = Tenancy {
            org_id: "a".into(),
            project_ids: vec!["p1".into()],
        };
        assert!(sees(None, &scope("b", None)));
        assert!(sees(Some(&org_a), &scope("a", Some("p9"))));
        assert!(!sees(Some(&org_a), &scope("b", None)));
        assert!(sees(Some(&p1), &scope("a", None)));
        assert!(sees(Some(&p1), &scope("a", Some("p1"))));
        assert!(!sees(Some(&p1), &scope("a", Some("p2"))));
        assert!(owns(Some(&p1), &scope("a", Some("p1"))));
        assert!(!owns(Some(&p1), &scope("a", None)));
        assert!(owns(Some(&org_a), &scope("a", None)));
    }
}
