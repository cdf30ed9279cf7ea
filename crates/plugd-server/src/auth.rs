//! Who may talk to serve: the socket peer's uid or a bearer token decides an
//! [`Identity`], its role decides what it may do, and browsers' cross-site
//! requests are refused (`Host` and `Origin` checks).
//!
//! Two layers run before any handler reads a body: [`authorize`] before
//! routing (steps 1 to 4), [`authorize_route`] after it, on the route the
//! request matched and its percent-decoded parameters (steps 5 and 6; a
//! path that matches no route is the router's `404`, after authentication):
//! 1. the connection's [`Peer`] (set by the listener; a request without one is
//!    refused, so nothing reaches a handler unauthenticated);
//! 2. on TCP, `Host` must name the listener (or `localhost`, or a host of
//!    `http.allowed_hosts`): DNS rebinding gets `403 forbidden_host`;
//! 3. a state-changing request with an `Origin` (or `Sec-Fetch-Site`) that is
//!    not this listener's own gets `403 cross_origin` (no CORS, ever);
//! 4. the identity: a Unix peer with serve's uid or root is the local admin;
//!    any other uid gets `403`; on TCP `Authorization: Bearer plugd_…`
//!    (`401 unauthenticated` without one, after a fixed delay when wrong),
//!    else the console's session cookie (`plugd_console`), whose
//!    state-changing requests must echo the session's CSRF token
//!    (`403 csrf`);
//! 5. the route's [`Right`] ([`route_right`]: its template and decoded last
//!    parameter, never the path's spelling) against the identity's
//!    [`Role`]: `403 forbidden` naming the role needed;
//! 6. after the handler, a state-changing request is appended to the audit
//!    trail with the identity's name and the status (by the audit writer's
//!    thread, in batches, off the request path; never dropped). Reads are
//!    not, the admin-only ones (`GET /v1/tokens`, `GET /v1/audit`) neither.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use plugd_store::tokens::{Role, TokenRejection};

use crate::{ApiError, AppState, error};

/// The far end of a connection, as the listener saw it at accept time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A Unix-socket peer and its credentials (`SO_PEERCRED`).
    Unix {
        /// Its effective uid.
        uid: u32,
        /// Its pid, when the kernel gave one.
        pid: Option<i32>,
    },
    /// A TCP peer; `local` is the listener's own address (for `Host`).
    Tcp {
        /// The client's address.
        remote: SocketAddr,
        /// The address it connected to.
        local: SocketAddr,
    },
}

impl Peer {
    /// A socket peer running as this process's user (what the CLI is).
    pub fn local_owner() -> Peer {
        Peer::Unix {
            uid: rustix::process::geteuid().as_raw(),
            pid: None,
        }
    }
}

/// Who a request comes from, once authenticated; handlers read it as an
/// `Extension<Identity>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `token:NAME`, or the Unix user name of a socket peer.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The MCP profiles a limited token may use (`None`: not limited).
    pub mcp_profiles: Option<Vec<String>>,
    /// The org (and projects) a bound token belongs to (`None`: a workspace
    /// identity); see `crate::bindings`.
    pub tenant: Option<plugd_store::tokens::Tenancy>,
    /// The delegation of a `vai_dlg_` token (seed 003): only the canonical
    /// session/chain/run routes, each needing its scope.
    pub delegation: Option<std::sync::Arc<plugd_control::delegation::Delegation>>,
    /// The groups of an OAuth/OIDC identity (its token's groups claim; the
    /// per-tool policy's `caller.groups`); empty for plugd tokens.
    pub groups: Vec<String>,
    /// The caller's own access token (a JWT of `auth.issuers`), for remote
    /// MCP servers with plugd.yaml `upstream_auth`; `None` for every other
    /// identity. `Debug` shows its subject only.
    pub user: Option<plugd_host::dialect::UserToken>,
}

impl Identity {
    /// Whether this identity may make a non-read request to `path`: a token
    /// limited to MCP profiles reaches only `/mcp/{one of them}`.
    pub fn may_reach(&self, path: &str) -> bool {
        match &self.mcp_profiles {
            None => true,
            Some(allowed) => ["/mcp/", "/sse/", "/messages/"]
                .iter()
                .find_map(|prefix| path.strip_prefix(prefix))
                .is_some_and(|p| allowed.iter().any(|a| a == p)),
        }
    }

    /// The name a record's `by` takes.
    pub fn by(&self) -> &str {
        &self.name
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// Read anything (every `GET`).
    Read,
    /// Invoke tools, run turns and hooks, publish on the bus.
    Invoke,
    /// Approve, revoke, restart, reconfigure, start, stop plugins; decide pending calls.
    Govern,
    /// Anything else.
    Admin,
}

impl Right {
    /// The least role that has this right, for messages.
    pub fn role_name(self) -> &'static str {
        match self {
            Right::Read => "viewer",
            Right::Invoke => "agent",
            Right::Govern => "operator",
            Right::Admin => "admin",
        }
    }
}

/// Whether `role` has `right`.
pub fn allows(role: Role, right: Right) -> bool {
    match role {
        Role::Admin => true,
        Role::Operator => matches!(right, Right::Read | Right::Govern),
        Role::Agent => matches!(right, Right::Read | Right::Invoke),
        Role::Viewer => right == Right::Read,
    }
}

