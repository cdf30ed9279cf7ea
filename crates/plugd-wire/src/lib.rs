//! plugd's wire layer: how bytes become frames and frames become JSON-RPC messages.
//!
//! This crate is pure: no processes, no sockets, no async runtime. It offers
//!
//! * [`framing`]: a [`FrameDecoder`] for newline-delimited and Content-Length
//!   (LSP-style) streams, with a hard frame-size limit that is enforced without
//!   buffering the oversized frame, and [`encode_frame`] for the other way;
//! * [`jsonrpc`]: plain serde data types for JSON-RPC 2.0 ([`Message`],
//!   [`Request`], [`Response`], [`Notification`], [`Id`], [`ErrorObject`]) and a
//!   strict decoder that classifies bad input as `-32700` or `-32600`.
//!
//! **API boundary**: everything plugin-facing in plugd reads plugin output
//! through this crate, so a parser bug here is a host bug; the decoders are
//! covered by property tests.

pub mod framing;
pub mod jsonrpc;
#[cfg(feature = "test-util")]
pub mod test_json;

pub use framing::{DEFAULT_MAX_FRAME, Frame, FrameDecoder, FrameError, Framing, encode_frame};
pub use jsonrpc::{DecodeError, ErrorObject, Id, Message, Notification, Request, Response, codes};
