//! Bindings, tenancy and export discovery over HTTP, as seed 003 names the
//! routes, plus the org secrets that bindings reference.
//!
//! | route | right |
//! |-------|-------|
//! | `POST /v1/plugin-bindings` | operator |
//! | `GET /v1/plugin-bindings` (`?org_id=&export_id=&package_id=&status=`; paged with `q`, `limit`, `cursor`, `sort`, `org`, `project`: [`crate::paging`]) | viewer |
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
//! are of its projects (or any of its org's, unlimited). `/mcp`,
//! `/mcp/{profile}`, `GET /v1/tools` and its agent turns (`POST
//! /v1/sessions/{id}/messages`) serve it the exports bound to its
//! scope (the one catalog); every other route of the API answers a bound
//! token `404` ([`tenant_may_reach`]). Unbound
//! tokens and the socket's local admin are workspace operators: they see
//! every org.
//!
//! Errors: an unknown or invisible binding → 404 `unknown_binding`; a
//! binding that fails its checks → 422 `invalid_binding` with
//! `details.problems: [{path, message}]` (every problem, each with its
//! JSON Pointer); an unknown package or version → 404 `unknown_package`;
//! an export the package lacks → 422 `unknown_export`.
//!
//! The create, update, validate and discovery steps, with the tenancy
//! rules, are plugd-governance's binding service
//! ([`plugd_governance::bindings`]), so that `plugd binding` runs the very
//! same code; this module is their routes.

use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Extension, Json, Router};
use plugd_control::{Binding, BindingFilter, BindingPatch};
use plugd_governance::bindings::{NewBinding, discover, owns, seen, update, validate, visible};
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
    // The one catalog (issue 28): the MCP gateway and the tool list serve
    // an org token the exports bound to its scope.
    if matches!(path, "/mcp" | "/mcp/_" | "/v1/tools") {
        return true;
    }
    // Its own console session: who it is, and its logout (an org identity
    // may sign in on the console by single sign-on).
    if matches!(path, "/console/session" | "/console/logout") {
        return true;
    }
    // Sessions, chains and runs of the org, and its agent turns
    // (`/v1/sessions/{id}/messages`), which offer the model the same
    // catalog.
    if ["/v1/sessions", "/v1/chains", "/v1/runs", "/v1/compactions"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
    {
        return true;
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
    let b =
        plugd_governance::bindings::create(state.runtime.state().as_ref(), req, who.by()).await?;
    Ok((StatusCode::CREATED, Json(b)).into_response())
}

/// The `GET /v1/plugin-bindings` query: `org_id`, `export_id`,
/// `package_id`, `status` (ids need no percent-encoding).
fn list_filter(query: Option<&str>) -> Result<BindingFilter, ApiError> {
    let mut f = BindingFilter::default();
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, code::BAD_REQUEST, m);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let raw = v;
        let v = Some(v.to_owned());
        match k {
            "org_id" => f.org_id = v,
            "export_id" => f.export_id = v,
            "package_id" => f.package_id = v.map(|p| p.replace("%2F", "/").replace("%2f", "/")),
            "status" => f.status = Some(raw.parse().map_err(bad)?),
            _ => {
                return Err(bad(format!(
                    "unknown query parameter {k:?}; use org_id, export_id, package_id or status"
                )));
            }
        }
    }
    Ok(f)
}

/// The bindings the caller sees: the bare array (`org_id`, `export_id`,
/// `package_id`, `status` filter it in the store), or a page of them with
/// [`crate::paging`]'s parameters (filters `org`, `project`).
async fn list(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let paging = crate::paging::PageQuery::parse(crate::paging::BINDINGS, q.as_deref())?;
    let filter = list_filter(Some(paging.own_raw()))?;
    let rows: Vec<Binding> = seen(state.runtime.state().as_ref(), tenancy(&who), &filter).await?;
    if !paging.paged() {
        return Ok(Json(rows).into_response());
    }
    Ok(Json(paging.answer(crate::paging::rows_json(&rows)?)).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Result<Json<Binding>, ApiError> {
    Ok(Json(
        visible(state.runtime.state().as_ref(), tenancy(&who), &id).await?,
    ))
}

async fn update_route(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    JsonBody(patch): JsonBody<BindingPatch>,
) -> Result<Json<Binding>, ApiError> {
    Ok(Json(
        update(state.runtime.state().as_ref(), tenancy(&who), &id, &patch).await?,
    ))
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
    Ok(Json(
        validate(state.runtime.state().as_ref(), tenancy(&who), id, patch).await?,
    ))
}

async fn exports(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    kind: &'static str,
) -> Result<Json<Vec<Value>>, ApiError> {
    Ok(Json(
        discover(state.runtime.state().as_ref(), tenancy(&who), kind).await?,
    ))
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
        .state()
        .org_secret_names(&org)
        .await
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
        .state()
        .org_secret_set(&org, &name, &body.value)
        .await
        .map_err(|e| match e {
            plugd_store::StoreError::Invalid { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, code::BAD_REQUEST, e.to_string())
            }
            e => store_error(e),
        })?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(tenant_may_reach("/mcp"));
        assert!(tenant_may_reach("/mcp/_"));
        assert!(tenant_may_reach("/v1/tools"));
        assert!(!tenant_may_reach("/v1/tools/_"));
        assert!(!tenant_may_reach("/sse"));
    }
}
