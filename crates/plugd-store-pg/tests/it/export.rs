//! `import_workspace`: a real SQLite workspace (`plugd_store::Store` in a
//! temporary directory) copied into a real PostgreSQL cluster reads back
//! alike through the `StateStore` traits; tokens still verify, secrets still
//! open; refusals (not initialised, not empty, another key) name why.

use std::path::Path;
use std::sync::Arc;

use plugd_control::bindings::{Binding, BindingFilter, BindingStatus, Rollout, Scope};
use plugd_control::chains::{BlockKind, Compaction, NewBlock};
use plugd_control::invocations::{InvocationFilter, InvocationRecord, TerminalStatus, rfc3339_ms};
use plugd_control::packages::{Digest, Package, PackageExport, SignatureStatus};
use plugd_control::store::outbox::{NewEvent, Subscriber};
use plugd_control::store::tool_state::NewCallApproval;
use plugd_control::store::vectors::VectorRecord;
use plugd_control::store::{Approval, Role, StateStore, StoredValue};
use plugd_store::dump::read_workspace;
use plugd_store::secrets::MasterKey;
use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgError, PgStore};
use serde_json::json;

use crate::options;

fn key(b: u8) -> MasterKey {
    MasterKey::from_bytes([b; 32], format!("test key {b}"))
}

fn package() -> Package {
    Package {
        package_id: "acme/devkit".to_owned(),
        version: "0.1.0".to_owned(),
        digest: Digest::from_sha256_hex(&"01".repeat(32)).unwrap(),
        source: "oci://127.0.0.1:5000/acme/devkit:latest".to_owned(),
        installed_at: "2026-01-01T00:00:01Z".to_owned(),
        installed_by: "cli".to_owned(),
        path: "/w/.plugd/packages/sha256/x".into(),
        manifest: "vai-plugin.toml".to_owned(),
        exports: vec![PackageExport {
            id: "jira_search".to_owned(),
            kind: "tool".to_owned(),
            display_name: None,
            execution_class: Some("isolated".to_owned()),
        }],
        signature: SignatureStatus::Unverified {
            file: "marketplace.signature.json".to_owned(),
        },
        files: 3,
        size: 1234,
        tree_digest: Some(format!("sha256:{}", "ab".repeat(32))),
    }
}

fn binding() -> Binding {
    Binding {
        binding_id: "bind_a".into(),
        package_id: "acme/devkit".into(),
        package_version: "0.1.0".into(),
        export_id: "jira_search".into(),
        scope: Scope {
            org_id: "org_a".into(),
            project_id: None,
        },
        config: json!({"max_results": 10}),
        secrets: Default::default(),
        status: BindingStatus::Active,
        rollout: Rollout::default(),
        created_at: "2026-01-01T00:00:00Z".into(),
        updated_at: "2026-01-01T00:00:00Z".into(),
        created_by: "cli".into(),
        gateway_api_scopes: None,
    }
}

