//! plugd's HTTP API (`plugd serve`): plugins, tools, hook runs and agent
//! sessions over axum, with JSON errors of stable codes, on the workspace's
//! Unix socket and, with `--listen ADDR`, on TCP behind bearer tokens.
//!
//! Every request passes [`auth::authorize`] first (socket peer uid or token,
//! role, `Host`/`Origin` checks, audit); see that module. The listeners and
//! their timeouts are in [`listen`].
//!
//! Endpoints (all JSON; request bodies `application/json`, 1 MiB by default):
//!
//! | method and path                    | answer                                         |
//! |------------------------------------|------------------------------------------------|
//! | `GET /healthz`                     | `{"status": "ok"}`, without credentials |
//! | `GET /readyz`                      | `{"status": "ready"}`, or 503 while the state store cannot be read or this node runs another plugd.yaml than the cluster; without credentials (see [`cluster`]) |
//! | `GET /v1/cluster`                  | the live nodes, their leases and the cluster's configuration digest |
//! | `GET /v1/plugins`                  | the rows of `plugd plugin list --json`; with `q`, `limit`, `cursor`, `sort` or a filter (`state`, `dialect`, `approved`), `{"items", "next_cursor", "total"}` (see [`paging`], the same for the other lists it names) |
//! | `GET /v1/plugins/{id}`             | `plugd plugin show --json` from serve's runtime (live counters, `withheld_tools`) |
//! | `POST /v1/plugins/{id}:approve`    | `{}` → `plugd plugin approve` on serve's runtime, recorded as by the caller's identity; the row plus `digest` |
//! | `POST /v1/plugins/{id}:revoke`     | `{}` → `plugd plugin revoke`; the row plus `was_approved` |
//! | `POST /v1/plugins/{id}:reconfigure` | `{}` → apply stored settings (`plugd plugin config`); the row plus `applied` |
//! | `POST /v1/plugins/{id}:restart`    | `{}` → `plugd plugin restart`; the plugin row   |
//! | `POST /v1/plugins/{id}:stop`       | `{}` → `plugd plugin stop`: stopped until started (calls answer 503 `plugin_stopped`); the plugin row |
//! | `POST /v1/plugins/{id}:start`      | `{}` → `plugd plugin start`: clears the stop and starts it now; the plugin row |
//! | `GET /v1/tools`                    | the enabled rows of `plugd tool list --json`; paged with [`paging`]'s parameters (filters `plugin`, `risk`, `risk_source`, `enabled`) |
//! | `GET /v1/skills`                   | the skills of approved plugins (`plugd skill list --json`) |
//! | `GET /v1/skills/{plugin}/{name}`   | one skill `{plugin, name, text}`; 400 `invalid_skill_name`, 404 `unknown_skill`, 422 `skill_refused` (symlink, over 64 KiB) |
//! | `POST /v1/tools/{name}:invoke`     | `{"args", "agent_id"?}` → the tool's result; header `Plugd-Invocation-Id` names its record |
//! | `POST /v1/hooks/{point}:run`       | `{"payload", "context"?}` → `plugd hook run`'s JSON, 200 continue or blocked |
//! | `POST /v1/sessions/{id}/messages`  | `{"text", "context"?}` → one agent turn (`TurnOutcome`); SSE of `TurnEvent`s with `Accept: text/event-stream` |
//! | `GET /v1/sessions/{id}`            | the stored session, 404 when unknown           |
//! | `POST /v1/bus/publish`             | `{"subject", "payload"?, "source"?, "session_id"?}` → `{event, delivered, shed}` |
//! | `GET /v1/bus/tail/{pattern}`       | SSE: every bus event matching the pattern (`event: bus`) |
//! | `GET /metrics`                     | per-plugin and per-channel counters, Prometheus text format |
//! | `GET /v1/approvals`                | calls of high/critical tools waiting for an operator; paged with [`paging`]'s parameters (filters `risk`, `plugin`, `tool`) |
//! | `POST /v1/approvals/{id}:approve`  | `{}` → the waiting call runs; the approval record (`decided_by`: the caller's identity) |
//! | `POST /v1/approvals/{id}:deny`     | `{"reason"?}` → the waiting call fails (`call_denied`) |
//! | `GET /v1/resources`, `GET /v1/resources/templates`, `GET /v1/prompts` | MCP listings over every approved server (`?server=S` for one), each item with its server; see [`mcp_features`] |
//! | `POST /v1/resources:read`          | `{"server", "uri"}` → the MCP `resources/read` result |
//! | `POST /v1/prompts:get`             | `{"server", "name", "arguments"?}` → the MCP `prompts/get` result |
//! | `POST /v1/completions`             | `{"server", "ref", "argument", "context"?}` → `{"completion"}` |
//! | `GET /v1/plugin-packages`          | installed packages (`plugd package list --json`); paged with [`paging`]'s parameters (filters `package`, `signature`, `org`) |
//! | `GET /v1/plugin-packages/{id}`     | one: `sha256:DIGEST`, `ID@VERSION` or `ID` (its highest version); see [`packages`] |
//! | `POST /v1/plugin-packages`         | `{"source": "oci://…", "insecure"?}` → pull and install (operator); 201 new, 200 installed already |
//! | `POST /v1/plugin-packages/{id}:restart` | `{}` → `plugd package restart`: clears the failure and restart budget of its process (operator; org tokens refused); the record plus `had_process` |
//! | `GET`/`PUT /v1/plugins/{id}/config`, `GET /v1/plugins/{id}/logs`, `POST /v1/tools/{name}:enable\|disable`, `GET /v1/tools?all=true`, `GET /v1/events` | the operator console's; see [`console_api`] |
//! | `POST /v1/plugin-tools/{export_id}:invoke` | `{"input", "session_id"?, "project_id"?, "org_id"?}` → the tool's result, through the binding of the caller's scope (agent); see [`binding_calls`] |
//! | `GET /v1/plugin-bindings`, `POST`, `GET`/`PATCH /v1/plugin-bindings/{id}`, exports, org secrets | see [`bindings`]; the list paged with [`paging`]'s parameters (filters `org`, `project`) |
//! | `GET /v1/invocations`              | invocation records, newest first (`order=asc`: oldest first), `{"invocations", "next_cursor"}`; filters, `q`, `caller`: see [`invocations`] |
//! | `GET /v1/invocations/{id}`         | one record                                     |
//! | `GET /v1/invocations/stats`        | `{"since", "until", "bucket_ms", "series", "plugins", "tools", "scanned", "truncated"}`: calls, errors, p50/p99 per time bucket, plugin and tool; see [`invocation_stats`] |
//! | `GET /v1/tokens`                   | `{"tokens": [...]}`, never secrets (admin); see [`tokens_api`] |
//! | `POST /v1/tokens`                  | `{"name", "role", "expires_in"?, "org"?, "projects"?}` → 201 `{"id", "name", "role", "token", "expires_at"}` (admin) |
//! | `POST /v1/tokens/{id_or_name}:revoke` | `{}` → the token, revoked (admin); 404 `unknown_token` |
//! | `GET /v1/audit`                    | `{"entries", "next_cursor"}`: the audit trail, newest first, `limit`, `cursor`, `identity`, `q`, `status`, `since`, `until` (admin); see [`audit_api`] |
//!
//! A `by` member in a body is ignored: who did something is always the
//! authenticated identity (a socket peer's user name, or `token:NAME`).
//!
//! A blocked turn answers 403 (429 with a quota notice, 401 with an
//! unauthorized one) with the `outcome` beside the error; as SSE it is a
//! `done` event whose outcome is `blocked` (the status line is already 200).
//! A turn that cannot run at all ends an SSE stream with an `error` event
//! carrying the same JSON as the error response.
//!
//! Tool names may contain `/` (`hello-salmex-node/say_hello`): the route is a
//! wildcard whose last segment ends in `:invoke`. Plugin ids may too (VAI
//! package ids), so the plugin actions are routed the same way.
//!
//! Errors are [`ApiError`]s: `{"error": {"code", "message", "details"?}}`
//! with a fixed status per code (see [`error::code`]).
//!
//! **API boundary**: [`bind`] refuses TCP addresses that are not loopback:
//! plugd speaks plain HTTP, so bearer tokens would cross the network in
//! clear; put a TLS-terminating proxy on the same host in front instead.
//!
//! Why one file: the router and `AppState` are one table of routes with their
//! rights, and the core routes' handlers sit beside it; each larger family
//! (approvals, bindings, packages, chains, console API, MCP) has its own
//! module.

