//! plugd-control: the control plane's domain types and the store traits
//! their backends implement, with no I/O.
//!
//! Today this is the installed-package inventory ([`packages`]): immutable,
//! content-addressed [`Package`](packages::Package) records and the
//! [`PackageStore`](packages::PackageStore) trait; [`bindings`]: the
//! Binding Record of one export to an org or project, its checks against
//! the export's contract, deterministic rollout selection and the
//! [`BindingStore`](bindings::BindingStore) trait; and the invocation
//! records of every tool call ([`invocations`]) with their
//! [`InvocationStore`](invocations::InvocationStore) trait; and the
//! marketplace catalog ([`marketplace`]): curated entries, the signed index
//! document's canonical bytes and which entries a mode lets install;
//! sessions, chains, runs and compactions ([`chains`]) with their
//! [`ChainStore`](chains::ChainStore) trait; and delegated credentials'
//! scopes ([`delegation`]); and the one list of error codes with the
//! [`ServiceError`](error::ServiceError) the services return ([`error`]);
//! and every other piece of persisted state behind async, object-safe
//! traits with one neutral [`StoreError`](store::StoreError) ([`store`]).
//!
//! **Architecture invariant**: this crate reads no file, opens no socket and
//! links no database driver. Backends depend on it, never the reverse:
//! `plugd-store` implements every trait of [`store`] for its SQLite `Store`,
//! and `plugd-store-pg` the same traits for PostgreSQL.

pub mod bindings;
pub mod blobs;
pub mod chains;
pub mod cluster;
pub mod delegation;
pub mod error;
pub mod forward;
pub mod id;
pub mod invocations;
pub mod marketplace;
pub mod packages;
#[cfg(any(test, feature = "test-util"))]
pub mod samples;
pub mod store;

pub use bindings::{
    Binding, BindingFilter, BindingPatch, BindingStatus, BindingStore, ExportContract, Problem,
    Rollout, Scope, SecretRef,
};
pub use error::{Code, ServiceError};
pub use invocations::{
    Cursor, InvocationFilter, InvocationPage, InvocationPoint, InvocationRecord, InvocationStore,
    Order, TerminalStatus,
};
pub use packages::{
    Digest, Inserted, Package, PackageExport, PackageSelector, PackageStore, SignatureStatus,
};
