//! The agent's key-value storage on PostgreSQL (Dexto `storage.database` and
//! `storage.cache`): same spaces, bounds and meaning as `plugd-store`'s `kv.rs`.

use plugd_control::store::kv::{MAX_LIST, check_key, check_value};
use serde_json::Value;

use crate::clock::NOW_RFC3339;
use crate::{PgError, PgStore};

impl PgStore {
    /// The value of `key` in `space`, `None` when unset.
    pub async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Value>, PgError> {
        check_key(space, key)?;
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT value FROM agent_kv WHERE space = $1 AND key = $2",
                &[&space, &key],
            )
            .await
            .map_err(|e| self.query_error(format!("read storage key {key:?}"), e))?;
        Ok(row.and_then(|r| serde_json::from_str(r.get::<_, &str>(0)).ok()))
    }

    /// Sets `key` in `space` to `value` (at most [`MAX_VALUE`] bytes of JSON).
    pub async fn kv_set(&self, space: &str, key: &str, value: &Value) -> Result<(), PgError> {
        check_key(space, key)?;
        let text = value.to_string();
        check_value(key, &text)?;
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO agent_kv (space, key, value, updated_at) VALUES ($1, $2, $3, {NOW_RFC3339})
                     ON CONFLICT (space, key) DO UPDATE
                     SET value = excluded.value, updated_at = excluded.updated_at"
                ),
                &[&space, &key, &text],
            )
            .await
            .map_err(|e| self.query_error(format!("write storage key {key:?}"), e))?;
        Ok(())
    }

    /// Removes `key` from `space`; `false` when it was not set.
    pub async fn kv_delete(&self, space: &str, key: &str) -> Result<bool, PgError> {
        check_key(space, key)?;
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM agent_kv WHERE space = $1 AND key = $2",
                &[&space, &key],
            )
            .await
            .map_err(|e| self.query_error(format!("delete storage key {key:?}"), e))?;
        Ok(n > 0)
    }

    /// The keys of `space` starting with `prefix` (literally: no pattern),
    /// in byte order, at most [`MAX_LIST`].
    pub async fn kv_list(&self, space: &str, prefix: &str) -> Result<Vec<String>, PgError> {
        check_key(space, "x")?;
        if prefix.contains('\0') {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT key FROM agent_kv WHERE space = $1 AND starts_with(key, $2)
                 ORDER BY key LIMIT $3",
                &[&space, &prefix, &(MAX_LIST as i64)],
            )
            .await
            .map_err(|e| self.query_error("list storage keys", e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