pub mod approvals;
pub mod audit_api;
pub mod auth;
pub mod binding_calls;
pub mod bindings;
pub mod chains;
pub mod cluster;
pub mod config_api;
mod console;
pub mod console_api;
pub mod error;
pub mod invocation_stats;
pub mod invocations;
mod invoke_stream;
pub mod listen;
pub mod marketplace;
pub mod mcp;
pub mod mcp_features;
pub mod mcp_sse;
pub mod mcp_stream;
pub mod oidc;
pub mod packages;
pub mod paging;
pub mod tokens_api;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use plugd_agent::agent::{Agent, AgentError, AgentSettings, TurnEvent, TurnOutcome, TurnStatus};
use plugd_agent::llm::LlmError;
use plugd_host::dialect::CallContext;
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::governed::{Governed, Surface};
use plugd_runtime::hooks::{HookContext, HookPoint, Pipeline};
use plugd_runtime::{PluginRow, Runtime};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

pub use error::ApiError;

mod bus;
mod channels;
mod traces;

/// The request body limit without configuration: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A non-loopback address: tokens would travel in clear.
    #[error(
        "refusing to listen on {addr}: it is not a loopback address and plugd speaks plain HTTP, so bearer tokens would cross the network in clear; use --listen 127.0.0.1:PORT or [::1]:PORT behind a TLS proxy"
    )]
    NotLoopback {
        /// The refused address.
        addr: SocketAddr,
    },
    /// The socket could not be bound.
    #[error(
        "cannot listen on {addr}: {source}; pick another --listen address or stop what uses it"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The `llm:` section names a provider that cannot be built.
    #[error("the llm: section of plugd.yaml cannot be used by the sessions endpoints: {0}")]
    Llm(#[from] LlmError),
}

/// Refuses `addr` unless it is loopback (`127.0.0.0/8`, `::1`, or an
/// IPv4-mapped loopback).
pub fn check_listen(addr: SocketAddr) -> Result<(), ServeError> {
    if addr.ip().to_canonical().is_loopback() {
        Ok(())
    } else {
        Err(ServeError::NotLoopback { addr })
    }
}

