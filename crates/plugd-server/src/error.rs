//! HTTP errors as types: each [`ApiError`] has a fixed status and a stable
//! code, and renders as `{"error": {"code", "message", "details"?}}`.
//!
//! The mapping from runtime errors lives here too, so a status is decided in
//! one place: unknown tool/plugin/session → 404, argument schema violation →
//! 422, tool failure → 502, plugin unavailable → 503, plugin timeout → 504,
//! a call the risk gate refused (disabled, denied, not approved) → 403, an
//! unknown call approval → 404, one decided already → 409.
//!
//! MCP resources, prompts and completion (`crate::mcp_features`): a server
//! that did not declare the capability → 422 `capability_missing`, a
//! plugin of another dialect → 422 `not_supported_by_dialect`, an
//! unapproved one → 403 `plugin_not_approved`, resources denied by
//! plugd.yaml → 403 `resources_denied`, the server's `-32002` → 404
//! `unknown_resource`, its `-32602` → 422 `invalid_params`, another error
//! reply → 502 `server_error`, a reply of the wrong shape or over a bound →
//! 502 `plugin_error`; each names `details.server`.
//!
//! A plugin's typed tool errors keep their class: `-33401` → 404
//! `tool_not_found`, `-33402` → 422 `invalid_arguments` (`details.fields`),
//! `-33403` → 502 `tool_failed`, `-33404` → 503 `tool_unavailable` with a
//! `Retry-After` header and `details.retry_after_ms`, `-33405` → 403
//! `tool_denied`; each names `details.plugin`, `details.tool` and
//! `details.rpc_code` (docs/contracts/errors.md).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use plugd_agent::agent::{AgentError, TurnOutcome};
use plugd_dialects::FeatureError;
use plugd_host::{CallError, CallToolError, ToolError};
use plugd_runtime::llm::LlmError;
use plugd_runtime::risk::{DecideError, GateError};
use plugd_runtime::{ArgsError, RuntimeError};
use serde_json::{Value, json};

