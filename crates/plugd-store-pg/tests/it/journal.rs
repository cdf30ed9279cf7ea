//! The journal writer on PostgreSQL: audit entries and invocation records
//! batched off the request path, in order, written across a restart.

use std::time::Duration;

use plugd_control::invocations::{InvocationFilter, InvocationRecord, TerminalStatus, rfc3339_ms};
use plugd_store::tokens::Role;
use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgOptions, PgStore};

use crate::fresh_store;

fn rec(n: usize) -> InvocationRecord {
    InvocationRecord {
        invocation_id: format!("inv_{n:04}"),
        export_kind: "tool".into(),
        export_id: "t".into(),
        tool: "p/t".into(),
        plugin_id: "p".into(),
        dialect: "native".into(),
        binding_id: None,
        package_id: None,
        package_version: None,
        execution_class: None,
        started_at: rfc3339_ms(1_000 + n as i64),
        ended_at: rfc3339_ms(1_005 + n as i64),
        started_ms: 1_000 + n as i64,
        duration_ms: 5,
        status: TerminalStatus::Succeeded,
        retry_count: 0,
        error_code: None,
        caller: None,
        org_id: None,
        project_id: None,
        session_id: None,
        chain_id: None,
        run_id: None,
        trace_id: None,
        execution_id: None,
        surface: None,
        payload: None,
    }
}

async fn invocations(store: &PgStore) -> usize {
    store
        .list_invocations(&InvocationFilter {
            limit: 1000,
            ..InvocationFilter::default()
        })
        .await
        .unwrap()
        .invocations
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_entries_are_written_in_order_by_the_flush() {
    let store = std::sync::Arc::new(fresh_store().await);
    for n in 0..300 {
        store.journal_audit("token:ci", Role::Agent, "POST", &format!("/p/{n}"), 200);
        store.journal_invocation(Box::new(rec(n)));
    }
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.flush_journal())
        .await
        .unwrap();
    let audit = store.audit_list(1000).await.unwrap();
    let paths: Vec<String> = audit.iter().map(|a| a.path.clone()).collect();
    assert_eq!(
        paths,
        (0..300).map(|n| format!("/p/{n}")).collect::<Vec<_>>(),
        "in order"
    );
    assert_eq!(invocations(&store).await, 300);
    assert_eq!(store.journal_unwritten(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_store_writes_what_is_queued() {
    let url = TestPg::shared().fresh_database();
    let opts = PgOptions::default();
    let store = PgStore::connect(&url, &opts).await.unwrap();
    for n in 0..50 {
        store.journal_invocation(Box::new(rec(n)));
    }
    tokio::task::spawn_blocking(move || drop(store))
        .await
        .unwrap();
    let reader = PgStore::connect(&url, &opts).await.unwrap();
    assert_eq!(invocations(&reader).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_queued_while_the_server_is_down_are_written_when_it_is_back() {
    let pg = TestPg::start().unwrap();
    let url = pg.fresh_database();
    let store = std::sync::Arc::new(
        PgStore::connect(
            &url,
            &PgOptions {
                pool_size: 2,
                timeout: Duration::from_secs(1),
                op_timeout: Duration::from_secs(1),
            },
        )
        .await
        .unwrap(),
    );
    store.journal_audit("token:ci", Role::Admin, "POST", "/before", 200);
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.flush_journal())
        .await
        .unwrap();
    pg.stop_immediate().unwrap();
    for n in 0..10 {
        store.journal_audit("token:ci", Role::Admin, "POST", &format!("/down/{n}"), 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    pg.start_again().unwrap();
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.flush_journal())
        .await
        .unwrap();
    assert_eq!(store.journal_unwritten(), (0, 0));
    assert_eq!(store.audit_list(100).await.unwrap().len(), 11);
}

/// What a typical record takes on PostgreSQL with its indexes (table, TOAST
/// and indexes over the records written). PostgreSQL's row header (24 bytes
/// and a 4-byte line pointer) and index tuples (8 bytes and a pointer each)
/// make this more than SQLite's, whose bound is 300 (`plugd-store`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typical_record_takes_at_most_400_bytes_on_postgresql() {
    let url = TestPg::shared().fresh_database();
    let store = PgStore::connect(&url, &PgOptions::default()).await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let size = async || -> i64 {
        client
            .query_one("SELECT pg_total_relation_size('invocations')", &[])
            .await
            .unwrap()
            .get(0)
    };
    let before = size().await;
    const N: u64 = 20_000;
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|&n| plugd_control::samples::typical_invocation(n))
            .collect();
        store.append_invocations(&batch).await.unwrap();
    }
    let per = (size().await - before) / N as i64;
    assert!(per <= 400, "{per} bytes per record");
    let one = plugd_control::samples::typical_invocation(77);
    assert_eq!(
        store.invocation(&one.invocation_id).await.unwrap().unwrap(),
        one
    );
}
