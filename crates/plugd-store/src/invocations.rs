//! Invocation records on SQLite: `plugd-control`'s [`InvocationStore`] for
//! [`Store`].
//!
//! One row per invocation id, as [`StoredInvocation`]: a column per field
//! that lists filter, search or chart on or that nearly every record has,
//! and `extra`, a JSON object of the rest (`NULL` for most records). A
//! typical record takes under 300 bytes with its indexes (1,071 as one JSON
//! document each before schema step 23; the test `size` below measures it).
//! The list order (`started_ms`), the plugin and the status have an index
//! ending in `started_ms` (a page is an index range scan; ties of one
//! millisecond are ordered by id after it); the rarer filters (tool, export,
//! org, project, caller) are checked along the time order, since every
//! index is one more B-tree written on every call (the writer thread's
//! share of `plugd bench`'s CPU went from 38 % to 33 % without three).
//! Appending is `INSERT OR IGNORE`, so writing a batch twice changes nothing.

use plugd_control::invocations::{
    InvocationFilter, InvocationPage, InvocationPoint, InvocationRecord, Order, StoredInvocation,
};
use rusqlite::{OptionalExtension, params_from_iter};

use crate::error::StoreError;
use crate::store::Store;

/// Schema step: invocation records.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE invocations (
        invocation_id TEXT PRIMARY KEY NOT NULL,
        started_ms    INTEGER NOT NULL,
        plugin_id     TEXT NOT NULL,
        tool          TEXT NOT NULL,
        export_id     TEXT NOT NULL,
        status        TEXT NOT NULL,
        org_id        TEXT,
        project_id    TEXT,
        record        TEXT NOT NULL
    ) STRICT;
    CREATE INDEX invocations_order ON invocations (started_ms, invocation_id);
    CREATE INDEX invocations_plugin ON invocations (plugin_id, started_ms, invocation_id);
    CREATE INDEX invocations_status ON invocations (status, started_ms, invocation_id);
";

/// Schema step 23: the records as [`StoredInvocation`]'s columns. A record
/// of the old table keeps its document, less the fields now in columns, as
/// its `extra` (it reads back as it was).
pub(crate) const COMPACT_MIGRATION: &str = "
    CREATE TABLE invocation_records (
        invocation_id TEXT PRIMARY KEY NOT NULL,
        started_ms    INTEGER NOT NULL,
        duration_ms   INTEGER NOT NULL,
        status        TEXT NOT NULL,
        plugin_id     TEXT NOT NULL,
        tool          TEXT NOT NULL,
        export_id     TEXT NOT NULL,
        dialect       TEXT NOT NULL,
        caller        TEXT,
        surface       TEXT,
        trace_id      TEXT,
        error_code    TEXT,
        org_id        TEXT,
        project_id    TEXT,
        extra         TEXT
    ) STRICT;
    INSERT INTO invocation_records
    SELECT invocation_id, started_ms, coalesce(json_extract(record, '$.duration_ms'), 0), status,
           plugin_id, tool, export_id, coalesce(json_extract(record, '$.dialect'), ''),
           json_extract(record, '$.caller'), json_extract(record, '$.surface'),
           json_extract(record, '$.trace_id'), json_extract(record, '$.error_code'),
           org_id, project_id,
           json_remove(record, '$.invocation_id', '$.started_ms', '$.duration_ms', '$.status',
                       '$.plugin_id', '$.tool', '$.export_id', '$.dialect', '$.caller',
                       '$.surface', '$.trace_id', '$.error_code', '$.org_id', '$.project_id')
    FROM invocations ORDER BY started_ms, invocation_id;
    DROP TABLE invocations;
    ALTER TABLE invocation_records RENAME TO invocations;
    CREATE INDEX invocations_order ON invocations (started_ms);
    CREATE INDEX invocations_plugin ON invocations (plugin_id, started_ms);
    CREATE INDEX invocations_status ON invocations (status, started_ms);
";

/// The columns a record is read from, in [`row`]'s order.
pub(crate) const COLUMNS: &str = "invocation_id, started_ms, duration_ms, status, plugin_id, tool,
    export_id, dialect, caller, surface, trace_id, error_code, org_id, project_id, extra";

/// A row of [`COLUMNS`].
fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredInvocation> {
    Ok(StoredInvocation {
        invocation_id: r.get(0)?,
        started_ms: r.get(1)?,
        duration_ms: r.get(2)?,
        status: r.get(3)?,
        plugin_id: r.get(4)?,
        tool: r.get(5)?,
        export_id: r.get(6)?,
        dialect: r.get(7)?,
        caller: r.get(8)?,
        surface: r.get(9)?,
        trace_id: r.get(10)?,
        error_code: r.get(11)?,
        org_id: r.get(12)?,
        project_id: r.get(13)?,
        extra: r.get(14)?,
    })
}

