//! The outbox on both backends: enqueue, lease, renew, ack, fail, backoff,
//! retry and dead letters; three workers on three connections never lease
//! one delivery twice; a dead worker's lease taken over after its TTL.

use std::sync::Arc;

use std::collections::HashSet;
use std::time::Duration;

use plugd_control::store::{StateStore, StoreError};
use plugd_store::outbox::{
    DeliveryStatus, FailOutcome, NewEvent, RetryOutcome, RetryPolicy, Subscriber,
};
use serde_json::json;

use super::backends;

const POLICY: RetryPolicy = RetryPolicy {
    base: Duration::from_millis(10),
    cap: Duration::from_millis(25),
    max_attempts: 3,
};

/// `n` subscribers of one plugin.
pub(crate) fn subs(n: usize) -> Vec<Subscriber> {
    (0..n)
        .map(|i| Subscriber {
            plugin_id: "acme/kit".into(),
            export_id: format!("h{i}"),
        })
        .collect()
}

/// An event of type `t` about a run.
pub(crate) fn event(t: &str) -> NewEvent {
    NewEvent {
        event_type: t.into(),
        subject: json!({"kind": "run", "id": "run_1"}),
        summary: json!({"task": "x"}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_event_type_records_nothing() {
    for be in backends().await {
        let s = &be.a;
        let e = s
            .outbox_enqueue(&event("Bad Type"), &subs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Invalid { .. }), "{e:?}");
        assert!(e.to_string().contains("event type \"Bad Type\""), "{e}");
        assert!(s.outbox_list(None).await.unwrap().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_lease_ack() {
    for be in backends().await {
        let s = &be.a;
        let q = s
            .outbox_enqueue(&event("run.completed"), &subs(2))
            .await
            .unwrap();
        assert_eq!(q.deliveries.len(), 2);
        assert_ne!(q.deliveries[0], q.deliveries[1]);
        assert!(q.deliveries[0].0.starts_with("del_") && q.deliveries[0].0.len() == 20);
        assert!(q.event_id.starts_with("evt_") && q.event_id.len() == 20);
        assert_eq!(q.event["type"], "run.completed");
        assert_eq!(q.event["subject"]["id"], "run_1");
        assert_eq!(
            s.outbox_events("run.completed").await.unwrap(),
            vec![q.event.clone()]
        );
        assert_eq!(s.outbox_next_due_in().await.unwrap(), Some(Duration::ZERO));

        let leased = s
            .outbox_lease("w1", Duration::from_secs(30), 10, 3)
            .await
            .unwrap();
        assert_eq!(leased.len(), 2);
        assert_eq!(
            leased[0].delivery.delivery_id, q.deliveries[0],
            "oldest due first"
        );
        assert_eq!(leased[0].delivery.attempt, 1);
        assert_eq!(leased[0].delivery.leased_by.as_deref(), Some("w1"));
        assert_eq!(leased[0].event, q.event);
        assert!(
            s.outbox_lease("w2", Duration::from_secs(30), 10, 3)
                .await
                .unwrap()
                .is_empty()
        );
        let wait = s.outbox_next_due_in().await.unwrap().unwrap();
        assert!(
            wait > Duration::from_secs(25),
            "{wait:?}: a leased delivery counts from its lease's end"
        );

        assert!(s.outbox_ack(leased[0].delivery.id).await.unwrap());
        assert!(!s.outbox_ack(leased[0].delivery.id).await.unwrap());
        let all = s.outbox_list(None).await.unwrap();
        assert_eq!(all[0].status, DeliveryStatus::Delivered);
        assert!(all[0].delivered_at.is_some() && all[0].next_attempt_at.is_none());
        assert_eq!(all[1].status, DeliveryStatus::Pending);
        assert_eq!(
            s.outbox_list(Some(DeliveryStatus::Pending))
                .await
                .unwrap()
                .len(),
            1
        );
        let by_key = s
            .outbox_delivery(&q.deliveries[1].0)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(by_key.delivery, all[1]);
        let by_row = s
            .outbox_delivery(&all[1].id.to_string())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(by_row.delivery, all[1]);
    }
}

/// Leases one delivery, retrying while none is due yet.
async fn lease_one(s: &Arc<dyn StateStore>, worker: &str, max: u32) -> plugd_store::outbox::Leased {
    for _ in 0..200 {
        if let Some(l) = s
            .outbox_lease(worker, Duration::from_secs(30), 1, max)
            .await
            .unwrap()
            .pop()
        {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("nothing became due")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_then_die_and_retry_resets_the_budget() {
    for be in backends().await {
        let s = &be.a;
        let q = s
            .outbox_enqueue(&event("tool.completed"), &subs(1))
            .await
            .unwrap();
        let mut delays = Vec::new();
        for attempt in 1..=3u32 {
            let l = lease_one(s, "w", 3).await;
            assert_eq!(l.delivery.attempt, attempt);
            assert_eq!(l.delivery.delivery_id, q.deliveries[0]);
            match s
                .outbox_fail(l.delivery.id, "w", attempt, "boom", true, &POLICY)
                .await
                .unwrap()
            {
                FailOutcome::Retry { delay, .. } => delays.push(delay.as_millis()),
                FailOutcome::Dead => assert_eq!(attempt, 3),
                FailOutcome::LostLease => panic!("lost lease"),
            }
        }
        assert_eq!(delays, [10, 20]);
        let dead = s.outbox_list(Some(DeliveryStatus::Dead)).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].last_error.as_deref(), Some("boom"));
        assert!(
            s.outbox_lease("w", Duration::from_secs(30), 1, 3)
                .await
                .unwrap()
                .is_empty()
        );

        assert_eq!(
            s.outbox_retry("nope").await.unwrap(),
            RetryOutcome::NotFound
        );
        let RetryOutcome::Retried(d) = s.outbox_retry(&q.deliveries[0].0).await.unwrap() else {
            panic!("not retried")
        };
        assert_eq!(
            (d.status, d.attempt, d.budget_used),
            (DeliveryStatus::Pending, 3, 0)
        );
        assert!(matches!(
            s.outbox_retry(&d.id.to_string()).await.unwrap(),
            RetryOutcome::NotDead(_)
        ));
        let l = s
            .outbox_lease("w", Duration::from_secs(30), 1, 3)
            .await
            .unwrap();
        assert_eq!(l[0].delivery.attempt, 4, "attempt numbers carry on");
        assert_eq!(l[0].delivery.budget_used, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_retryable_failure_is_dead_at_once_and_a_stale_worker_writes_nothing() {
    for be in backends().await {
        let s = &be.a;
        s.outbox_enqueue(&event("run.completed"), &subs(2))
            .await
            .unwrap();
        let l = s
            .outbox_lease("w", Duration::from_secs(30), 2, 3)
            .await
            .unwrap();
        let (a, b) = (&l[0].delivery, &l[1].delivery);
        assert_eq!(
            s.outbox_fail(a.id, "w", 1, "bad input", false, &POLICY)
                .await
                .unwrap(),
            FailOutcome::Dead
        );
        assert_eq!(
            s.outbox_fail(b.id, "other", 1, "x", true, &POLICY)
                .await
                .unwrap(),
            FailOutcome::LostLease
        );
        assert!(
            !s.outbox_renew(b.id, "other", 1, Duration::from_secs(1))
                .await
                .unwrap()
        );
        assert!(
            s.outbox_renew(b.id, "w", 1, Duration::from_secs(1))
                .await
                .unwrap()
        );
        assert!(s.outbox_release(b.id, "w", 1).await.unwrap());
        let again = s
            .outbox_lease("w2", Duration::from_secs(30), 2, 3)
            .await
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].delivery.attempt, 2);
        assert_eq!(again[0].delivery.budget_used, 1, "a release does not count");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_and_counts_against_the_budget() {
    for be in backends().await {
        let s = &be.a;
        let q = s
            .outbox_enqueue(&event("run.completed"), &subs(1))
            .await
            .unwrap();
        let l = s
            .outbox_lease("dead-worker", Duration::from_millis(30), 1, 2)
            .await
            .unwrap();
        assert_eq!(l.len(), 1);
        assert!(s.outbox_next_due_in().await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(80)).await;
        let l = s
            .outbox_lease("w2", Duration::from_millis(30), 1, 2)
            .await
            .unwrap();
        assert_eq!(l[0].delivery.delivery_id, q.deliveries[0]);
        assert_eq!(l[0].delivery.attempt, 2);
        let err = l[0].delivery.last_error.as_deref().unwrap();
        assert!(
            err.contains("dead-worker") && err.contains("attempt 1"),
            "{err}"
        );
        // The dead worker's late failure report writes nothing.
        assert_eq!(
            s.outbox_fail(l[0].delivery.id, "dead-worker", 1, "late", true, &POLICY)
                .await
                .unwrap(),
            FailOutcome::LostLease
        );
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(
            s.outbox_lease("w3", Duration::from_secs(1), 1, 2)
                .await
                .unwrap()
                .is_empty()
        );
        let d = &s.outbox_list(Some(DeliveryStatus::Dead)).await.unwrap()[0];
        assert!(d.last_error.as_deref().unwrap().contains("w2"), "{d:?}");
        assert_eq!(s.outbox_next_due_in().await.unwrap(), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_subscribers_no_deliveries() {
    for be in backends().await {
        let s = &be.a;
        let q = s
            .outbox_enqueue(&event("session.created"), &[])
            .await
            .unwrap();
        assert!(q.deliveries.is_empty());
        assert!(s.outbox_list(None).await.unwrap().is_empty());
        assert_eq!(s.outbox_events("session.created").await.unwrap().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_on_three_connections_never_lease_one_delivery_twice() {
    for be in backends().await {
        let first = &be.a;
        let mut expected = HashSet::new();
        for _ in 0..30 {
            let q = first
                .outbox_enqueue(&event("run.completed"), &subs(10))
                .await
                .unwrap();
            expected.extend(q.deliveries.into_iter().map(|d| d.0));
        }
        let mut workers = Vec::new();
        for w in 0..3 {
            let store = be.connect().await;
            workers.push(tokio::spawn(async move {
                let worker = format!("w{w}");
                let mut got = Vec::new();
                let mut empty = 0;
                while empty < 3 {
                    let leased = store
                        .outbox_lease(&worker, Duration::from_secs(60), 7, 3)
                        .await
                        .unwrap();
                    if leased.is_empty() {
                        empty += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    empty = 0;
                    for l in leased {
                        assert_eq!(l.delivery.attempt, 1, "{l:?}");
                        assert_eq!(l.delivery.leased_by.as_deref(), Some(worker.as_str()));
                        got.push(l.delivery.delivery_id.0);
                    }
                }
                got
            }));
        }
        let mut seen = HashSet::new();
        let mut per_worker = Vec::new();
        for w in workers {
            let got = w.await.unwrap();
            per_worker.push(got.len());
            for id in got {
                assert!(seen.insert(id.clone()), "{}: {id} leased twice", be.name);
            }
        }
        assert_eq!(
            seen, expected,
            "{}: every delivery leased once ({per_worker:?} per worker)",
            be.name
        );
    }
}