/// Checks `addr` with [`check_listen`] and binds it.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    check_listen(addr)?;
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// The loopback listener through which plugins reach this process's API
/// with their delegation tokens (VAI `context.gateway.base_url`): binds
/// `127.0.0.1:0`, serves `app` on it until `stop` behind
/// [`delegated_only`], and records its URL in the runtime's delegations.
/// Returns the bound address and the server task.
///
/// This is not the API's TCP listener: only requests with a delegation
/// token (`vai_dlg_…`) pass, and the auth middleware lets those reach the
/// delegated routes (`plugd_control::delegation::scope_for`) and nothing
/// else; any other request gets `404` on any other route and `401` on a
/// delegated one. `plugd serve` opens the API on TCP only with `--listen`.
pub async fn serve_delegated(
    runtime: &Runtime,
    app: Router,
    limits: listen::Limits,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>), ServeError> {
    let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
    let tcp = bind(addr).await?;
    let bound = tcp
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    runtime
        .delegations()
        .set_base_url(Some(format!("http://{bound}")));
    let app = app.layer(axum::middleware::from_fn(delegated_only));
    let task = tokio::spawn(listen::run(listen::Listener::Tcp(tcp), app, limits, stop));
    Ok((bound, task))
}

/// The delegation listener's gate (see [`serve_delegated`]), before the
/// auth middleware: a request with a delegation token goes on (auth checks
/// the token and its scope for the route); any other request is answered
/// here, `404` off the delegated routes, `401` on them.
pub async fn delegated_only(req: Request, next: axum::middleware::Next) -> Response {
    let delegated = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .is_some_and(|(scheme, token)| {
            scheme.eq_ignore_ascii_case("bearer")
                && token
                    .trim()
                    .starts_with(plugd_control::delegation::TOKEN_PREFIX)
        });
    if delegated {
        return next.run(req).await;
    }
    let method = req.method().as_str();
    let path = req.uri().path();
    if plugd_control::delegation::scope_for(method, path).is_none() {
        return ApiError::no_route(method, path).into_response();
    }
    let mut resp = ApiError::new(
        StatusCode::UNAUTHORIZED,
        error::code::UNAUTHENTICATED,
        format!(
            "this listener serves plugins' delegation tokens ({}…) only; other clients use plugd serve's socket or its --listen address",
            plugd_control::delegation::TOKEN_PREFIX
        ),
    )
    .into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"plugd\""),
    );
    resp
}

/// The API of a CLI command that runs VAI invocations itself (`plugd run`,
/// `plugd run --harness`): no agent, no hooks, served only to plugins on
/// loopback through [`serve_delegated`].
pub async fn delegated_api(
    runtime: &Runtime,
    config: Arc<PlugdConfig>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<SocketAddr, ServeError> {
    let pipeline = Arc::new(Pipeline::new(Vec::new()).unwrap_or_else(|_| unreachable!()));
    let limits = listen::Limits::from_config(&config.http);
    // `llm:complete` needs the provider; no hooks run on this API.
    let agent = agent_for(runtime, &pipeline, &config).await?;
    let state = AppState::new(runtime.clone(), pipeline, config, agent);
    let (addr, _task) = serve_delegated(runtime, router(state), limits, stop).await?;
    Ok(addr)
}

/// Builds the agent of the sessions endpoints from plugd.yaml's `llm:`
/// section over the pipeline `plugd serve` already built (Dexto modules are
/// not loaded twice). `None` without an `llm:` section.
pub async fn agent_for(
    runtime: &Runtime,
    pipeline: &Arc<Pipeline>,
    config: &PlugdConfig,
) -> Result<Option<Agent>, ServeError> {
    let Some(llm) = &config.llm else {
        return Ok(None);
    };
    let provider = plugd_agent::llm::build_provider(llm, runtime, runtime.dir()).await?;
    Ok(Some(Agent::new(
        runtime.clone(),
        pipeline.clone(),
        provider,
        AgentSettings {
            max_tool_rounds: config.agent.max_tool_rounds.max(1),
            system_prompt: runtime
                .system_prompt_with_skills(
                    config.agent.system_prompt.as_deref(),
                    &config.agent.skills,
                )
                .await,
            defaults: config.tenant.clone(),
            compactor: config.agent.compactor.clone(),
        },
    )))
}

/// Everything the handlers share. Cheap to clone: one reference count
/// (each request clones it, for the middleware and for its handler).
#[derive(Clone)]
pub struct AppState(Arc<AppShared>);

impl std::ops::Deref for AppState {
    type Target = AppShared;
    fn deref(&self) -> &AppShared {
        &self.0
    }
}

/// What an [`AppState`] holds (its fields are the server's own).
#[derive(Clone)]
pub struct AppShared {
    runtime: Runtime,
    pipeline: Arc<Pipeline>,
    config: Arc<PlugdConfig>,
    agent: Option<Agent>,
    body_limit: usize,
    body_timeout: Duration,
    auth: Arc<auth::AuthConfig>,
    mcp: Option<Arc<mcp::McpHttp>>,
    audit: Arc<plugd_store::tokens::AuditWriter>,
    console: Arc<plugd_console::Sessions>,
    /// serve's plugd.yaml gate (`GET`/`POST /v1/config`); `None` outside serve.
    config_gate: Option<Arc<plugd_runtime::config_gate::ConfigGate>>,
    /// Hands what another node must act on to that node (serve with
    /// `--nats`); `None` on a single node.
    forwarder: Option<Arc<dyn plugd_control::forward::Forwarder>>,
    /// plugd.yaml `auth:` with issuers (JWT access tokens, console SSO);
    /// `None`: plugd tokens only.
    oidc: Option<Arc<oidc::Oidc>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("workspace", &self.runtime.dir())
            .field("agent", &self.agent)
            .field("body_limit", &self.body_limit)
            .finish()
    }
}

