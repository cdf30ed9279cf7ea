//! Sessions as transcripts on PostgreSQL: the SQLite store's behaviour, and
//! an append that follows a compaction made meanwhile.

use plugd_control::chains::{BlockKind, Compaction, NewBlock};
use plugd_control::store::StoreError;
use serde_json::{Value, json};

use super::backends;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_round_trip_and_ids_are_checked() {
    for be in backends().await {
        let store = &be.a;
        let (row, created) = store.session_ensure("s_1").await.unwrap();
        assert!(created);
        assert_eq!(row.id, "s_1");
        let (again, created) = store.session_ensure("s_1").await.unwrap();
        assert!(!created);
        assert_eq!(again, row);
        store
            .session_append("s_1", &[json!({"role": "user", "content": "hi"})])
            .await
            .unwrap();
        store
            .session_append("s_1", &[json!({"role": "assistant", "content": "yo"})])
            .await
            .unwrap();
        let t = store.session_transcript("s_1").await.unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1]["content"], "yo");
        assert!(store.session_transcript("other").await.unwrap().is_empty());
        assert!(store.session_get("nope").await.unwrap().is_none());
        for bad in ["", "a/b", "has space", &"x".repeat(129)] {
            assert!(matches!(
                store.session_ensure(bad).await,
                Err(StoreError::Invalid { .. })
            ));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_list_newest_first_and_tails_are_bounded() {
    for be in backends().await {
        let store = &be.a;
        assert!(store.session_list(10).await.unwrap().is_empty());
        for id in ["a", "b", "c"] {
            store.session_ensure(id).await.unwrap();
        }
        assert_eq!(store.session_list(2).await.unwrap().len(), 2);
        let entries: Vec<Value> = (0..5)
            .map(|i| json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        store.session_append("b", &entries).await.unwrap();
        let (total, tail) = store.session_tail("b", 2).await.unwrap();
        assert_eq!(total, 5);
        let texts: Vec<&str> = tail
            .iter()
            .map(|e| e["content"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["m3", "m4"]);
        assert_eq!(store.session_tail("zz", 2).await.unwrap(), (0, Vec::new()));
        assert!(store.session_tail("a/b", 2).await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_round_trip_through_blocks_and_follow_the_head() {
    let entries = vec![
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "name": "a/t", "arguments": {"x": 1}},
            {"id": "c2", "name": "a/u", "arguments": {}}]}),
        json!({"role": "tool", "content": "r1", "tool_call_id": "c1"}),
        json!({"role": "tool", "content": "r2", "tool_call_id": "c2"}),
        json!({"role": "assistant", "content": "done"}),
        json!({"role": "system", "content": "turn blocked"}),
    ];
    for be in backends().await {
        let store = &be.a;
        store.session_ensure("rt").await.unwrap();
        store.session_append("rt", &entries).await.unwrap();
        let back = store.session_transcript("rt").await.unwrap();
        assert_eq!(back.len(), entries.len());
        for (a, b) in entries.iter().zip(&back) {
            assert_eq!(a["role"], b["role"]);
            assert_eq!(a["content"], b["content"]);
            assert_eq!(a.get("tool_calls"), b.get("tool_calls"), "{b}");
            assert_eq!(a.get("tool_call_id"), b.get("tool_call_id"));
        }
        // After a compaction the transcript is the new head's, and appends land there.
        let head = store.session_head("rt").await.unwrap();
        let c = Compaction {
            id: "cmp_1".into(),
            session_id: "rt".into(),
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
        store
            .chain_derive(&head, &[NewBlock::text(BlockKind::Input, "summary")], &c)
            .await
            .unwrap();
        store
            .session_append("rt", &[json!({"role": "user", "content": "next"})])
            .await
            .unwrap();
        let t = store.session_transcript("rt").await.unwrap();
        let texts: Vec<&str> = t.iter().map(|e| e["content"].as_str().unwrap()).collect();
        assert_eq!(texts, ["summary", "next"]);
    }
}