/// A route's last parameter split into its target and its action, the
/// text after the last `:` (`x/y:invoke` → `("x/y", "invoke")`; a target
/// may hold `/` and `:`). The one reading of `{target}:{action}` that both
/// [`route_right`] and the handlers dispatch on; `None` without a `:`.
pub fn action_of(segment: &str) -> Option<(&str, &str)> {
    segment.rsplit_once(':')
}

/// The right route `template` (as the router declares it, e.g.
/// `/v1/tools/{*name}`) needs for `method`; `last` is the route's last
/// parameter, percent-decoded: the very value its handler dispatches on
/// (`x:disable` of `/v1/tools/x%3Adisable`), so no spelling of a path can
/// reach an action with the right of another.
pub fn route_right(method: &Method, template: &str, last: Option<&str>) -> Right {
    // The MCP gateway: listing and calling is the agent's right; its GET
    // stream and DELETE belong to a session the caller opened with POST.
    // The legacy HTTP+SSE transport: opening its stream opens a session,
    // as `initialize` does on `/mcp`.
    if matches!(
        template,
        "/sse" | "/sse/{profile}" | "/messages" | "/messages/{profile}"
    ) {
        return Right::Invoke;
    }
    if template == "/mcp" || template == "/mcp/{profile}" {
        return if *method == Method::GET || *method == Method::HEAD {
            Right::Read
        } else {
            Right::Invoke
        };
    }
    // Tokens and the audit trail are the admin's, reads included.
    if is_admin_only(template) {
        return Right::Admin;
    }
    if *method == Method::GET || *method == Method::HEAD {
        return Right::Read;
    }
    // The action after the last `:` of the last parameter; on a route with
    // actions of different rights, one it does not know needs the admin
    // (its handler answers 404 anyway).
    let action = last.and_then(action_of).map(|(_, a)| a);
    let is = |names: &[&str]| action.is_some_and(|a| names.contains(&a));
    const GOVERNS: [&str; 6] = [
        "approve",
        "revoke",
        "restart",
        "reconfigure",
        "start",
        "stop",
    ];
    match (method.as_str(), template) {
        ("POST", "/v1/plugins/{*action}") if is(&GOVERNS) => Right::Govern,
        // The console's settings form: the operator's, like `:reconfigure`.
        ("PUT", "/v1/plugins/{*action}") if last.is_some_and(|p| p.ends_with("/config")) => {
            Right::Govern
        }
        ("POST", "/v1/tools/{*name}") if is(&["enable", "disable"]) => Right::Govern,
        ("POST", "/v1/tools/{*name}") if is(&["invoke"]) => Right::Invoke,
        // Routes of one action: any other is the handler's 404, at the
        // same right (no action of more right hides behind them).
        ("POST", "/v1/plugin-tools/{export}" | "/v1/hooks/{point}") => Right::Invoke,
        ("POST", "/v1/approvals/{action}") => Right::Govern,
        ("POST", "/v1/plugin-packages") => Right::Govern,
        ("POST", "/v1/plugin-packages/{*id}") if is(&["restart"]) => Right::Govern,
        ("POST", "/v1/marketplace/{id}") if is(&["install"]) => Right::Govern,
        ("POST", "/v1/plugin-bindings") => Right::Govern,
        ("POST", "/v1/plugin-bindings/{id}") if is(&["validate"]) => Right::Read,
        ("PATCH", "/v1/plugin-bindings/{id}") => Right::Govern,
        ("PUT", "/v1/secrets/{org}/{name}") => Right::Govern,
        // Anyone logged in may log out.
        ("POST", "/console/logout") => Right::Read,
        ("PATCH", "/v1/runs/{id}") => Right::Invoke,
        (
            "POST",
            "/v1/sessions/{id}/messages"
            | "/v1/chains/{id}/blocks"
            | "/v1/runs"
            | "/v1/compactions"
            | "/v1/llm:complete"
            | "/v1/bus/publish"
            | "/v1/resources:read"
            | "/v1/prompts:get"
            | "/v1/completions",
        ) => Right::Invoke,
        _ => Right::Admin,
    }
}

/// The routes only an admin reaches, whatever the method: the API tokens
/// ([`crate::tokens_api`]) and the audit trail ([`crate::audit_api`]).
pub fn is_admin_only(template: &str) -> bool {
    matches!(
        template,
        "/v1/tokens" | "/v1/tokens/{*action}" | "/v1/audit"
    )
}

