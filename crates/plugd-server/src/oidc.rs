//! plugd.yaml `auth:` on serve: JWT access tokens of the configured issuers
//! as identities on `/mcp` and the API (beside `plugd_…` tokens), the
//! protected resource metadata (RFC 9728) at
//! `/.well-known/oauth-protected-resource[/mcp]`, the `401` challenge that
//! points MCP clients at it, and the console's single sign-on routes
//! (`/console/sso`, `/console/sso/start`, `/console/sso/callback`).
//!
//! Tokens are validated by `plugd-oidc` (signature with the issuer's JWKS,
//! `alg` allow-list, `iss`, `aud`, `exp`/`nbf`); the groups claim maps to a
//! role through `auth.role_mapping`, first match wins, and a token in no
//! mapped group is refused (`403`). That entry's `org`/`project`, else the
//! issuer's `org_claim`/`project_claim`, make the identity an org identity
//! (`Identity::tenant`, as an `--org` token); an org claim naming an org no
//! binding names is refused (`403`), never widened to the workspace. Every
//! refusal is logged with its cause, never with the token. Without
//! `auth.issuers` nothing here is reachable (`404`) and nothing changes.
//! A console logout of a single sign-on session goes on to the provider's
//! `end_session_endpoint` ([`logout_url`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use plugd_runtime::auth_config::AuthConfig;
use plugd_store::tokens::{Role, Tenancy};
use serde_json::json;

use crate::auth::{Identity, Peer};
use crate::{ApiError, AppState, error};

/// The path of the protected resource metadata (RFC 9728).
pub const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// How long a console sign-in may take between the redirect and the
/// callback.
const LOGIN_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// Sign-ins under way kept at most (the oldest goes first).
const MAX_LOGINS: usize = 256;

/// How long a refused token waits before its answer.
const FAILURE_DELAY: Duration = Duration::from_millis(100);

/// serve's `auth:`: the validator with its key caches, the role mapping,
/// and the console's sign-ins under way.
pub struct Oidc {
    /// Validates tokens of the configured issuers.
    pub validator: plugd_oidc::Validator,
    /// plugd.yaml `auth:`.
    pub config: AuthConfig,
    logins: Mutex<HashMap<String, (plugd_oidc::sso::Login, Instant)>>,
    /// The ID tokens of this node's single sign-on sessions, by session
    /// id, with their `exp`: the `id_token_hint` of their logout. Held in
    /// memory only (never stored): a session logged out through another
    /// node, or after a restart, logs out at the provider without it.
    id_tokens: Mutex<HashMap<String, (String, u64)>>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("validator", &self.validator)
            .finish_non_exhaustive()
    }
}

impl Oidc {
    /// serve's `auth:` when it lists issuers (`None`: plugd tokens only).
    pub fn from_config(config: &AuthConfig) -> Option<Arc<Oidc>> {
        if config.issuers.is_empty() {
            return None;
        }
        let specs = config
            .issuers
            .iter()
            .map(|i| plugd_oidc::IssuerSpec {
                issuer: i.issuer.clone(),
                audiences: std::iter::once(i.audience.clone())
                    .chain(config.resource.clone())
                    .collect(),
                groups_claim: i.groups_claim.clone(),
                org_claim: i.org_claim.clone(),
                project_claim: i.project_claim.clone(),
            })
            .collect();
        match plugd_oidc::Validator::new(specs) {
            Ok(validator) => Some(Arc::new(Oidc {
                validator,
                config: config.clone(),
                logins: Mutex::new(HashMap::new()),
                id_tokens: Mutex::new(HashMap::new()),
            })),
            Err(e) => {
                // Fail closed: no token of an issuer is accepted.
                tracing::error!(error = %e, "auth.issuers: cannot make the HTTP client that fetches issuers' keys; their tokens are refused");
                None
            }
        }
    }

