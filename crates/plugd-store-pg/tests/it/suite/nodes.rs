//! The nodes' rows on both backends: a beat is seen by the other connection, the configuration time moves only with the digest, a node past its liveness is not listed, leaving removes it; leases held are listed; an ended live session moves the control epoch.

use std::time::Duration;

use plugd_control::store::{LiveKind, NodeRecord};
use serde_json::json;

use super::backends;

fn node(id: &str, digest: &str) -> NodeRecord {
    NodeRecord {
        node_id: id.to_owned(),
        version: "0.1.0".into(),
        schema_version: 4,
        key_id: "key_1".into(),
        config_digest: digest.to_owned(),
        config_ms: 0,
        addr: Some("127.0.0.1:1".into()),
        started_ms: 1,
        seen_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_beat_age_and_leave() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        a.node_beat(&node("a", "sha256:1")).await.unwrap();
        b.node_beat(&node("b", "sha256:1")).await.unwrap();
        let live = a.nodes_live(5_000).await.unwrap();
        let ids: Vec<_> = live.iter().map(|n| n.node_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "{name}");
        assert!(
            live[0].seen_ms > 1_000_000_000_000,
            "{name}: the store's clock"
        );
        let first = live[0].config_ms;
        // The same digest keeps its time; a new one moves it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.node_beat(&node("a", "sha256:1")).await.unwrap();
        let again = b.nodes_live(5_000).await.unwrap();
        assert_eq!(again[0].config_ms, first, "{name}");
        a.node_beat(&node("a", "sha256:2")).await.unwrap();
        let moved = b.nodes_live(5_000).await.unwrap();
        assert!(moved[0].config_ms > first, "{name}");
        assert_eq!(moved[0].config_digest, "sha256:2", "{name}");
        // Past its liveness a node is not listed; leaving removes it.
        tokio::time::sleep(Duration::from_millis(60)).await;
        b.node_beat(&node("b", "sha256:1")).await.unwrap();
        let ids: Vec<_> = a
            .nodes_live(50)
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.node_id)
            .collect();
        assert_eq!(ids, ["b"], "{name}");
        b.node_leave("b").await.unwrap();
        assert!(a.nodes_live(50).await.unwrap().is_empty(), "{name}");
        // A control character is refused by both.
        let mut bad = node("c", "x");
        bad.node_id = "c\n".into();
        assert!(a.node_beat(&bad).await.is_err(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_held_are_listed_and_an_ended_session_moves_the_epoch() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        a.lease_acquire("retention", "a/retention", 60_000)
            .await
            .unwrap()
            .unwrap();
        b.lease_acquire("channel:slack", "b/channels", 60_000)
            .await
            .unwrap()
            .unwrap();
        let held: Vec<_> = a
            .leases_held()
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.name, l.holder))
            .collect();
        assert_eq!(
            held,
            [
                ("channel:slack".to_owned(), "b/channels".to_owned()),
                ("retention".to_owned(), "a/retention".to_owned())
            ],
            "{name}"
        );
        let data = json!({"protocol": "2025-06-18"});
        a.live_session_put(LiveKind::Mcp, "s1", "alice", None, &data)
            .await
            .unwrap();
        let before = b.control_epoch().await.unwrap();
        assert!(
            b.live_session_delete(LiveKind::Mcp, "s1").await.unwrap(),
            "{name}"
        );
        let after = a.control_epoch().await.unwrap();
        assert!(after > before, "{name}: an ended session moves the epoch");
        // Deleting nothing moves nothing.
        assert!(
            !b.live_session_delete(LiveKind::Mcp, "s1").await.unwrap(),
            "{name}"
        );
        assert_eq!(a.control_epoch().await.unwrap(), after, "{name}");
    }
}