/// Appends `records` (`INSERT OR IGNORE`: a record stored already stays).
pub(crate) fn insert(
    tx: &rusqlite::Transaction<'_>,
    records: &[StoredInvocation],
) -> rusqlite::Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let mut st = tx.prepare_cached(&format!(
        "INSERT OR IGNORE INTO invocations ({COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
    ))?;
    for r in records {
        st.execute(rusqlite::params![
            r.invocation_id,
            r.started_ms,
            r.duration_ms,
            r.status,
            r.plugin_id,
            r.tool,
            r.export_id,
            r.dialect,
            r.caller,
            r.surface,
            r.trace_id,
            r.error_code,
            r.org_id,
            r.project_id,
            r.extra
        ])?;
    }
    Ok(())
}

/// The `WHERE` condition of every filter of `f` but its cursor (its
/// parameters appended to `args`).
fn where_clause(f: &InvocationFilter, args: &mut Vec<rusqlite::types::Value>) -> String {
    let mut sql = String::from("1");
    let mut text = |sql: &mut String, column: &str, v: &Option<String>| {
        if let Some(v) = v {
            args.push(v.clone().into());
            sql.push_str(&format!(" AND {column} = ?{}", args.len()));
        }
    };
    text(&mut sql, "org_id", &f.org_id);
    text(&mut sql, "project_id", &f.project_id);
    text(&mut sql, "plugin_id", &f.plugin_id);
    text(&mut sql, "status", &f.status.map(|s| s.as_str().to_owned()));
    text(&mut sql, "caller", &f.caller);
    if let Some(projects) = &f.project_in {
        let mut marks = Vec::new();
        for p in projects {
            args.push(p.clone().into());
            marks.push(format!("?{}", args.len()));
        }
        sql.push_str(&format!(
            " AND (project_id IS NULL OR project_id IN ({}))",
            if marks.is_empty() {
                "NULL".to_owned()
            } else {
                marks.join(", ")
            }
        ));
    }
    if let Some(tool) = &f.tool {
        args.push(tool.clone().into());
        let n = args.len();
        sql.push_str(&format!(" AND (tool = ?{n} OR export_id = ?{n})"));
    }
    if let Some(q) = f.q.as_deref().filter(|q| !q.is_empty()) {
        // SQLite's `lower` folds ASCII letters only: so does the needle.
        args.push(q.to_ascii_lowercase().into());
        let n = args.len();
        sql.push_str(&format!(
            " AND (instr(lower(invocation_id), ?{n}) OR instr(lower(tool), ?{n})
                   OR instr(lower(plugin_id), ?{n})
                   OR instr(lower(coalesce(caller, '')), ?{n})
                   OR instr(lower(coalesce(error_code, '')), ?{n}))"
        ));
    }
    if let Some(since) = f.since_ms {
        args.push(since.into());
        sql.push_str(&format!(" AND started_ms >= ?{}", args.len()));
    }
    if let Some(until) = f.until_ms {
        args.push(until.into());
        sql.push_str(&format!(" AND started_ms < ?{}", args.len()));
    }
    sql
}

impl Store {
    /// Another connection to the same database file (an in-memory store
    /// has none: `None`), for a writer thread that must not queue behind
    /// the requests on this one.
    pub fn second_connection(&self) -> Result<Option<Store>, StoreError> {
        match self.path().and_then(|p| p.parent()) {
            Some(dir) => Store::open(dir).map(Some),
            None => Ok(None),
        }
    }

    fn decode_invocation(&self, row: StoredInvocation) -> Result<InvocationRecord, StoreError> {
        let id = row.invocation_id.clone();
        row.into_record().map_err(|detail| StoreError::Damaged {
            db: self.label().to_owned(),
            what: format!("invocation {id}"),
            detail,
        })
    }
}

impl Store {
    pub fn append_invocations(&self, batch: &[InvocationRecord]) -> Result<(), StoreError> {
        crate::journal::write(&mut self.lock(), self.label(), &[], batch)
    }

    pub fn invocation(&self, invocation_id: &str) -> Result<Option<InvocationRecord>, StoreError> {
        let found = self
            .lock()
            .query_row(
                &format!("SELECT {COLUMNS} FROM invocations WHERE invocation_id = ?1"),
                [invocation_id],
                row,
            )
            .optional()
            .map_err(|e| self.query_error(format!("read invocation {invocation_id:?}"), e))?;
        found.map(|r| self.decode_invocation(r)).transpose()
    }

