//! The node's backends: where its state is kept and what its bus is. The node
//! opens its runtime on the ones it is given, so a PostgreSQL store or a NATS
//! bus plugs in here and nowhere else.
//!
//! **Architecture invariant**: only [`crate::run`] chooses backends; the
//! runtime and the surfaces use the [`StateStore`] and the
//! [`plugd_host::bus::Bus`] they were opened with.

use std::path::Path;
use std::sync::Arc;

use plugd_host::bus::{Bus, LocalBus};
use plugd_store::{StateStore, Store, StoreError};

/// Where a node keeps its state (approvals, tokens, audit, outbox, sessions,
/// secrets, invocation records).
pub trait StateBackend: Send + Sync {
    /// The backend's name, for the serving log line (`sqlite`).
    fn name(&self) -> &str;
    /// Opens the store of the workspace whose state directory is `state_dir`
    /// (`DIR/.plugd`), migrated to this build's schema.
    fn open(&self, state_dir: &Path) -> Result<Arc<dyn StateStore>, StoreError>;
}

/// The state database of the workspace: `.plugd/state.db` (SQLite).
#[derive(Debug, Clone, Copy, Default)]
pub struct SqliteState;

impl StateBackend for SqliteState {
    fn name(&self) -> &str {
        "sqlite"
    }

    fn open(&self, state_dir: &Path) -> Result<Arc<dyn StateStore>, StoreError> {
        Ok(Arc::new(Store::open(state_dir)?))
    }
}

/// The backends a node runs on.
pub struct Backends {
    /// Where state is kept.
    pub state: Box<dyn StateBackend>,
    /// What plugins publish on and receive from (`broker.publish`,
    /// `broker.event`), channels included.
    pub bus: Arc<dyn Bus>,
}

impl Backends {
    /// One machine: the workspace's SQLite database and the in-process bus.
    pub fn local() -> Backends {
        Backends {
            state: Box::new(SqliteState),
            bus: Arc::new(LocalBus::new()),
        }
    }
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("state", &self.state.name())
            .finish_non_exhaustive()
    }
}
