//! The test server itself: a Unix socket only, restarts, and what callers see
//! while the database is down.

use std::time::{Duration, Instant};

use plugd_store_pg::test_pg::{RestartMode, TestPg};
use plugd_store_pg::{PgError, PgOptions, PgStore};

fn opts() -> PgOptions {
    PgOptions {
        pool_size: 4,
        timeout: Duration::from_secs(5),
        op_timeout: Duration::from_secs(5),
    }
}

/// Retries `SELECT 1` until it answers, at most `within`.
async fn answers_within(store: &PgStore, within: Duration) -> Result<Duration, PgError> {
    let start = Instant::now();
    loop {
        match store.schema_version().await {
            Ok(_) => return Ok(start.elapsed()),
            Err(e) if start.elapsed() > within => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_server_listens_on_a_unix_socket_only() {
    let pg = TestPg::shared();
    let url = pg.fresh_database();
    assert!(url.contains("?host=/"), "{url}");
    let store = PgStore::connect(&url, &opts()).await.unwrap();
    assert!(
        store
            .label()
            .contains(&pg.socket_dir().display().to_string()),
        "{}",
        store.label()
    );
    assert!(
        pg.socket_dir()
            .join(format!(".s.PGSQL.{}", pg.port()))
            .exists()
    );
    let listen = store.setting("listen_addresses").await.unwrap();
    assert_eq!(listen, "");
    // Two fresh databases never share state.
    let other = pg.fresh_database();
    assert_ne!(url, other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_reconnects_after_fast_and_immediate_restarts() {
    // Its own server: restarting the shared one would disturb the other tests.
    let pg = TestPg::start().unwrap();
    let url = pg.fresh_database();
    let store = PgStore::connect(&url, &opts()).await.unwrap();
    pg.restart(RestartMode::Fast).unwrap();
    answers_within(&store, Duration::from_secs(5))
        .await
        .unwrap();
    pg.restart(RestartMode::Immediate).unwrap();
    answers_within(&store, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        plugd_store_pg::SCHEMA_VERSION
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unavailable_then_back() {
    let pg = TestPg::start().unwrap();
    let url = pg.fresh_database();
    let store = PgStore::connect(&url, &opts()).await.unwrap();
    pg.stop_immediate().unwrap();
    let started = Instant::now();
    let err = store.schema_version().await.unwrap_err();
    assert!(matches!(err, PgError::Unavailable { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let msg = err.to_string();
    assert!(msg.contains("is unavailable"), "{msg}");
    pg.start_again().unwrap();
    answers_within(&store, Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_server_stops_it_and_removes_its_directory() {
    let pg = TestPg::start().unwrap();
    let dir = pg.socket_dir().to_owned();
    let url = pg.fresh_database();
    PgStore::connect(&url, &opts()).await.unwrap();
    drop(pg);
    assert!(!dir.exists(), "{} still exists", dir.display());
    let store = PgStore::connect_unmigrated(&url, &opts()).unwrap();
    let err = store.schema_version().await.unwrap_err();
    assert!(matches!(err, PgError::Unavailable { .. }), "{err:?}");
}
