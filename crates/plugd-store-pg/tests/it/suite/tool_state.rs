//! Disabled tools and per-call approvals on both backends: expiry, one
//! winner when two operators decide at once.

use std::sync::Arc;

use plugd_control::store::StateStore;
use plugd_store::tool_state::{ApprovalState, CallApproval, Decide, NewCallApproval};

use super::now_ms;

use super::backends;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_enable_round_trip() {
    for be in backends().await {
        let s = &be.a;
        assert!(!s.tool_disabled("p", "p_x").await.unwrap());
        assert!(s.tool_disable("p", "p_x", "ana").await.unwrap());
        assert!(!s.tool_disable("p", "p_x", "ana").await.unwrap());
        assert!(s.tool_disabled("p", "p_x").await.unwrap());
        assert!(
            !s.tool_disabled("q", "p_x").await.unwrap(),
            "keyed by plugin too"
        );
        let listed = s.disabled_tools().await.unwrap();
        assert_eq!(listed[0].disabled_by, "ana");
        assert_eq!(listed[0].disabled_at.len(), 20, "{}", listed[0].disabled_at);
        assert!(s.tool_enable("p", "p_x").await.unwrap());
        assert!(!s.tool_enable("p", "p_x").await.unwrap());
        assert!(s.disabled_tools().await.unwrap().is_empty());
    }
}

/// A request expiring `in_ms` from now.
async fn request(s: &Arc<dyn StateStore>, in_ms: i64) -> CallApproval {
    let now = now_ms();
    s.call_approval_request(&NewCallApproval {
        tool: "p_x".into(),
        plugin_id: "p".into(),
        risk: "high".into(),
        args_preview: "{}".into(),
        expires_at_ms: now + in_ms,
        caller: Some("token:demo".into()),
        surface: Some("http".into()),
        session_id: Some("s1".into()),
        agent_id: None,
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_is_recorded_once() {
    for be in backends().await {
        let s = &be.a;
        let a = request(s, 60_000).await;
        assert!(a.id.starts_with("apr_") && a.id.len() == 20, "{}", a.id);
        assert_eq!(a.state, ApprovalState::Pending);
        // Who asks is kept and read back as it was given.
        assert_eq!(
            (
                a.caller.as_deref(),
                a.surface.as_deref(),
                a.session_id.as_deref(),
                a.agent_id.as_deref()
            ),
            (Some("token:demo"), Some("http"), Some("s1"), None)
        );
        assert_eq!(s.call_approvals_pending().await.unwrap(), vec![a.clone()]);
        let Decide::Decided(d) = s
            .call_approval_decide(&a.id, ApprovalState::Approved, "ana", None)
            .await
            .unwrap()
        else {
            panic!("not decided")
        };
        assert_eq!(d.state, ApprovalState::Approved);
        assert_eq!(d.decided_by.as_deref(), Some("ana"));
        assert!(matches!(
            s.call_approval_decide(&a.id, ApprovalState::Denied, "bo", Some("no")).await.unwrap(),
            Decide::AlreadyDecided(x) if x.state == ApprovalState::Approved
        ));
        assert_eq!(
            s.call_approval_decide("apr_nope", ApprovalState::Denied, "bo", None)
                .await
                .unwrap(),
            Decide::Unknown
        );
        assert!(s.call_approvals_pending().await.unwrap().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_request_cannot_be_approved() {
    for be in backends().await {
        let s = &be.a;
        let a = request(s, -1).await;
        assert!(s.call_approvals_pending().await.unwrap().is_empty());
        assert!(matches!(
            s.call_approval_decide(&a.id, ApprovalState::Approved, "ana", None).await.unwrap(),
            Decide::AlreadyDecided(x) if x.state == ApprovalState::TimedOut && x.decided_by.as_deref() == Some("timeout")
        ));
        // The waiting call may still record its own timeout.
        let b = request(s, -1).await;
        assert!(matches!(
            s.call_approval_decide(&b.id, ApprovalState::TimedOut, "timeout", None).await.unwrap(),
            Decide::Decided(x) if x.state == ApprovalState::TimedOut
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_deciding_at_once_get_one_winner() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        for round in 0..20 {
            let req = request(a, 60_000).await;
            let (x, y) = tokio::join!(
                a.call_approval_decide(&req.id, ApprovalState::Approved, "ana", None),
                b.call_approval_decide(&req.id, ApprovalState::Denied, "bo", Some("no")),
            );
            let (x, y) = (x.unwrap(), y.unwrap());
            let winner = match (&x, &y) {
                (Decide::Decided(w), Decide::AlreadyDecided(l))
                | (Decide::AlreadyDecided(l), Decide::Decided(w)) => {
                    assert_eq!(w, l, "round {round}: the loser sees the winner's decision");
                    w.clone()
                }
                other => panic!("round {round}: {other:?}"),
            };
            assert_eq!(a.call_approval(&req.id).await.unwrap(), Some(winner));
        }
    }
}
