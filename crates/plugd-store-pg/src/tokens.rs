//! API tokens (only the SHA-256 of their secret) and the audit trail on PostgreSQL.
//!
//! Same token format as `plugd-store`'s `tokens.rs`: `plugd_<id>_<secret>`,
//! `id` 16 hex digits (the row's key), `secret` 64 hex digits from the OS
//! RNG; the database keeps `sha256(secret)` and the check compares hashes in
//! constant time. Creation, revocation, expiry and "last used" are judged
//! and stamped by the database's clock. Every check reads the row (no cache
//! yet): a token revoked through one node is refused by every other at its
//! next request.

use plugd_control::store::tokens::{
    AuditEntry, NewToken, Role, Tenancy, TokenInfo, TokenRejection,
};
use sha2::{Digest, Sha256};

use crate::clock::{NOW_MS, NOW_RFC3339, ms_rfc3339, random_hex};
use crate::{PgError, PgStore};

const PREFIX: &str = "plugd_";
const ID_HEX: usize = 16;
const SECRET_HEX: usize = 64;
/// `last_used` is written at most once a minute per token.
const LAST_USED_GRANULARITY_MS: i64 = 60_000;

const TOKEN_COLUMNS: &str = "id, name, role, created_at, created_by, expires_at_ms, revoked_at, last_used_ms, mcp_profiles, org_id, project_ids";

