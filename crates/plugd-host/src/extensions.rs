//! Host-initiated methods for native plugins that extend host registries:
//! channel adapters (`[plugin.extends].channels`, nexo §5.x) and vector
//! memory backends (`[plugin.extends].memory_backends`, §5.w), with their
//! typed errors (`-33001..-33005`, `-33301..-33304`) and deadlines.

use std::time::Duration;

use plugd_wire::codes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::peer::{CallError, Peer};

/// Overrides all three channel deadlines (milliseconds).
pub const CHANNEL_TIMEOUT_ENV: &str = "NEXO_PLUGIN_CHANNEL_TIMEOUT_MS";
/// Overrides all three vector-backend deadlines (milliseconds).
pub const MEMORY_TIMEOUT_ENV: &str = "NEXO_PLUGIN_MEMORY_TIMEOUT_MS";

/// `channel.start` / `channel.stop` deadline.
pub const CHANNEL_CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
/// `channel.send_outbound` deadline.
pub const CHANNEL_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// `memory.vector_upsert` / `memory.vector_delete` deadline.
pub const VECTOR_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// `memory.vector_search` deadline.
pub const VECTOR_SEARCH_TIMEOUT: Duration = Duration::from_secs(10);

/// `default`, unless `env` is set: then its value in milliseconds (an error
/// names the variable when it is not a positive integer).
pub fn deadline(env: &str, default: Duration) -> Result<Duration, String> {
    override_ms(env, std::env::var(env).ok().as_deref(), default)
}

/// `default`, or `value` (the text of the variable `env`, if set) in
/// milliseconds; an error names the variable when it is not a positive
/// integer.
pub fn override_ms(env: &str, value: Option<&str>, default: Duration) -> Result<Duration, String> {
    match value {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .map(Duration::from_millis)
            .ok_or_else(|| format!("{env}={v:?} is not a positive integer (milliseconds)")),
    }
}

/// `-33001`: the channel could not connect.
pub const CHANNEL_CONNECTION_FAILED: i64 = -33001;
/// `-33002`: the channel's credentials were refused.
pub const CHANNEL_AUTHENTICATION_FAILED: i64 = -33002;
/// `-33003`: the recipient is invalid (`data.recipient`, `data.reason`).
pub const CHANNEL_RECIPIENT_INVALID: i64 = -33003;
/// `-33004`: rate limited (`data.retry_after_secs`).
pub const CHANNEL_RATE_LIMITED: i64 = -33004;
/// `-33005`: the channel does not support this (`data.feature`).
pub const CHANNEL_UNSUPPORTED_FEATURE: i64 = -33005;

/// `-33301`: no such collection (`data.collection`).
pub const MEMORY_COLLECTION_NOT_FOUND: i64 = -33301;
/// `-33302`: embedding dimension mismatch (`data.expected`, `data.got`).
pub const MEMORY_DIMENSION_MISMATCH: i64 = -33302;
/// `-33303`: rate limited (`data.retry_after_secs`).
pub const MEMORY_RATE_LIMITED: i64 = -33303;
/// `-33304`: the write failed.
pub const MEMORY_WRITE_FAILED: i64 = -33304;

/// Why a channel method failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// `-33001`.
    #[error("channel {kind:?}: connection failed: {message}")]
    Connection {
        /// Channel kind.
        kind: String,
        /// Detail.
        message: String,
    },
    /// `-33002`.
    #[error("channel {kind:?}: authentication failed: {reason}")]
    Authentication {
        /// Channel kind.
        kind: String,
        /// Detail.
        reason: String,
    },
    /// `-33003`.
    #[error("channel {kind:?}: recipient {recipient:?} is invalid: {reason}")]
    Recipient {
        /// Channel kind.
        kind: String,
        /// The recipient.
        recipient: String,
        /// Why.
        reason: String,
    },
    /// `-33004`.
    #[error("channel {kind:?}: rate limited{}", retry_after_secs.map(|s| format!("; retry after {s}s")).unwrap_or_default())]
    RateLimited {
        /// Channel kind.
        kind: String,
        /// When to retry.
        retry_after_secs: Option<u64>,
    },
    /// `-33005`, or `-32601` (the method is not implemented).
    #[error("channel {kind:?}: unsupported feature: {feature}")]
    Unsupported {
        /// Channel kind.
        kind: String,
        /// The feature or method.
        feature: String,
    },
    /// Anything else: other error codes, timeouts, a crash, a malformed reply.
    #[error("channel {kind:?}: {message}")]
    Other {
        /// Channel kind.
        kind: String,
        /// Detail.
        message: String,
    },
}

