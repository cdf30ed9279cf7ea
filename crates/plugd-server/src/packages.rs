//! Installed plugin packages over HTTP, as seed 003 names the routes:
//! `POST /v1/plugin-packages` (`{"source": "oci://…", "insecure"?}` pulls
//! and installs; operator or admin), `GET /v1/plugin-packages` and
//! `GET /v1/plugin-packages/{id}` (viewer and up). A token bound to an org
//! sees only the package versions its org's bindings use (others are 404)
//! and may not pull (packages are installed for the whole workspace).
//!
//! `{id}` is `sha256:DIGEST`, `PUBLISHER/NAME@VERSION`, or `PUBLISHER/NAME`
//! for its highest installed version. The `/` of a package id may be sent
//! as is (the route is a wildcard) or percent-encoded (`acme%2Fdevkit`).
//!
//! `POST /v1/plugin-packages/{id}:restart` (`{}`; operator or admin)
//! clears a failed state and the restart budget of the package's process,
//! as `POST /v1/plugins/{id}:restart` does for a `.plugins/` plugin: its
//! next call starts it again, after the tamper check. The answer is the
//! package record plus `had_process` (whether this serve had made its
//! process yet). A token bound to an org may not restart (a package process
//! serves every org whose bindings use that version): 404 for a package its
//! org does not use, 403 `forbidden` for one it does.
//!
//! An `application/x-tar` body is a package archive instead (a tar of the
//! package directory): uploaded and installed by `plugd_packages::install_archive`
//! under the digest a push would give it.
//!
//! Errors: a bad `source` → 400 `invalid_source`, a bad `{id}` → 400
//! `invalid_package_id`, none installed → 404 `unknown_package`, a package
//! refused for its content (secrets, links, paths, bounds, manifest, not a
//! plugd artifact) → 422 `package_refused`, a blob or manifest that does
//! not match its digest → 502 `package_tampered`, a registry that fails →
//! 502 `registry_error`, another digest installed as the same version → 409
//! `package_version_taken`, a signature that does not verify or that the
//! trust policy refuses (`require_signatures: true` and unsigned or an
//! untrusted key) → 422 `signature_refused`. Pulling an installed digest
//! whose files changed since its install puts them back: 200 with
//! `"restored": true`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use plugd_control::{Package, PackageSelector};
use plugd_packages::{OciRef, PackageError, RegistryOptions};
use serde::Deserialize;
use serde_json::json;

use crate::error::code;
use axum::extract::FromRequest;

use crate::{ApiError, AppState, JsonBody};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/plugin-packages", get(list).post(pull))
        .route("/v1/plugin-packages/{*id}", get(show).post(action))
}

/// The body of `POST /v1/plugin-packages/{id}:restart`: `{}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartRequest {}

/// The package `id` names, as `who` may see it (404 otherwise).
async fn visible(
    state: &AppState,
    who: &crate::auth::Identity,
    id: &str,
) -> Result<Package, ApiError> {
    let sel = PackageSelector::parse(id).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            code::INVALID_PACKAGE_ID,
            e.to_string(),
        )
    })?;
    let found = state
        .runtime
        .state()
        .find_package(&sel)
        .await
        .map_err(store_error)?;
    // A token bound to an org sees only the packages its bindings use.
    let found = match (&who.tenant, found) {
        (Some(t), Some(p)) => {
            let used =
                plugd_governance::bindings::packages_in_use(state.runtime.state().as_ref(), t)
                    .await?;
            used.contains(&(p.package_id.clone(), p.version.clone()))
                .then_some(p)
        }
        (_, found) => found,
    };
    found.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            code::UNKNOWN_PACKAGE,
            format!("no installed package {id:?}; GET /v1/plugin-packages lists them"),
        )
    })
}

async fn action(
    State(state): State<AppState>,
    axum::Extension(who): axum::Extension<crate::auth::Identity>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    Path(path): Path<String>,
    JsonBody(_body): JsonBody<RestartRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Some((id, "restart")) = crate::auth::action_of(&path).filter(|(id, _)| !id.is_empty())
    else {
        return Err(ApiError::no_route(method.as_str(), uri.path()));
    };
    let p = visible(&state, &who, id).await?;
    if who.tenant.is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            code::FORBIDDEN,
            format!(
                "the process of package {}@{} serves the whole workspace; ask a workspace operator (a token without --org) to restart it",
                p.package_id, p.version
            ),
        ));
    }
    let had = state.runtime.restart_package(&p).await;
    let mut v = serde_json::to_value(&p).unwrap_or_else(|_| json!({}));
    v["had_process"] = had.into();
    Ok(Json(v))
}

/// The body of `POST /v1/plugin-packages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `oci://HOST[:PORT]/REPO:TAG` or `oci://HOST[:PORT]/REPO@sha256:…`.
    pub source: String,
    /// Plain HTTP to a registry that is not on loopback.
    #[serde(default)]
    pub insecure: bool,
}

