//! One scenario over most domains through `Arc<dyn StateStore>`: both backends give the same answers, line for line.

use std::sync::Arc;
use std::time::Duration;

use plugd_control::chains::{BlockKind, Compaction, NewBlock};
use plugd_control::store::outbox::{DeliveryStatus, NewEvent, Subscriber};
use plugd_control::store::tool_state::{ApprovalState, Decide, NewCallApproval};
use plugd_control::store::vectors::VectorRecord;
use plugd_control::store::{Approval, Role, StateStore, TokenRejection};

use super::backends;
use serde_json::json;

/// A scenario over most domains; returns what it saw, to compare backends.
async fn scenario(store: Arc<dyn StateStore>) -> Vec<String> {
    let mut seen = Vec::new();
    let approval = Approval {
        plugin_id: "acme".into(),
        digest: "sha256:1".into(),
        approved_by: "ana".into(),
        approved_at: "2026-01-01T00:00:00Z".into(),
        catalog: json!([{"name": "t"}]),
    };
    store.mark_failed("acme", "crashed").await.unwrap();
    store.approve_clearing_failure(&approval).await.unwrap();
    seen.push(format!("{:?}", store.approvals().await.unwrap()));
    seen.push(format!(
        "failure {:?}",
        store.failure("acme").await.unwrap()
    ));
    assert!(store.tool_disable("acme", "acme_t", "ana").await.unwrap());
    seen.push(format!(
        "disabled {}",
        store.tool_disabled("acme", "acme_t").await.unwrap()
    ));
    let far = i64::MAX / 2;
    let req = store
        .call_approval_request(&NewCallApproval {
            tool: "acme_t".into(),
            plugin_id: "acme".into(),
            risk: "high".into(),
            args_preview: "{}".into(),
            expires_at_ms: far,
            ..Default::default()
        })
        .await
        .unwrap();
    let d = store
        .call_approval_decide(&req.id, ApprovalState::Denied, "bo", Some("no"))
        .await
        .unwrap();
    seen.push(format!(
        "decided {}",
        matches!(d, Decide::Decided(ref a) if a.state == ApprovalState::Denied)
    ));
    let t = store
        .token_create("ci", Role::Agent, None, "root")
        .await
        .unwrap();
    seen.push(format!(
        "verify {:?}",
        store.token_verify(&t.token).await.unwrap().map(|i| i.name)
    ));
    store.token_revoke("ci").await.unwrap();
    seen.push(format!(
        "revoked {}",
        matches!(
            store.token_verify(&t.token).await.unwrap(),
            Err(TokenRejection::Revoked(_))
        )
    ));
    store
        .kv_set("database", "k", &json!({"a": 1}))
        .await
        .unwrap();
    seen.push(format!(
        "kv {:?}",
        store.kv_get("database", "k").await.unwrap()
    ));
    let q = store
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
    let leased = store
        .outbox_lease("w", Duration::from_secs(30), 10, 3)
        .await
        .unwrap();
    assert_eq!(leased[0].delivery.delivery_id, q.deliveries[0]);
    assert!(store.outbox_ack(leased[0].delivery.id).await.unwrap());
    seen.push(format!(
        "delivered {}",
        store
            .outbox_list(Some(DeliveryStatus::Delivered))
            .await
            .unwrap()
            .len()
    ));
    let m = store
        .memory_add("a1", "user prefers tea", &[])
        .await
        .unwrap();
    seen.push(format!(
        "memory {:?}",
        store.memory_search("a1", "tea", None).await.unwrap().len()
    ));
    store.memory_delete(&m.id).await.unwrap();
    let (s, created) = store.session_open("s1", None, None).await.unwrap();
    seen.push(format!("session {created} {:?}", s.head_chain_id));
    store
        .session_append("s1", &[json!({"role": "user", "content": "hi"})])
        .await
        .unwrap();
    seen.push(format!(
        "transcript {}",
        store.session_transcript("s1").await.unwrap().len()
    ));
    let head = store.session_head("s1").await.unwrap();
    let compaction = Compaction {
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
    };
    let derived = store
        .chain_derive(
            &head,
            &[NewBlock::text(BlockKind::System, "s")],
            &compaction,
        )
        .await
        .unwrap();
    seen.push(format!(
        "derived {} {:?}",
        derived.blocks, derived.parent_chain_id
    ));
    seen.push(format!(
        "chains {}",
        store.session_chains("s1").await.unwrap().len()
    ));
    let n = store
        .vector_upsert(
            "kb",
            &[VectorRecord {
                id: "x".into(),
                content: "c".into(),
                embedding: vec![1.0, 0.0],
                metadata: json!({"t": 1}),
            }],
        )
        .await
        .unwrap();
    let hits = store
        .vector_search("kb", &[1.0, 0.0], 5, None)
        .await
        .unwrap();
    seen.push(format!(
        "vectors {n} {:?}",
        hits.iter().map(|h| &h.id).collect::<Vec<_>>()
    ));
    let mismatch = store
        .vector_search("kb", &[1.0], 5, None)
        .await
        .unwrap_err();
    seen.push(format!("vector error {mismatch}"));
    store
        .config_set_plain("acme", "units", &json!("si"))
        .await
        .unwrap();
    seen.push(format!(
        "config {:?}",
        store.config_values("acme").await.unwrap()
    ));
    seen.push(format!(
        "unknown chain {}",
        store.chain_append("ch_nope", &[], "t").await.unwrap_err()
    ));
    store.journal_audit("token:ci", Role::Agent, "POST", "/x", 200);
    let flushing = store.clone();
    tokio::task::spawn_blocking(move || flushing.flush_journal())
        .await
        .unwrap();
    let audit = store.audit_list(10).await.unwrap();
    seen.push(format!(
        "audit {:?}",
        audit.iter().map(|a| a.path.as_str()).collect::<Vec<_>>()
    ));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_answer_one_scenario_alike() {
    let mut seen = Vec::new();
    for be in backends().await {
        seen.push(scenario(be.a.clone()).await);
    }
    assert_eq!(seen[0], seen[1]);
}
