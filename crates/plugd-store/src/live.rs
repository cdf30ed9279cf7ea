//! Live sessions, one-time login codes and the control epoch on SQLite (see `plugd_control::store::live`).
//!
//! Session ids and login codes are stored as their SHA-256 only. The control
//! epoch is one row bumped by triggers in the same transaction as every
//! change to what guards consent, so no writer can forget it.

use plugd_control::store::live::{
    Lifetime, LiveKind, LiveSession, MAX_CODES, check_session, session_key,
};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use crate::error::StoreError;
use crate::outbox::now_ms;
use crate::store::Store;

/// Schema step 17: live sessions, login codes, the control epoch and the
/// triggers that bump it: every change to approvals, disabled tools,
/// per-call approvals, plugin configuration, packages and bindings, and to
/// API tokens except their last-use stamp.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE live_sessions (
        kind       TEXT NOT NULL,
        id_sha256  BLOB NOT NULL,
        owner      TEXT NOT NULL,
        profile    TEXT,
        data       TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        used_ms    INTEGER NOT NULL,
        PRIMARY KEY (kind, id_sha256)
    ) STRICT;
    CREATE INDEX live_sessions_owner ON live_sessions (kind, owner);
    CREATE TABLE login_codes (
        code_sha256 BLOB PRIMARY KEY NOT NULL,
        name        TEXT NOT NULL,
        minted_ms   INTEGER NOT NULL,
        expires_ms  INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE control_epoch (
        id INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
        n  INTEGER NOT NULL
    ) STRICT;
    INSERT INTO control_epoch (id, n) VALUES (1, 0);
    CREATE TRIGGER epoch_api_tokens_insert AFTER INSERT ON api_tokens
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_api_tokens_delete AFTER DELETE ON api_tokens
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_api_tokens_update AFTER UPDATE OF
        id, name, role, secret_sha256, created_at, created_by, expires_at_ms,
        revoked_at, mcp_profiles, org_id, project_ids ON api_tokens
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_approvals_insert AFTER INSERT ON approvals
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_approvals_update AFTER UPDATE ON approvals
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_approvals_delete AFTER DELETE ON approvals
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_disabled_tools_insert AFTER INSERT ON disabled_tools
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_disabled_tools_update AFTER UPDATE ON disabled_tools
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_disabled_tools_delete AFTER DELETE ON disabled_tools
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_plugin_config_insert AFTER INSERT ON plugin_config
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_plugin_config_update AFTER UPDATE ON plugin_config
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_plugin_config_delete AFTER DELETE ON plugin_config
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_packages_insert AFTER INSERT ON packages
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_packages_update AFTER UPDATE ON packages
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_packages_delete AFTER DELETE ON packages
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_bindings_insert AFTER INSERT ON bindings
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_bindings_update AFTER UPDATE ON bindings
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_bindings_delete AFTER DELETE ON bindings
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_call_approvals_insert AFTER INSERT ON call_approvals
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_call_approvals_update AFTER UPDATE ON call_approvals
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
    CREATE TRIGGER epoch_call_approvals_delete AFTER DELETE ON call_approvals
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
";

fn alive(created_ms: i64, used_ms: i64, life: Lifetime, now: i64) -> bool {
    used_ms + life.idle_ms > now && life.max_age_ms.is_none_or(|age| created_ms + age > now)
}

impl Store {
    /// Stores live session `id` of `kind`, opened and used now.
    pub fn live_session_put(
        &self,
        kind: LiveKind,
        id: &str,
        owner: &str,
        profile: Option<&str>,
        data: &Value,
    ) -> Result<(), StoreError> {
        let text = check_session(owner, profile, data)?;
        let now = now_ms();
        let conn = self.lock();
        conn.execute(
            "INSERT INTO live_sessions (kind, id_sha256, owner, profile, data, created_ms, used_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
             ON CONFLICT (kind, id_sha256) DO UPDATE SET owner = excluded.owner,
                profile = excluded.profile, data = excluded.data,
                created_ms = excluded.created_ms, used_ms = excluded.used_ms",
            params![
                kind.as_str(),
                &session_key(id)[..],
                owner,
                profile,
                text,
                now
            ],
        )
        .map_err(|e| self.query_error(format!("store a {} session", kind.as_str()), e))?;
        Ok(())
    }

    /// Live session `id` of `kind` while alive under `life`; an expired one
    /// is deleted.
    pub fn live_session_get(
        &self,
        kind: LiveKind,
        id: &str,
        life: Lifetime,
    ) -> Result<Option<LiveSession>, StoreError> {
        let key = session_key(id);
        let conn = self.lock();
        let row: Option<(String, Option<String>, String, i64, i64)> = conn
            .query_row(
                "SELECT owner, profile, data, created_ms, used_ms FROM live_sessions
                 WHERE kind = ?1 AND id_sha256 = ?2",
                params![kind.as_str(), &key[..]],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()
            .map_err(|e| self.query_error(format!("read a {} session", kind.as_str()), e))?;
        let Some((owner, profile, data, created_ms, used_ms)) = row else {
            return Ok(None);
        };
        if !alive(created_ms, used_ms, life, now_ms()) {
            conn.execute(
                "DELETE FROM live_sessions WHERE kind = ?1 AND id_sha256 = ?2",
                params![kind.as_str(), &key[..]],
            )
            .map_err(|e| self.query_error(format!("end a {} session", kind.as_str()), e))?;
            return Ok(None);
        }
        Ok(Some(LiveSession {
            kind,
            owner,
            profile,
            data: serde_json::from_str(&data).unwrap_or(Value::Null),
            created_ms,
            used_ms,
        }))
    }

    /// Marks session `id` used now; whether it exists.
    pub fn live_session_touch(&self, kind: LiveKind, id: &str) -> Result<bool, StoreError> {
        let conn = self.lock();
        let n = conn
            .execute(
                "UPDATE live_sessions SET used_ms = max(used_ms, ?3)
                 WHERE kind = ?1 AND id_sha256 = ?2",
                params![kind.as_str(), &session_key(id)[..], now_ms()],
            )
            .map_err(|e| self.query_error(format!("mark a {} session used", kind.as_str()), e))?;
        Ok(n > 0)
    }

    /// Ends session `id`; whether it existed.
    pub fn live_session_delete(&self, kind: LiveKind, id: &str) -> Result<bool, StoreError> {
        let conn = self.lock();
        let n = conn
            .execute(
                "DELETE FROM live_sessions WHERE kind = ?1 AND id_sha256 = ?2",
                params![kind.as_str(), &session_key(id)[..]],
            )
            .map_err(|e| self.query_error(format!("end a {} session", kind.as_str()), e))?;
        Ok(n > 0)
    }

    /// Deletes every session of `kind` expired under `life`; how many.
    pub fn live_sessions_sweep(&self, kind: LiveKind, life: Lifetime) -> Result<u64, StoreError> {
        let now = now_ms();
        let conn = self.lock();
        let n = conn
            .execute(
                "DELETE FROM live_sessions WHERE kind = ?1
                 AND (used_ms + ?2 <= ?4 OR (?3 IS NOT NULL AND created_ms + ?3 <= ?4))",
                params![kind.as_str(), life.idle_ms, life.max_age_ms, now],
            )
            .map_err(|e| self.query_error(format!("sweep {} sessions", kind.as_str()), e))?;
        Ok(n as u64)
    }

    /// Keeps the `keep` most recently used sessions of `kind`; how many went.
    pub fn live_sessions_trim(&self, kind: LiveKind, keep: u64) -> Result<u64, StoreError> {
        let conn = self.lock();
        let n = conn
            .execute(
                "DELETE FROM live_sessions WHERE kind = ?1 AND id_sha256 IN (
                    SELECT id_sha256 FROM live_sessions WHERE kind = ?1
                    ORDER BY used_ms DESC LIMIT -1 OFFSET ?2)",
                params![kind.as_str(), keep as i64],
            )
            .map_err(|e| self.query_error(format!("trim {} sessions", kind.as_str()), e))?;
        Ok(n as u64)
    }

    /// How many sessions of `kind` `owner` holds alive under `life`.
    pub fn live_sessions_held(
        &self,
        kind: LiveKind,
        owner: &str,
        life: Lifetime,
    ) -> Result<u64, StoreError> {
        let now = now_ms();
        let conn = self.lock();
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM live_sessions WHERE kind = ?1 AND owner = ?2
                 AND used_ms + ?3 > ?5 AND (?4 IS NULL OR created_ms + ?4 > ?5)",
                params![kind.as_str(), owner, life.idle_ms, life.max_age_ms, now],
                |r| r.get(0),
            )
            .map_err(|e| self.query_error(format!("count {} sessions", kind.as_str()), e))?;
        Ok(n as u64)
    }

    /// Stores a one-time login code for `name`, good for `lifetime_ms`.
    pub fn login_code_put(
        &self,
        code: &str,
        name: &str,
        lifetime_ms: i64,
    ) -> Result<(), StoreError> {
        check_session(name, None, &Value::Null)?;
        let now = now_ms();
        let mut conn = self.lock();
        let tx = conn
            .transaction()
            .map_err(|e| self.query_error("store a login code".to_owned(), e))?;
        let run = || -> rusqlite::Result<()> {
            tx.execute(
                "DELETE FROM login_codes WHERE expires_ms <= ?1",
                params![now],
            )?;
            tx.execute(
                "DELETE FROM login_codes WHERE code_sha256 IN (
                    SELECT code_sha256 FROM login_codes ORDER BY minted_ms DESC, rowid DESC
                    LIMIT -1 OFFSET ?1)",
                params![MAX_CODES as i64 - 1],
            )?;
            tx.execute(
                "INSERT INTO login_codes (code_sha256, name, minted_ms, expires_ms)
                 VALUES (?1, ?2, ?3, ?4)",
                params![&session_key(code)[..], name, now, now + lifetime_ms],
            )?;
            Ok(())
        };
        run()
            .and_then(|()| tx.commit())
            .map_err(|e| self.query_error("store a login code".to_owned(), e))
    }

    /// Spends `code`: the user it was minted for, once, while it is fresh.
    pub fn login_code_redeem(&self, code: &str) -> Result<Option<String>, StoreError> {
        let conn = self.lock();
        let row: Option<(String, i64)> = conn
            .query_row(
                "DELETE FROM login_codes WHERE code_sha256 = ?1 RETURNING name, expires_ms",
                params![&session_key(code)[..]],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| self.query_error("spend a login code".to_owned(), e))?;
        Ok(row.and_then(|(name, expires)| (expires > now_ms()).then_some(name)))
    }

    /// The control epoch now.
    pub fn control_epoch(&self) -> Result<i64, StoreError> {
        let conn = self.lock();
        conn.prepare_cached("SELECT n FROM control_epoch WHERE id = 1")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(|e| self.query_error("read the control epoch".to_owned(), e))
    }
}
