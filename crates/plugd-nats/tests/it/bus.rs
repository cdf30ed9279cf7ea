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

/// The ids `sub` got within `wait`.
async fn ids_of(sub: &mut plugd_host::bus::Subscription, wait: Duration) -> Vec<String> {
    drain(sub, wait).await.into_iter().map(|e| e.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_copies_on_three_nodes_share_its_events_each_once() {
    let nats = TestNats::start();
    let nodes = [
        node(&nats, "a").await,
        node(&nats, "b").await,
        node(&nats, "c").await,
    ];
    // Plugin p runs on all three nodes, plugin q on A and B, and a
    // subscriber outside any group on C.
    let mut p: Vec<_> = nodes
        .iter()
        .map(|n| {
            let (sub, sink) = queue(1000);
            (
                sub,
                n.subscribe_group("plugin.inbound.>", "acme/p", sink)
                    .unwrap(),
            )
        })
        .collect();
    let mut q: Vec<_> = nodes[..2]
        .iter()
        .map(|n| {
            let (sub, sink) = queue(1000);
            (
                sub,
                n.subscribe_group("plugin.inbound.slack", "acme/q", sink)
                    .unwrap(),
            )
        })
        .collect();
    let mut everyone = nodes[2].subscribe("plugin.inbound.>", 1000).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..300 {
        let mut e = Event::new("plugin.inbound.slack", "slack", json!({"n": i}));
        e.id = format!("e{i}");
        nodes[i % 3].publish(e);
    }
    let want: std::collections::BTreeSet<String> = (0..300).map(|i| format!("e{i}")).collect();
    for (name, members) in [("p", &mut p), ("q", &mut q)] {
        let mut all = Vec::new();
        for (i, (sub, _)) in members.iter_mut().enumerate() {
            let got = ids_of(sub, Duration::from_millis(1500)).await;
            assert!(!got.is_empty(), "{name}'s member on node {i} got nothing");
            all.extend(got);
        }
        let once: std::collections::BTreeSet<String> = all.iter().cloned().collect();
        assert_eq!(
            all.len(),
            300,
            "group {name}: each event once, got {}",
            all.len()
        );
        assert_eq!(once, want, "group {name}");
    }
    // Outside a group, a subscriber still gets every event.
    let got = ids_of(&mut everyone, Duration::from_millis(500)).await;
    assert_eq!(got.len(), 300);
    let grouped: u64 = nodes
        .iter()
        .map(|n| n.stats().grouped.load(Ordering::Relaxed))
        .sum();
    assert_eq!(grouped, 600);
    // Leaving: a dropped member gets nothing more; the others take all.
    let (_, guard) = p.remove(0);
    drop(guard);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..30 {
        let mut e = Event::new("plugin.inbound.mail", "mail", json!({}));
        e.id = format!("m{i}");
        nodes[0].publish(e);
    }
    let mut left = Vec::new();
    for (sub, _) in &mut p {
        left.extend(ids_of(sub, Duration::from_millis(1000)).await);
    }
    assert_eq!(left.len(), 30, "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_nats_is_away_a_group_member_on_the_publishing_node_gets_the_event() {
    let mut nats = TestNats::start();
    let (a, b) = (node(&nats, "a").await, node(&nats, "b").await);
    let (mut on_a, sink) = queue(100);
    let _ga = a
        .subscribe_group("plugin.inbound.>", "acme/p", sink)
        .unwrap();
    let (mut on_b, sink) = queue(100);
    let _gb = b
        .subscribe_group("plugin.inbound.>", "acme/p", sink)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    nats.stop();
    // Until the client notices, a publish still goes to NATS (and is lost:
    // at most once); then the publishing node serves its own member.
    let noticed = async {
        while a.stats().dropped.load(Ordering::Relaxed) == 0 {
            a.publish(Event::new("plugin.inbound.probe", "x", json!({})));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), noticed)
        .await
        .expect("the bus noticed NATS was away");
    drain(&mut on_a, Duration::from_millis(100)).await;
    let mut e = Event::new("plugin.inbound.slack", "slack", json!({}));
    e.id = "while-away".into();
    a.publish(e);
    let got = ids_of(&mut on_a, Duration::from_millis(300)).await;
    assert_eq!(got, vec!["while-away".to_owned()]);
    assert!(
        ids_of(&mut on_b, Duration::from_millis(300))
            .await
            .is_empty()
    );
}

/// A queue of events of `depth` and the sink that fills it.
fn queue(depth: usize) -> (plugd_host::bus::Subscription, plugd_host::bus::Sink) {
    let bus = plugd_host::bus::LocalBus::new();
    let sub = bus.subscribe(">", depth).unwrap();
    let sink: plugd_host::bus::Sink = std::sync::Arc::new(move |e: &Event| {
        bus.publish(e.clone());
        plugd_host::bus::Delivery::Queued
    });
    (sub, sink)
}
