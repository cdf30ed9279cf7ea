//! Tool surface of the SDK: catalog entries, decoded invocations and the typed `-33401..-33405` errors.

use std::fmt;

use serde::Serialize;
use serde_json::{Value, json};

/// One entry of the tool catalog advertised in the `initialize` reply
/// (contract §4.1.1).
///
/// `name` must be listed in the manifest's `[plugin.extends] tools` and be
/// namespaced `<plugin_id>_*` or `ext_<plugin_id>_*`; the SDK checks both
/// before serving, exactly as the host would.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDef {
    /// Tool name, e.g. `hello_rust_greet`.
    pub name: String,
    /// One line for the model / operator.
    pub description: String,
    /// JSON Schema of the arguments; the host validates `args` against it.
    pub input_schema: Value,
}

impl ToolDef {
    /// Shorthand constructor.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        ToolDef {
            name: name.into(),
            description: description.into(),
            input_schema,
        }
    }
}

/// A decoded `tool.invoke` request (contract §5.t).
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// Plugin id the host addressed (normally this plugin's own id).
    pub plugin_id: String,
    /// The tool being called; always one the plugin registered.
    pub tool_name: String,
    /// Arguments as sent by the host; `null` when absent.
    pub args: Value,
    /// Agent that issued the call, when the host said.
    pub agent_id: Option<String>,
}

impl Invocation {
    /// The string argument `key`, or an [`ToolError::ArgumentInvalid`]
    /// naming the field when it is missing or not a string.
    pub fn str_arg(&self, key: &str) -> Result<&str, ToolError> {
        self.args
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::ArgumentInvalid {
                message: format!("missing string argument `{key}`"),
                details: Some(json!({ "field": key, "expected": "string" })),
            })
    }

    /// The numeric argument `key` as `f64`, or an
    /// [`ToolError::ArgumentInvalid`] naming the field.
    pub fn f64_arg(&self, key: &str) -> Result<f64, ToolError> {
        self.args
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| ToolError::ArgumentInvalid {
                message: format!("missing number argument `{key}`"),
                details: Some(json!({ "field": key, "expected": "number" })),
            })
    }
}

/// Typed failure of a tool handler; each variant maps to one contract code.
///
/// Messages follow the prefixes the other nexo SDKs use (`invalid argument:
/// ...`), so operator greps work across languages.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolError {
    /// `-33401`: the plugin does not implement this tool.
    NotFound(String),
    /// `-33402`: arguments failed plugin-side validation; `details` becomes
    /// `error.data.details`.
    ArgumentInvalid {
        /// What is wrong, e.g. ``missing `city` ``.
        message: String,
        /// Machine-readable description of the offending fields.
        details: Option<Value>,
    },
    /// `-33403`: the tool ran and failed.
    ExecutionFailed(String),
    /// `-33404`: transient; `retry_after_ms` becomes `error.data.retry_after_ms`.
    Unavailable {
        /// Why the tool cannot run right now.
        message: String,
        /// Hint for the host's retry.
        retry_after_ms: Option<u64>,
    },
    /// `-33405`: the caller is not authorised.
    Denied(String),
}

impl ToolError {
    /// `ArgumentInvalid` without details.
    pub fn argument_invalid(message: impl Into<String>) -> Self {
        ToolError::ArgumentInvalid {
            message: message.into(),
            details: None,
        }
    }

    /// `Unavailable` without a retry hint.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ToolError::Unavailable {
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// The JSON-RPC error code (contract §5.t).
    pub fn code(&self) -> i64 {
        match self {
            ToolError::NotFound(_) => -33401,
            ToolError::ArgumentInvalid { .. } => -33402,
            ToolError::ExecutionFailed(_) => -33403,
            ToolError::Unavailable { .. } => -33404,
            ToolError::Denied(_) => -33405,
        }
    }

    /// The `error.data` object, when the variant carries one.
    pub fn data(&self) -> Option<Value> {
        match self {
            ToolError::ArgumentInvalid {
                details: Some(d), ..
            } => Some(json!({ "details": d })),
            ToolError::Unavailable {
                retry_after_ms: Some(ms),
                ..
            } => Some(json!({ "retry_after_ms": ms })),
            _ => None,
        }
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::NotFound(name) => write!(f, "tool not found: {name}"),
            ToolError::ArgumentInvalid { message, .. } => write!(f, "invalid argument: {message}"),
            ToolError::ExecutionFailed(m) => write!(f, "execution failed: {m}"),
            ToolError::Unavailable { message, .. } => write!(f, "unavailable: {message}"),
            ToolError::Denied(m) => write!(f, "denied: {m}"),
        }
    }
}

impl std::error::Error for ToolError {}

/// The conventional text result:
/// `{"content":[{"type":"text","text":..}],"is_error":false}`.
pub fn text_result(text: &str) -> Value {
    json!({ "content": [{ "type": "text", "text": text }], "is_error": false })
}
