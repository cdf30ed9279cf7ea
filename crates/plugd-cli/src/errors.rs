//! The CLI's mapping table of the one list of error codes
//! ([`plugd_control::Code`]): the exit code of each class for `plugd tool
//! call --json`, and the [`Failure`] every command reports a service's
//! error as.
//!
//! A [`Failure`] prints as `STATUS REASON code: message`
//! (`422 Unprocessable Entity invalid_binding: …`), the same line whether
//! the error came from a service in this process or from serve's answer;
//! `tool call --json` prints it as `{"code", "message", "details"?,
//! "http_status"}` instead (see [`report`]).

use plugd_control::ServiceError;
use plugd_control::error::code as c;
use serde_json::{Value, json};

/// One classified failure: the stable code, the message, the details and
/// the HTTP status the code answers with (the status serve sent, when it
/// came through serve).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{} {code}: {message}", status_line(*http_status))]
pub struct Failure {
    /// The stable code (`unknown_tool`, …).
    pub code: String,
    /// The human message.
    pub message: String,
    /// Structured detail, when there is some.
    pub details: Option<Value>,
    /// The HTTP status of the class.
    pub http_status: u16,
}

/// `422 Unprocessable Entity`: a status and its reason phrase.
fn status_line(status: u16) -> String {
    match reqwest::StatusCode::from_u16(status) {
        Ok(s) => s.to_string(),
        Err(_) => status.to_string(),
    }
}

impl From<ServiceError> for Failure {
    fn from(e: ServiceError) -> Failure {
        Failure {
            code: e.code.as_str().to_owned(),
            message: e.message,
            details: e.details,
            http_status: e.code.http_status(),
        }
    }
}

impl From<plugd_runtime::RuntimeError> for Failure {
    fn from(e: plugd_runtime::RuntimeError) -> Failure {
        ServiceError::from(e).into()
    }
}

/// The exit code of one error class with `--json`: 4 not found, 5 invalid
/// arguments, 6 the tool failed, 7 unavailable (retry later), 8 refused,
/// 1 anything else (docs/contracts/errors.md).
pub fn exit_code(code: &str) -> i32 {
    match code {
        c::UNKNOWN_TOOL | c::UNKNOWN_PLUGIN | c::TOOL_NOT_FOUND | c::NOT_FOUND => 4,
        c::INVALID_ARGUMENTS | c::INVALID_CONFIG | c::INVALID_BINDING => 5,
        c::TOOL_FAILED | c::PLUGIN_ERROR => 6,
        c::TOOL_UNAVAILABLE
        | c::PLUGIN_UNAVAILABLE
        | c::PLUGIN_TIMEOUT
        | c::PLUGIN_STOPPED
        | c::PLUGIN_CHANGED
        | c::STORE_UNAVAILABLE
        | c::RATE_LIMITED => 7,
        c::TOOL_DENIED
        | c::BLOCKED_BY_HOOK
        | c::TOOL_DISABLED
        | c::CALL_DENIED
        | c::APPROVAL_TIMED_OUT
        | c::APPROVAL_REQUIRED
        | c::UPSTREAM_AUTH_FAILED => 8,
        _ => 1,
    }
}

/// For `--json`: prints `err` as one JSON object on stderr and returns its
/// exit code. Errors that are no [`Failure`] (bad `--args`, no workspace)
/// have no class: code `error`, exit 1.
pub fn report(err: &anyhow::Error) -> i32 {
    let (object, code) = match err.downcast_ref::<Failure>() {
        Some(f) => {
            let mut o = json!({
                "code": f.code,
                "message": f.message,
                "http_status": f.http_status,
            });
            if let Some(d) = &f.details {
                o["details"] = d.clone();
            }
            (o, exit_code(&f.code))
        }
        None => (
            json!({"code": "error", "message": format!("{err:#}").replace('\n', " ")}),
            1,
        ),
    };
    eprintln!("{object}");
    code
}

#[cfg(test)]
mod tests {
    use plugd_control::Code;

    use super::*;

    #[test]
    fn failures_print_as_the_api_error_line() {
        let f = Failure::from(ServiceError::new(
            Code::InvalidBinding,
            "the binding has 1 problem(s): x",
        ));
        assert_eq!(
            f.to_string(),
            "422 Unprocessable Entity invalid_binding: the binding has 1 problem(s): x"
        );
        assert_eq!(f.http_status, 422);
    }

    #[test]
    fn every_class_has_its_exit_code() {
        assert_eq!(exit_code(Code::UnknownTool.as_str()), 4);
        assert_eq!(exit_code(Code::InvalidBinding.as_str()), 5);
        assert_eq!(exit_code(Code::PluginError.as_str()), 6);
        assert_eq!(exit_code(Code::PluginChanged.as_str()), 7);
        assert_eq!(exit_code(Code::ApprovalRequired.as_str()), 8);
        assert_eq!(exit_code(Code::UpstreamAuthFailed.as_str()), 8);
        assert_eq!(exit_code(Code::Internal.as_str()), 1);
    }
}