    pub fn list_invocations(&self, f: &InvocationFilter) -> Result<InvocationPage, StoreError> {
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        let mut sql = format!(
            "SELECT {COLUMNS} FROM invocations WHERE {}",
            where_clause(f, &mut args)
        );
        let (cmp, dir) = match f.order {
            Order::NewestFirst => ("<", "DESC"),
            Order::OldestFirst => (">", "ASC"),
        };
        if let Some(c) = &f.cursor {
            args.push(c.started_ms.into());
            args.push(c.invocation_id.clone().into());
            sql.push_str(&format!(
                " AND (started_ms, invocation_id) {cmp} (?{}, ?{})",
                args.len() - 1,
                args.len()
            ));
        }
        let page = f.page_size();
        args.push((page as i64 + 1).into());
        sql.push_str(&format!(
            " ORDER BY started_ms {dir}, invocation_id {dir} LIMIT ?{}",
            args.len()
        ));
        let rows = {
            let conn = self.lock();
            conn.prepare_cached(&sql)
                .and_then(|mut st| {
                    st.query_map(params_from_iter(args.iter()), row)?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| self.query_error("list invocations".to_owned(), e))?
        };
        let records = rows
            .into_iter()
            .map(|r| self.decode_invocation(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InvocationPage::from_rows(records, page))
    }

    /// The points of the records `f` matches (its cursor, order and limit
    /// aside), newest first, at most `max`.
    pub fn invocation_points(
        &self,
        f: &InvocationFilter,
        max: usize,
    ) -> Result<Vec<InvocationPoint>, StoreError> {
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        let mut sql = format!(
            "SELECT started_ms, duration_ms, status, plugin_id, tool
             FROM invocations WHERE {}",
            where_clause(f, &mut args)
        );
        args.push(i64::try_from(max).unwrap_or(i64::MAX).into());
        sql.push_str(&format!(
            " ORDER BY started_ms DESC, invocation_id DESC LIMIT ?{}",
            args.len()
        ));
        type Raw = (i64, Option<i64>, String, String, String);
        let rows: Vec<Raw> = {
            let conn = self.lock();
            conn.prepare_cached(&sql)
                .and_then(|mut st| {
                    st.query_map(params_from_iter(args.iter()), |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| self.query_error("read invocation points".to_owned(), e))?
        };
        rows.into_iter()
            .map(|(started_ms, duration, status, plugin_id, tool)| {
                Ok(InvocationPoint {
                    started_ms,
                    duration_ms: u64::try_from(duration.unwrap_or(0)).unwrap_or(0),
                    status: status.parse().map_err(|detail| StoreError::Damaged {
                        db: self.label().to_owned(),
                        what: format!("an invocation of {plugin_id} at {started_ms}"),
                        detail,
                    })?,
                    plugin_id,
                    tool,
                })
            })
            .collect()
    }

    pub fn delete_invocations_before(&self, before_ms: i64) -> Result<u64, StoreError> {
        let n = self
            .lock()
            .execute("DELETE FROM invocations WHERE started_ms < ?1", [before_ms])
            .map_err(|e| self.query_error("delete old invocations".to_owned(), e))?;
        Ok(n as u64)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use plugd_control::invocations::TerminalStatus;

    use super::*;

    /// A record `inv_NNNN` of `plugin` started at `ms` (also the journal's tests').
    pub(crate) use plugd_control::samples::invocation as rec;

    #[test]
    fn a_second_connection_sees_the_same_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join(".plugd")).unwrap();
        let writer = store.second_connection().unwrap().unwrap();
        writer
            .append_invocations(&[rec(1, 5, "p", TerminalStatus::Cancelled)])
            .unwrap();
        assert_eq!(
            store.invocation("inv_0001").unwrap().unwrap().status,
            TerminalStatus::Cancelled
        );
        assert!(
            Store::open_in_memory()
                .unwrap()
                .second_connection()
                .unwrap()
                .is_none()
        );
    }
}

#[cfg(test)]
mod size {
    use plugd_control::samples::typical_invocation as typical;

    use crate::store::Store;

    fn used_bytes(store: &Store) -> i64 {
        let conn = store.lock();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let q = |p: &str| -> i64 { conn.pragma_query_value(None, p, |r| r.get(0)).unwrap() };
        (q("page_count") - q("freelist_count")) * q("page_size")
    }

    #[test]
    fn a_typical_record_takes_at_most_300_bytes_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join(".plugd")).unwrap();
        let before = used_bytes(&store);
        const N: u64 = 20_000;
        for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
            let batch: Vec<_> = chunk.iter().map(|&n| typical(n)).collect();
            store.append_invocations(&batch).unwrap();
        }
        let per = (used_bytes(&store) - before) / N as i64;
        assert!(per <= 300, "{per} bytes per record");
        assert_eq!(
            store
                .invocation(&typical(77).invocation_id)
                .unwrap()
                .unwrap(),
            typical(77)
        );
    }
}
