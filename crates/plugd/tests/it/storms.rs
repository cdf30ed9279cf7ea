//! Start storms: many plugins started at once by their first calls go
//! through the host's start gate, each `initialize` deadline counting from
//! its turn; a plugin that failed only because its handshakes timed out (a
//! host too busy to start it) starts again on the next demand, in this
//! runtime and in the next one, instead of staying failed for good.

use std::time::{Duration, Instant};

use plugd_host::{StartGate, Status};
use serde_json::json;

use crate::support::{Ws, eventually, quick};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_starts_wait_their_turn_and_their_deadline_counts_from_it() {
    let ws = Ws::new();
    let ids: Vec<String> = (0..6).map(|i| format!("storm{i}")).collect();
    for id in &ids {
        ws.misbehave(id, "slow_init", Some("400"), "");
    }
    let mut config = quick(30_000);
    config.init_timeout = Duration::from_millis(1_500);
    for id in &ids {
        let rt = ws.runtime(config.clone()).await;
        rt.approve(id, "test").await.unwrap();
        rt.shutdown().await;
    }
    // One permit in the queue and one in the callers' lane: at most two
    // handshakes at once.
    config.start_gate = StartGate::new(1);
    let rt = ws.runtime(config).await;
    let began = Instant::now();
    let calls = ids.iter().map(|id| {
        let rt = rt.clone();
        let tool = format!("{id}_echo");
        async move { rt.call_tool(&tool, json!({"message": "x"}), None).await }
    });
    let results = futures_util::future::join_all(calls).await;
    let took = began.elapsed();
    for (id, r) in ids.iter().zip(&results) {
        assert!(r.is_ok(), "{id}: {r:?}");
    }
    // Six 400 ms handshakes two at a time take at least 1.2 s; the last
    // pair began after the 1.5 s deadline would have run out had it counted
    // from the call, and still succeeded.
    assert!(took >= Duration::from_millis(1_200), "{took:?}: not gated");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_failed_by_timed_out_handshakes_starts_again_on_the_next_demand() {
    let ws = Ws::new();
    let busy = ws.dir().join("busy");
    ws.misbehave(
        "slowpoke",
        "slow_init_while",
        Some(busy.to_str().unwrap()),
        "[plugin.supervisor]\nrestart_attempts = 1\nbackoff_base_ms = 100\nbackoff_max_ms = 100\n",
    );
    let mut config = quick(30_000);
    config.init_timeout = Duration::from_millis(300);
    let rt = ws.runtime(config.clone()).await;
    rt.approve("slowpoke", "test").await.unwrap();
    rt.shutdown().await;

    std::fs::write(&busy, "").unwrap();
    let rt = ws.runtime(config.clone()).await;
    assert!(
        rt.call_tool("slowpoke_echo", json!({"message": "x"}), None)
            .await
            .is_err()
    );
    let sup = rt.supervised("slowpoke").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            sup.status(),
            Status::Failed { .. }
        ))
        .await,
        "{:?}",
        sup.status()
    );
    // While the host stays busy, a demand retries once and fails again.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        rt.call_tool("slowpoke_echo", json!({"message": "x"}), None)
            .await
            .is_err()
    );
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            sup.status(),
            Status::Failed { .. }
        ))
        .await
    );
    rt.shutdown().await;

    // The failure is on record; the next runtime (the next serve) retries
    // it on demand once the host has room, and the record is cleared.
    std::fs::remove_file(&busy).unwrap();
    let rt = ws.runtime(config).await;
    assert!(matches!(
        rt.supervised("slowpoke").unwrap().status(),
        Status::Failed { .. }
    ));
    let v = rt
        .call_tool("slowpoke_echo", json!({"message": "x"}), None)
        .await
        .unwrap();
    assert_eq!(v["echo"]["message"], "x", "{v}");
    assert!(rt.state().failure("slowpoke").await.unwrap().is_none());
    rt.shutdown().await;
}
