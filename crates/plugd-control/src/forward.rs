//! Handing a message to whichever node holds what it is for: the [`Forwarder`] a surface offers it to, and the [`Taker`] each node answers with.
//!
//! A node that receives something it cannot act on itself (an MCP client's
//! answer to a question another node's call asked) offers it to the
//! cluster; the node that holds the waiting call takes it. `plugd-nats`
//! implements both over NATS in signed envelopes; a single node has no
//! forwarder and handles everything itself.

use async_trait::async_trait;
use serde_json::Value;

/// Why an offer could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// The transport between the nodes is down: try again later.
    #[error("the other nodes cannot be reached now ({0}); try again")]
    Unavailable(String),
}

/// Offers a message to the other nodes of the cluster.
#[async_trait]
pub trait Forwarder: Send + Sync {
    /// Offers `payload` of `kind` about `key` (a session id, say): `true`
    /// when a node took it, `false` when none did within the forwarder's
    /// wait.
    async fn offer(&self, kind: &str, key: &str, payload: Value) -> Result<bool, ForwardError>;
}

/// What a node does with a message another node offers.
#[async_trait]
pub trait Taker: Send + Sync {
    /// Takes `payload` of `kind` about `key` if this node holds what it is
    /// for; whether it did.
    async fn take(&self, kind: &str, key: &str, payload: Value) -> bool;
}
