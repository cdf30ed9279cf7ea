//! Live sessions, one-time login codes and the control epoch on PostgreSQL: the SQLite store's meaning, every time from the server's clock.
//!
//! Session ids and login codes are stored as their SHA-256 only. A login
//! code is spent by one `DELETE … RETURNING`, so of several nodes trying the
//! same code at once exactly one gets it. The control epoch is bumped by
//! statement-level triggers in the writing transaction (`migrations.rs`).

use plugd_control::store::live::{
    Lifetime, LiveKind, LiveSession, MAX_CODES, check_session, session_key,
};
use serde_json::Value;

use crate::clock::NOW_MS;
use crate::{PgError, PgStore};

impl PgStore {
    /// Stores live session `id` of `kind`, opened and used now.
    pub async fn live_session_put(
        &self,
        kind: LiveKind,
        id: &str,
        owner: &str,
        profile: Option<&str>,
        data: &Value,
    ) -> Result<(), PgError> {
        let text = check_session(owner, profile, data)?;
        let key = session_key(id).to_vec();
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO live_sessions (kind, id_sha256, owner, profile, data, created_ms, used_ms)
                     VALUES ($1, $2, $3, $4, $5, {NOW_MS}, {NOW_MS})
                     ON CONFLICT (kind, id_sha256) DO UPDATE SET owner = excluded.owner,
                        profile = excluded.profile, data = excluded.data,
                        created_ms = excluded.created_ms, used_ms = excluded.used_ms"
                ),
                &[&kind.as_str(), &key, &owner, &profile, &text],
            )
            .await
            .map_err(|e| self.query_error(format!("store a {} session", kind.as_str()), e))?;
        Ok(())
    }

    /// Live session `id` of `kind` while alive under `life`; an expired one
    /// is deleted.
    pub async fn live_session_get(
        &self,
        kind: LiveKind,
        id: &str,
        life: Lifetime,
    ) -> Result<Option<LiveSession>, PgError> {
        let key = session_key(id).to_vec();
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT owner, profile, data, created_ms, used_ms,
                        (used_ms + $3 > {NOW_MS} AND ($4::bigint IS NULL OR created_ms + $4 > {NOW_MS}))
                     FROM live_sessions WHERE kind = $1 AND id_sha256 = $2"
                ),
                &[&kind.as_str(), &key, &life.idle_ms, &life.max_age_ms],
            )
            .await
            .map_err(|e| self.query_error(format!("read a {} session", kind.as_str()), e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        if !row.get::<_, bool>(5) {
            client
                .execute(
                    "DELETE FROM live_sessions WHERE kind = $1 AND id_sha256 = $2",
                    &[&kind.as_str(), &key],
                )
                .await
                .map_err(|e| self.query_error(format!("end a {} session", kind.as_str()), e))?;
            return Ok(None);
        }
        Ok(Some(LiveSession {
            kind,
            owner: row.get(0),
            profile: row.get(1),
            data: serde_json::from_str(row.get::<_, &str>(2)).unwrap_or(Value::Null),
            created_ms: row.get(3),
            used_ms: row.get(4),
        }))
    }

    /// Marks session `id` used now; whether it exists.
    pub async fn live_session_touch(&self, kind: LiveKind, id: &str) -> Result<bool, PgError> {
        let key = session_key(id).to_vec();
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "UPDATE live_sessions SET used_ms = greatest(used_ms, {NOW_MS})
                     WHERE kind = $1 AND id_sha256 = $2"
                ),
                &[&kind.as_str(), &key],
            )
            .await
            .map_err(|e| self.query_error(format!("mark a {} session used", kind.as_str()), e))?;
        Ok(n > 0)
    }

    /// Ends session `id`; whether it existed.
    pub async fn live_session_delete(&self, kind: LiveKind, id: &str) -> Result<bool, PgError> {
        let key = session_key(id).to_vec();
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM live_sessions WHERE kind = $1 AND id_sha256 = $2",
                &[&kind.as_str(), &key],
            )
            .await
            .map_err(|e| self.query_error(format!("end a {} session", kind.as_str()), e))?;
        Ok(n > 0)
    }

    /// Deletes every session of `kind` expired under `life`; how many.
    pub async fn live_sessions_sweep(
        &self,
        kind: LiveKind,
        life: Lifetime,
    ) -> Result<u64, PgError> {
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "DELETE FROM live_sessions WHERE kind = $1
                     AND (used_ms + $2 <= {NOW_MS} OR ($3::bigint IS NOT NULL AND created_ms + $3 <= {NOW_MS}))"
                ),
                &[&kind.as_str(), &life.idle_ms, &life.max_age_ms],
            )
            .await
            .map_err(|e| self.query_error(format!("sweep {} sessions", kind.as_str()), e))
    }

    /// Keeps the `keep` most recently used sessions of `kind`; how many went.
    pub async fn live_sessions_trim(&self, kind: LiveKind, keep: u64) -> Result<u64, PgError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM live_sessions WHERE kind = $1 AND id_sha256 IN (
                    SELECT id_sha256 FROM live_sessions WHERE kind = $1
                    ORDER BY used_ms DESC OFFSET $2)",
                &[&kind.as_str(), &(keep as i64)],
            )
            .await
            .map_err(|e| self.query_error(format!("trim {} sessions", kind.as_str()), e))
    }

    /// How many sessions of `kind` `owner` holds alive under `life`.
    pub async fn live_sessions_held(
        &self,
        kind: LiveKind,
        owner: &str,
        life: Lifetime,
    ) -> Result<u64, PgError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM live_sessions WHERE kind = $1 AND owner = $2
                     AND used_ms + $3 > {NOW_MS} AND ($4::bigint IS NULL OR created_ms + $4 > {NOW_MS})"
                ),
                &[&kind.as_str(), &owner, &life.idle_ms, &life.max_age_ms],
            )
            .await
            .map_err(|e| self.query_error(format!("count {} sessions", kind.as_str()), e))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Stores a one-time login code for `name`, good for `lifetime_ms`.
    pub async fn login_code_put(
        &self,
        code: &str,
        name: &str,
        lifetime_ms: i64,
    ) -> Result<(), PgError> {
        check_session(name, None, &Value::Null)?;
        let key = session_key(code).to_vec();
        let mut client = self.client().await?;
        let err = |e| self.query_error("store a login code", e);
        let tx = client.transaction().await.map_err(err)?;
        // One writer of codes at a time, so the bound holds across nodes.
        tx.execute("LOCK TABLE login_codes IN SHARE ROW EXCLUSIVE MODE", &[])
            .await
            .map_err(err)?;
        tx.execute(
            &format!("DELETE FROM login_codes WHERE expires_ms <= {NOW_MS}"),
            &[],
        )
        .await
        .map_err(err)?;
        tx.execute(
            "DELETE FROM login_codes WHERE code_sha256 IN (
                SELECT code_sha256 FROM login_codes ORDER BY minted_ms DESC OFFSET $1)",
            &[&(MAX_CODES as i64 - 1)],
        )
        .await
        .map_err(err)?;
        tx.execute(
            &format!(
                "INSERT INTO login_codes (code_sha256, name, minted_ms, expires_ms)
                 VALUES ($1, $2, {NOW_MS}, {NOW_MS} + $3)"
            ),
            &[&key, &name, &lifetime_ms],
        )
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)
    }

    /// Spends `code`: the user it was minted for, once, while it is fresh.
    pub async fn login_code_redeem(&self, code: &str) -> Result<Option<String>, PgError> {
        let key = session_key(code).to_vec();
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "DELETE FROM login_codes WHERE code_sha256 = $1
                     RETURNING name, expires_ms > {NOW_MS}"
                ),
                &[&key],
            )
            .await
            .map_err(|e| self.query_error("spend a login code", e))?;
        Ok(row.and_then(|r| r.get::<_, bool>(1).then(|| r.get(0))))
    }

    /// The control epoch now.
    pub async fn control_epoch(&self) -> Result<i64, PgError> {
        let client = self.client().await?;
        let st = client
            .prepare_cached("SELECT n FROM control_epoch WHERE id = 1")
            .await
            .map_err(|e| self.query_error("read the control epoch", e))?;
        let row = client
            .query_one(&st, &[])
            .await
            .map_err(|e| self.query_error("read the control epoch", e))?;
        Ok(row.get(0))
    }
}
