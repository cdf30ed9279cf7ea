//! Errors of the PostgreSQL backend: [`PgError`] and the opaque [`DbError`] it wraps.

use std::fmt;

/// An error of the PostgreSQL driver or pool, kept opaque so no driver type
/// appears in the API. Its `Display` is the driver's message followed by the
/// server's detail when there is one (e.g. `db error: ERROR: relation "x"
/// does not exist`).
pub struct DbError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl DbError {
    pub(crate) fn new(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        DbError(Box::new(err))
    }

    /// The SQLSTATE code the server sent, if the error came from the server
    /// (e.g. `40001` for a serialization failure).
    pub fn sqlstate(&self) -> Option<&str> {
        self.0
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|e| e.code())
            .map(|c| c.code())
    }
}

impl fmt::Debug for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)?;
        // tokio-postgres's own Display says only "db error": add the server's words.
        if let Some(db) = self
            .0
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|e| e.as_db_error())
        {
            write!(f, ": {}: {}", db.severity(), db.message())?;
            if let Some(detail) = db.detail() {
                write!(f, " ({detail})")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Why an operation of [`PgStore`](crate::PgStore) failed.
///
/// `db` fields name the database without its password, as
/// [`PgStore::label`](crate::PgStore::label) gives it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The state URL is not a PostgreSQL connection string.
    #[error(
        "state URL {url:?} is not a PostgreSQL connection string ({source}); use postgres://USER@HOST:PORT/DB or postgres://USER@/DB?host=/socket/dir"
    )]
    Url {
        /// The URL with any password replaced by `***`.
        url: String,
        /// What the driver reported.
        #[source]
        source: DbError,
    },
    /// No connection could be had: the server is down, unreachable, refuses
    /// us, or every pooled connection stayed busy past the wait timeout.
    #[error("state database {db} is unavailable: {source}")]
    Unavailable {
        /// The database concerned.
        db: String,
        /// What the driver or the pool reported.
        #[source]
        source: DbError,
    },
    /// The database was migrated by a newer plugd whose schema this build does not know.
    #[error(
        "state database {db} has schema version {found}, but this plugd knows only up to {supported}; upgrade plugd"
    )]
    TooNew {
        /// The database concerned.
        db: String,
        /// The schema version found in `plugd_schema`.
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },
    /// Upgrading the schema failed; the transaction was rolled back, so the
    /// database is left as it was.
    #[error("state database {db}: migrating to schema version {version} failed: {source}")]
    Migrate {
        /// The database concerned.
        db: String,
        /// The version the failed step would have produced.
        version: i64,
        /// What the server reported.
        #[source]
        source: DbError,
    },
    /// An argument was rejected before reaching the database.
    #[error("{what}: {problem}")]
    Invalid {
        /// What was rejected, e.g. `plugin id ""`.
        what: String,
        /// Why, and what to do.
        problem: &'static str,
    },
    /// A stored row could not be decoded.
    #[error("state database {db}: stored {what} is damaged: {detail}")]
    Damaged {
        /// The database concerned.
        db: String,
        /// The record, e.g. `approval of plugin "x"`.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A record a write needs does not exist.
    #[error("{what} does not exist")]
    NotFound {
        /// What, e.g. `chain "ch_1"`.
        what: String,
    },
    /// A write that would break a uniqueness rule; says what to do.
    #[error("{0}")]
    Conflict(String),
    /// The OS random number generator failed.
    #[error("cannot draw random bytes from the OS: {0}")]
    Random(String),
    /// A secret could not be sealed or opened, or the master key not loaded.
    #[error(transparent)]
    Secret(Box<dyn std::error::Error + Send + Sync>),
    /// `plugd cluster init` ran on this database before: a second init is refused.
    #[error(
        "state database {db} is already initialised as cluster {cluster_id} (master key {key_id}, created {created_at}); nodes join it with `plugd serve --state URL`"
    )]
    AlreadyInitialised {
        /// The database concerned.
        db: String,
        /// The cluster it holds.
        cluster_id: String,
        /// The cluster's master key id.
        key_id: String,
        /// When that cluster was created (RFC 3339 UTC).
        created_at: String,
    },
    /// The database holds no cluster record.
    #[error(
        "state database {db} is not a plugd cluster yet; run `plugd cluster init --state URL` first"
    )]
    NotInitialised {
        /// The database concerned.
        db: String,
    },
    /// A node's master key is not the one the cluster was created with.
    #[error(
        "state database {db} belongs to cluster {cluster_id} whose master key is {cluster_key_id}, but this node's master key is {node_key_id}; start every node with the cluster's key (PLUGD_MASTER_KEY or the key file)"
    )]
    KeyMismatch {
        /// The database concerned.
        db: String,
        /// The cluster it holds.
        cluster_id: String,
        /// The master key id recorded by `plugd cluster init`.
        cluster_key_id: String,
        /// The master key id of this node.
        node_key_id: String,
    },
    /// This machine has no usable master key to open the cluster with.
    #[error("state database {db}: {problem}")]
    NoKey {
        /// The database concerned (password left out).
        db: String,
        /// Why no key could be loaded.
        problem: String,
    },
    /// A workspace export into a cluster that already holds state.
    #[error(
        "state database {db} is not empty (table {table} has {rows} rows); export a workspace only into a freshly initialised cluster"
    )]
    NotEmpty {
        /// The database concerned.
        db: String,
        /// The first table found with rows.
        table: String,
        /// How many rows it has.
        rows: i64,
    },
    /// A workspace export with a secret sealed by another master key than the cluster's.
    #[error(
        "secret {field:?} of plugin {plugin:?} is sealed with master key {key_id}, but the cluster's master key is {cluster_key_id}; rotate the workspace's secrets to the cluster's key (`plugd secrets rotate`) before exporting, or init the cluster with the workspace's key"
    )]
    ForeignSecret {
        /// The plugin whose setting it is.
        plugin: String,
        /// The setting.
        field: String,
        /// The key id the secret is sealed with.
        key_id: String,
        /// The cluster's master key id.
        cluster_key_id: String,
    },
    /// A workspace export whose tables or columns do not match this schema.
    #[error("cannot export table {table}: {detail}")]
    ExportMismatch {
        /// The table concerned.
        table: String,
        /// What does not match, and what to do.
        detail: String,
    },
    /// A query failed.
    #[error("state database {db}: {action}: {source}")]
    Query {
        /// The database concerned.
        db: String,
        /// What was being done, e.g. `read the schema version`.
        action: String,
        /// What the server reported.
        #[source]
        source: DbError,
    },
}

impl From<plugd_control::store::Invalid> for PgError {
    fn from(e: plugd_control::store::Invalid) -> Self {
        PgError::Invalid {
            what: e.what,
            problem: e.problem,
        }
    }
}
