//! The console's login routes: `POST /console/login` (a token or a one-time
//! code for a session cookie), `GET /console/session` (who, and the CSRF
//! token), `POST /console/logout` (`204`, or `200 {"redirect"}` naming the
//! provider's `end_session_endpoint` for a single sign-on session), and `POST /console/links` (a one-time
//! login code, admin only; `plugd console` asks for it over the socket).
//! The page and its assets come from `plugd-console`.

use axum::extract::{Extension, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use zeroize::Zeroizing;

use crate::auth::{ConsoleSession, Identity, Peer, token_identity, user_name};
use crate::{ApiError, AppState, error};

/// The routes (the page's own are merged from `plugd_console::assets`).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/login", post(login))
        .route("/console/session", get(session))
        .route("/console/logout", post(logout))
        .route("/console/links", post(links))
        .merge(plugd_console::assets::routes())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    code: Option<String>,
}

async fn login(
    State(state): State<AppState>,
    Extension(peer): Extension<Peer>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Peer::Tcp { remote, local } = peer else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            error::code::BAD_REQUEST,
            "the console is served on the TCP listener (plugd serve --listen ADDR); the socket needs no login".to_owned(),
        )
        .into_response();
    };
    // An object, not serde's other spellings of a struct (an array).
    let body: LoginBody = match serde_json::from_slice::<serde_json::Value>(&body).and_then(|v| {
        if v.is_object() {
            serde_json::from_value(v)
        } else {
            Err(serde::de::Error::custom("the body is not a JSON object"))
        }
    }) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                error::code::INVALID_BODY,
                format!("expected {{\"token\": \"plugd_…\"}} or {{\"code\": \"…\"}}: {e}"),
            )
            .into_response();
        }
    };
    let login = match (body.token, body.code) {
        (Some(token), None) => {
            let token = Zeroizing::new(token);
            let identity = match token_identity(&state, remote, token.trim()).await {
                Ok(i) => i,
                Err(resp) => return resp,
            };
            // A session holds the token's id and checks it again on every
            // request; a delegation token lives only as long as its
            // invocation and opens no session.
            let Some(id) = plugd_store::tokens::token_id(token.trim()) else {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    error::code::BAD_REQUEST,
                    "only an API token (plugd token create) opens a console session".to_owned(),
                )
                .into_response();
            };
            tracing::info!(identity = %identity.name, %remote, "console login");
            plugd_console::Login::Token { id: id.to_owned() }
        }
        (None, Some(code)) => match state.console.redeem_code(code.trim()).await {
            Err(e) => return store_error(e),
            Ok(Some(name)) => {
                tracing::info!(identity = %name, %remote, "console login by a one-time link");
                plugd_console::Login::Owner { name }
            }
            Ok(None) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    error::code::UNAUTHENTICATED,
                    "this login link was used already, has expired (links last 10 minutes) or is not one of this serve's; run `plugd console` for a new one".to_owned(),
                )
                .into_response();
            }
        },
        _ => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                error::code::INVALID_BODY,
                "send exactly one of \"token\" and \"code\"".to_owned(),
            )
            .into_response();
        }
    };
    let id = match state.console.create(login).await {
        Ok((id, _)) => id,
        Err(plugd_console::SessionError::Store(e)) => return store_error(e),
        Err(e) => {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                error::code::SERVER_ERROR,
                e.to_string(),
            )
            .into_response();
        }
    };
    let name = plugd_console::cookie_name_for(
        headers.get(header::HOST).and_then(|h| h.to_str().ok()),
        local.port(),
    );
    let cookie = plugd_console::set_cookie(&name, &id);
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn session(
    State(state): State<AppState>,
    Extension(identity): Extension<Identity>,
    console: Option<Extension<ConsoleSession>>,
) -> Response {
    let mut resp = Json(json!({
        "identity": identity.name,
        "role": identity.role,
        "org_id": identity.tenant.as_ref().map(|t| &t.org_id),
        "csrf": console.map(|Extension(c)| c.csrf),
        // plugd.yaml's `console.trace_url`: where a trace id links.
        "trace_url": state.config.console.trace_url,
    }))
    .into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn logout(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    console: Option<Extension<ConsoleSession>>,
) -> Response {
    let Some(Extension(c)) = console else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            error::code::BAD_REQUEST,
            "only a console session logs out; a bearer token is revoked with `plugd token revoke`"
                .to_owned(),
        )
        .into_response();
    };
    // A single sign-on session ends at its provider too when the provider
    // offers an `end_session_endpoint`: the page goes there next.
    let issuer = match state.console.get(&c.id).await {
        Ok(Some(plugd_console::sessions::Session {
            login:
                plugd_console::Login::Oidc {
                    issuer: Some(issuer),
                    ..
                },
            ..
        })) => Some(issuer),
        _ => None,
    };
    if let Err(e) = state.console.remove(&c.id).await {
        return store_error(e);
    }
    let redirect = match (&state.oidc, issuer) {
        (Some(oidc), Some(issuer)) => crate::oidc::logout_url(oidc, &headers, &c.id, &issuer).await,
        _ => None,
    };
    let mut resp = match redirect {
        Some(url) => Json(json!({ "redirect": url })).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    };
    if let Ok(v) = HeaderValue::from_str(&plugd_console::clear_cookie(&c.cookie)) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// `POST /console/links` (admin): a one-time login code for the serve
/// owner, and the path that spends it.
async fn links(State(state): State<AppState>) -> Response {
    match state.console_link_path().await {
        Ok(path) => (StatusCode::CREATED, Json(json!({"path": path}))).into_response(),
        Err(plugd_console::SessionError::Store(e)) => store_error(e),
        Err(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            error::code::SERVER_ERROR,
            e.to_string(),
        )
        .into_response(),
    }
}

/// A failure of the state store as the API's error (503 `store_unavailable`
/// when the database is unreachable).
fn store_error(e: plugd_store::StoreError) -> Response {
    crate::error::store_error(e).into_response()
}

impl AppState {
    /// A fresh one-time login path (`/console/login#code=…`) for the user
    /// serve runs as: what `plugd serve` prints at start and `plugd
    /// console` asks for. The code is in the fragment, so it never reaches
    /// a server log or a `Referer`.
    pub async fn console_link_path(&self) -> Result<String, plugd_console::SessionError> {
        let code = self
            .console
            .mint_code(&user_name(self.auth.owner_uid))
            .await?;
        Ok(format!("/console/login#code={code}"))
    }
}
