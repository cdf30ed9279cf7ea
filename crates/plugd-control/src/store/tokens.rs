//! API tokens (only their hashes are stored) and the audit trail: the records and the [`TokenStore`] and [`AuditStore`] traits.
//!
//! What a new token may be is checked here, once, for every surface that
//! makes one (`plugd token create`, `POST /v1/tokens`): [`check_token_name`],
//! [`parse_lifetime`], [`check_scope`]. The audit trail is listed newest
//! first in pages ([`AuditFilter`], [`AuditPage`]) keyed by the entries'
//! `seq`, so a page never repeats or skips an entry while new ones arrive.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// What a token may do. Roles are sets of rights, not a ladder: an operator
/// governs (approves, revokes, decides calls) but does not invoke tools, so
/// nobody but an admin can both ask for a critical call and approve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, including tokens.
    Admin,
    /// Read, plus approve/revoke/restart/reconfigure plugins, enable and
    /// disable tools, decide pending calls.
    Operator,
    /// Read, plus invoke tools, run turns and hooks, publish on the bus within
    /// its grants.
    Agent,
    /// Read only.
    Viewer,
}

impl Role {
    /// Every role, most powerful first.
    pub const ALL: [Role; 4] = [Role::Admin, Role::Operator, Role::Agent, Role::Viewer];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Agent => "agent",
            Role::Viewer => "viewer",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?}; use admin, operator, agent or viewer"))
    }
}

/// A stored token (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// Its id (16 hex digits; part of the token string).
    pub id: String,
    /// The operator's name for it (unique among live tokens).
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// Who made it.
    pub created_by: String,
    /// When it stops working (RFC 3339), if ever.
    pub expires_at: Option<String>,
    /// When it was revoked (RFC 3339).
    pub revoked_at: Option<String>,
    /// When it was last accepted (RFC 3339, to the minute).
    pub last_used_at: Option<String>,
    /// The MCP gateway profiles it is limited to (`None`: not limited). A
    /// limited token reaches `/mcp/{profile}` of these profiles only (and
    /// reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_profiles: Option<Vec<String>>,
    /// The org it is bound to (`None`: a workspace token that sees every
    /// org). A bound token sees only its org's bindings, packages in use
    /// and secrets, and everything else answers it 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org_id: Option<String>,
    /// The projects of [`TokenInfo::org_id`] it is limited to (empty: all of
    /// them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub project_ids: Vec<String>,
}

/// The org and projects a token is bound to (see [`TokenInfo::org_id`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenancy {
    /// The org.
    pub org_id: String,
    /// Its projects the token is limited to (empty: all).
    pub project_ids: Vec<String>,
}

/// A token just made: the record and the one time its secret is shown.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// The record.
    pub info: TokenInfo,
    /// `plugd_<id>_<secret>`: what a client sends as `Authorization: Bearer`.
    pub token: String,
}

/// Why a presented token was not accepted (said to the client only as
/// "invalid token", to give a prober nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRejection {
    /// Not of the form `plugd_<16 hex>_<64 hex>`, unknown id, or wrong secret.
    Invalid,
    /// Revoked at the given time.
    Revoked(String),
    /// Expired at the given time.
    Expired(String),
}

/// One state-changing request, as [`AuditStore::audit_record`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Order of arrival.
    pub seq: i64,
    /// When (RFC 3339).
    pub at: String,
    /// Who: `token:NAME` or the Unix user of a socket peer.
    pub identity: String,
    /// Their role.
    pub role: String,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Response status.
    pub status: u16,
}

/// Why a field of a token to make is refused: the field (`name`, `role`,
/// `expires`, `org`, `projects`) and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct BadTokenField {
    /// The field, as the HTTP body names it.
    pub field: &'static str,
    /// What is wrong, and what to do.
    pub message: String,
}

impl BadTokenField {
    fn new(field: &'static str, message: String) -> BadTokenField {
        BadTokenField { field, message }
    }
}

/// A token's name: 1 to 128 bytes, not only spaces, no control character.
pub fn check_token_name(name: &str) -> Result<(), BadTokenField> {
    if name.trim().is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(BadTokenField::new(
            "name",
            format!("token name {name:?} must be 1 to 128 printable characters"),
        ));
    }
    Ok(())
}