impl AppState {
    /// State over the runtime, the hook pipeline, plugd.yaml and the agent
    /// (`None`: the sessions endpoints answer 503 `llm_not_configured`).
    pub fn new(
        runtime: Runtime,
        pipeline: Arc<Pipeline>,
        config: Arc<PlugdConfig>,
        agent: Option<Agent>,
    ) -> AppState {
        let auth = Arc::new(
            auth::AuthConfig::current(config.http.allowed_hosts.clone())
                .with_cors(&config.mcp.http.cors_allowed_origins),
        );
        let body_timeout = Duration::from_secs(config.http.body_timeout_secs);
        let runtime_state = runtime.state().clone();
        let gateway =
            plugd_gateway::Gateway::new(runtime.clone(), config.clone(), env!("CARGO_PKG_VERSION"));
        let audit = Arc::new(plugd_store::tokens::AuditWriter::start(
            runtime.state().clone(),
        ));
        let mcp = Some(Arc::new(mcp::McpHttp::new(
            gateway,
            &config.mcp.http,
            runtime_state.clone(),
        )));
        let oidc = oidc::Oidc::from_config(&config.auth);
        AppState(Arc::new(AppShared {
            runtime,
            pipeline,
            config,
            agent,
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout,
            auth,
            mcp,
            audit,
            console: Arc::new(plugd_console::Sessions::new(runtime_state)),
            config_gate: None,
            forwarder: None,
            oidc,
        }))
    }

    /// The cluster's forwarder (`plugd serve --nats`).
    pub fn with_forwarder(mut self, f: Arc<dyn plugd_control::forward::Forwarder>) -> AppState {
        Arc::make_mut(&mut self.0).forwarder = Some(f);
        self
    }

    /// Serves `GET`/`POST /v1/config` over serve's plugd.yaml gate.
    pub fn with_config_gate(
        mut self,
        gate: Arc<plugd_runtime::config_gate::ConfigGate>,
    ) -> AppState {
        Arc::make_mut(&mut self.0).config_gate = Some(gate);
        self
    }

    /// Sets the request body limit in bytes (413 beyond).
    pub fn with_body_limit(mut self, limit: usize) -> AppState {
        Arc::make_mut(&mut self.0).body_limit = limit;
        self
    }

    fn agent(&self) -> Result<&Agent, ApiError> {
        self.agent.as_ref().ok_or_else(|| {
            ApiError::llm_not_configured(&format!(
                "{} has no llm: section; add one (provider: openai | plugin | scripted) and restart plugd serve",
                self.runtime
                    .dir()
                    .join(plugd_runtime::config::CONFIG_FILE)
                    .display()
            ))
        })
    }
}

/// The API's router over `state`.
pub fn router(state: AppState) -> Router {
    let limit = state.body_limit;
    let authorize = axum::middleware::from_fn_with_state(state.clone(), auth::authorize);
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/plugins", get(list_plugins))
        .route(
            "/v1/plugins/{*action}",
            post(plugin_action)
                .get(plugin_get)
                .put(console_api::plugin_put),
        )
        .route("/v1/events", get(console_api::events))
        .route(
            "/v1/config",
            get(config_api::show).post(config_api::approve),
        )
        .route("/v1/tools", get(list_tools))
        .route("/v1/skills", get(list_skills))
        .route("/v1/skills/{*path}", get(show_skill))
        .route("/v1/tools/{*name}", post(invoke_tool))
        .route("/v1/plugin-tools/{export}", post(binding_calls::invoke))
        .route("/v1/hooks/{point}", post(run_hook))
        .route("/v1/sessions/{id}/messages", post(post_message))
        .route("/v1/sessions", get(chains::list_sessions))
        .route("/v1/sessions/{id}", get(chains::get_session))
        .route(
            "/v1/sessions/{id}/compactions",
            get(chains::list_compactions),
        )
        .route("/v1/chains/{id}", get(chains::get_chain))
        .route(
            "/v1/chains/{id}/blocks",
            get(chains::get_chain).post(chains::append_blocks),
        )
        .route("/v1/runs", get(chains::list_runs).post(chains::create_run))
        .route(
            "/v1/runs/{id}",
            get(chains::get_run).patch(chains::patch_run),
        )
        .route("/v1/compactions", post(chains::compact))
        .route("/v1/compactions/jobs/{id}", get(chains::compaction_job))
        .route("/v1/llm:complete", post(chains::llm_complete))
        .route("/v1/bus/publish", post(bus::publish))
        .route("/v1/bus/tail/{pattern}", get(bus::tail))
        .route("/metrics", get(bus::metrics))
        .route(
            "/mcp",
            post(mcp::post_mcp)
                .get(mcp::get_mcp)
                .delete(mcp::delete_mcp),
        )
        .route(
            "/mcp/{profile}",
            post(mcp::post_mcp)
                .get(mcp::get_mcp)
                .delete(mcp::delete_mcp),
        )
        .merge(mcp_sse::routes(state.config.mcp.http.legacy_sse))
        .merge(approvals::routes())
        .merge(mcp_features::routes())
        .merge(packages::routes())
        .merge(bindings::routes())
        .merge(marketplace::routes())
        .merge(invocations::routes())
        .merge(tokens_api::routes())
        .merge(audit_api::routes())
        .merge(cluster::routes())
        .merge(console::routes())
        .merge(oidc::routes())
        // After routing, on every route (not on the fallbacks): the matched
        // route's right, on its decoded parameters.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authorize_route,
        ))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(authorize);
    // The request span's layer only when traces are exported (decided at
    // start-up, before the router): with traces off, a middleware that
    // only passes requests on still costs a boxed future per request.
    let app = if plugd_telemetry::enabled() {
        app.layer(axum::middleware::from_fn(traces::trace_request))
    } else {
        app
    };
    app.with_state(state)
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        error::code::METHOD_NOT_ALLOWED,
        format!(
            "{} does not accept {method}; see README.md (HTTP API) for the endpoints",
            uri.path()
        ),
    )
}

