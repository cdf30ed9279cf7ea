//! A read-only copy of a workspace's whole state, table by table, for
//! `plugd state export` (plugd-store-pg copies it into a cluster).
//!
//! [`read_workspace`] opens `state.db` read-only (never migrating or
//! writing it) and reads every table of the logical schema in one read
//! transaction, so the copy is one consistent instant even while a serve
//! writes. Values are neutral ([`DumpValue`]): nothing of the SQLite binding
//! appears in the API. Sealed secrets stay the boxes they are.
//!
//! Left out, as in the shape (`shape.rs`): `sqlite_*` tables, FTS5 virtual
//! tables and their shadow tables (PostgreSQL indexes memories itself), and
//! the `plugd_workspace` identity table.

use std::path::{Path, PathBuf};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

use crate::error::{BackendError, StoreError};
use crate::store::{SCHEMA_VERSION, STATE_DB_FILE};

/// One stored value, as SQLite's storage classes have it.
#[derive(Debug, Clone, PartialEq)]
pub enum DumpValue {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Integer(i64),
    /// A double.
    Real(f64),
    /// UTF-8 text.
    Text(String),
    /// Bytes (sealed secrets, token hashes, embeddings).
    Blob(Vec<u8>),
}

/// One row: SQLite's row id (for tables that have one) and the values in
/// the order of [`TableDump::columns`].
#[derive(Debug, Clone, PartialEq)]
pub struct DumpRow {
    /// The implicit `rowid` (`None` for `WITHOUT ROWID` tables): where the
    /// store orders ties by it, the copy keeps it.
    pub rowid: Option<i64>,
    /// The columns' values.
    pub values: Vec<DumpValue>,
}

/// Every row of one table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableDump {
    /// The table's name.
    pub table: String,
    /// Its columns, in declaration order.
    pub columns: Vec<String>,
    /// Its rows, in row-id order (primary-key order without a row id).
    pub rows: Vec<DumpRow>,
}

/// A workspace's state at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceDump {
    /// The database read.
    pub path: PathBuf,
    /// Its schema version (always [`SCHEMA_VERSION`]).
    pub schema_version: i64,
    /// Every table of the logical schema, sorted by name.
    pub tables: Vec<TableDump>,
}

impl WorkspaceDump {
    /// The table named `name`, if the workspace has it.
    pub fn table(&self, name: &str) -> Option<&TableDump> {
        self.tables.iter().find(|t| t.table == name)
    }
}

/// Reads every table of `state_dir/state.db` without writing it.
///
/// Refused when there is no database, and when its schema is not this
/// build's (older: any plugd command in the workspace upgrades it first;
/// newer: [`StoreError::TooNew`]).
pub fn read_workspace(state_dir: &Path) -> Result<WorkspaceDump, StoreError> {
    let path = state_dir.join(STATE_DB_FILE);
    if !path.is_file() {
        return Err(StoreError::Io {
            path: path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no state database here; run the export in the workspace directory (or pass --workspace DIR)",
            ),
        });
    }
    let open_error = |e: rusqlite::Error| StoreError::Open {
        path: path.clone(),
        source: BackendError::new(e),
    };
    let mut conn = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open_error)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(open_error)?;
    let label = path.display().to_string();
    let query_error = |action: &str, e: rusqlite::Error| StoreError::Query {
        db: label.clone(),
        action: action.to_owned(),
        source: BackendError::new(e),
    };
    // One read transaction: every table from the same instant.
    let tx = conn
        .transaction()
        .map_err(|e| query_error("begin reading", e))?;
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(open_error)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.clone(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < SCHEMA_VERSION {
        return Err(StoreError::Invalid {
            what: format!("state database {label} (schema version {version})"),
            problem: "is older than this plugd's; run any plugd command in the workspace (e.g. `plugd plugin list`) to upgrade it, then export again",
        });
    }
    let mut tables = Vec::new();
    for (table, without_rowid) in
        logical_tables(&tx).map_err(|e| query_error("list the tables", e))?
    {
        // Each database keeps its own control epoch: a counter of changes
        // (the copied rows move the cluster's), not state to copy.
        if table == "control_epoch" {
            continue;
        }
        tables.push(
            read_table(&tx, &table, without_rowid)
                .map_err(|e| query_error(&format!("read table {table}"), e))?,
        );
    }
    tx.commit().map_err(|e| query_error("end reading", e))?;
    Ok(WorkspaceDump {
        path,
        schema_version: version,
        tables,
    })
}

