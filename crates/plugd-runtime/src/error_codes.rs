//! The stable code, message and details of every runtime error, as a
//! [`ServiceError`]: the one classification the surfaces map (HTTP status
//! in `plugd-server`, the exit code of `plugd tool call --json` in
//! `plugd-cli`).
//!
//! Unknown tool/plugin → `unknown_tool`/`unknown_plugin`, argument schema
//! violation → `invalid_arguments` (`details.fields`), tool failure →
//! `tool_failed`, plugin unavailable → `plugin_unavailable`, plugin
//! timeout → `plugin_timeout`, a call the risk gate refused (disabled,
//! denied, not approved) → `tool_disabled`/`call_denied`/`approval_*`, an
//! unknown call approval → `unknown_approval`, one decided already →
//! `approval_already_decided`, a call over a `limits:` rule →
//! `rate_limited` (429, `Retry-After`, `details.rule`,
//! `details.retry_after_ms`).
//!
//! MCP resources, prompts and completion: a server that did not declare the
//! capability → `capability_missing`, a plugin of another dialect →
//! `not_supported_by_dialect`, an unapproved one → `plugin_not_approved`,
//! resources denied by plugd.yaml → `resources_denied`, the server's
//! `-32002` → `unknown_resource`, its `-32602` → `invalid_params`, another
//! error reply → `server_error`, a reply of the wrong shape or over a bound
//! → `plugin_error`; each names `details.server`.
//!
//! A plugin's typed tool errors keep their class: `-33401` →
//! `tool_not_found`, `-33402` → `invalid_arguments` (`details.fields`),
//! `-33403` → `tool_failed`, `-33404` → `tool_unavailable` with a retry
//! hint and `details.retry_after_ms`, `-33405` → `tool_denied`; each names
//! `details.plugin`, `details.tool` and `details.rpc_code`
//! (docs/contracts/errors.md).

use plugd_control::{Code, ServiceError};
use plugd_dialects::FeatureError;
use plugd_host::{CallError, CallToolError, ToolError};
use serde_json::{Value, json};

use crate::risk::{DecideError, GateError};
use crate::skills::SkillError;
use crate::{ArgsError, RuntimeError};

impl From<RuntimeError> for ServiceError {
    fn from(err: RuntimeError) -> ServiceError {
        let message = err.to_string();
        let code = match &err {
            RuntimeError::UnknownTool(_) => Code::UnknownTool,
            RuntimeError::UnknownPlugin(_) => Code::UnknownPlugin,
            RuntimeError::Changed { .. } => Code::PluginChanged,
            RuntimeError::Args(ArgsError::Invalid { errors, .. }) => {
                return ServiceError::new(Code::InvalidArguments, message)
                    .with_details(json!({ "fields": errors }));
            }
            RuntimeError::Args(_) => Code::PluginError,
            RuntimeError::Call(CallToolError::Plugin(_))
            | RuntimeError::Broken { .. }
            | RuntimeError::ApprovalFailed { .. } => Code::PluginUnavailable,
            RuntimeError::Call(CallToolError::Tool(t)) => return tool_error(t, message),
            RuntimeError::Gate(g) => return gate_error(g, message),
            RuntimeError::Config { .. } => Code::InvalidConfig,
            RuntimeError::Feature(f) => return feature_error(f, message),
            RuntimeError::NotApproved { plugin } => {
                return ServiceError::new(Code::PluginNotApproved, message)
                    .with_details(json!({ "plugin": plugin }));
            }
            RuntimeError::PluginChanged { plugin, .. } => {
                return ServiceError::new(Code::PluginChanged, message)
                    .with_details(json!({ "plugin": plugin }));
            }
            RuntimeError::ResourcesDenied { server, .. } => {
                return ServiceError::new(Code::ResourcesDenied, message)
                    .with_details(json!({ "server": server }));
            }
            RuntimeError::UpstreamAuth { server, .. } => {
                return ServiceError::new(Code::UpstreamAuthFailed, message)
                    .with_details(json!({ "server": server }));
            }
            RuntimeError::UnknownExport { .. } => Code::NotFound,
            RuntimeError::Store(e @ plugd_store::StoreError::Unavailable { .. }) => {
                let mut err = ServiceError::new(Code::StoreUnavailable, e.to_string());
                err.retry_after_secs = Some(1);
                return err;
            }
            RuntimeError::RateLimited {
                rule,
                retry_after_ms,
            } => {
                let mut e = ServiceError::new(Code::RateLimited, message)
                    .with_details(json!({ "rule": rule, "retry_after_ms": retry_after_ms }));
                e.retry_after_secs = Some(retry_after_ms.div_ceil(1000).max(1));
                return e;
            }
            RuntimeError::BlockedByHook {
                point,
                message: hook_message,
                notices,
            } => {
                return ServiceError::new(Code::BlockedByHook, message).with_details(
                    json!({ "point": point, "message": hook_message, "notices": notices }),
                );
            }
            RuntimeError::InvalidBinding {
                binding_id,
                problems,
            } => {
                return ServiceError::new(Code::InvalidBinding, message)
                    .with_details(json!({ "binding_id": binding_id, "problems": problems }));
            }
            RuntimeError::Stopped { plugin, .. } => {
                return ServiceError::new(Code::PluginStopped, message)
                    .with_details(json!({ "plugin": plugin }));
            }
            _ => Code::Internal,
        };
        ServiceError::new(code, message)
    }
}

