//! Hand-offs between nodes on a real nats-server: the node that holds a thing takes it and the offerer hears so; nobody holding it is `false` after the wait; a forged offer (another key), a replayed one and a node's own offer are never taken; a lying reply does not count.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugd_control::forward::{Forwarder, Taker};
use plugd_nats::NatsForwarder;
use plugd_nats::envelope::Sealer;
use plugd_nats::test_nats::TestNats;
use serde_json::{Value, json};

/// Takes payloads whose key it holds, and remembers every take.
struct Holder {
    holds: &'static str,
    took: Mutex<Vec<Value>>,
}

#[async_trait::async_trait]
impl Taker for Holder {
    async fn take(&self, kind: &str, key: &str, payload: Value) -> bool {
        if kind != "mcp.answer" || key != self.holds {
            return false;
        }
        self.took.lock().unwrap().push(payload);
        true
    }
}

async fn node(
    nats: &TestNats,
    key: &[u8],
    id: &str,
    holds: &'static str,
) -> (NatsForwarder, Arc<Holder>) {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let f = NatsForwarder::start(client, key, id).await.unwrap();
    let h = Arc::new(Holder {
        holds,
        took: Mutex::default(),
    });
    f.set_taker(h.clone());
    (f, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_takes_an_offer_and_forgeries_are_never_taken() {
    let nats = TestNats::start();
    let key = [7u8; 32];
    let (a, a_took) = node(&nats, &key, "a", "s-a").await;
    let (_b, b_took) = node(&nats, &key, "b", "s-b").await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // B holds s-b: A's offer reaches it.
    assert!(
        a.offer("mcp.answer", "s-b", json!({"id": 1}))
            .await
            .unwrap()
    );
    assert_eq!(b_took.took.lock().unwrap().as_slice(), &[json!({"id": 1})]);
    // Nobody holds s-x; A never takes its own offer (it holds s-a).
    assert!(!a.offer("mcp.answer", "s-x", json!({})).await.unwrap());
    assert!(!a.offer("mcp.answer", "s-a", json!({})).await.unwrap());
    assert!(a_took.took.lock().unwrap().is_empty());

    // A raw client with another key, then a replay of a genuine offer.
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let forger = Sealer::new(&[8u8; 32], "a");
    let body = json!({"kind": "mcp.answer", "key": "s-b", "payload": {"forged": true}}).to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let forged = serde_json::to_vec(&forger.seal(&body, now)).unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        raw.request("plugd.fwd.mcp.answer", forged.into()),
    )
    .await;
    assert!(!matches!(r, Ok(Ok(_))), "a forged offer got a reply");
    let genuine = serde_json::to_vec(&Sealer::new(&key, "a").seal(&body, now)).unwrap();
    let first = raw
        .request("plugd.fwd.mcp.answer", genuine.clone().into())
        .await;
    assert!(first.is_ok(), "the genuine offer is taken once");
    let again = tokio::time::timeout(
        Duration::from_secs(1),
        raw.request("plugd.fwd.mcp.answer", genuine.into()),
    )
    .await;
    assert!(!matches!(again, Ok(Ok(_))), "a replayed offer got a reply");
    // Its kind must be its subject.
    let wrong = serde_json::to_vec(&Sealer::new(&key, "a").seal(&body, now)).unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        raw.request("plugd.fwd.other", wrong.into()),
    )
    .await;
    assert!(
        !matches!(r, Ok(Ok(_))),
        "an offer under another subject got a reply"
    );
    // B took the first offer and the genuine one, once; never the forgery
    // (same payload, another key), the replay or the misfiled one.
    let took = b_took.took.lock().unwrap().clone();
    assert_eq!(took, [json!({"id": 1}), json!({"forged": true})]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_through_a_frozen_nats_is_unavailable_not_untaken() {
    let nats = TestNats::start();
    let key = [7u8; 32];
    let (a, _) = node(&nats, &key, "a", "s-a").await;
    let (_b, _) = node(&nats, &key, "b", "s-b").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A healthy NATS: nobody holds s-x, and that is what A hears.
    assert!(!a.offer("mcp.answer", "s-x", json!({})).await.unwrap());
    nats.freeze();
    let asked = std::time::Instant::now();
    let e = a.offer("mcp.answer", "s-b", json!({})).await;
    nats.thaw();
    let e = e.unwrap_err();
    assert!(e.to_string().contains("did not deliver"), "{e}");
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "{:?}",
        asked.elapsed()
    );
    // Thawed: B takes it again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(a.offer("mcp.answer", "s-b", json!({})).await.unwrap());
}
