//! The agent's key-value storage (Dexto `agent.storage.database` and
//! `agent.storage.cache`, seed 002): JSON values by key, shared by the
//! agent's plugins and kept across restarts.
//!
//! Two namespaces (`database`, `cache`) in one table; keys and values are
//! bounded so a plugin cannot fill the state database through it.
//!
//! **API boundary:** plain data in and out; nothing SQLite-specific leaks.

use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use plugd_control::store::kv::{check_key, check_value};

use crate::error::StoreError;
use crate::store::Store;

pub use plugd_control::store::kv::{MAX_KEY, MAX_LIST, MAX_VALUE, SPACES};

/// Schema step: the agent key-value store.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE agent_kv (
        space      TEXT NOT NULL,
        key        TEXT NOT NULL,
        value      TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (space, key)
    ) STRICT;
";

impl Store {
    /// The value of `key` in `space`, `None` when unset.
    pub fn kv_get(&self, space: &str, key: &str) -> Result<Option<Value>, StoreError> {
        check_key(space, key)?;
        let conn = self.lock();
        let text: Option<String> = conn
            .query_row(
                "SELECT value FROM agent_kv WHERE space = ?1 AND key = ?2",
                params![space, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.query_error(format!("read storage key {key:?}"), e))?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    }

    /// Sets `key` in `space` to `value` (at most [`MAX_VALUE`] bytes of JSON).
    pub fn kv_set(&self, space: &str, key: &str, value: &Value) -> Result<(), StoreError> {
        check_key(space, key)?;
        let text = value.to_string();
        check_value(key, &text)?;
        let conn = self.lock();
        conn.execute(
            "INSERT INTO agent_kv (space, key, value, updated_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (space, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            params![space, key, text, crate::time::now_rfc3339()],
        )
        .map_err(|e| self.query_error(format!("write storage key {key:?}"), e))?;
        Ok(())
    }

    /// Removes `key` from `space`; `false` when it was not set.
    pub fn kv_delete(&self, space: &str, key: &str) -> Result<bool, StoreError> {
        check_key(space, key)?;
        let conn = self.lock();
        let n = conn
            .execute(
                "DELETE FROM agent_kv WHERE space = ?1 AND key = ?2",
                params![space, key],
            )
            .map_err(|e| self.query_error(format!("delete storage key {key:?}"), e))?;
        Ok(n > 0)
    }

    /// The keys of `space` starting with `prefix`, sorted, at most
    /// [`MAX_LIST`].
    pub fn kv_list(&self, space: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        check_key(space, "x")?;
        let conn = self.lock();
        let read = || -> rusqlite::Result<Vec<String>> {
            // substr keeps `%` and `_` in the prefix literal (no LIKE).
            let mut stmt = conn.prepare(
                "SELECT key FROM agent_kv WHERE space = ?1 AND substr(key, 1, length(?2)) = ?2
                 ORDER BY key LIMIT ?3",
            )?;
            stmt.query_map(params![space, prefix, MAX_LIST as i64], |r| r.get(0))?
                .collect()
        };
        read().map_err(|e| self.query_error("list storage keys".to_owned(), e))
    }
}
