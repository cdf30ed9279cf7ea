//! The cluster record: `cluster_init` once (of several at once exactly one
//! wins), `cluster_info`, and `open_node` refusing an uninitialised database
//! and a node with another master key.

use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgError, PgOptions, PgStore, SCHEMA_VERSION};

use crate::options;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_writes_one_record_and_a_second_init_names_the_cluster() {
    let url = TestPg::shared().fresh_database();
    let store = PgStore::connect_unmigrated(&url, &options()).unwrap();
    assert_eq!(store.cluster_info().await.unwrap(), None);
    let info = store.cluster_init("k-0123456789abcdef").await.unwrap();
    assert!(info.cluster_id.starts_with("cluster_"), "{info:?}");
    assert_eq!(info.key_id, "k-0123456789abcdef");
    assert_eq!(info.schema_version, SCHEMA_VERSION);
    assert!(
        info.created_at.len() == 20 && info.created_at.ends_with('Z'),
        "{info:?}"
    );
    assert_eq!(store.cluster_info().await.unwrap(), Some(info.clone()));

    let err = store.cluster_init("k-ffffffffffffffff").await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PgError::AlreadyInitialised { .. }), "{err:?}");
    assert!(msg.contains(&info.cluster_id), "{msg}");
    assert!(msg.contains("already initialised"), "{msg}");
    assert!(msg.contains("k-0123456789abcdef"), "{msg}");
    // The record is unchanged.
    assert_eq!(store.cluster_info().await.unwrap(), Some(info));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_three_concurrent_inits_exactly_one_wins() {
    let url = TestPg::shared().fresh_database();
    let mut tasks = Vec::new();
    for n in 0..3 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            // Each its own pool, as three operators on three machines.
            let store = PgStore::connect_unmigrated(&url, &options()).unwrap();
            store.cluster_init(&format!("k-{n:016}")).await
        }));
    }
    let mut won = Vec::new();
    let mut refused = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(info) => won.push(info),
            Err(PgError::AlreadyInitialised { cluster_id, .. }) => refused.push(cluster_id),
            Err(e) => panic!("unexpected: {e}"),
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
    assert_eq!(refused, vec![won[0].cluster_id.clone(); 2]);
    let store = PgStore::connect_unmigrated(&url, &options()).unwrap();
    assert_eq!(store.cluster_info().await.unwrap(), Some(won[0].clone()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_needs_an_initialised_cluster_and_its_master_key() {
    let url = TestPg::shared().fresh_database();
    let err = PgStore::open_node(&url, &options(), "k-aaaaaaaaaaaaaaaa")
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PgError::NotInitialised { .. }), "{err:?}");
    assert!(
        msg.contains("run `plugd cluster init --state URL` first"),
        "{msg}"
    );

    let admin = PgStore::connect_unmigrated(&url, &options()).unwrap();
    let info = admin.cluster_init("k-aaaaaaaaaaaaaaaa").await.unwrap();

    let err = PgStore::open_node(&url, &options(), "k-bbbbbbbbbbbbbbbb")
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PgError::KeyMismatch { .. }), "{err:?}");
    assert!(msg.contains("k-aaaaaaaaaaaaaaaa"), "{msg}");
    assert!(msg.contains("k-bbbbbbbbbbbbbbbb"), "{msg}");
    assert!(msg.contains(&info.cluster_id), "{msg}");

    let node = PgStore::open_node(&url, &options(), "k-aaaaaaaaaaaaaaaa")
        .await
        .unwrap();
    assert_eq!(node.cluster_info().await.unwrap(), Some(info));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_table_is_not_part_of_the_logical_shape() {
    let url = TestPg::shared().fresh_database();
    let store = PgStore::connect(&url, &PgOptions::default()).await.unwrap();
    let before = store.schema_shape().await.unwrap();
    store.cluster_init("k-0000000000000001").await.unwrap();
    assert_eq!(store.schema_shape().await.unwrap(), before);
}
