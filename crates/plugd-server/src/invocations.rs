//! Invocation records over HTTP: `GET /v1/invocations` (filters `plugin`,
//! `tool`, `status`, `since`, `until`, `org`, `project`, `caller` (exact);
//! `q`, a case-insensitive substring of the invocation id, tool, plugin id,
//! caller or error code; `order=desc` (default, newest first) or `asc`
//! (oldest first); `limit` up to 500, default 50; `cursor` from the previous
//! page's `next_cursor`, in either order) answers `{"invocations": [...],
//! "next_cursor": ...}`, and `GET /v1/invocations/{id}` one record. Viewer
//! and up. `GET /v1/invocations/stats` is [`crate::invocation_stats`].
//!
//! **Tenancy**: a token bound to an org sees only its org's records (and,
//! limited to projects, those of no project or of its projects): the
//! listing is filtered so, and another org's record answers 404 like an
//! unknown one.
//!
//! Errors: a bad query (unknown parameter, status, time or cursor) → 400
//! `bad_request`; no such record → 404 `unknown_invocation`.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Json, Router};
use plugd_control::invocations::{
    Cursor, InvocationFilter, InvocationPage, InvocationRecord, Order, TerminalStatus,
    parse_rfc3339_ms,
};
use plugd_store::tokens::Tenancy;

use crate::auth::Identity;
use crate::error::code;
use crate::{ApiError, AppState};

/// Records on a page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 50;

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/invocations", get(list))
        // A static segment wins over `{id}` (record ids are `inv_…`).
        .route("/v1/invocations/stats", get(crate::invocation_stats::stats))
        .route("/v1/invocations/{id}", get(show))
}

/// The query of `GET /v1/invocations`.
#[derive(Debug, Default)]
pub struct ListQuery {
    /// The plugin id.
    pub plugin: Option<String>,
    /// The tool's plugd name or its export id.
    pub tool: Option<String>,
    /// `succeeded`, `failed`, `cancelled` or `retryable_failure`.
    pub status: Option<String>,
    /// Started at or after (RFC 3339 UTC, or a date).
    pub since: Option<String>,
    /// Started before (RFC 3339 UTC, or a date).
    pub until: Option<String>,
    /// Tenant scope.
    pub org: Option<String>,
    /// Project scope.
    pub project: Option<String>,
    /// Who called, exactly.
    pub caller: Option<String>,
    /// A case-insensitive substring of id, tool, plugin, caller, error code.
    pub q: Option<String>,
    /// `desc` (newest first, the default) or `asc`.
    pub order: Option<String>,
    /// Page size, 1 to 500.
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

pub(crate) fn bad(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code::BAD_REQUEST, message)
}

impl ListQuery {
    /// Reads `a=b&c=d` (percent-encoded); an unknown or repeated name, or a
    /// `limit` that is not a number, is a 400.
    pub fn parse(query: &str) -> Result<ListQuery, ApiError> {
        let mut q = ListQuery::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k)?, decode(v)?);
            let slot = match k.as_str() {
                "plugin" => &mut q.plugin,
                "tool" => &mut q.tool,
                "status" => &mut q.status,
                "since" => &mut q.since,
                "until" => &mut q.until,
                "org" => &mut q.org,
                "project" => &mut q.project,
                "caller" => &mut q.caller,
                "q" => &mut q.q,
                "order" => &mut q.order,
                "cursor" => &mut q.cursor,
                "limit" => {
                    q.limit =
                        Some(v.parse().map_err(|_| {
                            bad(format!("limit={v:?} is not a number; use 1 to 500"))
                        })?);
                    continue;
                }
                other => {
                    return Err(bad(format!(
                        "unknown query parameter {other:?}; the parameters are plugin, tool, status, since, until, org, project, caller, q, order, limit and cursor"
                    )));
                }
            };
            if slot.replace(v).is_some() {
                return Err(bad(format!("query parameter {k:?} is given twice")));
            }
        }
        Ok(q)
    }

    /// The store filter this query asks for.
    pub fn filter(self) -> Result<InvocationFilter, ApiError> {
        let order = match self.order.as_deref() {
            None | Some("desc") => Order::NewestFirst,
            Some("asc") => Order::OldestFirst,
            Some(o) => {
                return Err(bad(format!(
                    "order={o:?}: use desc (newest first, the default) or asc (oldest first)"
                )));
            }
        };
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=plugd_control::invocations::MAX_PAGE).contains(&limit) {
            return Err(bad(format!(
                "limit={limit} is out of range; use 1 to {}",
                plugd_control::invocations::MAX_PAGE
            )));
        }
        Ok(InvocationFilter {
            org_id: self.org,
            project_id: self.project,
            project_in: None,
            plugin_id: self.plugin,
            tool: self.tool,
            status: self
                .status
                .map(|s| s.parse::<TerminalStatus>())
                .transpose()
                .map_err(bad)?,
            since_ms: time("since", self.since)?,
            until_ms: time("until", self.until)?,
            caller: self.caller,
            q: self.q.filter(|q| !q.is_empty()),
            order,
            limit,
            cursor: self
                .cursor
                .map(|c| Cursor::decode(&c))
                .transpose()
                .map_err(|e| bad(e.to_string()))?,
        })
    }
}

