//! Rate-limit buckets on both backends: a bucket shared by two nodes lets
//! exactly its capacity through, refuses with the wait to the next token,
//! refills with time, gives a refund back, and idle buckets expire.

use std::sync::Arc;

use plugd_control::store::limits::{Bucket, Take};

use super::backends;

const HOUR3: Bucket = Bucket {
    capacity: 3,
    period_ms: 3_600_000,
};

const T0: i64 = 1_800_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_lets_its_capacity_through_then_says_how_long_to_wait() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        // Two nodes share one bucket: 3 takes pass, the 4th waits 20 min.
        let mut got = Vec::new();
        for (i, s) in [a, b, a, b].into_iter().enumerate() {
            got.push(
                s.limit_take("per-user", "alice", HOUR3, T0 + i as i64)
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(&got[..3], [Take::Allowed; 3], "{name}");
        assert_eq!(got[3], Take::Wait { ms: 1_200_000 - 3 }, "{name}");
        // Another key and another rule have their own buckets.
        assert_eq!(
            b.limit_take("per-user", "bob", HOUR3, T0).await.unwrap(),
            Take::Allowed,
            "{name}"
        );
        assert_eq!(
            a.limit_take("per-org", "alice", HOUR3, T0).await.unwrap(),
            Take::Allowed,
            "{name}"
        );
        // A refund gives one token back, once.
        b.limit_refund("per-user", "alice", HOUR3).await.unwrap();
        assert_eq!(
            a.limit_take("per-user", "alice", HOUR3, T0 + 10)
                .await
                .unwrap(),
            Take::Allowed,
            "{name}"
        );
        assert!(
            matches!(
                a.limit_take("per-user", "alice", HOUR3, T0 + 10)
                    .await
                    .unwrap(),
                Take::Wait { .. }
            ),
            "{name}"
        );
        // 20 minutes later one token is back, and one only.
        let later = T0 + 1_200_000;
        assert_eq!(
            b.limit_take("per-user", "alice", HOUR3, later)
                .await
                .unwrap(),
            Take::Allowed,
            "{name}"
        );
        assert!(
            matches!(
                b.limit_take("per-user", "alice", HOUR3, later)
                    .await
                    .unwrap(),
                Take::Wait { .. }
            ),
            "{name}"
        );
        // An hour after the last take every bucket is full again: expired.
        let idle = later + 3_600_000 + 1_200_000;
        assert!(a.limit_expire(idle).await.unwrap() >= 3, "{name}");
        assert_eq!(b.limit_expire(idle).await.unwrap(), 0, "{name}");
        for _ in 0..3 {
            assert_eq!(
                a.limit_take("per-user", "alice", HOUR3, idle)
                    .await
                    .unwrap(),
                Take::Allowed,
                "{name}"
            );
        }
        // Bad keys are refused alike.
        assert!(a.limit_take("", "k", HOUR3, T0).await.is_err(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_takes_at_once_from_two_nodes_pass_exactly_the_capacity() {
    let ten = Bucket {
        capacity: 10,
        period_ms: 3_600_000,
    };
    for be in backends().await {
        let name = be.name;
        let mut tasks = Vec::new();
        for i in 0..30 {
            let s = Arc::clone(if i % 2 == 0 { &be.a } else { &be.b });
            tasks.push(tokio::spawn(async move {
                s.limit_take("burst", "k", ten, T0).await.unwrap()
            }));
        }
        let mut allowed = 0;
        for t in tasks {
            if t.await.unwrap() == Take::Allowed {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 10, "{name}");
    }
}
