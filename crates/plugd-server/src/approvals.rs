//! Per-call approvals over HTTP: `GET /v1/approvals` lists the calls of
//! `high` and `critical` tools that wait for an operator, and
//! `POST /v1/approvals/{id}:approve` / `:deny` decide one; the waiting
//! `:invoke` (or agent turn) then resumes, or fails with `call_denied`.
//!
//! Unknown ids answer 404 `unknown_approval`; ids decided already (or timed
//! out) answer 409 `approval_already_decided`.

use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use plugd_runtime::risk::CallApproval;
use serde::Deserialize;

use crate::paging::PageQuery;
use crate::{ApiError, AppState, JsonBody};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/approvals", get(list))
        .route("/v1/approvals/{action}", post(decide))
}

/// The pending calls: the bare array, or a page of them with
/// [`crate::paging`]'s parameters (filters `risk`, `plugin`, `tool`).
async fn list(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let paging = PageQuery::parse(crate::paging::APPROVALS, query.as_deref())?;
    let rows: Vec<CallApproval> = state.runtime.pending_approvals().await?;
    if !paging.paged() {
        return Ok(Json(rows).into_response());
    }
    Ok(Json(paging.answer(crate::paging::rows_json(&rows)?)).into_response())
}

/// The body of `POST /v1/approvals/{id}:approve|deny` (both optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    /// Ignored (kept so older clients' bodies still parse): who decides is
    /// the authenticated identity.
    #[serde(default)]
    pub by: Option<String>,
    /// Why (`:deny`; shown to the caller). For an MCP server's question,
    /// `:deny` with reason `cancel` answers `cancel` (else `decline`).
    #[serde(default)]
    pub reason: Option<String>,
    /// The answer to an MCP server's question (`:approve` of an
    /// `elicitation/create` record): a JSON object matching its requested
    /// schema, checked before it is recorded.
    #[serde(default)]
    pub content: Option<serde_json::Value>,
}

async fn decide(
    State(state): State<AppState>,
    Path(action): Path<String>,
    method: Method,
    uri: Uri,
    axum::Extension(who): axum::Extension<crate::auth::Identity>,
    JsonBody(body): JsonBody<DecideRequest>,
) -> Result<Json<CallApproval>, ApiError> {
    let (id, approve) = match crate::auth::action_of(&action) {
        Some((id, "approve")) if !id.is_empty() => (id, true),
        Some((id, "deny")) if !id.is_empty() => (id, false),
        _ => return Err(ApiError::no_route(method.as_str(), uri.path())),
    };
    let by = who.by();
    let content = body.content.as_ref().map(|c| c.to_string());
    let reason = match (approve, &content) {
        (true, Some(c)) => Some(c.as_str()),
        _ => body.reason.as_deref().filter(|r| !r.trim().is_empty()),
    };
    let reason = match (approve, reason) {
        (false, None) => Some("denied by an operator through the HTTP API"),
        (_, r) => r,
    };
    Ok(Json(
        state
            .runtime
            .decide_approval(id, approve, by, reason)
            .await?,
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use plugd_host::HostConfig;
    use plugd_runtime::config::PlugdConfig;
    use plugd_runtime::hooks::Pipeline;
    use plugd_store::tool_state::NewCallApproval;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    use crate::{AppState, router};

    async fn send(app: &Router, method: &str, uri: &str, body: &str) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .extension(crate::auth::Peer::local_owner())
            .body(Body::from(body.to_owned()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn approvals_answer_with_fixed_statuses_and_codes() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = plugd_agent::open(tmp.path(), HostConfig::default())
            .await
            .unwrap();
        let pending = rt
            .state()
            .call_approval_request(&NewCallApproval {
                tool: "p/t".into(),
                plugin_id: "p".into(),
                risk: "critical".into(),
                args_preview: "{}".into(),
                expires_at_ms: plugd_store::outbox::now_ms() + 60_000,
                ..NewCallApproval::default()
            })
            .await
            .unwrap();
        let state = AppState::new(
            rt,
            Arc::new(Pipeline::default()),
            Arc::new(PlugdConfig::default()),
            None,
        );
        let app = router(state);
        let (s, v) = send(&app, "GET", "/v1/approvals", "").await;
        assert_eq!((s, v[0]["id"].clone()), (StatusCode::OK, json!(pending.id)));
        let path = format!("/v1/approvals/{}:deny", pending.id);
        let (s, v) = send(&app, "POST", &path, "{\"by\": ").await;
        assert_eq!(
            (s, v["error"]["code"].clone()),
            (StatusCode::BAD_REQUEST, json!("malformed_json"))
        );
        // A `by` in the body is not who decided: the socket peer's user is.
        let (s, v) = send(&app, "POST", &path, "{\"by\": \"ana\"}").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let me = crate::auth::user_name(rustix::process::geteuid().as_raw());
        assert_eq!(
            (v["state"].clone(), v["decided_by"].clone()),
            (json!("denied"), json!(me))
        );
        let (s, v) = send(&app, "POST", &path, "{}").await;
        assert_eq!(
            (s, v["error"]["code"].clone()),
            (StatusCode::CONFLICT, json!("approval_already_decided")),
            "{v}"
        );
        let (s, v) = send(&app, "POST", "/v1/approvals/apr_x:approve", "{}").await;
        assert_eq!(
            (s, v["error"]["code"].clone()),
            (StatusCode::NOT_FOUND, json!("unknown_approval")),
            "{v}"
        );
        let (s, v) = send(&app, "POST", "/v1/approvals/apr_x:maybe", "{}").await;
        assert_eq!(
            (s, v["error"]["code"].clone()),
            (StatusCode::NOT_FOUND, json!("not_found")),
            "{v}"
        );
        let (s, _) = send(&app, "GET", "/v1/approvals", "").await;
        assert_eq!(s, StatusCode::OK);
    }
}