/// A role by name (`admin`, `operator`, `agent`, `viewer`).
pub fn parse_role(role: &str) -> Result<Role, BadTokenField> {
    role.parse().map_err(|m| BadTokenField::new("role", m))
}

/// How long a token lasts: a positive number and one unit, `30s`, `15m`,
/// `12h`, `90d`, `2w`; at most 100 years.
pub fn parse_lifetime(s: &str) -> Result<std::time::Duration, BadTokenField> {
    let bad = |m: String| BadTokenField::new("expires", m);
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| bad(format!("{s:?} has no unit; write e.g. 30m, 12h, 90d or 2w")))?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| {
        bad(format!(
            "{s:?} does not start with a number; write e.g. 30m, 12h, 90d"
        ))
    })?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(bad(format!(
                "unknown unit {unit:?} in {s:?}; use s, m, h, d or w"
            )));
        }
    };
    if n == 0 {
        return Err(bad(format!("{s:?} is zero; a token must last a while")));
    }
    n.checked_mul(secs)
        .filter(|t| *t <= 100 * 365 * 86_400)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| {
            bad(format!(
                "{s:?} is too long; leave the expiry out for a token that lasts until revoked"
            ))
        })
}

/// When a token made at `now_ms` and lasting `lifetime` expires (ms since
/// the epoch).
pub fn expires_at_ms(now_ms: i64, lifetime: std::time::Duration) -> i64 {
    now_ms.saturating_add(i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX))
}

/// The org and projects a token is bound to, checked: each an id of
/// `crate::bindings::NAME_RULE`, projects only with an org.
pub fn check_scope(
    org: Option<&str>,
    projects: &[String],
) -> Result<Option<Tenancy>, BadTokenField> {
    let Some(org) = org else {
        if projects.is_empty() {
            return Ok(None);
        }
        return Err(BadTokenField::new(
            "projects",
            "projects limit an org token; give the org too".to_owned(),
        ));
    };
    if !crate::bindings::is_valid_name(org) {
        return Err(BadTokenField::new(
            "org",
            format!("{org:?} is not an org id; {}", crate::bindings::NAME_RULE),
        ));
    }
    if let Some(p) = projects.iter().find(|p| !crate::bindings::is_valid_name(p)) {
        return Err(BadTokenField::new(
            "projects",
            format!("{p:?} is not a project id; {}", crate::bindings::NAME_RULE),
        ));
    }
    Ok(Some(Tenancy {
        org_id: org.to_owned(),
        project_ids: projects.to_vec(),
    }))
}

/// API tokens: created with a secret shown once, listed, revoked and verified.
///
/// A backend keeps only the SHA-256 of each secret and compares hashes in
/// constant time; verification may be cached only while no other connection
/// has committed a change.
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Creates a token for `name` with `role`; its secret is returned once.
    async fn token_create(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
    ) -> Result<NewToken, StoreError>;
    /// As [`TokenStore::token_create`], limited to MCP gateway profiles.
    async fn token_create_limited(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
    ) -> Result<NewToken, StoreError>;
    /// As [`TokenStore::token_create_limited`], bound to an org and projects.
    async fn token_create_scoped(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
        tenancy: Option<&Tenancy>,
    ) -> Result<NewToken, StoreError>;
    /// Every token, revoked ones included.
    async fn token_list(&self) -> Result<Vec<TokenInfo>, StoreError>;
    /// Revokes the token with this id or name; the token as it was.
    async fn token_revoke(&self, id_or_name: &str) -> Result<Option<TokenInfo>, StoreError>;
    /// Checks a presented token: the token, or why it is refused.
    async fn token_verify(
        &self,
        token: &str,
    ) -> Result<Result<TokenInfo, TokenRejection>, StoreError>;
    /// The record of token `id` when it is live (not revoked, not expired by
    /// the database's clock), else why not; for a holder that checked the
    /// secret earlier (a console session opened with the token). Does not
    /// stamp the token's last use.
    async fn token_live(&self, id: &str) -> Result<Result<TokenInfo, TokenRejection>, StoreError>;
}

/// Which HTTP statuses an audit listing keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    /// Exactly this status.
    Exact(u16),
    /// A class: `2` for `2xx` (200 to 299), `4` for `4xx`, …
    Class(u16),
}

