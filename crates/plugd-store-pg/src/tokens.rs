//! API tokens (only the SHA-256 of their secret) and the audit trail on PostgreSQL.
//!
//! Same token format as `plugd-store`'s `tokens.rs`: `plugd_<id>_<secret>`,
//! `id` 16 hex digits (the row's key), `secret` 64 hex digits from the OS
//! RNG; the database keeps `sha256(secret)` and the check compares hashes in
//! constant time. Creation, revocation, expiry and "last used" are judged
//! and stamped by the database's clock.
//!
//! **Checks are cached under the control epoch.** A check reads the epoch
//! (one round trip, at most once per [`TOKEN_RECHECK`] for all requests) and
//! serves token rows from the cache while it has not moved; every change to
//! a token bumps it in the changing transaction (`migrations.rs`), so a
//! token revoked through any node or connection is refused at the next
//! request after that millisecond. Between epoch reads, expiry is judged by
//! the database's clock as read with the epoch plus the time elapsed here.

use plugd_control::store::tokens::{
    AuditEntry, AuditFilter, AuditPage, NewToken, Role, Tenancy, TokenInfo, TokenRejection,
};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;

use crate::clock::{NOW_MS, NOW_RFC3339, ms_rfc3339, random_hex};
use crate::{PgError, PgStore};

const PREFIX: &str = "plugd_";
const ID_HEX: usize = 16;
const SECRET_HEX: usize = 64;
/// `last_used` is written at most once a minute per token.
const LAST_USED_GRANULARITY_MS: i64 = 60_000;

/// How long a read of the control epoch serves token checks.
pub const TOKEN_RECHECK: Duration = Duration::from_millis(1);

/// Rows kept at most; beyond, the cache starts over.
const TOKEN_CACHE_MAX: usize = 4096;

/// A token row as a check needs it.
#[derive(Clone)]
struct Cached {
    info: TokenInfo,
    secret_sha256: Vec<u8>,
    expires_ms: Option<i64>,
    last_used: Option<i64>,
}

