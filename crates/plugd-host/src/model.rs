//! The model every dialect shares: a tool as a plugin advertises it
//! ([`ToolDef`], [`ToolMeta`]), what a handshake establishes ([`Handshake`])
//! or why it was refused ([`HandshakeError`]), and a failed tool call
//! ([`ToolError`], with the nexo `-33401..-33405` codes mapped by
//! [`map_tool_error`]).

use std::sync::Arc;

use plugd_wire::{ErrorObject, codes};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::peer::CallError;

/// The contract version plugd speaks, sent as `contract_version` beside
/// `nexo_version` in `initialize` (a plugd addition; SDKs ignore it).
pub use plugd_manifest::NEXO_CONTRACT_VERSION;
/// The nexo daemon version plugd presents as `initialize.params.nexo_version`.
pub use plugd_manifest::NEXO_HOST_VERSION;

/// One tool as a plugin advertises it (§4.1.1 `RemoteToolDef`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// The name `plugd tool call` accepts (namespaced).
    pub name: String,
    /// What it does, for people and models.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    #[serde(default = "default_schema")]
    pub input_schema: Value,
    /// The name on the wire when it differs from `name` (Salmex and MCP tool
    /// names, VAI export ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_name: Option<String>,
    /// Risk level (`low`, `medium`, `high`, `critical`) when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<String>,
    /// What the plugin says about the tool beyond its call contract (MCP
    /// `title`, `annotations`, `outputSchema`, `icons`); `None` when it
    /// says nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Box<ToolMeta>>,
}

/// Optional descriptive metadata of a tool (MCP `Tool` fields beyond name,
/// description and input schema), kept as the server sent them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolMeta {
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// MCP `ToolAnnotations` (`readOnlyHint`, `destructiveHint`,
    /// `idempotentHint`, `openWorldHint`, `title`): hints, not guarantees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<serde_json::Map<String, Value>>,
    /// JSON Schema of `structuredContent` (MCP `outputSchema`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// MCP `icons`, as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icons: Option<Vec<Value>>,
    /// MCP `execution` (`taskSupport`: `forbidden`, `optional` or
    /// `required`), kept only when the server can run the tool as a task;
    /// `required` makes plugd call it task-augmented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<serde_json::Map<String, Value>>,
}

impl ToolMeta {
    /// Annotation `key` when it is a boolean.
    pub fn hint(&self, key: &str) -> Option<bool> {
        self.annotations.as_ref()?.get(key)?.as_bool()
    }
}

impl ToolDef {
    /// A tool whose wire name is its listed name.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        ToolDef {
            name: name.into(),
            description: description.into(),
            input_schema,
            wire_name: None,
            risk_level: None,
            meta: None,
        }
    }

    /// The tool a manifest declares (Salmex `capabilities.tools`, VAI tool
    /// exports), as the catalog entry it becomes.
    pub fn declared(t: &plugd_manifest::DeclaredTool) -> Self {
        ToolDef {
            name: t.name.clone(),
            description: t.description.clone(),
            input_schema: t.input_schema.clone(),
            wire_name: Some(t.wire_name.clone()),
            risk_level: t.risk_level.clone(),
            meta: None,
        }
    }

    /// The output schema, when the plugin declared one.
    pub fn output_schema(&self) -> Option<&Value> {
        self.meta.as_ref()?.output_schema.as_ref()
    }

    /// The name to send on the wire.
    pub fn wire(&self) -> &str {
        self.wire_name.as_deref().unwrap_or(&self.name)
    }
}

fn default_schema() -> Value {
    json!({"type": "object"})
}

/// What the handshake established.
#[derive(Debug, Clone, Default)]
pub struct Handshake {
    /// The plugin's free-form `server_version`.
    pub server_version: Option<String>,
    /// The advertised tool catalog, validated against the manifest.
    pub tools: Vec<ToolDef>,
    /// Non-fatal findings (declared tools the plugin did not advertise).
    pub warnings: Vec<String>,
}

