//! Bindings, tenancy and export discovery over HTTP, as seed 003 names the
//! routes, plus the org secrets that bindings reference.
//!
//! | route | right |
//! |-------|-------|
//! | `POST /v1/plugin-bindings` | operator |
//! | `GET /v1/plugin-bindings` (`?org_id=&export_id=&package_id=&status=`) | viewer |
//! | `GET /v1/plugin-bindings/{id}` | viewer |
//! | `PATCH /v1/plugin-bindings/{id}` | operator |
//! | `POST /v1/plugin-bindings/{id}:validate` (optional body: a patch to try) | viewer |
//! | `GET /v1/plugin-harnesses`, `/v1/plugin-tools`, `/v1/plugin-hooks`, `/v1/plugin-compactors` | viewer |
//! | `GET /v1/secrets/{org}` (names only) | viewer |
//! | `PUT /v1/secrets/{org}/{name}` (`{"value"}`) | operator |
//!
//! **Tenancy**: a token bound to an org ([`Tenancy`]) sees only bindings of
//! its org (and, when it is limited to projects, the org-wide ones and
//! those of its projects); anything else answers it `404`, never `403`,
//! so it cannot learn what exists. It may write only bindings it sees that
//! are of its projects (or any of its org's, unlimited). Every other route
//! of the API answers a bound token `404` ([`tenant_may_reach`]). Unbound
//! tokens and the socket's local admin are workspace operators: they see
//! every org.
//!
//! Errors: an unknown or invisible binding → 404 `unknown_binding`; a
//! binding that fails its checks → 422 `invalid_binding` with
//! `details.problems: [{path, message}]` (every problem, each with its
//! JSON Pointer); an unknown package or version → 404 `unknown_package`;
//! an export the package lacks → 422 `unknown_export`.
//!
//! The create, update and validate steps are public functions over a
//! [`Store`] so that `plugd binding` runs the very same code.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Extension, Json, Router};
use plugd_control::{
    Binding, BindingFilter, BindingPatch, BindingStatus, BindingStore, PackageSelector,
    PackageStore, Problem, Rollout, Scope,
};
use plugd_store::Store;
use plugd_store::tokens::Tenancy;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::{Identity, Right};
use crate::error::code;
use crate::packages::store_error;
use crate::{ApiError, AppState, JsonBody};

type St = State<AppState>;
type Who = Extension<Identity>;

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/plugin-bindings", get(list).post(create_route))
        .route(
            "/v1/plugin-bindings/{id}",
            get(show).patch(update_route).post(action),
        )
        .route(
            "/v1/plugin-harnesses",
            get(|s: St, w: Who| exports(s, w, "harness")),
        )
        .route(
            "/v1/plugin-tools",
            get(|s: St, w: Who| exports(s, w, "tool")),
        )
        .route(
            "/v1/plugin-hooks",
            get(|s: St, w: Who| exports(s, w, "hook")),
        )
        .route(
            "/v1/plugin-compactors",
            get(|s: St, w: Who| exports(s, w, "compactor")),
        )
        .route("/v1/secrets/{org}", get(secret_names))
        .route("/v1/secrets/{org}/{name}", put(secret_set))
}

