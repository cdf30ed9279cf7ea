//! The cluster record: one row saying which plugd cluster a database holds
//! (its id, the id of the master key every node must use, when it was
//! created), written once by `plugd cluster init` and checked by every node
//! that opens the database ([`PgStore::open_node`]).
//!
//! The table `plugd_cluster` lives outside the numbered migrations and the
//! logical shape, like `plugd_schema` here and SQLite's `plugd_workspace`
//! identity table: it is this backend's identity, not shared state, and
//! the single-node SQLite store has no cluster. It is created idempotently
//! under the migration lock by [`PgStore::cluster_init`]; a database without
//! it is not initialised.

use tokio_postgres::error::SqlState;

use crate::clock::NOW_RFC3339;
use crate::migrations::MIGRATION_LOCK_KEY;
use crate::{PgError, PgOptions, PgStore};

/// Tables of this backend's own bookkeeping, outside the logical shape and
/// never exported: the schema version and the cluster record (and
/// `plugd_workspace`, SQLite's identity table, should one be copied in).
pub(crate) const INTERNAL_TABLES: &[&str] = &["plugd_schema", "plugd_cluster", "plugd_workspace"];

/// The cluster table, created under the migration lock. `id = 1`: one row.
const CLUSTER_TABLE: &str = r#"CREATE TABLE IF NOT EXISTS plugd_cluster (
        id         smallint PRIMARY KEY CHECK (id = 1),
        cluster_id text COLLATE "C" NOT NULL,
        key_id     text COLLATE "C" NOT NULL,
        created_at text COLLATE "C" NOT NULL
    )"#;

/// What the cluster record of a database says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The cluster's id (`cluster_` and a UUIDv7-like random id).
    pub cluster_id: String,
    /// The id of the master key every node of the cluster uses (`k-…`, see
    /// `plugd_store::secrets::MasterKey::id`); never the key itself.
    pub key_id: String,
    /// When `plugd cluster init` ran, RFC 3339 UTC by the database's clock.
    pub created_at: String,
    /// The schema version recorded in the database when read.
    pub schema_version: i64,
}

impl PgStore {
    /// Makes this database a cluster whose nodes use the master key
    /// `key_id`: migrates the schema, then writes the cluster record with a
    /// fresh cluster id and the database's time.
    ///
    /// Refused with [`PgError::AlreadyInitialised`] (naming the cluster) when
    /// the database already has a record: of several inits at once exactly
    /// one wins, since each holds the migration lock while it looks.
    pub async fn cluster_init(&self, key_id: &str) -> Result<ClusterInfo, PgError> {
        if key_id.is_empty() {
            return Err(PgError::Invalid {
                what: "master key id \"\"".to_owned(),
                problem: "a cluster needs the id of its master key",
            });
        }
        self.migrate().await?;
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error("begin the cluster init", e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
            .await
            .map_err(|e| self.query_error("take the schema migration lock", e))?;
        tx.batch_execute(CLUSTER_TABLE)
            .await
            .map_err(|e| self.query_error("create the cluster table", e))?;
        if let Some(row) = tx
            .query_opt(
                "SELECT cluster_id, key_id, created_at FROM plugd_cluster WHERE id = 1",
                &[],
            )
            .await
            .map_err(|e| self.query_error("read the cluster record", e))?
        {
            return Err(PgError::AlreadyInitialised {
                db: self.label().to_owned(),
                cluster_id: row.get(0),
                key_id: row.get(1),
                created_at: row.get(2),
            });
        }
        let cluster_id = plugd_control::id::fresh("cluster");
        let row = tx
            .query_one(
                &format!(
                    "INSERT INTO plugd_cluster (id, cluster_id, key_id, created_at)
                     VALUES (1, $1, $2, {NOW_RFC3339})
                     RETURNING created_at, (SELECT version FROM plugd_schema WHERE id = 1)"
                ),
                &[&cluster_id, &key_id],
            )
            .await
            .map_err(|e| self.query_error("write the cluster record", e))?;
        let info = ClusterInfo {
            cluster_id,
            key_id: key_id.to_owned(),
            created_at: row.get(0),
            schema_version: row.get::<_, Option<i64>>(1).unwrap_or(0),
        };
        tx.commit()
            .await
            .map_err(|e| self.query_error("commit the cluster record", e))?;
        tracing::info!(db = %self.label(), cluster = %info.cluster_id, key = %info.key_id, "cluster initialised");
        Ok(info)
    }

    /// The cluster record, or `None` when `plugd cluster init` never ran on
    /// this database. Reads only (no migration).
    pub async fn cluster_info(&self) -> Result<Option<ClusterInfo>, PgError> {
        let client = self.client().await?;
        let row = match client
            .query_opt(
                "SELECT cluster_id, key_id, created_at FROM plugd_cluster WHERE id = 1",
                &[],
            )
            .await
        {
            Ok(row) => row,
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => None,
            Err(e) => return Err(self.query_error("read the cluster record", e)),
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let schema_version = self.schema_version().await?;
        Ok(Some(ClusterInfo {
            cluster_id: row.get(0),
            key_id: row.get(1),
            created_at: row.get(2),
            schema_version,
        }))
    }

    /// Connects a node to the cluster at `url`: connects, migrates, and checks
    /// the cluster record. Refused with [`PgError::NotInitialised`] when
    /// `plugd cluster init` never ran there, and with
    /// [`PgError::KeyMismatch`] (naming both key ids) when the node's master
    /// key `key_id` is not the cluster's.
    pub async fn open_node(url: &str, opts: &PgOptions, key_id: &str) -> Result<PgStore, PgError> {
        let store = PgStore::connect(url, opts).await?;
        store.check_node(key_id).await?;
        Ok(store)
    }

    /// [`PgStore::open_node`] with this machine's master key from its usual
    /// sources (`PLUGD_MASTER_KEY`, the key file; never created here: a node
    /// without the cluster's key is refused): how a node and every command
    /// open the cluster's state.
    pub async fn open_node_with_env_key(url: &str) -> Result<PgStore, PgError> {
        let key = plugd_store::secrets::KeySource::from_env()
            .and_then(|source| source.require())
            .map_err(|e| PgError::NoKey {
                db: crate::redact(url),
                problem: e.to_string(),
            })?;
        PgStore::open_node(url, &PgOptions::from_env(), key.id()).await
    }

    /// The cluster record, checked against a node's master key id.
    pub async fn check_node(&self, key_id: &str) -> Result<ClusterInfo, PgError> {
        let Some(info) = self.cluster_info().await? else {
            return Err(PgError::NotInitialised {
                db: self.label().to_owned(),
            });
        };
        if info.key_id != key_id {
            return Err(PgError::KeyMismatch {
                db: self.label().to_owned(),
                cluster_id: info.cluster_id,
                cluster_key_id: info.key_id,
                node_key_id: key_id.to_owned(),
            });
        }
        Ok(info)
    }
}
