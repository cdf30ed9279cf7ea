//! Sessions, chains, runs and compactions on PostgreSQL: the SQLite store's
//! behaviour, and appends and compactions raced from several connections.

use std::sync::Arc;

use plugd_control::chains::{
    BlockKind, ChainStatus, Compaction, NewBlock, Run, RunKind, RunPatch, RunStatus, ScopeFilter,
};
use plugd_control::store::{StateStore, StoreError};
use serde_json::{Value, json};

use super::backends;

pub(crate) fn compaction(session: &str, source: &str, n: u32) -> Compaction {
    Compaction {
        id: format!("cmp_{source}_{n}"),
        session_id: session.into(),
        source_chain_id: source.into(),
        derived_chain_id: None,
        compactor: "acme/kit/window".into(),
        status: "succeeded".into(),
        token_estimate: 99,
        summary: json!({"text": "s"}),
        diagnostics: json!({}),
        error: None,
        run_id: None,
        created_at: "2026-01-01T00:00:00Z".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_append_derive_and_keep_lineage() {
    for be in backends().await {
        let store = &be.a;
        let (s, created) = store.session_open("s1", Some("org"), None).await.unwrap();
        assert!(created);
        assert_eq!(s.created_at.len(), 20, "{}", s.created_at);
        let (again, created) = store.session_open("s1", None, None).await.unwrap();
        assert!(!created);
        assert_eq!(again, s, "reopening changes nothing");
        let head = s.head_chain_id.clone().unwrap();
        assert_eq!(head, "ch_s1");
        let seqs = store
            .chain_append(
                &head,
                &[
                    NewBlock::text(BlockKind::Input, "hi"),
                    NewBlock::text(BlockKind::Output, "yo"),
                ],
                "agent",
            )
            .await
            .unwrap();
        assert_eq!(seqs, [1, 2]);
        let more = store
            .chain_append(&head, &[NewBlock::text(BlockKind::Input, "again")], "t")
            .await
            .unwrap();
        assert_eq!(more, [3]);
        let blocks = store.chain_blocks(&head, 1, 10).await.unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].text(), "yo");
        assert_eq!(blocks[1].created_by.as_deref(), Some("t"));

        let c = compaction("s1", &head, 0);
        let derived = store
            .chain_derive(&head, &[NewBlock::text(BlockKind::System, "seed")], &c)
            .await
            .unwrap();
        assert!(
            derived.id.starts_with("ch_") && derived.id.len() == 35,
            "{}",
            derived.id
        );
        assert_eq!(derived.parent_chain_id.as_deref(), Some(head.as_str()));
        assert_eq!(derived.blocks, 1);
        let info = store.session_info("s1").await.unwrap().unwrap();
        assert_eq!(info.head_chain_id.as_deref(), Some(derived.id.as_str()));
        let old = store.chain(&head).await.unwrap().unwrap();
        assert_eq!(old.status, ChainStatus::Superseded);
        assert_eq!(old.blocks, 3, "the source is never rewritten");
        let e = store
            .chain_append(&head, &[NewBlock::text(BlockKind::Input, "x")], "t")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("compacted"), "{e}");
        let e = store
            .chain_derive(&head, &[], &compaction("s1", &head, 1))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no longer"), "{e}");
        let list = store.compactions("s1").await.unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(
            list[0].derived_chain_id.as_deref(),
            Some(derived.id.as_str())
        );
        let chains = store.session_chains("s1").await.unwrap();
        assert_eq!(
            chains.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            [head.as_str(), derived.id.as_str()],
            "oldest first, also within one second"
        );
        assert!(matches!(
            store.chain_append("ch_nope", &[], "t").await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            store.session_open("bad id", None, None).await,
            Err(StoreError::Invalid { .. })
        ));
    }
}