impl StatusMatch {
    /// The inclusive range of statuses it keeps.
    pub fn range(self) -> (u16, u16) {
        match self {
            StatusMatch::Exact(s) => (s, s),
            StatusMatch::Class(c) => (c * 100, c * 100 + 99),
        }
    }
}

impl std::str::FromStr for StatusMatch {
    type Err = String;

    /// `404`, or `2xx` … `5xx` (`X` in capitals too).
    fn from_str(s: &str) -> Result<StatusMatch, String> {
        let b = s.as_bytes();
        if b.len() == 3
            && (b'1'..=b'5').contains(&b[0])
            && b[1..].iter().all(|c| *c == b'x' || *c == b'X')
        {
            return Ok(StatusMatch::Class(u16::from(b[0] - b'0')));
        }
        match s.parse::<u16>() {
            Ok(n) if (100..=599).contains(&n) => Ok(StatusMatch::Exact(n)),
            _ => Err(format!(
                "status {s:?} is not an HTTP status; write one (404) or a class (2xx, 4xx, 5xx)"
            )),
        }
    }
}

/// Most audit entries on one page.
pub const MAX_AUDIT_PAGE: usize = 500;

/// Which audit entries to list: every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Exactly this identity (`token:NAME`, a Unix user).
    pub identity: Option<String>,
    /// A case-insensitive substring of the identity, the method or the
    /// path (ASCII letters fold on SQLite; PostgreSQL folds with `lower`).
    pub q: Option<String>,
    /// The response status.
    pub status: Option<StatusMatch>,
    /// Recorded at or after (ms since the epoch; entries are stamped to
    /// the second).
    pub since_ms: Option<i64>,
    /// Recorded before (ms since the epoch).
    pub until_ms: Option<i64>,
    /// Only entries older than this `seq` (the cursor).
    pub before_seq: Option<i64>,
    /// Page size, 1..=[`MAX_AUDIT_PAGE`] (0 is taken as 1, more as the most).
    pub limit: usize,
}

impl AuditFilter {
    /// The page size actually used.
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_AUDIT_PAGE)
    }

    /// The bound an entry's `at` (`YYYY-MM-DDTHH:MM:SSZ`, to the second)
    /// is compared with for `ms`: an entry stamped second `T` is taken as
    /// recorded at `T`, so `since`/`until` compare with the first whole
    /// second at or after `ms`.
    pub fn at_bound(ms: i64) -> String {
        let secs = ms.max(0).div_euclid(1000) + i64::from(ms.max(0) % 1000 != 0);
        let stamp = crate::invocations::rfc3339_ms(secs * 1000);
        // `…SS.000Z` → `…SSZ`, the audit trail's form.
        format!("{}Z", &stamp[..19])
    }
}

/// One page of the audit trail, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditPage {
    /// The entries.
    pub entries: Vec<AuditEntry>,
    /// Pass as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

impl AuditPage {
    /// A page of `rows` (newest first) fetched with one row beyond `page`.
    pub fn from_rows(mut rows: Vec<AuditEntry>, page: usize) -> AuditPage {
        let more = rows.len() > page;
        rows.truncate(page);
        let next_cursor = more
            .then(|| rows.last())
            .flatten()
            .map(|e| audit_cursor(e.seq));
        AuditPage {
            entries: rows,
            next_cursor,
        }
    }
}

/// The opaque cursor after entry `seq`: `a` and its hex.
pub fn audit_cursor(seq: i64) -> String {
    format!("a{seq:x}")
}

/// The `seq` of an [`audit_cursor`].
pub fn parse_audit_cursor(s: &str) -> Result<i64, String> {
    s.strip_prefix('a')
        .filter(|h| !h.is_empty() && h.len() <= 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| i64::from_str_radix(h, 16).ok())
        .ok_or_else(|| {
            format!("{s:?} is not an audit cursor; pass the next_cursor of the previous page as is")
        })
}

