//! Agent memory on PostgreSQL: the SQLite store's behaviour, through tsvector.

use plugd_store::memory::MAX_MEMORY_BYTES;

use super::backends;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_is_scoped_ranked_and_capped() {
    for be in backends().await {
        let s = &be.a;
        s.memory_add("a1", "user prefers concise answers", &["preference".into()])
            .await
            .unwrap();
        s.memory_add("a1", "the deploy runs on Fridays", &[])
            .await
            .unwrap();
        s.memory_add("a2", "user prefers long answers", &[])
            .await
            .unwrap();
        let hits = s
            .memory_search("a1", "concise answers?", None)
            .await
            .unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].content, "user prefers concise answers");
        assert_eq!(hits[0].tags, vec!["preference".to_string()]);
        assert!(hits[0].id.starts_with("mem_") && hits[0].id.len() == 20);
        assert_eq!(hits[0].created_at.len(), 20);
        // Tags are searched too; other agents' entries never show; case does not matter.
        assert_eq!(
            s.memory_search("a1", "PREFERENCE", None)
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            s.memory_search("a2", "concise", None).await.unwrap().len(),
            0
        );
        // Best first: two matching words outrank one.
        s.memory_add("a1", "answers about fridays", &[])
            .await
            .unwrap();
        let ranked = s
            .memory_search("a1", "concise answers", None)
            .await
            .unwrap();
        assert_eq!(ranked[0].content, "user prefers concise answers");
        for i in 0..20 {
            s.memory_add("a3", &format!("note {i} about cats"), &[])
                .await
                .unwrap();
        }
        assert_eq!(s.memory_search("a3", "cats", None).await.unwrap().len(), 10);
        assert_eq!(
            s.memory_search("a3", "cats", Some(5000))
                .await
                .unwrap()
                .len(),
            20
        );
        assert_eq!(
            s.memory_list("a3", 3).await.unwrap()[0].content,
            "note 19 about cats"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_syntax_never_errors() {
    for be in backends().await {
        let s = &be.a;
        s.memory_add("a", "alpha beta", &[]).await.unwrap();
        for q in [
            "\"",
            "alpha\" OR",
            "NEAR(",
            "*",
            "a:b",
            ")",
            "-alpha",
            "",
            "   ",
            "ümlaut",
            "!alpha",
            "alpha & | beta",
            "'",
            "\\",
            "a:*",
            "<->",
            "½",
        ] {
            s.memory_search("a", q, None).await.unwrap();
        }
        assert_eq!(
            s.memory_search("a", "\"alpha\"", None).await.unwrap().len(),
            1
        );
        assert_eq!(
            s.memory_search("a", "!alpha", None).await.unwrap().len(),
            1,
            "no negation"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_reason() {
    for be in backends().await {
        let s = &be.a;
        let e = s
            .memory_add("bad agent", "x", &[])
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent id"), "{e}");
        assert!(s.memory_add("a", "  ", &[]).await.is_err());
        assert!(
            s.memory_add("a", &"x".repeat(MAX_MEMORY_BYTES + 1), &[])
                .await
                .is_err()
        );
        assert!(s.memory_add("a", "x", &["".into()]).await.is_err());
        assert!(
            s.memory_add("a", "x", &vec!["t".to_string(); 33])
                .await
                .is_err()
        );
        assert!(s.memory_add("a", "a\0b", &[]).await.is_err());
        assert!(s.memory_search("", "x", None).await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_entries_leave_the_index() {
    for be in backends().await {
        let s = &be.a;
        let e = s.memory_add("a", "forget me", &[]).await.unwrap();
        assert_eq!(s.memory_get(&e.id).await.unwrap(), Some(e.clone()));
        assert!(s.memory_delete(&e.id).await.unwrap());
        assert_eq!(s.memory_get(&e.id).await.unwrap(), None);
        assert!(!s.memory_delete(&e.id).await.unwrap());
        assert!(
            s.memory_search("a", "forget", None)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
