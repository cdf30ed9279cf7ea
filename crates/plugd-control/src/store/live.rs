//! Live sessions (MCP Streamable HTTP and console logins), one-time login codes and the control epoch: the [`LiveSessionStore`] and [`ControlEpoch`] traits.
//!
//! **Live sessions** are kept in the store, not only in one serve's memory,
//! so that a session outlives the process that opened it (a restart, and
//! with several nodes any node can serve it). A session id is a bearer
//! secret: the store keeps only its SHA-256 ([`session_key`]), never the id.
//! What a session needs to be rebuilt (its protocol version, the login it
//! stands for, its CSRF token) is `data`, JSON written by the surface that
//! owns the kind. Times are the database's: on PostgreSQL the server's
//! clock, on SQLite the one machine's.
//!
//! **Login codes** (the console's one-time links) are spent by one atomic
//! delete, so a code tried on several nodes at once logs in exactly once.
//!
//! **The control epoch** is a counter the database bumps in the same
//! transaction as every change to what guards consent: API tokens (not
//! their last-use stamp), approvals, disabled tools and per-call approval
//! decisions, plugin configuration, packages and bindings. A cache of any of
//! these is exact as long as the epoch it was filled under is still the
//! database's: read it (at most once per millisecond on a hot path) and
//! refill when it moved.

use async_trait::async_trait;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Invalid, StoreError};

/// What kind of live session: each kind has its own surface and lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LiveKind {
    /// An MCP Streamable HTTP session (`Mcp-Session-Id`).
    Mcp,
    /// A console login (the session cookie).
    Console,
}

impl LiveKind {
    /// The stored name: `mcp` or `console`.
    pub fn as_str(self) -> &'static str {
        match self {
            LiveKind::Mcp => "mcp",
            LiveKind::Console => "console",
        }
    }
}

/// How long sessions of one kind live, decided against the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// A session unused this long (milliseconds) is gone.
    pub idle_ms: i64,
    /// A session is gone this long (milliseconds) after it was opened, used
    /// or not; `None`: no such limit.
    pub max_age_ms: Option<i64>,
}

/// A live session as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSession {
    /// Its kind.
    pub kind: LiveKind,
    /// Who opened it (the identity's stable name); only they may use it.
    pub owner: String,
    /// The MCP gateway profile it was opened under, if any.
    pub profile: Option<String>,
    /// What the owning surface needs to rebuild it (JSON, at most
    /// [`MAX_DATA`] bytes).
    pub data: Value,
    /// When it was opened (ms since the Unix epoch, the database's clock).
    pub created_ms: i64,
    /// When it was last marked used (ms, the database's clock).
    pub used_ms: i64,
}

/// Largest `data` of one session, in bytes of JSON.
pub const MAX_DATA: usize = 64 * 1024;

/// Longest owner or profile name, in bytes.
pub const MAX_NAME: usize = 512;

/// Login codes waiting at most; minting one beyond drops the oldest.
pub const MAX_CODES: usize = 16;

/// The key a session id or login code is stored under: its SHA-256.
pub fn session_key(secret: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"plugd-live-session-v1\0");
    h.update(secret.as_bytes());
    h.finalize().into()
}

/// Checks a session about to be stored: bounded names and data.
pub fn check_session(owner: &str, profile: Option<&str>, data: &Value) -> Result<String, Invalid> {
    for (what, name) in [("owner", Some(owner)), ("profile", profile)] {
        if let Some(name) = name
            && (name.len() > MAX_NAME || name.contains('\0'))
        {
            return Err(Invalid::new(
                format!(
                    "session {what} {:?}",
                    name.chars().take(64).collect::<String>()
                ),
                "a session's owner and profile are at most 512 bytes without NUL",
            ));
        }
    }
    let text = data.to_string();
    if text.len() > MAX_DATA {
        return Err(Invalid::new(
            format!("session data ({} bytes)", text.len()),
            "a session's data is at most 64 KiB of JSON",
        ));
    }
    Ok(text)
}

/// Live sessions and one-time login codes, shared by every node.
#[async_trait]
pub trait LiveSessionStore: Send + Sync {
    /// Stores session `id` (replacing one of the same kind and id), opened
    /// and used now.
    async fn live_session_put(
        &self,
        kind: LiveKind,
        id: &str,
        owner: &str,
        profile: Option<&str>,
        data: &Value,
    ) -> Result<(), StoreError>;
    /// Session `id` of `kind` while it is alive under `life`; an expired one
    /// is deleted and `None`.
    async fn live_session_get(
        &self,
        kind: LiveKind,
        id: &str,
        life: Lifetime,
    ) -> Result<Option<LiveSession>, StoreError>;
    /// Marks session `id` used now; whether it exists.
    async fn live_session_touch(&self, kind: LiveKind, id: &str) -> Result<bool, StoreError>;
    /// Ends session `id`; whether it existed.
    async fn live_session_delete(&self, kind: LiveKind, id: &str) -> Result<bool, StoreError>;
    /// Deletes every session of `kind` expired under `life`; how many.
    async fn live_sessions_sweep(&self, kind: LiveKind, life: Lifetime) -> Result<u64, StoreError>;
    /// Keeps the `keep` most recently used sessions of `kind` and deletes the
    /// rest; how many went.
    async fn live_sessions_trim(&self, kind: LiveKind, keep: u64) -> Result<u64, StoreError>;
    /// How many sessions of `kind` `owner` holds alive under `life`.
    async fn live_sessions_held(
        &self,
        kind: LiveKind,
        owner: &str,
        life: Lifetime,
    ) -> Result<u64, StoreError>;
    /// Stores a one-time login `code` for user `name`, good for
    /// `lifetime_ms`; beyond [`MAX_CODES`] waiting, the oldest is dropped.
    async fn login_code_put(
        &self,
        code: &str,
        name: &str,
        lifetime_ms: i64,
    ) -> Result<(), StoreError>;
    /// Spends `code`: the user it was minted for, once, while it is fresh.
    async fn login_code_redeem(&self, code: &str) -> Result<Option<String>, StoreError>;
}

/// The control epoch (see the module documentation).
#[async_trait]
pub trait ControlEpoch: Send + Sync {
    /// The database's control epoch now. It only grows.
    async fn control_epoch(&self) -> Result<i64, StoreError>;

    /// The control epoch as read at most `max_age` ago by anything of this
    /// store (its token checks included), else read now: one round trip
    /// serves every cache of a node within that time. Defaults to
    /// [`ControlEpoch::control_epoch`].
    async fn control_epoch_within(&self, max_age: std::time::Duration) -> Result<i64, StoreError> {
        let _ = max_age;
        self.control_epoch().await
    }
}
