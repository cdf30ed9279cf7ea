//! `GET /v1/config` and `POST /v1/config`: the plugd.yaml policy in force
//! and a held change ([`plugd_runtime::config_gate`]), and an operator's
//! approval of exactly the held text.

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use plugd_runtime::config_gate::{GateError, GateView};
use serde::Deserialize;

use crate::AppState;
use crate::auth::Identity;
use crate::error::ApiError;

/// Code of a request when serve gates no plugd.yaml (a server built
/// without the gate, as in tests of the router alone).
pub const NOT_GATED: &str = "config_not_gated";
/// Code of an approval that names no held change, or a stale one.
pub const NOTHING_HELD: &str = "config_nothing_held";
/// Code of an approval of a text that is no longer the one held.
pub const STALE: &str = "config_stale";

fn gate(state: &AppState) -> Result<&plugd_runtime::config_gate::ConfigGate, ApiError> {
    state.config_gate.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            NOT_GATED,
            "this server does not gate plugd.yaml (only plugd serve does)",
        )
    })
}

/// `GET /v1/config`.
pub async fn show(State(state): State<AppState>) -> Result<Json<GateView>, ApiError> {
    Ok(Json(gate(&state)?.view()))
}

/// The body of `POST /v1/config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approve {
    /// The `sha256:` digest of the held change being approved.
    pub approve: String,
}

/// `POST /v1/config` `{"approve": "sha256:…"}`.
pub async fn approve(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Json(body): Json<Approve>,
) -> Result<Json<GateView>, ApiError> {
    let gate = gate(&state)?;
    match gate.approve(&body.approve, who.by()).await {
        Ok(view) => Ok(Json(view)),
        Err(e @ GateError::NothingHeld) => Err(ApiError::new(
            StatusCode::CONFLICT,
            NOTHING_HELD,
            e.to_string(),
        )),
        Err(e @ (GateError::Stale { .. } | GateError::ChangedAgain { .. })) => {
            Err(ApiError::new(StatusCode::CONFLICT, STALE, e.to_string()))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "config_unreadable",
            e.to_string(),
        )),
    }
}
