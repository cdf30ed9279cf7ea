//! What a hosted MCP server says that the gateway passes on unchanged: its
//! JSON-RPC errors (code, message and data, not an `isError` text), and the
//! 2026-07-28 multi-round-trip requests (`input_required` results out, the
//! client's `inputResponses` and `requestState` back in).
//!
//! Decisions written beside the code:
//! - a hosted server's error reply keeps its code and data on every
//!   revision (JSON-RPC errors exist on all of them); plugd's own failures
//!   (a timeout, a crash, an oversized reply) stay plugd's errors;
//! - `input_required` passes through only to a client on the stateless
//!   revision, which answers it itself; a stateful client is asked the
//!   same questions as server requests on its stream (the dialect's
//!   `answer_inputs`), as before.

use plugd_host::supervisor::CallToolError;
use plugd_host::{CallError, ToolError};
use plugd_runtime::RuntimeError;
use serde_json::{Map, Value, json};

/// The JSON-RPC error a hosted server answered with, as it sent it, when
/// `e` is one.
pub(crate) fn rpc_error(e: &RuntimeError) -> Option<Value> {
    let call = match e {
        RuntimeError::Feature(plugd_dialects::FeatureError::Call(c)) => c,
        RuntimeError::Call(CallToolError::Tool(ToolError::Call(c))) => c,
        _ => return None,
    };
    let CallError::Remote { error, .. } = call else {
        return None;
    };
    let mut out = json!({"code": error.code, "message": error.message});
    if let Some(data) = &error.data {
        out["data"] = data.clone();
    }
    Some(out)
}

/// The params of a retried 2026-07-28 request that belong to its rounds
/// (`inputResponses`, `requestState`), to send on to the hosted server.
pub(crate) fn round_params(params: &Value) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    for key in ["inputResponses", "requestState"] {
        if let Some(v) = params.get(key).filter(|v| !v.is_null()) {
            out.insert(key.to_owned(), v.clone());
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether `result` asks the client for input (2026-07-28).
pub(crate) fn is_input_required(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_round_params_are_taken() {
        let p =
            json!({"name": "t", "arguments": {}, "inputResponses": {"a": {}}, "requestState": "s"});
        let got = round_params(&p).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got["requestState"], "s");
        assert!(round_params(&json!({"name": "t", "requestState": null})).is_none());
    }

    #[test]
    fn a_remote_error_keeps_code_and_data() {
        let e = RuntimeError::Feature(plugd_dialects::FeatureError::Call(CallError::Remote {
            plugin: "s".into(),
            method: "resources/read".into(),
            error: Box::new(plugd_wire::ErrorObject {
                code: -32602,
                message: "Resource not found".into(),
                data: Some(json!({"uri": "test://x"})),
            }),
        }));
        assert_eq!(
            rpc_error(&e).unwrap(),
            json!({"code": -32602, "message": "Resource not found", "data": {"uri": "test://x"}})
        );
        assert!(rpc_error(&RuntimeError::UnknownTool("t".into())).is_none());
    }
}