/// Token rows under the control epoch they were read under.
#[derive(Default)]
pub(crate) struct TokenCache {
    epoch: Option<i64>,
    /// When the epoch was read here, and the database's time then (ms).
    checked: Option<(Instant, i64)>,
    rows: HashMap<String, Cached>,
}

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
        // This node's next check reads the moved epoch, whatever the time.
        self.forget_tokens();
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
        let (hit, now, epoch) = self.token_cached(id).await?;
        let cached = match hit {
            Some(hit) => hit,
            None => {
                // Every authenticated request may run this: cached statements.
                let client = self.client().await?;
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {TOKEN_COLUMNS}, secret_sha256 FROM api_tokens WHERE id = $1"
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
                let cached = Cached {
                    info: self.token_info(&row)?,
                    secret_sha256: row.get(11),
                    expires_ms: row.get(5),
                    last_used: row.get(7),
                };
                let mut cache = self.token_cache();
                // Only under the epoch it was read after: had another check
                // seen the epoch move meanwhile, this row may predate that
                // change.
                if cache.epoch == Some(epoch) {
                    if cache.rows.len() >= TOKEN_CACHE_MAX {
                        cache.rows.clear();
                    }
                    cache.rows.insert(id.to_owned(), cached.clone());
                }
                cached
            }
        };
        if !ct_eq(&cached.secret_sha256, &secret_hash(secret)) {
            return Ok(Err(TokenRejection::Invalid));
        }
        let info = cached.info;
        if let Some(at) = &info.revoked_at {
            return Ok(Err(TokenRejection::Revoked(at.clone())));
        }
        if let (Some(at), Some(ms)) = (&info.expires_at, cached.expires_ms)
            && ms <= now
        {
            return Ok(Err(TokenRejection::Expired(at.clone())));
        }
        if cached
            .last_used
            .is_none_or(|t| now - t >= LAST_USED_GRANULARITY_MS)
        {
            // The stamp moves no epoch (its trigger leaves it out): the
            // cached row is updated here.
            if let Some(row) = self.token_cache().rows.get_mut(id) {
                row.last_used = Some(now);
            }
            let client = self.client().await?;
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

    /// Makes the next check read the control epoch (after a token write
    /// here: no window of [`TOKEN_RECHECK`] for this node's own changes).
    pub(crate) fn forget_tokens(&self) {
        self.token_cache().checked = None;
    }

    fn token_cache(&self) -> std::sync::MutexGuard<'_, TokenCache> {
        self.token_cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached row of token `id` if the control epoch has not moved
    /// since it was read, the database's time now (ms) and the epoch. Reads
    /// the epoch when the last read is older than [`TOKEN_RECHECK`].
    async fn token_cached(&self, id: &str) -> Result<(Option<Cached>, i64, i64), PgError> {
        let (epoch, now) = self.epoch_within(TOKEN_RECHECK).await?;
        let cache = self.token_cache();
        let hit = if cache.epoch == Some(epoch) {
            cache.rows.get(id).cloned()
        } else {
            None
        };
        Ok((hit, now, epoch))
    }

    /// The control epoch and the database's time now (ms), as read at most
    /// `max_age` ago by this store (estimated forward from that read), else
    /// read now: one read at a time, the callers waiting on it use its
    /// answer. A newer epoch empties the token cache.
    pub(crate) async fn epoch_within(&self, max_age: Duration) -> Result<(i64, i64), PgError> {
        let fresh = || {
            let cache = self.token_cache();
            match (cache.epoch, cache.checked) {
                (Some(epoch), Some((at, db_ms))) if at.elapsed() < max_age => {
                    Some((epoch, db_ms + at.elapsed().as_millis() as i64))
                }
                _ => None,
            }
        };
        if let Some(hit) = fresh() {
            return Ok(hit);
        }
        let _one = self.epoch_flight.lock().await;
        if let Some(hit) = fresh() {
            return Ok(hit);
        }
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT n, {NOW_MS} FROM control_epoch WHERE id = 1"
            ))
            .await
            .map_err(|e| self.query_error("read the control epoch", e))?;
        let row = client
            .query_one(&stmt, &[])
            .await
            .map_err(|e| self.query_error("read the control epoch", e))?;
        let (epoch, now): (i64, i64) = (row.get(0), row.get(1));
        let mut cache = self.token_cache();
        // Epochs only grow: a read that lost the race to a newer one leaves
        // the cache to it.
        if cache.epoch.is_none_or(|e| e < epoch) {
            cache.rows.clear();
            cache.epoch = Some(epoch);
            cache.checked = Some((Instant::now(), now));
        } else if cache.epoch == Some(epoch) {
            cache.checked = Some((Instant::now(), now));
        }
        Ok((epoch, now))
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
        rows.iter().rev().map(|r| self.audit_entry(r)).collect()
    }

    /// One page of the audit entries `f` matches, newest first.
    pub async fn audit_page(&self, f: &AuditFilter) -> Result<AuditPage, PgError> {
        let mut sql = String::from(
            "SELECT seq, at, identity, role, method, path, status FROM audit WHERE true",
        );
        let mut args: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
        // Appends `clause`, each of its `$?` standing for `v`.
        let mut push = |sql: &mut String, clause: &str, v: Box<dyn ToSql + Sync + Send>| {
            args.push(v);
            sql.push_str(&clause.replace("$?", &format!("${}", args.len())));
        };
        if let Some(id) = &f.identity {
            push(&mut sql, " AND identity = $?", Box::new(id.clone()));
        }
        if let Some(q) = f.q.as_deref().filter(|q| !q.is_empty()) {
            push(
                &mut sql,
                " AND (strpos(lower(identity), lower($?::text)) > 0
                       OR strpos(lower(method), lower($?::text)) > 0
                       OR strpos(lower(path), lower($?::text)) > 0)",
                Box::new(q.to_owned()),
            );
        }
        if let Some(status) = f.status {
            let (lo, hi) = status.range();
            push(&mut sql, " AND status >= $?", Box::new(i64::from(lo)));
            push(&mut sql, " AND status <= $?", Box::new(i64::from(hi)));
        }
        if let Some(ms) = f.since_ms {
            push(
                &mut sql,
                " AND at >= $?",
                Box::new(AuditFilter::at_bound(ms)),
            );
        }
        if let Some(ms) = f.until_ms {
            push(
                &mut sql,
                " AND at < $?",
                Box::new(AuditFilter::at_bound(ms)),
            );
        }
        if let Some(seq) = f.before_seq {
            push(&mut sql, " AND seq < $?", Box::new(seq));
        }
        let page = f.page_size();
        push(
            &mut sql,
            " ORDER BY seq DESC LIMIT $?",
            Box::new(page as i64 + 1),
        );
        let params: Vec<&(dyn ToSql + Sync)> = args
            .iter()
            .map(|a| a.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let client = self.client().await?;
        let rows = client
            .query(&sql, &params)
            .await
            .map_err(|e| self.query_error("list the audit trail", e))?;
        let entries = rows
            .iter()
            .map(|r| self.audit_entry(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AuditPage::from_rows(entries, page))
    }

    fn audit_entry(&self, r: &tokio_postgres::Row) -> Result<AuditEntry, PgError> {
        let seq: i64 = r.get(0);
        let status: i64 = r.get(6);
        Ok(AuditEntry {
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
        })
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
