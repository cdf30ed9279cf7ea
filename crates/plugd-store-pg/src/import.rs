//! `plugd state export`: a single-node workspace's state (read by
//! `plugd_store::dump`) copied into an initialised, empty cluster database
//! in one transaction.
//!
//! Table by table, column by column by name, with the type mapping of
//! [`migrations`](crate::migrations) (text, bigint, bytea, double precision,
//! boolean); SQLite's row id goes into the explicit `rowid` columns so ties
//! keep their order; generated columns (the memories' `tsvector`) are
//! computed by the server. Tables are filled parents first (foreign keys
//! read from the catalog; a self-referencing table's rows parents first),
//! then every identity sequence restarts after the largest id copied.
//!
//! Refused before anything is written: a database without a cluster
//! record, a logical table that already holds rows (the first one named), a
//! sealed secret whose master key is not the cluster's (plugin, field and
//! both key ids named), tables or columns that do not match this build's
//! schema. Secrets are copied as the sealed boxes they are, never opened.

use std::collections::{BTreeMap, HashMap, HashSet};

use plugd_store::dump::{DumpRow, DumpValue, TableDump, WorkspaceDump};
use tokio_postgres::types::{ToSql, Type};

use crate::cluster::INTERNAL_TABLES;
use crate::migrations::MIGRATION_LOCK_KEY;
use crate::{PgError, PgStore};

/// The most parameters one `INSERT` carries (PostgreSQL allows 65535).
const MAX_PARAMS: usize = 30_000;

/// The most rows one `INSERT` carries.
const MAX_ROWS: usize = 500;

/// What an export copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// The cluster the state now belongs to.
    pub cluster_id: String,
    /// Rows copied per table, in the order the tables were filled.
    pub tables: Vec<(String, u64)>,
}

/// One column of a PostgreSQL table.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    data_type: String,
    /// `GENERATED ALWAYS AS (…) STORED`: computed by the server.
    generated: bool,
    /// `GENERATED ALWAYS AS IDENTITY` (needs `OVERRIDING SYSTEM VALUE`).
    identity_always: bool,
    /// Any identity column (its sequence is reset after the copy).
    identity: bool,
}

/// A foreign key of one column.
#[derive(Debug, Clone)]
struct ForeignKey {
    table: String,
    column: String,
    parent: String,
    parent_column: String,
}

/// Where a target column's values come from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// SQLite's row id.
    RowId,
    /// The dump's column at this index.
    Column(usize),
}

/// Tables each database keeps for itself and an export does not copy: the
/// control epoch is a counter of changes (the copied rows bump the
/// cluster's own), not state.
const OWN_COUNTERS: &[&str] = &["control_epoch"];

