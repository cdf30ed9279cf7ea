//! The nodes serving one state store: the [`NodeStore`] trait and the [`NodeRecord`] each node renews while it runs (`GET /v1/cluster`, `plugd cluster status`, `/readyz`).
//!
//! Each node writes its row every [`NODE_BEAT_MS`] and is live while its
//! last beat is younger than [`NODE_LIVE_MS`] (the database's clock, so
//! nodes with skewed clocks agree). The cluster's configuration digest is
//! the one the live node applied last: a node whose own differs is not
//! ready until it applies the same.

use async_trait::async_trait;

use super::{Invalid, StoreError};

/// How often a node renews its row.
pub const NODE_BEAT_MS: i64 = 1_000;

/// A node is live while its last beat is younger than this.
pub const NODE_LIVE_MS: i64 = 5_000;

/// One node, as it last reported itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeRecord {
    /// The node's id (`--node-id`, else a fresh one per start).
    pub node_id: String,
    /// plugd's version on that node.
    pub version: String,
    /// The schema version that node's build writes.
    pub schema_version: i64,
    /// The id of the master key it opened the state with.
    pub key_id: String,
    /// The digest of the plugd.yaml text it has in force.
    pub config_digest: String,
    /// When it put that text in force (ms since the epoch, the database's
    /// clock; set by the store when the digest changes).
    pub config_ms: i64,
    /// Where its HTTP API listens, if it does.
    pub addr: Option<String>,
    /// When it started (ms since the epoch).
    pub started_ms: i64,
    /// Its last beat (ms since the epoch, the database's clock).
    pub seen_ms: i64,
}

/// Checks a node record's text fields.
pub fn check_node(n: &NodeRecord) -> Result<(), Invalid> {
    for (what, v, max) in [
        ("node id", n.node_id.as_str(), 128),
        ("version", n.version.as_str(), 128),
        ("key id", n.key_id.as_str(), 128),
        ("config digest", n.config_digest.as_str(), 128),
        ("address", n.addr.as_deref().unwrap_or("-"), 128),
    ] {
        if v.is_empty() || v.len() > max || v.chars().any(char::is_control) {
            return Err(Invalid::new(
                format!("{what} {:?}", v.chars().take(64).collect::<String>()),
                "a node's fields are 1 to 128 bytes without control characters",
            ));
        }
    }
    Ok(())
}

/// The nodes serving one state store.
#[async_trait]
pub trait NodeStore: Send + Sync {
    /// Writes node `n`'s row now (`seen_ms` is the store's now; `config_ms`
    /// moves only when `config_digest` changed).
    async fn node_beat(&self, n: &NodeRecord) -> Result<(), StoreError>;
    /// The nodes whose last beat is younger than `live_ms`, by id.
    async fn nodes_live(&self, live_ms: i64) -> Result<Vec<NodeRecord>, StoreError>;
    /// Removes node `id`'s row (it stopped).
    async fn node_leave(&self, id: &str) -> Result<(), StoreError>;
}