fn invocation() -> InvocationRecord {
    InvocationRecord {
        invocation_id: "inv_0001".into(),
        export_kind: "tool".into(),
        export_id: "jira_search".into(),
        tool: "acme/jira_search".into(),
        plugin_id: "acme".into(),
        dialect: "vai".into(),
        binding_id: Some("bind_a".into()),
        package_id: Some("acme/devkit".into()),
        package_version: Some("0.1.0".into()),
        execution_class: None,
        started_at: rfc3339_ms(1_700_000_000_000),
        ended_at: rfc3339_ms(1_700_000_000_005),
        started_ms: 1_700_000_000_000,
        duration_ms: 5,
        status: TerminalStatus::Succeeded,
        retry_count: 0,
        error_code: None,
        caller: Some("cli:root".into()),
        org_id: Some("org_a".into()),
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

/// A workspace with a bit of every kind of state; returns the token's secret.
fn fill(dir: &Path, master: &MasterKey) -> String {
    let sqlite = plugd_store::Store::open(&dir.join(".plugd")).unwrap();
    sqlite
        .config_set_secret("acme", "api_key", "s3cret", master)
        .unwrap();
    let store: Arc<dyn StateStore> = Arc::new(sqlite);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        store
            .approve(&Approval {
                plugin_id: "acme".into(),
                digest: "sha256:1".into(),
                approved_by: "ana".into(),
                approved_at: "2026-01-01T00:00:00Z".into(),
                catalog: json!([{"name": "t"}]),
            })
            .await
            .unwrap();
        store.tool_disable("acme", "acme_t", "ana").await.unwrap();
        store
            .call_approval_request(&NewCallApproval {
                tool: "acme_t".into(),
                plugin_id: "acme".into(),
                risk: "high".into(),
                args_preview: "{}".into(),
                expires_at_ms: i64::MAX / 2,
                caller: Some("cli:ana".into()),
                surface: Some("cli".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let token = store
            .token_create("ci", Role::Agent, None, "root")
            .await
            .unwrap()
            .token;
        store
            .config_set_plain("acme", "units", &json!("si"))
            .await
            .unwrap();
        store
            .memory_add("a1", "user prefers tea", &["drinks".into()])
            .await
            .unwrap();
        store
            .memory_add("a1", "user lives in Lyon", &[])
            .await
            .unwrap();
        store
            .kv_set("database", "k", &json!({"a": 1}))
            .await
            .unwrap();
        store
            .outbox_enqueue(
                &NewEvent {
                    event_type: "run.completed".into(),
                    subject: json!({"id": "r"}),
                    summary: json!({}),
                },
                &[Subscriber {
                    plugin_id: "acme".into(),
                    export_id: "h".into(),
                }],
            )
            .await
            .unwrap();
        store
            .vector_upsert(
                "kb",
                &[VectorRecord {
                    id: "x".into(),
                    content: "c".into(),
                    embedding: vec![1.0, 0.5],
                    metadata: json!({"t": 1}),
                }],
            )
            .await
            .unwrap();
        store.insert_package(&package()).await.unwrap();
        store.insert_binding(&binding()).await.unwrap();
        store.append_invocations(&[invocation()]).await.unwrap();
        store.session_open("s1", Some("org_a"), None).await.unwrap();
        store
            .session_append("s1", &[json!({"role": "user", "content": "hi"})])
            .await
            .unwrap();
        let head = store.session_head("s1").await.unwrap();
        store
            .chain_derive(
                &head,
                &[NewBlock::text(BlockKind::System, "summary")],
                &Compaction {
                    id: "cmp_1".into(),
                    session_id: "s1".into(),
                    source_chain_id: head.clone(),
                    derived_chain_id: None,
                    compactor: "k".into(),
                    status: "succeeded".into(),
                    token_estimate: 1,
                    summary: json!({}),
                    diagnostics: json!({}),
                    error: None,
                    run_id: None,
                    created_at: "2026-01-01T00:00:00Z".into(),
                },
            )
            .await
            .unwrap();
        store.journal_audit("token:ci", Role::Agent, "POST", "/v1/x", 200);
        store.journal_audit("token:ci", Role::Agent, "GET", "/v1/y", 404);
        store.flush_journal();
        token
    })
}

/// What the traits say about everything `fill` wrote.
async fn view(store: &dyn StateStore) -> Vec<String> {
    let mut seen = vec![
        format!("{:?}", store.approvals().await.unwrap()),
        format!("{:?}", store.disabled_tools().await.unwrap()),
        format!("{:?}", store.call_approvals_pending().await.unwrap()),
        format!("{:?}", store.token_list().await.unwrap()),
        format!("{:?}", store.config_values("acme").await.unwrap()),
        format!("{:?}", store.memory_list("a1", 10).await.unwrap()),
        format!(
            "{:?}",
            store.memory_search("a1", "tea", None).await.unwrap()
        ),
        format!("{:?}", store.kv_get("database", "k").await.unwrap()),
        format!("{:?}", store.outbox_list(None).await.unwrap()),
        format!(
            "{:?}",
            store
                .vector_search("kb", &[1.0, 0.5], 5, None)
                .await
                .unwrap()
        ),
        format!("{:?}", store.packages().await.unwrap()),
        format!(
            "{:?}",
            store.bindings(&BindingFilter::default()).await.unwrap()
        ),
        format!(
            "{:?}",
            store
                .list_invocations(&InvocationFilter::default())
                .await
                .unwrap()
                .invocations
        ),
        format!("{:?}", store.session_chains("s1").await.unwrap()),
        format!("{:?}", store.session_transcript("s1").await.unwrap()),
    ];
    let audit = store.audit_list(10).await.unwrap();
    seen.push(format!("{audit:?}"));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_exports_into_an_empty_cluster_and_reads_back_alike() {
    let dir = tempfile::tempdir().unwrap();
    let master = key(3);
    let token = {
        let dir = dir.path().to_owned();
        let master = key(3);
        tokio::task::spawn_blocking(move || fill(&dir, &master))
            .await
            .unwrap()
    };
    let db = dir.path().join(".plugd").join(plugd_store::STATE_DB_FILE);
    let before = std::fs::read(&db).unwrap();
    let dump = read_workspace(&dir.path().join(".plugd")).unwrap();

    let url = TestPg::shared().fresh_database();
    let pg = PgStore::connect(&url, &options()).await.unwrap();
    let info = pg.cluster_init(master.id()).await.unwrap();
    let report = pg.import_workspace(&dump).await.unwrap();
    assert_eq!(report.cluster_id, info.cluster_id);
    let count = |t: &str| {
        report
            .tables
            .iter()
            .find(|(n, _)| n == t)
            .map(|(_, c)| *c)
            .unwrap_or_else(|| panic!("{t} not in {:?}", report.tables))
    };
    assert_eq!(count("approvals"), 1);
    assert_eq!(count("memories"), 2);
    assert_eq!(count("audit"), 2);
    assert_eq!(count("chains"), 2);
    assert_eq!(count("plugin_config"), 2);
    assert_eq!(report.tables.len(), dump.tables.len());
    let pos = |t: &str| report.tables.iter().position(|(n, _)| n == t).unwrap();
    assert!(pos("sessions") < pos("chains") && pos("chains") < pos("chain_blocks"));
    assert!(pos("outbox_events") < pos("outbox_deliveries"));
    // The SQLite file was only read.
    assert_eq!(std::fs::read(&db).unwrap(), before);

    let sqlite: Arc<dyn StateStore> =
        Arc::new(plugd_store::Store::open(&dir.path().join(".plugd")).unwrap());
    let pg: Arc<dyn StateStore> = Arc::new(pg);
    assert_eq!(view(sqlite.as_ref()).await, view(pg.as_ref()).await);

    // The token verifies with its original secret; the secret opens with the same key.
    let verified = pg.token_verify(&token).await.unwrap().unwrap();
    assert_eq!(verified.name, "ci");
    let Some(StoredValue::Secret(sealed)) = pg.config_value("acme", "api_key").await.unwrap()
    else {
        panic!("the secret is not sealed on PostgreSQL");
    };
    assert_eq!(
        master.open("acme", "api_key", &sealed).unwrap().as_str(),
        "s3cret"
    );

    // Identity sequences continue after the copied ids.
    let m = pg.memory_add("a1", "third", &[]).await.unwrap();
    assert_eq!(pg.memory_list("a1", 10).await.unwrap().len(), 3, "{m:?}");
    let q = pg
        .outbox_enqueue(
            &NewEvent {
                event_type: "run.completed".into(),
                subject: json!({"id": "r2"}),
                summary: json!({}),
            },
            &[Subscriber {
                plugin_id: "acme".into(),
                export_id: "h".into(),
            }],
        )
        .await
        .unwrap();
    assert_eq!(q.deliveries.len(), 1);
    assert_eq!(pg.outbox_list(None).await.unwrap().len(), 2);
    pg.journal_audit("token:ci", Role::Agent, "GET", "/v1/z", 200);
    let flushing = pg.clone();
    tokio::task::spawn_blocking(move || flushing.flush_journal())
        .await
        .unwrap();
    assert_eq!(pg.audit_list(10).await.unwrap().len(), 3);

    // A second export finds the cluster no longer empty.
    let again = PgStore::connect(&url, &options()).await.unwrap();
    let err = again.import_workspace(&dump).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PgError::NotEmpty { .. }), "{err:?}");
    assert!(msg.contains("table agent_kv has 1 rows"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninitialised_cluster_and_a_foreign_key_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let dir = dir.path().to_owned();
        tokio::task::spawn_blocking(move || fill(&dir, &key(3)))
            .await
            .unwrap();
    }
    let dump = read_workspace(&dir.path().join(".plugd")).unwrap();

    let url = TestPg::shared().fresh_database();
    let pg = PgStore::connect(&url, &options()).await.unwrap();
    let err = pg.import_workspace(&dump).await.unwrap_err();
    assert!(matches!(err, PgError::NotInitialised { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("run `plugd cluster init --state URL` first"),
        "{err}"
    );

    let other = key(4);
    pg.cluster_init(other.id()).await.unwrap();
    let err = pg.import_workspace(&dump).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PgError::ForeignSecret { .. }), "{err:?}");
    assert!(msg.contains("\"api_key\""), "{msg}");
    assert!(msg.contains("\"acme\""), "{msg}");
    assert!(msg.contains(key(3).id()), "{msg}");
    assert!(msg.contains(other.id()), "{msg}");
    // Nothing was written.
    assert_eq!(
        pg.test_count("SELECT count(*) FROM approvals WHERE plugin_id <> $1", "")
            .await
            .unwrap(),
        0
    );
}
