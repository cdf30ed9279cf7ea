//! Invocation records on PostgreSQL (`plugd-control`'s `InvocationStore`
//! operations): the same columns as `plugd-store`'s `invocations.rs`
//! (`plugd-control`'s `StoredInvocation`: a column per common field and
//! `extra`, a JSON object of the rare ones). Appending a batch is one
//! `INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING`, so writing a
//! batch twice changes nothing.

use deadpool_postgres::GenericClient;
use plugd_control::invocations::{
    InvocationFilter, InvocationPage, InvocationPoint, InvocationRecord, Order, StoredInvocation,
};
use tokio_postgres::types::ToSql;

use crate::{PgError, PgStore};

impl PgStore {
    fn decode_invocation(&self, r: &tokio_postgres::Row) -> Result<InvocationRecord, PgError> {
        let row = StoredInvocation {
            invocation_id: r.get(0),
            started_ms: r.get(1),
            duration_ms: r.get(2),
            status: r.get(3),
            plugin_id: r.get(4),
            tool: r.get(5),
            export_id: r.get(6),
            dialect: r.get(7),
            caller: r.get(8),
            surface: r.get(9),
            trace_id: r.get(10),
            error_code: r.get(11),
            org_id: r.get(12),
            project_id: r.get(13),
            extra: r.get(14),
        };
        let id = row.invocation_id.clone();
        row.into_record().map_err(|detail| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("invocation {id}"),
            detail,
        })
    }

    /// Appends `batch` (records already stored are left as they are).
    pub async fn append_invocations(&self, batch: &[InvocationRecord]) -> Result<(), PgError> {
        let stored = self.stored_invocations(batch)?;
        let client = self.client().await?;
        insert_invocations(&client, &stored)
            .await
            .map_err(|e| self.query_error(format!("record {} invocations", batch.len()), e))
    }

    /// Each record of `batch` as stored.
    pub(crate) fn stored_invocations(
        &self,
        batch: &[InvocationRecord],
    ) -> Result<Vec<StoredInvocation>, PgError> {
        batch
            .iter()
            .map(|r| {
                StoredInvocation::from_record(r).map_err(|e| PgError::Damaged {
                    db: self.label().to_owned(),
                    what: format!("invocation {}", r.invocation_id),
                    detail: format!("cannot encode its record: {e}"),
                })
            })
            .collect()
    }

    /// The record of `invocation_id`.
    pub async fn invocation(
        &self,
        invocation_id: &str,
    ) -> Result<Option<InvocationRecord>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM invocations WHERE invocation_id = $1"),
                &[&invocation_id],
            )
            .await
            .map_err(|e| self.query_error(format!("read invocation {invocation_id:?}"), e))?;
        row.map(|r| self.decode_invocation(&r)).transpose()
    }

    /// One page of records matching `f`, in its order.
    pub async fn list_invocations(&self, f: &InvocationFilter) -> Result<InvocationPage, PgError> {
        let mut q = Query::new(&format!("SELECT {COLUMNS} FROM invocations WHERE true"));
        q.filters(f);
        let (cmp, dir) = match f.order {
            Order::NewestFirst => ("<", "DESC"),
            Order::OldestFirst => (">", "ASC"),
        };
        if let Some(c) = &f.cursor {
            q.push(
                &format!(" AND (started_ms, invocation_id) {cmp} ($?"),
                Box::new(c.started_ms),
            );
            q.push(", $?::text)", Box::new(c.invocation_id.clone()));
        }
        let page = f.page_size();
        q.push(
            &format!(" ORDER BY started_ms {dir}, invocation_id {dir} LIMIT $?"),
            Box::new(page as i64 + 1),
        );
        let client = self.client().await?;
        let rows = client
            .query(&q.sql, &q.params())
            .await
            .map_err(|e| self.query_error("list invocations", e))?;
        let records = rows
            .iter()
            .map(|r| self.decode_invocation(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InvocationPage::from_rows(records, page))
    }

    /// The points of the records `f` matches (its cursor, order and limit
    /// aside), newest first, at most `max`.
    pub async fn invocation_points(
        &self,
        f: &InvocationFilter,
        max: usize,
    ) -> Result<Vec<InvocationPoint>, PgError> {
        let mut q = Query::new(
            "SELECT started_ms, duration_ms, status, plugin_id, tool
             FROM invocations WHERE true",
        );
        q.filters(f);
        q.push(
            " ORDER BY started_ms DESC, invocation_id DESC LIMIT $?",
            Box::new(i64::try_from(max).unwrap_or(i64::MAX)),
        );
        let client = self.client().await?;
        let rows = client
            .query(&q.sql, &q.params())
            .await
            .map_err(|e| self.query_error("read invocation points", e))?;
        rows.iter()
            .map(|r| {
                let started_ms: i64 = r.get(0);
                let duration: Option<i64> = r.get(1);
                let status: String = r.get(2);
                let plugin_id: String = r.get(3);
                Ok(InvocationPoint {
                    started_ms,
                    duration_ms: u64::try_from(duration.unwrap_or(0)).unwrap_or(0),
                    status: status.parse().map_err(|detail| PgError::Damaged {
                        db: self.label().to_owned(),
                        what: format!("an invocation of {plugin_id} at {started_ms}"),
                        detail,
                    })?,
                    plugin_id,
                    tool: r.get(4),
                })
            })
            .collect()
    }

    /// Deletes the records started before `before_ms`; how many.
    pub async fn delete_invocations_before(&self, before_ms: i64) -> Result<u64, PgError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM invocations WHERE started_ms < $1",
                &[&before_ms],
            )
            .await
            .map_err(|e| self.query_error("delete old invocations", e))
    }
}

