//! Invocation records: one per tool call of any dialect, with the fields
//! seed 003 lists under "Observability", and the [`InvocationStore`] trait
//! that keeps them.
//!
//! A record says who called what, in which scope, when, for how long and
//! how it ended ([`TerminalStatus`]); its [`InvocationRecord::payload`]
//! adds the error, the decisions taken on the call and, only when the
//! workspace asks for them, its arguments and result, masked (built by
//! plugd-runtime's `record_payload`).
//!
//! Listing is newest first (or oldest first, [`Order::OldestFirst`]),
//! ordered by start time then invocation id, and paged by an opaque
//! [`Cursor`]: a page starts strictly after the last row of the previous
//! one, so pages never repeat or skip a record, even while new ones arrive.
//!
//! [`InvocationStore::invocation_points`] reads a light projection of the
//! records ([`InvocationPoint`]: start, duration, status, plugin, tool) for
//! statistics computed by the caller (`GET /v1/invocations/stats`).

use crate::store::StoreError;
use std::fmt;

use serde::{Deserialize, Serialize};

/// How an invocation ended (seed 003 "Terminal Statuses").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalStatus {
    /// The export answered.
    Succeeded,
    /// The export (or a check before it) refused or failed; retrying the
    /// same call will fail the same way.
    Failed,
    /// The caller went away or cancelled before an answer.
    Cancelled,
    /// A timeout, a crash or an overload: the same call may succeed later.
    RetryableFailure,
}

impl TerminalStatus {
    /// Every status, in declaration order.
    pub const ALL: [TerminalStatus; 4] = [
        TerminalStatus::Succeeded,
        TerminalStatus::Failed,
        TerminalStatus::Cancelled,
        TerminalStatus::RetryableFailure,
    ];

    /// The wire name (`retryable_failure`).
    pub fn as_str(self) -> &'static str {
        match self {
            TerminalStatus::Succeeded => "succeeded",
            TerminalStatus::Failed => "failed",
            TerminalStatus::Cancelled => "cancelled",
            TerminalStatus::RetryableFailure => "retryable_failure",
        }
    }
}

impl fmt::Display for TerminalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TerminalStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<TerminalStatus, String> {
        TerminalStatus::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown status {s:?}; use succeeded, failed, cancelled or retryable_failure"
                )
            })
    }
}

/// One invocation, as recorded once it ended.
///
/// Fields plugd cannot know yet stay `None`: `binding_id`, `package_id`,
/// `package_version` (filled when bindings resolve a call), `chain_id`,
/// `run_id` (agent chains and runs). `trace_id` is always set: the
/// caller's W3C trace, else a new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvocationRecord {
    /// `inv_…`, unique; for a VAI export the `context.invocation_id` it got.
    pub invocation_id: String,
    /// `tool` (seed 003 also names `harness`, `hook`, `compactor`).
    pub export_kind: String,
    /// The export's own name in its plugin (`jira_search`).
    pub export_id: String,
    /// The tool's name in plugd's registry (`acme/jira_search`).
    pub tool: String,
    /// The plugin that served it.
    pub plugin_id: String,
    /// Its dialect (`native`, `microapp`, `salmex`, `vai`, `mcp`).
    pub dialect: String,
    /// The binding the call resolved through.
    pub binding_id: Option<String>,
    /// The package the export came from.
    pub package_id: Option<String>,
    /// Its version.
    pub package_version: Option<String>,
    /// VAI `execution_class` (`inline`, `worker`, `isolated`).
    pub execution_class: Option<String>,
    /// When it started, RFC 3339 UTC with milliseconds.
    pub started_at: String,
    /// When it ended, RFC 3339 UTC with milliseconds.
    pub ended_at: String,
    /// Milliseconds since the Unix epoch at start (what lists order by).
    pub started_ms: i64,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// How it ended.
    pub status: TerminalStatus,
    /// Retries before this attempt (0: the first).
    pub retry_count: u32,
    /// Error code when it did not succeed (`timeout`, `tool_failed`, …).
    pub error_code: Option<String>,
    /// Who called: `token:NAME`, a Unix user, `cli:USER`, `agent:ID`.
    pub caller: Option<String>,
    /// Tenant scope.
    pub org_id: Option<String>,
    /// Project scope.
    pub project_id: Option<String>,
    /// The session it was part of.
    pub session_id: Option<String>,
    /// The chain it was part of.
    pub chain_id: Option<String>,
    /// The run it was part of.
    pub run_id: Option<String>,
    /// The trace it was part of.
    pub trace_id: Option<String>,
    /// The door the call came in by (`http`, `mcp`, `cli`, `agent`,
    /// `binding`, `hook`, `runtime`); `None` in records of older plugds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface: Option<String>,
    /// The execution (VAI `tool_execution_id`, a harness execution).
    pub execution_id: Option<String>,
    /// What the status does not say, when there is something: `error`
    /// (`{"code", "message"}`) of a call that did not succeed, `decisions`
    /// (hooks, the risk approval, policy) and, under plugd.yaml's
    /// `records.keep_bodies`, `args` and `result`, secrets masked as
    /// `***` and cut at 16 KB (plugd-runtime's `record_payload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
}

