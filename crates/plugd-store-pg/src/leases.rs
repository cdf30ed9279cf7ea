//! Singleton leases with fencing numbers on PostgreSQL: one atomic upsert takes or renews a lease by the database's clock; fenced writes check the lease in their own transaction.

use plugd_control::store::leases::{Fence, Lease, check_lease};

use crate::clock::NOW_MS;
use crate::{PgError, PgStore};

impl PgStore {
    /// Takes or renews lease `name` for `holder` (see `LeaseStore`): one
    /// statement, so of several nodes asking at once exactly one holds it.
    pub async fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<Lease>, PgError> {
        check_lease(name, holder)?;
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "INSERT INTO leases AS l (name, holder, fence, until_ms)
                     VALUES ($1, $2, 1, {NOW_MS} + $3)
                     ON CONFLICT (name) DO UPDATE SET
                        holder = excluded.holder,
                        fence = CASE WHEN l.holder = excluded.holder AND l.until_ms > {NOW_MS}
                                     THEN l.fence ELSE l.fence + 1 END,
                        until_ms = excluded.until_ms
                     WHERE l.holder = excluded.holder OR l.until_ms <= {NOW_MS}
                     RETURNING fence, until_ms"
                ),
                &[&name, &holder, &ttl_ms],
            )
            .await
            .map_err(|e| self.query_error(format!("take lease {name:?}"), e))?;
        Ok(row.map(|r| Lease {
            name: name.to_owned(),
            holder: holder.to_owned(),
            fence: r.get(0),
            until_ms: r.get(1),
        }))
    }

    /// Gives lease `fence.name` up if `fence` still holds it.
    pub async fn lease_release(&self, fence: &Fence) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "UPDATE leases SET until_ms = 0
                     WHERE name = $1 AND fence = $2 AND until_ms > {NOW_MS}"
                ),
                &[&fence.name, &fence.fence],
            )
            .await
            .map_err(|e| self.query_error(format!("give lease {:?} up", fence.name), e))?;
        Ok(n > 0)
    }

    /// Who holds lease `name` now.
    pub async fn lease_holder(&self, name: &str) -> Result<Option<Lease>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT holder, fence, until_ms FROM leases WHERE name = $1 AND until_ms > {NOW_MS}"
                ),
                &[&name],
            )
            .await
            .map_err(|e| self.query_error(format!("read lease {name:?}"), e))?;
        Ok(row.map(|r| Lease {
            name: name.to_owned(),
            holder: r.get(0),
            fence: r.get(1),
            until_ms: r.get(2),
        }))
    }

    /// Retention under its lease: deletes invocation records started before
    /// `before_ms` only while `fence` holds the lease (the lease row locked
    /// for the delete's transaction).
    pub async fn delete_invocations_before_fenced(
        &self,
        before_ms: i64,
        fence: &Fence,
    ) -> Result<u64, PgError> {
        let mut client = self.client().await?;
        let err = |e| self.query_error("delete old invocations", e);
        let tx = client.transaction().await.map_err(err)?;
        let held = tx
            .query_opt(
                &format!(
                    "SELECT 1 FROM leases WHERE name = $1 AND fence = $2 AND until_ms > {NOW_MS}
                     FOR SHARE"
                ),
                &[&fence.name, &fence.fence],
            )
            .await
            .map_err(err)?;
        if held.is_none() {
            return Err(PgError::Conflict(format!(
                "the lease {:?} is no longer held with fence {} (it ran out and another holder took it); the write was refused",
                fence.name, fence.fence
            )));
        }
        let n = tx
            .execute(
                "DELETE FROM invocations WHERE started_ms < $1",
                &[&before_ms],
            )
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(n)
    }
}
