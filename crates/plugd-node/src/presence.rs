//! This node's row in the state store, renewed every `NODE_BEAT_MS` while it serves and removed when it stops: what `GET /v1/cluster`, `plugd cluster status` and `/readyz` read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use plugd_control::store::nodes::{NODE_BEAT_MS, NodeRecord};
use plugd_runtime::Runtime;
use plugd_runtime::config_gate::ConfigGate;

/// The task renewing this node's row; [`Presence::leave`] ends it.
pub(crate) struct Presence {
    task: tokio::task::JoinHandle<()>,
    rt: Runtime,
}

/// The id of the master key this process opens secrets with (`none` when
/// it has none yet: a single node that stores no secret).
fn key_id() -> String {
    plugd_store::secrets::KeySource::from_env()
        .and_then(|s| s.load())
        .ok()
        .flatten()
        .map_or_else(|| "none".to_owned(), |k| k.id().to_owned())
}

impl Presence {
    /// Writes this node's row now and every `NODE_BEAT_MS`, with the digest
    /// of the plugd.yaml text `gate` has in force.
    pub(crate) fn start(rt: &Runtime, gate: Arc<ConfigGate>, addr: Option<SocketAddr>) -> Presence {
        let mut record = NodeRecord {
            node_id: rt.node_id().to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            schema_version: rt.state().schema_version(),
            key_id: key_id(),
            config_digest: gate.view().in_force,
            config_ms: 0,
            addr: addr.map(|a| a.to_string()),
            started_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            seen_ms: 0,
        };
        let store = rt.state().clone();
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(NODE_BEAT_MS as u64));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                every.tick().await;
                record.config_digest = gate.view().in_force;
                match store.node_beat(&record).await {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!(node = %record.node_id, "this node's row is written again");
                    }
                    Ok(()) => {}
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(node = %record.node_id, error = %e, "cannot write this node's row; other nodes will not list it");
                    }
                    Err(_) => {}
                }
            }
        });
        Presence {
            task,
            rt: rt.clone(),
        }
    }

    /// Stops renewing and removes the row (bounded: a store that does not
    /// answer lets the row age out instead).
    pub(crate) async fn leave(self) {
        self.task.abort();
        let id = self.rt.node_id().to_owned();
        let gone =
            tokio::time::timeout(Duration::from_secs(2), self.rt.state().node_leave(&id)).await;
        if !matches!(gone, Ok(Ok(()))) {
            tracing::debug!(node = %id, "could not remove this node's row; it ages out");
        }
    }
}
