//! The input checks written once in `plugd_control::store`: both backends refuse the same inputs with the same messages.

use plugd_control::store::live::LiveKind;
use plugd_control::store::outbox::{NewEvent, Subscriber};
use plugd_control::store::vectors::VectorRecord;
use plugd_control::store::{Approval, StateStore};
use serde_json::json;

use super::backends;

/// Every shared check's refusal, as the caller sees it.
async fn refusals(s: &dyn StateStore) -> Vec<String> {
    let approval = Approval {
        plugin_id: String::new(),
        digest: "d".into(),
        approved_by: "ana".into(),
        approved_at: "2026-01-01T00:00:00Z".into(),
        catalog: json!([]),
    };
    let record = |id: &str, content: &str, embedding: Vec<f32>| VectorRecord {
        id: id.into(),
        content: content.into(),
        embedding,
        metadata: json!({}),
    };
    let event = NewEvent {
        event_type: "Bad Type".into(),
        subject: json!({}),
        summary: json!({}),
    };
    let subscriber = Subscriber {
        plugin_id: "p".into(),
        export_id: "h".into(),
    };
    let big = json!("x".repeat(1024 * 1024));
    vec![
        s.approve(&approval).await.unwrap_err().to_string(),
        s.mark_failed("", "x").await.unwrap_err().to_string(),
        s.kv_set("secrets", "k", &json!(1))
            .await
            .unwrap_err()
            .to_string(),
        s.kv_get("database", "").await.unwrap_err().to_string(),
        s.kv_set("database", "big", &big)
            .await
            .unwrap_err()
            .to_string(),
        s.config_set_plain("", "k", &json!(1))
            .await
            .unwrap_err()
            .to_string(),
        s.config_unset("p", "a\0b").await.unwrap_err().to_string(),
        s.org_secret_set("bad org", "x", "v")
            .await
            .unwrap_err()
            .to_string(),
        s.org_secret_set("acme", "x", "")
            .await
            .unwrap_err()
            .to_string(),
        s.session_open("bad id!", None, None)
            .await
            .unwrap_err()
            .to_string(),
        s.outbox_enqueue(&event, &[subscriber])
            .await
            .unwrap_err()
            .to_string(),
        s.memory_add("bad agent", "x", &[])
            .await
            .unwrap_err()
            .to_string(),
        s.memory_add("a", "a\0b", &[])
            .await
            .unwrap_err()
            .to_string(),
        s.memory_add("a", "x", &["".into()])
            .await
            .unwrap_err()
            .to_string(),
        s.vector_upsert("", &[]).await.unwrap_err().to_string(),
        s.vector_upsert("kb", &[record("r", "a\0b", vec![1.0])])
            .await
            .unwrap_err()
            .to_string(),
        s.vector_upsert("kb", &[record("r", "c", vec![f32::NAN])])
            .await
            .unwrap_err()
            .to_string(),
        s.vector_search("kb", &[1.0], 5, Some(&json!([1])))
            .await
            .unwrap_err()
            .to_string(),
        s.lease_acquire("", "h", 1000)
            .await
            .unwrap_err()
            .to_string(),
        s.live_session_put(LiveKind::Mcp, "x", &"o".repeat(513), None, &json!({}))
            .await
            .unwrap_err()
            .to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_refuse_the_same_inputs_with_the_same_messages() {
    let mut seen = Vec::new();
    for be in backends().await {
        seen.push((be.name, refusals(be.a.as_ref()).await));
    }
    let (_, sqlite) = &seen[0];
    let (_, postgres) = &seen[1];
    assert_eq!(sqlite, postgres);
    // The messages as they were before the checks moved.
    for expected in [
        "plugin id \"\": a plugin id must not be empty",
        "storage \"secrets\": the agent's storage is \"database\" or \"cache\"",
        "key \"\": a storage key is 1 to 512 bytes without NUL",
        "the value of \"big\" (1048578 bytes): a storage value is at most 1 MiB of JSON",
        "plugin id \"\": a plugin id must be non-empty and contain no NUL",
        "config key \"a\\0b\": a config key must be non-empty and contain no NUL",
        "the value of secret acme/x: a secret value must be 1 byte to 64 KiB",
        "session id \"bad id!\": use 1-128 characters of letters, digits, '-', '_' and '.'",
        "agent id \"bad agent\": use 1-128 characters of letters, digits, '-', '_', '.' and ':'",
        "memory content: it contains a NUL character; remove it",
        "tag \"\": tags are 1-64 bytes and not blank",
        "record \"r\": content must not contain NUL",
        "filter must be a JSON object of metadata keys and values",
    ] {
        assert!(
            sqlite.iter().any(|m| m.contains(expected)),
            "{expected:?} not in {sqlite:#?}"
        );
    }
    assert!(
        sqlite
            .iter()
            .any(|m| m.starts_with("event type \"Bad Type\": an event type is 1-128")),
        "{sqlite:#?}"
    );
}