fn secret_hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Splits `plugd_<id>_<secret>` into its id and secret; `None` when the
/// shape is wrong.
fn split_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, ID_HEX) && hex(secret, SECRET_HEX)).then_some((id, secret))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl PgStore {
    /// Makes a token named `name` with `role`, valid until `expires_at_ms`
    /// (ms since the epoch) if given. A live token of the same name is an
    /// error ([`PgError::Conflict`]).
    pub async fn token_create(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
    ) -> Result<NewToken, PgError> {
        self.token_create_scoped(name, role, expires_at_ms, created_by, None, None)
            .await
    }

    /// [`PgStore::token_create`], limited to the MCP profiles `mcp_profiles`
    /// when given.
    pub async fn token_create_limited(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
    ) -> Result<NewToken, PgError> {
        self.token_create_scoped(name, role, expires_at_ms, created_by, mcp_profiles, None)
            .await
    }

    /// [`PgStore::token_create_limited`], bound to an org (and projects)
    /// when `tenancy` is given.
    pub async fn token_create_scoped(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
        tenancy: Option<&Tenancy>,
    ) -> Result<NewToken, PgError> {
        let org_id = tenancy.map(|t| t.org_id.clone());
        let project_ids = tenancy.map(|t| t.project_ids.clone()).unwrap_or_default();
        let projects_json =
            (!project_ids.is_empty()).then(|| serde_json::json!(project_ids).to_string());
        let profiles_json = mcp_profiles.map(|p| serde_json::json!(p).to_string());
        let id = random_hex(ID_HEX / 2)?;
        let secret = random_hex(SECRET_HEX / 2)?;
        let hash = secret_hash(&secret);
        let client = self.client().await?;
        let result = client
            .query_one(
                &format!(
                    "INSERT INTO api_tokens (id, name, role, secret_sha256, created_at, created_by,
                                             expires_at_ms, mcp_profiles, org_id, project_ids)
                     VALUES ($1, $2, $3, $4, {NOW_RFC3339}, $5, $6, $7, $8, $9)
                     RETURNING created_at"
                ),
                &[
                    &id,
                    &name,
                    &role.as_str(),
                    &&hash[..],
                    &created_by,
                    &expires_at_ms,
                    &profiles_json,
                    &org_id,
                    &projects_json,
                ],
            )
            .await;
        let created_at: String = match result {
            Ok(row) => row.get(0),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                return Err(PgError::Conflict(format!(
                    "a live token named {name:?} exists; revoke it (`plugd token revoke ID`) or pick another name"
                )));
            }
            Err(e) => return Err(self.query_error(format!("create token {name:?}"), e)),
        };
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
    pub async fn token_list(&self) -> Result<Vec<TokenInfo>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at, id"),
                &[],
            )
            .await
            .map_err(|e| self.query_error("list tokens", e))?;
        rows.iter().map(|r| self.token_info(r)).collect()
    }

    /// Revokes token `id` (or the live token named `id`) at the database's
    /// now; the record as it is now, `None` when no token matches. Revoking
    /// twice keeps the first time.
    pub async fn token_revoke(&self, id_or_name: &str) -> Result<Option<TokenInfo>, PgError> {
        let client = self.client().await?;
        // Both rows when one token's id is another live token's name (as on SQLite).
        let revoked = client
            .query(
                &format!(
                    "UPDATE api_tokens SET revoked_at = {NOW_RFC3339}
                     WHERE revoked_at IS NULL AND (id = $1 OR name = $1)
                     RETURNING {TOKEN_COLUMNS}"
                ),
                &[&id_or_name],
            )
            .await
            .map_err(|e| self.query_error(format!("revoke token {id_or_name:?}"), e))?;
        let by_id = revoked.iter().find(|r| r.get::<_, &str>(0) == id_or_name);
        if let Some(row) = by_id.or(revoked.first()) {
            return self.token_info(row).map(Some);
        }
        // Revoked before: the record as it is.
        // NULLS LAST: SQLite sorts NULL lowest, so its `DESC` puts them last.
        let row = client
            .query_opt(
                &format!(
                    "SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = $1
                     OR (name = $1 AND NOT EXISTS (SELECT 1 FROM api_tokens WHERE id = $1))
                     ORDER BY revoked_at DESC NULLS LAST LIMIT 1"
                ),
                &[&id_or_name],
            )
            .await
            .map_err(|e| self.query_error(format!("read token {id_or_name:?}"), e))?;
        row.map(|r| self.token_info(&r)).transpose()
    }

    /// Checks a presented token string: its record when it is live (by the
    /// database's clock), else why not. Records when it was last used (at
    /// most once a minute).
    pub async fn token_verify(
        &self,
        token: &str,
    ) -> Result<Result<TokenInfo, TokenRejection>, PgError> {
        let Some((id, secret)) = split_token(token) else {
            return Ok(Err(TokenRejection::Invalid));
        };
        // Every authenticated request runs this: cached statements.
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS}, secret_sha256, {NOW_MS} FROM api_tokens WHERE id = $1"
            ))
            .await
            .map_err(|e| self.query_error("verify a token", e))?;
        let row = client
            .query_opt(&stmt, &[&id])
            .await
            .map_err(|e| self.query_error("verify a token", e))?;
        let Some(row) = row else {
            return Ok(Err(TokenRejection::Invalid));
        };
        let stored: Vec<u8> = row.get(11);
        if !ct_eq(&stored, &secret_hash(secret)) {
            return Ok(Err(TokenRejection::Invalid));
        }
        let (expires_ms, last_used, now): (Option<i64>, Option<i64>, i64) =
            (row.get(5), row.get(7), row.get(12));
        let info = self.token_info(&row)?;
        if let Some(at) = &info.revoked_at {
            return Ok(Err(TokenRejection::Revoked(at.clone())));
        }
        if let (Some(at), Some(ms)) = (&info.expires_at, expires_ms)
            && ms <= now
        {
            return Ok(Err(TokenRejection::Expired(at.clone())));
        }
        if last_used.is_none_or(|t| now - t >= LAST_USED_GRANULARITY_MS) {
            let stmt = client
                .prepare_cached(&format!(
                    "UPDATE api_tokens SET last_used_ms = {NOW_MS}
                     WHERE id = $1 AND (last_used_ms IS NULL OR last_used_ms <= {NOW_MS} - $2)"
                ))
                .await
                .map_err(|e| self.query_error("record a token's use", e))?;
            client
                .execute(&stmt, &[&info.id, &LAST_USED_GRANULARITY_MS])
                .await
                .map_err(|e| self.query_error("record a token's use", e))?;
        }
        Ok(Ok(info))
    }

    /// The record of token `id` when it is live (not revoked, not expired by
    /// the database's clock), else why not. The secret is not checked (the
    /// caller did, earlier) and the last use is not stamped.
    pub async fn token_live(&self, id: &str) -> Result<Result<TokenInfo, TokenRejection>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {TOKEN_COLUMNS}, {NOW_MS} FROM api_tokens WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error("read a token", e))?;
        let Some(row) = row else {
            return Ok(Err(TokenRejection::Invalid));
        };
        let (expires_ms, now): (Option<i64>, i64) = (row.get(5), row.get(11));
        let info = self.token_info(&row)?;
        if let Some(at) = &info.revoked_at {
            return Ok(Err(TokenRejection::Revoked(at.clone())));
        }
        if let (Some(at), Some(ms)) = (&info.expires_at, expires_ms)
            && ms <= now
        {
            return Ok(Err(TokenRejection::Expired(at.clone())));
        }
        Ok(Ok(info))
    }

    /// Appends one state-changing request to the audit trail, stamped by the
    /// database's clock.
    pub async fn audit_record(
        &self,
        identity: &str,
        role: Role,
        method: &str,
        path: &str,
        status: u16,
    ) -> Result<(), PgError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "INSERT INTO audit (at, identity, role, method, path, status)
                 VALUES ({NOW_RFC3339}, $1, $2, $3, $4, $5)"
            ))
            .await
            .map_err(|e| self.query_error("record an audit entry", e))?;
        client
            .execute(
                &stmt,
                &[
                    &identity,
                    &role.as_str(),
                    &method,
                    &path,
                    &i64::from(status),
                ],
            )
            .await
            .map_err(|e| self.query_error("record an audit entry", e))?;
        Ok(())
    }

    /// The last `limit` audit entries, newest last.
    pub async fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, at, identity, role, method, path, status FROM audit
                 ORDER BY seq DESC LIMIT $1",
                &[&i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(|e| self.query_error("list the audit trail", e))?;
        let mut entries = Vec::with_capacity(rows.len());
        for r in rows.iter().rev() {
            let seq: i64 = r.get(0);
            let status: i64 = r.get(6);
            entries.push(AuditEntry {
                seq,
                at: r.get(1),
                identity: r.get(2),
                role: r.get(3),
                method: r.get(4),
                path: r.get(5),
                status: u16::try_from(status).map_err(|_| PgError::Damaged {
                    db: self.label().to_owned(),
                    what: format!("audit entry {seq}"),
                    detail: format!("status {status} is not an HTTP status"),
                })?,
            });
        }
        Ok(entries)
    }

    fn token_info(&self, r: &tokio_postgres::Row) -> Result<TokenInfo, PgError> {
        let id: String = r.get(0);
        let damaged = |detail: String| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("token {id}"),
            detail,
        };
        // A JSON list of names in column `field`, if set.
        let names = |field: &str, text: Option<String>| {
            text.map(|p| {
                serde_json::from_str::<Vec<String>>(&p)
                    .map_err(|e| damaged(format!("{field} is not a JSON list of names: {e}")))
            })
            .transpose()
        };
        let mcp_profiles = names("mcp_profiles", r.get(8))?;
        let project_ids = names("project_ids", r.get(10))?.unwrap_or_default();
        let role: String = r.get(2);
        let role = role.parse().map_err(damaged)?;
        let expires: Option<i64> = r.get(5);
        let last_used: Option<i64> = r.get(7);
        Ok(TokenInfo {
            id: id.clone(),
            name: r.get(1),
            role,
            created_at: r.get(3),
            created_by: r.get(4),
            expires_at: expires.map(ms_rfc3339),
            revoked_at: r.get(6),
            last_used_at: last_used.map(ms_rfc3339),
            mcp_profiles,
            org_id: r.get(9),
            project_ids,
        })
    }
}