/// A JSON request body: `application/json` (415 otherwise), within the body
/// limit (413), parsed with its error position (400 malformed, 422 wrong
/// shape). An empty body without a content type is `{}`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or("(not text)").to_owned());
        // A declared length over the limit is refused before reading.
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > state.body_limit as u64) {
            return Err(ApiError::too_large(state.body_limit));
        }
        let bytes = tokio::time::timeout(
            state.body_timeout,
            axum::body::Bytes::from_request(req, state),
        )
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                error::code::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (plugd.yaml http.body_timeout_secs)",
                    state.body_timeout.as_secs()
                ),
            )
        })?
        .map_err(|e| body_rejection(&e, state.body_limit))?;
        let is_json = content_type.as_deref().is_some_and(|ct| {
            let mime = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        });
        let bytes: &[u8] = match (&content_type, bytes.is_empty()) {
            (None, true) => b"{}",
            _ if is_json => &bytes,
            _ => return Err(ApiError::media_type(content_type.as_deref())),
        };
        serde_json::from_slice(bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::json(&e))
    }
}

fn body_rejection(e: &BytesRejection, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(limit)
    } else {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            error::code::BAD_REQUEST,
            format!("the request body could not be read: {}", e.body_text()),
        )
    }
}

async fn list_plugins(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let paging = paging::PageQuery::parse(paging::PLUGINS, query.as_deref())?;
    let plugins = state.runtime.plugin_list().await?;
    let rows: Vec<PluginRow<'_>> = plugins.iter().map(PluginRow::live).collect();
    if !paging.paged() {
        return Ok(Json(rows).into_response());
    }
    Ok(Json(paging.answer(paging::rows_json(&rows)?)).into_response())
}

/// The body of `POST /v1/plugins/{id}:approve|revoke|restart`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginActionRequest {
    /// Ignored (kept so older clients' bodies still parse): who approves is
    /// the authenticated identity.
    #[serde(default)]
    pub by: Option<String>,
}

/// What `POST /v1/plugins/{id}:ACTION` does: the CLI's `plugd plugin ACTION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginAction {
    /// `:approve`.
    Approve,
    /// `:revoke`.
    Revoke,
    /// `:restart`.
    Restart,
    /// `:reconfigure`: apply the settings stored by `plugd plugin config`
    /// (Salmex `config/changed`, others restarted). The CLI sends no value
    /// over HTTP: both processes read the same state database (the
    /// console's `PUT /v1/plugins/{id}/config` is the route that carries
    /// values, see [`console_api`]).
    Reconfigure,
    /// `:stop`: an operator stop that holds until `:start`.
    Stop,
    /// `:start`: clear an operator stop (or a failure) and start now.
    Start,
}

impl PluginAction {
    /// Every action.
    pub const ALL: [PluginAction; 6] = [
        PluginAction::Approve,
        PluginAction::Revoke,
        PluginAction::Restart,
        PluginAction::Reconfigure,
        PluginAction::Stop,
        PluginAction::Start,
    ];

    /// The suffix after `:` in the path.
    pub fn name(self) -> &'static str {
        match self {
            PluginAction::Approve => "approve",
            PluginAction::Revoke => "revoke",
            PluginAction::Restart => "restart",
            PluginAction::Reconfigure => "reconfigure",
            PluginAction::Stop => "stop",
            PluginAction::Start => "start",
        }
    }

    /// Splits `{id}:{action}` (the id may contain `/` and `:`; the action is
    /// after the last `:`).
    pub fn split(path: &str) -> Option<(&str, PluginAction)> {
        let (id, name) = auth::action_of(path)?;
        let action = PluginAction::ALL.into_iter().find(|a| a.name() == name)?;
        (!id.is_empty()).then_some((id, action))
    }
}

