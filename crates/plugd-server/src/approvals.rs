//! Per-call approvals over HTTP: `GET /v1/approvals` lists the calls of
//! `high` and `critical` tools that wait for an operator, and
//! `POST /v1/approvals/{id}:approve` / `:deny` decide one; the waiting
//! `:invoke` (or agent turn) then resumes, or fails with `call_denied`.
//!
//! Unknown ids answer 404 `unknown_approval`; ids decided already (or timed
//! out) answer 409 `approval_already_decided`.

use axum::extract::{Path, State};
use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::{Json, Router};
use plugd_runtime::risk::CallApproval;
use serde::Deserialize;

use crate::{ApiError, AppState, JsonBody};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/approvals", get(list))
        .route("/v1/approvals/{action}", post(decide))
}

async fn list(State(state): State<AppState>) -> Result<Json<Vec<CallApproval>>, ApiError> {
    Ok(Json(state.runtime.pending_approvals()?))
}

/// The body of `POST /v1/approvals/{id}:approve|deny` (both optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    /// Who decides (default `http`).
    #[serde(default)]
    pub by: Option<String>,
    /// Why (`:deny`; shown to the caller).
    #[serde(default)]
    pub reason: Option<String>,
}

async fn decide(
    State(state): State<AppState>,
    Path(action): Path<String>,
    method: Method,
    uri: Uri,
    JsonBody(body): JsonBody<DecideRequest>,
) -> Result<Json<CallApproval>, ApiError> {
    let (id, approve) = match action.rsplit_once(':') {
        Some((id, "approve")) if !id.is_empty() => (id, true),
        Some((id, "deny")) if !id.is_empty() => (id, false),
        _ => return Err(ApiError::no_route(method.as_str(), uri.path())),
    };
    let by = body
        .by
        .as_deref()
        .filter(|b| !b.trim().is_empty())
        .unwrap_or("http");
    let reason = body.reason.as_deref().filter(|r| !r.trim().is_empty());
    let reason = match (approve, reason) {
        (false, None) => Some("denied by an operator through the HTTP API"),
        (_, r) => r,
    };
    Ok(Json(
        state.runtime.decide_approval(id, approve, by, reason)?,
    ))
}
