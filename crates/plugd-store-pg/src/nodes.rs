//! The nodes serving the cluster on PostgreSQL (see `plugd_control::store::nodes`): each node's row renewed by the database's clock, and the leases held now.

use plugd_control::store::Lease;
use plugd_control::store::nodes::{NodeRecord, check_node};

use crate::clock::NOW_MS;
use crate::{PgError, PgStore};

/// The nodes' rows, and the control epoch moved by every live session that
/// ends (SQLite step 19, `plugd-store` `nodes.rs`).
pub(crate) const MIGRATION: &str = r#"
    CREATE TABLE cluster_nodes (
        node_id        text COLLATE "C" PRIMARY KEY,
        version        text COLLATE "C" NOT NULL,
        schema_version bigint NOT NULL,
        key_id         text COLLATE "C" NOT NULL,
        config_digest  text COLLATE "C" NOT NULL,
        config_ms      bigint NOT NULL,
        addr           text COLLATE "C",
        started_ms     bigint NOT NULL,
        seen_ms        bigint NOT NULL
    );
    CREATE TRIGGER epoch_live_sessions_delete AFTER DELETE ON live_sessions
        FOR EACH ROW EXECUTE FUNCTION plugd_bump_epoch();
"#;

fn record(r: &tokio_postgres::Row) -> NodeRecord {
    NodeRecord {
        node_id: r.get(0),
        version: r.get(1),
        schema_version: r.get(2),
        key_id: r.get(3),
        config_digest: r.get(4),
        config_ms: r.get(5),
        addr: r.get(6),
        started_ms: r.get(7),
        seen_ms: r.get(8),
    }
}

impl PgStore {
    /// Writes node `n`'s row now (see `NodeStore::node_beat`).
    pub async fn node_beat(&self, n: &NodeRecord) -> Result<(), PgError> {
        check_node(n)?;
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO cluster_nodes AS c (node_id, version, schema_version, key_id,
                         config_digest, config_ms, addr, started_ms, seen_ms)
                     VALUES ($1, $2, $3, $4, $5, {NOW_MS}, $6, $7, {NOW_MS})
                     ON CONFLICT (node_id) DO UPDATE SET version = excluded.version,
                         schema_version = excluded.schema_version, key_id = excluded.key_id,
                         config_ms = CASE WHEN c.config_digest = excluded.config_digest
                                          THEN c.config_ms ELSE excluded.config_ms END,
                         config_digest = excluded.config_digest, addr = excluded.addr,
                         started_ms = excluded.started_ms, seen_ms = excluded.seen_ms"
                ),
                &[
                    &n.node_id,
                    &n.version,
                    &n.schema_version,
                    &n.key_id,
                    &n.config_digest,
                    &n.addr,
                    &n.started_ms,
                ],
            )
            .await
            .map_err(|e| self.query_error(format!("record node {:?}", n.node_id), e))?;
        Ok(())
    }

    /// The nodes seen within `live_ms`, by id.
    pub async fn nodes_live(&self, live_ms: i64) -> Result<Vec<NodeRecord>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT node_id, version, schema_version, key_id, config_digest, config_ms,
                            addr, started_ms, seen_ms
                     FROM cluster_nodes WHERE seen_ms > {NOW_MS} - $1 ORDER BY node_id"
                ),
                &[&live_ms],
            )
            .await
            .map_err(|e| self.query_error("list nodes", e))?;
        Ok(rows.iter().map(record).collect())
    }

    /// Removes node `id`'s row.
    pub async fn node_leave(&self, id: &str) -> Result<(), PgError> {
        let client = self.client().await?;
        client
            .execute("DELETE FROM cluster_nodes WHERE node_id = $1", &[&id])
            .await
            .map_err(|e| self.query_error(format!("remove node {id:?}"), e))?;
        Ok(())
    }

    /// Every lease held now, by name.
    pub async fn leases_held(&self) -> Result<Vec<Lease>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT name, holder, fence, until_ms FROM leases
                     WHERE until_ms > {NOW_MS} ORDER BY name"
                ),
                &[],
            )
            .await
            .map_err(|e| self.query_error("list leases", e))?;
        Ok(rows
            .iter()
            .map(|r| Lease {
                name: r.get(0),
                holder: r.get(1),
                fence: r.get(2),
                until_ms: r.get(3),
            })
            .collect())
    }
}