/// Stable error codes of the HTTP API (the `error.code` field).
pub mod code {
    /// A console request that changes state without its session's CSRF token.
    pub const CSRF: &str = "csrf";
    /// No such route.
    pub const NOT_FOUND: &str = "not_found";
    /// The MCP gateway has too many sessions open.
    pub const TOO_MANY_SESSIONS: &str = "too_many_sessions";
    /// This serve has no MCP gateway.
    pub const MCP_UNAVAILABLE: &str = "mcp_unavailable";
    /// No such MCP session (ended, expired, or someone else's).
    pub const MCP_SESSION_NOT_FOUND: &str = "mcp_session_not_found";
    /// An MCP request without the `Mcp-Session-Id` it needs.
    pub const MCP_SESSION_REQUIRED: &str = "mcp_session_required";
    /// The client does not accept what the route answers with.
    pub const NOT_ACCEPTABLE: &str = "not_acceptable";
    /// The route exists but not for this method.
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    /// The body is not JSON (`details.line`, `details.column`).
    pub const MALFORMED_JSON: &str = "malformed_json";
    /// The body is JSON of the wrong shape (`details.line`, `details.column`).
    pub const INVALID_BODY: &str = "invalid_body";
    /// The request is not `application/json`.
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
    /// The body is over the size limit.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// The body could not be read.
    pub const BAD_REQUEST: &str = "bad_request";
    /// No tool of that name.
    pub const UNKNOWN_TOOL: &str = "unknown_tool";
    /// No plugin of that id.
    pub const UNKNOWN_PLUGIN: &str = "unknown_plugin";
    /// The tool's plugin changed since approval; its tools are withheld
    /// until it is approved again (the message names the files).
    pub const PLUGIN_CHANGED: &str = "plugin_changed";
    /// No session of that id.
    pub const UNKNOWN_SESSION: &str = "unknown_session";
    /// No hook point of that name.
    pub const UNKNOWN_HOOK_POINT: &str = "unknown_hook_point";
    /// The arguments violate the tool's input schema (`details.fields`).
    pub const INVALID_ARGUMENTS: &str = "invalid_arguments";
    /// The session id is not acceptable.
    pub const INVALID_SESSION_ID: &str = "invalid_session_id";
    /// The tool ran and failed (the plugin's message).
    pub const TOOL_FAILED: &str = "tool_failed";
    /// 404: the plugin says it does not implement the tool (`-33401`).
    pub const TOOL_NOT_FOUND: &str = "tool_not_found";
    /// 503: the tool is transiently unavailable (`-33404`); `Retry-After`
    /// and `details.retry_after_ms` when the plugin gave a hint.
    pub const TOOL_UNAVAILABLE: &str = "tool_unavailable";
    /// 400: not a skill name (`..`, `/`, other characters).
    pub const INVALID_SKILL_NAME: &str = "invalid_skill_name";
    /// 404: no such skill of an approved plugin.
    pub const UNKNOWN_SKILL: &str = "unknown_skill";
    /// 422: the skill exists but is not served (symlink, too large, not UTF-8).
    pub const SKILL_REFUSED: &str = "skill_refused";
    /// 503: an operator stopped the plugin (`plugd plugin start ID`).
    pub const PLUGIN_STOPPED: &str = "plugin_stopped";
    /// The plugin's own authorization refused the call.
    pub const TOOL_DENIED: &str = "tool_denied";
    /// The plugin cannot be reached (not started, failed, crashed, broken).
    pub const PLUGIN_UNAVAILABLE: &str = "plugin_unavailable";
    /// The plugin did not answer in time.
    pub const PLUGIN_TIMEOUT: &str = "plugin_timeout";
    /// The plugin answered with something unusable.
    pub const PLUGIN_ERROR: &str = "plugin_error";
    /// plugd.yaml has no `llm:` section.
    pub const LLM_NOT_CONFIGURED: &str = "llm_not_configured";
    /// The LLM provider failed.
    pub const LLM_UNAVAILABLE: &str = "llm_unavailable";
    /// The model kept calling tools past `agent.max_tool_rounds`.
    pub const TOO_MANY_ROUNDS: &str = "too_many_rounds";
    /// A hook blocked the turn (403).
    pub const TURN_BLOCKED: &str = "turn_blocked";
    /// A `before_tool_call` / `after_tool_result` hook refused a tool call (403).
    pub const BLOCKED_BY_HOOK: &str = "blocked_by_hook";
    /// A hook blocked the turn with a quota notice (429).
    pub const QUOTA_EXCEEDED: &str = "quota_exceeded";
    /// A hook blocked the turn with an unauthorized notice (401).
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// The tool is disabled (`plugd tool enable NAME`).
    pub const TOOL_DISABLED: &str = "tool_disabled";
    /// An operator (or the caller's approver) denied the call.
    pub const CALL_DENIED: &str = "call_denied";
    /// Nobody approved the call within `risk.approval_timeout_secs`.
    pub const APPROVAL_TIMED_OUT: &str = "approval_timed_out";
    /// The call needs an approval and nobody could be asked.
    pub const APPROVAL_REQUIRED: &str = "approval_required";
    /// plugd.yaml's risk policy cannot be read, so no tool runs.
    pub const RISK_POLICY_INVALID: &str = "risk_policy_invalid";
    /// No call approval of that id.
    pub const UNKNOWN_APPROVAL: &str = "unknown_approval";
    /// The call approval was decided (or timed out) already.
    pub const APPROVAL_ALREADY_DECIDED: &str = "approval_already_decided";
    /// 422: the MCP server did not declare the capability the request needs
    /// (`details.server`, `details.capability`).
    pub const CAPABILITY_MISSING: &str = "capability_missing";
    /// 422: the plugin is not an MCP server, so it has no resources,
    /// prompts or completion.
    pub const NOT_SUPPORTED_BY_DIALECT: &str = "not_supported_by_dialect";
    /// 403: the plugin is not approved.
    pub const PLUGIN_NOT_APPROVED: &str = "plugin_not_approved";
    /// 403: plugd.yaml refuses this server's resources
    /// (`mcp.servers.NAME.resources: false`), or cannot be loaded.
    pub const RESOURCES_DENIED: &str = "resources_denied";
    /// 404: the MCP server has no such resource (its `-32002`).
    pub const UNKNOWN_RESOURCE: &str = "unknown_resource";
    /// 422: the MCP server refused the request's parameters (its `-32602`:
    /// an unknown prompt or resource, a missing argument).
    pub const INVALID_PARAMS: &str = "invalid_params";
    /// 502: the MCP server answered with another JSON-RPC error
    /// (`details.rpc_code`).
    pub const SERVER_ERROR: &str = "server_error";
    /// 400: `source` is not an `oci://` reference (`POST /v1/plugin-packages`).
    pub const INVALID_SOURCE: &str = "invalid_source";
    /// 400: not `sha256:DIGEST`, `ID@VERSION` or `ID`.
    pub const INVALID_PACKAGE_ID: &str = "invalid_package_id";
    /// 404: no installed package of that id, version or digest.
    pub const UNKNOWN_PACKAGE: &str = "unknown_package";
    /// 422: the package was refused for its content (secrets, links, paths,
    /// bounds, manifest, not a plugd artifact).
    pub const PACKAGE_REFUSED: &str = "package_refused";
    /// 502: a blob or manifest from the registry does not match its digest.
    pub const PACKAGE_TAMPERED: &str = "package_tampered";
    /// 502: the registry failed or refused.
    pub const REGISTRY_ERROR: &str = "registry_error";
    /// 409: another digest is installed as the same `package_id@version`.
    pub const PACKAGE_VERSION_TAKEN: &str = "package_version_taken";
    /// 404: no binding of that id the caller may see.
    pub const UNKNOWN_BINDING: &str = "unknown_binding";
    /// 422: a binding fails its checks (`details.problems`).
    pub const INVALID_BINDING: &str = "invalid_binding";
    /// 422: the package has no such export.
    pub const UNKNOWN_EXPORT: &str = "unknown_export";
    /// 404: no invocation record with that id.
    pub const UNKNOWN_INVOCATION: &str = "unknown_invocation";
    /// 422: a package's signature is invalid, or the trust policy (or the
    /// marketplace mode) refuses it.
    pub const SIGNATURE_REFUSED: &str = "signature_refused";
    /// 503: plugd.yaml sets no `marketplace:`.
    pub const MARKETPLACE_NOT_CONFIGURED: &str = "marketplace_not_configured";
    /// 502: the marketplace index cannot be read or fails a check.
    pub const MARKETPLACE_INDEX_REFUSED: &str = "marketplace_index_refused";
    /// 404: no marketplace entry of that id.
    pub const UNKNOWN_ENTRY: &str = "unknown_entry";
    /// 409: a contract-ready entry, or one the marketplace mode refuses.
    pub const ENTRY_NOT_INSTALLABLE: &str = "entry_not_installable";
    /// 422: a package lacks an export its marketplace entry names.
    pub const ENTRY_MISMATCH: &str = "entry_mismatch";
    /// Anything else that went wrong inside plugd.
    pub const INTERNAL: &str = "internal";
    /// The request conflicts with the record's state (e.g. an append to a compacted chain).
    pub const CONFLICT: &str = "conflict";
    /// A delegation token lacks the scope a route needs.
    pub const MISSING_SCOPE: &str = "missing_scope";
    /// 422: a plugin's settings are invalid or cannot be decrypted.
    pub const INVALID_CONFIG: &str = "invalid_config";
    /// 401: no bearer token, or one that is invalid, revoked or expired.
    pub const UNAUTHENTICATED: &str = "unauthenticated";
    /// 403: the identity's role lacks the right, or a socket peer of another user.
    pub const FORBIDDEN: &str = "forbidden";
    /// 503: serve is shutting down and the request did not finish within
    /// the grace.
    pub const SHUTTING_DOWN: &str = "shutting_down";
    /// 403: the `Host` header does not name the listener (DNS rebinding).
    pub const FORBIDDEN_HOST: &str = "forbidden_host";
    /// 403: a state-changing request from another origin.
    pub const CROSS_ORIGIN: &str = "cross_origin";
    /// 408: the request body did not arrive in time.
    pub const REQUEST_TIMEOUT: &str = "request_timeout";
    /// 503: too many connections.
    pub const TOO_MANY_CONNECTIONS: &str = "too_many_connections";
}

