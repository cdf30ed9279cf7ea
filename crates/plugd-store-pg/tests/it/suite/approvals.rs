//! Approvals and failure marks on both backends, with the races of two connections.

use plugd_control::store::StoreError;
use plugd_store::{Approval, Failure};

use super::backends;

fn approval(id: &str, digest: &str) -> Approval {
    Approval {
        plugin_id: id.into(),
        digest: digest.into(),
        approved_by: "ana".into(),
        approved_at: "2026-01-01T00:00:00Z".into(),
        catalog: serde_json::json!([{"name": "t"}]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_round_trip_in_byte_order() {
    for be in backends().await {
        let s = &be.a;
        assert_eq!(s.approval("b").await.unwrap(), None);
        assert!(s.approvals().await.unwrap().is_empty());
        assert!(
            !s.update_catalog("b", "sha256:1", &serde_json::json!([]))
                .await
                .unwrap(),
            "{}: no approval, no catalog",
            be.name
        );
        for id in ["b", "B", "a", "é"] {
            s.approve(&approval(id, "sha256:1")).await.unwrap();
        }
        let ids: Vec<String> = s
            .approvals()
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.plugin_id)
            .collect();
        assert_eq!(ids, ["B", "a", "b", "é"], "byte order, as SQLite");
        assert_eq!(
            s.approval("a").await.unwrap(),
            Some(approval("a", "sha256:1"))
        );
        s.approve(&approval("a", "sha256:2")).await.unwrap();
        assert_eq!(s.approval("a").await.unwrap().unwrap().digest, "sha256:2");
        assert!(
            s.update_catalog("a", "sha256:2", &serde_json::json!([]))
                .await
                .unwrap()
        );
        assert!(
            !s.update_catalog("a", "sha256:1", &serde_json::json!([1]))
                .await
                .unwrap()
        );
        assert_eq!(
            s.approval("a").await.unwrap().unwrap().catalog,
            serde_json::json!([])
        );
        assert!(s.revoke("a").await.unwrap());
        assert!(!s.revoke("a").await.unwrap());
        let err = s.approve(&approval("", "x")).await.unwrap_err();
        assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_stamped_replaced_and_cleared() {
    for be in backends().await {
        let s = &be.a;
        assert_eq!(s.failure("p").await.unwrap(), None);
        assert!(!s.clear_failure("p").await.unwrap());
        s.mark_failed("p", "crashed 3 times").await.unwrap();
        let Failure {
            plugin_id,
            reason,
            at,
        } = s.failure("p").await.unwrap().unwrap();
        assert_eq!(
            (plugin_id.as_str(), reason.as_str()),
            ("p", "crashed 3 times")
        );
        assert_eq!(at.len(), 20, "{at}");
        s.mark_failed("p", "again").await.unwrap();
        assert_eq!(s.failure("p").await.unwrap().unwrap().reason, "again");
        // Approving with the clearing variant forgets it, a plain approval does not.
        s.approve(&approval("p", "d")).await.unwrap();
        assert!(s.failure("p").await.unwrap().is_some());
        s.approve_clearing_failure(&approval("p", "d"))
            .await
            .unwrap();
        assert!(s.failure("p").await.unwrap().is_none());
        // Failures and approvals are otherwise independent: a revoke keeps it.
        s.mark_failed("p", "x").await.unwrap();
        assert!(s.revoke("p").await.unwrap());
        assert!(s.failure("p").await.unwrap().is_some(), "{}", be.name);
        assert!(s.clear_failure("p").await.unwrap());
        assert!(!s.clear_failure("p").await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_exact_never_withdraws_a_newer_approval() {
    for be in backends().await {
        let s = &be.a;
        let old = approval("p", "d1");
        s.approve(&old).await.unwrap();
        s.mark_failed("p", "x").await.unwrap();
        let newer = Approval {
            approved_at: "2026-01-02T00:00:00Z".into(),
            ..approval("p", "d2")
        };
        s.approve(&newer).await.unwrap();
        assert!(!s.revoke_exact(&old).await.unwrap());
        assert_eq!(s.approval("p").await.unwrap(), Some(newer.clone()));
        assert!(
            s.failure("p").await.unwrap().is_some(),
            "kept when nothing was withdrawn"
        );
        // Another approver of the same digest is another approval too.
        let theirs = Approval {
            approved_by: "bob".into(),
            ..newer.clone()
        };
        s.approve_clearing_failure(&theirs).await.unwrap();
        assert!(!s.revoke_exact(&newer).await.unwrap(), "{}", be.name);
        s.mark_failed("p", "x").await.unwrap();
        assert!(s.revoke_exact(&theirs).await.unwrap());
        assert_eq!(s.approval("p").await.unwrap(), None);
        assert!(s.failure("p").await.unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_revoking_one_approval_exactly_one_withdraws_it() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        for round in 0..20 {
            let ap = approval(&format!("p{round}"), "d");
            a.approve(&ap).await.unwrap();
            let (x, y) = tokio::join!(a.revoke_exact(&ap), b.revoke_exact(&ap));
            assert_eq!(
                [x.unwrap(), y.unwrap()].iter().filter(|w| **w).count(),
                1,
                "round {round}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_and_its_rollback_racing_leave_one_consistent_state() {
    // Node a approves and clears the failure; node b rolls back the same
    // approval. Whatever the order, the failure mark is gone only together
    // with a write that succeeded, and the approval is either there or not.
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        for round in 0..20 {
            let ap = approval(&format!("p{round}"), "d");
            a.mark_failed(&ap.plugin_id, "x").await.unwrap();
            let (approved, rolled_back) =
                tokio::join!(a.approve_clearing_failure(&ap), b.revoke_exact(&ap));
            approved.unwrap();
            let rolled_back = rolled_back.unwrap();
            let now = a.approval(&ap.plugin_id).await.unwrap();
            assert_eq!(now.is_none(), rolled_back, "round {round}");
            assert!(
                a.failure(&ap.plugin_id).await.unwrap().is_none(),
                "round {round}"
            );
        }
    }
}