async fn plugin_action(
    State(state): State<AppState>,
    Path(path): Path<String>,
    method: Method,
    uri: Uri,
    axum::Extension(who): axum::Extension<auth::Identity>,
    JsonBody(_body): JsonBody<PluginActionRequest>,
) -> Result<Json<Value>, ApiError> {
    let Some((id, action)) = PluginAction::split(&path) else {
        return Err(ApiError::no_route(method.as_str(), uri.path()));
    };
    let rt = &state.runtime;
    let mut was_approved = None;
    let mut applied = None;
    let info = match action {
        PluginAction::Approve => rt.approve(id, who.by()).await?,
        PluginAction::Revoke => {
            was_approved = Some(rt.revoke(id).await?);
            rt.plugin(id).await?
        }
        PluginAction::Restart => {
            rt.restart(id).await?;
            rt.plugin(id).await?
        }
        PluginAction::Reconfigure => {
            applied = Some(rt.config_apply(id).await?);
            rt.plugin(id).await?
        }
        PluginAction::Stop => {
            rt.stop(id, who.by()).await?;
            rt.plugin(id).await?
        }
        PluginAction::Start => {
            rt.start(id).await?;
            rt.plugin(id).await?
        }
    };
    // Approvals and settings change a row without a status change.
    rt.plugin_changed(id);
    let mut row = serde_json::to_value(PluginRow::live(&info)).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error::code::INTERNAL,
            format!("cannot encode the plugin row of {id:?}: {e}"),
        )
    })?;
    if let Some(map) = row.as_object_mut() {
        if let Some(had) = was_approved {
            map.insert("was_approved".into(), Value::Bool(had));
        }
        if let Some(a) = applied {
            map.insert(
                "applied".into(),
                serde_json::to_value(a).unwrap_or(Value::Null),
            );
        }
        if action == PluginAction::Approve {
            let digest = info.approval.as_ref().map(|a| a.digest.clone());
            map.insert("digest".into(), digest.map_or(Value::Null, Value::String));
            // Non-fatal manifest findings, so `plugd plugin approve` shows
            // what it approved despite them.
            map.insert(
                "warnings".into(),
                serde_json::to_value(&info.warnings).unwrap_or(Value::Null),
            );
        }
    }
    Ok(Json(row))
}

/// `GET /v1/plugins/{id}`: everything `plugd plugin show --json` prints, from
/// serve's runtime (live counters included); `{id}/config` and `{id}/logs`
/// are the console's ([`console_api`]).
async fn plugin_get(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    match console_api::split_get(&state, &rest) {
        console_api::PluginGet::Show(id) => {
            Ok(Json(state.runtime.plugin(id).await?).into_response())
        }
        console_api::PluginGet::Config(id) => console_api::config_get(&state, id).await,
        console_api::PluginGet::Logs(id) => {
            console_api::logs(&state, id, query.as_deref(), &headers)
        }
    }
}

async fn list_tools(
    State(state): State<AppState>,
    axum::Extension(who): axum::Extension<auth::Identity>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let paging = paging::PageQuery::parse(paging::TOOLS, query.as_deref())?;
    if let Some(t) = &who.tenant {
        // An org token: the exports bound to its scope (the one catalog,
        // issue 28), as its MCP sessions and `/v1/plugin-tools/{export}:invoke`
        // name them.
        let rows = bound_tool_rows(&state.runtime, &who, t).await?;
        if !paging.paged() {
            return Ok(Json(rows).into_response());
        }
        return Ok(Json(paging.answer(rows)).into_response());
    }
    let mut rows = state.runtime.tool_views()?;
    // plugd.yaml's `policy:` hides what a deny rule keeps from this caller.
    // With the role and groups `:invoke` gives its calls (`caller_role`,
    // `caller_groups`), so a rule hides here what it refuses there.
    let caller = plugd_runtime::tool_policy::PolicyCaller {
        groups: who.groups.clone(),
        role: who.role.as_str().to_owned(),
        ..plugd_runtime::tool_policy::PolicyCaller::named(&who.name)
    };
    rows.retain(|t| !state.runtime.policy_hides(&caller, &t.entry));
    // What an agent may call: disabled tools are left out, unless
    // `?all=true` (the console's tools page) asks for every one, or an
    // `enabled` filter says which.
    let all = paging
        .own("all")
        .is_some_and(|v| matches!(v, "true" | "1" | ""));
    if !all && !paging.has_filter("enabled") {
        rows.retain(|t| t.enabled);
    }
    if !paging.paged() {
        return Ok(Json(rows).into_response());
    }
    Ok(Json(paging.answer(paging::rows_json(&rows)?)).into_response())
}

/// `GET /v1/tools` of a token bound to org `t`: one row per tool export
/// bound to its scope (org-wide bindings, and those of its project when it
/// is limited to exactly one), shaped like a workspace tool's row (`name`
/// is the export id) with the binding it resolves to now (`binding_id`,
/// `package_id`, `package_version`); what plugd.yaml's `policy:` hides from
/// the token is left out.
async fn bound_tool_rows(
    rt: &Runtime,
    who: &auth::Identity,
    t: &plugd_store::tokens::Tenancy,
) -> Result<Vec<Value>, ApiError> {
    let project = match t.project_ids.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    };
    let call = plugd_runtime::bindings_rt::ExportCall {
        org_id: t.org_id.clone(),
        project_id: project.clone(),
        caller: Some(who.name.clone()),
        ..Default::default()
    };
    let caller = plugd_runtime::tool_policy::PolicyCaller {
        org: t.org_id.clone(),
        project: project.unwrap_or_default(),
        role: who.role.as_str().to_owned(),
        ..plugd_runtime::tool_policy::PolicyCaller::named(&who.name)
    };
    let policy = rt
        .risk_config()
        .map_err(plugd_runtime::RuntimeError::from)?;
    let exports = rt
        .scoped_exports(&call, &Default::default(), &caller)
        .await?;
    exports
        .into_iter()
        .map(|x| {
            let (risk, risk_source) = plugd_runtime::risk::effective_risk(&x.entry, &policy);
            let mut row = serde_json::to_value(plugd_runtime::risk::ToolView {
                entry: x.entry.clone(),
                risk,
                risk_source,
                enabled: true,
            })
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    error::code::INTERNAL,
                    e.to_string(),
                )
            })?;
            row["name"] = json!(x.export_id);
            row["plugin"] = json!(x.binding.package_id);
            row["export_id"] = json!(x.export_id);
            row["binding_id"] = json!(x.binding.binding_id);
            row["package_id"] = json!(x.binding.package_id);
            row["package_version"] = json!(x.binding.package_version);
            Ok(row)
        })
        .collect()
}

