//! API tokens (only their hashes are stored) and the audit trail: the records and the [`TokenStore`] and [`AuditStore`] traits.

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
    /// The newest `limit` entries, newest first.
    async fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError>;
    /// Queues one entry for the background writer; never blocks the caller.
    fn journal_audit(&self, identity: &str, role: Role, method: &str, path: &str, status: u16);
    /// Queues one invocation record for the background writer.
    fn journal_invocation(&self, record: Box<crate::invocations::InvocationRecord>);
    /// Writes what the journal queued, before returning.
    fn flush_journal(&self);
    /// How many audit entries and invocation records the journal could not write.
    fn journal_unwritten(&self) -> (u64, u64);
}