/// A record as both stores keep it (and read it back, to
/// [`StoredInvocation::into_record`]): a column per field that lists filter,
/// search or chart on or that nearly every record has, and `extra`, a JSON
/// object of the rest, only what is there (`None` when nothing is): a
/// typical record is about a quarter of its JSON document (issue 29).
///
/// `extra` holds the fields that are `Some` among the rare ones (binding,
/// package, execution class, session, chain, run, execution, payload), an
/// `export_kind` other than `tool`, a `retry_count` other than 0, and
/// `started_at`/`ended_at` only when they are not `started_ms` and
/// `started_ms + duration_ms` written by [`rfc3339_ms`] (they always are in
/// records plugd writes). Reading overlays `extra` on the columns, so a
/// field added to [`InvocationRecord`] later goes in `extra` (its writer
/// names every field, so none is forgotten) with no schema change, and an `extra` holding every field (a record converted
/// from the old JSON document) reads back as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredInvocation {
    pub invocation_id: String,
    pub started_ms: i64,
    pub duration_ms: i64,
    pub status: String,
    pub plugin_id: String,
    pub tool: String,
    pub export_id: String,
    pub dialect: String,
    pub caller: Option<String>,
    pub surface: Option<String>,
    pub trace_id: Option<String>,
    pub error_code: Option<String>,
    pub org_id: Option<String>,
    pub project_id: Option<String>,
    /// The rest, a JSON object; `None` when there is nothing.
    pub extra: Option<String>,
}

impl StoredInvocation {
    /// `r` as stored. Typed, with no JSON document in between (the journal
    /// writer calls this once per tool call: issue 29 measured the generic
    /// `to_value` route at 7 % of serve's CPU under load).
    pub fn from_record(r: &InvocationRecord) -> Result<StoredInvocation, serde_json::Error> {
        // Every field named (no `..`): a field added to the record must be
        // placed here, as a column or in `extra`, or this stops compiling.
        let InvocationRecord {
            invocation_id,
            export_kind,
            export_id,
            tool,
            plugin_id,
            dialect,
            binding_id,
            package_id,
            package_version,
            execution_class,
            started_at,
            ended_at,
            started_ms,
            duration_ms,
            status,
            retry_count,
            error_code,
            caller,
            org_id,
            project_id,
            session_id,
            chain_id,
            run_id,
            trace_id,
            surface,
            execution_id,
            payload,
        } = r;
        let duration = i64::try_from(*duration_ms).unwrap_or(i64::MAX);
        let extra = Extra {
            export_kind: (export_kind != "tool").then_some(export_kind.as_str()),
            binding_id: binding_id.as_deref(),
            package_id: package_id.as_deref(),
            package_version: package_version.as_deref(),
            execution_class: execution_class.as_deref(),
            started_at: (*started_at != rfc3339_ms(*started_ms)).then_some(started_at.as_str()),
            ended_at: (*ended_at != rfc3339_ms(started_ms.saturating_add(duration)))
                .then_some(ended_at.as_str()),
            retry_count: (*retry_count != 0).then_some(*retry_count),
            session_id: session_id.as_deref(),
            chain_id: chain_id.as_deref(),
            run_id: run_id.as_deref(),
            execution_id: execution_id.as_deref(),
            payload: payload.as_ref().filter(|p| !p.is_null()),
        };
        Ok(StoredInvocation {
            invocation_id: invocation_id.clone(),
            started_ms: *started_ms,
            duration_ms: duration,
            status: status.as_str().to_owned(),
            plugin_id: plugin_id.clone(),
            tool: tool.clone(),
            export_id: export_id.clone(),
            dialect: dialect.clone(),
            caller: caller.clone(),
            surface: surface.clone(),
            trace_id: trace_id.clone(),
            error_code: error_code.clone(),
            org_id: org_id.clone(),
            project_id: project_id.clone(),
            extra: Some(serde_json::to_string(&extra)?).filter(|e| e != "{}"),
        })
    }
}

