//! The marketplace over HTTP; the install step and the catalog views are
//! plugd-governance's ([`plugd_governance::marketplace_install`]), shared
//! with `plugd marketplace install`:
//!
//! | route | right |
//! |-------|-------|
//! | `GET /v1/marketplace` | viewer (org tokens too) |
//! | `GET /v1/marketplace/{entry_id}` | viewer (org tokens too) |
//! | `POST /v1/marketplace/{entry_id}:install` (`{"org_id", "project_id"?, "config"?, "secrets"?}`) | operator |
//!
//! Install = pull the entry's OCI reference by its pinned digest (digest
//! and signature verified, the signature per the mode and trust policy),
//! then create, or update when one exists, a binding of each of the
//! entry's exports in the scope, through the checks of
//! [`plugd_governance::bindings`].
//! Nothing here calls a plugin: execution still flows through the ordinary
//! contracts. A token bound to an org installs only into its own org
//! (another org answers 404, as everywhere).
//!
//! Errors: no `marketplace:` in plugd.yaml → 503
//! `marketplace_not_configured`; an index that cannot be read or fails its
//! checks (signature, trusted key, entries, size) → 502
//! `marketplace_index_refused`, naming the cause; an unknown entry → 404
//! `unknown_entry`; a contract-ready entry, or one the mode refuses → 409
//! `entry_not_installable`, naming why; a package whose signature is refused
//! → 422 `signature_refused`; a package that lacks an export its entry
//! names → 422 `entry_mismatch`; the package and binding errors otherwise.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use plugd_governance::marketplace_install::{
    InstallRequest, Installer, catalog_view, entry_view, find, install, load,
};
use serde_json::Value;

use crate::auth::Identity;
use crate::{ApiError, AppState, JsonBody};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/marketplace", get(list))
        .route("/v1/marketplace/{id}", get(show).post(action))
}

async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let index = load(state.config.marketplace.as_ref(), &state.config.signing).await?;
    Ok(Json(catalog_view(&state.config.signing, &index)))
}

async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let index = load(state.config.marketplace.as_ref(), &state.config.signing).await?;
    let entry = find(&index, &id)?;
    Ok(Json(entry_view(&state.config.signing, index.mode, entry)))
}

/// `POST /v1/marketplace/{entry_id}:install`.
async fn action(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<InstallRequest>,
) -> Result<Response, ApiError> {
    let Some((entry_id, "install")) = crate::auth::action_of(&id) else {
        return Err(ApiError::no_route("POST", &format!("/v1/marketplace/{id}")));
    };
    let state_dir = state.runtime.dir().join(".plugd");
    let installer = Installer {
        store: state.runtime.state().as_ref(),
        state_dir: &state_dir,
        marketplace: state.config.marketplace.as_ref(),
        signing: &state.config.signing,
        by: who.by(),
        tenant: who.tenant.as_ref(),
    };
    let done = install(&installer, entry_id, req).await?;
    let status = if done.package_new || done.bindings.iter().any(|(_, c)| *c) {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(done.to_json())).into_response())
}

#[cfg(test)]
mod tests {
    use plugd_control::ServiceError;
    use plugd_runtime::marketplace::IndexError;

    use super::*;
    use crate::error::code;

    #[test]
    fn index_errors_have_fixed_statuses() {
        let cases = [
            (
                IndexError::NotConfigured,
                503,
                code::MARKETPLACE_NOT_CONFIGURED,
            ),
            (
                IndexError::BadSignature {
                    location: "i.json".into(),
                    key_id: "00".into(),
                },
                502,
                code::MARKETPLACE_INDEX_REFUSED,
            ),
            (
                IndexError::TooLarge {
                    location: "i.json".into(),
                },
                502,
                code::MARKETPLACE_INDEX_REFUSED,
            ),
        ];
        for (e, status, c) in cases {
            let err = ApiError::from(ServiceError::from(e));
            assert_eq!(err.body()["error"]["code"], c);
            assert_eq!(err.into_response().status().as_u16(), status);
        }
    }
}