/// `v` of parameter `name` as ms since the epoch: RFC 3339 UTC or a date.
pub(crate) fn time(name: &str, v: Option<String>) -> Result<Option<i64>, ApiError> {
    v.map(|s| {
        parse_rfc3339_ms(&s).ok_or_else(|| {
            bad(format!(
                "{name}={s:?} is not a time; write RFC 3339 UTC (2026-03-12T20:00:00Z) or a date (2026-03-12)"
            ))
        })
    })
    .transpose()
}

/// Percent-decodes one query component (`+` is a space).
pub(crate) fn decode(s: &str) -> Result<String, ApiError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| bad(format!("{s:?} has a bad percent escape")))?;
                out.push(hex);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| bad(format!("{s:?} is not UTF-8 once decoded")))
}

/// `f` narrowed to what a caller bound to `t` sees; `None` when it can see
/// nothing of what `f` asks (another org, another project).
pub fn within_tenancy(mut f: InvocationFilter, t: Option<&Tenancy>) -> Option<InvocationFilter> {
    let Some(t) = t else { return Some(f) };
    if f.org_id.as_ref().is_some_and(|o| *o != t.org_id) {
        return None;
    }
    f.org_id = Some(t.org_id.clone());
    if !t.project_ids.is_empty() {
        if f.project_id
            .as_ref()
            .is_some_and(|p| !t.project_ids.contains(p))
        {
            return None;
        }
        f.project_in = Some(t.project_ids.clone());
    }
    Some(f)
}

/// Whether a caller bound to `t` sees record `r`.
pub fn sees(t: Option<&Tenancy>, r: &InvocationRecord) -> bool {
    t.is_none_or(|t| {
        r.org_id.as_deref() == Some(t.org_id.as_str())
            && (t.project_ids.is_empty()
                || r.project_id
                    .as_ref()
                    .is_none_or(|p| t.project_ids.contains(p)))
    })
}

async fn list(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    RawQuery(query): RawQuery,
) -> Result<Json<InvocationPage>, ApiError> {
    let filter = ListQuery::parse(query.as_deref().unwrap_or(""))?.filter()?;
    let Some(filter) = within_tenancy(filter, who.tenant.as_ref()) else {
        return Ok(Json(InvocationPage::from_rows(Vec::new(), 1)));
    };
    let store = state.runtime.state();
    Ok(Json(
        store
            .list_invocations(&filter)
            .await
            .map_err(crate::packages::store_error)?,
    ))
}

async fn show(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Result<Json<InvocationRecord>, ApiError> {
    let found = state
        .runtime
        .state()
        .invocation(&id)
        .await
        .map_err(crate::packages::store_error)?
        .filter(|r| sees(who.tenant.as_ref(), r));
    found.map(Json).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            code::UNKNOWN_INVOCATION,
            format!("no invocation {id:?}; GET /v1/invocations lists them"),
        )
    })
}

/// Appends the invocation counters to a Prometheus text page.
pub(crate) fn metrics(out: &mut String, stats: &plugd_runtime::invocations::InvocationStats) {
    use std::fmt::Write;
    let rows = stats.by_plugin();
    family(
        out,
        &rows,
        "plugd_invocations_total",
        "Tool invocations recorded, by plugin and terminal status.",
        |c| c.calls,
    );
    family(
        out,
        &rows,
        "plugd_invocation_duration_ms_sum",
        "Summed duration of recorded tool invocations in milliseconds.",
        |c| c.duration_ms,
    );
    family(
        out,
        &rows,
        "plugd_invocation_duration_ms_count",
        "Tool invocations counted in plugd_invocation_duration_ms_sum.",
        |c| c.calls,
    );
    let name = "plugd_invocation_records_unwritten_total";
    let _ = writeln!(
        out,
        "# HELP {name} Invocation records that could not be written to the state database.\n# TYPE {name} counter\n{name} {}",
        stats.unwritten()
    );
}

/// Rows per plugin and status of one counter family.
type Rows = [((String, TerminalStatus), plugd_runtime::invocations::Counts)];