impl PgStore {
    /// Copies `dump` into this cluster database in one transaction (see the
    /// module documentation for what is refused). The SQLite file is not
    /// touched: `dump` was read before.
    pub async fn import_workspace(&self, dump: &WorkspaceDump) -> Result<ImportReport, PgError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error("begin the export", e))?;
        // One export (or init, or migration) at a time.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
            .await
            .map_err(|e| self.query_error("take the schema migration lock", e))?;
        let cluster = match tx
            .query_opt(
                "SELECT cluster_id, key_id FROM plugd_cluster WHERE id = 1",
                &[],
            )
            .await
        {
            Ok(row) => row.map(|r| (r.get::<_, String>(0), r.get::<_, String>(1))),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => None,
            Err(e) => return Err(self.query_error("read the cluster record", e)),
        };
        let Some((cluster_id, cluster_key_id)) = cluster else {
            return Err(PgError::NotInitialised {
                db: self.label().to_owned(),
            });
        };

        let mut columns = self.columns(&tx).await?;
        columns.retain(|table, _| !OWN_COUNTERS.contains(&table.as_str()));
        let sources: BTreeMap<&str, &TableDump> = dump
            .tables
            .iter()
            .filter(|t| !OWN_COUNTERS.contains(&t.table.as_str()))
            .map(|t| (t.table.as_str(), t))
            .collect();
        for table in columns.keys() {
            if !sources.contains_key(table.as_str()) {
                return Err(PgError::ExportMismatch {
                    table: table.clone(),
                    detail: format!(
                        "the workspace {} has no such table; export with the plugd version that wrote the workspace",
                        dump.path.display()
                    ),
                });
            }
        }
        for table in sources.keys() {
            if !columns.contains_key(*table) {
                return Err(PgError::ExportMismatch {
                    table: (*table).to_owned(),
                    detail: "the cluster's schema has no such table; upgrade plugd".to_owned(),
                });
            }
        }

        // Nothing may be there yet: the first table with rows is named.
        for table in columns.keys() {
            let rows: i64 = tx
                .query_one(&format!("SELECT count(*) FROM {}", quote(table)), &[])
                .await
                .map_err(|e| self.query_error(format!("count the rows of {table}"), e))?
                .get(0);
            if rows > 0 {
                return Err(PgError::NotEmpty {
                    db: self.label().to_owned(),
                    table: table.clone(),
                    rows,
                });
            }
        }

        if let Some(config) = sources.get("plugin_config") {
            check_secret_keys(config, &cluster_key_id)?;
        }

        let keys = self.foreign_keys(&tx).await?;
        let order = fill_order(columns.keys().cloned().collect(), &keys);
        let mut report = Vec::with_capacity(order.len());
        for table in &order {
            let source = sources[table.as_str()];
            let cols = &columns[table];
            let targets = plan(table, cols, source)?;
            let self_key = keys
                .iter()
                .find(|k| &k.table == table && &k.parent == table);
            let rows = match self_key {
                Some(k) => parents_first(source, &k.column, &k.parent_column),
                None => source.rows.iter().collect(),
            };
            self.insert_rows(&tx, table, &targets, &rows).await?;
            for (_, c) in cols.iter().filter(|(_, c)| c.identity) {
                let sql = format!(
                    "SELECT setval(pg_get_serial_sequence($1, $2),
                                   COALESCE(max({col}), 1), max({col}) IS NOT NULL)
                     FROM {t}",
                    col = quote(&c.name),
                    t = quote(table)
                );
                tx.query_one(&sql, &[&quote(table), &c.name])
                    .await
                    .map_err(|e| {
                        self.query_error(format!("restart the sequence of {table}.{}", c.name), e)
                    })?;
            }
            report.push((table.clone(), rows.len() as u64));
        }
        tx.commit()
            .await
            .map_err(|e| self.query_error("commit the export", e))?;
        tracing::info!(db = %self.label(), cluster = %cluster_id, from = %dump.path.display(), "workspace exported");
        Ok(ImportReport {
            cluster_id,
            tables: report,
        })
    }

    /// Every logical table's columns, by table name.
    async fn columns(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<BTreeMap<String, Vec<(String, Column)>>, PgError> {
        let rows = tx
            .query(
                "SELECT c.table_name::text, c.column_name::text, c.data_type::text,
                        c.is_generated = 'ALWAYS', c.identity_generation::text
                 FROM information_schema.columns c
                 JOIN information_schema.tables t
                   ON t.table_schema = c.table_schema AND t.table_name = c.table_name
                 WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
                   AND c.table_name <> ALL($1)
                 ORDER BY c.table_name, c.ordinal_position",
                &[&INTERNAL_TABLES],
            )
            .await
            .map_err(|e| self.query_error("read the columns", e))?;
        let mut out: BTreeMap<String, Vec<(String, Column)>> = BTreeMap::new();
        for r in rows {
            let identity: Option<String> = r.get(4);
            let column = Column {
                name: r.get(1),
                data_type: r.get(2),
                generated: r.get(3),
                identity_always: identity.as_deref() == Some("ALWAYS"),
                identity: identity.is_some(),
            };
            out.entry(r.get(0))
                .or_default()
                .push((column.name.clone(), column));
        }
        Ok(out)
    }

    /// Single-column foreign keys of the logical tables.
    async fn foreign_keys(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<Vec<ForeignKey>, PgError> {
        let rows = tx
            .query(
                "SELECT child.relname::text, a.attname::text, parent.relname::text, pa.attname::text
                 FROM pg_constraint c
                 JOIN pg_class child ON child.oid = c.conrelid
                 JOIN pg_class parent ON parent.oid = c.confrelid
                 JOIN pg_namespace n ON n.oid = child.relnamespace
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
                 JOIN pg_attribute pa ON pa.attrelid = c.confrelid AND pa.attnum = c.confkey[1]
                 WHERE c.contype = 'f' AND n.nspname = current_schema()
                 ORDER BY 1, 2",
                &[],
            )
            .await
            .map_err(|e| self.query_error("read the foreign keys", e))?;
        Ok(rows
            .into_iter()
            .map(|r| ForeignKey {
                table: r.get(0),
                column: r.get(1),
                parent: r.get(2),
                parent_column: r.get(3),
            })
            .collect())
    }

    /// Inserts `rows` into `table`, several rows per statement.
    async fn insert_rows(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        table: &str,
        targets: &[(&Column, Source)],
        rows: &[&DumpRow],
    ) -> Result<(), PgError> {
        if rows.is_empty() || targets.is_empty() {
            return Ok(());
        }
        let per_statement = (MAX_PARAMS / targets.len()).clamp(1, MAX_ROWS);
        let types: Vec<Type> = targets.iter().map(|(c, _)| pg_type(c)).collect();
        let overriding = if targets.iter().any(|(c, _)| c.identity_always) {
            " OVERRIDING SYSTEM VALUE"
        } else {
            ""
        };
        let names: Vec<String> = targets.iter().map(|(c, _)| quote(&c.name)).collect();
        let mut prepared: HashMap<usize, tokio_postgres::Statement> = HashMap::new();
        for chunk in rows.chunks(per_statement) {
            let statement = match prepared.get(&chunk.len()) {
                Some(s) => s.clone(),
                None => {
                    let mut sql = format!(
                        "INSERT INTO {} ({}){overriding} VALUES ",
                        quote(table),
                        names.join(", ")
                    );
                    let mut param_types = Vec::with_capacity(chunk.len() * targets.len());
                    for i in 0..chunk.len() {
                        if i > 0 {
                            sql.push_str(", ");
                        }
                        sql.push('(');
                        for j in 0..targets.len() {
                            if j > 0 {
                                sql.push_str(", ");
                            }
                            sql.push_str(&format!("${}", i * targets.len() + j + 1));
                        }
                        sql.push(')');
                        param_types.extend(types.iter().cloned());
                    }
                    let s = tx
                        .prepare_typed(&sql, &param_types)
                        .await
                        .map_err(|e| self.query_error(format!("prepare the copy of {table}"), e))?;
                    prepared.insert(chunk.len(), s.clone());
                    s
                }
            };
            let mut params: Vec<Box<dyn ToSql + Sync + Send>> =
                Vec::with_capacity(chunk.len() * targets.len());
            for row in chunk {
                for (column, source) in targets {
                    params.push(convert(table, column, *source, row)?);
                }
            }
            let refs: Vec<&(dyn ToSql + Sync)> = params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect();
            tx.execute(&statement, &refs)
                .await
                .map_err(|e| self.query_error(format!("copy the rows of {table}"), e))?;
        }
        Ok(())
    }
}

/// Refuses a sealed secret whose master key is not the cluster's.
fn check_secret_keys(config: &TableDump, cluster_key_id: &str) -> Result<(), PgError> {
    let index = |name: &str| {
        config
            .columns
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| PgError::ExportMismatch {
                table: config.table.clone(),
                detail: format!("the workspace's table has no column {name}"),
            })
    };
    let (plugin, key, key_id) = (index("plugin_id")?, index("key")?, index("key_id")?);
    let text = |v: &DumpValue| match v {
        DumpValue::Text(t) => Some(t.clone()),
        _ => None,
    };
    for row in &config.rows {
        let Some(id) = text(&row.values[key_id]) else {
            continue;
        };
        if id != cluster_key_id {
            return Err(PgError::ForeignSecret {
                plugin: text(&row.values[plugin]).unwrap_or_default(),
                field: text(&row.values[key]).unwrap_or_default(),
                key_id: id,
                cluster_key_id: cluster_key_id.to_owned(),
            });
        }
    }
    Ok(())
}

