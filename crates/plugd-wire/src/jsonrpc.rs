//! JSON-RPC 2.0 messages as plain serde data, and a strict decoder.
//!
//! The `"jsonrpc": "2.0"` member is checked when reading and added when
//! writing; it is not a field of the types. Ids are integers or strings
//! ([`Id`]); a response to unparseable input carries a null id.

use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// Error codes: JSON-RPC's reserved band and the contract bands plugd maps.
pub mod codes {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON sent is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist or is not available.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// nexo: the shutdown handler returned an error.
    pub const SHUTDOWN_FAILED: i64 = -32000;
    /// nexo §5.t: the plugin does not implement the declared tool.
    pub const TOOL_NOT_FOUND: i64 = -33401;
    /// nexo §5.t: arguments failed plugin-side validation (`data.details`).
    pub const TOOL_ARGUMENT_INVALID: i64 = -33402;
    /// nexo §5.t: the tool ran and failed.
    pub const TOOL_EXECUTION_FAILED: i64 = -33403;
    /// nexo §5.t: transient failure (`data.retry_after_ms`).
    pub const TOOL_UNAVAILABLE: i64 = -33404;
    /// nexo §5.t: the plugin's authorization refused the call.
    pub const TOOL_DENIED: i64 = -33405;
}

/// A request id: an integer or a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    /// An integer id (plugd assigns these).
    Int(i64),
    /// A string id (peers may use these).
    Str(String),
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Int(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for Id {
    fn from(n: i64) -> Self {
        Id::Int(n)
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id::Str(s.to_owned())
    }
}

/// The `error` member of a failed response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// The error code (see [`codes`]).
    pub code: i64,
    /// A short description.
    pub message: String,
    /// Structured detail, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ErrorObject {
    /// An error with a code and message and no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ErrorObject {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Adds structured data.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

impl fmt::Display for ErrorObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

/// A call that expects a response.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The id the response will carry.
    pub id: Id,
    /// The method name.
    pub method: String,
    /// Parameters (`params` member), if present.
    pub params: Option<Value>,
}

/// A one-way message.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The method name.
    pub method: String,
    /// Parameters (`params` member), if present.
    pub params: Option<Value>,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The request's id; `None` (null) only for errors about unparseable input.
    pub id: Option<Id>,
    /// `result` or `error`.
    pub outcome: Result<Value, ErrorObject>,
}

impl Response {
    /// A success response.
    pub fn ok(id: Id, result: Value) -> Self {
        Response {
            id: Some(id),
            outcome: Ok(result),
        }
    }

    /// An error response.
    pub fn err(id: Option<Id>, error: ErrorObject) -> Self {
        Response {
            id,
            outcome: Err(error),
        }
    }
}

/// Any JSON-RPC 2.0 message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request.
    Request(Request),
    /// A response.
    Response(Response),
    /// A notification.
    Notification(Notification),
}

impl From<Request> for Message {
    fn from(r: Request) -> Self {
        Message::Request(r)
    }
}
impl From<Response> for Message {
    fn from(r: Response) -> Self {
        Message::Response(r)
    }
}
impl From<Notification> for Message {
    fn from(n: Notification) -> Self {
        Message::Notification(n)
    }
}

/// Why bytes are not a JSON-RPC message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON at all (`-32700`).
    #[error("not valid JSON: {0}")]
    Parse(#[source] serde_json::Error),
    /// JSON, but not a JSON-RPC 2.0 message (`-32600`).
    #[error("not a JSON-RPC 2.0 message: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
        /// The id, when one could be read, so the error can be answered.
        id: Option<Id>,
    },
}

impl DecodeError {
    /// The JSON-RPC error code for this failure.
    pub fn code(&self) -> i64 {
        match self {
            DecodeError::Parse(_) => codes::PARSE_ERROR,
            DecodeError::Invalid { .. } => codes::INVALID_REQUEST,
        }
    }

    /// The error response a server sends back for this input.
    pub fn to_response(&self) -> Response {
        let id = match self {
            DecodeError::Parse(_) => None,
            DecodeError::Invalid { id, .. } => id.clone(),
        };
        let message = match self {
            DecodeError::Parse(e) => format!("parse error: {e}"),
            DecodeError::Invalid { reason, .. } => format!("invalid request: {reason}"),
        };
        Response::err(id, ErrorObject::new(self.code(), message))
    }
}

/// A member that distinguishes "absent" from "null".
#[derive(Debug, Default)]
enum Member<T> {
    #[default]
    Absent,
    Present(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Member<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Member::Present)
    }
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    jsonrpc: Member<Value>,
    #[serde(default)]
    id: Member<Value>,
    #[serde(default)]
    method: Member<Value>,
    #[serde(default)]
    params: Member<Value>,
    #[serde(default)]
    result: Member<Value>,
    #[serde(default)]
    error: Member<Value>,
}

