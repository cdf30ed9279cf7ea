//! Agent sessions and their transcripts: what `plugd run --session` and the HTTP API resume.
//!
//! A session is a row with its id and creation time; its transcript is an
//! ordered list of entries, each stored as one JSON document (the agent turn
//! decides their shape). Entries of one turn are appended in one transaction,
//! so a crash mid-turn leaves either all of them or none.
//!
//! **API boundary:** plain data in and out ([`SessionRow`], [`serde_json::Value`]
//! entries); nothing SQLite-specific leaks.

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StoreError;
use crate::store::Store;

/// Schema step 4: sessions and their transcripts.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE sessions (
        id         TEXT PRIMARY KEY NOT NULL,
        created_at TEXT NOT NULL
    ) STRICT;
    CREATE TABLE transcript_entries (
        id         INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        body       TEXT NOT NULL
    ) STRICT;
    CREATE INDEX transcript_by_session ON transcript_entries (session_id, id);
";

/// Longest session id accepted.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Whether `id` is an acceptable session id: 1-128 of `[A-Za-z0-9_.-]`.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SESSION_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// One stored session (without its transcript).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    /// Its id.
    pub id: String,
    /// When it was first stored (RFC 3339).
    pub created_at: String,
}

impl Store {
    fn check_session_id(id: &str) -> Result<(), StoreError> {
        if valid_session_id(id) {
            Ok(())
        } else {
            Err(StoreError::Invalid {
                what: format!("session id {id:?}"),
                problem: "use 1-128 characters of letters, digits, '-', '_' and '.'",
            })
        }
    }