/// The tables in an order where every parent comes before its children
/// (self references aside), ties by name.
fn fill_order(mut tables: Vec<String>, keys: &[ForeignKey]) -> Vec<String> {
    tables.sort();
    let mut placed: HashSet<String> = HashSet::new();
    let mut order = Vec::with_capacity(tables.len());
    while order.len() < tables.len() {
        let before = order.len();
        for t in &tables {
            if placed.contains(t) {
                continue;
            }
            let ready = keys
                .iter()
                .filter(|k| &k.table == t && &k.parent != t)
                .all(|k| placed.contains(&k.parent) || !tables.contains(&k.parent));
            if ready {
                placed.insert(t.clone());
                order.push(t.clone());
            }
        }
        if order.len() == before {
            // A cycle between tables (none today): the rest by name, and
            // the server's foreign-key check says what failed.
            for t in &tables {
                if placed.insert(t.clone()) {
                    order.push(t.clone());
                }
            }
        }
    }
    order
}

/// The rows of a self-referencing table with every referenced row before
/// the rows that name it (`column` references `parent_column`).
fn parents_first<'a>(table: &'a TableDump, column: &str, parent_column: &str) -> Vec<&'a DumpRow> {
    let (Some(child), Some(parent)) = (
        table.columns.iter().position(|c| c == column),
        table.columns.iter().position(|c| c == parent_column),
    ) else {
        return table.rows.iter().collect();
    };
    // Values compared through their debug form (`DumpValue` holds floats,
    // so it is not `Hash`); ids are text, whose form is exact.
    let keys: Vec<String> = table
        .rows
        .iter()
        .map(|r| format!("{:?}", r.values[parent]))
        .collect();
    let mut placed: HashSet<String> = HashSet::new();
    let mut done = vec![false; table.rows.len()];
    let mut out = Vec::with_capacity(table.rows.len());
    loop {
        let before = out.len();
        for (i, row) in table.rows.iter().enumerate() {
            if done[i] {
                continue;
            }
            let reference = &row.values[child];
            let wanted = format!("{reference:?}");
            let ready = *reference == DumpValue::Null
                || placed.contains(&wanted)
                || !keys.contains(&wanted);
            if ready {
                done[i] = true;
                placed.insert(keys[i].clone());
                out.push(row);
            }
        }
        if out.len() == table.rows.len() {
            return out;
        }
        if out.len() == before {
            // A cycle of rows: the rest as they are (the server refuses).
            out.extend(
                table
                    .rows
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !done[*i])
                    .map(|(_, r)| r),
            );
            return out;
        }
    }
}