/// `template` with each `{name}` / `{*name}` replaced by its decoded value
/// from `params` (the path the handler acts on, for messages and profiles).
pub fn fill(template: &str, params: &[(String, String)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let name = rest[open + 1..open + close].trim_start_matches('*');
        match params.iter().find(|(k, _)| k == name) {
            Some((_, v)) => out.push_str(v),
            None => out.push_str(&rest[open..=open + close]),
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The template with every parameter replaced by `_`: the route's shape,
/// for the rules that depend on the route only (delegation scopes, the
/// tenant routes).
fn shape(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push('_');
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// Paths anyone may reach without credentials: `GET /healthz`, `GET
/// /readyz`, and the console's page, assets and login
/// (`plugd_console::is_public`).
pub fn is_public(method: &Method, path: &str) -> bool {
    ((*method == Method::GET || *method == Method::HEAD)
        && (path == "/healthz" || path == "/readyz" || crate::oidc::is_public(path)))
        || plugd_console::is_public(method.as_str(), path)
}

/// How long a request with a wrong token waits before its `401`.
const FAILURE_DELAY: Duration = Duration::from_millis(100);

/// What the auth middleware needs beside the request.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The uid `plugd serve` runs as (with root, the only socket peers let in).
    pub owner_uid: u32,
    /// Extra `Host` names accepted on TCP (`http.allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// Browser origins let in on the MCP paths, with CORS headers
    /// (`mcp.http.cors_allowed_origins`, as [`origin_key`]s).
    pub cors_origins: Vec<String>,
}

impl AuthConfig {
    /// Serve's own uid and the configured extra hosts.
    pub fn current(allowed_hosts: Vec<String>) -> AuthConfig {
        AuthConfig {
            owner_uid: rustix::process::geteuid().as_raw(),
            allowed_hosts,
            cors_origins: Vec::new(),
        }
    }

    /// Lets `origins` (plugd.yaml `mcp.http.cors_allowed_origins`) in on
    /// the MCP paths.
    pub fn with_cors(mut self, origins: &[String]) -> AuthConfig {
        self.cors_origins = origins.iter().filter_map(|o| origin_key(o)).collect();
        self
    }

    /// The allowed CORS origin `headers` carry on `path`, if any.
    fn cors_origin(&self, path: &str, headers: &HeaderMap) -> Option<HeaderValue> {
        if self.cors_origins.is_empty() || !is_mcp_path(path) {
            return None;
        }
        let origin = headers.get(header::ORIGIN)?;
        let key = origin_key(origin.to_str().ok()?)?;
        self.cors_origins.contains(&key).then(|| origin.clone())
    }
}

/// The paths of the MCP gateway's transports, where CORS may be on.
fn is_mcp_path(path: &str) -> bool {
    ["/mcp", "/sse", "/messages"].iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The paths of the legacy HTTP+SSE transport, whose `GET` (it opens a
/// session) has its `Origin` checked too.
fn is_legacy_sse_path(path: &str) -> bool {
    path == "/sse" || path.starts_with("/sse/")
}

/// An origin as `scheme://host:port`, lower case, default port added
/// (`None` when it is not a plain http(s) origin).
fn origin_key(origin: &str) -> Option<String> {
    let scheme = origin.split_once("://")?.0.to_ascii_lowercase();
    Some(format!("{scheme}://{}", origin_host(origin)?))
}

/// The request headers a browser client of `/mcp` may send.
const CORS_ALLOW_HEADERS: &str = "Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Mcp-Method, Mcp-Name, Last-Event-ID";

/// Adds the CORS headers of an allowed `origin` to `resp`.
fn with_cors_headers(mut resp: Response, origin: HeaderValue) -> Response {
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Mcp-Session-Id"),
    );
    resp
}

/// The answer to an allowed origin's preflight.
fn preflight(origin: HeaderValue) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(CORS_ALLOW_HEADERS),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    with_cors_headers(resp, origin)
}

pub use plugd_store::users::user_name;

/// `host[:port]` in lower case, with a default port added.
fn normalize_host(host: &str, default_port: u16) -> String {
    let host = host.trim().to_ascii_lowercase();
    let has_port = if host.starts_with('[') {
        host.contains("]:")
    } else {
        host.contains(':')
    };
    if has_port {
        host
    } else {
        format!("{host}:{default_port}")
    }
}

/// The `Host` values a TCP listener on `local` answers to.
fn own_hosts(local: SocketAddr, extra: &[String]) -> Vec<String> {
    let port = local.port();
    let mut hosts = vec![normalize_host(&local.to_string(), port)];
    if local.ip().to_canonical().is_loopback() {
        hosts.push(format!("localhost:{port}"));
        hosts.push(format!("127.0.0.1:{port}"));
        hosts.push(format!("[::1]:{port}"));
    }
    hosts.extend(extra.iter().map(|h| normalize_host(h, port)));
    hosts
}

/// Whether `host` (normalized: lower case, with its port) names a TCP
/// listener on `local`: exactly the members of [`own_hosts`], without
/// building them (every request on TCP asks).
fn names_listener(local: SocketAddr, extra: &[String], host: &str) -> bool {
    let port = local.port();
    if host.parse::<SocketAddr>().is_ok_and(|h| h == local) {
        return true;
    }
    if local.ip().to_canonical().is_loopback()
        && let Some((name, p)) = host.rsplit_once(':')
        && p.parse::<u16>() == Ok(port)
        && matches!(name, "localhost" | "127.0.0.1" | "[::1]")
    {
        return true;
    }
    extra.iter().any(|e| normalize_host(e, port) == host)
}

/// `scheme://host[:port]` of an `Origin` as `host:port` (`None` when it is
/// not a plain http(s) origin: `null`, a path, userinfo...).
fn origin_host(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.split_once("://")?;
    let port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    if rest.is_empty() || rest.contains(['/', '@', '?', '#', ' ']) {
        return None;
    }
    Some(normalize_host(rest, port))
}

fn forbidden(code: &'static str, message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, code, message).into_response()
}

/// Why a request is refused before authentication, if it is: `Host` on TCP,
/// then `Origin` / `Sec-Fetch-Site` on state-changing requests.
fn check_browser_rules(
    peer: &Peer,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    cfg: &AuthConfig,
    cors_allowed: bool,
) -> Result<(), Box<Response>> {
    let text = |name: header::HeaderName| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("(not text)").to_owned())
    };
    if let Peer::Tcp { local, .. } = peer {
        {
            let Some(host) = text(header::HOST) else {
                return Err(Box::new(forbidden(
                    error::code::FORBIDDEN_HOST,
                    "the request has no Host header; send one naming this listener".into(),
                )));
            };
            if !names_listener(
                *local,
                &cfg.allowed_hosts,
                &normalize_host(&host, local.port()),
            ) {
                return Err(Box::new(forbidden(
                    error::code::FORBIDDEN_HOST,
                    format!(
                        "Host {host:?} does not name this listener ({}); add it to plugd.yaml http.allowed_hosts if it is yours",
                        own_hosts(*local, &cfg.allowed_hosts)[0]
                    ),
                )));
            }
        }
    }
    let safe = (*method == Method::GET || *method == Method::HEAD) && !is_legacy_sse_path(path);
    if safe || cors_allowed {
        return Ok(());
    }
    if text(header::HeaderName::from_static("sec-fetch-site"))
        .is_some_and(|s| s != "same-origin" && s != "none")
    {
        return Err(Box::new(forbidden(
            error::code::CROSS_ORIGIN,
            "a cross-site browser request may not change anything here".into(),
        )));
    }
    if let Some(origin) = text(header::ORIGIN) {
        // Over the Unix socket no origin is this server's.
        let same = origin_host(&origin).is_some_and(|h| match peer {
            Peer::Tcp { local, .. } => names_listener(*local, &cfg.allowed_hosts, &h),
            Peer::Unix { .. } => false,
        });
        if !same {
            return Err(Box::new(forbidden(
                error::code::CROSS_ORIGIN,
                format!(
                    "Origin {origin:?} is not this server's; state-changing requests from other origins are refused"
                ),
            )));
        }
    }
    Ok(())
}

fn unauthenticated(message: String) -> Response {
    let mut resp = ApiError::new(
        StatusCode::UNAUTHORIZED,
        error::code::UNAUTHENTICATED,
        message,
    )
    .into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"plugd\""),
    );
    resp
}

