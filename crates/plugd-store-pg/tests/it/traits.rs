//! `plugd_control::store` through `Arc<dyn StateStore>` on PostgreSQL: a
//! server that is down is `StoreError::Unavailable`, and it comes back (the
//! scenarios run on both backends are in `suite`).

use std::sync::Arc;
use std::time::Duration;

use plugd_control::store::{StateStore, StoreError};
use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgOptions, PgStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_store_unavailable_through_the_traits() {
    let pg = TestPg::start().unwrap();
    let url = pg.fresh_database();
    let store: Arc<dyn StateStore> = Arc::new(
        PgStore::connect(
            &url,
            &PgOptions {
                pool_size: 2,
                timeout: Duration::from_secs(2),
                op_timeout: Duration::from_secs(2),
            },
        )
        .await
        .unwrap(),
    );
    assert!(
        store.describe().starts_with("postgres://plugd@/tmp/"),
        "{}",
        store.describe()
    );
    pg.stop_immediate().unwrap();
    let err = store.approvals().await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("is unavailable"), "{err}");
    pg.start_again().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while store.approvals().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "not back within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