/// One HTTP error: a status, a stable code, a message and optional details.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code (see [`code`]).
    pub code: &'static str,
    /// A human message naming what failed and what to do.
    pub message: String,
    /// Structured detail (fields, positions), when there is some.
    pub details: Option<Value>,
    /// Extra top-level members of the body (a blocked turn's `outcome`).
    pub extra: Option<Box<(&'static str, Value)>>,
    /// The `Retry-After` header, in seconds.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
            extra: None,
            retry_after_secs: None,
        }
    }

    /// Adds `details`.
    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.details {
            error["details"] = d.clone();
        }
        let mut body = json!({ "error": error });
        if let Some(extra) = &self.extra {
            let (k, v) = &**extra;
            body[*k] = v.clone();
        }
        body
    }

    /// 404 for a path no route serves.
    pub fn no_route(method: &str, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            code::NOT_FOUND,
            format!("no route {method} {path}; see README.md (HTTP API) for the endpoints"),
        )
    }

    /// 400 or 422 for a body serde_json refused, with its line and column.
    pub fn json(err: &serde_json::Error) -> ApiError {
        let (status, code, what) = match err.classify() {
            serde_json::error::Category::Data => (
                StatusCode::UNPROCESSABLE_ENTITY,
                code::INVALID_BODY,
                "the request body does not have the expected fields",
            ),
            _ => (
                StatusCode::BAD_REQUEST,
                code::MALFORMED_JSON,
                "the request body is not valid JSON",
            ),
        };
        ApiError::new(
            status,
            code,
            format!(
                "{what} (line {}, column {}): {err}",
                err.line(),
                err.column()
            ),
        )
        .with_details(json!({"line": err.line(), "column": err.column()}))
    }

    /// 415 for a body that is not `application/json`.
    pub fn media_type(got: Option<&str>) -> ApiError {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "the request body must be JSON; send Content-Type: application/json (got {})",
                got.map(|g| format!("{g:?}"))
                    .unwrap_or_else(|| "no Content-Type".into())
            ),
        )
    }

    /// 413 for a body over `limit` bytes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the {limit}-byte limit; send less"),
        )
        .with_details(json!({ "limit": limit }))
    }

    /// 404 (or 400 for an invalid id) for session `id`.
    pub fn unknown_session(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            code::UNKNOWN_SESSION,
            format!("no session {id:?}; POST /v1/sessions/{id}/messages starts it"),
        )
    }

    /// 503 when plugd.yaml has no `llm:` section.
    pub fn llm_not_configured(why: &str) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::LLM_NOT_CONFIGURED,
            format!("the sessions endpoints need an LLM: {why}"),
        )
    }

    /// The error for a blocked turn: 401 for an unauthorized notice, 429 for
    /// a quota notice, 403 otherwise; the outcome is in the body.
    pub fn blocked(outcome: &TurnOutcome) -> ApiError {
        let codes: Vec<String> = outcome
            .notices
            .iter()
            .filter_map(|n| n.code.as_deref())
            .map(str::to_ascii_uppercase)
            .collect();
        let has = |set: &[&str]| codes.iter().any(|c| set.contains(&c.as_str()));
        let (status, code) = if has(&["UNAUTHORIZED", "UNAUTHENTICATED"]) {
            (StatusCode::UNAUTHORIZED, code::UNAUTHORIZED)
        } else if has(&[
            "QUOTA_EXCEEDED",
            "RATE_LIMITED",
            "RATE_LIMIT_EXCEEDED",
            "TOO_MANY_REQUESTS",
        ]) {
            (StatusCode::TOO_MANY_REQUESTS, code::QUOTA_EXCEEDED)
        } else {
            (StatusCode::FORBIDDEN, code::TURN_BLOCKED)
        };
        let at = outcome
            .blocked_at
            .map(|p| format!(" at {}", p.name()))
            .unwrap_or_default();
        let mut e = ApiError::new(
            status,
            code,
            format!(
                "the turn was blocked{at}: {}",
                outcome.message.as_deref().unwrap_or("(no message)")
            ),
        );
        e.extra = Some(Box::new((
            "outcome",
            serde_json::to_value(outcome).unwrap_or(Value::Null),
        )));
        e
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        response
    }
}