    /// The role and tenancy `name` gets from its `groups` and the org and
    /// project claims its issuer names (`org_claim`, `project_claim`), or
    /// why it gets none. The first `role_mapping` entry whose group it is in
    /// decides the role, and the org and project when the entry names
    /// them; a claim names them otherwise. A claim that disagrees with the
    /// entry, or is not an id, is refused. The `bool`: the org came from a
    /// claim (and must be known to the store, see [`identity`]).
    pub fn mapped(
        &self,
        name: &str,
        groups: &[String],
        org_claim: Option<&str>,
        project_claim: Option<&str>,
    ) -> Result<(Role, Option<Tenancy>, bool), String> {
        let Some(m) = self.config.mapping_for(groups) else {
            return Err(format!(
                "{name} is in none of the groups plugd.yaml auth.role_mapping gives a role (its groups: [{}]); ask an administrator to map one of them",
                groups.join(", ")
            ));
        };
        let role: Role = m.role.parse().map_err(|_| format!("role {:?}", m.role))?;
        for (what, v) in [("org", org_claim), ("project", project_claim)] {
            if let Some(v) = v
                && !plugd_control::bindings::is_valid_name(v)
            {
                return Err(format!(
                    "{name}'s {what} claim {:?} is not an id; {}",
                    v.chars().take(80).collect::<String>(),
                    plugd_control::bindings::NAME_RULE
                ));
            }
        }
        let disagree = |what: &str, mapped: &str, claimed: &str| {
            format!(
                "{name}'s {what} claim {claimed:?} disagrees with the {mapped:?} plugd.yaml auth.role_mapping gives group {:?}; ask an administrator to align them",
                m.group
            )
        };
        let (org, from_claim) = match (m.org.as_deref(), org_claim) {
            (Some(mapped), Some(claimed)) if mapped != claimed => {
                return Err(disagree("org", mapped, claimed));
            }
            (Some(mapped), _) => (Some(mapped), false),
            (None, Some(claimed)) => (Some(claimed), true),
            (None, None) => (None, false),
        };
        let project = match (m.project.as_deref(), project_claim) {
            (Some(mapped), Some(claimed)) if mapped != claimed => {
                return Err(disagree("project", mapped, claimed));
            }
            (Some(mapped), _) => Some(mapped),
            (None, claimed) => claimed,
        };
        if org.is_none()
            && let Some(p) = project
        {
            return Err(format!(
                "{name}'s project claim {p:?} names no org (no org claim, and the mapping of group {:?} names none)",
                m.group
            ));
        }
        let tenant = org.map(|o| Tenancy {
            org_id: o.to_owned(),
            project_ids: project.map(str::to_owned).into_iter().collect(),
        });
        Ok((role, tenant, from_claim))
    }