async fn list_skills(State(state): State<AppState>) -> Json<Value> {
    Json(json!(state.runtime.skills().await))
}

/// `GET /v1/skills/{plugin}/{name}`: the plugin id is everything before the
/// last `/` (VAI-style ids may contain `/`).
async fn show_skill(
    State(state): State<AppState>,
    Path(path): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (plugin, name) = path
        .rsplit_once('/')
        .ok_or_else(|| ApiError::from(plugd_runtime::skills::SkillError::BadName(path.clone())))?;
    let skill = state.runtime.skill(plugin, name).await?;
    Ok(Json(json!(skill)))
}

/// The body of `POST /v1/tools/{name}:invoke`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeRequest {
    /// The arguments (a JSON object; `{}` when absent).
    #[serde(default)]
    pub args: Option<Value>,
    /// The agent the call is made for.
    #[serde(default)]
    pub agent_id: Option<String>,
}

async fn invoke_tool(
    State(state): State<AppState>,
    Path(path): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    axum::Extension(who): axum::Extension<auth::Identity>,
    JsonBody(body): JsonBody<InvokeRequest>,
) -> Result<Response, ApiError> {
    let (name, action) = auth::action_of(&path)
        .filter(|(n, _)| !n.is_empty())
        .ok_or_else(|| ApiError::no_route(method.as_str(), uri.path()))?;
    for (suffix, enabled) in [("enable", true), ("disable", false)] {
        if action == suffix {
            if body.args.is_some() || body.agent_id.is_some() {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    error::code::INVALID_BODY,
                    format!(":{suffix} takes no members; send {{}}"),
                ));
            }
            return console_api::set_enabled(&state, name, enabled, &who)
                .await
                .map(IntoResponse::into_response);
        }
    }
    if action != "invoke" {
        return Err(ApiError::no_route(method.as_str(), uri.path()));
    }
    let args = body.args.unwrap_or_else(|| json!({}));
    if !args.is_object() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            error::code::INVALID_ARGUMENTS,
            format!("\"args\" must be a JSON object of {name:?}'s arguments, got {args}"),
        )
        .with_details(json!({"fields": [{"path": "", "message": "not an object"}]})));
    }
    // The record's id, named before the call runs so the answer (JSON or
    // a stream) can carry it in `Plugd-Invocation-Id`.
    let invocation_id = plugd_runtime::invocations::fresh_invocation_id();
    let ctx = CallContext {
        agent_id: body.agent_id,
        caller_role: Some(who.role.as_str().to_owned()),
        caller_groups: who.groups,
        caller: Some(who.name),
        user: who.user,
        // The caller's W3C trace, kept in the record whether or not traces
        // are exported (the governed path makes one when there is none).
        trace_id: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(plugd_telemetry::trace_id_of),
        invocation_id: Some(invocation_id.clone()),
        ..CallContext::default()
    };
    let mut resp = if wants_sse(&headers) {
        invoke_stream::invoke(state, name.to_owned(), args, ctx)
    } else {
        let gov = Governed::new(Surface::Http);
        match state
            .runtime
            .call_tool_governed(name, args, &ctx, &gov)
            .await
            .outcome
        {
            Ok(result) => Json(result).into_response(),
            Err(e) => ApiError::from(e).into_response(),
        }
    };
    if let Ok(v) = header::HeaderValue::from_str(&invocation_id) {
        resp.headers_mut().insert(INVOCATION_ID_HEADER, v);
    }
    Ok(resp)
}

/// The response header of `POST /v1/tools/{name}:invoke` (JSON, error or
/// stream) naming the call's invocation record (`inv_…`; a call of an
/// unknown tool leaves none).
pub const INVOCATION_ID_HEADER: &str = "plugd-invocation-id";

/// The body of `POST /v1/hooks/{point}:run`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookRunRequest {
    /// The payload, with Dexto's field names.
    pub payload: Value,
    /// Context fields; plugd.yaml's `tenant:` fills the rest.
    #[serde(default)]
    pub context: Option<HookContext>,
}

async fn run_hook(
    State(state): State<AppState>,
    Path(segment): Path<String>,
    method: Method,
    uri: Uri,
    JsonBody(body): JsonBody<HookRunRequest>,
) -> Result<Json<Value>, ApiError> {
    let Some((name, "run")) = auth::action_of(&segment) else {
        return Err(ApiError::no_route(method.as_str(), uri.path()));
    };
    let point = HookPoint::parse(name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            error::code::UNKNOWN_HOOK_POINT,
            format!(
                "unknown hook point {name:?}; use one of: {}",
                HookPoint::ALL.map(HookPoint::name).join(", ")
            ),
        )
        .with_details(json!({"point": name}))
    })?;
    if !body.payload.is_object() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            error::code::INVALID_BODY,
            format!(
                "\"payload\" must be a JSON object with the payload fields of {point}, got {}",
                body.payload
            ),
        ));
    }
    let ctx = state.config.context(&body.context.unwrap_or_default());
    let outcome = state.pipeline.run(point, body.payload, &ctx).await;
    let mut out = serde_json::to_value(&outcome).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error::code::INTERNAL,
            format!("cannot encode the hook outcome: {e}"),
        )
    })?;
    if let Some(map) = out.as_object_mut() {
        map.entry("message").or_insert(Value::Null);
    }
    Ok(Json(out))
}