impl From<RuntimeError> for ApiError {
    fn from(err: RuntimeError) -> ApiError {
        let message = err.to_string();
        let (status, code) = match &err {
            RuntimeError::UnknownTool(_) => (StatusCode::NOT_FOUND, code::UNKNOWN_TOOL),
            RuntimeError::UnknownPlugin(_) => (StatusCode::NOT_FOUND, code::UNKNOWN_PLUGIN),
            RuntimeError::Changed { .. } => (StatusCode::CONFLICT, code::PLUGIN_CHANGED),
            RuntimeError::Args(ArgsError::Invalid { errors, .. }) => {
                return ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    code::INVALID_ARGUMENTS,
                    message,
                )
                .with_details(json!({ "fields": errors }));
            }
            RuntimeError::Args(_) => (StatusCode::BAD_GATEWAY, code::PLUGIN_ERROR),
            RuntimeError::Call(CallToolError::Plugin(_))
            | RuntimeError::Broken { .. }
            | RuntimeError::ApprovalFailed { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, code::PLUGIN_UNAVAILABLE)
            }
            RuntimeError::Call(CallToolError::Tool(t)) => return tool_error(t, message),
            RuntimeError::Gate(g) => return gate_error(g, message),
            RuntimeError::Config { .. } => (StatusCode::UNPROCESSABLE_ENTITY, code::INVALID_CONFIG),
            RuntimeError::Feature(f) => return feature_error(f, message),
            RuntimeError::NotApproved { plugin } => {
                return ApiError::new(StatusCode::FORBIDDEN, code::PLUGIN_NOT_APPROVED, message)
                    .with_details(json!({ "plugin": plugin }));
            }
            RuntimeError::PluginChanged { plugin, .. } => {
                return ApiError::new(StatusCode::CONFLICT, code::PLUGIN_CHANGED, message)
                    .with_details(json!({ "plugin": plugin }));
            }
            RuntimeError::ResourcesDenied { server, .. } => {
                return ApiError::new(StatusCode::FORBIDDEN, code::RESOURCES_DENIED, message)
                    .with_details(json!({ "server": server }));
            }
            RuntimeError::UnknownExport { .. } => (StatusCode::NOT_FOUND, code::NOT_FOUND),
            RuntimeError::BlockedByHook {
                point,
                message: hook_message,
                notices,
            } => {
                return ApiError::new(StatusCode::FORBIDDEN, code::BLOCKED_BY_HOOK, message)
                    .with_details(
                        json!({ "point": point, "message": hook_message, "notices": notices }),
                    );
            }
            RuntimeError::InvalidBinding {
                binding_id,
                problems,
            } => {
                return ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    code::INVALID_BINDING,
                    message,
                )
                .with_details(json!({ "binding_id": binding_id, "problems": problems }));
            }
            RuntimeError::Stopped { plugin, .. } => {
                return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code::PLUGIN_STOPPED,
                    message,
                )
                .with_details(json!({ "plugin": plugin }));
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL),
        };
        ApiError::new(status, code, message)
    }
}