    fn id_tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, u64)>> {
        self.id_tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the ID token of console session `id` until its `exp` (at most
    /// [`MAX_LOGINS`] times 16 of them; the expired go first, then the
    /// soonest to expire).
    fn keep_id_token(&self, id: &str, token: String, expires_at: u64) {
        let mut tokens = self.id_tokens();
        let now = now_secs();
        tokens.retain(|_, (_, exp)| *exp > now);
        if tokens.len() >= MAX_LOGINS * 16
            && let Some(first) = tokens
                .iter()
                .min_by_key(|(_, (_, exp))| *exp)
                .map(|(k, _)| k.clone())
        {
            tokens.remove(&first);
        }
        tokens.insert(id.to_owned(), (token, expires_at));
    }

    fn logins(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (plugd_oidc::sso::Login, Instant)>> {
        self.logins.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `token` is for the JWT path (not a plugd or delegation token).
pub fn is_jwt(token: &str) -> bool {
    !token.starts_with("plugd_") && !token.starts_with(plugd_control::delegation::TOKEN_PREFIX)
}

/// The identity of JWT access token `token`: `401` (after a fixed delay)
/// when it is refused, `403` when its groups map to no role or its org
/// claim names an org the store does not know.
pub(crate) async fn jwt_identity(
    state: &AppState,
    oidc: &Oidc,
    remote: SocketAddr,
    token: &str,
) -> Result<Identity, Response> {
    let verified = match oidc.validator.validate(token).await {
        Ok(v) => v,
        Err(why) => {
            tracing::warn!(%remote, cause = why.cause(), reason = %why, "refused a JWT access token");
            tokio::time::sleep(FAILURE_DELAY).await;
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                error::code::UNAUTHENTICATED,
                format!("the bearer token was refused: {why}"),
            )
            .into_response());
        }
    };
    let claims = Claims::of(&verified);
    let mut identity = identity(state, oidc, &claims).await.map_err(|e| {
        tracing::warn!(%remote, identity = %claims.name, cause = e.cause(), reason = %e, "refused a JWT access token");
        e.into_response()
    })?;
    identity.user = Some(plugd_host::dialect::UserToken::new(
        &identity.name,
        &verified.issuer,
        token,
    ));
    Ok(identity)
}

/// What decides an OIDC identity once its token is valid: its name,
/// groups, and the org and project claims its issuer names.
#[derive(Debug, Clone)]
pub(crate) struct Claims {
    pub(crate) name: String,
    pub(crate) groups: Vec<String>,
    pub(crate) org: Option<String>,
    pub(crate) project: Option<String>,
}

impl Claims {
    pub(crate) fn of(v: &plugd_oidc::Verified) -> Claims {
        Claims {
            name: v.name(),
            groups: v.groups.clone(),
            org: v.org.clone(),
            project: v.project.clone(),
        }
    }
}

/// Why an OIDC identity is refused once its token is valid.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Its groups map to no role, or its claims to no usable tenancy
    /// (`403`).
    Mapping(String),
    /// Its org claim names an org the store does not know (`403`).
    UnknownOrg(String),
    /// The store could not be asked.
    Store(ApiError),
}

impl Refused {
    fn cause(&self) -> &'static str {
        match self {
            Refused::Mapping(_) => "no_role",
            Refused::UnknownOrg(_) => "unknown_org",
            Refused::Store(_) => "store",
        }
    }

    fn into_response(self) -> Response {
        match self {
            Refused::Mapping(m) | Refused::UnknownOrg(m) => {
                ApiError::new(StatusCode::FORBIDDEN, error::code::FORBIDDEN, m).into_response()
            }
            Refused::Store(e) => e.into_response(),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Mapping(m) | Refused::UnknownOrg(m) => f.write_str(m),
            Refused::Store(e) => f.write_str(&e.message),
        }
    }
}

/// The identity `claims` stand for ([`Oidc::mapped`]), an org named by a
/// claim checked against the store: one no binding names is refused,
/// never widened to the workspace.
pub(crate) async fn identity(
    state: &AppState,
    oidc: &Oidc,
    claims: &Claims,
) -> Result<Identity, Refused> {
    let (role, tenant, from_claim) = oidc
        .mapped(
            &claims.name,
            &claims.groups,
            claims.org.as_deref(),
            claims.project.as_deref(),
        )
        .map_err(Refused::Mapping)?;
    if from_claim && let Some(t) = &tenant {
        let known =
            plugd_governance::bindings::org_known(state.runtime.state().as_ref(), &t.org_id)
                .await
                .map_err(|e| Refused::Store(ApiError::from(e)))?;
        if !known {
            return Err(Refused::UnknownOrg(format!(
                "{}'s org claim names org {:?}, which plugd does not know (no binding names it); ask an administrator to bind a package in it or to correct the claim",
                claims.name, t.org_id
            )));
        }
    }
    Ok(Identity {
        name: claims.name.clone(),
        role,
        mcp_profiles: None,
        tenant,
        delegation: None,
        groups: claims.groups.clone(),
        user: None,
    })
}

/// This server's resource identifier: `auth.resource`, else the
/// listener's own `/mcp` URL (from `Host`).
pub fn resource(oidc: &Oidc, headers: &HeaderMap) -> String {
    if let Some(r) = &oidc.config.resource {
        return r.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}/mcp")
}

