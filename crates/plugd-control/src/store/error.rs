//! Errors of every state store backend: [`StoreError`] and the opaque [`BackendError`] it wraps.

use std::fmt;
use std::path::PathBuf;

/// An error of the database backend, kept opaque so no driver type leaks into the API.
///
/// Its `Display` is the backend's own message (for SQLite, e.g. `database is locked`).
pub struct BackendError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl BackendError {
    /// Wraps a backend's own error.
    pub fn new(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        BackendError(Box::new(err))
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// An argument refused by a check shared by every backend (see the `check_*`
/// functions beside each trait): `StoreError::Invalid` on SQLite, the same
/// fields in `plugd-store-pg`'s own error, one message on both.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {problem}")]
pub struct Invalid {
    /// What was rejected, e.g. `plugin id ""`.
    pub what: String,
    /// Why, and what to do.
    pub problem: &'static str,
}

impl Invalid {
    /// An `Invalid` about `what`.
    pub fn new(what: impl Into<String>, problem: &'static str) -> Self {
        Invalid {
            what: what.into(),
            problem,
        }
    }
}

impl From<Invalid> for StoreError {
    fn from(e: Invalid) -> Self {
        StoreError::Invalid {
            what: e.what,
            problem: e.problem,
        }
    }
}

/// Why an operation of a state store failed, whatever the backend.
///
/// `db` fields name the database: the path of `state.db`, or `:memory:`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The state directory or database file could not be created or inspected.
    #[error("state directory {}: {source}", path.display())]
    Io {
        /// The directory or file concerned.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file exists but is not a SQLite database, or is damaged.
    #[error(
        "{} is not a usable plugd state database ({source}); plugd leaves it as it is: restore it from a backup, or start over with `plugd state reset --yes` (moves it aside)",
        path.display()
    )]
    NotADatabase {
        /// The file concerned.
        path: PathBuf,
        /// What SQLite reported.
        #[source]
        source: BackendError,
    },
    /// The database could not be opened or configured.
    #[error("cannot open state database {}: {source}", path.display())]
    Open {
        /// The file concerned.
        path: PathBuf,
        /// What the backend reported.
        #[source]
        source: BackendError,
    },
    /// The database was written by a newer plugd whose schema this build does not know.
    #[error(
        "state database {} has schema version {found}, but this plugd knows only up to {supported}; upgrade plugd",
        path.display()
    )]
    TooNew {
        /// The file concerned.
        path: PathBuf,
        /// The schema version found in the file.
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },
    /// Upgrading the schema to a newer version failed; the database is left as it was.
    #[error("state database {db}: migrating to schema version {version} failed: {source}")]
    Migrate {
        /// The database concerned.
        db: String,
        /// The version the failed step would have produced.
        version: i64,
        /// What the backend reported.
        #[source]
        source: BackendError,
    },
    /// A query failed.
    #[error("state database {db}: {action}: {source}")]
    Query {
        /// The database concerned.
        db: String,
        /// What was being done, naming the plugin, e.g. `approve plugin "x"`.
        action: String,
        /// What the backend reported.
        #[source]
        source: BackendError,
    },
    /// A stored row could not be decoded (e.g. the cached catalog is not JSON).
    #[error(
        "state database {db}: stored record of plugin {plugin_id:?} is damaged: {detail}; re-approve the plugin"
    )]
    Corrupt {
        /// The database concerned.
        db: String,
        /// The plugin whose row is damaged.
        plugin_id: String,
        /// What is wrong with it.
        detail: String,
    },
    /// An argument was rejected before reaching the database.
    #[error("{what}: {problem}")]
    Invalid {
        /// What was rejected, e.g. `plugin id ""`.
        what: String,
        /// Why, and what to do.
        problem: &'static str,
    },
    /// A stored row other than a plugin's could not be decoded.
    #[error("state database {db}: stored {what} is damaged: {detail}")]
    Damaged {
        /// The database concerned.
        db: String,
        /// The record, e.g. `token 0123456789abcdef`.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A write that would break a uniqueness rule; says what to do.
    #[error("{0}")]
    Conflict(String),
    /// A record a write needs does not exist.
    #[error("{what} does not exist")]
    NotFound {
        /// What, e.g. `chain "ch_1"`.
        what: String,
    },
    /// The OS random number generator failed.
    #[error("cannot draw random bytes from the OS: {0}")]
    Random(String),
    /// The database the workspace's marker (`.plugd/state.id`) vouches for is
    /// missing, empty, blank or another workspace's; nothing was created.
    #[error("{0}")]
    Lost(Box<dyn std::error::Error + Send + Sync>),
    /// A secret could not be sealed or opened, or the master key not loaded.
    #[error(transparent)]
    Secret(Box<dyn std::error::Error + Send + Sync>),
    /// The database cannot be reached now (a lost connection, a server
    /// restarting); the operation did not happen and may be retried.
    #[error("state database {db} is unavailable: {source}")]
    Unavailable {
        /// The database concerned (its address without credentials).
        db: String,
        /// What the backend reported.
        #[source]
        source: BackendError,
    },
}