/// Why a handshake was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The call itself failed (timeout, crash, error reply).
    #[error("initialize failed: {0}")]
    Call(#[from] CallError),
    /// The child claims to be another plugin.
    #[error(
        "plugin {expected:?} identified itself as {got:?} in its handshake; an impostor is refused (check the identity the plugin declares)"
    )]
    IdentityMismatch {
        /// The id from the installed manifest.
        expected: String,
        /// The id the child echoed.
        got: String,
    },
    /// The reply does not have the contract's shape.
    #[error("plugin {plugin:?}: malformed initialize reply: {reason}")]
    Malformed {
        /// Plugin id.
        plugin: String,
        /// What is wrong.
        reason: String,
    },
    /// An advertised tool is not in `[plugin.extends].tools`.
    #[error(
        "plugin {plugin:?} advertised tool {tool:?}, which is not declared in {declared_in}; declare it there or stop advertising it"
    )]
    UndeclaredTool {
        /// Plugin id.
        plugin: String,
        /// The tool.
        tool: String,
        /// Where tools are declared in this dialect.
        declared_in: &'static str,
    },
    /// An advertised tool breaks the dialect's naming rule (native:
    /// `<id>_*` / `ext_<id>_*`).
    #[error("plugin {plugin:?} advertised tool {tool:?} outside its namespace; {rule}")]
    Namespace {
        /// Plugin id.
        plugin: String,
        /// The tool.
        tool: String,
        /// The dialect's naming rule, as advice.
        rule: String,
    },
}

impl HandshakeError {
    /// `true` when retrying cannot help (the plugin lies about itself).
    pub fn is_permanent(&self) -> bool {
        !matches!(self, HandshakeError::Call(_))
    }
}

/// A tool call that did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// -33401: the plugin does not implement the tool.
    #[error("plugin {plugin:?}: tool {tool:?} not found: {message}")]
    NotFound {
        /// Plugin id.
        plugin: Arc<str>,
        /// The tool.
        tool: String,
        /// The plugin's message.
        message: String,
    },
    /// -33402: the plugin rejected the arguments.
    #[error("plugin {plugin:?}: tool {tool:?} rejected its arguments: {message}{}", details.as_ref().map(|d| format!(" (details: {d})")).unwrap_or_default())]
    ArgumentInvalid {
        /// Plugin id.
        plugin: Arc<str>,
        /// The tool.
        tool: String,
        /// The plugin's message.
        message: String,
        /// `data.details`, the offending fields.
        details: Option<Value>,
    },
    /// -33403: the tool ran and failed.
    #[error("plugin {plugin:?}: tool {tool:?} failed: {message}")]
    ExecutionFailed {
        /// Plugin id.
        plugin: Arc<str>,
        /// The tool.
        tool: String,
        /// The plugin's message.
        message: String,
    },
    /// -33404: transient; retry later.
    #[error("plugin {plugin:?}: tool {tool:?} unavailable: {message}{}", retry_after_ms.map(|ms| format!("; retry after {ms} ms")).unwrap_or_default())]
    Unavailable {
        /// Plugin id.
        plugin: Arc<str>,
        /// The tool.
        tool: String,
        /// The plugin's message.
        message: String,
        /// `data.retry_after_ms`.
        retry_after_ms: Option<u64>,
    },
    /// -33405: the plugin's authorization refused the call.
    #[error("plugin {plugin:?}: tool {tool:?} denied: {message}")]
    Denied {
        /// Plugin id.
        plugin: Arc<str>,
        /// The tool.
        tool: String,
        /// The plugin's message.
        message: String,
    },
    /// -32601: the plugin does not implement `tool.invoke`.
    #[error("plugin {plugin:?} does not implement tool calls (tool.invoke: method not found)")]
    NotImplemented {
        /// Plugin id.
        plugin: Arc<str>,
    },
    /// Any other failure of the call (other error codes, timeout, crash).
    #[error(transparent)]
    Call(#[from] CallError),
}

/// Maps a `tool.invoke` error reply to a typed [`ToolError`].
pub fn map_tool_error(plugin: &Arc<str>, tool: &str, err: CallError) -> ToolError {
    let CallError::Remote { error, .. } = &err else {
        return ToolError::Call(err);
    };
    let ErrorObject {
        code,
        message,
        data,
    } = (**error).clone();
    let plugin = plugin.clone();
    let tool = tool.to_owned();
    match code {
        codes::TOOL_NOT_FOUND => ToolError::NotFound {
            plugin,
            tool,
            message,
        },
        codes::TOOL_ARGUMENT_INVALID => ToolError::ArgumentInvalid {
            plugin,
            tool,
            message,
            details: data.and_then(|d| d.get("details").cloned()),
        },
        codes::TOOL_EXECUTION_FAILED => ToolError::ExecutionFailed {
            plugin,
            tool,
            message,
        },
        codes::TOOL_UNAVAILABLE => ToolError::Unavailable {
            plugin,
            tool,
            message,
            retry_after_ms: retry_after_ms(data.as_ref()),
        },
        codes::TOOL_DENIED => ToolError::Denied {
            plugin,
            tool,
            message,
        },
        codes::METHOD_NOT_FOUND => ToolError::NotImplemented { plugin },
        _ => ToolError::Call(err),
    }
}

