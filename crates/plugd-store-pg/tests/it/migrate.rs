//! Schema migrations: several nodes at once, idempotence, a newer schema refused, a schema-v1 dump upgraded.

use std::time::Duration;

use plugd_store_pg::migrations::force_schema_version;
use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgError, PgOptions, PgStore, SCHEMA_VERSION};

fn opts() -> PgOptions {
    PgOptions {
        pool_size: 2,
        timeout: Duration::from_secs(10),
        op_timeout: Duration::from_secs(10),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_migrating_at_once_migrate_once() {
    let url = TestPg::shared().fresh_database();
    // Three pools: three connections, as three nodes starting together.
    let nodes: Vec<PgStore> = (0..3)
        .map(|_| PgStore::connect_unmigrated(&url, &opts()).unwrap())
        .collect();
    let (a, b, c) = tokio::join!(nodes[0].migrate(), nodes[1].migrate(), nodes[2].migrate());
    let results = [a.unwrap(), b.unwrap(), c.unwrap()];
    let applied: Vec<_> = results.iter().filter(|m| m.applied()).collect();
    assert_eq!(applied.len(), 1, "{results:?}");
    assert_eq!(applied[0].from, 0, "{results:?}");
    for m in &results {
        assert_eq!(m.to, SCHEMA_VERSION, "{results:?}");
        if !m.applied() {
            assert_eq!(m.from, SCHEMA_VERSION, "{results:?}");
        }
    }
    for node in &nodes {
        assert_eq!(node.schema_version().await.unwrap(), SCHEMA_VERSION);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_again_changes_nothing() {
    let url = TestPg::shared().fresh_database();
    let store = PgStore::connect(&url, &opts()).await.unwrap();
    let before = store.schema_shape().await.unwrap();
    let again = store.migrate().await.unwrap();
    assert!(!again.applied(), "{again:?}");
    assert_eq!(store.schema_shape().await.unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_alone() {
    let url = TestPg::shared().fresh_database();
    let store = PgStore::connect(&url, &opts()).await.unwrap();
    force_schema_version(&store, SCHEMA_VERSION + 1)
        .await
        .unwrap();
    let err = PgStore::connect(&url, &opts()).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, PgError::TooNew { found, supported, .. } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{err:?}"
    );
    assert!(
        msg.contains(&format!("schema version {}", SCHEMA_VERSION + 1))
            && msg.contains(&format!("only up to {SCHEMA_VERSION}"))
            && msg.contains("upgrade plugd"),
        "{msg}"
    );
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_within_the_timeout() {
    // No server has a socket numbered 1 in the temporary directory.
    let dir = std::env::temp_dir();
    let url = format!("postgres://plugd@/x?host={}&port=1", dir.display());
    let started = std::time::Instant::now();
    let err = PgStore::connect(&url, &opts()).await.unwrap_err();
    assert!(matches!(err, PgError::Unavailable { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.to_string().contains(&dir.display().to_string()),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_leaves_the_database_as_it_was() {
    let url = TestPg::shared().fresh_database();
    let store = PgStore::connect_unmigrated(&url, &opts()).unwrap();
    // A table in the way of step 1 (its third script).
    store
        .test_execute("CREATE TABLE memories (x int)")
        .await
        .unwrap();
    let err = store.migrate().await.unwrap_err();
    assert!(
        matches!(err, PgError::Migrate { version: 1, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("migrating to schema version 1"),
        "{err}"
    );
    assert_eq!(store.schema_version().await.unwrap(), 0);
    let tables = store
        .test_count(
            "SELECT count(*) FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name <> $1",
            "memories",
        )
        .await
        .unwrap();
    assert_eq!(tables, 0, "no table of the failed step remains");
}

/// The invocation record of `fixtures/schema-v1.sql`, as its document.
const V1_RECORD: &str = r#"{"invocation_id":"inv_v1","export_kind":"tool","export_id":"add","tool":"hello_python_add","plugin_id":"hello_python","dialect":"native","binding_id":null,"package_id":null,"package_version":null,"execution_class":null,"started_at":"2026-11-20T10:00:00.000Z","ended_at":"2026-11-20T10:00:00.007Z","started_ms":1795168800000,"duration_ms":7,"status":"failed","retry_count":1,"error_code":"tool_failed","caller":"token:ci","org_id":null,"project_id":null,"session_id":"s1","chain_id":null,"run_id":null,"trace_id":"abc","execution_id":null}"#;

/// A database at schema version 1 as first shipped (`fixtures/schema-v1.sql`,
/// a `pg_dump` with rows in it) upgrades to this build's schema in place:
/// its rows are read back through the traits, the new tables work, and the
/// logical shape is the snapshot's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_v1_dump_upgrades_to_this_schema() {
    use plugd_control::store::live::{Lifetime, LiveKind};
    use plugd_control::store::{StateStore, TokenRejection};

    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures/schema-v1.sql");
    let url = TestPg::shared().database_from_dump(&fixture);
    let old = PgStore::connect_unmigrated(&url, &opts()).unwrap();
    assert_eq!(old.schema_version().await.unwrap(), 1);
    let store = PgStore::connect(&url, &opts()).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        plugd_store_pg::SCHEMA_VERSION
    );
    let store: std::sync::Arc<dyn StateStore> = std::sync::Arc::new(store);

    // The rows written at version 1.
    let approval = store.approval("hello_python").await.unwrap().unwrap();
    assert_eq!(approval.digest, "sha256:0f0e");
    assert!(
        store
            .tool_disabled("hello_python", "hello_python_add")
            .await
            .unwrap()
    );
    let token = format!("plugd_0123456789abcdef_{}", "ab".repeat(32));
    let info = store.token_verify(&token).await.unwrap().unwrap();
    assert_eq!(info.name, "ci");
    assert!(matches!(
        store
            .token_verify(&format!("plugd_0123456789abcdef_{}", "cd".repeat(32)))
            .await
            .unwrap(),
        Err(TokenRejection::Invalid)
    ));
    assert_eq!(
        store.kv_get("database", "tenant:acme").await.unwrap(),
        Some(serde_json::json!({"quota": 5}))
    );
    let found = store
        .memory_search("default", "postgres", Some(5))
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let info = store.session_info("s1").await.unwrap().unwrap();
    assert_eq!(info.head_chain_id.as_deref(), Some("ch_s1"));
    assert_eq!(store.chain_blocks("ch_s1", 0, 10).await.unwrap().len(), 1);
    // An invocation record written as one JSON document reads back whole
    // from the columns and `extra` of step 8.
    let r = store.invocation("inv_v1").await.unwrap().unwrap();
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        serde_json::from_str::<serde_json::Value>(V1_RECORD).unwrap()
    );

    // What later steps added works on the upgraded database.
    let before = store.control_epoch().await.unwrap();
    store.revoke("hello_python").await.unwrap();
    assert!(store.control_epoch().await.unwrap() > before);
    store
        .live_session_put(LiveKind::Mcp, "s", "token:ci", None, &serde_json::json!({}))
        .await
        .unwrap();
    let life = Lifetime {
        idle_ms: 60_000,
        max_age_ms: None,
    };
    assert!(
        store
            .live_session_get(LiveKind::Mcp, "s", life)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .lease_acquire("retention", "node-a", 1000)
            .await
            .unwrap()
            .is_some()
    );
}