/// Where browsers reach this server: the origin of `auth.resource` (behind
/// a TLS-terminating proxy, its https address), else `http://HOST`.
fn public_origin(oidc: &Oidc, headers: &HeaderMap) -> String {
    if let Some(u) = oidc
        .config
        .resource
        .as_deref()
        .and_then(|r| url::Url::parse(r).ok())
    {
        return u.origin().ascii_serialization();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// The URL of the metadata document of `resource` (RFC 9728 §3.1: the
/// well-known path between the origin and the resource's path).
pub fn metadata_url(resource: &str) -> String {
    match url::Url::parse(resource) {
        Ok(u) => {
            let path = u.path().trim_end_matches('/');
            let mut origin = u.clone();
            origin.set_path("");
            origin.set_query(None);
            origin.set_fragment(None);
            format!(
                "{}{WELL_KNOWN}{path}",
                origin.as_str().trim_end_matches('/')
            )
        }
        Err(_) => format!("{resource}{WELL_KNOWN}"),
    }
}

/// Puts the challenge of RFC 9728 §5.1 on a `401`: `Bearer
/// resource_metadata="…"`, with `error="invalid_token"` when a token was
/// sent and refused.
pub(crate) fn challenge(oidc: &Oidc, headers: &HeaderMap, mut resp: Response) -> Response {
    if resp.status() != StatusCode::UNAUTHORIZED {
        return resp;
    }
    let url = metadata_url(&resource(oidc, headers));
    let mut value = format!("Bearer realm=\"plugd\", resource_metadata=\"{url}\"");
    if headers.contains_key(header::AUTHORIZATION) {
        value.push_str(", error=\"invalid_token\"");
    }
    if let Ok(v) = HeaderValue::from_str(&value) {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    resp
}

/// The routes: the metadata document and the console's sign-in.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(WELL_KNOWN, get(protected_resource))
        .route(&format!("{WELL_KNOWN}/{{*path}}"), get(protected_resource))
        .route("/console/sso", get(sso_providers))
        .route("/console/sso/start", get(sso_start))
        .route("/console/sso/callback", get(sso_callback))
}

/// Whether `path` is one of this module's public routes.
pub fn is_public(path: &str) -> bool {
    path == WELL_KNOWN || path.starts_with(&format!("{WELL_KNOWN}/"))
}

/// `GET /.well-known/oauth-protected-resource[/PATH]`.
async fn protected_resource(
    State(state): State<AppState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let Some(oidc) = &state.oidc else {
        return ApiError::no_route("GET", uri.path()).into_response();
    };
    let resource = resource(oidc, &headers);
    // The path-suffixed form names the resource's own path only.
    if let Some(rest) = uri.path().strip_prefix(WELL_KNOWN)
        && !rest.is_empty()
    {
        let own = url::Url::parse(&resource)
            .map(|u| u.path().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        if rest.trim_end_matches('/') != own {
            return ApiError::no_route("GET", uri.path()).into_response();
        }
    }
    let mut doc = json!({
        "resource": resource,
        "authorization_servers": oidc.config.issuers.iter().map(|i| &i.issuer).collect::<Vec<_>>(),
        "bearer_methods_supported": ["header"],
        "resource_name": "plugd",
    });
    if !oidc.config.scopes_supported.is_empty() {
        doc["scopes_supported"] = json!(oidc.config.scopes_supported);
    }
    let mut resp = Json(doc).into_response();
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    resp
}

/// `GET /console/sso`: the issuers the console offers a sign-in with.
async fn sso_providers(State(state): State<AppState>) -> Response {
    let providers: Vec<_> = state
        .oidc
        .iter()
        .flat_map(|o| o.config.issuers.iter().enumerate())
        .filter(|(_, i)| i.client_id.is_some())
        .map(|(n, i)| {
            let host = url::Url::parse(&i.issuer)
                .ok()
                .and_then(|u| {
                    Some(match u.port() {
                        Some(p) => format!("{}:{p}", u.host_str()?),
                        None => u.host_str()?.to_owned(),
                    })
                })
                .unwrap_or_else(|| i.issuer.clone());
            json!({"issuer": i.issuer, "name": host, "start": format!("/console/sso/start?issuer={n}")})
        })
        .collect();
    let mut resp = Json(json!({ "providers": providers })).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The decoded pairs of a query string.
fn query_pairs(raw: Option<&str>) -> HashMap<String, String> {
    url::form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .take(16)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The cookie binding a sign-in to the browser that started it.
fn login_cookie_name(headers: &HeaderMap, local: SocketAddr) -> String {
    format!(
        "{}_sso",
        plugd_console::cookie_name_for(
            headers.get(header::HOST).and_then(|h| h.to_str().ok()),
            local.port(),
        )
    )
}

fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let body = format!(
        "<!doctype html><meta charset=utf-8><title>{t}</title><main id=sso-result><h1>{t}</h1><p id=sso-message>{m}</p><p><a href=\"/console/login\">Back to the login page</a></p></main>",
        t = esc(title),
        m = esc(message)
    );
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
    );
    resp
}

/// `GET /console/sso/start?issuer=N`: redirects to the issuer's
/// authorization endpoint (code flow, PKCE S256, state and nonce).
async fn sso_start(
    State(state): State<AppState>,
    Extension(peer): Extension<Peer>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = query_pairs(raw.as_deref());
    let number = q
        .get("issuer")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let Peer::Tcp { local, .. } = peer else {
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in unavailable",
            "the console is served on the TCP listener (plugd serve --listen ADDR)",
        );
    };
    let Some(oidc) = &state.oidc else {
        return ApiError::no_route("GET", "/console/sso/start").into_response();
    };
    let Some((issuer, client_id)) = oidc
        .config
        .issuers
        .get(number)
        .and_then(|i| Some((i.issuer.clone(), i.client_id.clone()?)))
    else {
        return page(
            StatusCode::NOT_FOUND,
            "Sign-in unavailable",
            "no issuer of plugd.yaml auth.issuers with a client_id has that number",
        );
    };
    let redirect_uri = format!("{}/console/sso/callback", public_origin(oidc, &headers));
    let login =
        match plugd_oidc::sso::begin(&oidc.validator, &issuer, &client_id, &redirect_uri).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%issuer, error = %e, "console sign-in: cannot reach the issuer");
                return page(
                    StatusCode::BAD_GATEWAY,
                    "Sign-in unavailable",
                    &format!("the identity provider cannot be reached: {e}"),
                );
            }
        };
    let url = login.url.clone();
    let state_value = login.state.clone();
    {
        let mut logins = oidc.logins();
        logins.retain(|_, (_, at)| at.elapsed() < LOGIN_LIFETIME);
        if logins.len() >= MAX_LOGINS
            && let Some(oldest) = logins
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
        {
            logins.remove(&oldest);
        }
        logins.insert(state_value.clone(), (login, Instant::now()));
    }
    let mut resp = StatusCode::SEE_OTHER.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&url) {
        h.insert(header::LOCATION, v);
    }
    // Lax: the provider's redirect back is a top-level navigation.
    let cookie = format!(
        "{}={state_value}; HttpOnly; SameSite=Lax; Path=/console/sso/; Max-Age={}",
        login_cookie_name(&headers, local),
        LOGIN_LIFETIME.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        h.insert(header::SET_COOKIE, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `GET /console/sso/callback`: checks `state` (and that this browser
/// started the sign-in), exchanges the code, validates the ID token, maps
/// its groups to a role, and opens a console session.
async fn sso_callback(
    State(state): State<AppState>,
    Extension(peer): Extension<Peer>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let mut q = query_pairs(raw.as_deref());
    let Peer::Tcp { remote, local } = peer else {
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "not on the TCP listener",
        );
    };
    let Some(oidc) = &state.oidc else {
        return ApiError::no_route("GET", "/console/sso/callback").into_response();
    };
    if let Some(e) = q.get("error") {
        return page(
            StatusCode::UNAUTHORIZED,
            "Sign-in failed",
            &format!(
                "the identity provider answered {e}: {}",
                q.get("error_description").map_or("", String::as_str)
            ),
        );
    }
    let (Some(code), Some(sent_state)) = (q.remove("code"), q.remove("state")) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "the callback has no code or state; start again from the login page",
        );
    };
    let cookie_name = login_cookie_name(&headers, local);
    let bound = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| plugd_console::session_cookie(v, &cookie_name).map(str::to_owned));
    if !bound.is_some_and(|b| plugd_console::same_secret(&b, &sent_state)) {
        tracing::warn!(%remote, cause = "state_mismatch", "console sign-in refused: the state is not this browser's");
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "this sign-in was not started by this browser (state mismatch); start again from the login page",
        );
    }
    let login = {
        let mut logins = oidc.logins();
        logins.retain(|_, (_, at)| at.elapsed() < LOGIN_LIFETIME);
        logins.remove(&sent_state)
    };
    let Some((login, _)) = login else {
        tracing::warn!(%remote, cause = "unknown_state", "console sign-in refused: no sign-in under way with that state");
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "no sign-in is under way with that state (it expired after 10 minutes or was used); start again from the login page",
        );
    };
    let (verified, id_token) = match plugd_oidc::sso::finish(&oidc.validator, &login, &code).await {
        Ok(f) => (f.verified, f.id_token),
        Err(e) => {
            tracing::warn!(%remote, issuer = %login.issuer, reason = %e, "console sign-in refused");
            return page(StatusCode::UNAUTHORIZED, "Sign-in failed", &e);
        }
    };
    let claims = Claims::of(&verified);
    let identity = match identity(&state, oidc, &claims).await {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(%remote, identity = %claims.name, cause = e.cause(), reason = %e, "console sign-in refused");
            let status = match &e {
                Refused::Store(api) => api.status,
                _ => StatusCode::FORBIDDEN,
            };
            return page(status, "No access", &e.to_string());
        }
    };
    let session = plugd_console::Login::Oidc {
        name: identity.name.clone(),
        groups: verified.groups.clone(),
        expires_at: verified.expires_at,
        issuer: Some(login.issuer.clone()),
        org: claims.org.clone(),
        project: claims.project.clone(),
    };
    let id = match state.console.create(session).await {
        Ok((id, _)) => id,
        Err(e) => {
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Sign-in failed",
                &e.to_string(),
            );
        }
    };
    oidc.keep_id_token(&id, id_token, verified.expires_at);
    tracing::info!(identity = %identity.name, role = %identity.role, %remote, "console login by single sign-on");
    let name = plugd_console::cookie_name_for(
        headers.get(header::HOST).and_then(|h| h.to_str().ok()),
        local.port(),
    );
    let max_age = verified
        .expires_at
        .saturating_sub(now_secs())
        .min(plugd_console::sessions::IDLE_LIMIT.as_secs());
    let cookie = format!("{name}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}");
    // A page, not a redirect: the cookie is SameSite=Strict, and a
    // redirect chain begun by the provider's site would not send it.
    let mut resp = page(
        StatusCode::OK,
        "Signed in",
        "signed in; opening the console…",
    );
    let body = format!(
        "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=\"0;url=/console/#/plugins\"><title>Signed in</title><p id=sso-message>Signed in as {}; <a href=\"/console/#/plugins\">open the console</a>.</p>",
        identity.name.replace('&', "&amp;").replace('<', "&lt;")
    );
    *resp.body_mut() = axum::body::Body::from(body);
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        h.insert(header::SET_COOKIE, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{cookie_name}=; HttpOnly; SameSite=Lax; Path=/console/sso/; Max-Age=0"
    )) {
        h.append(header::SET_COOKIE, v);
    }
    resp
}