/// Why a vector-backend method failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VectorError {
    /// `-33301`.
    #[error("collection {collection:?} not found")]
    CollectionNotFound {
        /// The collection.
        collection: String,
    },
    /// `-33302`.
    #[error("dimension mismatch: expected {expected}, got {got}")]
    DimensionMismatch {
        /// The backend's dimension.
        expected: u64,
        /// The one sent.
        got: u64,
    },
    /// `-33303`.
    #[error("rate limited{}", retry_after_secs.map(|s| format!("; retry after {s}s")).unwrap_or_default())]
    RateLimited {
        /// When to retry.
        retry_after_secs: Option<u64>,
    },
    /// `-33304`.
    #[error("write failed: {message}")]
    WriteFailed {
        /// Detail.
        message: String,
    },
    /// Bad input (`-32602`).
    #[error("invalid request: {message}")]
    Invalid {
        /// Detail.
        message: String,
    },
    /// `-32601`: the backend does not implement the method.
    #[error("{method} is not implemented by the backend")]
    Unsupported {
        /// The method.
        method: String,
    },
    /// Anything else: other codes, timeouts, a crash, a malformed reply.
    #[error("{message}")]
    Other {
        /// Detail.
        message: String,
    },
}

fn data_str(data: Option<&Value>, key: &str) -> Option<String> {
    data.and_then(|d| d.get(key))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn data_u64(data: Option<&Value>, key: &str) -> Option<u64> {
    data.and_then(|d| d.get(key)).and_then(Value::as_u64)
}

/// Maps a failed channel call of `method` to its typed error.
pub fn channel_error(kind: &str, method: &str, e: CallError) -> ChannelError {
    let kind = kind.to_owned();
    let CallError::Remote { error, .. } = e else {
        return ChannelError::Other {
            kind,
            message: e.to_string(),
        };
    };
    let data = error.data.as_ref();
    let message = error.message.clone();
    match error.code {
        CHANNEL_CONNECTION_FAILED => ChannelError::Connection { kind, message },
        CHANNEL_AUTHENTICATION_FAILED => ChannelError::Authentication {
            kind,
            reason: message,
        },
        CHANNEL_RECIPIENT_INVALID => ChannelError::Recipient {
            kind,
            recipient: data_str(data, "recipient").unwrap_or_default(),
            reason: data_str(data, "reason").unwrap_or(message),
        },
        CHANNEL_RATE_LIMITED => ChannelError::RateLimited {
            kind,
            retry_after_secs: data_u64(data, "retry_after_secs"),
        },
        CHANNEL_UNSUPPORTED_FEATURE => ChannelError::Unsupported {
            kind,
            feature: data_str(data, "feature").unwrap_or(message),
        },
        codes::METHOD_NOT_FOUND => ChannelError::Unsupported {
            kind,
            feature: method.to_owned(),
        },
        code => ChannelError::Other {
            kind,
            message: format!("{method} failed ({code}): {message}"),
        },
    }
}

/// The JSON-RPC error a typed channel error is passed on as (microapp
/// `nexo/dispatch`): the contract's code and data; anything else `-32603`.
pub fn channel_error_object(e: &ChannelError) -> plugd_wire::ErrorObject {
    use plugd_wire::ErrorObject;
    let message = e.to_string();
    match e {
        ChannelError::Connection { .. } => ErrorObject::new(CHANNEL_CONNECTION_FAILED, message),
        ChannelError::Authentication { .. } => {
            ErrorObject::new(CHANNEL_AUTHENTICATION_FAILED, message)
        }
        ChannelError::Recipient {
            recipient, reason, ..
        } => ErrorObject::new(CHANNEL_RECIPIENT_INVALID, message)
            .with_data(json!({"recipient": recipient, "reason": reason})),
        ChannelError::RateLimited {
            retry_after_secs, ..
        } => ErrorObject::new(CHANNEL_RATE_LIMITED, message)
            .with_data(json!({"retry_after_secs": retry_after_secs})),
        ChannelError::Unsupported { feature, .. } => {
            ErrorObject::new(CHANNEL_UNSUPPORTED_FEATURE, message)
                .with_data(json!({"feature": feature}))
        }
        ChannelError::Other { .. } => ErrorObject::new(codes::INTERNAL_ERROR, message),
    }
}

/// Maps a failed vector-backend call of `method` to its typed error.
pub fn vector_error(method: &str, e: CallError) -> VectorError {
    let CallError::Remote { error, .. } = e else {
        return VectorError::Other {
            message: e.to_string(),
        };
    };
    let data = error.data.as_ref();
    let message = error.message.clone();
    match error.code {
        MEMORY_COLLECTION_NOT_FOUND => VectorError::CollectionNotFound {
            collection: data_str(data, "collection").unwrap_or(message),
        },
        MEMORY_DIMENSION_MISMATCH => match (data_u64(data, "expected"), data_u64(data, "got")) {
            (Some(expected), Some(got)) => VectorError::DimensionMismatch { expected, got },
            _ => VectorError::Other {
                message: format!(
                    "{method}: dimension mismatch without data.expected/data.got: {message}"
                ),
            },
        },
        MEMORY_RATE_LIMITED => VectorError::RateLimited {
            retry_after_secs: data_u64(data, "retry_after_secs"),
        },
        MEMORY_WRITE_FAILED => VectorError::WriteFailed { message },
        codes::INVALID_PARAMS => VectorError::Invalid { message },
        codes::METHOD_NOT_FOUND => VectorError::Unsupported {
            method: method.to_owned(),
        },
        code => VectorError::Other {
            message: format!("{method} failed ({code}): {message}"),
        },
    }
}

/// What a channel sends (`msg` of `channel.send_outbound`): `kind` is
/// `text`, `media` or `custom`, `to` the recipient; the rest is per kind
/// (`body` for text, `url`/`caption` for media, anything for custom).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboundMessage {
    /// `text`, `media` or `custom`.
    pub kind: String,
    /// The recipient.
    pub to: String,
    /// The kind's own fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl OutboundMessage {
    /// A text message.
    pub fn text(to: impl Into<String>, body: impl Into<String>) -> Self {
        let mut fields = Map::new();
        fields.insert("body".into(), Value::String(body.into()));
        OutboundMessage {
            kind: "text".into(),
            to: to.into(),
            fields,
        }
    }

    /// Checks the kind and its required fields.
    pub fn check(&self) -> Result<(), String> {
        let need = |k: &str| {
            self.fields
                .get(k)
                .and_then(Value::as_str)
                .map(|_| ())
                .ok_or_else(|| format!("a {} message needs a string {k:?}", self.kind))
        };
        if self.to.trim().is_empty() {
            return Err("the message has no recipient (`to`)".into());
        }
        match self.kind.as_str() {
            "text" => need("body"),
            "media" => need("url"),
            "custom" => Ok(()),
            other => Err(format!(
                "message kind {other:?} is not one of text, media, custom"
            )),
        }
    }
}