const HOW_TO_GET_A_TOKEN: &str = "create one with `plugd token create --name NAME --role ROLE` on the serving machine and send `Authorization: Bearer TOKEN`; `plugd` commands on that machine use the Unix socket .plugd/serve.sock instead";

async fn identify(
    state: &AppState,
    peer: &Peer,
    headers: &HeaderMap,
) -> Result<(Identity, Option<ConsoleSession>), Response> {
    let cfg = &state.auth;
    match peer {
        Peer::Unix { uid, pid } => {
            if *uid == cfg.owner_uid || *uid == 0 {
                Ok((
                    Identity {
                        name: user_name(*uid),
                        role: Role::Admin,
                        mcp_profiles: None,
                        tenant: None,
                        delegation: None,
                        groups: Vec::new(),
                        user: None,
                    },
                    None,
                ))
            } else {
                tracing::warn!(uid, pid, "refused a socket peer of another user");
                Err(forbidden(
                    error::code::FORBIDDEN,
                    format!(
                        "uid {uid} ({}) may not use this socket: only the user running plugd serve ({}) and root may; ask them for a token for --listen",
                        user_name(*uid),
                        user_name(cfg.owner_uid)
                    ),
                ))
            }
        }
        Peer::Tcp { remote, local } => {
            let Some(value) = headers.get(header::AUTHORIZATION) else {
                return console_identity(state, *remote, *local, headers).await;
            };
            let token = value
                .to_str()
                .ok()
                .and_then(|v| {
                    let (scheme, t) = v.split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| t.trim())
                })
                .unwrap_or("");
            // plugd.yaml `auth.issuers`: a token that is not plugd's is
            // read as an issuer's JWT access token.
            if let Some(oidc) = &state.oidc
                && crate::oidc::is_jwt(token)
            {
                return Ok((
                    crate::oidc::jwt_identity(state, oidc, *remote, token).await?,
                    None,
                ));
            }
            Ok((token_identity(state, *remote, token).await?, None))
        }
    }
}

/// The identity of bearer token `token` (a wrong one waits
/// [`FAILURE_DELAY`] before its `401`).
pub(crate) async fn token_identity(
    state: &AppState,
    remote: SocketAddr,
    token: &str,
) -> Result<Identity, Response> {
    if token.starts_with(plugd_control::delegation::TOKEN_PREFIX) {
        return match state.runtime.delegations().verify(token) {
            Some(d) => Ok(Identity {
                name: format!("delegated:{}:{}", d.export, d.invocation_id),
                role: Role::Agent,
                mcp_profiles: None,
                tenant: None,
                delegation: Some(d),
                groups: Vec::new(),
                user: None,
            }),
            None => {
                tracing::warn!(%remote, "refused a request with an unusable delegation token");
                tokio::time::sleep(FAILURE_DELAY).await;
                Err(unauthenticated(
                    "the delegation token is not valid: it was never issued, its invocation ended, or its deadline passed; delegation tokens live only as long as the invocation they were minted for".to_owned(),
                ))
            }
        };
    }
    let verdict = state
        .runtime
        .state()
        .token_verify(token)
        .await
        .map_err(|e| ApiError::from(plugd_runtime::RuntimeError::from(e)).into_response())?;
    token_verdict(remote, verdict).await
}

