//! The vector index on PostgreSQL: the SQLite store's behaviour, and one
//! dimension per collection when two nodes create it at once.

use plugd_control::store::VectorStoreError as VectorError;
use plugd_store::vectors::VectorRecord;
use serde_json::{Value, json};

use super::backends;

fn rec(id: &str, e: &[f32], meta: Value) -> VectorRecord {
    VectorRecord {
        id: id.into(),
        content: format!("content of {id}"),
        embedding: e.to_vec(),
        metadata: meta,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosine_search_ranks_filters_and_replaces() {
    for be in backends().await {
        let s = &be.a;
        let n = s
            .vector_upsert(
                "kb",
                &[
                    rec("x", &[1.0, 0.0, 0.0], json!({"t": "a"})),
                    rec("y", &[0.0, 1.0, 0.0], json!({"t": "b"})),
                    rec("xy", &[1.0, 1.0, 0.0], json!({"t": "a"})),
                ],
            )
            .await
            .unwrap();
        assert_eq!(n, 3);
        let m = s
            .vector_search("kb", &[1.0, 0.1, 0.0], 2, None)
            .await
            .unwrap();
        assert_eq!(
            m.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
            ["x", "xy"]
        );
        assert!(m[0].score > 0.99 && m[0].score <= 1.0);
        assert_eq!(m[0].content, "content of x");
        let only_b = s
            .vector_search("kb", &[1.0, 0.0, 0.0], 10, Some(&json!({"t": "b"})))
            .await
            .unwrap();
        assert_eq!(only_b.len(), 1);
        assert_eq!(only_b[0].id, "y");
        assert!(only_b[0].score.abs() < 1e-6);
        s.vector_upsert("kb", &[rec("y", &[1.0, 0.0, 0.0], json!({"t": "b"}))])
            .await
            .unwrap();
        let top = s
            .vector_search("kb", &[1.0, 0.0, 0.0], 1, Some(&json!({"t": "b"})))
            .await
            .unwrap();
        assert!(top[0].score > 0.99);
        assert_eq!(
            s.vector_delete("kb", &["x".into(), "nope".into()])
                .await
                .unwrap(),
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_errors() {
    for be in backends().await {
        let s = &be.a;
        assert!(matches!(
            s.vector_search("missing", &[1.0], 1, None).await,
            Err(VectorError::CollectionNotFound { .. })
        ));
        assert!(matches!(
            s.vector_delete("missing", &[]).await,
            Err(VectorError::CollectionNotFound { .. })
        ));
        // A mixed first batch is refused whole and creates no collection.
        assert!(
            s.vector_upsert(
                "kb",
                &[
                    rec("ok", &[1.0, 0.0, 0.0], json!({})),
                    rec("bad", &[1.0], json!({}))
                ]
            )
            .await
            .is_err()
        );
        s.vector_upsert("kb", &[rec("a", &[1.0, 2.0], json!({}))])
            .await
            .unwrap();
        let e = s
            .vector_upsert("kb", &[rec("b", &[1.0, 2.0, 3.0], json!({}))])
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                VectorError::DimensionMismatch {
                    expected: 2,
                    got: 3
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "dimension mismatch: expected 2, got 3");
        assert!(matches!(
            s.vector_search("kb", &[1.0], 1, None).await,
            Err(VectorError::DimensionMismatch {
                expected: 2,
                got: 1
            })
        ));
        for bad in [vec![], vec![f32::NAN, 1.0]] {
            assert!(matches!(
                s.vector_upsert("kb", &[rec("c", &bad, json!({}))]).await,
                Err(VectorError::Invalid(_))
            ));
        }
        assert!(matches!(
            s.vector_upsert("kb", &[rec("c", &[1.0, 1.0], json!([1]))])
                .await,
            Err(VectorError::Invalid(_))
        ));
        assert!(matches!(
            s.vector_search("kb", &[1.0, 1.0], 1, Some(&json!("x")))
                .await,
            Err(VectorError::Invalid(_))
        ));
        assert!(
            s.vector_upsert(
                "kb",
                &[
                    rec("ok", &[1.0, 0.0], json!({})),
                    rec("bad", &[1.0], json!({}))
                ]
            )
            .await
            .is_err()
        );
        assert!(
            s.vector_search("kb", &[1.0, 0.0], 10, None)
                .await
                .unwrap()
                .iter()
                .all(|m| m.id != "ok")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_creating_one_collection_at_once_agree_on_its_dimension() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        for round in 0..10 {
            let name = format!("c{round}");
            let (two, three) = (
                [rec("p", &[1.0, 0.0], json!({}))],
                [rec("q", &[1.0, 0.0, 0.0], json!({}))],
            );
            let (x, y) = tokio::join!(a.vector_upsert(&name, &two), b.vector_upsert(&name, &three));
            let ok = [x.is_ok(), y.is_ok()];
            assert_eq!(
                ok.iter().filter(|o| **o).count(),
                1,
                "round {round}: {x:?} {y:?}"
            );
            let err = x.err().or(y.err()).unwrap();
            assert!(
                matches!(err, VectorError::DimensionMismatch { .. }),
                "{err:?}"
            );
            let dim = if ok[0] { 2 } else { 3 };
            let found = a
                .vector_search(&name, &vec![1.0; dim], 10, None)
                .await
                .unwrap();
            assert_eq!(found.len(), 1, "round {round}");
        }
    }
}
