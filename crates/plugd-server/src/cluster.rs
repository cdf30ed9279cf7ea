//! The cluster over HTTP: `GET /v1/cluster` (viewer) lists the live nodes with their versions, schema, key id, configuration digest and leases held; `GET /readyz` (no credentials, for load balancers) answers 503 while this node cannot reach the state store or runs another plugd.yaml than the cluster.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::error::store_error;
use crate::{ApiError, AppState};

/// How long `/readyz` waits for the state store before answering 503.
const READY_STORE_WAIT: Duration = Duration::from_secs(2);

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/cluster", get(cluster))
        .route("/readyz", get(readyz))
}

/// The digest of the plugd.yaml text this node has in force (`-` outside
/// serve, where nothing gates it).
fn own_config(state: &AppState) -> String {
    state
        .config_gate
        .as_ref()
        .map_or_else(|| "-".to_owned(), |g| g.view().in_force)
}

async fn cluster(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let rt = &state.runtime;
    let view = plugd_control::cluster::status(&**rt.state())
        .await
        .map_err(store_error)?;
    Ok(Json(json!({
        "this_node": rt.node_id(),
        "config_digest": view.config_digest,
        "nodes": view.nodes,
    })))
}

async fn readyz(State(state): State<AppState>) -> Response {
    let rt = &state.runtime;
    let unready = |reason: String| {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unready", "node": rt.node_id(), "reason": reason})),
        )
            .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    };
    let view = match tokio::time::timeout(
        READY_STORE_WAIT,
        plugd_control::cluster::status(&**rt.state()),
    )
    .await
    {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return unready(format!("the state store cannot be read: {e}")),
        Err(_) => {
            return unready(format!(
                "the state store did not answer within {} s",
                READY_STORE_WAIT.as_secs()
            ));
        }
    };
    let config = own_config(&state);
    match plugd_control::cluster::readiness(&view, rt.node_id(), &config) {
        Ok(()) => Json(json!({"status": "ready", "node": rt.node_id(), "config_digest": config}))
            .into_response(),
        Err(reason) => unready(reason),
    }
}