/// The paths a token bound to an org may reach; every other route answers
/// it 404.
pub fn tenant_may_reach(path: &str) -> bool {
    // Sessions, chains and runs of the org (not the workspace agent's
    // turns: `/v1/sessions/{id}/messages`).
    if ["/v1/sessions", "/v1/chains", "/v1/runs", "/v1/compactions"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
    {
        return !path.ends_with("/messages");
    }
    [
        "/v1/plugin-bindings",
        "/v1/plugin-harnesses",
        "/v1/plugin-tools",
        "/v1/plugin-hooks",
        "/v1/plugin-compactors",
        "/v1/plugin-packages",
        "/v1/secrets/",
        "/v1/marketplace",
        "/v1/invocations",
    ]
    .iter()
    .any(|p| path == *p || path.starts_with(&format!("{}/", p.trim_end_matches('/'))))
}

/// The right this module's routes need (`None`: not one of them).
pub fn required(method: &Method, path: &str) -> Option<Right> {
    let binding = path.strip_prefix("/v1/plugin-bindings/");
    match *method {
        Method::POST if path == "/v1/plugin-bindings" => Some(Right::Govern),
        Method::POST if binding.is_some_and(|b| b.ends_with(":validate")) => Some(Right::Read),
        Method::PATCH if binding.is_some() => Some(Right::Govern),
        Method::PUT if path.starts_with("/v1/secrets/") => Some(Right::Govern),
        _ => None,
    }
}

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

fn unknown_binding(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        code::UNKNOWN_BINDING,
        format!("no binding {id:?}; GET /v1/plugin-bindings lists the bindings you can see"),
    )
}

/// 422 `invalid_binding` listing `problems`.
pub(crate) fn invalid(problems: &[Problem]) -> ApiError {
    let list: Vec<String> = problems.iter().map(Problem::to_string).collect();
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        code::INVALID_BINDING,
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
pub fn problems(store: &Store, b: &Binding) -> Result<Vec<Problem>, ApiError> {
    let sel = PackageSelector::Version {
        package_id: b.package_id.clone(),
        version: b.package_version.clone(),
    };
    let Some(pkg) = store.find_package(&sel).map_err(store_error)? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            code::UNKNOWN_PACKAGE,
            format!(
                "package {sel} is not installed; pull it first (POST /v1/plugin-packages or `plugd package pull`)"
            ),
        ));
    };
    let contract = plugd_packages::export_contract(&pkg, &b.export_id)
        .map_err(crate::packages::package_error)?
        .ok_or_else(|| {
            let ids: Vec<&str> = pkg.exports.iter().map(|e| e.id.as_str()).collect();
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                code::UNKNOWN_EXPORT,
                format!(
                    "package {sel} has no export {:?}; it exports {}",
                    b.export_id,
                    ids.join(", ")
                ),
            )
        })?;
    let exists =
        |r: &plugd_control::SecretRef| store.org_secret_exists(&r.org_id, &r.name).unwrap_or(false);
    Ok(plugd_control::bindings::check(b, &contract, &exists))
}

/// Creates a binding from `req` for `by` (checked first; nothing is stored
/// when a check fails).
pub fn create(store: &Store, req: NewBinding, by: &str) -> Result<Binding, ApiError> {
    let package_version = match req.package_version {
        Some(v) => v,
        None => store
            .find_package(&PackageSelector::Latest(req.package_id.clone()))
            .map_err(store_error)?
            .map(|p| p.version)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    code::UNKNOWN_PACKAGE,
                    format!(
                        "package {:?} is not installed; pull it first",
                        req.package_id
                    ),
                )
            })?,
    };
    let now = plugd_store::now_rfc3339();
    let b = Binding {
        binding_id: plugd_store::bindings::new_binding_id().map_err(store_error)?,
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
    let found = problems(store, &b)?;
    if !found.is_empty() {
        return Err(invalid(&found));
    }
    store.insert_binding(&b).map_err(store_error)?;
    Ok(b)
}

/// The binding `id` as `t` may see it (404 otherwise).
pub fn visible(store: &Store, t: Option<&Tenancy>, id: &str) -> Result<Binding, ApiError> {
    store
        .binding(id)
        .map_err(store_error)?
        .filter(|b| sees(t, &b.scope))
        .ok_or_else(|| unknown_binding(id))
}

