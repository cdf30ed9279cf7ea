//! The outbox on PostgreSQL across server restarts: nothing lost (the rest
//! of the outbox runs on both backends in `suite::outbox`).

use std::collections::HashSet;
use std::time::Duration;

use crate::suite::outbox::{event, subs};
use plugd_store::outbox::DeliveryStatus;
use plugd_store_pg::{PgError, PgStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_outbox_drains_across_server_restarts_with_nothing_lost() {
    // Its own server: the restarts would disturb the other tests.
    let pg = plugd_store_pg::test_pg::TestPg::start().unwrap();
    let url = pg.fresh_database();
    let opts = plugd_store_pg::PgOptions {
        pool_size: 2,
        timeout: Duration::from_secs(2),
        op_timeout: Duration::from_secs(2),
    };
    let first = PgStore::connect(&url, &opts).await.unwrap();
    let mut expected = HashSet::new();
    for _ in 0..20 {
        let q = first
            .outbox_enqueue(&event("run.completed"), &subs(10))
            .await
            .unwrap();
        expected.extend(q.deliveries.into_iter().map(|d| d.0));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..3 {
        let store = PgStore::connect(&url, &opts).await.unwrap();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let mut errors = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match store
                    .outbox_lease(&worker, Duration::from_millis(1500), 1, 100)
                    .await
                {
                    Ok(leased) => {
                        for l in leased {
                            // A lost ack is delivered again after the lease.
                            if store.outbox_ack(l.delivery.id).await.is_err() {
                                errors += 1;
                            }
                        }
                    }
                    Err(PgError::Unavailable { .. }) => errors += 1,
                    Err(e) => panic!("{e}"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            errors
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let restart = tokio::task::spawn_blocking(move || {
        pg.restart(plugd_store_pg::test_pg::RestartMode::Fast)
            .unwrap();
        std::thread::sleep(Duration::from_millis(150));
        pg.restart(plugd_store_pg::test_pg::RestartMode::Immediate)
            .unwrap();
        pg
    });
    let pg = restart.await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let delivered = loop {
        if let Ok(done) = first.outbox_list(Some(DeliveryStatus::Delivered)).await
            && done.len() == expected.len()
        {
            break done;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the outbox did not drain"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut errors = 0;
    for w in workers {
        errors += w.await.unwrap();
    }
    assert!(errors > 0, "the restarts happened while the workers worked");
    let got: HashSet<String> = delivered.into_iter().map(|d| d.delivery_id.0).collect();
    assert_eq!(got, expected, "every delivery delivered, none lost");
    assert!(
        first
            .outbox_list(Some(DeliveryStatus::Dead))
            .await
            .unwrap()
            .is_empty()
    );
    drop(pg);
}
