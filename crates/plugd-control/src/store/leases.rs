//! Singleton leases with fencing numbers: the [`LeaseStore`] trait.
//!
//! A job that must run on exactly one node at a time (retention, the
//! sweeper, a channel adapter) holds a named lease row for a time to live,
//! renewed while it works. Each new holder gets a larger fencing number; a
//! write the job makes passes its [`Fence`] and the store refuses it
//! ([`StoreError::Conflict`]) unless that fence still holds the lease, in
//! the write's own transaction, so a holder that stalled past its lease and
//! lost it cannot write over its successor's work. Time is the database's.

use async_trait::async_trait;

use super::{Invalid, StoreError};

/// A lease as held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job's name, e.g. `retention`.
    pub name: String,
    /// Who holds it (a node and task id).
    pub holder: String,
    /// The fencing number: larger for every new holder.
    pub fence: i64,
    /// When it runs out unless renewed (ms since the epoch, the database's
    /// clock).
    pub until_ms: i64,
}

impl Lease {
    /// The fence a holder passes to its writes.
    pub fn fence(&self) -> Fence {
        Fence {
            name: self.name.clone(),
            fence: self.fence,
        }
    }
}

/// What a fenced write carries: the lease and the number it was held with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The lease's name.
    pub name: String,
    /// The fencing number it was taken with.
    pub fence: i64,
}

/// Longest lease name or holder, in bytes.
pub const MAX_NAME: usize = 256;

/// Checks a lease name and holder.
pub fn check_lease(name: &str, holder: &str) -> Result<(), Invalid> {
    for (what, v) in [("lease name", name), ("lease holder", holder)] {
        if v.is_empty() || v.len() > MAX_NAME || v.contains('\0') {
            return Err(Invalid::new(
                format!("{what} {:?}", v.chars().take(64).collect::<String>()),
                "a lease's name and holder are 1 to 256 bytes without NUL",
            ));
        }
    }
    Ok(())
}

/// Named singleton leases with fencing numbers.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes lease `name` for `holder` for `ttl_ms`, or renews it when
    /// `holder` has it: the lease when `holder` holds it now, `None` while
    /// another holds it. A holder taking it anew (first, after another, or
    /// after its own lease ran out) gets a larger fence; a renewal keeps it.
    async fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<Lease>, StoreError>;
    /// Gives lease `name` up if `fence` still holds it; whether it did.
    async fn lease_release(&self, fence: &Fence) -> Result<bool, StoreError>;
    /// Who holds lease `name` now (`None`: nobody, or it ran out).
    async fn lease_holder(&self, name: &str) -> Result<Option<Lease>, StoreError>;
    /// Every lease held now, by name.
    async fn leases_held(&self) -> Result<Vec<Lease>, StoreError>;
    /// Deletes invocation records started before `before_ms`, only while
    /// `fence` holds its lease (retention is a singleton): how many, or
    /// `StoreError::Conflict` naming the lease when it was lost.
    async fn delete_invocations_before_fenced(
        &self,
        before_ms: i64,
        fence: &Fence,
    ) -> Result<u64, StoreError>;
}