/// Applies `patch` to binding `id` (checked first).
pub fn update(
    store: &Store,
    t: Option<&Tenancy>,
    id: &str,
    patch: &BindingPatch,
) -> Result<Binding, ApiError> {
    let old = visible(store, t, id)?;
    if !owns(t, &old.scope) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            code::FORBIDDEN,
            format!(
                "binding {id} applies to the whole org; only a token not limited to projects may change it"
            ),
        ));
    }
    let mut b = patch.apply(&old);
    b.updated_at = plugd_store::now_rfc3339();
    let found = problems(store, &b)?;
    if !found.is_empty() {
        return Err(invalid(&found));
    }
    if !store.update_binding(&b).map_err(store_error)? {
        return Err(unknown_binding(id));
    }
    Ok(b)
}

/// `{"binding_id", "valid", "problems"}` for binding `id`, with `patch`
/// tried on it (not stored) when given.
pub fn validate(
    store: &Store,
    t: Option<&Tenancy>,
    id: &str,
    patch: Option<&BindingPatch>,
) -> Result<Value, ApiError> {
    let old = visible(store, t, id)?;
    let b = match patch {
        Some(p) => p.apply(&old),
        None => old,
    };
    let found = problems(store, &b)?;
    Ok(json!({"binding_id": id, "valid": found.is_empty(), "problems": found}))
}

fn tenancy(who: &Identity) -> Option<&Tenancy> {
    who.tenant.as_ref()
}

async fn create_route(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    JsonBody(req): JsonBody<NewBinding>,
) -> Result<Response, ApiError> {
    if !owns(tenancy(&who), &req.scope) {
        // Another org's (or project's) scope does not exist for this caller.
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            code::NOT_FOUND,
            format!(
                "no scope {:?}; {} may bind only in its own org",
                req.scope.org_id,
                who.by()
            ),
        ));
    }
    let b = create(state.runtime.store(), req, who.by())?;
    Ok((StatusCode::CREATED, Json(b)).into_response())
}

/// The `GET /v1/plugin-bindings` query: `org_id`, `export_id`,
/// `package_id`, `status` (ids need no percent-encoding).
fn list_filter(query: Option<&str>) -> Result<BindingFilter, ApiError> {
    let mut f = BindingFilter::default();
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, code::BAD_REQUEST, m);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = Some(v.to_owned());
        match k {
            "org_id" => f.org_id = v,
            "export_id" => f.export_id = v,
            "package_id" => f.package_id = v.map(|p| p.replace("%2F", "/").replace("%2f", "/")),
            "status" => f.status = Some(pair[k.len() + 1..].parse().map_err(bad)?),
            _ => {
                return Err(bad(format!(
                    "unknown query parameter {k:?}; use org_id, export_id, package_id or status"
                )));
            }
        }
    }
    Ok(f)
}

/// The bindings `t` sees that `filter` passes.
fn seen(
    store: &Store,
    t: Option<&Tenancy>,
    filter: &BindingFilter,
) -> Result<Vec<Binding>, ApiError> {
    let mut filter = filter.clone();
    if let Some(t) = t {
        if filter.org_id.as_ref().is_some_and(|o| *o != t.org_id) {
            return Ok(Vec::new());
        }
        filter.org_id = Some(t.org_id.clone());
    }
    Ok(store
        .bindings(&filter)
        .map_err(store_error)?
        .into_iter()
        .filter(|b| sees(t, &b.scope))
        .collect())
}

async fn list(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    RawQuery(q): RawQuery,
) -> Result<Json<Vec<Binding>>, ApiError> {
    let filter = list_filter(q.as_deref())?;
    Ok(Json(seen(state.runtime.store(), tenancy(&who), &filter)?))
}

