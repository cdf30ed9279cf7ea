//! Three nodes' buses on one nats-server: an event published on one node reaches every node's subscribers exactly once (its own at once, the others through NATS), a node never hears its own events back, and lying or malformed messages on the bus subjects are refused and counted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use plugd_host::bus::{Bus, Event};
use plugd_nats::NatsBus;
use plugd_nats::test_nats::TestNats;
use serde_json::json;

async fn node(nats: &TestNats, id: &str) -> NatsBus {
    let client = async_nats::connect(nats.url()).await.unwrap();
    NatsBus::start(client, id).await.unwrap()
}

/// Every event of `sub` within `wait`.
async fn drain(sub: &mut plugd_host::bus::Subscription, wait: Duration) -> Vec<Event> {
    let mut got = Vec::new();
    let end = tokio::time::Instant::now() + wait;
    while let Ok(Some(e)) = tokio::time::timeout_at(end, sub.recv()).await {
        got.push(e);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_reaches_every_node_once_and_never_comes_back() {
    let nats = TestNats::start();
    let (a, b, c) = (
        node(&nats, "a").await,
        node(&nats, "b").await,
        node(&nats, "c").await,
    );
    let mut on_a = a.subscribe("plugin.inbound.>", 1000).unwrap();
    let mut on_b = b.subscribe("plugin.inbound.>", 1000).unwrap();
    let mut on_c = c.subscribe("plugin.inbound.slack", 1000).unwrap();
    // Subscriptions on NATS are live once the server has them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..100 {
        let mut e = Event::new("plugin.inbound.slack", "slack", json!({"n": i}));
        e.id = format!("e{i}");
        a.publish(e);
    }
    b.publish(Event::new("plugin.inbound.mail", "mail", json!({})));
    let ids = |v: &[Event]| v.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    let got_a = drain(&mut on_a, Duration::from_secs(2)).await;
    let got_b = drain(&mut on_b, Duration::from_secs(1)).await;
    let got_c = drain(&mut on_c, Duration::from_secs(1)).await;
    let want: Vec<String> = (0..100).map(|i| format!("e{i}")).collect();
    // A: its own 100 once (not again from NATS) and B's mail event.
    assert_eq!(got_a.len(), 101, "{:?}", ids(&got_a));
    assert_eq!(ids(&got_a[..100]), want);
    assert_eq!(got_a[100].topic, "plugin.inbound.mail");
    // B: its own at once (before any relay), and A's 100 in order.
    assert_eq!(got_b.len(), 101, "{:?}", ids(&got_b));
    let (own, from_a): (Vec<Event>, Vec<Event>) = got_b
        .into_iter()
        .partition(|e| e.topic == "plugin.inbound.mail");
    assert_eq!(own.len(), 1);
    assert_eq!(ids(&from_a), want);
    // C: only what its pattern matches.
    assert_eq!(ids(&got_c), want);
    assert_eq!(a.stats().relayed.load(Ordering::Relaxed), 100);
    assert_eq!(b.stats().received.load(Ordering::Relaxed), 100);
    assert_eq!(a.stats().dropped.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_or_oversized_messages_on_the_bus_subjects_are_refused_and_counted() {
    let nats = TestNats::start();
    let a = node(&nats, "a").await;
    let mut on_a = a.subscribe(">", 100).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let lie = serde_json::to_vec(&Event::new("plugin.inbound.mail", "x", json!({}))).unwrap();
    raw.publish("plugd.bus.plugin.inbound.slack", lie.into())
        .await
        .unwrap();
    raw.publish("plugd.bus.x", "{not json".into())
        .await
        .unwrap();
    // (An oversized one the server itself refuses at its max_payload;
    // plugd's own limit is checked by a unit test.)
    let ok = serde_json::to_vec(&Event::new("x", "x", json!({"fine": true}))).unwrap();
    raw.publish("plugd.bus.x", ok.into()).await.unwrap();
    raw.flush().await.unwrap();
    let got = drain(&mut on_a, Duration::from_secs(1)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].payload, json!({"fine": true}));
    assert_eq!(a.stats().refused.load(Ordering::Relaxed), 2);
}