fn feature_error(err: &FeatureError, message: String) -> ApiError {
    let (status, code, details) = match err {
        FeatureError::NotDeclared {
            server,
            capability,
            method,
        } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            code::CAPABILITY_MISSING,
            json!({"server": server, "capability": capability, "method": method}),
        ),
        FeatureError::NotSupported {
            plugin, dialect, ..
        } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            code::NOT_SUPPORTED_BY_DIALECT,
            json!({"server": plugin, "dialect": dialect}),
        ),
        FeatureError::Invalid { server, method, .. } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            code::INVALID_BODY,
            json!({"server": server, "method": method}),
        ),
        FeatureError::Malformed { server, method, .. }
        | FeatureError::TooLarge { server, method, .. } => (
            StatusCode::BAD_GATEWAY,
            code::PLUGIN_ERROR,
            json!({"server": server, "method": method}),
        ),
        FeatureError::Call(CallError::Remote {
            plugin,
            method,
            error,
        }) => {
            let (status, code) = match error.code {
                -32002 => (StatusCode::NOT_FOUND, code::UNKNOWN_RESOURCE),
                -32602 => (StatusCode::UNPROCESSABLE_ENTITY, code::INVALID_PARAMS),
                _ => (StatusCode::BAD_GATEWAY, code::SERVER_ERROR),
            };
            (
                status,
                code,
                json!({"server": &**plugin, "method": method, "rpc_code": error.code}),
            )
        }
        FeatureError::Call(CallError::Timeout { plugin, method, .. }) => (
            StatusCode::GATEWAY_TIMEOUT,
            code::PLUGIN_TIMEOUT,
            json!({"server": &**plugin, "method": method}),
        ),
        FeatureError::Call(CallError::Closed(closed)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            code::PLUGIN_UNAVAILABLE,
            json!({"server": &*closed.plugin}),
        ),
        FeatureError::Call(CallError::FrameTooLarge { plugin, method, .. }) => (
            StatusCode::BAD_GATEWAY,
            code::PLUGIN_ERROR,
            json!({"server": &**plugin, "method": method}),
        ),
        _ => (StatusCode::BAD_GATEWAY, code::PLUGIN_ERROR, Value::Null),
    };
    let e = ApiError::new(status, code, message);
    if details.is_null() {
        e
    } else {
        e.with_details(details)
    }
}

