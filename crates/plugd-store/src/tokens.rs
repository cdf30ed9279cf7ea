//! API tokens of `plugd serve`'s TCP listener (only their SHA-256 is stored)
//! and the audit trail of state-changing requests.
//!
//! A token reads `plugd_<id>_<secret>`: `id` is 16 hex digits (the row's
//! key, shown by `plugd token list`), `secret` 64 hex digits from the OS
//! RNG. The database keeps `sha256(secret)`; [`Store::token_verify`] looks
//! the row up by id and compares hashes in constant time, so neither a
//! database copy nor a timing probe gives a usable token.
//!
//! **API boundary:** plain data in and out; nothing SQLite-specific leaks.

use rusqlite::{OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::outbox::now_ms;
use crate::store::Store;

pub use plugd_control::store::tokens::{
    AuditEntry, AuditFilter, AuditPage, BadTokenField, NewToken, Role, StatusMatch, Tenancy,
    TokenInfo, TokenRejection, check_scope, check_token_name, expires_at_ms, parse_lifetime,
    parse_role,
};

/// Schema step: API tokens and the audit trail.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE api_tokens (
        id            TEXT PRIMARY KEY NOT NULL,
        name          TEXT NOT NULL,
        role          TEXT NOT NULL,
        secret_sha256 BLOB NOT NULL,
        created_at    TEXT NOT NULL,
        created_by    TEXT NOT NULL,
        expires_at_ms INTEGER,
        revoked_at    TEXT,
        last_used_ms  INTEGER
    ) STRICT;
    CREATE UNIQUE INDEX api_tokens_live_name ON api_tokens (name) WHERE revoked_at IS NULL;
    CREATE TABLE audit (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,
        at       TEXT NOT NULL,
        identity TEXT NOT NULL,
        role     TEXT NOT NULL,
        method   TEXT NOT NULL,
        path     TEXT NOT NULL,
        status   INTEGER NOT NULL
    ) STRICT;
";

/// Schema step: the MCP profiles a token is limited to (JSON array; NULL:
/// not limited).
pub(crate) const PROFILES_MIGRATION: &str = "ALTER TABLE api_tokens ADD COLUMN mcp_profiles TEXT;";

const PREFIX: &str = "plugd_";
const ID_HEX: usize = 16;
const SECRET_HEX: usize = 64;
/// `last_used` is written at most once a minute per token.
const LAST_USED_GRANULARITY_MS: i64 = 60_000;

fn random_hex(bytes: usize) -> Result<String, StoreError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| StoreError::Random(e.to_string()))?;
    Ok(hex::encode(b))
}

fn secret_hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Splits `plugd_<id>_<secret>` into its id and secret; `None` when the
/// shape is wrong.
/// The id part of an API token string (`plugd_ID_SECRET`), when it has the
/// shape of one; nothing is checked against the store.
pub fn token_id(token: &str) -> Option<&str> {
    split_token(token).map(|(id, _)| id)
}

fn split_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, ID_HEX) && hex(secret, SECRET_HEX)).then_some((id, secret))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn ms_rfc3339(ms: i64) -> String {
    crate::time::format_unix_secs(u64::try_from(ms.max(0) / 1000).unwrap_or(0))
}

type RawToken = (
    String,
    String,
    String,
    String,
    String,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn token_info(label: &str, r: RawToken) -> Result<TokenInfo, StoreError> {
    let (
        id,
        name,
        role,
        created_at,
        created_by,
        expires,
        revoked_at,
        last_used,
        profiles,
        org,
        projects,
    ) = r;
    // A JSON list of names in column `field`, if set.
    let names = |field: &str, text: Option<String>| {
        text.map(|p| {
            serde_json::from_str::<Vec<String>>(&p).map_err(|e| StoreError::Damaged {
                db: label.to_owned(),
                what: format!("token {id}"),
                detail: format!("{field} is not a JSON list of names: {e}"),
            })
        })
        .transpose()
    };
    let project_ids = names("project_ids", projects)?.unwrap_or_default();
    let mcp_profiles = names("mcp_profiles", profiles)?;
    let role = role.parse().map_err(|detail| StoreError::Damaged {
        db: label.to_owned(),
        what: format!("token {id}"),
        detail,
    })?;
    Ok(TokenInfo {
        id,
        name,
        role,
        created_at,
        created_by,
        expires_at: expires.map(ms_rfc3339),
        revoked_at,
        last_used_at: last_used.map(ms_rfc3339),
        mcp_profiles,
        org_id: org,
        project_ids,
    })
}

const TOKEN_COLUMNS: &str = "id, name, role, created_at, created_by, expires_at_ms, revoked_at, last_used_ms, mcp_profiles, org_id, project_ids";

fn raw_token(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawToken> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
    ))
}