/// The longest wait a plugin's `retry_after_ms` can ask for: one hour.
pub const MAX_RETRY_AFTER_MS: u64 = 3_600_000;

/// `data.retry_after_ms` of a `-33404` reply, made safe: a non-negative
/// integer or finite number (rounded up) clamped to [`MAX_RETRY_AFTER_MS`];
/// anything else (negative, a string, `null`, an object) is no hint at all.
/// The plugin is untrusted: `1e308` or `u64::MAX` must not overflow the
/// `Retry-After` arithmetic or tell clients to wait for ages.
pub fn retry_after_ms(data: Option<&Value>) -> Option<u64> {
    let v = data?.get("retry_after_ms")?;
    if let Some(n) = v.as_u64() {
        return Some(n.min(MAX_RETRY_AFTER_MS));
    }
    match v.as_f64() {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped first
        Some(f) if f.is_finite() && f >= 0.0 => {
            Some(f.ceil().min(MAX_RETRY_AFTER_MS as f64) as u64)
        }
        _ => None,
    }
}

/// A fresh id `<prefix>_<32 hex digits>`: a UUIDv7 (the time and 74 random
/// bits), the same form as `plugd_control::id::fresh`, unique across
/// processes and nodes.
pub fn fresh_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(code: i64, message: &str, data: Option<Value>) -> CallError {
        CallError::Remote {
            plugin: "p".into(),
            method: "tool.invoke".into(),
            error: Box::new(ErrorObject {
                code,
                message: message.into(),
                data,
            }),
        }
    }

    /// A lying `retry_after_ms` (negative, a string, 1e308, u64::MAX,
    /// fractional) never panics: it is clamped or dropped.
    #[test]
    fn retry_after_ms_from_a_lying_plugin_is_clamped_or_dropped() {
        let r = |v: Value| retry_after_ms(Some(&json!({ "retry_after_ms": v })));
        assert_eq!(r(json!(1500)), Some(1500));
        assert_eq!(r(json!(1.2)), Some(2));
        assert_eq!(r(json!(-5)), None);
        assert_eq!(r(json!(-0.5)), None);
        assert_eq!(r(json!("5000")), None);
        assert_eq!(r(json!(null)), None);
        assert_eq!(r(json!({"ms": 1})), None);
        assert_eq!(r(json!(1e308)), Some(MAX_RETRY_AFTER_MS));
        assert_eq!(r(json!(u64::MAX)), Some(MAX_RETRY_AFTER_MS));
        assert_eq!(retry_after_ms(None), None);
        assert_eq!(retry_after_ms(Some(&json!([1]))), None);
    }

    /// The exact JSON shapes of §5.t, as a plugin sends them.
    #[test]
    fn typed_tool_errors_from_real_shapes() {
        let p: Arc<str> = "p".into();
        let parse = |s: &str| -> CallError {
            let v: Value = serde_json::from_str(s).unwrap();
            let e: ErrorObject = serde_json::from_value(v["error"].clone()).unwrap();
            remote(e.code, &e.message, e.data)
        };
        let e = map_tool_error(
            &p,
            "p_t",
            parse(
                r#"{"jsonrpc":"2.0","id":80,"error":{"code":-33402,"message":"argument invalid: missing `city`","data":{"details":{"field":"city"}}}}"#,
            ),
        );
        assert!(
            matches!(&e, ToolError::ArgumentInvalid { details: Some(d), .. } if d["field"] == "city"),
            "{e:?}"
        );
        let e = map_tool_error(
            &p,
            "p_t",
            parse(
                r#"{"jsonrpc":"2.0","id":80,"error":{"code":-33404,"message":"unavailable","data":{"retry_after_ms":5000}}}"#,
            ),
        );
        assert!(matches!(
            e,
            ToolError::Unavailable {
                retry_after_ms: Some(5000),
                ..
            }
        ));
        assert!(e.to_string().contains("retry after 5000 ms"));
        assert!(matches!(
            map_tool_error(&p, "t", remote(-33401, "nf", None)),
            ToolError::NotFound { .. }
        ));
        assert!(matches!(
            map_tool_error(&p, "t", remote(-33403, "boom", None)),
            ToolError::ExecutionFailed { .. }
        ));
        assert!(matches!(
            map_tool_error(&p, "t", remote(-33405, "no", None)),
            ToolError::Denied { .. }
        ));
        assert!(matches!(
            map_tool_error(&p, "t", remote(-32601, "mnf", None)),
            ToolError::NotImplemented { .. }
        ));
        assert!(matches!(
            map_tool_error(&p, "t", remote(-32000, "x", None)),
            ToolError::Call(CallError::Remote { .. })
        ));
    }
}
