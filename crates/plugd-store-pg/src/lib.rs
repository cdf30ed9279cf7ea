//! plugd-store-pg: plugd's shared state on PostgreSQL, for several nodes sharing one truth.
//!
//! [`PgStore::connect`] takes a `postgres://` URL (TCP, or a Unix-socket
//! directory with `?host=/path/to/dir`), builds a connection pool of the
//! configured size and brings the schema up to [`SCHEMA_VERSION`] (see
//! [`migrations`]): the same logical schema as SQLite's in `plugd-store`,
//! which a test compares against one checked-in snapshot.
//!
//! The state is the SQLite store's, domain by domain (one module each), as
//! async methods of [`PgStore`] with the same names and meaning, and
//! `store_impl.rs` makes [`PgStore`] a `plugd_control::store::StateStore`
//! (every trait forwards to them, `PgError` becoming the neutral
//! `StoreError`, a lost server `StoreError::Unavailable`); every
//! transaction that relies on SQLite's single writer is translated with row
//! locks and has a race test with two connections (`tests/it/`).
//!
//! **Architecture invariant:** the database is the truth and its clock
//! decides: every decision about time (leases, backoff, expiry) is taken with
//! the server's `now()`, never the node's clock.
//!
//! **API boundary:** no driver type appears in the public API; errors are
//! [`PgError`] wrapping the opaque [`DbError`].

mod chains;
mod clock;
mod cluster;
mod config;
mod error;
mod import;
mod invocations;
pub mod journal;
mod kv;
mod leases;
mod limits;
mod live;
mod memory;
pub mod migrations;
mod nodes;
mod outbox;
mod packages;
#[cfg(feature = "test-util")]
pub mod shape;
mod store_impl;
#[cfg(feature = "test-util")]
pub mod test_pg;
pub(crate) mod tokens;
mod tool_pins;
mod tool_state;
mod transcripts;
mod trust;
mod vectors;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

pub use cluster::ClusterInfo;
pub use error::{DbError, PgError};
pub use import::ImportReport;
pub use migrations::{Migrated, SCHEMA_VERSION};
pub use tokens::TOKEN_RECHECK;
pub use vectors::VectorError;

/// How a [`PgStore`] connects.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The most connections the pool keeps open at once.
    pub pool_size: usize,
    /// How long one connection attempt (socket and start-up) may take, and
    /// how long a caller waits for a free pooled connection.
    pub timeout: Duration,
    /// How long one operation of the state traits may take in all (getting
    /// a connection, its queries, its transaction): past it the caller gets
    /// `Unavailable`, so a database that stopped answering (a network cut
    /// that drops packets) never hangs a request.
    pub op_timeout: Duration,
}

/// The variable that bounds one state operation in ms
/// ([`PgOptions::op_timeout`]; [`PgOptions::from_env`]).
pub const OP_TIMEOUT_ENV: &str = "PLUGD_STATE_TIMEOUT_MS";

impl PgOptions {
    /// The defaults, with [`OP_TIMEOUT_ENV`] applied when it holds a
    /// positive number of milliseconds (anything else is ignored, warned).
    pub fn from_env() -> PgOptions {
        let mut o = PgOptions::default();
        if let Ok(v) = std::env::var(OP_TIMEOUT_ENV) {
            match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => o.op_timeout = Duration::from_millis(ms),
                _ => tracing::warn!(
                    "{OP_TIMEOUT_ENV}={v:?} is not a positive number of milliseconds; ignored"
                ),
            }
        }
        o
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            pool_size: 16,
            timeout: Duration::from_secs(5),
            op_timeout: Duration::from_millis(2_500),
        }
    }
}

