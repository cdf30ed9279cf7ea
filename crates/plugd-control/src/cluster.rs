//! The cluster as its nodes see it: the live nodes with the leases each holds and the configuration the cluster runs ([`status`]), and whether one node is ready to serve ([`readiness`]). `GET /v1/cluster`, `plugd cluster status` and `/readyz` all answer from here.

use serde::Serialize;

use crate::store::nodes::{NODE_LIVE_MS, NodeRecord};
use crate::store::{LeaseStore, NodeStore, StoreError};

/// One live node and the leases it holds.
#[derive(Debug, Clone, Serialize)]
pub struct NodeView {
    /// The node's row.
    #[serde(flatten)]
    pub node: NodeRecord,
    /// The leases it holds now, by name (`retention`, `channel:slack`).
    pub leases: Vec<String>,
    /// Whether it has the cluster's configuration in force.
    pub config_current: bool,
}

/// The live nodes of a cluster.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterView {
    /// The live nodes, by id.
    pub nodes: Vec<NodeView>,
    /// The cluster's configuration: the digest of the plugd.yaml text most
    /// live nodes have in force ([`cluster_config`]).
    pub config_digest: Option<String>,
}

/// Whether `id` may name a node: 1 to 64 letters, digits, `.`, `_` or
/// `-`, starting with a letter or digit (it names lease holders
/// `NODE/TASK`, log lines and NATS connections).
pub fn is_node_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Whether `url` may name the cluster's NATS: `nats://` or `tls://` URLs,
/// several separated by commas (the servers of a NATS cluster).
pub fn is_nats_url(url: &str) -> bool {
    !url.is_empty()
        && url.split(',').all(|u| {
            let u = u.trim();
            (u.starts_with("nats://") || u.starts_with("tls://")) && u.len() > "tls://".len()
        })
}

/// The node a lease holder belongs to (holders are `NODE/TASK`).
pub fn holder_node(holder: &str) -> &str {
    holder.split_once('/').map_or(holder, |(n, _)| n)
}

/// The cluster's configuration digest among `nodes`: the one most live
/// nodes have in force, so that one node started with another plugd.yaml
/// takes no traffic while the rest serve; between equally many, the one
/// put in force last (then the smaller digest, so every reader agrees).
pub fn cluster_config(nodes: &[NodeRecord]) -> Option<String> {
    let mut by_digest: std::collections::BTreeMap<&str, (usize, i64)> = Default::default();
    for n in nodes {
        let e = by_digest.entry(n.config_digest.as_str()).or_default();
        e.0 += 1;
        e.1 = e.1.max(n.config_ms);
    }
    by_digest
        .into_iter()
        .max_by(|(da, a), (db, b)| a.cmp(b).then_with(|| db.cmp(da)))
        .map(|(d, _)| d.to_owned())
}

/// The live nodes, their leases and the cluster's configuration.
pub async fn status<S: NodeStore + LeaseStore + ?Sized>(
    store: &S,
) -> Result<ClusterView, StoreError> {
    let nodes = store.nodes_live(NODE_LIVE_MS).await?;
    let leases = store.leases_held().await?;
    let config_digest = cluster_config(&nodes);
    let nodes = nodes
        .into_iter()
        .map(|node| NodeView {
            leases: leases
                .iter()
                .filter(|l| holder_node(&l.holder) == node.node_id)
                .map(|l| l.name.clone())
                .collect(),
            config_current: config_digest.as_deref() == Some(node.config_digest.as_str()),
            node,
        })
        .collect();
    Ok(ClusterView {
        nodes,
        config_digest,
    })
}

/// Whether node `id`, whose plugd.yaml in force digests to `config`, may
/// take traffic: `Err` says why not (its configuration differs from the
/// cluster's). A node not yet listed is judged on the others.
pub fn readiness(view: &ClusterView, id: &str, config: &str) -> Result<(), String> {
    let others: Vec<NodeRecord> = view
        .nodes
        .iter()
        .filter(|n| n.node.node_id != id)
        .map(|n| n.node.clone())
        .collect();
    let listed = view.nodes.iter().any(|n| n.node.node_id == id);
    let cluster = if listed {
        view.config_digest.clone()
    } else {
        cluster_config(&others)
    };
    match cluster {
        Some(c) if c != config => Err(format!(
            "this node has plugd.yaml {config} in force, the cluster {c}: apply the cluster's configuration (or approve the held change) on this node"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, digest: &str, config_ms: i64) -> NodeRecord {
        NodeRecord {
            node_id: id.into(),
            version: "0".into(),
            schema_version: 1,
            key_id: "k".into(),
            config_digest: digest.into(),
            config_ms,
            addr: None,
            started_ms: 0,
            seen_ms: 0,
        }
    }

    fn view(nodes: Vec<NodeRecord>) -> ClusterView {
        let config_digest = cluster_config(&nodes);
        ClusterView {
            nodes: nodes
                .into_iter()
                .map(|node| NodeView {
                    leases: Vec::new(),
                    config_current: false,
                    node,
                })
                .collect(),
            config_digest,
        }
    }

    #[test]
    fn the_configuration_most_nodes_run_is_the_clusters() {
        let v = view(vec![
            node("a", "x", 10),
            node("b", "y", 20),
            node("c", "x", 5),
        ]);
        assert_eq!(v.config_digest.as_deref(), Some("x"));
        assert!(readiness(&v, "a", "x").is_ok());
        let e = readiness(&v, "b", "y").unwrap_err();
        assert!(e.contains("y in force, the cluster x"), "{e}");
        // A node not listed yet is judged on the others.
        assert!(readiness(&v, "d", "x").is_ok());
        assert!(readiness(&v, "d", "z").is_err());
        // Alone, a node is ready.
        assert!(readiness(&view(vec![]), "a", "x").is_ok());
        // Between equally many, the one put in force last; then by digest.
        let t = view(vec![node("a", "x", 10), node("b", "y", 20)]);
        assert_eq!(t.config_digest.as_deref(), Some("y"));
        let t = view(vec![node("a", "x", 10), node("b", "y", 10)]);
        assert_eq!(t.config_digest.as_deref(), Some("x"));
    }

    #[test]
    fn holders_name_their_node() {
        assert_eq!(holder_node("node-a/retention"), "node-a");
        assert_eq!(holder_node("solo"), "solo");
    }
}
