//! The one list of error codes every surface answers with (the `error.code`
//! of the HTTP API, `plugd tool call --json`'s `code`), and [`ServiceError`],
//! the error the domain services return before a surface maps it.
//!
//! [`codes!`] writes the list once and generates from it the [`Code`] enum,
//! its stable string ([`Code::as_str`]), the `&str` constants of [`code`]
//! the surfaces match on, and the HTTP status each code answers with
//! ([`Code::http_status`], the HTTP surface's table; `plugd-server` turns it
//! into a status, `plugd tool call --json` prints it as `http_status`).
//! The other surfaces keep their own table over [`Code`]: the CLI's exit
//! codes in `plugd-cli`. A few HTTP-only framing errors (a body that is not
//! JSON) set their status themselves; every error a service returns takes
//! its code's.
//!
//! The strings are wire format: never rename one.

use serde_json::Value;

/// Writes [`Code`], [`Code::as_str`], [`Code::http_status`], [`Code::ALL`]
/// and the [`code`] constants from one list of `Variant = CONST, "string", status;`.
macro_rules! codes {
    ($($(#[$doc:meta])* $variant:ident = $konst:ident, $s:literal, $status:literal;)*) => {
        /// A stable error code (see the module docs).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($(#[$doc])* $variant,)*
        }

        impl Code {
            /// Every code, in the list's order.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The stable string (the wire's `error.code`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $s,)*
                }
            }

            /// The HTTP status this code answers with.
            pub const fn http_status(self) -> u16 {
                match self {
                    $(Code::$variant => $status,)*
                }
            }
        }

        /// The codes as `&str` constants, for matching on a code string.
        pub mod code {
            $($(#[$doc])* pub const $konst: &str = $s;)*
        }
    };
}

codes! {
    /// A console request that changes state without its session's CSRF token.
    Csrf = CSRF, "csrf", 403;
    /// No such route.
    NotFound = NOT_FOUND, "not_found", 404;
    /// The state database is unreachable (restarting, failing over): retry
    /// shortly; nothing was written.
    StoreUnavailable = STORE_UNAVAILABLE, "store_unavailable", 503;
    /// The other nodes of the cluster cannot be reached now (NATS down)
    /// and the request needs one of them: retry shortly.
    NodesUnavailable = NODES_UNAVAILABLE, "nodes_unavailable", 503;
    /// The MCP gateway has too many sessions open.
    TooManySessions = TOO_MANY_SESSIONS, "too_many_sessions", 503;
    /// This serve has no MCP gateway.
    McpUnavailable = MCP_UNAVAILABLE, "mcp_unavailable", 503;
    /// No such MCP session (ended, expired, or someone else's).
    McpSessionNotFound = MCP_SESSION_NOT_FOUND, "mcp_session_not_found", 404;
    /// An MCP request without the `Mcp-Session-Id` it needs.
    McpSessionRequired = MCP_SESSION_REQUIRED, "mcp_session_required", 400;
    /// The client does not accept what the route answers with.
    NotAcceptable = NOT_ACCEPTABLE, "not_acceptable", 406;
    /// The route exists but not for this method.
    MethodNotAllowed = METHOD_NOT_ALLOWED, "method_not_allowed", 405;
    /// The body is not JSON (`details.line`, `details.column`).
    MalformedJson = MALFORMED_JSON, "malformed_json", 400;
    /// The body is JSON of the wrong shape (`details.line`, `details.column`).
    InvalidBody = INVALID_BODY, "invalid_body", 422;
    /// The request is not `application/json`.
    UnsupportedMediaType = UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", 415;
    /// The body is over the size limit.
    PayloadTooLarge = PAYLOAD_TOO_LARGE, "payload_too_large", 413;
    /// The body could not be read.
    BadRequest = BAD_REQUEST, "bad_request", 400;
    /// No tool of that name.
    UnknownTool = UNKNOWN_TOOL, "unknown_tool", 404;
    /// No plugin of that id.
    UnknownPlugin = UNKNOWN_PLUGIN, "unknown_plugin", 404;
    /// The tool's plugin changed since approval; its tools are withheld
    /// until it is approved again (the message names the files).
    PluginChanged = PLUGIN_CHANGED, "plugin_changed", 409;
    /// No session of that id.
    UnknownSession = UNKNOWN_SESSION, "unknown_session", 404;
    /// No hook point of that name.
    UnknownHookPoint = UNKNOWN_HOOK_POINT, "unknown_hook_point", 404;
    /// The arguments violate the tool's input schema (`details.fields`).
    InvalidArguments = INVALID_ARGUMENTS, "invalid_arguments", 422;
    /// The session id is not acceptable.
    InvalidSessionId = INVALID_SESSION_ID, "invalid_session_id", 400;
    /// The tool ran and failed (the plugin's message).
    ToolFailed = TOOL_FAILED, "tool_failed", 502;
    /// 404: the plugin says it does not implement the tool (`-33401`).
    ToolNotFound = TOOL_NOT_FOUND, "tool_not_found", 404;
    /// 503: the tool is transiently unavailable (`-33404`); `Retry-After`
    /// and `details.retry_after_ms` when the plugin gave a hint.
    ToolUnavailable = TOOL_UNAVAILABLE, "tool_unavailable", 503;
    /// 400: not a skill name (`..`, `/`, other characters).
    InvalidSkillName = INVALID_SKILL_NAME, "invalid_skill_name", 400;
    /// 404: no such skill of an approved plugin.
    UnknownSkill = UNKNOWN_SKILL, "unknown_skill", 404;
    /// 422: the skill exists but is not served (symlink, too large, not UTF-8).
    SkillRefused = SKILL_REFUSED, "skill_refused", 422;
    /// 503: an operator stopped the plugin (`plugd plugin start ID`).
    PluginStopped = PLUGIN_STOPPED, "plugin_stopped", 503;
    /// The plugin's own authorization refused the call.
    ToolDenied = TOOL_DENIED, "tool_denied", 403;
    /// The plugin cannot be reached (not started, failed, crashed, broken).
    PluginUnavailable = PLUGIN_UNAVAILABLE, "plugin_unavailable", 503;
    /// The plugin did not answer in time.
    PluginTimeout = PLUGIN_TIMEOUT, "plugin_timeout", 504;
    /// The plugin answered with something unusable.
    PluginError = PLUGIN_ERROR, "plugin_error", 502;
    /// plugd.yaml has no `llm:` section.
    LlmNotConfigured = LLM_NOT_CONFIGURED, "llm_not_configured", 503;
    /// The LLM provider failed.
    LlmUnavailable = LLM_UNAVAILABLE, "llm_unavailable", 503;
    /// The model kept calling tools past `agent.max_tool_rounds`.
    TooManyRounds = TOO_MANY_ROUNDS, "too_many_rounds", 502;
    /// A hook blocked the turn (403).
    TurnBlocked = TURN_BLOCKED, "turn_blocked", 403;
    /// A `before_tool_call` / `after_tool_result` hook refused a tool call (403).
    BlockedByHook = BLOCKED_BY_HOOK, "blocked_by_hook", 403;
    /// A hook blocked the turn with a quota notice (429).
    QuotaExceeded = QUOTA_EXCEEDED, "quota_exceeded", 429;
    /// A `limits:` rule of plugd.yaml refused the call: over its rate
    /// (429, `Retry-After`, `details.rule`, `details.retry_after_ms`).
    RateLimited = RATE_LIMITED, "rate_limited", 429;
    /// A hook blocked the turn with an unauthorized notice (401).
    Unauthorized = UNAUTHORIZED, "unauthorized", 401;
    /// The tool is disabled (`plugd tool enable NAME`).
    ToolDisabled = TOOL_DISABLED, "tool_disabled", 403;
    /// An operator (or the caller's approver) denied the call.
    CallDenied = CALL_DENIED, "call_denied", 403;
    /// Nobody approved the call within `risk.approval_timeout_secs`.
    ApprovalTimedOut = APPROVAL_TIMED_OUT, "approval_timed_out", 403;
    /// The call needs an approval and nobody could be asked.
    ApprovalRequired = APPROVAL_REQUIRED, "approval_required", 403;
    /// plugd.yaml's risk policy cannot be read, so no tool runs.
    RiskPolicyInvalid = RISK_POLICY_INVALID, "risk_policy_invalid", 500;
    /// No call approval of that id.
    UnknownApproval = UNKNOWN_APPROVAL, "unknown_approval", 404;
    /// The call approval was decided (or timed out) already.
    ApprovalAlreadyDecided = APPROVAL_ALREADY_DECIDED, "approval_already_decided", 409;
    /// 422: the MCP server did not declare the capability the request needs
    /// (`details.server`, `details.capability`).
    CapabilityMissing = CAPABILITY_MISSING, "capability_missing", 422;
    /// 422: the plugin is not an MCP server, so it has no resources,
    /// prompts or completion.
    NotSupportedByDialect = NOT_SUPPORTED_BY_DIALECT, "not_supported_by_dialect", 422;
    /// 403: the plugin is not approved.
    PluginNotApproved = PLUGIN_NOT_APPROVED, "plugin_not_approved", 403;
    /// 403: plugd.yaml refuses this server's resources
    /// (`mcp.servers.NAME.resources: false`), or cannot be loaded.
    ResourcesDenied = RESOURCES_DENIED, "resources_denied", 403;
    /// 403: a remote MCP server with plugd.yaml `upstream_auth` cannot get
    /// this caller's own credential (a caller without a user token, or a
    /// token exchange the issuer refused or that failed); `details.server`.
    UpstreamAuthFailed = UPSTREAM_AUTH_FAILED, "upstream_auth_failed", 403;
    /// 404: the MCP server has no such resource (its `-32002`).
    UnknownResource = UNKNOWN_RESOURCE, "unknown_resource", 404;
    /// 422: the MCP server refused the request's parameters (its `-32602`:
    /// an unknown prompt or resource, a missing argument).
    InvalidParams = INVALID_PARAMS, "invalid_params", 422;
    /// 502: the MCP server answered with another JSON-RPC error
    /// (`details.rpc_code`).
    ServerError = SERVER_ERROR, "server_error", 502;
    /// 400: `source` is not an `oci://` reference (`POST /v1/plugin-packages`).
    InvalidSource = INVALID_SOURCE, "invalid_source", 400;
    /// 400: not `sha256:DIGEST`, `ID@VERSION` or `ID`.
    InvalidPackageId = INVALID_PACKAGE_ID, "invalid_package_id", 400;
    /// 404: no installed package of that id, version or digest.
    UnknownPackage = UNKNOWN_PACKAGE, "unknown_package", 404;
    /// 422: the package was refused for its content (secrets, links, paths,
    /// bounds, manifest, not a plugd artifact).
    PackageRefused = PACKAGE_REFUSED, "package_refused", 422;
    /// 502: a blob or manifest from the registry does not match its digest.
    PackageTampered = PACKAGE_TAMPERED, "package_tampered", 502;
    /// 502: the registry failed or refused.
    RegistryError = REGISTRY_ERROR, "registry_error", 502;
    /// 409: another digest is installed as the same `package_id@version`.
    PackageVersionTaken = PACKAGE_VERSION_TAKEN, "package_version_taken", 409;
    /// 404: no binding of that id the caller may see.
    UnknownBinding = UNKNOWN_BINDING, "unknown_binding", 404;
    /// 422: a binding fails its checks (`details.problems`).
    InvalidBinding = INVALID_BINDING, "invalid_binding", 422;
    /// 422: the package has no such export.
    UnknownExport = UNKNOWN_EXPORT, "unknown_export", 422;
    /// 404: no invocation record with that id.
    UnknownInvocation = UNKNOWN_INVOCATION, "unknown_invocation", 404;
    /// 422: a package's signature is invalid, or the trust policy (or the
    /// marketplace mode) refuses it.
    SignatureRefused = SIGNATURE_REFUSED, "signature_refused", 422;
    /// 503: plugd.yaml sets no `marketplace:`.
    MarketplaceNotConfigured = MARKETPLACE_NOT_CONFIGURED, "marketplace_not_configured", 503;
    /// 502: the marketplace index cannot be read or fails a check.
    MarketplaceIndexRefused = MARKETPLACE_INDEX_REFUSED, "marketplace_index_refused", 502;
    /// 404: no marketplace entry of that id.
    UnknownEntry = UNKNOWN_ENTRY, "unknown_entry", 404;
    /// 409: a contract-ready entry, or one the marketplace mode refuses.
    EntryNotInstallable = ENTRY_NOT_INSTALLABLE, "entry_not_installable", 409;
    /// 422: a package lacks an export its marketplace entry names.
    EntryMismatch = ENTRY_MISMATCH, "entry_mismatch", 422;
    /// 404: no live token of that id or name (`POST /v1/tokens/{id}:revoke`).
    UnknownToken = UNKNOWN_TOKEN, "unknown_token", 404;
    /// 409: a live token has that name already (`POST /v1/tokens`).
    TokenExists = TOKEN_EXISTS, "token_exists", 409;
    /// Anything else that went wrong inside plugd.
    Internal = INTERNAL, "internal", 500;
    /// The request conflicts with the record's state (e.g. an append to a compacted chain).
    Conflict = CONFLICT, "conflict", 409;
    /// A delegation token lacks the scope a route needs.
    MissingScope = MISSING_SCOPE, "missing_scope", 403;
    /// 422: a plugin's settings are invalid or cannot be decrypted.
    InvalidConfig = INVALID_CONFIG, "invalid_config", 422;
    /// 401: no bearer token, or one that is invalid, revoked or expired.
    Unauthenticated = UNAUTHENTICATED, "unauthenticated", 401;
    /// 403: the identity's role lacks the right, or a socket peer of another user.
    Forbidden = FORBIDDEN, "forbidden", 403;
    /// 503: serve is shutting down and the request did not finish within
    /// the grace.
    ShuttingDown = SHUTTING_DOWN, "shutting_down", 503;
    /// 403: the `Host` header does not name the listener (DNS rebinding).
    ForbiddenHost = FORBIDDEN_HOST, "forbidden_host", 403;
    /// 403: a state-changing request from another origin.
    CrossOrigin = CROSS_ORIGIN, "cross_origin", 403;
    /// 408: the request body did not arrive in time.
    RequestTimeout = REQUEST_TIMEOUT, "request_timeout", 408;
    /// 503: too many connections.
    TooManyConnections = TOO_MANY_CONNECTIONS, "too_many_connections", 503;
}

impl Code {
    /// The code whose string is `s`.
    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error of a domain service (bindings, marketplace install, a call by
/// the runtime): a stable [`Code`], a message naming what failed and what
/// to do, and optional structured details. Surfaces map it: HTTP status
/// from [`Code::http_status`], the CLI's exit code from its own table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ServiceError {
    /// The stable code.
    pub code: Code,
    /// A human message naming what failed and what to do.
    pub message: String,
    /// Structured detail (fields, problems), when there is some.
    pub details: Option<Value>,
    /// A retry hint in seconds (`tool_unavailable`'s `Retry-After`).
    pub retry_after_secs: Option<u64>,
}

impl ServiceError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> ServiceError {
        ServiceError {
            code,
            message: message.into(),
            details: None,
            retry_after_secs: None,
        }
    }

    /// Adds `details`.
    pub fn with_details(mut self, details: Value) -> ServiceError {
        self.details = Some(details);
        self
    }

    /// `internal` for a failure of plugd itself (the state store, a file).
    pub fn internal(e: impl std::fmt::Display) -> ServiceError {
        ServiceError::new(Code::Internal, e.to_string())
    }

    /// A failure of the state store: `store_unavailable` (503, retry in a
    /// second) while its database is unreachable, else `internal`.
    pub fn store(e: crate::store::StoreError) -> ServiceError {
        match e {
            crate::store::StoreError::Unavailable { .. } => {
                let mut err = ServiceError::new(Code::StoreUnavailable, e.to_string());
                err.retry_after_secs = Some(1);
                err
            }
            e => ServiceError::internal(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for c in Code::ALL {
            let s = c.as_str();
            assert!(seen.insert(s), "{s} listed twice");
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
            assert_eq!(Code::parse(s), Some(*c));
            assert!((400..600).contains(&c.http_status()), "{s}");
        }
        assert_eq!(code::UNKNOWN_BINDING, Code::UnknownBinding.as_str());
        assert_eq!(Code::InvalidBinding.http_status(), 422);
    }
}