/// The identity of a console session opened with API token `id`: the token
/// checked again (live, not revoked, not expired), else `401`.
async fn token_id_identity(
    state: &AppState,
    remote: SocketAddr,
    id: &str,
) -> Result<Identity, Response> {
    let verdict = state
        .runtime
        .state()
        .token_live(id)
        .await
        .map_err(|e| ApiError::from(plugd_runtime::RuntimeError::from(e)).into_response())?;
    token_verdict(remote, verdict).await
}

async fn token_verdict(
    remote: SocketAddr,
    verdict: Result<plugd_store::tokens::TokenInfo, TokenRejection>,
) -> Result<Identity, Response> {
    match verdict {
        Ok(info) => Ok(Identity {
            name: format!("token:{}", info.name),
            role: info.role,
            mcp_profiles: info.mcp_profiles,
            tenant: info.org_id.map(|org_id| plugd_store::tokens::Tenancy {
                org_id,
                project_ids: info.project_ids,
            }),
            delegation: None,
            groups: Vec::new(),
            user: None,
        }),
        Err(why) => {
            tracing::warn!(%remote, "refused a request with an unusable token");
            tokio::time::sleep(FAILURE_DELAY).await;
            let what = match why {
                TokenRejection::Invalid => "the bearer token is not valid".to_owned(),
                TokenRejection::Revoked(at) => {
                    format!("the bearer token was revoked at {at}")
                }
                TokenRejection::Expired(at) => format!("the bearer token expired at {at}"),
            };
            Err(unauthenticated(format!("{what}; {HOW_TO_GET_A_TOKEN}")))
        }
    }
}

/// A console session a request authenticated with (its cookie).
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    /// The session id (the cookie's value).
    pub id: String,
    /// The token state-changing requests must echo.
    pub csrf: String,
    /// The cookie's name on this listener.
    pub cookie: String,
}

/// The identity of a request without `Authorization`: its console cookie's
/// session, else `401`.
async fn console_identity(
    state: &AppState,
    remote: SocketAddr,
    local: SocketAddr,
    headers: &HeaderMap,
) -> Result<(Identity, Option<ConsoleSession>), Response> {
    let cookie = plugd_console::cookie_name_for(
        headers.get(header::HOST).and_then(|h| h.to_str().ok()),
        local.port(),
    );
    let id = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| plugd_console::session_cookie(v, &cookie).map(str::to_owned));
    let Some(id) = id else {
        return Err(unauthenticated(format!(
            "this request needs a bearer token: {HOW_TO_GET_A_TOKEN}"
        )));
    };
    let session = match state.console.get(&id).await {
        Ok(Some(session)) => session,
        Ok(None) => {
            tokio::time::sleep(FAILURE_DELAY).await;
            return Err(unauthenticated(
                "the console session ended (logged out or expired); log in again at /console/login"
                    .into(),
            ));
        }
        Err(e) => {
            return Err(ApiError::from(plugd_runtime::RuntimeError::from(e)).into_response());
        }
    };
    let identity = match &session.login {
        plugd_console::Login::Token { id: token_id } => {
            let identity = token_id_identity(state, remote, token_id).await;
            if identity.is_err() {
                // The token is gone: so is every session it opened.
                let _ = state.console.remove(&id).await;
            }
            identity?
        }
        plugd_console::Login::Owner { name } => Identity {
            name: name.clone(),
            role: Role::Admin,
            mcp_profiles: None,
            tenant: None,
            delegation: None,
            groups: Vec::new(),
            user: None,
        },
        plugd_console::Login::Oidc {
            name,
            groups,
            expires_at,
            org,
            project,
            ..
        } => {
            let sso = crate::oidc::SsoSession {
                name,
                groups,
                expires_at: *expires_at,
                org: org.as_deref(),
                project: project.as_deref(),
            };
            match crate::oidc::session_identity(state, &sso).await {
                Ok(identity) => identity,
                Err(Err(e)) => return Err(e.into_response()),
                Err(Ok(why)) => {
                    // The IdP's lifetime (or the mapping) ended the session.
                    tracing::info!(identity = %name, reason = %why, "ended a single sign-on console session");
                    let _ = state.console.remove(&id).await;
                    return Err(unauthenticated(format!(
                        "{why}; log in again at /console/login"
                    )));
                }
            }
        }
    };
    Ok((
        identity,
        Some(ConsoleSession {
            id,
            csrf: session.csrf,
            cookie,
        }),
    ))
}