fn family(
    out: &mut String,
    rows: &Rows,
    name: &str,
    help: &str,
    value: fn(&plugd_runtime::invocations::Counts) -> u64,
) {
    use std::fmt::Write;
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for ((plugin, status), counts) in rows {
        let _ = writeln!(
            out,
            "{name}{{plugin=\"{}\",status=\"{status}\"}} {}",
            crate::bus::label(plugin),
            value(counts)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_org_token_lists_and_reads_only_its_org() {
        let a = Tenancy {
            org_id: "a".into(),
            project_ids: vec![],
        };
        let a_p1 = Tenancy {
            org_id: "a".into(),
            project_ids: vec!["p1".into()],
        };
        let f = within_tenancy(InvocationFilter::default(), Some(&a)).unwrap();
        assert_eq!((f.org_id.as_deref(), f.project_in), (Some("a"), None));
        let other = InvocationFilter {
            org_id: Some("b".into()),
            ..InvocationFilter::default()
        };
        assert!(within_tenancy(other.clone(), Some(&a)).is_none());
        assert_eq!(within_tenancy(other.clone(), None), Some(other));
        let f = within_tenancy(InvocationFilter::default(), Some(&a_p1)).unwrap();
        assert_eq!(f.project_in, Some(vec!["p1".to_owned()]));
        let p2 = InvocationFilter {
            project_id: Some("p2".into()),
            ..InvocationFilter::default()
        };
        assert!(within_tenancy(p2, Some(&a_p1)).is_none());
        let rec = |org: Option<&str>, project: Option<&str>| {
            let mut r: InvocationRecord = serde_json::from_value(serde_json::json!({
                "invocation_id": "inv_1", "export_kind": "tool", "export_id": "e",
                "tool": "p/e", "plugin_id": "p", "dialect": "vai",
                "started_at": "2026-01-01T00:00:00.000Z", "ended_at": "2026-01-01T00:00:00.000Z",
                "started_ms": 0, "duration_ms": 0, "status": "succeeded", "retry_count": 0
            }))
            .unwrap();
            r.org_id = org.map(str::to_owned);
            r.project_id = project.map(str::to_owned);
            r
        };
        assert!(sees(Some(&a), &rec(Some("a"), Some("p9"))));
        assert!(!sees(Some(&a), &rec(Some("b"), None)));
        assert!(!sees(Some(&a), &rec(None, None)));
        assert!(sees(Some(&a_p1), &rec(Some("a"), None)));
        assert!(!sees(Some(&a_p1), &rec(Some("a"), Some("p2"))));
        assert!(sees(None, &rec(None, None)));
    }

    #[test]
    fn a_query_becomes_a_filter_or_a_400() {
        let q = ListQuery {
            status: Some("failed".into()),
            since: Some("2026-01-01".into()),
            limit: Some(10),
            ..ListQuery::default()
        };
        let f = q.filter().unwrap();
        assert_eq!(f.status, Some(TerminalStatus::Failed));
        assert_eq!(f.since_ms, Some(1_767_225_600_000));
        assert_eq!(f.limit, 10);
        assert_eq!(ListQuery::default().filter().unwrap().limit, DEFAULT_LIMIT);
        let q = ListQuery::parse("plugin=a%2Fb&tool=x+y&limit=3").unwrap();
        assert_eq!(q.plugin.as_deref(), Some("a/b"));
        assert_eq!(q.tool.as_deref(), Some("x y"));
        assert_eq!(q.limit, Some(3));
        for bad in ["nope=1", "limit=x", "plugin=a&plugin=b", "tool=%zz"] {
            assert!(ListQuery::parse(bad).is_err(), "{bad}");
        }
        let f = ListQuery::parse("q=Inv_&caller=token%3Aci&order=asc")
            .unwrap()
            .filter()
            .unwrap();
        assert_eq!(
            (f.q.as_deref(), f.caller.as_deref(), f.order),
            (Some("Inv_"), Some("token:ci"), Order::OldestFirst)
        );
        let f = ListQuery::parse("order=desc&q=").unwrap().filter().unwrap();
        assert_eq!((f.q, f.order), (None, Order::NewestFirst));
        assert!(ListQuery::parse("order=up").unwrap().filter().is_err());
        for q in [
            ListQuery {
                status: Some("ok".into()),
                ..ListQuery::default()
            },
            ListQuery {
                limit: Some(501),
                ..ListQuery::default()
            },
            ListQuery {
                limit: Some(0),
                ..ListQuery::default()
            },
            ListQuery {
                until: Some("tomorrow".into()),
                ..ListQuery::default()
            },
            ListQuery {
                cursor: Some("xyz".into()),
                ..ListQuery::default()
            },
        ] {
            let e = q.filter().unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }
}