/// Which source feeds each column that is written; every column of the
/// workspace must land somewhere.
fn plan<'c>(
    table: &str,
    columns: &'c [(String, Column)],
    source: &TableDump,
) -> Result<Vec<(&'c Column, Source)>, PgError> {
    let mut targets = Vec::new();
    let mut used = vec![false; source.columns.len()];
    for (name, column) in columns {
        if column.generated {
            continue;
        }
        match source.columns.iter().position(|c| c == name) {
            Some(i) => {
                used[i] = true;
                targets.push((column, Source::Column(i)));
            }
            None if name == "rowid" && column.identity_always => {
                targets.push((column, Source::RowId))
            }
            None => {
                return Err(PgError::ExportMismatch {
                    table: table.to_owned(),
                    detail: format!(
                        "the workspace's table has no column {name}; export with a plugd of the same version as the cluster"
                    ),
                });
            }
        }
    }
    if let Some(i) = used.iter().position(|u| !u) {
        return Err(PgError::ExportMismatch {
            table: table.to_owned(),
            detail: format!(
                "the cluster's table has no column {}; upgrade plugd",
                source.columns[i]
            ),
        });
    }
    Ok(targets)
}

/// The kinds of column the logical schema uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Float,
    Bytes,
    Bool,
    Text,
    /// A type the export does not know: refused.
    Other,
}

