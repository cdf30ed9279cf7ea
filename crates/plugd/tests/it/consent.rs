//! Two runtimes on one state store (as two processes, or two nodes of a cluster in the PostgreSQL pass): a tool disabled and a plugin revoked through one are refused at the other's very next call, with no wait; the revoked plugin is no longer listed or approved there.

use crate::state_pg::greet;
use crate::support::{Ws, quick};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disable_or_revoke_through_one_runtime_is_refused_at_the_others_next_call() {
    // Two runtimes on one workspace, each with its own connections to the
    // state store (SQLite: two connections to one file; PostgreSQL: two
    // pools to one database).
    let ws = Ws::new();
    ws.example("hello-python");
    let rt_b = ws.runtime(quick(10_000)).await;
    rt_b.approve("hello_python", "test").await.unwrap();
    // A approved nothing itself: it serves what the store holds approved.
    let rt_a = ws.runtime(quick(10_000)).await;
    greet(&rt_a).await.unwrap();
    greet(&rt_b).await.unwrap();

    // Disabled through B: A refuses its next call.
    rt_b.set_tool_enabled("hello_python_greet", false, "test")
        .await
        .unwrap();
    let refused = greet(&rt_a).await.unwrap_err();
    assert!(refused.contains("is disabled"), "{refused}");
    rt_b.set_tool_enabled("hello_python_greet", true, "test")
        .await
        .unwrap();

    // Revoked through B while A serves it: A's next call is refused and
    // A's process of the plugin stops.
    let a_running = rt_a.plugin("hello_python").await.unwrap();
    assert!(rt_b.revoke("hello_python").await.unwrap());
    let refused = greet(&rt_a).await.unwrap_err();
    assert!(
        refused.contains("hello_python_greet"),
        "A's call after B's revoke: {refused}"
    );
    let after = rt_a.plugin("hello_python").await.unwrap();
    assert!(!after.approved, "{a_running:?} → {after:?}");
    assert!(
        !rt_a.tools().iter().any(|t| t.plugin == "hello_python"),
        "A still lists the revoked plugin's tools"
    );
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}