/// A console session opened by single sign-on, as stored.
pub(crate) struct SsoSession<'a> {
    pub(crate) name: &'a str,
    pub(crate) groups: &'a [String],
    pub(crate) expires_at: u64,
    pub(crate) org: Option<&'a str>,
    pub(crate) project: Option<&'a str>,
}

/// The identity of a console session opened by single sign-on: ended once
/// the ID token's `exp` passed; the role and tenancy from its groups and
/// claims as now mapped (an org claim checked against the store again).
/// `Err(Ok(why))`: the session ended; `Err(Err(e))`: the store could not
/// be asked (the session stays).
pub(crate) async fn session_identity(
    state: &AppState,
    s: &SsoSession<'_>,
) -> Result<Identity, Result<String, ApiError>> {
    session_live(s.name, s.expires_at, state.oidc.is_some()).map_err(Ok)?;
    let Some(oidc) = state.oidc.as_deref() else {
        return Err(Ok("single sign-on is no longer configured".into()));
    };
    let claims = Claims {
        name: s.name.to_owned(),
        groups: s.groups.to_vec(),
        org: s.org.map(str::to_owned),
        project: s.project.map(str::to_owned),
    };
    identity(state, oidc, &claims).await.map_err(|e| match e {
        Refused::Store(e) => Err(e),
        e => Ok(format!("{} no longer maps to an identity: {e}", s.name)),
    })
}

