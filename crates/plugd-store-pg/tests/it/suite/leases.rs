//! Singleton leases with fencing numbers on both backends: one holder at a time, takeover after the time to live with a larger fence, and a fenced-out holder's writes refused.

use std::time::Duration;

use plugd_control::invocations::TerminalStatus;
use plugd_control::store::StoreError;

use super::backends;
use super::invocations::rec;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_at_a_time_and_a_fenced_out_holder_cannot_write() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        let held = a
            .lease_acquire("retention", "node-a", 300)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(held.holder, "node-a", "{name}");
        // Another holder is refused while it lasts; a renewal keeps the fence.
        assert_eq!(
            b.lease_acquire("retention", "node-b", 300).await.unwrap(),
            None,
            "{name}"
        );
        let renewed = a
            .lease_acquire("retention", "node-a", 300)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(renewed.fence, held.fence, "{name}");
        assert_eq!(
            b.lease_holder("retention").await.unwrap().unwrap().holder,
            "node-a",
            "{name}"
        );
        // Other leases are independent.
        assert!(
            b.lease_acquire("sweeper", "node-b", 300)
                .await
                .unwrap()
                .is_some(),
            "{name}"
        );

        // node-a stalls past its lease: node-b takes it with a larger fence.
        a.append_invocations(&[rec(1, 1_000, "p", TerminalStatus::Succeeded)])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let taken = b
            .lease_acquire("retention", "node-b", 60_000)
            .await
            .unwrap()
            .unwrap();
        assert!(taken.fence > held.fence, "{name}: {taken:?} after {held:?}");
        // node-a wakes up and writes with its old fence: refused, nothing deleted.
        match a
            .delete_invocations_before_fenced(i64::MAX, &held.fence())
            .await
        {
            Err(StoreError::Conflict(why)) => assert!(why.contains("retention"), "{name}: {why}"),
            other => panic!("{name}: the fenced-out write was not refused: {other:?}"),
        }
        assert!(a.invocation("inv_0001").await.unwrap().is_some(), "{name}");
        // Nor can it give up the lease it lost.
        assert!(!a.lease_release(&held.fence()).await.unwrap(), "{name}");
        // The holder's write goes through.
        assert_eq!(
            b.delete_invocations_before_fenced(i64::MAX, &taken.fence())
                .await
                .unwrap(),
            1,
            "{name}"
        );
        // Released: the next holder takes it at once, with a larger fence.
        assert!(b.lease_release(&taken.fence()).await.unwrap(), "{name}");
        assert_eq!(a.lease_holder("retention").await.unwrap(), None, "{name}");
        let again = a
            .lease_acquire("retention", "node-a", 60_000)
            .await
            .unwrap()
            .unwrap();
        assert!(again.fence > taken.fence, "{name}");
        // Bad names are refused.
        assert!(a.lease_acquire("", "x", 1).await.is_err(), "{name}");
        assert!(a.lease_acquire("x", "a\0b", 1).await.is_err(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_many_asking_at_once_exactly_one_holds_the_lease() {
    for be in backends().await {
        let (name, a, b) = (be.name, &be.a, &be.b);
        for round in 0..10 {
            let lease = format!("job-{round}");
            let asks: Vec<_> = (0..6)
                .map(|i| {
                    let s = if i % 2 == 0 { a.clone() } else { b.clone() };
                    let lease = lease.clone();
                    tokio::spawn(async move {
                        s.lease_acquire(&lease, &format!("node-{i}"), 60_000)
                            .await
                            .unwrap()
                    })
                })
                .collect();
            let mut holders = Vec::new();
            for ask in asks {
                if let Some(l) = ask.await.unwrap() {
                    holders.push(l.holder);
                }
            }
            assert_eq!(holders.len(), 1, "{name}: round {round}: {holders:?}");
        }
    }
}