fn kind(c: &Column) -> Kind {
    match c.data_type.as_str() {
        "bigint" | "integer" | "smallint" => Kind::Int,
        "double precision" | "real" => Kind::Float,
        "bytea" => Kind::Bytes,
        "boolean" => Kind::Bool,
        "text" => Kind::Text,
        _ => Kind::Other,
    }
}

/// The parameter type of a column.
fn pg_type(c: &Column) -> Type {
    match kind(c) {
        Kind::Int => Type::INT8,
        Kind::Float => Type::FLOAT8,
        Kind::Bytes => Type::BYTEA,
        Kind::Bool => Type::BOOL,
        Kind::Text | Kind::Other => Type::TEXT,
    }
}

/// One value as the parameter its column takes.
fn convert(
    table: &str,
    column: &Column,
    source: Source,
    row: &DumpRow,
) -> Result<Box<dyn ToSql + Sync + Send>, PgError> {
    let value = match source {
        Source::RowId => match row.rowid {
            Some(id) => DumpValue::Integer(id),
            None => DumpValue::Null,
        },
        Source::Column(i) => row.values[i].clone(),
    };
    Ok(match (kind(column), value) {
        (Kind::Int, DumpValue::Null) => Box::new(None::<i64>),
        (Kind::Int, DumpValue::Integer(v)) => Box::new(Some(v)),
        (Kind::Float, DumpValue::Null) => Box::new(None::<f64>),
        (Kind::Float, DumpValue::Real(v)) => Box::new(Some(v)),
        (Kind::Float, DumpValue::Integer(v)) => Box::new(Some(v as f64)),
        (Kind::Bytes, DumpValue::Null) => Box::new(None::<Vec<u8>>),
        (Kind::Bytes, DumpValue::Blob(v)) => Box::new(Some(v)),
        (Kind::Bool, DumpValue::Null) => Box::new(None::<bool>),
        (Kind::Bool, DumpValue::Integer(v)) => Box::new(Some(v != 0)),
        (Kind::Text, DumpValue::Null) => Box::new(None::<String>),
        (Kind::Text, DumpValue::Text(v)) => Box::new(Some(v)),
        (_, v) => {
            return Err(PgError::ExportMismatch {
                table: table.to_owned(),
                detail: format!(
                    "column {} ({}) cannot hold {v:?}",
                    column.name, column.data_type
                ),
            });
        }
    })
}

/// An SQL identifier in double quotes.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(table: &str, parent: &str) -> ForeignKey {
        ForeignKey {
            table: table.into(),
            column: "p".into(),
            parent: parent.into(),
            parent_column: "id".into(),
        }
    }

    #[test]
    fn parents_are_filled_before_children() {
        let tables = vec!["b".to_owned(), "a".to_owned(), "c".to_owned()];
        let keys = [key("a", "c"), key("c", "b"), key("c", "c")];
        assert_eq!(fill_order(tables, &keys), ["b", "c", "a"]);
    }

    #[test]
    fn self_references_put_parent_rows_first() {
        let row = |id: &str, p: Option<&str>| DumpRow {
            rowid: None,
            values: vec![
                DumpValue::Text(id.into()),
                p.map_or(DumpValue::Null, |p| DumpValue::Text(p.into())),
            ],
        };
        let table = TableDump {
            table: "chains".into(),
            columns: vec!["id".into(), "p".into()],
            rows: vec![
                row("c3", Some("c2")),
                row("c2", Some("c1")),
                row("c1", None),
            ],
        };
        let order: Vec<&DumpValue> = parents_first(&table, "p", "id")
            .iter()
            .map(|r| &r.values[0])
            .collect();
        assert_eq!(
            order,
            [
                &DumpValue::Text("c1".into()),
                &DumpValue::Text("c2".into()),
                &DumpValue::Text("c3".into())
            ]
        );
    }
}