/// What [`StoredInvocation::extra`] holds: only the fields that are there.
#[derive(Serialize)]
struct Extra<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    export_kind: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binding_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    package_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    package_version: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    execution_class: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chain_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    execution_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a serde_json::Value>,
}

impl StoredInvocation {
    /// The record: the columns, the derived fields, `extra` over them.
    /// `Err` says what is wrong with a damaged row.
    pub fn into_record(self) -> Result<InvocationRecord, String> {
        use serde_json::{Value, json};
        let duration = u64::try_from(self.duration_ms)
            .map_err(|_| format!("negative duration_ms {}", self.duration_ms))?;
        let Value::Object(mut m) = json!({
            "invocation_id": self.invocation_id,
            "export_kind": "tool",
            "export_id": self.export_id,
            "tool": self.tool,
            "plugin_id": self.plugin_id,
            "dialect": self.dialect,
            "started_at": rfc3339_ms(self.started_ms),
            "ended_at": rfc3339_ms(self.started_ms.saturating_add(self.duration_ms)),
            "started_ms": self.started_ms,
            "duration_ms": duration,
            "status": self.status,
            "retry_count": 0,
            "error_code": self.error_code,
            "caller": self.caller,
            "org_id": self.org_id,
            "project_id": self.project_id,
            "trace_id": self.trace_id,
            "surface": self.surface,
        }) else {
            unreachable!("an object literal")
        };
        if let Some(extra) = self.extra {
            match serde_json::from_str(&extra) {
                Ok(Value::Object(rest)) => m.extend(rest),
                Ok(_) => return Err("extra is not a JSON object".to_owned()),
                Err(e) => return Err(format!("extra is not JSON: {e}")),
            }
        }
        serde_json::from_value(Value::Object(m)).map_err(|e| format!("not a record: {e}"))
    }
}

/// Where a list page starts: after the record started at `started_ms`
/// with id `invocation_id` (in list order, newest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last listed record's start.
    pub started_ms: i64,
    /// The last listed record's id.
    pub invocation_id: String,
}

/// Why a string is not a cursor of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an invocations cursor; pass the next_cursor of the previous page as is")]
pub struct BadCursor(pub String);

impl Cursor {
    /// The opaque form: hex of `MS:ID`.
    pub fn encode(&self) -> String {
        let plain = format!("{}:{}", self.started_ms, self.invocation_id);
        plain.bytes().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads what [`Cursor::encode`] wrote.
    pub fn decode(s: &str) -> Result<Cursor, BadCursor> {
        let bad = || BadCursor(s.to_owned());
        if !s.len().is_multiple_of(2) || s.len() > 1024 {
            return Err(bad());
        }
        let bytes = (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
            .collect::<Result<Vec<u8>, BadCursor>>()?;
        let plain = String::from_utf8(bytes).map_err(|_| bad())?;
        let (ms, id) = plain.split_once(':').ok_or_else(bad)?;
        Ok(Cursor {
            started_ms: ms.parse().map_err(|_| bad())?,
            invocation_id: id.to_owned(),
        })
    }
}

/// Most records on one page.
pub const MAX_PAGE: usize = 500;

/// Which way a list runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// Newest first: start time, then id, both descending.
    #[default]
    NewestFirst,
    /// Oldest first: start time, then id, both ascending.
    OldestFirst,
}

/// Which records to list: every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InvocationFilter {
    /// Tenant scope.
    pub org_id: Option<String>,
    /// Project scope.
    pub project_id: Option<String>,
    /// Only records of no project or of one of these (what a token limited
    /// to projects sees); `None` does not filter.
    pub project_in: Option<Vec<String>>,
    /// The plugin.
    pub plugin_id: Option<String>,
    /// The tool's registry name or its export id.
    pub tool: Option<String>,
    /// How it ended.
    pub status: Option<TerminalStatus>,
    /// Started at or after (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Started before (ms since the epoch).
    pub until_ms: Option<i64>,
    /// Who called, exactly ([`InvocationRecord::caller`]).
    pub caller: Option<String>,
    /// A case-insensitive substring of the invocation id, the tool, the
    /// plugin id, the caller or the error code (ASCII letters fold on
    /// SQLite; PostgreSQL folds with `lower`).
    pub q: Option<String>,
    /// Newest or oldest first.
    pub order: Order,
    /// Page size, 1..=[`MAX_PAGE`] (0 is taken as 1, more as [`MAX_PAGE`]).
    pub limit: usize,
    /// Continue after this point (in [`InvocationFilter::order`]).
    pub cursor: Option<Cursor>,
}