/// The body of `POST /v1/sessions/{id}/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageRequest {
    /// The user's message.
    pub text: String,
    /// Context fields; plugd.yaml's `tenant:` fills the rest.
    #[serde(default)]
    pub context: Option<HookContext>,
}

pub(crate) fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/event-stream"))
}

async fn post_message(
    State(state): State<AppState>,
    Path(id): Path<String>,
    axum::Extension(who): axum::Extension<crate::auth::Identity>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<MessageRequest>,
) -> Result<Response, ApiError> {
    let agent = state.agent()?.clone();
    let mut ctx = body.context.unwrap_or_default();
    ctx.session_id = Some(id.clone());
    let org = match &who.tenant {
        None => None,
        Some(t) => {
            // An org identity's turn: its session is the org's (one of
            // another scope answers 404), the tenant is its org whatever
            // the body says, and the model is offered the org's catalog.
            org_session(&state, t, &id).await?;
            ctx.tenant_id = Some(t.org_id.clone());
            Some(plugd_agent::agent::OrgTurn {
                org_id: t.org_id.clone(),
                // As on /mcp and :invoke without a project_id: the project
                // when limited to exactly one, else org-wide bindings.
                project_id: match t.project_ids.as_slice() {
                    [one] => Some(one.clone()),
                    _ => None,
                },
                caller: who.name.clone(),
                role: Some(who.role.as_str().to_owned()),
                groups: who.groups.clone(),
            })
        }
    };
    if !wants_sse(&headers) {
        let outcome = match &org {
            None => agent.turn(&id, &body.text, &ctx, None).await?,
            Some(org) => agent.turn_for_org(&id, &body.text, &ctx, org, None).await?,
        };
        return Ok(match outcome.status {
            TurnStatus::Completed => Json(outcome).into_response(),
            TurnStatus::Blocked => ApiError::blocked(&outcome).into_response(),
        });
    }
    let (events_tx, events) = mpsc::unbounded_channel();
    let (result_tx, result) = oneshot::channel();
    // The turn runs to its end even if the client goes away: its transcript
    // is stored either way.
    tokio::spawn(async move {
        let r = match &org {
            None => agent.turn(&id, &body.text, &ctx, Some(events_tx)).await,
            Some(org) => {
                agent
                    .turn_for_org(&id, &body.text, &ctx, org, Some(events_tx))
                    .await
            }
        };
        let _ = result_tx.send(r);
    });
    let stream = futures_util::stream::unfold(
        SseState {
            events,
            result: Some(result),
            saw_done: false,
        },
        next_sse,
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Whether tenant `t` may run a turn in session `id`: `404` when it exists
/// in another scope (a new one is created in the org by the turn).
async fn org_session(
    state: &AppState,
    t: &plugd_store::tokens::Tenancy,
    id: &str,
) -> Result<(), ApiError> {
    let unknown = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            error::code::NOT_FOUND,
            format!("session {id:?} does not exist (or is not in your scope)"),
        )
    };
    if !plugd_store::sessions::valid_session_id(id) {
        return Err(unknown());
    }
    let store = state.runtime.state();
    let existing = store
        .session_info(id)
        .await
        .map_err(crate::error::store_error)?;
    let scope = plugd_control::chains::ScopeFilter {
        org_id: Some(t.org_id.clone()),
        project_ids: t.project_ids.clone(),
        workspace_only: false,
    };
    match existing {
        Some(s) if !scope.sees(s.org_id.as_deref(), s.project_id.as_deref()) => Err(unknown()),
        _ => Ok(()),
    }
}

struct SseState {
    events: mpsc::UnboundedReceiver<TurnEvent>,
    result: Option<oneshot::Receiver<Result<TurnOutcome, AgentError>>>,
    saw_done: bool,
}

/// The next SSE event: the turn's events as they come, then (if the turn
/// sent no `done`) a `done` from its result, or an `error` event.
async fn next_sse(mut st: SseState) -> Option<(Result<Event, Infallible>, SseState)> {
    if !st.saw_done
        && let Some(ev) = st.events.recv().await
    {
        st.saw_done = matches!(ev, TurnEvent::Done { .. });
        return Some((Ok(sse_event(&ev)), st));
    }
    let result = st.result.take()?.await;
    let event = match result {
        Ok(Ok(_)) if st.saw_done => return None,
        Ok(Ok(outcome)) => {
            st.saw_done = true;
            sse_event(&TurnEvent::Done {
                outcome: Box::new(outcome),
            })
        }
        Ok(Err(e)) => error_event(&ApiError::from(e)),
        Err(_) => error_event(&ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error::code::INTERNAL,
            "the turn ended without a result (its task panicked); see plugd's log",
        )),
    };
    Some((Ok(event), st))
}

/// `event: <type>` and `data: <the TurnEvent as JSON>`.
pub fn sse_event(ev: &TurnEvent) -> Event {
    let data = serde_json::to_value(ev).unwrap_or(Value::Null);
    let kind = data
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("event")
        .to_owned();
    Event::default().event(kind).data(data.to_string())
}

fn error_event(e: &ApiError) -> Event {
    Event::default().event("error").data(e.body().to_string())
}

#[cfg(test)]
mod tests;