/// plugd's state in one PostgreSQL database, shared by every node that
/// connects to it. `Send + Sync` and cheap to share behind an `Arc`.
pub struct PgStore {
    pool: Pool,
    label: String,
    /// The connection settings, for the journal's own connection.
    config: tokio_postgres::Config,
    timeout: Duration,
    /// The bound of one trait operation (`PgOptions::op_timeout`).
    op_timeout: Duration,
    /// The audit trail's and invocation records' writer, started on first
    /// use (`journal.rs`); dropping the store writes what it queued.
    journal: std::sync::OnceLock<journal::Journal>,
    /// Token checks under the control epoch (`tokens.rs`).
    token_cache: std::sync::Mutex<tokens::TokenCache>,
    /// One read of the control epoch for the token checks at a time: the
    /// checks arriving meanwhile use its answer (a burst of new
    /// connections makes one read, not one each).
    epoch_flight: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("db", &self.label).finish()
    }
}

impl PgStore {
    /// Connects to `url` and migrates its schema to [`SCHEMA_VERSION`].
    ///
    /// `url` is `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`, or for a Unix
    /// socket `postgres://USER@/DB?host=/path/to/socket/dir&port=N` (the
    /// socket is `DIR/.s.PGSQL.N`). A database migrated by a newer plugd is
    /// refused with [`PgError::TooNew`].
    pub async fn connect(url: &str, opts: &PgOptions) -> Result<PgStore, PgError> {
        let store = PgStore::connect_unmigrated(url, opts)?;
        store.migrate().await?;
        Ok(store)
    }

    /// Builds the pool for `url` without connecting yet or touching the schema
    /// (the first query connects); for tools that inspect a database as it is.
    pub fn connect_unmigrated(url: &str, opts: &PgOptions) -> Result<PgStore, PgError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| PgError::Url {
            url: redact(url),
            source: DbError::new(e),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(opts.timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("plugd");
        }
        PgStore::from_config(config, opts)
    }

    /// A store over an already parsed configuration (no connection yet).
    pub(crate) fn from_config(
        config: tokio_postgres::Config,
        opts: &PgOptions,
    ) -> Result<PgStore, PgError> {
        let label = label(&config);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                // Fast: a connection the server closed fails its next query
                // and is dropped then; no extra round trip per checkout.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(opts.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(opts.timeout))
            .create_timeout(Some(opts.timeout))
            .recycle_timeout(Some(opts.timeout))
            .build()
            .map_err(|e| PgError::Unavailable {
                db: label.clone(),
                source: DbError::new(e),
            })?;
        Ok(PgStore {
            pool,
            label,
            config,
            timeout: opts.timeout,
            op_timeout: opts.op_timeout,
            journal: std::sync::OnceLock::new(),
            token_cache: std::sync::Mutex::default(),
            epoch_flight: tokio::sync::Mutex::new(()),
        })
    }

    /// The database's name in messages: user, host(s), port(s) and database,
    /// never the password.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The pool's size limit.
    pub fn pool_size(&self) -> usize {
        self.pool.status().max_size
    }

    /// A pooled connection, or [`PgError::Unavailable`].
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        self.pool.get().await.map_err(|e| PgError::Unavailable {
            db: self.label.clone(),
            source: DbError::new(e),
        })
    }

    /// `op` bounded by [`PgOptions::op_timeout`]: past it, `Unavailable`
    /// naming what did not answer (the operation is abandoned).
    pub(crate) async fn bounded<T>(
        &self,
        what: &'static str,
        op: impl std::future::Future<Output = Result<T, PgError>>,
    ) -> Result<T, PgError> {
        match tokio::time::timeout(self.op_timeout, op).await {
            Ok(r) => r,
            Err(_) => Err(PgError::Unavailable {
                db: self.label.clone(),
                source: DbError::new(NoAnswer {
                    what,
                    after: self.op_timeout,
                }),
            }),
        }
    }

    /// A failed query as [`PgError`]: a broken connection, or the server
    /// shutting down or starting up (SQLSTATE class `08`, `57P01`..`57P03`),
    /// is [`PgError::Unavailable`]; anything else [`PgError::Query`].
    pub(crate) fn query_error(
        &self,
        action: impl Into<String>,
        e: tokio_postgres::Error,
    ) -> PgError {
        if is_unavailable(&e) {
            PgError::Unavailable {
                db: self.label.clone(),
                source: DbError::new(e),
            }
        } else {
            PgError::Query {
                db: self.label.clone(),
                action: action.into(),
                source: DbError::new(e),
            }
        }
    }
}