impl InvocationFilter {
    /// The page size actually used.
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE)
    }
}

/// One page of records, in the filter's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvocationPage {
    /// The records.
    pub invocations: Vec<InvocationRecord>,
    /// Pass as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

impl InvocationPage {
    /// A page of `rows` fetched with one row beyond `page` (the look-ahead
    /// that says whether another page exists).
    pub fn from_rows(mut rows: Vec<InvocationRecord>, page: usize) -> InvocationPage {
        let more = rows.len() > page;
        rows.truncate(page);
        let next_cursor = more.then(|| rows.last()).flatten().map(|r| {
            Cursor {
                started_ms: r.started_ms,
                invocation_id: r.invocation_id.clone(),
            }
            .encode()
        });
        InvocationPage {
            invocations: rows,
            next_cursor,
        }
    }
}

/// What statistics need of one record: [`InvocationStore::invocation_points`]
/// reads these instead of whole records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvocationPoint {
    /// Milliseconds since the Unix epoch at start.
    pub started_ms: i64,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// How it ended.
    pub status: TerminalStatus,
    /// The plugin that served it.
    pub plugin_id: String,
    /// The tool's registry name.
    pub tool: String,
}

/// Most points one [`InvocationStore::invocation_points`] call is asked for
/// by the API (`GET /v1/invocations/stats` says `truncated` beyond).
pub const MAX_POINTS: usize = 200_000;

/// Keeps invocation records. `plugd-store` implements it on SQLite; a
/// PostgreSQL backend implements the same.
#[async_trait::async_trait]
pub trait InvocationStore: Send + Sync {
    /// Appends `batch` in one transaction; a record whose id is stored
    /// already is skipped (appending is idempotent).
    async fn append_invocations(&self, batch: &[InvocationRecord]) -> Result<(), StoreError>;

    /// The record of `invocation_id`.
    async fn invocation(&self, invocation_id: &str)
    -> Result<Option<InvocationRecord>, StoreError>;

    /// One page of the records `filter` matches, in its order (newest
    /// first: start time, then id, both descending; oldest first: both
    /// ascending).
    async fn list_invocations(
        &self,
        filter: &InvocationFilter,
    ) -> Result<InvocationPage, StoreError>;

    /// The points of the records `filter` matches (every filter but the
    /// cursor, the order and the limit), newest first, at most `max`.
    async fn invocation_points(
        &self,
        filter: &InvocationFilter,
        max: usize,
    ) -> Result<Vec<InvocationPoint>, StoreError>;

    /// Deletes the records started before `before_ms`; how many.
    async fn delete_invocations_before(&self, before_ms: i64) -> Result<u64, StoreError>;
}

/// `ms` since the Unix epoch as RFC 3339 UTC with milliseconds
/// (`2026-03-12T20:00:00.123Z`); before 1970 reads as the epoch.
pub fn rfc3339_ms(ms: i64) -> String {
    let ms = ms.max(0);
    let secs = ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

/// Reads RFC 3339 UTC (`2026-03-12T20:00:00Z`, optional fraction, `Z` or
/// `+00:00`) or a bare date (`2026-03-12`, its midnight) as ms since the epoch.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let num = |a: usize, b: usize| -> Option<i64> {
        let t = s.get(a..b)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if s.get(4..5)? != "-"
        || s.get(7..8)? != "-"
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&d)
    {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    if s.len() == 10 {
        return Some(days * 86_400_000);
    }
    if !matches!(s.get(10..11)?, "T" | "t" | " ") || s.get(13..14)? != ":" || s.get(16..17)? != ":"
    {
        return None;
    }
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut frac_ms = 0;
    if let Some(f) = rest.strip_prefix('.') {
        let digits = f.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &f[..digits.min(3)]);
        frac_ms = padded.parse().ok()?;
        rest = &f[digits..];
    }
    if !matches!(rest, "Z" | "z" | "+00:00") {
        return None;
    }
    Some(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + frac_ms)
}

