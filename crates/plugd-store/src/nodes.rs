//! The nodes serving this state on SQLite (see `plugd_control::store::nodes`), and the trigger that makes an ended live session move the control epoch.

use plugd_control::store::nodes::{NodeRecord, check_node};
use rusqlite::params;

use crate::error::StoreError;
use crate::outbox::now_ms;
use crate::store::Store;

/// Schema step 19: the nodes' rows, and the control epoch moved by every
/// live session that ends (so the nodes that cache it drop it at their
/// next request).
pub(crate) const MIGRATION: &str = "
    CREATE TABLE cluster_nodes (
        node_id        TEXT PRIMARY KEY NOT NULL,
        version        TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        key_id         TEXT NOT NULL,
        config_digest  TEXT NOT NULL,
        config_ms      INTEGER NOT NULL,
        addr           TEXT,
        started_ms     INTEGER NOT NULL,
        seen_ms        INTEGER NOT NULL
    ) STRICT;
    CREATE TRIGGER epoch_live_sessions_delete AFTER DELETE ON live_sessions
        BEGIN UPDATE control_epoch SET n = n + 1 WHERE id = 1; END;
";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<NodeRecord> {
    Ok(NodeRecord {
        node_id: r.get(0)?,
        version: r.get(1)?,
        schema_version: r.get(2)?,
        key_id: r.get(3)?,
        config_digest: r.get(4)?,
        config_ms: r.get(5)?,
        addr: r.get(6)?,
        started_ms: r.get(7)?,
        seen_ms: r.get(8)?,
    })
}

impl Store {
    /// Writes node `n`'s row now (see `NodeStore::node_beat`).
    pub fn node_beat(&self, n: &NodeRecord) -> Result<(), StoreError> {
        check_node(n)?;
        let now = now_ms();
        self.lock()
            .execute(
                "INSERT INTO cluster_nodes (node_id, version, schema_version, key_id,
                     config_digest, config_ms, addr, started_ms, seen_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?6)
                 ON CONFLICT (node_id) DO UPDATE SET version = excluded.version,
                     schema_version = excluded.schema_version, key_id = excluded.key_id,
                     config_ms = CASE WHEN cluster_nodes.config_digest = excluded.config_digest
                                      THEN cluster_nodes.config_ms ELSE excluded.config_ms END,
                     config_digest = excluded.config_digest, addr = excluded.addr,
                     started_ms = excluded.started_ms, seen_ms = excluded.seen_ms",
                params![
                    n.node_id,
                    n.version,
                    n.schema_version,
                    n.key_id,
                    n.config_digest,
                    now,
                    n.addr,
                    n.started_ms
                ],
            )
            .map_err(|e| self.query_error(format!("record node {:?}", n.node_id), e))?;
        Ok(())
    }

    /// The nodes seen within `live_ms`, by id.
    pub fn nodes_live(&self, live_ms: i64) -> Result<Vec<NodeRecord>, StoreError> {
        let conn = self.lock();
        let mut st = conn
            .prepare(
                "SELECT node_id, version, schema_version, key_id, config_digest, config_ms,
                        addr, started_ms, seen_ms
                 FROM cluster_nodes WHERE seen_ms > ?1 ORDER BY node_id",
            )
            .map_err(|e| self.query_error("list nodes".into(), e))?;
        let rows = st
            .query_map(params![now_ms() - live_ms], row)
            .and_then(Iterator::collect)
            .map_err(|e| self.query_error("list nodes".into(), e))?;
        Ok(rows)
    }

    /// Removes node `id`'s row.
    pub fn node_leave(&self, id: &str) -> Result<(), StoreError> {
        self.lock()
            .execute("DELETE FROM cluster_nodes WHERE node_id = ?1", params![id])
            .map_err(|e| self.query_error(format!("remove node {id:?}"), e))?;
        Ok(())
    }

    /// Every lease held now, by name.
    pub fn leases_held(&self) -> Result<Vec<plugd_control::store::Lease>, StoreError> {
        let conn = self.lock();
        let mut st = conn
            .prepare("SELECT name, holder, fence, until_ms FROM leases WHERE until_ms > ?1 ORDER BY name")
            .map_err(|e| self.query_error("list leases".into(), e))?;
        let rows = st
            .query_map(params![now_ms()], |r| {
                Ok(plugd_control::store::Lease {
                    name: r.get(0)?,
                    holder: r.get(1)?,
                    fence: r.get(2)?,
                    until_ms: r.get(3)?,
                })
            })
            .and_then(Iterator::collect)
            .map_err(|e| self.query_error("list leases".into(), e))?;
        Ok(rows)
    }
}