/// `403 csrf` unless a cookie-authenticated, state-changing request echoes
/// its session's CSRF token.
fn check_csrf(
    method: &Method,
    headers: &HeaderMap,
    session: &ConsoleSession,
) -> Result<(), Box<Response>> {
    if *method == Method::GET || *method == Method::HEAD {
        return Ok(());
    }
    let sent = headers
        .get(plugd_console::CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if plugd_console::same_secret(sent, &session.csrf) {
        Ok(())
    } else {
        Err(Box::new(forbidden(
            error::code::CSRF,
            format!(
                "a request authenticated by the console's cookie must carry the session's CSRF token in {} (from GET /console/session)",
                plugd_console::CSRF_HEADER
            ),
        )))
    }
}

/// The outer middleware, before routing: steps 1 to 4 of the module
/// documentation (peer, `Host`/`Origin`, identity, CSRF). The identity goes
/// into the request's extensions; the route's right is checked after
/// routing, by [`authorize_route`], on the route the request matched.
pub async fn authorize(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let cors = state.auth.cors_origin(req.uri().path(), req.headers());
    match cors {
        None => authorize_request(state, req, next, false).await,
        Some(origin) => {
            if req.method() == Method::OPTIONS
                && let Some(peer) = req.extensions().get::<Peer>()
            {
                // The Host check still applies (DNS rebinding).
                let path = req.uri().path();
                return match check_browser_rules(
                    peer,
                    req.method(),
                    path,
                    req.headers(),
                    &state.auth,
                    true,
                ) {
                    Ok(()) => preflight(origin),
                    Err(resp) => *resp,
                };
            }
            with_cors_headers(authorize_request(state, req, next, true).await, origin)
        }
    }
}

async fn authorize_request(
    state: AppState,
    mut req: Request,
    next: Next,
    cors_allowed: bool,
) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let Some(peer) = req.extensions().get::<Peer>().cloned() else {
        return forbidden(
            error::code::FORBIDDEN,
            "the request did not come through a plugd listener".into(),
        );
    };
    if let Err(resp) = check_browser_rules(
        &peer,
        &method,
        &path,
        req.headers(),
        &state.auth,
        cors_allowed,
    ) {
        return *resp;
    }
    if is_public(&method, &path) {
        req.extensions_mut().insert(Public);
        return next.run(req).await;
    }
    // Credentials presented and being checked: the connection is not
    // closed for room meanwhile (see `crate::listen`).
    let checking = req
        .extensions()
        .get::<crate::listen::ConnAuth>()
        .map(|c| c.verifying());
    let identified = identify(&state, &peer, req.headers()).await;
    drop(checking);
    let (identity, console) = match identified {
        Ok(i) => i,
        // With plugd.yaml `auth.issuers`, a 401 names the protected
        // resource metadata (RFC 9728) for MCP clients to discover.
        Err(resp) => {
            return match &state.oidc {
                Some(oidc) => crate::oidc::challenge(oidc, req.headers(), resp),
                None => resp,
            };
        }
    };
    // Valid credentials: the connection leaves the listener's pool of
    // unauthenticated connections (see `crate::listen`).
    if let Some(conn) = req.extensions().get::<crate::listen::ConnAuth>() {
        conn.authenticated();
    }
    if let Some(session) = &console {
        if let Err(resp) = check_csrf(&method, req.headers(), session) {
            return *resp;
        }
        req.extensions_mut().insert(session.clone());
    }
    req.extensions_mut().insert(identity);
    next.run(req).await
}

/// Marks a request [`is_public`] let through without credentials.
#[derive(Debug, Clone, Copy)]
struct Public;

/// Set on the response of a request that passed [`authorize_route`] and
/// reached its handler: the route it matched and the right that was checked
/// (what the route walk of the tests asserts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    /// The route's template, as the router declares it.
    pub route: String,
    /// The right the identity was checked against.
    pub right: Right,
}