/// `e` with `details` unless they are null.
fn detailed(e: ServiceError, details: Value) -> ServiceError {
    if details.is_null() {
        e
    } else {
        e.with_details(details)
    }
}

fn feature_error(err: &FeatureError, message: String) -> ServiceError {
    let (code, details) = match err {
        FeatureError::NotDeclared {
            server,
            capability,
            method,
        } => (
            Code::CapabilityMissing,
            json!({"server": server, "capability": capability, "method": method}),
        ),
        FeatureError::NotSupported {
            plugin, dialect, ..
        } => (
            Code::NotSupportedByDialect,
            json!({"server": plugin, "dialect": dialect}),
        ),
        FeatureError::Invalid { server, method, .. } => (
            Code::InvalidBody,
            json!({"server": server, "method": method}),
        ),
        FeatureError::Malformed { server, method, .. }
        | FeatureError::TooLarge { server, method, .. } => (
            Code::PluginError,
            json!({"server": server, "method": method}),
        ),
        FeatureError::Call(CallError::Remote {
            plugin,
            method,
            error,
        }) => {
            let code = match error.code {
                -32002 => Code::UnknownResource,
                -32602 => Code::InvalidParams,
                _ => Code::ServerError,
            };
            (
                code,
                json!({"server": &**plugin, "method": method, "rpc_code": error.code}),
            )
        }
        FeatureError::Call(CallError::Timeout { plugin, method, .. }) => (
            Code::PluginTimeout,
            json!({"server": &**plugin, "method": method}),
        ),
        FeatureError::Call(CallError::Closed(closed)) => {
            (Code::PluginUnavailable, json!({"server": &*closed.plugin}))
        }
        FeatureError::Call(CallError::FrameTooLarge { plugin, method, .. }) => (
            Code::PluginError,
            json!({"server": &**plugin, "method": method}),
        ),
        _ => (Code::PluginError, Value::Null),
    };
    detailed(ServiceError::new(code, message), details)
}

fn gate_error(err: &GateError, message: String) -> ServiceError {
    let code = match err {
        GateError::Disabled { .. } => Code::ToolDisabled,
        GateError::Denied { .. } => Code::CallDenied,
        GateError::TimedOut { .. } => Code::ApprovalTimedOut,
        GateError::NoApprover { .. } => Code::ApprovalRequired,
        _ => Code::RiskPolicyInvalid,
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
    detailed(ServiceError::new(code, message), details)
}

impl From<SkillError> for ServiceError {
    fn from(err: SkillError) -> ServiceError {
        let code = match &err {
            SkillError::BadName(_) => Code::InvalidSkillName,
            SkillError::Unknown { .. } => Code::UnknownSkill,
            SkillError::Refused { .. } => Code::SkillRefused,
        };
        ServiceError::new(code, err.to_string())
    }
}

impl From<DecideError> for ServiceError {
    fn from(err: DecideError) -> ServiceError {
        let message = err.to_string();
        match &err {
            DecideError::Unknown(id) => {
                ServiceError::new(Code::UnknownApproval, message).with_details(json!({ "id": id }))
            }
            DecideError::AlreadyDecided(a) => {
                ServiceError::new(Code::ApprovalAlreadyDecided, message)
                    .with_details(json!({"id": a.id, "state": a.state, "decided_by": a.decided_by}))
            }
            DecideError::Invalid(_) => ServiceError::new(Code::InvalidArguments, message),
            _ => ServiceError::new(Code::Internal, message),
        }
    }
}

fn tool_error(err: &ToolError, message: String) -> ServiceError {
    // The typed band of §5.t: each keeps its class and names its plugin.
    let typed = |plugin: &str, tool: &str, rpc: i64| json!({"plugin": plugin, "tool": tool, "rpc_code": rpc});
    let (code, details) = match err {
        ToolError::NotFound { plugin, tool, .. } => {
            (Code::ToolNotFound, typed(plugin, tool, -33401))
        }
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
            (Code::InvalidArguments, d)
        }
        ToolError::ExecutionFailed { plugin, tool, .. } => {
            (Code::ToolFailed, typed(plugin, tool, -33403))
        }
        ToolError::Unavailable {
            plugin,
            tool,
            retry_after_ms,
            ..
        } => {
            let mut d = typed(plugin, tool, -33404);
            let mut e = ServiceError::new(Code::ToolUnavailable, message);
            if let Some(ms) = retry_after_ms {
                // Clamped by the host when read, so this cannot overflow.
                let ms = (*ms).min(plugd_host::model::MAX_RETRY_AFTER_MS);
                d["retry_after_ms"] = json!(ms);
                e.retry_after_secs = Some(ms.div_ceil(1000));
            }
            return e.with_details(d);
        }
        ToolError::Denied { plugin, tool, .. } => (Code::ToolDenied, typed(plugin, tool, -33405)),
        ToolError::Call(CallError::Timeout { .. }) => {
            return ServiceError::new(Code::PluginTimeout, message);
        }
        ToolError::Call(CallError::Closed(_)) => {
            return ServiceError::new(Code::PluginUnavailable, message);
        }
        ToolError::Call(CallError::Remote { error, .. }) => {
            return ServiceError::new(Code::ToolFailed, message)
                .with_details(json!({ "rpc_code": error.code }));
        }
        _ => return ServiceError::new(Code::PluginError, message),
    };
    ServiceError::new(code, message).with_details(details)
}