/// The installed packages the caller sees: the bare array, or a page of
/// them with [`crate::paging`]'s parameters (filters `package`,
/// `signature`, and `org`: the versions that org's bindings use).
async fn list(
    State(state): State<AppState>,
    axum::Extension(who): axum::Extension<crate::auth::Identity>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, ApiError> {
    let paging = crate::paging::PageQuery::parse(crate::paging::PACKAGES, query.as_deref())?;
    let store = state.runtime.state().as_ref();
    let mut all = store.packages().await.map_err(store_error)?;
    if let Some(t) = &who.tenant {
        let used = plugd_governance::bindings::packages_in_use(store, t).await?;
        all.retain(|p| used.contains(&(p.package_id.clone(), p.version.clone())));
    }
    if !paging.paged() {
        return Ok(Json(all).into_response());
    }
    if let Some(org) = paging.own("org") {
        let t = plugd_store::tokens::Tenancy {
            org_id: org.to_owned(),
            project_ids: Vec::new(),
        };
        let used = plugd_governance::bindings::packages_in_use(store, &t).await?;
        all.retain(|p| used.contains(&(p.package_id.clone(), p.version.clone())));
    }
    Ok(Json(paging.answer(crate::paging::rows_json(&all)?)).into_response())
}

async fn show(
    State(state): State<AppState>,
    axum::Extension(who): axum::Extension<crate::auth::Identity>,
    Path(id): Path<String>,
) -> Result<Json<Package>, ApiError> {
    visible(&state, &who, &id).await.map(Json)
}

async fn pull(
    State(state): State<AppState>,
    axum::Extension(who): axum::Extension<crate::auth::Identity>,
    req: axum::extract::Request,
) -> Result<Response, ApiError> {
    if who.tenant.is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            code::FORBIDDEN,
            "packages are installed for the whole workspace; ask a workspace operator (a token without --org)",
        ));
    }
    if is_archive(req.headers()) {
        let data = archive_body(req).await?;
        let at = plugd_store::now_rfc3339();
        let verify = plugd_runtime::signing::package_verifier(state.config.signing.clone());
        let how = plugd_packages::Local {
            limits: plugd_packages::Limits::default(),
            by: who.by(),
            at: &at,
            verify: &verify,
        };
        let state_dir = state.runtime.dir().join(".plugd");
        let done =
            plugd_packages::install_archive(state.runtime.state().as_ref(), &state_dir, data, &how)
                .await
                .map_err(package_error)?;
        return Ok(installed(&done));
    }
    let JsonBody(body) = JsonBody::<PullRequest>::from_request(req, &state)
        .await
        .map_err(|e| {
            if e.status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
                // Two bodies are welcome here; say both.
                ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    code::UNSUPPORTED_MEDIA_TYPE,
                    "send application/json ({\"source\": \"oci://…\"}) to pull, or application/x-tar (a tar of the package directory) to upload",
                )
            } else {
                e
            }
        })?;
    let source = OciRef::parse(&body.source).map_err(package_error)?;
    let opts = RegistryOptions {
        insecure: body.insecure,
        ..RegistryOptions::default()
    };
    let state_dir = state.runtime.dir().join(".plugd");
    let at = plugd_store::now_rfc3339();
    let verify = plugd_runtime::signing::package_verifier(state.config.signing.clone());
    let req = plugd_packages::Request {
        source: &source,
        opts: &opts,
        by: who.by(),
        at: &at,
        verify: &verify,
    };
    let done = plugd_packages::install(state.runtime.state().as_ref(), &state_dir, &req)
        .await
        .map_err(package_error)?;
    Ok(installed(&done))
}

/// 201 with the package for a new install, else 200, with `new` and
/// `restored`.
fn installed(done: &plugd_packages::Installed) -> Response {
    let status = if done.new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut v = serde_json::to_value(&done.package).unwrap_or_else(|_| json!({}));
    v["new"] = done.new.into();
    v["restored"] = done.restored.into();
    (status, Json(v)).into_response()
}

/// Whether the body is a package archive (`application/x-tar`), not JSON.
fn is_archive(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            m.trim()
                .eq_ignore_ascii_case(plugd_packages::ARCHIVE_MEDIA_TYPE)
        })
}

/// The archive body, within the package bound (413 beyond it, declared or
/// sent) and the pull deadline (408).
async fn archive_body(req: axum::extract::Request) -> Result<Vec<u8>, ApiError> {
    let limit = plugd_packages::Limits::default().max_layer_bytes() as usize;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let body = axum::body::to_bytes(req.into_body(), limit);
    match tokio::time::timeout(plugd_packages::install::PULL_DEADLINE, body).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            code::REQUEST_TIMEOUT,
            format!(
                "the package archive did not arrive within {} s",
                plugd_packages::install::PULL_DEADLINE.as_secs()
            ),
        )),
        Ok(Err(_)) => Err(ApiError::too_large(limit)),
        Ok(Ok(bytes)) => Ok(bytes.to_vec()),
    }
}

pub(crate) use crate::error::store_error;

/// The status and code of a package error (its code from plugd-packages,
/// its status from the code's table).
pub fn package_error(e: PackageError) -> ApiError {
    plugd_control::ServiceError::from(e).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_errors_have_fixed_statuses() {
        let cases = [
            (
                PackageError::Reference {
                    input: "x".into(),
                    problem: "p".into(),
                },
                400,
                code::INVALID_SOURCE,
            ),
            (
                PackageError::Tampered {
                    what: "blob",
                    expected: "sha256:a".into(),
                    actual: "sha256:b".into(),
                    reference: "r".into(),
                },
                502,
                code::PACKAGE_TAMPERED,
            ),
            (
                PackageError::Secret {
                    path: ".env".into(),
                    why: "w",
                },
                422,
                code::PACKAGE_REFUSED,
            ),
            (
                PackageError::VersionTaken {
                    package_id: "a/b".into(),
                    version: "1.0.0".into(),
                    installed: "i".into(),
                    source_ref: "s".into(),
                    new: "n".into(),
                },
                409,
                code::PACKAGE_VERSION_TAKEN,
            ),
        ];
        for (e, status, c) in cases {
            let err = package_error(e);
            assert_eq!(err.body()["error"]["code"], c);
            assert_eq!(err.into_response().status().as_u16(), status);
        }
    }
}
