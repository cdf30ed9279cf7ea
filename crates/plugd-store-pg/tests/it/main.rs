//! plugd-store-pg's integration tests, one binary, against a real PostgreSQL 15
//! started by `TestPg` (one server per run, one fresh database per test).

mod cluster;
mod export;
mod harness;
mod journal;
mod migrate;
mod outbox;
mod shape;
mod suite;
mod tokens;
mod traits;

use std::time::Duration;

use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgOptions, PgStore};

/// A migrated store on a fresh database of the shared server.
pub async fn fresh_store() -> PgStore {
    let url = TestPg::shared().fresh_database();
    PgStore::connect(&url, &options()).await.unwrap()
}

/// Two stores on one fresh database: two pools, as two nodes.
pub async fn two_nodes() -> (PgStore, PgStore) {
    let url = TestPg::shared().fresh_database();
    let a = PgStore::connect(&url, &options()).await.unwrap();
    let b = PgStore::connect(&url, &options()).await.unwrap();
    (a, b)
}

pub fn options() -> PgOptions {
    PgOptions {
        pool_size: 4,
        timeout: Duration::from_secs(10),
        op_timeout: Duration::from_secs(10),
    }
}