/// The tables of the logical schema (name, whether it is `WITHOUT ROWID`),
/// sorted by name: every table but `sqlite_*`, FTS5 virtual tables with their
/// shadow tables, and `plugd_workspace`.
pub(crate) fn logical_tables(conn: &Connection) -> rusqlite::Result<Vec<(String, bool)>> {
    let mut tables: Vec<(String, String)> = conn
        .prepare(
            "SELECT name, COALESCE(sql, '') FROM sqlite_master WHERE type = 'table' ORDER BY name",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let virtual_tables: Vec<String> = tables
        .iter()
        .filter(|(_, sql)| sql.to_ascii_uppercase().starts_with("CREATE VIRTUAL TABLE"))
        .map(|(name, _)| name.clone())
        .collect();
    tables.retain(|(name, _)| {
        !name.starts_with("sqlite_")
            && name != "plugd_workspace"
            && !virtual_tables
                .iter()
                .any(|v| name == v || name.starts_with(&format!("{v}_")))
    });
    Ok(tables
        .into_iter()
        .map(|(name, sql)| {
            let without_rowid = sql.to_ascii_uppercase().contains("WITHOUT ROWID");
            (name, without_rowid)
        })
        .collect())
}

fn read_table(conn: &Connection, table: &str, without_rowid: bool) -> rusqlite::Result<TableDump> {
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")?
        .query_map([table], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let quoted: Vec<String> = columns.iter().map(|c| quote(c)).collect();
    let sql = if without_rowid {
        format!("SELECT {} FROM {}", quoted.join(", "), quote(table))
    } else {
        format!(
            "SELECT _rowid_, {} FROM {} ORDER BY _rowid_",
            quoted.join(", "),
            quote(table)
        )
    };
    let offset = usize::from(!without_rowid);
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt
        .query_map([], |r| {
            let rowid = if without_rowid {
                None
            } else {
                Some(r.get::<_, i64>(0)?)
            };
            let mut values = Vec::with_capacity(columns.len());
            for i in 0..columns.len() {
                values.push(match r.get_ref(i + offset)? {
                    ValueRef::Null => DumpValue::Null,
                    ValueRef::Integer(v) => DumpValue::Integer(v),
                    ValueRef::Real(v) => DumpValue::Real(v),
                    ValueRef::Text(t) => DumpValue::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => DumpValue::Blob(b.to_vec()),
                });
            }
            Ok(DumpRow { rowid, values })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TableDump {
        table: table.to_owned(),
        columns,
        rows,
    })
}

/// An SQL identifier in double quotes.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    #[test]
    fn reads_every_logical_table_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join(".plugd");
        {
            let store = Store::open(&state).unwrap();
            store
                .kv_set("database", "k", &serde_json::json!(1))
                .unwrap();
        }
        let db = state.join(STATE_DB_FILE);
        let before = std::fs::read(&db).unwrap();
        let dump = read_workspace(&state).unwrap();
        assert_eq!(std::fs::read(&db).unwrap(), before);
        assert_eq!(dump.schema_version, SCHEMA_VERSION);
        let names: Vec<&str> = dump.tables.iter().map(|t| t.table.as_str()).collect();
        assert!(names.contains(&"agent_kv"), "{names:?}");
        assert!(names.contains(&"chain_blocks"), "{names:?}");
        assert!(
            !names.iter().any(|n| n.starts_with("memories_fts")),
            "{names:?}"
        );
        assert!(!names.contains(&"plugd_workspace"), "{names:?}");
        let kv = dump.table("agent_kv").unwrap();
        assert_eq!(kv.rows.len(), 1);
        assert!(kv.rows[0].rowid.is_some());
        let space = kv.columns.iter().position(|c| c == "space").unwrap();
        assert_eq!(kv.rows[0].values[space], DumpValue::Text("database".into()));
        assert!(dump.table("chain_blocks").unwrap().rows.is_empty());
    }

    #[test]
    fn a_missing_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_workspace(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no state database here"), "{err}");
        assert!(!dir.path().join(STATE_DB_FILE).exists());
    }
}
