//! The client side of MCP's Streamable HTTP transport and its OAuth 2.1
//! authorization, for remote MCP servers that plugd hosts.
//!
//! **API boundary**: [`transport::connect`] turns a remote server into the
//! same byte pipe a local server's stdin/stdout is (one JSON-RPC message per
//! line each way), so the MCP dialect, the peer and the supervisor treat a
//! remote server exactly like a local one. What is HTTP-specific stays here:
//! the session id, the protocol-version header, SSE responses, the GET
//! stream, resumption with `Last-Event-ID`, `DELETE` at the end, bearer
//! tokens and their refresh ([`transport::Credentials`]).
//!
//! [`oauth`] is the authorization of the 2025-06-18/2025-11-25 revisions (and
//! the 2025-03-26 fallbacks): protected-resource metadata (RFC 9728),
//! authorization-server metadata (RFC 8414, OpenID discovery), dynamic client
//! registration (RFC 7591) or a pre-registered client, the authorization-code
//! flow with PKCE (S256) and resource indicators (RFC 8707), and refresh.
//! The OAuth mechanics themselves (PKCE, the code and refresh grants, client
//! authentication) are the `oauth2` crate's.

pub mod exchange;
pub mod oauth;
pub mod transport;

pub use transport::{Control, Credentials, Pipe, Remote, connect};
