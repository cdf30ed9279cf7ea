//! Message envelopes: how a dialect's frames map onto the peer's operations.
//!
//! The [`Peer`](crate::peer::Peer) only knows requests (with host-assigned
//! integer ids), responses, notifications, per-request events and cancels.
//! A [`Protocol`] translates those to and from one contract's bytes:
//! [`JsonRpc`] for the JSON-RPC dialects (native, microapp, Salmex, MCP, with
//! line or Content-Length framing); the VAI dialect brings its own.

use plugd_wire::{ErrorObject, Framing, Id, Message, Notification, Request, Response};
use serde_json::Value;

/// One decoded frame from the child.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// The answer to a host request. `id` is the host's integer id when the
    /// frame carried one plugd could have issued, else `None` (then `raw_id`
    /// describes what it carried).
    Response {
        /// The host request id it answers.
        id: Option<i64>,
        /// What the frame carried as id, for logs.
        raw_id: String,
        /// `result` or `error`.
        outcome: Result<Value, ErrorObject>,
    },
    /// A request from the child to the host.
    Request {
        /// The child's id, echoed in the response.
        id: Id,
        /// Method (or VAI op).
        method: String,
        /// Parameters.
        params: Option<Value>,
    },
    /// A one-way message from the child.
    Notification {
        /// Method.
        method: String,
        /// Parameters.
        params: Option<Value>,
    },
    /// Progress (or another event) about one host request: VAI `event`
    /// frames, MCP `notifications/progress`. `request_id: None` means "the
    /// call in flight", when exactly one is.
    Event {
        /// The host request it is about.
        request_id: Option<i64>,
        /// The event as sent.
        event: Value,
    },
}

/// A wire contract's envelope.
pub trait Protocol: Send + Sync + 'static {
    /// How frames are cut.
    fn framing(&self) -> Framing;
    /// A host-to-child request.
    fn encode_request(&self, id: i64, method: &str, params: Option<Value>) -> Vec<u8>;
    /// A host-to-child notification.
    fn encode_notification(&self, method: &str, params: Option<Value>) -> Vec<u8>;
    /// The host's answer to a child request.
    fn encode_response(&self, id: Id, outcome: Result<Value, ErrorObject>) -> Vec<u8>;
    /// What to send when the host gives up on request `id` (deadline or
    /// caller gone); `None` when the contract has no cancel.
    fn encode_cancel(&self, id: i64, reason: &str) -> Option<Vec<u8>> {
        let _ = (id, reason);
        None
    }
    /// Classifies one frame; `Err` describes junk.
    fn decode(&self, bytes: &[u8]) -> Result<Incoming, String>;

    /// The host request id named near the start of an oversized (unread)
    /// frame, so the call it answers can fail at once instead of timing out.
    fn sniff_id(&self, prefix: &[u8]) -> Option<i64> {
        sniff_jsonrpc_id(prefix)
    }
}

/// The text right after the first `"id":` in `prefix` (the valid UTF-8 part).
pub fn id_member(prefix: &[u8]) -> Option<&str> {
    let text = match std::str::from_utf8(prefix) {
        Ok(t) => t,
        // The cut may fall inside a UTF-8 sequence; use the valid part.
        Err(e) => std::str::from_utf8(&prefix[..e.valid_up_to()]).ok()?,
    };
    let at = text.find("\"id\"")? + 4;
    Some(text[at..].trim_start().strip_prefix(':')?.trim_start())
}

/// `"id": <integer>` near the start of a JSON-RPC frame.
pub fn sniff_jsonrpc_id(prefix: &[u8]) -> Option<i64> {
    let rest = id_member(prefix)?;
    let end = rest
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && c == '-')))
        .map_or(rest.len(), |(i, _)| i);
    rest[..end].parse().ok()
}

/// JSON-RPC 2.0 with integer host ids.
#[derive(Debug, Clone, Copy)]
pub struct JsonRpc {
    /// Lines or Content-Length.
    pub framing: Framing,
}

impl JsonRpc {
    /// Newline-delimited JSON-RPC (native, microapp, MCP).
    pub const LINES: JsonRpc = JsonRpc {
        framing: Framing::Lines,
    };
    /// Content-Length framed JSON-RPC (Salmex).
    pub const CONTENT_LENGTH: JsonRpc = JsonRpc {
        framing: Framing::ContentLength,
    };
}

/// Decodes one JSON-RPC frame into an [`Incoming`].
pub fn decode_jsonrpc(bytes: &[u8]) -> Result<Incoming, String> {
    match Message::decode(bytes).map_err(|e| e.to_string())? {
        Message::Response(Response { id, outcome }) => {
            let raw_id = id.as_ref().map_or_else(|| "null".to_owned(), Id::to_string);
            let id = match id {
                Some(Id::Int(n)) => Some(n),
                _ => None,
            };
            Ok(Incoming::Response {
                id,
                raw_id,
                outcome,
            })
        }
        Message::Request(Request { id, method, params }) => {
            Ok(Incoming::Request { id, method, params })
        }
        Message::Notification(Notification { method, params }) => {
            Ok(Incoming::Notification { method, params })
        }
    }
}

impl Protocol for JsonRpc {
    fn framing(&self) -> Framing {
        self.framing
    }

    fn encode_request(&self, id: i64, method: &str, params: Option<Value>) -> Vec<u8> {
        Message::Request(Request {
            id: Id::Int(id),
            method: method.to_owned(),
            params,
        })
        .to_vec()
    }

    fn encode_notification(&self, method: &str, params: Option<Value>) -> Vec<u8> {
        Message::Notification(Notification {
            method: method.to_owned(),
            params,
        })
        .to_vec()
    }

    fn encode_response(&self, id: Id, outcome: Result<Value, ErrorObject>) -> Vec<u8> {
        Message::Response(Response {
            id: Some(id),
            outcome,
        })
        .to_vec()
    }

    fn decode(&self, bytes: &[u8]) -> Result<Incoming, String> {
        decode_jsonrpc(bytes)
    }
}