/// What `channel.send_outbound` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendReceipt {
    /// The channel's id of the sent message.
    pub message_id: String,
    /// When it was sent (Unix seconds).
    #[serde(default)]
    pub sent_at_unix: Option<i64>,
}

fn ok_reply(kind: &str, method: &str, v: &Value) -> Result<(), ChannelError> {
    if v.get("ok").and_then(Value::as_bool) == Some(false) {
        return Err(ChannelError::Other {
            kind: kind.to_owned(),
            message: format!("{method} answered ok: false"),
        });
    }
    Ok(())
}

/// `channel.start {kind, instance}`.
pub async fn channel_start(
    peer: &Peer,
    kind: &str,
    instance: Option<&str>,
    timeout: Duration,
) -> Result<(), ChannelError> {
    let reply = peer
        .call(
            "channel.start",
            Some(json!({"kind": kind, "instance": instance})),
            timeout,
        )
        .await
        .map_err(|e| channel_error(kind, "channel.start", e))?;
    ok_reply(kind, "channel.start", &reply)
}

/// `channel.stop {kind}` (idempotent on the plugin's side).
pub async fn channel_stop(peer: &Peer, kind: &str, timeout: Duration) -> Result<(), ChannelError> {
    let reply = peer
        .call("channel.stop", Some(json!({"kind": kind})), timeout)
        .await
        .map_err(|e| channel_error(kind, "channel.stop", e))?;
    ok_reply(kind, "channel.stop", &reply)
}

