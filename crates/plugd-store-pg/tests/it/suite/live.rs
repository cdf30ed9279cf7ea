//! Live sessions, login codes and the control epoch through `Arc<dyn StateStore>`, on both backends (SQLite and PostgreSQL), and their races across two connections.

use plugd_control::store::live::{Lifetime, LiveKind, MAX_CODES};
use plugd_control::store::{Approval, Role};
use serde_json::json;

use super::backends;

const LONG: Lifetime = Lifetime {
    idle_ms: 3_600_000,
    max_age_ms: None,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_round_trip_are_owned_expire_and_end_on_both_backends() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        let data = json!({"protocol_version": "2025-11-25", "client": {"name": "c"}});
        a.live_session_put(LiveKind::Mcp, "sess-1", "token:ana", Some("dev"), &data)
            .await
            .unwrap();
        // The other connection sees it; the other kind does not.
        let got = b
            .live_session_get(LiveKind::Mcp, "sess-1", LONG)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: the session is not seen by the other connection"));
        assert_eq!(got.owner, "token:ana", "{name}");
        assert_eq!(got.profile.as_deref(), Some("dev"), "{name}");
        assert_eq!(got.data, data, "{name}");
        assert!(got.used_ms >= got.created_ms, "{name}");
        assert!(
            b.live_session_get(LiveKind::Console, "sess-1", LONG)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
        assert!(
            b.live_session_get(LiveKind::Mcp, "sess-2", LONG)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
        assert_eq!(
            b.live_sessions_held(LiveKind::Mcp, "token:ana", LONG)
                .await
                .unwrap(),
            1,
            "{name}"
        );
        assert_eq!(
            b.live_sessions_held(LiveKind::Mcp, "token:bob", LONG)
                .await
                .unwrap(),
            0,
            "{name}"
        );
        assert!(
            b.live_session_touch(LiveKind::Mcp, "sess-1").await.unwrap(),
            "{name}"
        );
        assert!(
            !b.live_session_touch(LiveKind::Mcp, "nope").await.unwrap(),
            "{name}"
        );

        // Expired by idleness: deleted on read, gone for every later reader.
        a.live_session_put(
            LiveKind::Console,
            "c-1",
            "owner:root",
            None,
            &json!({"csrf": "x"}),
        )
        .await
        .unwrap();
        let idle0 = Lifetime {
            idle_ms: 0,
            max_age_ms: None,
        };
        assert!(
            b.live_session_get(LiveKind::Console, "c-1", idle0)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
        assert!(
            a.live_session_get(LiveKind::Console, "c-1", LONG)
                .await
                .unwrap()
                .is_none(),
            "{name}: an expired session was left behind"
        );
        // Expired by age though used now.
        a.live_session_put(LiveKind::Console, "c-2", "owner:root", None, &json!({}))
            .await
            .unwrap();
        let aged = Lifetime {
            idle_ms: 3_600_000,
            max_age_ms: Some(0),
        };
        assert!(
            b.live_session_get(LiveKind::Console, "c-2", aged)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );

        // Sweep takes only the expired ones of its kind.
        a.live_session_put(LiveKind::Console, "c-3", "owner:root", None, &json!({}))
            .await
            .unwrap();
        assert_eq!(
            b.live_sessions_sweep(LiveKind::Console, idle0)
                .await
                .unwrap(),
            1,
            "{name}"
        );
        assert!(
            b.live_session_get(LiveKind::Mcp, "sess-1", LONG)
                .await
                .unwrap()
                .is_some(),
            "{name}: sweeping console sessions ended an MCP one"
        );
        assert!(
            a.live_session_delete(LiveKind::Mcp, "sess-1")
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            !b.live_session_delete(LiveKind::Mcp, "sess-1")
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            b.live_session_get(LiveKind::Mcp, "sess-1", LONG)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );

        // Oversized data and NUL in names are refused, not stored.
        let big = json!("x".repeat(70 * 1024));
        assert!(
            a.live_session_put(LiveKind::Mcp, "s", "o", None, &big)
                .await
                .is_err(),
            "{name}"
        );
        assert!(
            a.live_session_put(LiveKind::Mcp, "s", "o\0", None, &json!({}))
                .await
                .is_err(),
            "{name}"
        );
        assert!(
            a.live_session_get(LiveKind::Mcp, "s", LONG)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_code_raced_on_two_connections_logs_in_exactly_once() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        for round in 0..20 {
            let code = format!("code-{round}");
            a.login_code_put(&code, "root", 600_000).await.unwrap();
            let tries: Vec<_> = (0..3)
                .map(|i| {
                    let s = if i % 2 == 0 { a.clone() } else { b.clone() };
                    let code = code.clone();
                    tokio::spawn(async move { s.login_code_redeem(&code).await.unwrap() })
                })
                .collect();
            let mut won = 0;
            for t in tries {
                if let Some(user) = t.await.unwrap() {
                    assert_eq!(user, "root", "{name}");
                    won += 1;
                }
            }
            assert_eq!(
                won, 1,
                "{name}: round {round}: the code logged in {won} times"
            );
        }
        // An expired code is spent but gives nothing.
        a.login_code_put("old", "root", 0).await.unwrap();
        assert_eq!(b.login_code_redeem("old").await.unwrap(), None, "{name}");
        // At most MAX_CODES wait: the oldest go first.
        // (Codes minted within one millisecond have no order among them.)
        for i in 0..MAX_CODES + 4 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            a.login_code_put(&format!("many-{i}"), "root", 600_000)
                .await
                .unwrap();
        }
        for i in 0..4 {
            assert_eq!(
                b.login_code_redeem(&format!("many-{i}")).await.unwrap(),
                None,
                "{name}: code {i} outlived the bound"
            );
        }
        for i in 4..MAX_CODES + 4 {
            assert_eq!(
                b.login_code_redeem(&format!("many-{i}"))
                    .await
                    .unwrap()
                    .as_deref(),
                Some("root"),
                "{name}: code {i}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_epoch_moves_with_every_consent_change_seen_by_the_other_connection() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        let mut last = b.control_epoch().await.unwrap();
        let mut moved = |now: i64, what: &str| {
            assert!(
                now > last,
                "{name}: {what} did not move the epoch ({last} -> {now})"
            );
            last = now;
        };
        let token = a
            .token_create("ci", Role::Operator, None, "test")
            .await
            .unwrap();
        moved(b.control_epoch().await.unwrap(), "a token create");
        // Using a token stamps its last use: not a change of consent.
        let before = b.control_epoch().await.unwrap();
        assert!(
            a.token_verify(&token.token).await.unwrap().is_ok(),
            "{name}"
        );
        assert_eq!(
            b.control_epoch().await.unwrap(),
            before,
            "{name}: a token's use moved the epoch"
        );
        // A refused write (same live name) leaves it as it was.
        assert!(
            a.token_create("ci", Role::Viewer, None, "test")
                .await
                .is_err(),
            "{name}"
        );
        assert_eq!(
            b.control_epoch().await.unwrap(),
            before,
            "{name}: a refused write moved the epoch"
        );
        a.token_revoke("ci").await.unwrap();
        moved(b.control_epoch().await.unwrap(), "a token revoke");
        let approval = Approval {
            plugin_id: "acme".into(),
            digest: "sha256:1".into(),
            approved_by: "ana".into(),
            approved_at: "2026-01-01T00:00:00Z".into(),
            catalog: json!([]),
        };
        a.approve(&approval).await.unwrap();
        moved(b.control_epoch().await.unwrap(), "an approval");
        a.tool_disable("acme", "acme_t", "ana").await.unwrap();
        moved(b.control_epoch().await.unwrap(), "disabling a tool");
        a.tool_enable("acme", "acme_t").await.unwrap();
        moved(b.control_epoch().await.unwrap(), "enabling a tool");
        a.config_set_plain("acme", "mode", &json!("fast"))
            .await
            .unwrap();
        moved(b.control_epoch().await.unwrap(), "a config value");
        a.revoke("acme").await.unwrap();
        moved(b.control_epoch().await.unwrap(), "a revoke");
        // Other state does not move it.
        let before = b.control_epoch().await.unwrap();
        a.kv_set("database", "k", &json!(1)).await.unwrap();
        a.live_session_put(LiveKind::Mcp, "s", "o", None, &json!({}))
            .await
            .unwrap();
        assert_eq!(
            b.control_epoch().await.unwrap(),
            before,
            "{name}: storage or sessions moved the epoch"
        );
    }
}