fn read_id(v: Value) -> Result<Id, String> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .map(Id::Int)
            .ok_or_else(|| format!("id {n} is not an integer in the i64 range")),
        Value::String(s) => Ok(Id::Str(s)),
        other => Err(format!(
            "id must be an integer or a string, got {}",
            kind(&other)
        )),
    }
}

/// The JSON kind of `v` (`"a string"`, `"an object"`, ...), for messages
/// that must not quote a value (it may be huge, or a secret).
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Message {
    /// Decodes one frame's payload, strictly.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        let value: Value = serde_json::from_slice(bytes).map_err(DecodeError::Parse)?;
        Message::from_value(value)
    }

    /// Classifies an already parsed JSON value.
    pub fn from_value(value: Value) -> Result<Message, DecodeError> {
        if !value.is_object() {
            return Err(DecodeError::Invalid {
                reason: format!("expected an object, got {}", kind(&value)),
                id: None,
            });
        }
        let raw: Raw = serde_json::from_value(value).map_err(|e| DecodeError::Invalid {
            reason: e.to_string(),
            id: None,
        })?;
        // An id we can echo makes the -32600 answerable.
        let mut null_id = false;
        let (id, id_err) = match raw.id {
            Member::Absent => (None, None),
            Member::Present(Value::Null) => {
                null_id = true;
                (None, None)
            }
            Member::Present(v) => match read_id(v) {
                Ok(id) => (Some(id), None),
                Err(e) => (None, Some(e)),
            },
        };
        let invalid = |reason: String, id: Option<Id>| DecodeError::Invalid { reason, id };
        match raw.jsonrpc {
            Member::Present(Value::String(ref v)) if v == "2.0" => {}
            Member::Present(v) => {
                return Err(invalid(format!("\"jsonrpc\" must be \"2.0\", got {v}"), id));
            }
            Member::Absent => return Err(invalid("missing \"jsonrpc\": \"2.0\"".into(), id)),
        }
        let params = match raw.params {
            Member::Absent => None,
            Member::Present(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
            Member::Present(Value::Null) => None,
            Member::Present(other) => {
                return Err(invalid(
                    format!(
                        "\"params\" must be an object or an array, got {}",
                        kind(&other)
                    ),
                    id,
                ));
            }
        };
        if let Some(e) = id_err {
            return Err(invalid(e, None));
        }
        match raw.method {
            Member::Present(Value::String(method)) => {
                if !matches!(raw.result, Member::Absent) || !matches!(raw.error, Member::Absent) {
                    return Err(invalid(
                        "a request cannot carry \"result\" or \"error\"".into(),
                        id,
                    ));
                }
                if null_id {
                    return Err(invalid("a request id cannot be null".into(), None));
                }
                Ok(match id {
                    Some(id) => Message::Request(Request { id, method, params }),
                    None => Message::Notification(Notification { method, params }),
                })
            }
            Member::Present(other) => Err(invalid(
                format!("\"method\" must be a string, got {}", kind(&other)),
                id,
            )),
            Member::Absent => {
                let outcome = match (raw.result, raw.error) {
                    (Member::Present(r), Member::Absent) => Ok(r),
                    (Member::Absent, Member::Present(e)) => {
                        Err(serde_json::from_value::<ErrorObject>(e).map_err(|e| {
                            invalid(format!("malformed \"error\" member: {e}"), id.clone())
                        })?)
                    }
                    (Member::Present(_), Member::Present(_)) => {
                        return Err(invalid(
                            "a response cannot carry both \"result\" and \"error\"".into(),
                            id,
                        ));
                    }
                    (Member::Absent, Member::Absent) => {
                        return Err(invalid(
                            "neither \"method\" nor \"result\"/\"error\" present".into(),
                            id,
                        ));
                    }
                };
                if id.is_none() && outcome.is_ok() {
                    return Err(invalid("a success response needs an id".into(), None));
                }
                Ok(Message::Response(Response { id, outcome }))
            }
        }
    }

    /// Serializes to compact JSON bytes (with `"jsonrpc":"2.0"`).
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("JSON-RPC messages always serialize")
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("jsonrpc", "2.0")?;
        match self {
            Message::Request(r) => {
                map.serialize_entry("id", &r.id)?;
                map.serialize_entry("method", &r.method)?;
                if let Some(p) = &r.params {
                    map.serialize_entry("params", p)?;
                }
            }
            Message::Notification(n) => {
                map.serialize_entry("method", &n.method)?;
                if let Some(p) = &n.params {
                    map.serialize_entry("params", p)?;
                }
            }
            Message::Response(r) => {
                map.serialize_entry("id", &r.id)?;
                match &r.outcome {
                    Ok(v) => map.serialize_entry("result", v)?,
                    Err(e) => map.serialize_entry("error", e)?,
                }
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Message::from_value(v).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn dec(s: &str) -> Result<Message, DecodeError> {
        Message::decode(s.as_bytes())
    }

    #[test]
    fn classifies_the_seed_shapes() {
        let req = dec(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"nexo_version":"0.1.5"}}"#,
        )
        .unwrap();
        assert_eq!(
            req,
            Message::Request(Request {
                id: Id::Int(1),
                method: "initialize".into(),
                params: Some(json!({"nexo_version":"0.1.5"})),
            })
        );
        let note =
            dec(r#"{"jsonrpc":"2.0","method":"broker.publish","params":{"topic":"t"}}"#).unwrap();
        assert!(matches!(note, Message::Notification(n) if n.method == "broker.publish"));
        let ok = dec(r#"{"jsonrpc":"2.0","id":"a","result":null}"#).unwrap();
        assert_eq!(
            ok,
            Message::Response(Response::ok(Id::from("a"), Value::Null))
        );
        let err = dec(r#"{"jsonrpc":"2.0","id":80,"error":{"code":-33404,"message":"busy","data":{"retry_after_ms":5000}}}"#)
            .unwrap();
        let Message::Response(Response {
            id,
            outcome: Err(e),
        }) = err
        else {
            panic!()
        };
        assert_eq!(id, Some(Id::Int(80)));
        assert_eq!(e.code, codes::TOOL_UNAVAILABLE);
        assert_eq!(e.data, Some(json!({"retry_after_ms":5000})));
        let null_id =
            dec(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#).unwrap();
        assert!(matches!(
            null_id,
            Message::Response(Response { id: None, .. })
        ));
    }

    #[test]
    fn unparseable_input_is_32700_with_null_id() {
        let e = dec("hello there").unwrap_err();
        assert_eq!(e.code(), -32700);
        let resp = Message::Response(e.to_response());
        let v: Value = serde_json::from_slice(&resp.to_vec()).unwrap();
        assert_eq!(v["id"], Value::Null);
        assert_eq!(v["error"]["code"], -32700);
        assert_eq!(v["jsonrpc"], "2.0");
    }

    #[test]
    fn well_formed_non_jsonrpc_is_32600() {
        for (input, needle, id) in [
            (r#"[1,2]"#, "expected an object", None),
            (r#"{"hello":"world"}"#, "missing \"jsonrpc\"", None),
            (
                r#"{"jsonrpc":"1.0","id":3,"method":"x"}"#,
                "must be \"2.0\"",
                Some(Id::Int(3)),
            ),
            (r#"{"jsonrpc":"2.0","id":3}"#, "neither", Some(Id::Int(3))),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#,
                "not an integer",
                None,
            ),
            (
                r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
                "integer or a string",
                None,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
                "\"method\" must be a string",
                Some(Id::Int(1)),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m","params":5}"#,
                "\"params\"",
                Some(Id::Int(1)),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}"#,
                "both",
                Some(Id::Int(1)),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":"x"}}"#,
                "malformed \"error\"",
                Some(Id::Int(1)),
            ),
            (r#"{"jsonrpc":"2.0","result":1}"#, "needs an id", None),
        ] {
            let e = dec(input).unwrap_err();
            assert_eq!(e.code(), -32600, "{input}");
            assert!(e.to_string().contains(needle), "{input}: {e}");
            assert_eq!(e.to_response().id, id, "{input}");
        }
    }

    #[test]
    fn serializes_with_envelope_and_round_trips() {
        let msgs = [
            Message::Request(Request {
                id: Id::Int(7),
                method: "tool.invoke".into(),
                params: Some(json!({"a":1})),
            }),
            Message::Notification(Notification {
                method: "n".into(),
                params: None,
            }),
            Message::Response(Response::ok(Id::from("x"), json!([1]))),
            Message::Response(Response::err(
                None,
                ErrorObject::new(-32700, "bad").with_data(json!(1)),
            )),
        ];
        for m in msgs {
            let bytes = m.to_vec();
            assert!(bytes.starts_with(br#"{"jsonrpc":"2.0""#));
            assert_eq!(Message::decode(&bytes).unwrap(), m);
        }
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[a-z\\\\\"\n ]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Message::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_json_objects(v in arb_value(), id in arb_value(), method in arb_value()) {
            let mut obj = serde_json::Map::new();
            obj.insert("jsonrpc".into(), json!("2.0"));
            obj.insert("id".into(), id);
            obj.insert("method".into(), method);
            obj.insert("params".into(), v);
            let _ = Message::from_value(Value::Object(obj));
        }

        #[test]
        fn requests_round_trip(n in any::<i64>(), method in "[a-z./_]{1,20}", params in arb_value()) {
            let params = match params { p @ (Value::Object(_) | Value::Array(_)) => Some(p), _ => None };
            let m = Message::Request(Request { id: Id::Int(n), method, params });
            prop_assert_eq!(Message::decode(&m.to_vec()).unwrap(), m);
        }
    }
}