/// `channel.send_outbound {kind, msg}`.
pub async fn channel_send(
    peer: &Peer,
    kind: &str,
    msg: &OutboundMessage,
    timeout: Duration,
) -> Result<SendReceipt, ChannelError> {
    msg.check().map_err(|message| ChannelError::Other {
        kind: kind.to_owned(),
        message,
    })?;
    let reply = peer
        .call(
            "channel.send_outbound",
            Some(json!({"kind": kind, "msg": msg})),
            timeout,
        )
        .await
        .map_err(|e| channel_error(kind, "channel.send_outbound", e))?;
    serde_json::from_value(reply.clone()).map_err(|e| ChannelError::Other {
        kind: kind.to_owned(),
        message: format!(
            "channel.send_outbound answered {reply}, not {{message_id, sent_at_unix}}: {e}"
        ),
    })
}

/// `memory.vector_upsert {backend, collection, records}`; the count written.
pub async fn vector_upsert(
    peer: &Peer,
    backend: &str,
    collection: &str,
    records: Value,
    timeout: Duration,
) -> Result<u64, VectorError> {
    const M: &str = "memory.vector_upsert";
    let reply = peer
        .call(
            M,
            Some(json!({"backend": backend, "collection": collection, "records": records})),
            timeout,
        )
        .await
        .map_err(|e| vector_error(M, e))?;
    count(M, &reply)
}

/// `memory.vector_search {backend, collection, query}`; the `matches`.
pub async fn vector_search(
    peer: &Peer,
    backend: &str,
    collection: &str,
    query: Value,
    timeout: Duration,
) -> Result<Value, VectorError> {
    const M: &str = "memory.vector_search";
    let reply = peer
        .call(
            M,
            Some(json!({"backend": backend, "collection": collection, "query": query})),
            timeout,
        )
        .await
        .map_err(|e| vector_error(M, e))?;
    match reply.get("matches") {
        Some(m @ Value::Array(_)) => Ok(m.clone()),
        _ => Err(VectorError::Other {
            message: format!("{M} answered {reply}, not {{matches: [...]}}"),
        }),
    }
}

/// `memory.vector_delete {backend, collection, ids}`; the count deleted.
pub async fn vector_delete(
    peer: &Peer,
    backend: &str,
    collection: &str,
    ids: &[String],
    timeout: Duration,
) -> Result<u64, VectorError> {
    const M: &str = "memory.vector_delete";
    let reply = peer
        .call(
            M,
            Some(json!({"backend": backend, "collection": collection, "ids": ids})),
            timeout,
        )
        .await
        .map_err(|e| vector_error(M, e))?;
    count(M, &reply)
}