    /// The session `id`, if stored.
    pub fn session_get(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        Self::check_session_id(id)?;
        self.lock()
            .query_row(
                "SELECT id, created_at FROM sessions WHERE id = ?1",
                params![id],
                |r| {
                    Ok(SessionRow {
                        id: r.get(0)?,
                        created_at: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.query_error(format!("read session {id:?}"), e))
    }

    /// Stores session `id` unless it exists. Returns the row and whether it
    /// was created by this call.
    pub fn session_ensure(&self, id: &str) -> Result<(SessionRow, bool), StoreError> {
        Self::check_session_id(id)?;
        let now = crate::now_rfc3339();
        let created = self
            .lock()
            .execute(
                "INSERT INTO sessions (id, created_at) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING",
                params![id, now],
            )
            .map_err(|e| self.query_error(format!("create session {id:?}"), e))?;
        let row = self.session_get(id)?.ok_or_else(|| StoreError::Invalid {
            what: format!("session id {id:?}"),
            problem: "the session vanished right after it was stored; retry",
        })?;
        Ok((row, created > 0))
    }

    /// Appends `entries` to the transcript of session `id` (which must
    /// exist), in one transaction.
    pub fn session_append(&self, id: &str, entries: &[Value]) -> Result<(), StoreError> {
        Self::check_session_id(id)?;
        let action = || format!("append to the transcript of session {id:?}");
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let write = || -> rusqlite::Result<()> {
            let mut stmt =
                tx.prepare("INSERT INTO transcript_entries (session_id, body) VALUES (?1, ?2)")?;
            for entry in entries {
                stmt.execute(params![id, entry.to_string()])?;
            }
            Ok(())
        };
        write().map_err(|e| self.query_error(action(), e))?;
        tx.commit().map_err(|e| self.query_error(action(), e))
    }

    /// The stored sessions, newest first (by creation time, then id),
    /// at most `limit`.
    pub fn session_list(&self, limit: usize) -> Result<Vec<SessionRow>, StoreError> {
        let conn = self.lock();
        let read = || -> rusqlite::Result<Vec<SessionRow>> {
            let mut stmt = conn.prepare(
                "SELECT id, created_at FROM sessions ORDER BY created_at DESC, id DESC LIMIT ?1",
            )?;
            stmt.query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                Ok(SessionRow {
                    id: r.get(0)?,
                    created_at: r.get(1)?,
                })
            })?
            .collect()
        };
        read().map_err(|e| self.query_error("list sessions".to_owned(), e))
    }

    /// How many transcript entries session `id` has, and its last `limit`
    /// entries, oldest first (`0` and none when unknown).
    pub fn session_tail(&self, id: &str, limit: usize) -> Result<(usize, Vec<Value>), StoreError> {
        Self::check_session_id(id)?;
        let action = || format!("read the transcript of session {id:?}");
        let (total, rows): (i64, Vec<String>) = {
            let conn = self.lock();
            let read = || -> rusqlite::Result<(i64, Vec<String>)> {
                let total = conn.query_row(
                    "SELECT COUNT(*) FROM transcript_entries WHERE session_id = ?1",
                    params![id],
                    |r| r.get(0),
                )?;
                let mut stmt = conn.prepare(
                    "SELECT body FROM (SELECT id, body FROM transcript_entries WHERE session_id = ?1
                     ORDER BY id DESC LIMIT ?2) ORDER BY id",
                )?;
                let rows = stmt
                    .query_map(params![id, i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                        r.get(0)
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                Ok((total, rows))
            };
            read().map_err(|e| self.query_error(action(), e))?
        };
        let entries = rows
            .into_iter()
            .map(|body| {
                serde_json::from_str(&body).map_err(|e| StoreError::Corrupt {
                    db: self.label().to_owned(),
                    plugin_id: format!("session {id}"),
                    detail: format!("a transcript entry is not JSON ({e})"),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok((usize::try_from(total).unwrap_or(0), entries))
    }

    /// The transcript of session `id`, oldest first (empty when unknown).
    pub fn session_transcript(&self, id: &str) -> Result<Vec<Value>, StoreError> {
        Self::check_session_id(id)?;
        let action = || format!("read the transcript of session {id:?}");
        let rows: Vec<String> = {
            let conn = self.lock();
            let read = || -> rusqlite::Result<Vec<String>> {
                let mut stmt = conn.prepare(
                    "SELECT body FROM transcript_entries WHERE session_id = ?1 ORDER BY id",
                )?;
                stmt.query_map(params![id], |r| r.get(0))?.collect()
            };
            read().map_err(|e| self.query_error(action(), e))?
        };
        rows.into_iter()
            .map(|body| {
                serde_json::from_str(&body).map_err(|e| StoreError::Corrupt {
                    db: self.label().to_owned(),
                    plugin_id: format!("session {id}"),
                    detail: format!("a transcript entry is not JSON ({e})"),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_round_trip_and_ids_are_checked() {
        let store = Store::open_in_memory().unwrap();
        let (row, created) = store.session_ensure("s_1").unwrap();
        assert!(created);
        assert_eq!(row.id, "s_1");
        let (again, created) = store.session_ensure("s_1").unwrap();
        assert!(!created);
        assert_eq!(again, row);
        store
            .session_append(
                "s_1",
                &[serde_json::json!({"role": "user", "content": "hi"})],
            )
            .unwrap();
        store
            .session_append(
                "s_1",
                &[serde_json::json!({"role": "assistant", "content": "yo"})],
            )
            .unwrap();
        let t = store.session_transcript("s_1").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1]["content"], "yo");
        assert!(store.session_transcript("other").unwrap().is_empty());
        assert!(store.session_get("nope").unwrap().is_none());
        for bad in ["", "a/b", "has space", &"x".repeat(129)] {
            assert!(matches!(
                store.session_ensure(bad),
                Err(StoreError::Invalid { .. })
            ));
        }
        assert!(valid_session_id(&"x".repeat(128)));
    }

    #[test]
    fn sessions_list_newest_first_and_tails_are_bounded() {
        let store = Store::open_in_memory().unwrap();
        assert!(store.session_list(10).unwrap().is_empty());
        for id in ["a", "b", "c"] {
            store.session_ensure(id).unwrap();
        }
        let ids: Vec<String> = store
            .session_list(2)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        // Same second: the id breaks the tie, newest (largest) first.
        assert_eq!(ids.len(), 2);
        let entries: Vec<Value> = (0..5).map(|i| serde_json::json!({"n": i})).collect();
        store.session_append("b", &entries).unwrap();
        let (total, tail) = store.session_tail("b", 2).unwrap();
        assert_eq!(total, 5);
        assert_eq!(
            tail,
            [serde_json::json!({"n": 3}), serde_json::json!({"n": 4})]
        );
        assert_eq!(store.session_tail("zz", 2).unwrap(), (0, Vec::new()));
        assert!(store.session_tail("a/b", 2).is_err());
    }
}