/// The columns a record is read from, in `decode_invocation`'s order.
const COLUMNS: &str = "invocation_id, started_ms, duration_ms, status, plugin_id, tool,
    export_id, dialect, caller, surface, trace_id, error_code, org_id, project_id, extra";

/// Inserts `batch` in one statement, cached per connection: every tool
/// call's record comes this way. Records already stored are left as they
/// are.
pub(crate) async fn insert_invocations(
    client: &impl GenericClient,
    batch: &[StoredInvocation],
) -> Result<(), tokio_postgres::Error> {
    if batch.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&StoredInvocation) -> &str| batch.iter().map(f).collect::<Vec<&str>>();
    let opt = |f: fn(&StoredInvocation) -> Option<&str>| {
        batch.iter().map(f).collect::<Vec<Option<&str>>>()
    };
    let int = |f: fn(&StoredInvocation) -> i64| batch.iter().map(f).collect::<Vec<i64>>();
    let stmt = client
        .prepare_cached(&format!(
            "INSERT INTO invocations ({COLUMNS})
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[],
                                  $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
                                  $11::text[], $12::text[], $13::text[], $14::text[], $15::text[])
             ON CONFLICT (invocation_id) DO NOTHING"
        ))
        .await?;
    client
        .execute(
            &stmt,
            &[
                &col(|r| &r.invocation_id),
                &int(|r| r.started_ms),
                &int(|r| r.duration_ms),
                &col(|r| &r.status),
                &col(|r| &r.plugin_id),
                &col(|r| &r.tool),
                &col(|r| &r.export_id),
                &col(|r| &r.dialect),
                &opt(|r| r.caller.as_deref()),
                &opt(|r| r.surface.as_deref()),
                &opt(|r| r.trace_id.as_deref()),
                &opt(|r| r.error_code.as_deref()),
                &opt(|r| r.org_id.as_deref()),
                &opt(|r| r.project_id.as_deref()),
                &opt(|r| r.extra.as_deref()),
            ],
        )
        .await?;
    Ok(())
}

/// A statement being built: its text, with each `$?` numbered as its
/// parameter is pushed.
struct Query {
    sql: String,
    args: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Query {
    fn new(head: &str) -> Query {
        Query {
            sql: head.to_owned(),
            args: Vec::new(),
        }
    }

    /// Appends `clause`, its `$?` standing for `v`.
    fn push(&mut self, clause: &str, v: Box<dyn ToSql + Sync + Send>) {
        self.args.push(v);
        self.sql
            .push_str(&clause.replace("$?", &format!("${}", self.args.len())));
    }

    /// Every filter of `f` but its cursor.
    fn filters(&mut self, f: &InvocationFilter) {
        for (column, value) in [
            ("org_id", &f.org_id),
            ("project_id", &f.project_id),
            ("plugin_id", &f.plugin_id),
            ("caller", &f.caller),
        ] {
            if let Some(v) = value {
                self.push(&format!(" AND {column} = $?"), Box::new(v.clone()));
            }
        }
        if let Some(status) = f.status {
            self.push(" AND status = $?", Box::new(status.as_str().to_owned()));
        }
        if let Some(projects) = &f.project_in {
            self.push(
                " AND (project_id IS NULL OR project_id = ANY($?::text[]))",
                Box::new(projects.clone()),
            );
        }
        if let Some(tool) = &f.tool {
            self.push(" AND $?::text IN (tool, export_id)", Box::new(tool.clone()));
        }
        if let Some(needle) = f.q.as_deref().filter(|q| !q.is_empty()) {
            // One parameter, every `$?` of the clause.
            self.push(
                " AND (strpos(lower(invocation_id), lower($?::text)) > 0
                       OR strpos(lower(tool), lower($?::text)) > 0
                       OR strpos(lower(plugin_id), lower($?::text)) > 0
                       OR strpos(lower(coalesce(caller, '')), lower($?::text)) > 0
                       OR strpos(lower(coalesce(error_code, '')), lower($?::text)) > 0)",
                Box::new(needle.to_owned()),
            );
        }
        if let Some(since) = f.since_ms {
            self.push(" AND started_ms >= $?", Box::new(since));
        }
        if let Some(until) = f.until_ms {
            self.push(" AND started_ms < $?", Box::new(until));
        }
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.args
            .iter()
            .map(|a| a.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}
