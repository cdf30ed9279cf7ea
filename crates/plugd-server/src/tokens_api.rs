//! API tokens over HTTP, what `plugd token create|list|revoke` does, for
//! the console's tokens page. Admin only, reads included (a viewer gets
//! 403 `forbidden`; a token bound to an org gets 404, as on every route
//! outside its org's).
//!
//! | route | answer |
//! |-------|--------|
//! | `GET /v1/tokens` | `{"tokens": [TokenInfo…]}`, every token, revoked ones too, oldest first; never a secret (only hashes are stored) |
//! | `POST /v1/tokens` | body `{"name", "role", "expires_in"?, "org"?, "projects"?}` → 201 `{"id", "name", "role", "token", "expires_at"}`: the secret, shown this once |
//! | `POST /v1/tokens/{id_or_name}:revoke` | `{}` → the token's record, revoked (revoking twice keeps the first time) |
//!
//! `expires_in` takes what `plugd token create --expires` takes (`30m`,
//! `12h`, `90d`, `2w`; absent: until revoked); `org` and `projects` bind
//! the token as `--org` and `--project` do. The checks are plugd-control's
//! (`plugd_control::store::tokens`), the CLI's too. The token is made by
//! the caller's identity (`created_by`), never by a name in the body.
//!
//! Errors: a missing or bad `name`, `role`, `expires_in`, `org` or
//! `projects` → 400 `bad_request` with `details.field`; a member not listed
//! above → 422 `invalid_body`; a live token of that name → 409
//! `token_exists`; no token of that id or name → 404 `unknown_token`.

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use plugd_store::tokens::{self, BadTokenField};
use serde::Deserialize;
use serde_json::json;

use crate::auth::Identity;
use crate::error::code;
use crate::packages::store_error;
use crate::{ApiError, AppState, JsonBody};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/tokens", get(list).post(create))
        .route("/v1/tokens/{*action}", post(action))
}

/// The body of `POST /v1/tokens`. Every member is optional to serde so
/// that a missing one is a 400 naming it, like a bad one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// Unique among live tokens; requests are recorded under it.
    #[serde(default)]
    pub name: Option<String>,
    /// `viewer`, `agent`, `operator` or `admin`.
    #[serde(default)]
    pub role: Option<String>,
    /// How long it works (`30d`, `12h`); absent: until revoked.
    #[serde(default)]
    pub expires_in: Option<String>,
    /// The org it is bound to.
    #[serde(default)]
    pub org: Option<String>,
    /// The projects of `org` it is limited to.
    #[serde(default)]
    pub projects: Option<Vec<String>>,
}

/// The body of `POST /v1/tokens/{id}:revoke`: `{}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {}

/// 400 `bad_request` naming the field (`details.field`).
fn bad_field(e: BadTokenField) -> ApiError {
    // The body's names: `expires_in`, not the CLI's `--expires`.
    let field = if e.field == "expires" {
        "expires_in"
    } else {
        e.field
    };
    ApiError::new(
        StatusCode::BAD_REQUEST,
        code::BAD_REQUEST,
        format!("{field}: {}", e.message),
    )
    .with_details(json!({ "field": field }))
}

fn missing(field: &'static str, what: &str) -> ApiError {
    bad_field(BadTokenField {
        field,
        message: format!("is required; {what}"),
    })
}

async fn list(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let all = state
        .runtime
        .state()
        .token_list()
        .await
        .map_err(store_error)?;
    Ok(Json(json!({ "tokens": all })))
}

async fn create(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    JsonBody(body): JsonBody<CreateRequest>,
) -> Result<Response, ApiError> {
    let name = body
        .name
        .ok_or_else(|| missing("name", "name the token (1 to 128 printable characters)"))?;
    tokens::check_token_name(&name).map_err(bad_field)?;
    let role = body
        .role
        .ok_or_else(|| missing("role", "use admin, operator, agent or viewer"))?;
    let role = tokens::parse_role(&role).map_err(bad_field)?;
    let lifetime = body
        .expires_in
        .as_deref()
        .map(tokens::parse_lifetime)
        .transpose()
        .map_err(bad_field)?;
    let tenancy = tokens::check_scope(
        body.org.as_deref(),
        body.projects.as_deref().unwrap_or_default(),
    )
    .map_err(bad_field)?;
    let expires_at_ms = lifetime.map(|d| tokens::expires_at_ms(plugd_store::outbox::now_ms(), d));
    let made = state
        .runtime
        .state()
        .token_create_scoped(
            &name,
            role,
            expires_at_ms,
            who.by(),
            None,
            tenancy.as_ref(),
        )
        .await
        .map_err(|e| match e {
            plugd_store::StoreError::Conflict(_) => ApiError::new(
                StatusCode::CONFLICT,
                code::TOKEN_EXISTS,
                format!(
                    "a live token named {name:?} exists; revoke it (POST /v1/tokens/{name}:revoke) or pick another name"
                ),
            )
            .with_details(json!({ "field": "name" })),
            e => store_error(e),
        })?;
    let answer = json!({
        "id": made.info.id,
        "name": made.info.name,
        "role": made.info.role,
        "token": made.token,
        "expires_at": made.info.expires_at,
    });
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

async fn action(
    State(state): State<AppState>,
    Path(path): Path<String>,
    method: Method,
    uri: Uri,
    JsonBody(_body): JsonBody<RevokeRequest>,
) -> Result<Json<tokens::TokenInfo>, ApiError> {
    let Some((id, "revoke")) = crate::auth::action_of(&path).filter(|(id, _)| !id.is_empty())
    else {
        return Err(ApiError::no_route(method.as_str(), uri.path()));
    };
    let revoked = state
        .runtime
        .state()
        .token_revoke(id)
        .await
        .map_err(store_error)?;
    revoked.map(Json).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            code::UNKNOWN_TOKEN,
            format!("no token with id or name {id:?}; GET /v1/tokens lists them"),
        )
    })
}