/// The audit trail of state-changing requests.
#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Records one request now.
    async fn audit_record(
        &self,
        identity: &str,
        role: Role,
        method: &str,
        path: &str,
        status: u16,
    ) -> Result<(), StoreError>;
    /// The newest `limit` entries, oldest of them first (newest last).
    async fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError>;
    /// One page of the entries `filter` matches, newest first (by `seq`).
    async fn audit_page(&self, filter: &AuditFilter) -> Result<AuditPage, StoreError>;
    /// Queues one entry for the background writer; never blocks the caller.
    fn journal_audit(&self, identity: &str, role: Role, method: &str, path: &str, status: u16);
    /// Queues one invocation record for the background writer.
    fn journal_invocation(&self, record: Box<crate::invocations::InvocationRecord>);
    /// Writes what the journal queued, before returning.
    fn flush_journal(&self);
    /// How many audit entries and invocation records the journal could not write.
    fn journal_unwritten(&self) -> (u64, u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_need_a_number_and_a_unit() {
        assert_eq!(
            parse_lifetime("30m"),
            Ok(std::time::Duration::from_secs(1800))
        );
        assert_eq!(
            parse_lifetime(" 2w "),
            Ok(std::time::Duration::from_secs(14 * 86_400))
        );
        for bad in [
            "",
            "30",
            "m",
            "0h",
            "5y",
            "-1h",
            "99999999999999999999d",
            "1.5h",
            "101000d",
        ] {
            let e = parse_lifetime(bad).unwrap_err();
            assert_eq!(e.field, "expires", "{bad:?}");
        }
        assert_eq!(
            expires_at_ms(1_000, std::time::Duration::from_secs(2)),
            3_000
        );
    }

    #[test]
    fn names_roles_and_scopes_are_checked_by_field() {
        assert!(check_token_name("ci bot").is_ok());
        for bad in ["", "   ", "a\tb", &"x".repeat(129)] {
            assert_eq!(check_token_name(bad).unwrap_err().field, "name", "{bad:?}");
        }
        assert_eq!(parse_role("operator"), Ok(Role::Operator));
        assert_eq!(parse_role("root").unwrap_err().field, "role");
        assert_eq!(check_scope(None, &[]), Ok(None));
        let t = check_scope(Some("org_a"), &["p1".to_owned()])
            .unwrap()
            .unwrap();
        assert_eq!((t.org_id.as_str(), t.project_ids.len()), ("org_a", 1));
        assert_eq!(
            check_scope(None, &["p1".to_owned()]).unwrap_err().field,
            "projects"
        );
        assert_eq!(check_scope(Some("a b"), &[]).unwrap_err().field, "org");
        assert_eq!(
            check_scope(Some("org"), &["../x".to_owned()])
                .unwrap_err()
                .field,
            "projects"
        );
    }

    #[test]
    fn statuses_cursors_and_time_bounds_of_the_audit_trail() {
        assert_eq!("404".parse(), Ok(StatusMatch::Exact(404)));
        assert_eq!("2xx".parse(), Ok(StatusMatch::Class(2)));
        assert_eq!("5XX".parse::<StatusMatch>().unwrap().range(), (500, 599));
        for bad in ["", "6xx", "0xx", "99", "600", "2x", "abc", "4x4"] {
            assert!(bad.parse::<StatusMatch>().is_err(), "{bad:?}");
        }
        for seq in [0, 1, 255, i64::MAX] {
            assert_eq!(parse_audit_cursor(&audit_cursor(seq)), Ok(seq));
        }
        for bad in ["", "a", "77", "azz", "a-1", &format!("a{}", "f".repeat(17))] {
            assert!(parse_audit_cursor(bad).is_err(), "{bad:?}");
        }
        // Entries are stamped to the second: a bound rounds up to one.
        assert_eq!(
            AuditFilter::at_bound(1_767_225_600_000),
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            AuditFilter::at_bound(1_767_225_600_001),
            "2026-01-01T00:00:01Z"
        );
        let page = AuditPage::from_rows(
            (0..4)
                .rev()
                .map(|seq| AuditEntry {
                    seq,
                    at: String::new(),
                    identity: String::new(),
                    role: String::new(),
                    method: String::new(),
                    path: String::new(),
                    status: 200,
                })
                .collect(),
            3,
        );
        assert_eq!(page.entries.len(), 3);
        assert_eq!(page.next_cursor, Some(audit_cursor(1)));
    }
}