fn gate_error(err: &GateError, message: String) -> ApiError {
    let (status, code) = match err {
        GateError::Disabled { .. } => (StatusCode::FORBIDDEN, code::TOOL_DISABLED),
        GateError::Denied { .. } => (StatusCode::FORBIDDEN, code::CALL_DENIED),
        GateError::TimedOut { .. } => (StatusCode::FORBIDDEN, code::APPROVAL_TIMED_OUT),
        GateError::NoApprover { .. } => (StatusCode::FORBIDDEN, code::APPROVAL_REQUIRED),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, code::RISK_POLICY_INVALID),
    };
    let details = match err {
        GateError::Disabled { tool, plugin } => json!({"tool": tool, "plugin": plugin}),
        GateError::Denied {
            tool,
            plugin,
            risk,
            by,
            ..
        } => json!({"tool": tool, "plugin": plugin, "risk": risk, "decided_by": by}),
        GateError::TimedOut {
            tool,
            plugin,
            risk,
            after,
            id,
        } => {
            json!({"tool": tool, "plugin": plugin, "risk": risk, "timeout_secs": after.as_secs(), "approval_id": id})
        }
        GateError::NoApprover {
            tool, plugin, risk, ..
        } => json!({"tool": tool, "plugin": plugin, "risk": risk}),
        _ => Value::Null,
    };
    let e = ApiError::new(status, code, message);
    if details.is_null() {
        e
    } else {
        e.with_details(details)
    }
}

impl From<plugd_runtime::skills::SkillError> for ApiError {
    fn from(err: plugd_runtime::skills::SkillError) -> ApiError {
        use plugd_runtime::skills::SkillError;
        let (status, code) = match &err {
            SkillError::BadName(_) => (StatusCode::BAD_REQUEST, code::INVALID_SKILL_NAME),
            SkillError::Unknown { .. } => (StatusCode::NOT_FOUND, code::UNKNOWN_SKILL),
            SkillError::Refused { .. } => (StatusCode::UNPROCESSABLE_ENTITY, code::SKILL_REFUSED),
        };
        ApiError::new(status, code, err.to_string())
    }
}

