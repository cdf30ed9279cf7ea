//! plugd-store: the persisted trust state of a workspace and the content digest approvals pin.
//!
//! A workspace directory `DIR` keeps its state in `DIR/.plugd/state.db`, an
//! embedded SQLite database opened through [`Store`]. It records which plugin
//! contents a person approved ([`Approval`], pinned to a [`digest`]) and which
//! plugins the supervisor gave up on ([`Failure`]), so both survive restarts.
//!
//! **API boundary:** nothing from the SQLite binding appears in the public API.
//! [`Store`] implements every trait of `plugd_control::store` (and so
//! [`StateStore`]); its records and [`StoreError`] are plugd-control's,
//! re-exported here under their old paths.

mod backend;
pub mod bindings;
pub mod chains;
pub mod digest;
pub mod dump;
pub mod identity;
pub mod invocations;
pub mod journal;
pub mod kv;
pub mod leases;
pub mod limits;
pub mod live;
pub mod memory;
pub mod nodes;
pub mod outbox;
pub mod packages;
pub mod pin;
pub mod pin_share;
pub mod secrets;
pub mod sessions;
#[cfg(feature = "test-util")]
mod shape;
mod store;
mod time;
pub mod tokens;
pub mod tool_pins;
pub mod tool_state;
pub mod users;
pub mod vectors;

pub use plugd_control::store::{
    BackendError, ControlEpoch, Lifetime, LiveKind, LiveSession, LiveSessionStore, StateStore,
    StoreError,
};

/// The neutral errors, under the path the modules of this crate use.
mod error {
    pub(crate) use plugd_control::store::{BackendError, StoreError};
}
pub use store::{Approval, Failure, SCHEMA_VERSION, STATE_DB_FILE, Store};
pub use time::now_rfc3339;