/// Whether `e` says the database cannot be reached now (the operation did
/// not happen there, or its outcome is unknown): the connection closed or
/// broke, or the server is shutting down, crashed or starting up.
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => unavailable_code(code.code()),
        None => e.as_db_error().is_none() && is_io(e),
    }
}

/// SQLSTATEs of an unreachable database: class 08 (connection exception),
/// 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now.
fn unavailable_code(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
}

/// Whether the driver error came from the socket (the server went away).
fn is_io(e: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// `postgres://user@host:port/db` from a parsed configuration, without the password.
fn label(config: &tokio_postgres::Config) -> String {
    let user = config.get_user().unwrap_or("");
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            match ports.get(i).or(ports.first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{}/{db}", hosts.join(","))
}

/// `url` with any password (in the authority or a `password=` parameter)
/// replaced by `***`, for an error about a URL that did not parse.
fn redact(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest = scheme_end + 3;
        let authority_end = out[rest..].find(['/', '?']).map_or(out.len(), |i| rest + i);
        if let Some(at) = out[rest..authority_end].rfind('@') {
            let userinfo = rest..rest + at;
            if let Some(colon) = out[userinfo.clone()].find(':') {
                out.replace_range(rest + colon + 1..rest + at, "***");
            }
        }
    }
    if let Some(p) = out.find("password=") {
        let start = p + "password=".len();
        let end = out[start..]
            .find(['&', ' '])
            .map_or(out.len(), |i| start + i);
        out.replace_range(start..end, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("postgres://u@h/db?password=x&sslmode=disable"),
            "postgres://u@h/db?password=***&sslmode=disable"
        );
    }

    #[test]
    fn unix_socket_urls_name_the_directory() {
        let config: tokio_postgres::Config = "postgres://plugd@/state?host=/run/pg%20x&port=6543"
            .parse()
            .unwrap();
        assert_eq!(
            config.get_hosts(),
            [Host::Unix(std::path::PathBuf::from("/run/pg x"))]
        );
        assert_eq!(label(&config), "postgres://plugd@/run/pg x:6543/state");
        let config: tokio_postgres::Config = "postgres://plugd@/state?host=/tmp/d".parse().unwrap();
        assert_eq!(config.get_hosts(), [Host::Unix("/tmp/d".into())]);
    }

    #[test]
    fn tcp_labels_carry_no_password() {
        let config: tokio_postgres::Config =
            "postgres://u:pw@db.example:5433/state".parse().unwrap();
        assert_eq!(label(&config), "postgres://u@db.example:5433/state");
        let config: tokio_postgres::Config = "postgres://u@a:1,b:2/s".parse().unwrap();
        assert_eq!(label(&config), "postgres://u@a:1,b:2/s");
    }

    #[test]
    fn a_bad_url_is_refused_without_its_password() {
        let err =
            PgStore::connect_unmigrated("postgres://u:pw@h:notaport/db", &PgOptions::default())
                .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, PgError::Url { .. }), "{msg}");
        assert!(!msg.contains("pw@"), "{msg}");
        assert!(msg.contains("u:***@h"), "{msg}");
    }

    #[test]
    fn shutdown_and_connection_states_are_unavailable() {
        for code in ["08006", "08001", "57P01", "57P02", "57P03"] {
            assert!(unavailable_code(code), "{code}");
        }
        for code in ["23505", "40001", "42P01", "57014"] {
            assert!(!unavailable_code(code), "{code}");
        }
    }

    #[test]
    fn store_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<PgStore>();
    }
}

/// An operation the database did not finish within its bound.
#[derive(Debug)]
struct NoAnswer {
    what: &'static str,
    after: Duration,
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} got no answer within {} ms",
            self.what,
            self.after.as_millis()
        )
    }
}

impl std::error::Error for NoAnswer {}
