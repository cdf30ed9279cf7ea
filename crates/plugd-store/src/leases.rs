//! Singleton leases with fencing numbers on SQLite (see `plugd_control::store::leases`).

use plugd_control::store::leases::{Fence, Lease, check_lease};
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::error::StoreError;
use crate::outbox::now_ms;
use crate::store::Store;

/// Schema step 18: the leases of singleton jobs.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE leases (
        name     TEXT PRIMARY KEY NOT NULL,
        holder   TEXT NOT NULL,
        fence    INTEGER NOT NULL,
        until_ms INTEGER NOT NULL
    ) STRICT;
";

fn lost(fence: &Fence) -> StoreError {
    StoreError::Conflict(format!(
        "the lease {:?} is no longer held with fence {} (it ran out and another holder took it); the write was refused",
        fence.name, fence.fence
    ))
}

impl Store {
    /// Takes or renews lease `name` for `holder` (see `LeaseStore`).
    pub fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        check_lease(name, holder)?;
        let now = now_ms();
        let mut conn = self.lock();
        let mut run = || -> rusqlite::Result<Option<Lease>> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let row: Option<(String, i64, i64)> = tx
                .query_row(
                    "SELECT holder, fence, until_ms FROM leases WHERE name = ?1",
                    params![name],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let fence = match row {
                Some((h, f, until)) if until > now => {
                    if h != holder {
                        return Ok(None);
                    }
                    f
                }
                Some((_, f, _)) => f + 1,
                None => 1,
            };
            tx.execute(
                "INSERT INTO leases (name, holder, fence, until_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,
                    fence = excluded.fence, until_ms = excluded.until_ms",
                params![name, holder, fence, now + ttl_ms],
            )?;
            tx.commit()?;
            Ok(Some(Lease {
                name: name.to_owned(),
                holder: holder.to_owned(),
                fence,
                until_ms: now + ttl_ms,
            }))
        };
        run().map_err(|e| self.query_error(format!("take lease {name:?}"), e))
    }

    /// Gives lease `fence.name` up if `fence` still holds it.
    pub fn lease_release(&self, fence: &Fence) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "UPDATE leases SET until_ms = 0 WHERE name = ?1 AND fence = ?2 AND until_ms > ?3",
                params![fence.name, fence.fence, now_ms()],
            )
            .map_err(|e| self.query_error(format!("give lease {:?} up", fence.name), e))?;
        Ok(n > 0)
    }

    /// Who holds lease `name` now.
    pub fn lease_holder(&self, name: &str) -> Result<Option<Lease>, StoreError> {
        self.lock()
            .query_row(
                "SELECT holder, fence, until_ms FROM leases WHERE name = ?1 AND until_ms > ?2",
                params![name, now_ms()],
                |r| {
                    Ok(Lease {
                        name: name.to_owned(),
                        holder: r.get(0)?,
                        fence: r.get(1)?,
                        until_ms: r.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.query_error(format!("read lease {name:?}"), e))
    }

    /// Retention under its lease: deletes invocation records started before
    /// `before_ms` only while `fence` holds the lease.
    pub fn delete_invocations_before_fenced(
        &self,
        before_ms: i64,
        fence: &Fence,
    ) -> Result<u64, StoreError> {
        let now = now_ms();
        let mut conn = self.lock();
        let mut run = || -> rusqlite::Result<Option<u64>> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let held: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM leases WHERE name = ?1 AND fence = ?2 AND until_ms > ?3)",
                params![fence.name, fence.fence, now],
                |r| r.get(0),
            )?;
            if !held {
                return Ok(None);
            }
            let n = tx.execute("DELETE FROM invocations WHERE started_ms < ?1", [before_ms])?;
            tx.commit()?;
            Ok(Some(n as u64))
        };
        run()
            .map_err(|e| self.query_error("delete old invocations".to_owned(), e))?
            .ok_or_else(|| lost(fence))
    }
}
