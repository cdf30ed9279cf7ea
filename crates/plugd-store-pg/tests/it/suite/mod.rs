//! The store test suite: every test takes `Arc<dyn StateStore>` and runs on both backends.
//!
//! [`backends`] gives each test two connections to one fresh state, once on
//! SQLite (two `plugd_store::Store::open` on one temporary directory, two
//! connections to one file) and once on PostgreSQL (two pools on one fresh
//! database of the shared `TestPg`, as two nodes). A test loops over both
//! and names the backend in its failure messages, so one scenario proves
//! that the two backends give the same answers. Tests that only one backend
//! can run (SQLite's files, corruption and old-file migrations in
//! `plugd-store`'s unit tests; PostgreSQL's clock, restarts, cluster and
//! schema in the other modules of this binary) stay where they are.
//!
//! One module per domain: approvals and failures, tool state and call
//! approvals, tokens and audit, config (plain values, sealed boxes,
//! reseal), kv, outbox, transcripts, memory search, vectors, packages and
//! bindings, invocations, chains/runs/compactions, events written with
//! their state (`reporting`), live sessions and the control epoch, leases,
//! the nodes' rows, rate-limit buckets (`limits`: two nodes taking from one
//! bucket at once pass exactly its capacity), pinned tool definitions
//! (`tool_pins`: first pins hold, approvals clear them, bounded).
//!
//! ## Races: the transactions that relied on SQLite's single writer
//!
//! Each runs on two connections at once, on both backends:
//! 1. approval revoke-exact: of two revokes of one approval exactly one
//!    withdraws it (`approvals::two_nodes_revoking_one_approval_exactly_one_withdraws_it`);
//! 2. approve-and-clear-failure against a rollback: one consistent state
//!    (`approvals::an_approval_and_its_rollback_racing_leave_one_consistent_state`);
//! 3. call approval decide: one winner, the loser sees its decision
//!    (`tool_state::two_operators_deciding_at_once_get_one_winner`);
//! 4. token create: one live token per name
//!    (`tokens::two_nodes_creating_one_name_at_once_make_one_live_token`);
//! 5. secret rotation: of two rotations one wins, one key left
//!    (`config::two_nodes_rotating_at_once_leave_one_key`);
//! 6. outbox lease: three workers on three connections never lease one
//!    delivery twice (`outbox::three_workers_on_three_connections_never_lease_one_delivery_twice`);
//! 7. vector collection creation: one dimension
//!    (`vectors::two_nodes_creating_one_collection_at_once_agree_on_its_dimension`);
//! 8. package install: one row (`packages::two_nodes_installing_at_once_store_one_row`);
//! 9. invocation batch: stored once
//!    (`invocations::a_batch_written_by_two_nodes_at_once_is_stored_once`);
//! 10. chain append and compaction: consecutive numbers, one winning
//!     compaction (`chains::raced_appends_and_compactions_keep_order_and_one_winner`);
//! 11. session open: one first chain
//!     (`chains::two_nodes_opening_one_session_make_one_first_chain`);
//! 12. run end: recorded once (`chains::two_nodes_ending_one_run_at_once_record_one_end`);
//! 13. login code: spent exactly once
//!     (`live::a_login_code_raced_on_two_connections_logs_in_exactly_once`);
//!
//! and the singleton lease (`leases::of_many_asking_at_once_exactly_one_holds_the_lease`),
//! which came with the lease table.

mod approvals;
mod chains;
mod checks;
mod config;
mod invocations;
mod kv;
mod leases;
mod limits;
mod live;
mod memory;
mod nodes;
pub(crate) mod outbox;
mod packages;
mod reporting;
mod scenario;
mod tokens;
mod tool_pins;
mod tool_state;
mod transcripts;
mod vectors;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use plugd_control::store::StateStore;
use plugd_store_pg::PgStore;
use plugd_store_pg::test_pg::TestPg;

/// Where a backend's state lives, to open more connections to it.
enum Place {
    Sqlite(PathBuf),
    Postgres(String),
}

/// One fresh state on one backend, with two connections to it.
pub struct Backend {
    /// `"sqlite"` or `"postgres"`, for failure messages.
    pub name: &'static str,
    /// The first connection (a node).
    pub a: Arc<dyn StateStore>,
    /// The second connection to the same state (another node).
    pub b: Arc<dyn StateStore>,
    place: Place,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    /// Another connection to the same state.
    pub async fn connect(&self) -> Arc<dyn StateStore> {
        match &self.place {
            Place::Sqlite(dir) => Arc::new(plugd_store::Store::open(dir).unwrap()),
            Place::Postgres(url) => {
                Arc::new(PgStore::connect(url, &crate::options()).await.unwrap())
            }
        }
    }
}

/// A fresh state on SQLite (in a temporary directory) and one on
/// PostgreSQL (a fresh database), two connections each.
pub async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let sqlite = Backend {
        name: "sqlite",
        a: Arc::new(plugd_store::Store::open(&path).unwrap()),
        b: Arc::new(plugd_store::Store::open(&path).unwrap()),
        place: Place::Sqlite(path),
        _dir: Some(dir),
    };
    let url = TestPg::shared().fresh_database();
    let postgres = Backend {
        name: "postgres",
        a: Arc::new(PgStore::connect(&url, &crate::options()).await.unwrap()),
        b: Arc::new(PgStore::connect(&url, &crate::options()).await.unwrap()),
        place: Place::Postgres(url),
        _dir: None,
    };
    vec![sqlite, postgres]
}

/// Now, in milliseconds since the epoch, by this machine's clock (the
/// database server runs on it too).
pub fn now_ms() -> i64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(d.as_millis()).unwrap()
}
