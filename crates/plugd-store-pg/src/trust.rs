//! Approvals of plugin content and the supervisor's failure marks on PostgreSQL.
//!
//! Same operations and meaning as `plugd-store`'s `store.rs`; the failure's
//! time is the database's. The two-statement writes run in one transaction
//! at READ COMMITTED: each statement is keyed by the plugin id, and the
//! upsert / conditional delete lock that row, so a concurrent writer waits
//! and then sees the committed row (no lost update, no retry needed).

use plugd_control::store::approvals::check_plugin_id;
use plugd_control::store::{Approval, Failure};

use crate::clock::NOW_RFC3339;
use crate::{PgError, PgStore};

/// Writes one approval, replacing the plugin's earlier one.
const UPSERT_APPROVAL: &str =
    "INSERT INTO approvals (plugin_id, digest, approved_by, approved_at, catalog)
     VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (plugin_id) DO UPDATE SET
        digest = excluded.digest,
        approved_by = excluded.approved_by,
        approved_at = excluded.approved_at,
        catalog = excluded.catalog";

const APPROVAL_COLUMNS: &str = "plugin_id, digest, approved_by, approved_at, catalog";

impl PgStore {
    /// Records an approval, replacing any earlier one for the same plugin.
    pub async fn approve(&self, a: &Approval) -> Result<(), PgError> {
        check_plugin_id(&a.plugin_id)?;
        let catalog = a.catalog.to_string();
        let client = self.client().await?;
        client
            .execute(
                UPSERT_APPROVAL,
                &[
                    &a.plugin_id,
                    &a.digest,
                    &a.approved_by,
                    &a.approved_at,
                    &catalog,
                ],
            )
            .await
            .map_err(|e| self.query_error(format!("approve plugin {:?}", a.plugin_id), e))?;
        Ok(())
    }

    /// Records an approval and forgets the plugin's failure mark, in one
    /// transaction: a concurrent reader sees either neither or both.
    pub async fn approve_clearing_failure(&self, a: &Approval) -> Result<(), PgError> {
        check_plugin_id(&a.plugin_id)?;
        let catalog = a.catalog.to_string();
        let action = || format!("approve plugin {:?}", a.plugin_id);
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        tx.execute(
            UPSERT_APPROVAL,
            &[
                &a.plugin_id,
                &a.digest,
                &a.approved_by,
                &a.approved_at,
                &catalog,
            ],
        )
        .await
        .map_err(|e| self.query_error(action(), e))?;
        tx.execute("DELETE FROM failures WHERE plugin_id = $1", &[&a.plugin_id])
            .await
            .map_err(|e| self.query_error(action(), e))?;
        tx.commit().await.map_err(|e| self.query_error(action(), e))
    }

    /// Withdraws the approval `a` only if it is still the stored one (same
    /// digest, approver and time), and forgets the failure mark, in one
    /// transaction; `true` if it was withdrawn.
    pub async fn revoke_exact(&self, a: &Approval) -> Result<bool, PgError> {
        let action = || format!("roll back the approval of {:?}", a.plugin_id);
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let n = tx
            .execute(
                "DELETE FROM approvals WHERE plugin_id = $1 AND digest = $2
                   AND approved_by = $3 AND approved_at = $4",
                &[&a.plugin_id, &a.digest, &a.approved_by, &a.approved_at],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        if n > 0 {
            tx.execute("DELETE FROM failures WHERE plugin_id = $1", &[&a.plugin_id])
                .await
                .map_err(|e| self.query_error(action(), e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        Ok(n > 0)
    }

    /// The approval of `plugin_id`, if any.
    pub async fn approval(&self, plugin_id: &str) -> Result<Option<Approval>, PgError> {
        // Cached: listing N plugins reads N approvals.
        let action = || format!("read approval of plugin {plugin_id:?}");
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE plugin_id = $1"
            ))
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let row = client
            .query_opt(&stmt, &[&plugin_id])
            .await
            .map_err(|e| self.query_error(action(), e))?;
        row.map(|r| self.decode_approval(&r)).transpose()
    }

    /// All approvals, sorted by plugin id (byte order).
    pub async fn approvals(&self) -> Result<Vec<Approval>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT {APPROVAL_COLUMNS} FROM approvals ORDER BY plugin_id"),
                &[],
            )
            .await
            .map_err(|e| self.query_error("list approvals", e))?;
        rows.iter().map(|r| self.decode_approval(r)).collect()
    }

    /// Removes the approval of `plugin_id`; `true` if there was one. A
    /// recorded [`Failure`] is independent and stays.
    pub async fn revoke(&self, plugin_id: &str) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute("DELETE FROM approvals WHERE plugin_id = $1", &[&plugin_id])
            .await
            .map_err(|e| self.query_error(format!("revoke plugin {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Replaces the cached tool catalog of `plugin_id`, but only if its stored
    /// approval is for `digest` (one statement); `true` if it was updated.
    pub async fn update_catalog(
        &self,
        plugin_id: &str,
        digest: &str,
        catalog: &serde_json::Value,
    ) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE approvals SET catalog = $3 WHERE plugin_id = $1 AND digest = $2",
                &[&plugin_id, &digest, &catalog.to_string()],
            )
            .await
            .map_err(|e| self.query_error(format!("update catalog of plugin {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Records that the supervisor gave up on `plugin_id`, stamped with the
    /// database's clock; replaces an earlier failure of the same plugin.
    pub async fn mark_failed(&self, plugin_id: &str, reason: &str) -> Result<(), PgError> {
        check_plugin_id(plugin_id)?;
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO failures (plugin_id, reason, at) VALUES ($1, $2, {NOW_RFC3339})
                     ON CONFLICT (plugin_id) DO UPDATE SET reason = excluded.reason, at = excluded.at"
                ),
                &[&plugin_id, &reason],
            )
            .await
            .map_err(|e| self.query_error(format!("mark plugin {plugin_id:?} failed"), e))?;
        Ok(())
    }

    /// The recorded failure of `plugin_id`, if any.
    pub async fn failure(&self, plugin_id: &str) -> Result<Option<Failure>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT plugin_id, reason, at FROM failures WHERE plugin_id = $1",
                &[&plugin_id],
            )
            .await
            .map_err(|e| self.query_error(format!("read failure of plugin {plugin_id:?}"), e))?;
        Ok(row.map(|r| Failure {
            plugin_id: r.get(0),
            reason: r.get(1),
            at: r.get(2),
        }))
    }

    /// Forgets the failure of `plugin_id`; `true` if there was one.
    pub async fn clear_failure(&self, plugin_id: &str) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute("DELETE FROM failures WHERE plugin_id = $1", &[&plugin_id])
            .await
            .map_err(|e| self.query_error(format!("clear failure of plugin {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    fn decode_approval(&self, r: &tokio_postgres::Row) -> Result<Approval, PgError> {
        let plugin_id: String = r.get(0);
        let catalog: String = r.get(4);
        let catalog = serde_json::from_str(&catalog).map_err(|e| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("approval of plugin {plugin_id:?}"),
            detail: format!("cached catalog is not JSON ({e}); re-approve the plugin"),
        })?;
        Ok(Approval {
            plugin_id,
            digest: r.get(1),
            approved_by: r.get(2),
            approved_at: r.get(3),
            catalog,
        })
    }
}