/// Whether a single sign-on session of `name` ending at `expires_at` may
/// still be used (`configured`: serve still has `auth.issuers`).
fn session_live(name: &str, expires_at: u64, configured: bool) -> Result<(), String> {
    if now_secs() >= expires_at {
        return Err(format!("the sign-in of {name} expired; sign in again"));
    }
    if !configured {
        return Err("single sign-on is no longer configured (plugd.yaml auth.issuers)".into());
    }
    Ok(())
}

/// The URL a console logout of session `id` (signed in with `issuer`)
/// sends the browser to: the issuer's `end_session_endpoint`, back to the
/// console's login page; `None` when it has none (a local logout only).
pub(crate) async fn logout_url(
    oidc: &Oidc,
    headers: &HeaderMap,
    id: &str,
    issuer: &str,
) -> Option<String> {
    let hint = {
        let mut tokens = oidc.id_tokens();
        tokens.remove(id).map(|(t, _)| t)
    };
    let client_id = oidc
        .config
        .issuers
        .iter()
        .find(|i| i.issuer == issuer)?
        .client_id
        .clone()?;
    let back = format!("{}/console/login", public_origin(oidc, headers));
    plugd_oidc::sso::end_session_url(&oidc.validator, issuer, &client_id, hint.as_deref(), &back)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_url_puts_the_well_known_path_before_the_resource_path() {
        assert_eq!(
            metadata_url("https://plugd.example.com/mcp"),
            "https://plugd.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("http://127.0.0.1:7777/"),
            "http://127.0.0.1:7777/.well-known/oauth-protected-resource"
        );
        assert!(is_jwt("eyJhbGciOi") && !is_jwt("plugd_abc") && !is_jwt("vai_dlg_x"));
    }

    fn mapping(group: &str, role: &str, org: Option<&str>, project: Option<&str>) -> RoleMapping {
        RoleMapping {
            group: group.into(),
            role: role.into(),
            org: org.map(Into::into),
            project: project.map(Into::into),
        }
    }

    use plugd_runtime::auth_config::{IssuerConfig, RoleMapping};

    fn config() -> AuthConfig {
        AuthConfig {
            issuers: vec![IssuerConfig {
                issuer: "https://idp.example.com".into(),
                audience: "plugd".into(),
                groups_claim: "groups".into(),
                client_id: Some("console".into()),
                org_claim: Some("org".into()),
                project_claim: Some("project".into()),
            }],
            role_mapping: vec![
                mapping("admins", "admin", None, None),
                mapping("acme-devs", "agent", Some("acme"), None),
                mapping("web-devs", "agent", Some("acme"), Some("web")),
                mapping("staff", "viewer", None, None),
            ],
            ..AuthConfig::default()
        }
    }

    #[test]
    fn a_single_sign_on_session_ends_with_the_id_tokens_exp() {
        assert!(session_live("oidc:x/a", now_secs() + 60, true).is_ok());
        let ended = session_live("oidc:x/a", now_secs() - 1, true);
        assert!(ended.unwrap_err().contains("expired"));
        assert!(session_live("oidc:x/a", now_secs() + 60, false).is_err());
        assert!(Oidc::from_config(&AuthConfig::default()).is_none());
    }

    #[test]
    fn groups_and_claims_map_to_a_role_and_a_tenancy() {
        let cfg = config();
        let oidc = Oidc::from_config(&cfg).unwrap();
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let map = |groups: &[&str], org: Option<&str>, project: Option<&str>| {
            oidc.mapped("oidc:x/a", &g(groups), org, project)
        };
        // A plain member of a workspace group: a workspace identity.
        let (role, tenant, _) = map(&["staff"], None, None).unwrap();
        assert_eq!((role, tenant), (Role::Viewer, None));
        // A mapping naming an org (and a project).
        let (role, tenant, claimed) = map(&["acme-devs"], None, None).unwrap();
        let t = tenant.unwrap();
        assert_eq!(
            (role, t.org_id.as_str(), claimed),
            (Role::Agent, "acme", false)
        );
        assert!(t.project_ids.is_empty());
        let t = map(&["web-devs"], None, None).unwrap().1.unwrap();
        assert_eq!(t.project_ids, ["web"]);
        // The org claim, for a group that names none: from the claim.
        let (_, tenant, claimed) = map(&["staff"], Some("globex"), Some("p1")).unwrap();
        let t = tenant.unwrap();
        assert_eq!((t.org_id.as_str(), claimed), ("globex", true));
        assert_eq!(t.project_ids, ["p1"]);
        // A claim agreeing with the mapping is fine; one disagreeing is not.
        assert!(map(&["acme-devs"], Some("acme"), None).is_ok());
        let e = map(&["acme-devs"], Some("globex"), None).unwrap_err();
        assert!(e.contains("\"globex\"") && e.contains("acme-devs"), "{e}");
        let e = map(&["web-devs"], None, Some("api")).unwrap_err();
        assert!(e.contains("project claim"), "{e}");
        // Hostile claims: not ids.
        for bad in ["../etc", "", "a b", &"x".repeat(65)] {
            let e = map(&["staff"], Some(bad), None).unwrap_err();
            assert!(e.contains("org claim"), "{bad:?}: {e}");
        }
        // A project without an org.
        let e = map(&["staff"], None, Some("p1")).unwrap_err();
        assert!(e.contains("names no org"), "{e}");
        // The first matching group decides: admins first, a workspace admin.
        let (role, tenant, _) = map(&["acme-devs", "admins"], None, None).unwrap();
        assert_eq!((role, tenant), (Role::Admin, None));
        // No mapped group: no access.
        assert!(
            map(&["visitors"], None, None)
                .unwrap_err()
                .contains("role_mapping")
        );
    }

    #[test]
    fn the_consoles_redirect_and_the_resource_follow_auth_resource() {
        let cfg = config();
        let oidc = Oidc::from_config(&cfg).unwrap();
        // The console's redirect URI and the default resource follow
        // `auth.resource`, else the request's Host.
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7777"));
        assert_eq!(public_origin(&oidc, &headers), "http://127.0.0.1:7777");
        assert_eq!(resource(&oidc, &headers), "http://127.0.0.1:7777/mcp");
        let behind = Oidc::from_config(&AuthConfig {
            resource: Some("https://plugd.example.com/mcp".into()),
            ..cfg
        })
        .unwrap();
        assert_eq!(
            public_origin(&behind, &headers),
            "https://plugd.example.com"
        );
        assert_eq!(resource(&behind, &headers), "https://plugd.example.com/mcp");
    }
}