/// The route layer, after routing (so only on a request that matched a
/// route; anything else is the router's `404` after authentication): step 5
/// and 6 of the module documentation on the matched route and its decoded
/// parameters, never on the path's spelling.
pub async fn authorize_route(State(state): State<AppState>, req: Request, next: Next) -> Response {
    use axum::extract::FromRequestParts;
    let (mut parts, body) = req.into_parts();
    let Some(template) = parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned())
    else {
        return forbidden(
            error::code::FORBIDDEN,
            "the request matched no route; nothing is reached without one".into(),
        );
    };
    let params: Vec<(String, String)> =
        match axum::extract::RawPathParams::from_request_parts(&mut parts, &()).await {
            Ok(p) => p
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            Err(axum::extract::rejection::RawPathParamsRejection::MissingPathParams(_)) => {
                Vec::new()
            }
            Err(e) => {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    error::code::BAD_REQUEST,
                    format!(
                        "{} {}: {}; send the path's parameters as percent-encoded UTF-8",
                        parts.method,
                        parts.uri.path(),
                        e.body_text()
                    ),
                )
                .into_response();
            }
        };
    let req = Request::from_parts(parts, body);
    let method = req.method().clone();
    let raw_path = req.uri().path().to_owned();
    let last = params.last().map(|(_, v)| v.as_str());
    let right = route_right(&method, &template, last);
    let path = fill(&template, &params);
    let Some(identity) = req.extensions().get::<Identity>().cloned() else {
        if req.extensions().get::<Public>().is_some() {
            let mut resp = next.run(req).await;
            resp.extensions_mut().insert(Authorized {
                route: template,
                right: Right::Read,
            });
            return resp;
        }
        return forbidden(
            error::code::FORBIDDEN,
            format!("{method} {raw_path} was not authenticated; nothing is reached without it"),
        );
    };
    // A delegation token reaches the canonical session/chain/run routes,
    // each with its scope, and nothing else.
    if let Some(d) = &identity.delegation {
        let Some(scope) = plugd_control::delegation::scope_for(method.as_str(), &shape(&template))
        else {
            return forbidden(
                error::code::MISSING_SCOPE,
                format!(
                    "{method} {path} is not open to delegation tokens; they reach the session, chain, run and compaction APIs only (granted: {})",
                    d.scopes.join(", ")
                ),
            );
        };
        if !d.allows(scope) {
            return forbidden(
                error::code::MISSING_SCOPE,
                format!(
                    "{method} {path} needs the scope {scope}; this delegation token of {} grants only [{}] (the export's gateway_api_scopes)",
                    d.export,
                    d.scopes.join(", ")
                ),
            );
        }
    } else {
        // A token bound to an org reaches only the tenant routes; the rest
        // does not exist for it.
        if identity.tenant.is_some() && !crate::bindings::tenant_may_reach(&shape(&template)) {
            return ApiError::no_route(method.as_str(), &raw_path).into_response();
        }
        if !allows(identity.role, right) {
            return forbidden(
                error::code::FORBIDDEN,
                format!(
                    "{method} {path} needs the {} role (or admin); {} has role {}",
                    right.role_name(),
                    identity.name,
                    identity.role
                ),
            );
        }
        if right != Right::Read && !identity.may_reach(&path) {
            let allowed = identity.mcp_profiles.as_deref().unwrap_or_default();
            return forbidden(
                error::code::FORBIDDEN,
                format!(
                    "{} is limited to the MCP profiles {}; use /mcp/PROFILE of one of them",
                    identity.name,
                    allowed.join(", ")
                ),
            );
        }
    }
    let admin_only = is_admin_only(&template);
    let mut resp = next.run(req).await;
    resp.extensions_mut().insert(Authorized {
        route: template,
        right,
    });
    let read = method == Method::GET || method == Method::HEAD;
    let audited = if identity.delegation.is_some() {
        !read
    } else {
        // The admin's reads (tokens, the audit trail) are reads: a console
        // page polling them would fill the trail with itself.
        right != Right::Read && !(read && admin_only)
    };
    if audited {
        let status = resp.status().as_u16();
        tracing::info!(identity = %identity.name, role = %identity.role, %method, path = %raw_path, status, "request");
        // Written by the audit writer's thread, batched; never dropped.
        state.audit.record(
            &identity.name,
            identity.role,
            method.as_str(),
            &raw_path,
            status,
        );
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_follow_routes() {
        let post = Method::POST;
        let r = |m: &Method, t: &str, last: Option<&str>| route_right(m, t, last);
        let plugins = "/v1/plugins/{*action}";
        assert_eq!(r(&Method::GET, "/v1/plugins", None), Right::Read);
        assert_eq!(r(&post, plugins, Some("a/b:approve")), Right::Govern);
        for a in ["reconfigure", "start", "stop", "revoke", "restart"] {
            assert_eq!(r(&post, plugins, Some(&format!("x:{a}"))), Right::Govern);
        }
        assert_eq!(r(&post, plugins, Some("x:frobnicate")), Right::Admin);
        assert_eq!(
            r(&post, "/v1/approvals/{action}", Some("apr_1:deny")),
            Right::Govern
        );
        assert_eq!(r(&post, "/v1/plugin-packages", None), Right::Govern);
        let pkg = "/v1/plugin-packages/{*id}";
        assert_eq!(r(&post, pkg, Some("acme/kit@1.0.0:restart")), Right::Govern);
        let market = "/v1/marketplace/{id}";
        assert_eq!(r(&post, market, Some("weave:install")), Right::Govern);
        assert_eq!(r(&Method::GET, market, Some("weave")), Right::Read);
        let tools = "/v1/tools/{*name}";
        assert_eq!(r(&post, tools, Some("x/y:invoke")), Right::Invoke);
        // The decoded name decides: `x%3Adisable` arrives as `x:disable`.
        assert_eq!(r(&post, tools, Some("x/y:disable")), Right::Govern);
        assert_eq!(r(&post, tools, Some("x:enable")), Right::Govern);
        assert_eq!(r(&Method::PUT, plugins, Some("a/b/config")), Right::Govern);
        assert_eq!(r(&Method::PUT, plugins, Some("a")), Right::Admin);
        assert_eq!(r(&Method::GET, plugins, Some("a/logs")), Right::Read);
        let ptools = "/v1/plugin-tools/{export}";
        assert_eq!(r(&post, ptools, Some("x:invoke")), Right::Invoke);
        let msgs = "/v1/sessions/{id}/messages";
        assert_eq!(r(&post, msgs, Some("s")), Right::Invoke);
        assert_eq!(r(&post, "/v1/bus/publish", None), Right::Invoke);
        assert_eq!(r(&post, "/v1/resources:read", None), Right::Invoke);
        assert_eq!(r(&post, "/v1/prompts:get", None), Right::Invoke);
        assert_eq!(r(&post, "/v1/completions", None), Right::Invoke);
        assert_eq!(r(&Method::DELETE, "/v1/plugins", None), Right::Admin);
        assert_eq!(r(&post, "/mcp", None), Right::Invoke);
        assert_eq!(r(&post, "/mcp/{profile}", Some("readonly")), Right::Invoke);
        assert_eq!(r(&Method::DELETE, "/mcp", None), Right::Invoke);
        assert_eq!(r(&Method::GET, "/mcp", None), Right::Read);
        // Opening the legacy stream opens a session: the agent's right.
        assert_eq!(r(&Method::GET, "/sse", None), Right::Invoke);
        assert_eq!(r(&Method::GET, "/sse/{profile}", Some("p")), Right::Invoke);
        assert_eq!(r(&post, "/messages", None), Right::Invoke);
        assert_eq!(r(&post, "/messages/{profile}", Some("p")), Right::Invoke);
        let bind = "/v1/plugin-bindings/{id}";
        assert_eq!(r(&post, bind, Some("b:validate")), Right::Read);
        assert_eq!(r(&Method::PATCH, bind, Some("b")), Right::Govern);
        assert_eq!(r(&post, "/console/logout", None), Right::Read);
        assert_eq!(r(&post, "/console/links", None), Right::Admin);
        // Tokens and the audit trail: the admin's, reads included.
        assert_eq!(r(&Method::GET, "/v1/tokens", None), Right::Admin);
        assert_eq!(r(&post, "/v1/tokens", None), Right::Admin);
        assert_eq!(
            r(&post, "/v1/tokens/{*action}", Some("ci:revoke")),
            Right::Admin
        );
        assert_eq!(r(&Method::GET, "/v1/audit", None), Right::Admin);
        assert_eq!(r(&Method::GET, "/v1/invocations/stats", None), Right::Read);
        assert!(allows(Role::Operator, Right::Govern) && !allows(Role::Operator, Right::Invoke));
        assert!(allows(Role::Agent, Right::Invoke) && !allows(Role::Agent, Right::Govern));
        assert!(!allows(Role::Viewer, Right::Invoke) && allows(Role::Viewer, Right::Read));
        assert!(is_public(&Method::GET, "/healthz") && !is_public(&post, "/healthz"));
        let p = [("id".to_owned(), "a/b".to_owned())];
        assert_eq!(fill("/v1/chains/{id}/blocks", &p), "/v1/chains/a/b/blocks");
        assert_eq!(
            fill("/v1/plugin-packages/{*id}", &p),
            "/v1/plugin-packages/a/b"
        );
        assert_eq!(shape("/v1/chains/{id}/blocks"), "/v1/chains/_/blocks");
    }

    #[test]
    fn cors_is_for_the_listed_origins_on_the_mcp_paths_only() {
        let cfg = AuthConfig::current(Vec::new()).with_cors(&["HTTPS://App.Example".into()]);
        let with = |origin: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            h
        };
        for path in ["/mcp", "/mcp/p", "/sse", "/sse/p", "/messages"] {
            let h = with("https://app.example:443");
            assert!(cfg.cors_origin(path, &h).is_some(), "{path}");
        }
        for path in ["/mcpx", "/v1/tools/x:invoke", "/ssex", "/"] {
            assert!(
                cfg.cors_origin(path, &with("https://app.example"))
                    .is_none(),
                "{path}"
            );
        }
        for origin in [
            "http://app.example",
            "https://app.example:8443",
            "null",
            "https://evil.example",
        ] {
            assert!(cfg.cors_origin("/mcp", &with(origin)).is_none(), "{origin}");
        }
        assert!(cfg.cors_origin("/mcp", &HeaderMap::new()).is_none());
        let off = AuthConfig::current(Vec::new());
        assert!(
            off.cors_origin("/mcp", &with("https://app.example"))
                .is_none()
        );
    }

    #[test]
    fn a_profile_token_reaches_its_profiles_on_every_mcp_transport() {
        let id = Identity {
            name: "token:t".into(),
            role: Role::Agent,
            mcp_profiles: Some(vec!["ro".into()]),
            tenant: None,
            delegation: None,
            groups: Vec::new(),
            user: None,
        };
        for path in ["/mcp/ro", "/sse/ro", "/messages/ro"] {
            assert!(id.may_reach(path), "{path}");
        }
        for path in ["/mcp", "/sse", "/messages", "/sse/rw", "/v1/tools/x:invoke"] {
            assert!(!id.may_reach(path), "{path}");
        }
    }

    #[test]
    fn origins_and_hosts_are_parsed_strictly() {
        assert_eq!(
            origin_host("http://127.0.0.1:7777").as_deref(),
            Some("127.0.0.1:7777")
        );
        assert_eq!(
            origin_host("HTTP://LocalHost").as_deref(),
            Some("localhost:80")
        );
        for bad in [
            "null",
            "file://",
            "http://a@b:1",
            "http://x/y",
            "ftp://x",
            "http://",
        ] {
            assert_eq!(origin_host(bad), None, "{bad}");
        }
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let hosts = own_hosts(local, &["plugd.internal".into()]);
        for h in [
            "127.0.0.1:8080",
            "localhost:8080",
            "[::1]:8080",
            "plugd.internal:8080",
        ] {
            assert!(hosts.contains(&h.to_owned()), "{h}");
        }
        assert!(!hosts.contains(&normalize_host("evil.example", 8080)));
    }

    #[test]
    fn names_listener_answers_as_own_hosts_does() {
        let extra = ["plugd.internal".to_owned(), "Other.Example:9".to_owned()];
        for local in [
            "127.0.0.1:8080",
            "[::1]:8080",
            "10.1.2.3:8080",
            "[::ffff:127.0.0.1]:8080",
        ] {
            let local: SocketAddr = local.parse().unwrap();
            let hosts = own_hosts(local, &extra);
            for h in [
                "127.0.0.1:8080",
                "127.0.0.1:8081",
                "localhost:8080",
                "localhost:80",
                "[::1]:8080",
                "10.1.2.3:8080",
                "10.1.2.3:80",
                "[::ffff:127.0.0.1]:8080",
                "plugd.internal:8080",
                "plugd.internal:9",
                "other.example:9",
                "other.example:8080",
                "evil.example:8080",
                "localhost.evil:8080",
                "localhost",
                ":8080",
                "",
            ] {
                assert_eq!(
                    names_listener(local, &extra, h),
                    hosts.iter().any(|o| o == h),
                    "{local} {h}"
                );
            }
        }
    }
}
