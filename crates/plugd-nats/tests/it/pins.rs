//! Approval pins in JetStream's Object Store on a real nats-server: stored by one node, read by another, absent names are `None`, and a blob over the caller's bound is refused before it is read whole.

use plugd_control::blobs::PinBlobs;
use plugd_nats::NatsPinBlobs;
use plugd_nats::test_nats::TestNats;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_stored_by_one_node_is_read_by_another() {
    let nats = TestNats::start();
    let a = NatsPinBlobs::open(async_nats::connect(nats.url()).await.unwrap())
        .await
        .unwrap();
    // The second node finds the bucket the first created.
    let b = NatsPinBlobs::open(async_nats::connect(nats.url()).await.unwrap())
        .await
        .unwrap();
    let name = "ab".repeat(32);
    // Larger than one 128 KiB chunk, so the object spans several messages.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    a.put(&name, data.clone()).await.unwrap();
    assert_eq!(
        b.get(&name, 1 << 20).await.unwrap().as_deref(),
        Some(&data[..])
    );
    assert_eq!(b.get(&"cd".repeat(32), 1 << 20).await.unwrap(), None);
    let e = b.get(&name, 1000).await.unwrap_err();
    assert!(e.contains("over the 1000"), "{e}");
    // Replacing keeps one current version.
    a.put(&name, b"v2".to_vec()).await.unwrap();
    assert_eq!(
        b.get(&name, 1 << 20).await.unwrap().as_deref(),
        Some(&b"v2"[..])
    );
}
