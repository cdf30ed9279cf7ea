//! The logical shape of the SQLite schema (`Store::schema_shape`), in the
//! canonical text form plugd-store-pg's snapshot test compares with
//! PostgreSQL's (`crates/plugd-store-pg/tests/it/schema-shape.txt`).
//!
//! One line per fact, each naming its table:
//! `TABLE: column NAME TYPE null|not null`, `TABLE: primary key (A, B)`,
//! `TABLE: unique (A)` (`unique partial (A)` for a partial unique index).
//! Types are the declared STRICT types lower-cased (`text`, `integer`,
//! `real`, `blob`); anything else is written `other(TYPE)`. A primary-key
//! column is `not null` (SQLite's rowid alias can never hold NULL).
//!
//! Left out (internal to this backend): `sqlite_*` tables, FTS5 virtual
//! tables and their shadow tables (`memories_fts`, `memories_fts_*`), and
//! the `plugd_workspace` identity table.

use rusqlite::Connection;

use crate::{Store, StoreError};

impl Store {
    /// The schema's logical shape, one line per fact, sorted.
    pub fn schema_shape(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        shape(&conn).map_err(|e| self.query_error("read the schema shape".to_owned(), e))
    }
}

fn shape(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    // The same tables `plugd state export` copies.
    let tables = crate::dump::logical_tables(conn)?;
    let mut lines = Vec::new();
    for (table, _) in &tables {
        // (name, type, notnull, pk position)
        let columns: Vec<(String, String, bool, i64)> = conn
            .prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1)")?
            .query_map([table], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<Result<_, _>>()?;
        let mut pk: Vec<(i64, &str)> = Vec::new();
        for (name, ty, not_null, pk_pos) in &columns {
            let ty = match ty.to_ascii_uppercase().as_str() {
                "TEXT" => "text".to_owned(),
                "INTEGER" => "integer".to_owned(),
                "REAL" => "real".to_owned(),
                "BLOB" => "blob".to_owned(),
                other => format!("other({other})"),
            };
            let null = if *not_null || *pk_pos > 0 {
                "not null"
            } else {
                "null"
            };
            lines.push(format!("{table}: column {name} {ty} {null}"));
            if *pk_pos > 0 {
                pk.push((*pk_pos, name));
            }
        }
        if !pk.is_empty() {
            pk.sort();
            let cols: Vec<&str> = pk.iter().map(|(_, n)| *n).collect();
            lines.push(format!("{table}: primary key ({})", cols.join(", ")));
        }
        // (name, unique, origin, partial)
        let indexes: Vec<(String, bool, String, bool)> = conn
            .prepare("SELECT name, \"unique\", origin, partial FROM pragma_index_list(?1)")?
            .query_map([table], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<Result<_, _>>()?;
        for (index, unique, origin, partial) in indexes {
            if !unique || origin == "pk" {
                continue;
            }
            let cols: Vec<String> = conn
                .prepare("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")?
                .query_map([&index], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            let kind = if partial { "unique partial" } else { "unique" };
            lines.push(format!("{table}: {kind} ({})", cols.join(", ")));
        }
    }
    lines.sort();
    Ok(lines)
}
