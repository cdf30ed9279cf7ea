//! Invocation records on both backends: filters, cursor pages, retention, a batch raced.

use std::sync::Arc;

use std::collections::BTreeSet;

use plugd_control::invocations::{
    Cursor, InvocationFilter, InvocationRecord, Order, TerminalStatus,
};
use plugd_control::store::StateStore;

use super::backends;

pub(crate) use plugd_control::samples::invocation as rec;

/// 50 records over 20 distinct start times (ties broken by id).
async fn fill(store: &Arc<dyn StateStore>) {
    let batch: Vec<_> = (0..50usize)
        .map(|n| {
            let status = if n.is_multiple_of(5) {
                TerminalStatus::Failed
            } else {
                TerminalStatus::Succeeded
            };
            rec(n, 1_000 + (n as i64 % 20), ["p", "q"][n % 2], status)
        })
        .collect();
    store.append_invocations(&batch).await.unwrap();
    store.append_invocations(&batch[..10]).await.unwrap();
}

async fn list(store: &Arc<dyn StateStore>, f: InvocationFilter) -> Vec<InvocationRecord> {
    store
        .list_invocations(&InvocationFilter { limit: 500, ..f })
        .await
        .unwrap()
        .invocations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_limited_listing_shows_no_project_and_its_projects() {
    for be in backends().await {
        let store = &be.a;
        let batch: Vec<_> = [None, Some("p1"), Some("p2"), Some("p3")]
            .iter()
            .enumerate()
            .map(|(n, p)| {
                let mut r = rec(n, 1_000 + n as i64, "p", TerminalStatus::Succeeded);
                r.project_id = p.map(str::to_owned);
                r
            })
            .collect();
        store.append_invocations(&batch).await.unwrap();
        let ids = async |projects: Vec<&str>| -> Vec<Option<String>> {
            let filter = InvocationFilter {
                project_in: Some(projects.into_iter().map(str::to_owned).collect()),
                ..InvocationFilter::default()
            };
            let mut got: Vec<_> = list(store, filter)
                .await
                .into_iter()
                .map(|r| r.project_id)
                .collect();
            got.sort();
            got
        };
        assert_eq!(
            ids(vec!["p1", "p3"]).await,
            [None, Some("p1".to_owned()), Some("p3".to_owned())]
        );
        assert_eq!(ids(vec![]).await, [None]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_round_trips_by_id_and_pages_cover_every_record_once_in_order() {
    for be in backends().await {
        let store = &be.a;
        fill(store).await;
        let got = store.invocation("inv_0007").await.unwrap().unwrap();
        assert_eq!(got, rec(7, 1_007, "q", TerminalStatus::Succeeded));
        assert_eq!(store.invocation("inv_nope").await.unwrap(), None);
        let mut filter = InvocationFilter {
            limit: 7,
            ..InvocationFilter::default()
        };
        let mut seen = Vec::new();
        loop {
            let page = store.list_invocations(&filter).await.unwrap();
            assert!(page.invocations.len() <= 7);
            seen.extend(page.invocations);
            match page.next_cursor {
                Some(c) => filter.cursor = Some(Cursor::decode(&c).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen.len(), 50);
        let ids: BTreeSet<_> = seen.iter().map(|r| r.invocation_id.clone()).collect();
        assert_eq!(ids.len(), 50, "no duplicates");
        let keys: Vec<_> = seen
            .iter()
            .map(|r| (r.started_ms, r.invocation_id.clone()))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(keys, sorted, "newest first, ties by id");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_combine_and_retention_deletes_only_older_records() {
    for be in backends().await {
        let store = &be.a;
        fill(store).await;
        let failed = list(
            store,
            InvocationFilter {
                status: Some(TerminalStatus::Failed),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(failed.len(), 10);
        let q = list(
            store,
            InvocationFilter {
                plugin_id: Some("q".into()),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(q.len(), 25);
        assert!(q.iter().all(|r| r.org_id.as_deref() == Some("org_b")));
        let by_export = list(
            store,
            InvocationFilter {
                tool: Some("t1".into()),
                ..Default::default()
            },
        )
        .await;
        let by_name = list(
            store,
            InvocationFilter {
                tool: Some("p/t1".into()),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(by_export.len(), 17);
        assert!(!by_name.is_empty() && by_name.iter().all(|r| r.plugin_id == "p"));
        let window = list(
            store,
            InvocationFilter {
                since_ms: Some(1_005),
                until_ms: Some(1_010),
                org_id: Some("org_a".into()),
                ..Default::default()
            },
        )
        .await;
        assert!(!window.is_empty());
        assert!(window.iter().all(
            |r| (1_005..1_010).contains(&r.started_ms) && r.org_id.as_deref() == Some("org_a")
        ));
        assert!(
            list(
                store,
                InvocationFilter {
                    project_id: Some("none".into()),
                    ..Default::default()
                }
            )
            .await
            .is_empty()
        );
        assert_eq!(store.delete_invocations_before(1_010).await.unwrap(), 30);
        let left = list(store, InvocationFilter::default()).await;
        assert_eq!(left.len(), 20);
        assert!(left.iter().all(|r| r.started_ms >= 1_010));
        assert_eq!(store.delete_invocations_before(1_010).await.unwrap(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_written_by_two_nodes_at_once_is_stored_once() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        let batch: Vec<_> = (0..100)
            .map(|n| rec(n, 2_000 + n as i64, "p", TerminalStatus::Succeeded))
            .collect();
        let (x, y) = tokio::join!(a.append_invocations(&batch), b.append_invocations(&batch));
        x.unwrap();
        y.unwrap();
        assert_eq!(list(a, InvocationFilter::default()).await.len(), 100);
    }
}

/// 2,000 records over 200 start times: one whose caller and error code
/// are unusual (`inv_1234`), every 7th failed.
async fn crowd(store: &Arc<dyn StateStore>) {
    let batch: Vec<_> = (0..2_000usize)
        .map(|n| {
            let status = if n.is_multiple_of(7) {
                TerminalStatus::Failed
            } else {
                TerminalStatus::Succeeded
            };
            let mut r = rec(n, 10_000 + (n as i64 % 200), ["p", "q"][n % 2], status);
            r.duration_ms = n as u64 % 100;
            if n == 1234 {
                r.caller = Some("token:Needle".into());
                r.error_code = Some("Quota_Burst".into());
            }
            r
        })
        .collect();
    for chunk in batch.chunks(500) {
        store.append_invocations(chunk).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_caller_and_both_orders_find_and_page_alike() {
    for be in backends().await {
        let store = &be.a;
        let name = be.name;
        crowd(store).await;
        let ids = |rs: Vec<InvocationRecord>| -> Vec<String> {
            rs.into_iter().map(|r| r.invocation_id).collect()
        };
        for f in [
            InvocationFilter {
                q: Some("NEEDLE".into()),
                ..Default::default()
            },
            InvocationFilter {
                q: Some("burst".into()),
                ..Default::default()
            },
            InvocationFilter {
                q: Some("inv_1234".into()),
                ..Default::default()
            },
            InvocationFilter {
                caller: Some("token:Needle".into()),
                ..Default::default()
            },
        ] {
            assert_eq!(
                ids(list(store, f.clone()).await),
                ["inv_1234"],
                "{name}: {f:?}"
            );
        }
        let none = list(
            store,
            InvocationFilter {
                caller: Some("token:needle".into()),
                ..Default::default()
            },
        )
        .await;
        assert!(none.is_empty(), "{name}: caller is exact");
        // q over the plugin and the error code, with other filters.
        let failed_q = list(
            store,
            InvocationFilter {
                q: Some("TOOL_FAILED".into()),
                plugin_id: Some("q".into()),
                ..Default::default()
            },
        )
        .await;
        // Odd multiples of 7 under 2,000: 143.
        assert_eq!(failed_q.len(), 143, "{name}");
        // Every record once in each order, keys strictly monotone.
        for order in [Order::NewestFirst, Order::OldestFirst] {
            let mut f = InvocationFilter {
                order,
                limit: 77,
                ..Default::default()
            };
            let mut keys = Vec::new();
            loop {
                let page = store.list_invocations(&f).await.unwrap();
                keys.extend(
                    page.invocations
                        .iter()
                        .map(|r| (r.started_ms, r.invocation_id.clone())),
                );
                match page.next_cursor {
                    Some(c) => f.cursor = Some(Cursor::decode(&c).unwrap()),
                    None => break,
                }
            }
            assert_eq!(keys.len(), 2_000, "{name} {order:?}");
            let ascending = keys.windows(2).all(|w| w[0] < w[1]);
            let descending = keys.windows(2).all(|w| w[0] > w[1]);
            assert!(
                if order == Order::OldestFirst {
                    ascending
                } else {
                    descending
                },
                "{name} {order:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn points_are_the_filtered_records_newest_first_and_bounded() {
    for be in backends().await {
        let store = &be.a;
        let name = be.name;
        crowd(store).await;
        let all = store
            .invocation_points(&InvocationFilter::default(), 10_000)
            .await
            .unwrap();
        assert_eq!(all.len(), 2_000, "{name}");
        assert!(all.windows(2).all(|w| w[0].started_ms >= w[1].started_ms));
        let durations: u64 = all.iter().map(|p| p.duration_ms).sum();
        assert_eq!(durations, 20 * (0..100).sum::<u64>(), "{name}");
        let failed = all
            .iter()
            .filter(|p| p.status == TerminalStatus::Failed)
            .count();
        assert_eq!(failed, 286, "{name}");
        assert!(
            all.iter()
                .all(|p| p.tool.starts_with(&format!("{}/t", p.plugin_id)))
        );
        // The filters of a list apply; the limit bounds it.
        let window = store
            .invocation_points(
                &InvocationFilter {
                    plugin_id: Some("q".into()),
                    since_ms: Some(10_100),
                    until_ms: Some(10_150),
                    org_id: Some("org_b".into()),
                    ..Default::default()
                },
                10_000,
            )
            .await
            .unwrap();
        // Odd n with n % 200 in 100..150: 25 of every 200.
        assert_eq!(window.len(), 250, "{name}");
        assert!(
            window
                .iter()
                .all(|p| p.plugin_id == "q" && (10_100..10_150).contains(&p.started_ms))
        );
        let capped = store
            .invocation_points(&InvocationFilter::default(), 10)
            .await
            .unwrap();
        assert_eq!(capped.len(), 10, "{name}");
        assert_eq!(capped[0].started_ms, 10_199);
    }
}