fn count(method: &str, reply: &Value) -> Result<u64, VectorError> {
    reply
        .get("count")
        .and_then(Value::as_u64)
        .ok_or_else(|| VectorError::Other {
            message: format!("{method} answered {reply}, not {{count: N}}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugd_wire::ErrorObject;

    fn remote(code: i64, data: Option<Value>) -> CallError {
        let mut error = ErrorObject::new(code, "boom");
        error.data = data;
        CallError::Remote {
            plugin: "p".into(),
            method: "m".into(),
            error: Box::new(error),
        }
    }

    #[test]
    fn every_channel_code_maps_to_its_variant() {
        let k = "slack";
        assert!(matches!(
            channel_error(k, "m", remote(-33001, None)),
            ChannelError::Connection { .. }
        ));
        assert!(matches!(
            channel_error(k, "m", remote(-33002, None)),
            ChannelError::Authentication { .. }
        ));
        assert_eq!(
            channel_error(
                k,
                "m",
                remote(-33003, Some(json!({"recipient": "U1", "reason": "gone"})))
            ),
            ChannelError::Recipient {
                kind: k.into(),
                recipient: "U1".into(),
                reason: "gone".into()
            }
        );
        assert_eq!(
            channel_error(
                k,
                "m",
                remote(-33004, Some(json!({"retry_after_secs": 42})))
            ),
            ChannelError::RateLimited {
                kind: k.into(),
                retry_after_secs: Some(42)
            }
        );
        assert_eq!(
            channel_error(
                k,
                "m",
                remote(-33005, Some(json!({"feature": "reactions"})))
            ),
            ChannelError::Unsupported {
                kind: k.into(),
                feature: "reactions".into()
            }
        );
        assert_eq!(
            channel_error(k, "channel.stop", remote(-32601, None)),
            ChannelError::Unsupported {
                kind: k.into(),
                feature: "channel.stop".into()
            }
        );
        assert!(matches!(
            channel_error(k, "m", remote(-32000, None)),
            ChannelError::Other { .. }
        ));
    }

    #[test]
    fn every_memory_code_maps_to_its_variant() {
        assert_eq!(
            vector_error("m", remote(-33301, Some(json!({"collection": "kb"})))),
            VectorError::CollectionNotFound {
                collection: "kb".into()
            }
        );
        let e = vector_error(
            "m",
            remote(-33302, Some(json!({"expected": 768, "got": 2}))),
        );
        assert_eq!(e.to_string(), "dimension mismatch: expected 768, got 2");
        assert!(matches!(
            vector_error("m", remote(-33302, None)),
            VectorError::Other { .. }
        ));
        assert_eq!(
            vector_error("m", remote(-33303, Some(json!({"retry_after_secs": 60})))).to_string(),
            "rate limited; retry after 60s"
        );
        assert!(matches!(
            vector_error("m", remote(-33304, None)),
            VectorError::WriteFailed { .. }
        ));
        assert!(matches!(
            vector_error("memory.vector_delete", remote(-32601, None)),
            VectorError::Unsupported { .. }
        ));
    }

    #[test]
    fn outbound_messages_are_checked() {
        assert!(OutboundMessage::text("U1", "hi").check().is_ok());
        let m: OutboundMessage =
            serde_json::from_value(json!({"kind": "media", "to": "U1", "url": "http://x"}))
                .unwrap();
        assert!(m.check().is_ok());
        let m: OutboundMessage =
            serde_json::from_value(json!({"kind": "media", "to": "U1"})).unwrap();
        assert!(m.check().unwrap_err().contains("url"));
        let m: OutboundMessage =
            serde_json::from_value(json!({"kind": "fax", "to": "U1"})).unwrap();
        assert!(m.check().unwrap_err().contains("fax"));
        assert!(OutboundMessage::text(" ", "x").check().is_err());
    }
}