impl Store {
    /// Makes a token named `name` with `role`, valid until `expires_at_ms`
    /// (ms since the epoch) if given. A live token of the same name is an
    /// error ([`StoreError::Conflict`]).
    pub fn token_create(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
    ) -> Result<NewToken, StoreError> {
        self.token_create_limited(name, role, expires_at_ms, created_by, None)
    }

    /// [`Store::token_create`], limited to the MCP profiles `mcp_profiles`
    /// when given.
    pub fn token_create_limited(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
    ) -> Result<NewToken, StoreError> {
        self.token_create_scoped(name, role, expires_at_ms, created_by, mcp_profiles, None)
    }

    /// [`Store::token_create_limited`], bound to an org (and projects) when
    /// `tenancy` is given.
    pub fn token_create_scoped(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
        tenancy: Option<&Tenancy>,
    ) -> Result<NewToken, StoreError> {
        let org_id = tenancy.map(|t| t.org_id.clone());
        let project_ids = tenancy.map(|t| t.project_ids.clone()).unwrap_or_default();
        let projects_json =
            (!project_ids.is_empty()).then(|| serde_json::json!(project_ids).to_string());
        let profiles_json = mcp_profiles.map(|p| serde_json::json!(p).to_string());
        let id = random_hex(ID_HEX / 2)?;
        let secret = random_hex(SECRET_HEX / 2)?;
        let created_at = crate::now_rfc3339();
        let hash = secret_hash(&secret);
        let result = self.lock().execute(
            "INSERT INTO api_tokens (id, name, role, secret_sha256, created_at, created_by, expires_at_ms, mcp_profiles, org_id, project_ids)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![id, name, role.as_str(), &hash[..], created_at, created_by, expires_at_ms, profiles_json, org_id, projects_json],
        );
        match result {
            Ok(_) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                return Err(StoreError::Conflict(format!(
                    "a live token named {name:?} exists; revoke it (`plugd token revoke ID`) or pick another name"
                )));
            }
            Err(e) => return Err(self.query_error(format!("create token {name:?}"), e)),
        }
        self.forget_tokens();
        let token = format!("{PREFIX}{id}_{secret}");
        Ok(NewToken {
            info: TokenInfo {
                id,
                name: name.to_owned(),
                role,
                created_at,
                created_by: created_by.to_owned(),
                expires_at: expires_at_ms.map(ms_rfc3339),
                revoked_at: None,
                last_used_at: None,
                mcp_profiles: mcp_profiles.map(<[String]>::to_vec),
                org_id,
                project_ids,
            },
            token,
        })
    }

    /// Every token, live and revoked, oldest first.
    pub fn token_list(&self) -> Result<Vec<TokenInfo>, StoreError> {
        let conn = self.lock();
        let rows = conn
            .prepare(&format!(
                "SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at, id"
            ))
            .and_then(|mut s| {
                s.query_map([], raw_token)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| self.query_error("list tokens".into(), e))?;
        drop(conn);
        rows.into_iter()
            .map(|r| token_info(self.label(), r))
            .collect()
    }

    /// Revokes token `id` (or the live token named `id`); the record as it
    /// is now, `None` when no token matches. Revoking twice keeps the first
    /// time.
    pub fn token_revoke(&self, id_or_name: &str) -> Result<Option<TokenInfo>, StoreError> {
        let conn = self.lock();
        // Both rows when one token's id is another live token's name; the
        // record shown is the one revoked now (by id first), so an older
        // token of the same name revoked in the same second is never shown.
        let revoked: Vec<String> = conn
            .prepare(
                "UPDATE api_tokens SET revoked_at = ?2
                 WHERE revoked_at IS NULL AND (id = ?1 OR name = ?1)
                 RETURNING id",
            )
            .and_then(|mut st| {
                st.query_map(params![id_or_name, crate::now_rfc3339()], |r| r.get(0))?
                    .collect()
            })
            .map_err(|e| self.query_error(format!("revoke token {id_or_name:?}"), e))?;
        self.forget_tokens();
        let shown = revoked
            .iter()
            .find(|id| id.as_str() == id_or_name)
            .or(revoked.first())
            .map_or(id_or_name, String::as_str);
        let row = conn
            .query_row(
                &format!(
                    "SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = ?1
                     OR (name = ?1 AND NOT EXISTS (SELECT 1 FROM api_tokens WHERE id = ?1))
                     ORDER BY revoked_at DESC LIMIT 1"
                ),
                params![shown],
                raw_token,
            )
            .optional()
            .map_err(|e| self.query_error(format!("read token {id_or_name:?}"), e))?;
        drop(conn);
        row.map(|r| token_info(self.label(), r)).transpose()
    }

    /// Checks a presented token string: its record when it is live, else why
    /// not. Records when it was last used (at most once a minute).
    pub fn token_verify(
        &self,
        token: &str,
    ) -> Result<Result<TokenInfo, TokenRejection>, StoreError> {
        let Some((id, secret)) = split_token(token) else {
            return Ok(Err(TokenRejection::Invalid));
        };
        // Every authenticated request runs this. The row is cached while no
        // other connection committed anything (SQLite's `data_version`,
        // read at most once per [`TOKEN_RECHECK`]: reading it starts a read
        // transaction, file locks included, which cost more than the rest of
        // the check), so a token created, revoked or expired by another
        // process (`plugd token revoke`) counts from the next request after
        // that millisecond, and this process's own token writes clear the
        // cache themselves. A hit inside that window does not touch the
        // connection (nor wait for an audit batch holding it).
        let now_checked = std::time::Instant::now();
        let hit = {
            let cache = self.token_cache.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = cache.version.is_some()
                && cache
                    .checked_at
                    .is_some_and(|t| now_checked.duration_since(t) < TOKEN_RECHECK);
            if fresh {
                cache.rows.get(id).cloned()
            } else {
                None
            }
        };
        let (row, conn) = match hit {
            Some(hit) => (Some(hit), None),
            None => {
                let conn = self.lock();
                let version: i64 = conn
                    .prepare_cached("PRAGMA data_version")
                    .and_then(|mut st| st.query_row([], |r| r.get(0)))
                    .map_err(|e| self.query_error("verify a token".into(), e))?;
                let mut cache = self.token_cache.lock().unwrap_or_else(|p| p.into_inner());
                if cache.version != Some(version) {
                    cache.rows.clear();
                    cache.version = Some(version);
                }
                cache.checked_at = Some(now_checked);
                let row = match cache.rows.get(id) {
                    Some(hit) => Some(hit.clone()),
                    None => {
                        let row = conn
                            .prepare_cached(&format!(
                                "SELECT {TOKEN_COLUMNS}, secret_sha256 FROM api_tokens WHERE id = ?1"
                            ))
                            .and_then(|mut st| {
                                st.query_row(params![id], |r| {
                                    Ok((raw_token(r)?, r.get::<_, Vec<u8>>(11)?))
                                })
                                .optional()
                            })
                            .map_err(|e| self.query_error("verify a token".into(), e))?;
                        if let Some(row) = &row {
                            if cache.rows.len() >= TOKEN_CACHE_MAX {
                                cache.rows.clear();
                            }
                            cache.rows.insert(id.to_owned(), row.clone());
                        }
                        row
                    }
                };
                drop(cache);
                (row, Some(conn))
            }
        };
        let Some((raw, stored)) = row else {
            return Ok(Err(TokenRejection::Invalid));
        };
        if !ct_eq(&stored, &secret_hash(secret)) {
            return Ok(Err(TokenRejection::Invalid));
        }
        let (last_used, expires_ms) = (raw.7, raw.5);
        let info = token_info(self.label(), raw)?;
        if let Some(at) = &info.revoked_at {
            return Ok(Err(TokenRejection::Revoked(at.clone())));
        }
        let now = now_ms();
        if let (Some(at), Some(ms)) = (&info.expires_at, expires_ms)
            && ms <= now
        {
            return Ok(Err(TokenRejection::Expired(at.clone())));
        }
        if last_used.is_none_or(|t| now - t >= LAST_USED_GRANULARITY_MS) {
            let conn = conn.unwrap_or_else(|| self.lock());
            conn.execute(
                "UPDATE api_tokens SET last_used_ms = ?2 WHERE id = ?1",
                params![info.id, now],
            )
            .map_err(|e| self.query_error("record a token's use".into(), e))?;
            let mut cache = self.token_cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = cache.rows.get_mut(id) {
                hit.0.7 = Some(now);
            }
        }
        Ok(Ok(info))
    }

    /// The record of token `id` when it is live (not revoked, not expired),
    /// else why not. The secret is not checked (the caller did, earlier) and
    /// the last use is not stamped.
    pub fn token_live(&self, id: &str) -> Result<Result<TokenInfo, TokenRejection>, StoreError> {
        let raw = self
            .lock()
            .prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = ?1"
            ))
            .and_then(|mut st| st.query_row(params![id], raw_token).optional())
            .map_err(|e| self.query_error("read a token".into(), e))?;
        let Some(raw) = raw else {
            return Ok(Err(TokenRejection::Invalid));
        };
        let expires_ms = raw.5;
        let info = token_info(self.label(), raw)?;
        if let Some(at) = &info.revoked_at {
            return Ok(Err(TokenRejection::Revoked(at.clone())));
        }
        if let (Some(at), Some(ms)) = (&info.expires_at, expires_ms)
            && ms <= now_ms()
        {
            return Ok(Err(TokenRejection::Expired(at.clone())));
        }
        Ok(Ok(info))
    }

    /// Appends one state-changing request to the audit trail.
    pub fn audit_record(
        &self,
        identity: &str,
        role: Role,
        method: &str,
        path: &str,
        status: u16,
    ) -> Result<(), StoreError> {
        self.lock()
            .prepare_cached(
                "INSERT INTO audit (at, identity, role, method, path, status)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    crate::now_rfc3339(),
                    identity,
                    role.as_str(),
                    method,
                    path,
                    status
                ])
            })
            .map_err(|e| self.query_error("record an audit entry".into(), e))?;
        Ok(())
    }

    /// The last `limit` audit entries, newest last.
    pub fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let conn = self.lock();
        let mut rows = conn
            .prepare(
                "SELECT seq, at, identity, role, method, path, status FROM audit
                 ORDER BY seq DESC LIMIT ?1",
            )
            .and_then(|mut s| {
                s.query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                    Ok(AuditEntry {
                        seq: r.get(0)?,
                        at: r.get(1)?,
                        identity: r.get(2)?,
                        role: r.get(3)?,
                        method: r.get(4)?,
                        path: r.get(5)?,
                        status: r.get(6)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| self.query_error("list the audit trail".into(), e))?;
        rows.reverse();
        Ok(rows)
    }

    /// One page of the audit entries `f` matches, newest first.
    pub fn audit_page(&self, f: &AuditFilter) -> Result<AuditPage, StoreError> {
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        let mut sql =
            String::from("SELECT seq, at, identity, role, method, path, status FROM audit WHERE 1");
        let mut push = |sql: &mut String, clause: &str, v: rusqlite::types::Value| {
            args.push(v);
            sql.push_str(&clause.replace("?N", &format!("?{}", args.len())));
        };
        if let Some(id) = &f.identity {
            push(&mut sql, " AND identity = ?N", id.clone().into());
        }
        if let Some(q) = f.q.as_deref().filter(|q| !q.is_empty()) {
            // SQLite's `lower` folds ASCII letters only: so does the needle.
            push(
                &mut sql,
                " AND (instr(lower(identity), ?N) OR instr(lower(method), ?N)
                       OR instr(lower(path), ?N))",
                q.to_ascii_lowercase().into(),
            );
        }
        if let Some(status) = f.status {
            let (lo, hi) = status.range();
            push(&mut sql, " AND status >= ?N", i64::from(lo).into());
            push(&mut sql, " AND status <= ?N", i64::from(hi).into());
        }
        if let Some(ms) = f.since_ms {
            push(&mut sql, " AND at >= ?N", AuditFilter::at_bound(ms).into());
        }
        if let Some(ms) = f.until_ms {
            push(&mut sql, " AND at < ?N", AuditFilter::at_bound(ms).into());
        }
        if let Some(seq) = f.before_seq {
            push(&mut sql, " AND seq < ?N", seq.into());
        }
        let page = f.page_size();
        push(
            &mut sql,
            " ORDER BY seq DESC LIMIT ?N",
            (page as i64 + 1).into(),
        );
        let conn = self.lock();
        let rows = conn
            .prepare_cached(&sql)
            .and_then(|mut st| {
                st.query_map(rusqlite::params_from_iter(args.iter()), |r| {
                    Ok(AuditEntry {
                        seq: r.get(0)?,
                        at: r.get(1)?,
                        identity: r.get(2)?,
                        role: r.get(3)?,
                        method: r.get(4)?,
                        path: r.get(5)?,
                        status: r.get(6)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| self.query_error("list the audit trail".into(), e))?;
        Ok(AuditPage::from_rows(rows, page))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_only_whole_and_live() {
        let store = Store::open_in_memory().unwrap();
        let t = store.token_create("ci", Role::Agent, None, "root").unwrap();
        assert!(t.token.starts_with("plugd_"));
        let ok = store.token_verify(&t.token).unwrap().unwrap();
        assert_eq!((ok.name.as_str(), ok.role), ("ci", Role::Agent));
        // One changed secret digit, a truncated token, another prefix.
        let mut bad = t.token.clone();
        let last = bad.pop().unwrap();
        bad.push(if last == '0' { '1' } else { '0' });
        for wrong in [bad.as_str(), &t.token[..t.token.len() - 1], "Bearer x", ""] {
            assert_eq!(
                store.token_verify(wrong).unwrap(),
                Err(TokenRejection::Invalid),
                "{wrong:?}"
            );
        }
        // The secret itself is nowhere in the database.
        let secret = t.token.rsplit('_').next().unwrap();
        let n: i64 = store
            .lock()
            .query_row(
                "SELECT count(*) FROM api_tokens WHERE hex(secret_sha256) = upper(?1) OR id = ?1",
                params![secret],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 0);
        let revoked = store.token_revoke("ci").unwrap().unwrap();
        assert!(revoked.revoked_at.is_some());
        assert!(matches!(
            store.token_verify(&t.token).unwrap(),
            Err(TokenRejection::Revoked(_))
        ));
        // The name is free again once revoked; a live duplicate is refused.
        store
            .token_create("ci", Role::Viewer, None, "root")
            .unwrap();
        assert!(matches!(
            store.token_create("ci", Role::Viewer, None, "root"),
            Err(StoreError::Conflict(_))
        ));
        assert!(store.token_revoke("nope").unwrap().is_none());
    }

    #[test]
    fn an_expired_token_is_refused() {
        let store = Store::open_in_memory().unwrap();
        let t = store
            .token_create("old", Role::Admin, Some(now_ms() - 1000), "root")
            .unwrap();
        assert!(matches!(
            store.token_verify(&t.token).unwrap(),
            Err(TokenRejection::Expired(_))
        ));
        let fresh = store
            .token_create("new", Role::Admin, Some(now_ms() + 60_000), "root")
            .unwrap();
        assert!(store.token_verify(&fresh.token).unwrap().is_ok());
    }

    #[test]
    fn roles_parse_by_name_only() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        assert!(
            "root"
                .parse::<Role>()
                .unwrap_err()
                .contains("admin, operator")
        );
    }

    #[test]
    fn the_audit_writer_loses_nothing_past_its_queue_and_writes_all_before_it_drops() {
        let store = std::sync::Arc::new(Store::open_in_memory().unwrap());
        let writer = AuditWriter::start(store.clone());
        let n = crate::journal::QUEUE + 1000;
        std::thread::scope(|s| {
            for t in 0..4 {
                let w = &writer;
                s.spawn(move || {
                    for i in (t..n).step_by(4) {
                        w.record("token:ci", Role::Agent, "POST", &format!("/v1/x/{i}"), 200);
                    }
                });
            }
        });
        drop(writer);
        let all = store.audit_list(n + 10).unwrap();
        assert_eq!(all.len(), n, "every entry written, none twice");
        let paths: std::collections::BTreeSet<&str> = all.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths.len(), n);
        assert!(
            all.iter()
                .all(|e| e.identity == "token:ci" && e.role == "agent" && e.status == 200)
        );
    }

    #[test]
    fn a_cached_token_is_refused_at_the_next_request_after_another_process_revokes_it() {
        let dir = tempfile::tempdir().unwrap();
        let serve = Store::open(&dir.path().join(".plugd")).unwrap();
        let t = serve.token_create("ci", Role::Agent, None, "root").unwrap();
        // Verified (and cached) twice by serve's connection.
        assert!(serve.token_verify(&t.token).unwrap().is_ok());
        assert!(serve.token_verify(&t.token).unwrap().is_ok());
        // `plugd token revoke` is another process: another connection.
        let cli = Store::open(&dir.path().join(".plugd")).unwrap();
        assert!(cli.token_revoke("ci").unwrap().is_some());
        std::thread::sleep(TOKEN_RECHECK);
        assert!(matches!(
            serve.token_verify(&t.token).unwrap(),
            Err(TokenRejection::Revoked(_))
        ));
        // A new token made elsewhere works at once; a wrong secret never does.
        let u = cli.token_create("ci2", Role::Viewer, None, "root").unwrap();
        std::thread::sleep(TOKEN_RECHECK);
        assert_eq!(
            serve.token_verify(&u.token).unwrap().unwrap().role,
            Role::Viewer
        );
        let mut wrong = u.token.clone();
        wrong.pop();
        wrong.push(if u.token.ends_with('0') { '1' } else { '0' });
        assert_eq!(
            serve.token_verify(&wrong).unwrap(),
            Err(TokenRejection::Invalid)
        );
        // This process's own revocation counts at once too.
        assert!(serve.token_revoke("ci2").unwrap().is_some());
        assert!(matches!(
            serve.token_verify(&u.token).unwrap(),
            Err(TokenRejection::Revoked(_))
        ));
    }
}

/// Verified-token rows by id, valid for one `data_version` of the database.
#[derive(Debug, Default)]
pub(crate) struct TokenCache {
    version: Option<i64>,
    checked_at: Option<std::time::Instant>,
    rows: std::collections::HashMap<String, (RawToken, Vec<u8>)>,
}

/// How long a read of `data_version` stands for the database's: another
/// process's token change counts at most this much later.
pub const TOKEN_RECHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// Most token rows cached (a flood of distinct unknown ids is not cached:
/// only rows that exist are).
const TOKEN_CACHE_MAX: usize = 1024;

impl Store {
    /// Drops the verified-token cache (after this connection's own token
    /// writes, which do not change its `data_version`).
    fn forget_tokens(&self) {
        let mut cache = self.token_cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.rows.clear();
        cache.version = None;
        cache.checked_at = None;
    }
}

/// One audit entry on its way to the database.
#[derive(Debug)]
pub(crate) struct PendingAudit {
    pub(crate) at: String,
    pub(crate) identity: String,
    pub(crate) role: Role,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) status: u16,
}

/// Appends audit entries off the request path: through the store's journal
/// writer ([`crate::journal`]), many per transaction and in the same
/// transaction as the invocation records, so a request does not wait for
/// SQLite. Bounded, and nothing is dropped: when the queue is full the
/// entry is written by the caller at once. Dropping the writer waits until
/// what it queued is written.
#[derive(Debug)]
pub struct AuditWriter {
    store: std::sync::Arc<dyn crate::StateStore>,
}

impl AuditWriter {
    /// A writer into `store` (any backend: it queues to the backend's
    /// journal, [`plugd_control::store::AuditStore::journal_audit`]).
    pub fn start(store: std::sync::Arc<dyn crate::StateStore>) -> AuditWriter {
        AuditWriter { store }
    }

    /// Queues one state-changing request for the audit trail.
    pub fn record(&self, identity: &str, role: Role, method: &str, path: &str, status: u16) {
        self.store
            .journal_audit(identity, role, method, path, status);
    }
}

impl Drop for AuditWriter {
    fn drop(&mut self) {
        self.store.flush_journal();
    }
}