impl From<DecideError> for ApiError {
    fn from(err: DecideError) -> ApiError {
        let message = err.to_string();
        match &err {
            DecideError::Unknown(id) => {
                ApiError::new(StatusCode::NOT_FOUND, code::UNKNOWN_APPROVAL, message)
                    .with_details(json!({ "id": id }))
            }
            DecideError::AlreadyDecided(a) => ApiError::new(
                StatusCode::CONFLICT,
                code::APPROVAL_ALREADY_DECIDED,
                message,
            )
            .with_details(json!({"id": a.id, "state": a.state, "decided_by": a.decided_by})),
            DecideError::Invalid(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                code::INVALID_ARGUMENTS,
                message,
            ),
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL, message),
        }
    }
}

fn tool_error(err: &ToolError, message: String) -> ApiError {
    // The typed band of §5.t: each keeps its class and names its plugin.
    let typed = |plugin: &str, tool: &str, rpc: i64| json!({"plugin": plugin, "tool": tool, "rpc_code": rpc});
    let (status, code, details) = match err {
        ToolError::NotFound { plugin, tool, .. } => (
            StatusCode::NOT_FOUND,
            code::TOOL_NOT_FOUND,
            typed(plugin, tool, -33401),
        ),
        ToolError::ArgumentInvalid {
            plugin,
            tool,
            details,
            ..
        } => {
            let mut d = typed(plugin, tool, -33402);
            if let Some(fields) = details {
                d["fields"] = fields.clone();
            }
            (StatusCode::UNPROCESSABLE_ENTITY, code::INVALID_ARGUMENTS, d)
        }
        ToolError::ExecutionFailed { plugin, tool, .. } => (
            StatusCode::BAD_GATEWAY,
            code::TOOL_FAILED,
            typed(plugin, tool, -33403),
        ),
        ToolError::Unavailable {
            plugin,
            tool,
            retry_after_ms,
            ..
        } => {
            let mut d = typed(plugin, tool, -33404);
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::TOOL_UNAVAILABLE,
                message,
            );
            if let Some(ms) = retry_after_ms {
                // Clamped by the host when read, so this cannot overflow.
                let ms = (*ms).min(plugd_host::model::MAX_RETRY_AFTER_MS);
                d["retry_after_ms"] = json!(ms);
                e.retry_after_secs = Some(ms.div_ceil(1000));
            }
            return e.with_details(d);
        }
        ToolError::Denied { plugin, tool, .. } => (
            StatusCode::FORBIDDEN,
            code::TOOL_DENIED,
            typed(plugin, tool, -33405),
        ),
        ToolError::Call(CallError::Timeout { .. }) => {
            return ApiError::new(StatusCode::GATEWAY_TIMEOUT, code::PLUGIN_TIMEOUT, message);
        }
        ToolError::Call(CallError::Closed(_)) => {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::PLUGIN_UNAVAILABLE,
                message,
            );
        }
        ToolError::Call(CallError::Remote { error, .. }) => {
            return ApiError::new(StatusCode::BAD_GATEWAY, code::TOOL_FAILED, message)
                .with_details(json!({ "rpc_code": error.code }));
        }
        _ => return ApiError::new(StatusCode::BAD_GATEWAY, code::PLUGIN_ERROR, message),
    };
    ApiError::new(status, code, message).with_details(details)
}

impl From<AgentError> for ApiError {
    fn from(err: AgentError) -> ApiError {
        let message = err.to_string();
        let (status, code) = match &err {
            AgentError::Llm(LlmError::NotConfigured(why)) => {
                return ApiError::llm_not_configured(why);
            }
            AgentError::Llm(_) => (StatusCode::SERVICE_UNAVAILABLE, code::LLM_UNAVAILABLE),
            AgentError::BadSession(_) => (StatusCode::BAD_REQUEST, code::INVALID_SESSION_ID),
            AgentError::TooManyRounds { .. } => (StatusCode::BAD_GATEWAY, code::TOO_MANY_ROUNDS),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL),
        };
        ApiError::new(status, code, message)
    }
}
