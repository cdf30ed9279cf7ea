//! The runtime on PostgreSQL: opened with `Runtime::open_on` on a `PgStore`, it keeps approvals and tool state in the database (and never opens the workspace's SQLite file), and a second runtime on the same database reads what the first left.

use std::sync::Arc;
use std::time::Duration;

use plugd_runtime::Runtime;
use plugd_store::StateStore;
use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgOptions, PgStore};
use serde_json::json;

use crate::support::{Ws, quick};

/// A migrated store on a fresh database of the shared test server.
async fn pg(url: &str) -> Arc<dyn StateStore> {
    let opts = PgOptions {
        pool_size: 4,
        timeout: Duration::from_secs(10),
    };
    Arc::new(PgStore::connect(url, &opts).await.unwrap())
}

async fn open(ws: &Ws, state: Arc<dyn StateStore>) -> Runtime {
    Runtime::open_on(ws.dir(), state, quick(10_000), plugd_agent::parts())
        .await
        .unwrap()
}

async fn greet(rt: &Runtime) -> Result<serde_json::Value, String> {
    rt.call_tool("hello_python_greet", json!({"name": "pg"}), None)
        .await
        .map(|r| serde_json::to_value(r).unwrap())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_on_postgres_keeps_approvals_and_tool_state_in_the_database() {
    let url = TestPg::shared().fresh_database();
    let ws = Ws::new();
    ws.example("hello-python");
    let sqlite_file = ws.dir().join(".plugd").join(plugd_store::STATE_DB_FILE);

    let first = pg(&url).await;
    let rt = open(&ws, first.clone()).await;
    rt.approve("hello_python", "test").await.unwrap();
    assert!(first.approval("hello_python").await.unwrap().is_some());
    let out = greet(&rt).await.unwrap();
    assert!(out.to_string().contains("pg"), "{out}");

    // Disabled: refused before the plugin is called; enabled: served again.
    rt.set_tool_enabled("hello_python_greet", false, "test")
        .await
        .unwrap();
    let refused = greet(&rt).await.unwrap_err();
    assert!(refused.contains("is disabled"), "{refused}");
    assert_eq!(first.disabled_tools().await.unwrap().len(), 1);
    rt.set_tool_enabled("hello_python_greet", true, "test")
        .await
        .unwrap();
    greet(&rt).await.unwrap();

    // Revoked: refused, and the database has no approval.
    assert!(rt.revoke("hello_python").await.unwrap());
    assert!(greet(&rt).await.is_err());
    assert!(first.approval("hello_python").await.unwrap().is_none());

    // What the second runtime must find: approved again, `add` disabled.
    rt.approve("hello_python", "test").await.unwrap();
    rt.set_tool_enabled("hello_python_add", false, "test")
        .await
        .unwrap();
    rt.shutdown().await;
    drop(rt);
    drop(first);
    assert!(
        !sqlite_file.exists(),
        "a runtime opened on PostgreSQL created {}",
        sqlite_file.display()
    );

    // A second runtime, on a new pool to the same database.
    let rt = open(&ws, pg(&url).await).await;
    let info = rt.plugin("hello_python").await.unwrap();
    assert!(info.approved, "{info:?}");
    greet(&rt).await.unwrap();
    let refused = rt
        .call_tool("hello_python_add", json!({"a": 1, "b": 2}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("is disabled"), "{refused}");
    rt.shutdown().await;
    assert!(!sqlite_file.exists());
}
