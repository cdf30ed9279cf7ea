//! The `vai.rpc.v1` envelope: Content-Length frames carrying `protocol` and `type`.
//!
//! Maps the peer's operations onto VAI frames. Host request ids are integers
//! inside the peer and `req_<n>` strings on the wire; a response or event
//! whose id is not of that form cannot be ours and is reported as unknown.
//! The plugin's `hello` becomes [`Incoming::Notification`] `hello` (its
//! params are the whole frame) for the dialect's handler; frames with a
//! wrong or missing `protocol` are junk.

use plugd_wire::{ErrorObject, Framing, Id};
use serde_json::{Map, Value, json};

use plugd_host::protocol::{Incoming, Protocol};

/// The protocol name every frame carries.
pub const PROTOCOL: &str = "vai.rpc.v1";

/// Integer code given to `ok=false` responses inside the peer (the string
/// code travels in the message and in `data.code`).
pub const PROTOCOL_FAILURE: i64 = -32000;

/// The `vai.rpc.v1` envelope.
#[derive(Debug, Clone, Copy, Default)]
pub struct VaiRpc;

/// The wire id of host request `id`.
pub fn wire_id(id: i64) -> String {
    format!("req_{id}")
}

/// The host request id in a wire id, when it is one plugd issues.
pub fn parse_wire_id(s: &str) -> Option<i64> {
    let digits = s.strip_prefix("req_")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn envelope(kind: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("protocol".into(), json!(PROTOCOL));
    m.insert("type".into(), json!(kind));
    m
}

fn to_vec(m: Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
}

/// A frame of `type` `kind` with `fields` merged in (used for `hello` and
/// `shutdown`).
pub fn encode_frame(kind: &str, fields: Option<Value>) -> Vec<u8> {
    let mut m = envelope(kind);
    if let Some(Value::Object(fields)) = fields {
        for (k, v) in fields {
            if k != "protocol" && k != "type" {
                m.insert(k, v);
            }
        }
    }
    to_vec(m)
}

impl Protocol for VaiRpc {
    fn framing(&self) -> Framing {
        Framing::ContentLength
    }

    fn sniff_id(&self, prefix: &[u8]) -> Option<i64> {
        let rest = plugd_host::protocol::id_member(prefix)?.strip_prefix('"')?;
        parse_wire_id(&rest[..rest.find('"')?])
    }

    fn encode_request(&self, id: i64, method: &str, params: Option<Value>) -> Vec<u8> {
        let mut m = envelope("request");
        m.insert("id".into(), json!(wire_id(id)));
        m.insert("op".into(), json!(method));
        m.insert("body".into(), params.unwrap_or_else(|| json!({})));
        to_vec(m)
    }

    fn encode_notification(&self, method: &str, params: Option<Value>) -> Vec<u8> {
        encode_frame(method, params)
    }

    fn encode_response(&self, id: Id, outcome: Result<Value, ErrorObject>) -> Vec<u8> {
        let mut m = envelope("response");
        m.insert(
            "id".into(),
            match id {
                Id::Str(s) => json!(s),
                Id::Int(n) => json!(n),
            },
        );
        match outcome {
            Ok(body) => {
                m.insert("ok".into(), json!(true));
                m.insert("body".into(), body);
            }
            Err(e) => {
                let code = e
                    .data
                    .as_ref()
                    .and_then(|d| d.get("code"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| match e.code {
                        plugd_wire::codes::METHOD_NOT_FOUND => "protocol.unsupported_op".into(),
                        _ => "host.error".into(),
                    });
                m.insert("ok".into(), json!(false));
                m.insert("error".into(), json!({"code": code, "message": e.message}));
            }
        }
        to_vec(m)
    }

    fn encode_cancel(&self, id: i64, reason: &str) -> Option<Vec<u8>> {
        let reason = match reason {
            "deadline_exceeded" => "deadline_exceeded".to_owned(),
            other => other.replace(' ', "_"),
        };
        let mut m = envelope("cancel");
        m.insert("request_id".into(), json!(wire_id(id)));
        m.insert("reason".into(), json!(reason));
        Some(to_vec(m))
    }

    fn decode(&self, bytes: &[u8]) -> Result<Incoming, String> {
        decode(bytes)
    }
}

fn describe_id(v: Option<&Value>) -> String {
    match v {
        None => "none".into(),
        Some(Value::String(s)) => format!("{:?}", s.chars().take(64).collect::<String>()),
        Some(other) => other.to_string().chars().take(64).collect(),
    }
}

/// Classifies one `vai.rpc.v1` frame from a plugin.
pub fn decode(bytes: &[u8]) -> Result<Incoming, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut m) = v else {
        return Err("a frame must be a JSON object".into());
    };
    match m.get("protocol") {
        Some(Value::String(p)) if p == PROTOCOL => {}
        Some(other) => {
            return Err(format!(
                "\"protocol\" is {}, not \"{PROTOCOL}\"",
                other.to_string().chars().take(64).collect::<String>()
            ));
        }
        None => return Err("missing \"protocol\"".into()),
    }
    let kind = match m.get("type") {
        Some(Value::String(t)) => t.clone(),
        _ => return Err("missing or non-string \"type\"".into()),
    };
    match kind.as_str() {
        "response" => {
            let raw = m.get("id");
            let raw_id = describe_id(raw);
            let id = raw.and_then(Value::as_str).and_then(parse_wire_id);
            let outcome = match m.get("ok") {
                Some(Value::Bool(true)) => Ok(m.remove("body").unwrap_or(Value::Null)),
                Some(Value::Bool(false)) => {
                    let err = m.get("error");
                    let code = err
                        .and_then(|e| e.get("code"))
                        .and_then(Value::as_str)
                        .unwrap_or("protocol.unspecified");
                    let message = err
                        .and_then(|e| e.get("message"))
                        .and_then(Value::as_str)
                        .unwrap_or("no message");
                    Err(ErrorObject {
                        code: PROTOCOL_FAILURE,
                        message: format!("{code}: {message}"),
                        data: Some(json!({"code": code})),
                    })
                }
                _ => Err(ErrorObject {
                    code: PROTOCOL_FAILURE,
                    message: "protocol.invalid_frame: the response has no boolean \"ok\"".into(),
                    data: Some(json!({"code": "protocol.invalid_frame"})),
                }),
            };
            Ok(Incoming::Response {
                id,
                raw_id,
                outcome,
            })
        }
        "event" => {
            let request_id = match m.get("request_id").and_then(Value::as_str) {
                Some(s) => {
                    parse_wire_id(s).ok_or_else(|| format!("event for unknown request id {s:?}"))?
                }
                None => return Err("event without a string \"request_id\"".into()),
            };
            let event = match m.remove("event") {
                Some(e @ Value::Object(_)) => e,
                _ => return Err("event without an \"event\" object".into()),
            };
            Ok(Incoming::Event {
                request_id: Some(request_id),
                event,
            })
        }
        "request" => {
            let id = match m.get("id") {
                Some(Value::String(s)) => Id::Str(s.clone()),
                _ => return Err("request without a string \"id\"".into()),
            };
            let method = match m.get("op") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err("request without a string \"op\"".into()),
            };
            Ok(Incoming::Request {
                id,
                method,
                params: m.remove("body"),
            })
        }
        "hello" | "cancel" | "shutdown" => Ok(Incoming::Notification {
            method: kind,
            params: Some(Value::Object(m)),
        }),
        other => Err(format!(
            "unknown frame type {:?}",
            other.chars().take(64).collect::<String>()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Result<Incoming, String> {
        decode(s.as_bytes())
    }

    #[test]
    fn requests_cancels_and_frames_have_the_seed_shape() {
        let p = VaiRpc;
        let req: Value =
            serde_json::from_slice(&p.encode_request(123, "tool.invoke", Some(json!({"a":1}))))
                .unwrap();
        assert_eq!(
            req,
            json!({"protocol":"vai.rpc.v1","type":"request","id":"req_123","op":"tool.invoke","body":{"a":1}})
        );
        let cancel: Value =
            serde_json::from_slice(&p.encode_cancel(123, "deadline_exceeded").unwrap()).unwrap();
        assert_eq!(
            cancel,
            json!({"protocol":"vai.rpc.v1","type":"cancel","request_id":"req_123","reason":"deadline_exceeded"})
        );
        let shutdown: Value = serde_json::from_slice(&encode_frame("shutdown", None)).unwrap();
        assert_eq!(shutdown, json!({"protocol":"vai.rpc.v1","type":"shutdown"}));
        let resp: Value = serde_json::from_slice(&p.encode_response(
            Id::Str("p1".into()),
            Err(ErrorObject::new(plugd_wire::codes::METHOD_NOT_FOUND, "no")),
        ))
        .unwrap();
        assert_eq!(resp["ok"], false);
        assert_eq!(resp["error"]["code"], "protocol.unsupported_op");
    }

    #[test]
    fn responses_map_back_to_host_ids() {
        let ok = dec(r#"{"protocol":"vai.rpc.v1","type":"response","id":"req_7","ok":true,"body":{"status":"succeeded"}}"#).unwrap();
        assert_eq!(
            ok,
            Incoming::Response {
                id: Some(7),
                raw_id: "\"req_7\"".into(),
                outcome: Ok(json!({"status":"succeeded"}))
            }
        );
        assert_eq!(VaiRpc.sniff_id(br#"{"protocol":"vai.rpc.v1","type":"response","id": "req_42","ok":true,"body":{"x":"aaaa"#), Some(42));
        assert_eq!(
            VaiRpc.sniff_id(br#"{"protocol":"vai.rpc.v1","type":"response","id":"nope","#),
            None
        );
        let Incoming::Response { id, outcome: Err(e), .. } = dec(r#"{"protocol":"vai.rpc.v1","type":"response","id":"req_8","ok":false,"error":{"code":"protocol.invalid_frame","message":"missing body"}}"#).unwrap() else {
            panic!("expected an error response")
        };
        assert_eq!(id, Some(8));
        assert_eq!(e.message, "protocol.invalid_frame: missing body");
        assert_eq!(e.data.unwrap()["code"], "protocol.invalid_frame");
        // Ids plugd never issues are unknown, not misrouted.
        for bad in [
            r#""123""#,
            r#""req_""#,
            r#""req_-1""#,
            "123",
            r#""req_99999999999999999999""#,
        ] {
            let frame =
                format!(r#"{{"protocol":"vai.rpc.v1","type":"response","id":{bad},"ok":true}}"#);
            assert!(
                matches!(dec(&frame).unwrap(), Incoming::Response { id: None, .. }),
                "{bad}"
            );
        }
        // A response without "ok" fails its call instead of hanging it.
        let Incoming::Response {
            id: Some(9),
            outcome: Err(e),
            ..
        } = dec(r#"{"protocol":"vai.rpc.v1","type":"response","id":"req_9"}"#).unwrap()
        else {
            panic!()
        };
        assert!(e.message.contains("no boolean \"ok\""), "{}", e.message);
    }

    #[test]
    fn events_hello_and_junk() {
        let ev = dec(r#"{"protocol":"vai.rpc.v1","type":"event","request_id":"req_3","event":{"type":"progress","message":"working"}}"#).unwrap();
        assert_eq!(
            ev,
            Incoming::Event {
                request_id: Some(3),
                event: json!({"type":"progress","message":"working"})
            }
        );
        let hello = dec(r#"{"protocol":"vai.rpc.v1","type":"hello","role":"plugin","plugin":{"package_id":"a/b","version":"1.0.0"}}"#).unwrap();
        let Incoming::Notification {
            method,
            params: Some(p),
        } = hello
        else {
            panic!()
        };
        assert_eq!(method, "hello");
        assert_eq!(p["plugin"]["package_id"], "a/b");
        for junk in [
            r#"{"type":"response","id":"req_1","ok":true}"#,
            r#"{"protocol":"vai.rpc.v2","type":"response","id":"req_1","ok":true}"#,
            r#"{"protocol":1,"type":"hello"}"#,
            r#"{"protocol":"vai.rpc.v1"}"#,
            r#"{"protocol":"vai.rpc.v1","type":"telemetry"}"#,
            r#"{"protocol":"vai.rpc.v1","type":"event","request_id":"x","event":{}}"#,
            r#"{"protocol":"vai.rpc.v1","type":"event","request_id":"req_1","event":"str"}"#,
            r#"[1,2]"#,
            "not json",
        ] {
            assert!(dec(junk).is_err(), "{junk}");
        }
    }

    /// A small deterministic fuzz (the proptest properties are in `props`): random bytes
    /// and every truncation and byte flip of valid frames never panic.
    #[test]
    fn decode_never_panics() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let len = (next() % 200) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = decode(&bytes);
        }
        let valid = br#"{"protocol":"vai.rpc.v1","type":"response","id":"req_1","ok":false,"error":{"code":"c","message":"m"}}"#;
        for cut in 0..valid.len() {
            let _ = decode(&valid[..cut]);
            let mut flipped = valid.to_vec();
            flipped[cut] ^= (next() as u8) | 1;
            let _ = decode(&flipped);
        }
        for id in [0i64, 1, 42, i64::MAX] {
            assert_eq!(parse_wire_id(&wire_id(id)), Some(id));
        }
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::json_with;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "protocol",
        "type",
        "id",
        "ok",
        "body",
        "error",
        "code",
        "message",
        "request_id",
        "event",
        "op",
        "reason",
    ];
    const STRINGS: &[&str] = &[
        PROTOCOL,
        "response",
        "event",
        "request",
        "hello",
        "cancel",
        "shutdown",
        "req_0",
        "req_1",
        "req_",
        "req_-1",
        "req_99999999999999999999",
        "req_１",
    ];

    fn norm(v: &Value) -> Value {
        serde_json::from_slice(&serde_json::to_vec(v).unwrap()).unwrap()
    }

    /// A frame object: the envelope keys usually right, the rest random.
    fn frame() -> impl Strategy<Value = Value> {
        (
            json_with(KEYS, STRINGS),
            prop::option::weighted(0.9, json_with(KEYS, STRINGS)),
            prop::option::weighted(0.9, proptest::sample::select(STRINGS)),
            prop::option::of(json_with(KEYS, STRINGS)),
        )
            .prop_map(|(base, id, kind, body)| {
                let mut m = match base {
                    Value::Object(m) => m,
                    other => Map::from_iter([("body".to_owned(), other)]),
                };
                m.insert("protocol".into(), json!(PROTOCOL));
                if let Some(kind) = kind {
                    m.insert("type".into(), json!(kind));
                }
                if let Some(id) = id {
                    m.insert("id".into(), id.clone());
                    m.insert("request_id".into(), id);
                }
                if let Some(body) = body {
                    m.insert("event".into(), body);
                }
                Value::Object(m)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn decode_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_frame_objects(v in frame()) {
            let _ = decode(&serde_json::to_vec(&v).unwrap());
        }

        #[test]
        fn requests_round_trip(n in 0..=i64::MAX, op in "[a-z._/]{1,20}", body in prop::option::of(json_with(KEYS, STRINGS))) {
            let bytes = VaiRpc.encode_request(n, &op, body.clone());
            let want = Incoming::Request {
                id: Id::Str(wire_id(n)),
                method: op,
                params: Some(body.as_ref().map_or(json!({}), norm)),
            };
            prop_assert_eq!(decode(&bytes).unwrap(), want);
        }

        #[test]
        fn responses_round_trip(n in 0..=i64::MAX, body in json_with(KEYS, STRINGS)) {
            let bytes = VaiRpc.encode_response(Id::Str(wire_id(n)), Ok(body.clone()));
            prop_assert_eq!(decode(&bytes).unwrap(), Incoming::Response {
                id: Some(n),
                raw_id: format!("{:?}", wire_id(n)),
                outcome: Ok(norm(&body)),
            });
        }

        #[test]
        fn error_responses_round_trip(
            n in 0..=i64::MAX,
            code in any::<i64>(),
            message in any::<String>(),
            string_code in prop::option::of("[a-z._]{1,20}"),
        ) {
            let data = string_code.as_ref().map(|c| json!({"code": c}));
            let bytes = VaiRpc.encode_response(
                Id::Str(wire_id(n)),
                Err(ErrorObject { code, message: message.clone(), data }),
            );
            let want_code = string_code.unwrap_or_else(|| match code {
                plugd_wire::codes::METHOD_NOT_FOUND => "protocol.unsupported_op".into(),
                _ => "host.error".into(),
            });
            let Incoming::Response { id, outcome: Err(e), .. } = decode(&bytes).unwrap() else {
                return Err(TestCaseError::fail("expected an error response"));
            };
            prop_assert_eq!(id, Some(n));
            prop_assert_eq!(e.message, format!("{want_code}: {message}"));
            prop_assert_eq!(e.data, Some(json!({"code": want_code})));
        }

        #[test]
        fn events_round_trip(n in 0..=i64::MAX, event in prop::collection::btree_map("[a-z_]{1,8}", json_with(KEYS, STRINGS), 0..5)) {
            let event = Value::Object(event.into_iter().collect());
            let mut m = envelope("event");
            m.insert("request_id".into(), json!(wire_id(n)));
            m.insert("event".into(), event.clone());
            prop_assert_eq!(decode(&to_vec(m)).unwrap(), Incoming::Event {
                request_id: Some(n),
                event: norm(&event),
            });
        }

        #[test]
        fn cancels_round_trip(n in 0..=i64::MAX, reason in any::<String>()) {
            let bytes = VaiRpc.encode_cancel(n, &reason).unwrap();
            let Incoming::Notification { method, params: Some(p) } = decode(&bytes).unwrap() else {
                return Err(TestCaseError::fail("expected a cancel notification"));
            };
            prop_assert_eq!(method, "cancel");
            prop_assert_eq!(&p["request_id"], &json!(wire_id(n)));
            prop_assert_eq!(&p["reason"], &json!(reason.replace(' ', "_")));
        }

        #[test]
        fn sniff_id_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = VaiRpc.sniff_id(&bytes);
        }

        #[test]
        fn sniff_id_never_panics_on_id_like_prefixes(s in "(\\{|\"id\"|:| |\"|req_|[0-9]{1,3}|é|,)*") {
            let _ = VaiRpc.sniff_id(s.as_bytes());
        }

        /// Every prefix of a seed-shaped response: the id once its closing
        /// quote is in, nothing before.
        #[test]
        fn sniff_id_finds_the_response_id(
            n in 0..=i64::MAX,
            ws in "[ \t\n]{0,3}",
            body in json_with(KEYS, STRINGS),
        ) {
            let head = format!(r#"{{"protocol":"vai.rpc.v1","type":"response","id":{ws}"{}""#, wire_id(n));
            let frame = format!(r#"{head},"ok":true,"body":{body}}}"#);
            for cut in 0..=frame.len() {
                let got = VaiRpc.sniff_id(&frame.as_bytes()[..cut]);
                prop_assert_eq!(got, (cut >= head.len()).then_some(n), "cut {}", cut);
            }
        }
    }
}
