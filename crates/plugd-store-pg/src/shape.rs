//! The logical shape of the PostgreSQL schema, in the canonical text form
//! `plugd-store`'s `schema_shape` gives SQLite's, for the snapshot test.
//!
//! One line per fact, each naming its table:
//! `TABLE: column NAME TYPE null|not null`, `TABLE: primary key (A, B)`,
//! `TABLE: unique (A)` (`unique partial (A)` for a partial unique index).
//! Logical types: `text`, `integer`, `real`, `blob`, `bool`, `json`; anything
//! else is written as `other(PG_TYPE)` so a mismatch shows it. A primary-key
//! column is `not null`.
//!
//! Left out (internal to this backend): the tables `plugd_schema` and
//! `plugd_cluster` (the cluster record, `cluster.rs`), the
//! `plugd_workspace` identity table, `tsvector` columns (the full-text
//! index of `memories`, which SQLite keeps in FTS5 shadow tables), and
//! identity columns named `rowid` (SQLite's implicit row id made explicit).

use crate::cluster::INTERNAL_TABLES;
use crate::{PgError, PgStore};

impl PgStore {
    /// The schema's logical shape, one line per fact, sorted.
    pub async fn schema_shape(&self) -> Result<Vec<String>, PgError> {
        let client = self.client().await?;
        let mut lines = Vec::new();
        let columns = client
            .query(
                "SELECT c.table_name::text, c.column_name::text, c.data_type::text,
                        c.is_nullable = 'YES', c.is_identity = 'YES'
                 FROM information_schema.columns c
                 JOIN information_schema.tables t
                   ON t.table_schema = c.table_schema AND t.table_name = c.table_name
                 WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'",
                &[],
            )
            .await
            .map_err(|e| self.query_error("read the columns", e))?;
        for row in columns {
            let (table, column, ty, nullable, identity): (String, String, String, bool, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            if INTERNAL_TABLES.contains(&table.as_str())
                || ty == "tsvector"
                || (identity && column == "rowid")
            {
                continue;
            }
            let ty = match ty.as_str() {
                "text" => "text".to_owned(),
                "bigint" | "integer" | "smallint" => "integer".to_owned(),
                "double precision" | "real" => "real".to_owned(),
                "bytea" => "blob".to_owned(),
                "boolean" => "bool".to_owned(),
                "json" | "jsonb" => "json".to_owned(),
                other => format!("other({other})"),
            };
            let null = if nullable { "null" } else { "not null" };
            lines.push(format!("{table}: column {column} {ty} {null}"));
        }
        let indexes = client
            .query(
                "SELECT t.relname::text, i.indisprimary, i.indpred IS NOT NULL,
                        array_agg(a.attname::text ORDER BY k.ord)
                 FROM pg_index i
                 JOIN pg_class t ON t.oid = i.indrelid
                 JOIN pg_namespace n ON n.oid = t.relnamespace
                 CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                 JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
                 WHERE n.nspname = current_schema() AND i.indisunique
                 GROUP BY i.indexrelid, t.relname, i.indisprimary, i.indpred IS NOT NULL",
                &[],
            )
            .await
            .map_err(|e| self.query_error("read the unique indexes", e))?;
        for row in indexes {
            let (table, primary, partial, cols): (String, bool, bool, Vec<String>) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if INTERNAL_TABLES.contains(&table.as_str()) {
                continue;
            }
            let kind = match (primary, partial) {
                (true, _) => "primary key",
                (false, false) => "unique",
                (false, true) => "unique partial",
            };
            lines.push(format!("{table}: {kind} ({})", cols.join(", ")));
        }
        lines.sort();
        Ok(lines)
    }

    /// Runs `sql` with one text parameter `$1` and returns its first
    /// column of the first row as a `bigint`: tests' view of raw rows.
    pub async fn test_count(&self, sql: &str, param: &str) -> Result<i64, PgError> {
        let client = self.client().await?;
        let row = client
            .query_one(sql, &[&param])
            .await
            .map_err(|e| self.query_error(format!("run test query {sql:?}"), e))?;
        Ok(row.get(0))
    }

    /// Runs `sql` (statements without parameters): tests' way to damage
    /// or prepare a database.
    pub async fn test_execute(&self, sql: &str) -> Result<(), PgError> {
        let client = self.client().await?;
        client
            .batch_execute(sql)
            .await
            .map_err(|e| self.query_error(format!("run test statements {sql:?}"), e))
    }

    /// A server setting (`current_setting(name)`), e.g. `listen_addresses`.
    pub async fn setting(&self, name: &str) -> Result<String, PgError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT current_setting($1)", &[&name])
            .await
            .map_err(|e| self.query_error(format!("read setting {name:?}"), e))?;
        Ok(row.get(0))
    }

    /// Text columns whose collation is not `"C"` (the type-mapping rule in
    /// [`migrations`](crate::migrations)), as `table.column collation`.
    pub async fn non_c_text_columns(&self) -> Result<Vec<String>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT table_name::text || '.' || column_name::text || ' '
                        || COALESCE(collation_name::text, 'default')
                 FROM information_schema.columns
                 WHERE table_schema = current_schema() AND data_type = 'text'
                   AND table_name <> ALL($1)
                   AND COALESCE(collation_name::text, '') <> 'C'
                 ORDER BY 1",
                &[&INTERNAL_TABLES],
            )
            .await
            .map_err(|e| self.query_error("read the text columns' collations", e))?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }
}