pub(crate) fn run(id: &str, session: &str, parent: Option<&str>) -> Run {
    Run {
        id: id.into(),
        session_id: session.into(),
        chain_id: None,
        parent_run_id: parent.map(str::to_owned),
        depth: u32::from(parent.is_some()),
        kind: RunKind::External,
        harness: None,
        mode: None,
        status: RunStatus::Running,
        input: json!({}),
        checkpoint: Value::Null,
        summary: Value::Null,
        artifacts: json!([]),
        error: None,
        created_by: "t".into(),
        created_at: "2026-01-01T00:00:00Z".into(),
        ended_at: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_end_once_and_filter_by_scope() {
    for be in backends().await {
        let store = &be.a;
        store
            .session_open("a", Some("o1"), Some("p1"))
            .await
            .unwrap();
        store.session_open("b", Some("o2"), None).await.unwrap();
        store.session_open("w", None, None).await.unwrap();
        store.run_create(&run("r1", "a", None)).await.unwrap();
        store.run_create(&run("r2", "a", Some("r1"))).await.unwrap();
        store.run_create(&run("r3", "b", None)).await.unwrap();
        assert_eq!(store.child_runs("r1").await.unwrap(), 1);
        let done = store
            .run_update(
                "r1",
                &RunPatch {
                    status: Some(RunStatus::Succeeded),
                    summary: Some(json!({"text": "ok"})),
                    ..RunPatch::default()
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.status, RunStatus::Succeeded);
        assert!(done.ended_at.is_some());
        let again = store
            .run_update(
                "r1",
                &RunPatch {
                    status: Some(RunStatus::Failed),
                    summary: Some(json!({"text": "late"})),
                    ..RunPatch::default()
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            again.status,
            RunStatus::Succeeded,
            "an ended run stays ended"
        );
        assert_eq!(again.ended_at, done.ended_at);
        assert_eq!(
            again.summary,
            json!({"text": "late"}),
            "outputs may still land"
        );
        let o1 = ScopeFilter {
            org_id: Some("o1".into()),
            ..ScopeFilter::default()
        };
        let ids: Vec<String> = store
            .runs(&o1, None, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids.len(), 2);
        assert!(!ids.contains(&"r3".to_owned()));
        assert_eq!(
            store
                .runs(&ScopeFilter::default(), Some("b"), 10)
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            store
                .runs(&ScopeFilter::default(), None, 2)
                .await
                .unwrap()
                .len(),
            2
        );
        assert!(
            store
                .run_update("nope", &RunPatch::default())
                .await
                .unwrap()
                .is_none()
        );
        let names = async |scope: ScopeFilter| -> Vec<String> {
            store
                .sessions(&scope, 10, None)
                .await
                .unwrap()
                .into_iter()
                .map(|s| s.id)
                .collect()
        };
        assert_eq!(names(o1.clone()).await, ["a"]);
        let p2 = ScopeFilter {
            project_ids: vec!["p2".into()],
            ..o1.clone()
        };
        assert!(names(p2).await.is_empty());
        let workspace = ScopeFilter {
            workspace_only: true,
            ..ScopeFilter::default()
        };
        assert_eq!(names(workspace).await, ["w"]);
        let mut all = names(ScopeFilter::default()).await;
        all.sort();
        assert_eq!(all, ["a", "b", "w"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raced_appends_and_compactions_keep_order_and_one_winner() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        let nodes = [a.clone(), b.clone()];
        let (s, _) = nodes[0].session_open("race", None, None).await.unwrap();
        let head = s.head_chain_id.unwrap();
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let store: Arc<dyn StateStore> = nodes[t % 2].clone();
                let head = head.clone();
                tokio::spawn(async move {
                    let mut seqs = Vec::new();
                    for i in 0..25 {
                        let got = store
                            .chain_append(
                                &head,
                                &[
                                    NewBlock::text(BlockKind::Input, format!("{t}/{i}")),
                                    NewBlock::text(BlockKind::Output, format!("{t}/{i}")),
                                ],
                                "t",
                            )
                            .await
                            .unwrap();
                        seqs.extend(got);
                    }
                    seqs
                })
            })
            .collect();
        let mut seqs = Vec::new();
        for t in tasks {
            seqs.extend(t.await.unwrap());
        }
        seqs.sort_unstable();
        assert_eq!(
            seqs,
            (1..=400).collect::<Vec<u64>>(),
            "every seq once, none lost"
        );
        let blocks = nodes[1].chain_blocks(&head, 0, 1000).await.unwrap();
        for pair in blocks.chunks(2) {
            assert_eq!(
                pair[0].text(),
                pair[1].text(),
                "a pair appended together stays together"
            );
        }
        // Two compactions of the same head on two nodes at once: exactly one wins.
        let seed = [NewBlock::text(BlockKind::System, "s")];
        let (c1, c2) = (compaction("race", &head, 1), compaction("race", &head, 2));
        let (x, y) = tokio::join!(
            nodes[0].chain_derive(&head, &seed, &c1),
            nodes[1].chain_derive(&head, &seed, &c2),
        );
        assert_eq!(
            usize::from(x.is_ok()) + usize::from(y.is_ok()),
            1,
            "{x:?} {y:?}"
        );
        assert_eq!(nodes[0].session_chains("race").await.unwrap().len(), 2);
        assert_eq!(nodes[0].compactions("race").await.unwrap().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_opening_one_session_make_one_first_chain() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        for n in 0..10 {
            let id = format!("s{n}");
            let (x, y) = tokio::join!(
                a.session_open(&id, None, None),
                b.session_open(&id, None, None)
            );
            let ((x, cx), (y, cy)) = (x.unwrap(), y.unwrap());
            assert_eq!(x, y);
            assert!(cx ^ cy, "one of them created it");
            assert_eq!(a.session_chains(&id).await.unwrap().len(), 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_ending_one_run_at_once_record_one_end() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        a.session_open("s", None, None).await.unwrap();
        for n in 0..10 {
            let id = format!("r{n}");
            a.run_create(&run(&id, "s", None)).await.unwrap();
            let ok = RunPatch {
                status: Some(RunStatus::Succeeded),
                ..RunPatch::default()
            };
            let failed = RunPatch {
                status: Some(RunStatus::Failed),
                error: Some("boom".into()),
                ..RunPatch::default()
            };
            let (x, y) = tokio::join!(a.run_update(&id, &ok), b.run_update(&id, &failed));
            let (x, y) = (x.unwrap().unwrap(), y.unwrap().unwrap());
            let end = a.run(&id).await.unwrap().unwrap();
            assert!(end.ended_at.is_some());
            // The loser saw the winner's end, and the error belongs to the failure only.
            assert_eq!(x.status, end.status, "round {n}");
            assert_eq!(y.status, end.status, "round {n}");
            assert_eq!(
                end.error.is_some(),
                end.status == RunStatus::Failed,
                "round {n}"
            );
        }
    }
}
