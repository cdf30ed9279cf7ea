//! HTTP errors as types: each [`ApiError`] has a fixed status and a stable
//! code, and renders as `{"error": {"code", "message", "details"?}}`.
//!
//! The codes come from the one list in [`plugd_control::error`] and each
//! code's status from its table ([`Code::http_status`]); the runtime's
//! errors are classified once in `plugd-runtime` (its `error_codes`
//! module: code, message, details) and arrive here as a
//! [`ServiceError`], like the binding and marketplace services' errors.
//! What is decided here is only what HTTP alone has: the framing errors
//! (body, media type, size, route), the blocked turn's body and the
//! `Retry-After` header.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use plugd_agent::agent::{AgentError, TurnOutcome};
use plugd_agent::llm::LlmError;
use plugd_control::{Code, ServiceError};
use plugd_runtime::RuntimeError;
use plugd_runtime::risk::DecideError;
use serde_json::{Value, json};

/// Stable error codes of the HTTP API (the `error.code` field): the one
/// list in `plugd-control`.
pub use plugd_control::error::code;

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

impl ApiError {
    /// The status of `code` from its table.
    pub fn status_of(code: Code) -> StatusCode {
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// A failure of the state store as the API's error: 503 `store_unavailable`
/// (with `Retry-After`) while the database is unreachable, else 500.
pub(crate) fn store_error(e: plugd_store::StoreError) -> ApiError {
    ApiError::from(ServiceError::store(e))
}

impl From<ServiceError> for ApiError {
    fn from(err: ServiceError) -> ApiError {
        ApiError {
            status: ApiError::status_of(err.code),
            code: err.code.as_str(),
            message: err.message,
            details: err.details,
            extra: None,
            retry_after_secs: err.retry_after_secs,
        }
    }
}

impl From<RuntimeError> for ApiError {
    fn from(err: RuntimeError) -> ApiError {
        ServiceError::from(err).into()
    }
}

impl From<plugd_runtime::skills::SkillError> for ApiError {
    fn from(err: plugd_runtime::skills::SkillError) -> ApiError {
        ServiceError::from(err).into()
    }
}

impl From<DecideError> for ApiError {
    fn from(err: DecideError) -> ApiError {
        ServiceError::from(err).into()
    }
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
