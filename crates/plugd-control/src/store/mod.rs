//! The state store's traits, one per domain, their records and the neutral [`StoreError`]: what every backend implements.
//!
//! plugd keeps all of its persisted state behind these async, object-safe
//! traits: SQLite (`plugd-store`) for one machine, PostgreSQL
//! (`plugd-store-pg`) for several. The runtime, the agent, the surfaces and
//! the node hold an `Arc<dyn StateStore>` (or the one domain trait they
//! need) and never name a backend.
//!
//! | Trait | State |
//! |---|---|
//! | [`ApprovalStore`] | approvals of plugin content, the supervisor's failures |
//! | [`ToolStateStore`] | disabled tools, per-call approvals |
//! | [`TokenStore`], [`AuditStore`] | API tokens (hashes only), the audit trail and the journal |
//! | [`ConfigStore`] | plugin configuration with sealed secrets, org secrets |
//! | [`OutboxStore`] | semantic events and their hook deliveries |
//! | [`TranscriptStore`] | agent sessions as transcripts |
//! | [`MemoryStore`], [`VectorStore`], [`KvStore`] | agent memory, vectors, key-value storage |
//! | [`PackageStore`], [`BindingStore`], [`InvocationStore`], [`ChainStore`] | packages, bindings, invocation records, chains and runs |
//! | [`LeaseStore`] | singleton leases with fencing numbers |
//! | [`LimitStore`] | the token buckets of plugd.yaml's `limits:` rules |
//! | [`ToolPinStore`] | approved plugins' pinned tool definitions and withheld tools |
//! | [`NodeStore`] | the nodes serving the store, their versions, keys and configuration |
//! | [`LiveSessionStore`], [`ControlEpoch`] | MCP and console sessions, login codes; the epoch that keeps consent caches exact |
//!
//! Inputs are checked once, here, by the `check_*` functions beside each
//! trait (an [`Invalid`] that each backend maps to its own error), so both
//! backends refuse the same inputs with the same messages.
//!
//! Traits are written with `async_trait` so that `dyn` works; a backend
//! whose driver is synchronous (SQLite) answers without awaiting anything.

pub mod approvals;
mod error;
pub mod kv;
pub mod leases;
pub mod limits;
pub mod live;
pub mod memory;
pub mod nodes;
pub mod outbox;
pub mod secrets;
pub mod tokens;
pub mod tool_pins;
pub mod tool_state;
pub mod transcripts;
pub mod vectors;

pub use approvals::{Approval, ApprovalStore, Failure};
pub use error::{BackendError, Invalid, StoreError};
pub use kv::KvStore;
pub use leases::{Fence, Lease, LeaseStore};
pub use limits::LimitStore;
pub use live::{ControlEpoch, Lifetime, LiveKind, LiveSession, LiveSessionStore};
pub use memory::{MemoryEntry, MemoryStore};
pub use nodes::{NodeRecord, NodeStore};
pub use outbox::OutboxStore;
pub use secrets::{ConfigStore, ConfigWrite, Reseal, Rotation, Sealed, StoredValue};
pub use tokens::{
    AuditEntry, AuditFilter, AuditPage, AuditStore, NewToken, Role, StatusMatch, Tenancy,
    TokenInfo, TokenRejection, TokenStore,
};
pub use tool_pins::ToolPinStore;
pub use tool_state::ToolStateStore;
pub use transcripts::{SessionRow, TranscriptStore};
pub use vectors::{VectorMatch, VectorRecord, VectorStore, VectorStoreError};

pub use crate::bindings::BindingStore;
pub use crate::chains::ChainStore;
pub use crate::invocations::InvocationStore;
pub use crate::packages::PackageStore;

/// Every piece of plugd's persisted state: what a backend implements and
/// the node hands out as `Arc<dyn StateStore>`.
///
/// A holder that needs one domain upcasts (`Arc<dyn StateStore>` coerces to
/// `Arc<dyn TokenStore>`, say).
pub trait StateStore:
    ApprovalStore
    + ToolStateStore
    + TokenStore
    + AuditStore
    + ConfigStore
    + OutboxStore
    + TranscriptStore
    + MemoryStore
    + VectorStore
    + KvStore
    + PackageStore
    + BindingStore
    + InvocationStore
    + ChainStore
    + LiveSessionStore
    + ControlEpoch
    + LeaseStore
    + LimitStore
    + ToolPinStore
    + NodeStore
    + std::fmt::Debug
{
    /// The database, for people and logs: a file path, `:memory:`, or a
    /// PostgreSQL address without credentials.
    fn describe(&self) -> String;
    /// The schema version this build writes on this backend.
    fn schema_version(&self) -> i64;
}