/// Days since 1970-01-01 (non-negative) to a proleptic Gregorian (year,
/// month, day): Howard Hinnant's `civil_from_days` (the store's RFC 3339
/// stamps use it too).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Howard Hinnant's `days_from_civil`.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typical_record_is_all_columns_and_reads_back_whole() {
        let r = crate::samples::invocation(7, 1_795_000_000_000, "p", TerminalStatus::Failed);
        let s = StoredInvocation::from_record(&r).unwrap();
        assert_eq!(s.extra, None, "{s:?}");
        assert_eq!(s.into_record().unwrap(), r);
    }

    #[test]
    fn every_rare_field_and_odd_time_goes_to_extra_and_back() {
        let mut r =
            crate::samples::invocation(8, 1_795_000_000_000, "p", TerminalStatus::RetryableFailure);
        r.export_kind = "harness".into();
        r.retry_count = 2;
        r.binding_id = Some("bnd_1".into());
        r.package_id = Some("acme/devkit".into());
        r.package_version = Some("1.2.3".into());
        r.execution_class = Some("worker".into());
        r.session_id = Some("ses_1".into());
        r.chain_id = Some("chn_1".into());
        r.run_id = Some("run_1".into());
        r.execution_id = Some("ex_1".into());
        r.project_id = Some("prj".into());
        r.surface = Some("mcp".into());
        r.started_at = "2026-11-29T10:00:00.000+01:00".into();
        r.ended_at = "later".into();
        r.payload = Some(serde_json::json!({"error": {"code": "timeout"}}));
        let s = StoredInvocation::from_record(&r).unwrap();
        let extra: serde_json::Value = serde_json::from_str(s.extra.as_deref().unwrap()).unwrap();
        for k in [
            "export_kind",
            "retry_count",
            "binding_id",
            "package_id",
            "package_version",
            "execution_class",
            "session_id",
            "chain_id",
            "run_id",
            "execution_id",
            "started_at",
            "ended_at",
            "payload",
        ] {
            assert!(extra.get(k).is_some(), "{k} not in {extra}");
        }
        assert!(extra.get("project_id").is_none() && extra.get("tool").is_none());
        assert_eq!(s.into_record().unwrap(), r);
    }

    #[test]
    fn an_old_json_document_as_extra_reads_back_as_it_was() {
        let r = crate::samples::invocation(9, 1_795_000_000_123, "p", TerminalStatus::Succeeded);
        let mut s = StoredInvocation::from_record(&r).unwrap();
        // What the migration leaves: the document minus nothing at all.
        s.extra = Some(serde_json::to_string(&r).unwrap());
        assert_eq!(s.into_record().unwrap(), r);
    }

    #[test]
    fn a_damaged_row_says_what_is_wrong() {
        let r = crate::samples::invocation(1, 5, "p", TerminalStatus::Succeeded);
        let base = StoredInvocation::from_record(&r).unwrap();
        let bad = |f: fn(&mut StoredInvocation)| {
            let mut b = base.clone();
            f(&mut b);
            b.into_record().unwrap_err()
        };
        assert!(bad(|b| b.extra = Some("[1]".into())).contains("not a JSON object"));
        assert!(bad(|b| b.extra = Some("{".into())).contains("not JSON"));
        assert!(bad(|b| b.status = "sideways".into()).contains("not a record"));
        assert!(bad(|b| b.duration_ms = -1).contains("negative"));
    }

    #[test]
    fn statuses_use_the_seed_names() {
        for s in TerminalStatus::ALL {
            assert_eq!(s.as_str().parse::<TerminalStatus>().unwrap(), s);
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.as_str())
            );
        }
        assert!("ok".parse::<TerminalStatus>().is_err());
        assert_eq!(
            TerminalStatus::RetryableFailure.as_str(),
            "retryable_failure"
        );
    }

    #[test]
    fn cursors_round_trip_and_refuse_junk() {
        let c = Cursor {
            started_ms: 1_700_000_000_123,
            invocation_id: "inv_a:b".into(),
        };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
        for bad in ["", "zz", "abc", "3a", &"00".repeat(600)] {
            assert!(Cursor::decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_format_and_parse_to_the_millisecond() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_709_251_199_007), "2024-02-29T23:59:59.007Z");
        for ms in [0, 951_782_400_000, 1_709_251_199_007, 4_102_444_800_999] {
            assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms)), Some(ms));
        }
        assert_eq!(parse_rfc3339_ms("2024-02-29"), Some(1_709_164_800_000));
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T23:59:59Z"),
            Some(1_709_251_199_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T23:59:59.5+00:00"),
            Some(1_709_251_199_500)
        );
        for bad in [
            "",
            "yesterday",
            "2024-13-01",
            "2024-02-29T23:59:59",
            "2024-02-29T23:59:59+02:00",
            "2024-02-29T25:00:00Z",
            "2024-02-29T23:59:59.Z",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
