//! The console's login routes: `POST /console/login` (a token or a one-time
//! code for a session cookie), `GET /console/session` (who, and the CSRF
//! token), `POST /console/logout`, and `POST /console/links` (a one-time
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
            tracing::info!(identity = %identity.name, %remote, "console login");
            plugd_console::Login::Token(Zeroizing::new(token.trim().to_owned()))
        }
        (None, Some(code)) => match state.console.redeem_code(code.trim()) {
            Some(name) => {
                tracing::info!(identity = %name, %remote, "console login by a one-time link");
                plugd_console::Login::Owner { name }
            }
            None => {
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
    let Some((id, _)) = state.console.create(login) else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            error::code::SERVER_ERROR,
            "the operating system gave no randomness for a session id".to_owned(),
        )
        .into_response();
    };
    let cookie = plugd_console::set_cookie(&plugd_console::cookie_name(local.port()), &id);
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn session(
    Extension(identity): Extension<Identity>,
    console: Option<Extension<ConsoleSession>>,
) -> Response {
    let mut resp = Json(json!({
        "identity": identity.name,
        "role": identity.role,
        "org_id": identity.tenant.as_ref().map(|t| &t.org_id),
        "csrf": console.map(|Extension(c)| c.csrf),
    }))
    .into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn logout(
    State(state): State<AppState>,
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
    state.console.remove(&c.id);
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&plugd_console::clear_cookie(&c.cookie)) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// `POST /console/links` (admin): a one-time login code for the serve
/// owner, and the path that spends it.
async fn links(State(state): State<AppState>) -> Response {
    match state.console_link_path() {
        Some(path) => (StatusCode::CREATED, Json(json!({"path": path}))).into_response(),
        None => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            error::code::SERVER_ERROR,
            "the operating system gave no randomness for a login code".to_owned(),
        )
        .into_response(),
    }
}

impl AppState {
    /// A fresh one-time login path (`/console/login#code=…`) for the user
    /// serve runs as: what `plugd serve` prints at start and `plugd
    /// console` asks for. The code is in the fragment, so it never reaches
    /// a server log or a `Referer`.
    pub fn console_link_path(&self) -> Option<String> {
        let code = self.console.mint_code(&user_name(self.auth.owner_uid))?;
        Some(format!("/console/login#code={code}"))
    }
}