async fn show(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Result<Json<Binding>, ApiError> {
    visible(state.runtime.store(), tenancy(&who), &id).map(Json)
}

async fn update_route(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    JsonBody(patch): JsonBody<BindingPatch>,
) -> Result<Json<Binding>, ApiError> {
    update(state.runtime.store(), tenancy(&who), &id, &patch).map(Json)
}

/// `POST /v1/plugin-bindings/{id}:validate`.
async fn action(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    JsonBody(patch): JsonBody<BindingPatch>,
) -> Result<Json<Value>, ApiError> {
    let Some((id, "validate")) = crate::auth::action_of(&id) else {
        return Err(ApiError::no_route(
            "POST",
            &format!("/v1/plugin-bindings/{id}"),
        ));
    };
    let patch = (patch != BindingPatch::default()).then_some(&patch);
    validate(state.runtime.store(), tenancy(&who), id, patch).map(Json)
}

/// The exports of `kind` with an active binding the caller sees: one row
/// per package version and export, naming its bindings.
pub fn discover(store: &Store, t: Option<&Tenancy>, kind: &str) -> Result<Vec<Value>, ApiError> {
    let active = BindingFilter {
        status: Some(BindingStatus::Active),
        ..BindingFilter::default()
    };
    let mut rows: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for b in seen(store, t, &active)? {
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
        let Some(pkg) = store.find_package(&sel).map_err(store_error)? else {
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

async fn exports(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    kind: &'static str,
) -> Result<Json<Vec<Value>>, ApiError> {
    discover(state.runtime.store(), tenancy(&who), kind).map(Json)
}

/// Whether `t` may reach org `org`'s secrets (404 otherwise).
fn org_of(t: Option<&Tenancy>, org: &str) -> Result<(), ApiError> {
    if t.is_none_or(|t| t.org_id == org) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            code::NOT_FOUND,
            format!("no org {org:?}"),
        ))
    }
}

async fn secret_names(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(org): Path<String>,
) -> Result<Json<Value>, ApiError> {
    org_of(tenancy(&who), &org)?;
    let names = state
        .runtime
        .store()
        .org_secret_names(&org)
        .map_err(store_error)?;
    Ok(Json(json!({"org_id": org, "names": names})))
}

/// The body of `PUT /v1/secrets/{org}/{name}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretValue {
    value: String,
}

async fn secret_set(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path((org, name)): Path<(String, String)>,
    JsonBody(body): JsonBody<SecretValue>,
) -> Result<StatusCode, ApiError> {
    org_of(tenancy(&who), &org)?;
    state
        .runtime
        .store()
        .org_secret_set(&org, &name, &body.value)
        .map_err(|e| match e {
            plugd_store::StoreError::Invalid { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, code::BAD_REQUEST, e.to_string())
            }
            e => store_error(e),
        })?;
    Ok(StatusCode::NO_CONTENT)
}

/// The packages a caller bound to `t` sees: those with a binding it sees.
pub fn packages_in_use(store: &Store, t: &Tenancy) -> Result<Vec<(String, String)>, ApiError> {
    Ok(seen(store, Some(t), &BindingFilter::default())?
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

    #[test]
    fn rights_and_tenant_paths() {
        assert_eq!(
            required(&Method::POST, "/v1/plugin-bindings"),
            Some(Right::Govern)
        );
        assert_eq!(
            required(&Method::POST, "/v1/plugin-bindings/bind_1:validate"),
            Some(Right::Read)
        );
        assert_eq!(
            required(&Method::PATCH, "/v1/plugin-bindings/bind_1"),
            Some(Right::Govern)
        );
        assert_eq!(
            required(&Method::PUT, "/v1/secrets/a/b"),
            Some(Right::Govern)
        );
        assert_eq!(required(&Method::POST, "/v1/tools/x"), None);
        assert!(tenant_may_reach("/v1/plugin-bindings/bind_1:validate"));
        assert!(tenant_may_reach("/v1/plugin-tools"));
        assert!(tenant_may_reach("/v1/secrets/org_a"));
        assert!(tenant_may_reach("/v1/plugin-tools/x:invoke"));
        assert!(tenant_may_reach("/v1/invocations/inv_1"));
        assert!(!tenant_may_reach("/v1/invocationsx"));
        assert!(!tenant_may_reach("/v1/plugin-toolsx"));
        assert!(!tenant_may_reach("/v1/plugins"));
        assert!(!tenant_may_reach("/v1/tools/x"));
        assert!(!tenant_may_reach("/mcp"));
    }
}
