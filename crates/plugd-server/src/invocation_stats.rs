//! `GET /v1/invocations/stats`: calls, errors and latency percentiles of
//! the invocation records in a time window, as a time series and per
//! plugin and tool, for the console's activity charts. Viewer and up.
//!
//! Query: `since`, `until` (RFC 3339 UTC or a date, as `GET
//! /v1/invocations` takes them; default: the last hour, ending now, or the
//! hour before `until`, or `since` to now), `buckets` (1 to 200, default 60),
//! `plugin` (a plugin id), `tool` (a tool's plugd name or export id). An
//! unknown or repeated parameter, a bad time, `since` not before `until` or
//! `buckets` out of range is 400 `bad_request`.
//!
//! Answer:
//! `{"since", "until", "bucket_ms", "series": [{"start", "calls", "errors",
//! "p50_ms", "p99_ms"}], "plugins": [{"plugin", "calls", "errors", "p50_ms",
//! "p99_ms"}], "tools": [{"tool", "plugin", "calls", "errors", "p50_ms",
//! "p99_ms"}], "scanned", "truncated"}`. The window is cut in `buckets`
//! buckets of `bucket_ms` (the window's length divided by `buckets`,
//! rounded up; the last bucket may reach past `until`); `start` is RFC 3339
//! UTC with milliseconds. `errors` counts every record whose status is not
//! `succeeded`. Percentiles are nearest-rank over the durations
//! (`null` for a bucket without calls). `plugins` and `tools` are sorted by
//! calls, most first (then by name), at most 50 each.
//!
//! The store reads a light projection of the records
//! ([`InvocationStore::invocation_points`](plugd_control::InvocationStore::invocation_points)),
//! newest first, at most [`MAX_POINTS`] of them; beyond, `truncated` is
//! true and the oldest records of the window are left out. `scanned` is
//! how many records were counted.
//!
//! **Tenancy**: as the list, an org token counts only its org's records
//! (and, limited to projects, those of no project or of its projects).

use std::collections::HashMap;

use axum::extract::{RawQuery, State};
use axum::{Extension, Json};
use plugd_control::invocations::{
    InvocationFilter, InvocationPoint, MAX_POINTS, TerminalStatus, rfc3339_ms,
};
use serde::Serialize;

use crate::auth::Identity;
use crate::invocations::{bad, decode, time, within_tenancy};
use crate::{ApiError, AppState};

/// Buckets when `buckets` is not given.
pub const DEFAULT_BUCKETS: usize = 60;

/// Most buckets.
pub const MAX_BUCKETS: usize = 200;

/// The window when neither `since` nor `until` is given: one hour.
pub const DEFAULT_WINDOW_MS: i64 = 3_600_000;

/// Most rows in `plugins` and in `tools`.
pub const TOP: usize = 50;

/// The query of `GET /v1/invocations/stats`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StatsQuery {
    /// Window start (RFC 3339 UTC or a date).
    pub since: Option<String>,
    /// Window end, exclusive.
    pub until: Option<String>,
    /// How many buckets, 1 to 200.
    pub buckets: Option<String>,
    /// The plugin id.
    pub plugin: Option<String>,
    /// The tool's plugd name or export id.
    pub tool: Option<String>,
}

impl StatsQuery {
    /// Reads `a=b&c=d` (percent-encoded); an unknown or repeated name is a 400.
    pub fn parse(query: &str) -> Result<StatsQuery, ApiError> {
        let mut q = StatsQuery::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k)?, decode(v)?);
            let slot = match k.as_str() {
                "since" => &mut q.since,
                "until" => &mut q.until,
                "buckets" => &mut q.buckets,
                "plugin" => &mut q.plugin,
                "tool" => &mut q.tool,
                other => {
                    return Err(bad(format!(
                        "unknown query parameter {other:?}; the parameters are since, until, buckets, plugin and tool"
                    )));
                }
            };
            if slot.replace(v).is_some() {
                return Err(bad(format!("query parameter {k:?} is given twice")));
            }
        }
        Ok(q)
    }

    /// The window (`since_ms`, `until_ms`), the number of buckets and the
    /// store filter, with `now_ms` for the defaults.
    pub fn plan(self, now_ms: i64) -> Result<(i64, i64, usize, InvocationFilter), ApiError> {
        let buckets = match &self.buckets {
            None => DEFAULT_BUCKETS,
            Some(b) => b
                .parse()
                .ok()
                .filter(|n| (1..=MAX_BUCKETS).contains(n))
                .ok_or_else(|| {
                    bad(format!(
                        "buckets={b:?} is out of range; use 1 to {MAX_BUCKETS}"
                    ))
                })?,
        };
        let since = time("since", self.since)?;
        let until = time("until", self.until)?;
        let (since, until) = match (since, until) {
            (Some(s), Some(u)) => (s, u),
            (Some(s), None) => (s, now_ms),
            (None, Some(u)) => (u - DEFAULT_WINDOW_MS, u),
            (None, None) => (now_ms - DEFAULT_WINDOW_MS, now_ms),
        };
        if since >= until {
            return Err(bad(format!(
                "since ({}) must be before until ({}); a window starting now or later has no records",
                rfc3339_ms(since),
                rfc3339_ms(until)
            )));
        }
        let filter = InvocationFilter {
            plugin_id: self.plugin,
            tool: self.tool,
            since_ms: Some(since),
            until_ms: Some(until),
            ..InvocationFilter::default()
        };
        Ok((since, until, buckets, filter))
    }
}

/// The answer of `GET /v1/invocations/stats`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// The window's start, RFC 3339 UTC.
    pub since: String,
    /// Its end (exclusive).
    pub until: String,
    /// Each bucket's length.
    pub bucket_ms: i64,
    /// One entry per bucket, oldest first.
    pub series: Vec<Bucket>,
    /// Per plugin, most calls first.
    pub plugins: Vec<PluginStats>,
    /// Per tool, most calls first.
    pub tools: Vec<ToolStats>,
    /// Records counted.
    pub scanned: usize,
    /// Whether the window held more records than were read.
    pub truncated: bool,
}

/// Counts of one time bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Its start, RFC 3339 UTC with milliseconds.
    pub start: String,
    /// Calls.
    pub calls: u64,
    /// Calls that did not succeed.
    pub errors: u64,
    /// Median duration.
    pub p50_ms: Option<u64>,
    /// 99th percentile of the durations.
    pub p99_ms: Option<u64>,
}

/// Counts of one plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginStats {
    /// The plugin id.
    pub plugin: String,
    /// Calls.
    pub calls: u64,
    /// Calls that did not succeed.
    pub errors: u64,
    /// Median duration.
    pub p50_ms: Option<u64>,
    /// 99th percentile.
    pub p99_ms: Option<u64>,
}

/// Counts of one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolStats {
    /// The tool's plugd name.
    pub tool: String,
    /// Its plugin.
    pub plugin: String,
    /// Calls.
    pub calls: u64,
    /// Calls that did not succeed.
    pub errors: u64,
    /// Median duration.
    pub p50_ms: Option<u64>,
    /// 99th percentile.
    pub p99_ms: Option<u64>,
}

/// Durations and errors of one group.
#[derive(Debug, Default)]
struct Acc {
    durations: Vec<u64>,
    errors: u64,
}

impl Acc {
    fn add(&mut self, p: &InvocationPoint) {
        self.durations.push(p.duration_ms);
        self.errors += u64::from(p.status != TerminalStatus::Succeeded);
    }

    /// (calls, errors, p50, p99).
    fn finish(mut self) -> (u64, u64, Option<u64>, Option<u64>) {
        self.durations.sort_unstable();
        (
            self.durations.len() as u64,
            self.errors,
            percentile(&self.durations, 50),
            percentile(&self.durations, 99),
        )
    }
}

/// The nearest-rank `pct`th percentile of `sorted` (`None` when empty).
pub fn percentile(sorted: &[u64], pct: usize) -> Option<u64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (pct * n).div_ceil(100).clamp(1, n);
    Some(sorted[rank - 1])
}

/// The statistics of `points` (those of the window [`since_ms`,
/// `until_ms`)) in `buckets` buckets; `truncated` as the store read them.
pub fn compute(
    points: &[InvocationPoint],
    since_ms: i64,
    until_ms: i64,
    buckets: usize,
    truncated: bool,
) -> Stats {
    let buckets = buckets.max(1);
    let width = until_ms.saturating_sub(since_ms).max(1);
    let n = buckets as i64;
    let bucket_ms = ((width + n - 1) / n).max(1);
    let mut series: Vec<Acc> = (0..buckets).map(|_| Acc::default()).collect();
    let mut plugins: HashMap<&str, Acc> = HashMap::new();
    let mut tools: HashMap<(&str, &str), Acc> = HashMap::new();
    let mut scanned = 0;
    for p in points {
        if p.started_ms < since_ms || p.started_ms >= until_ms {
            continue;
        }
        scanned += 1;
        let i = ((p.started_ms - since_ms) / bucket_ms) as usize;
        series[i.min(buckets - 1)].add(p);
        plugins.entry(&p.plugin_id).or_default().add(p);
        tools.entry((&p.tool, &p.plugin_id)).or_default().add(p);
    }
    let series = series
        .into_iter()
        .enumerate()
        .map(|(i, acc)| {
            let (calls, errors, p50_ms, p99_ms) = acc.finish();
            Bucket {
                start: rfc3339_ms(since_ms + i as i64 * bucket_ms),
                calls,
                errors,
                p50_ms,
                p99_ms,
            }
        })
        .collect();
    let mut plugins: Vec<PluginStats> = plugins
        .into_iter()
        .map(|(plugin, acc)| {
            let (calls, errors, p50_ms, p99_ms) = acc.finish();
            PluginStats {
                plugin: plugin.to_owned(),
                calls,
                errors,
                p50_ms,
                p99_ms,
            }
        })
        .collect();
    plugins.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.plugin.cmp(&b.plugin)));
    plugins.truncate(TOP);
    let mut tools: Vec<ToolStats> = tools
        .into_iter()
        .map(|((tool, plugin), acc)| {
            let (calls, errors, p50_ms, p99_ms) = acc.finish();
            ToolStats {
                tool: tool.to_owned(),
                plugin: plugin.to_owned(),
                calls,
                errors,
                p50_ms,
                p99_ms,
            }
        })
        .collect();
    tools.sort_by(|a, b| {
        b.calls
            .cmp(&a.calls)
            .then_with(|| a.tool.cmp(&b.tool))
            .then_with(|| a.plugin.cmp(&b.plugin))
    });
    tools.truncate(TOP);
    Stats {
        since: rfc3339_ms(since_ms),
        until: rfc3339_ms(until_ms),
        bucket_ms,
        series,
        plugins,
        tools,
        scanned,
        truncated,
    }
}

/// `GET /v1/invocations/stats`.
pub(crate) async fn stats(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    RawQuery(query): RawQuery,
) -> Result<Json<Stats>, ApiError> {
    let now = plugd_store::outbox::now_ms();
    let (since, until, buckets, filter) =
        StatsQuery::parse(query.as_deref().unwrap_or(""))?.plan(now)?;
    let Some(filter) = within_tenancy(filter, who.tenant.as_ref()) else {
        return Ok(Json(compute(&[], since, until, buckets, false)));
    };
    let mut points = state
        .runtime
        .state()
        .invocation_points(&filter, MAX_POINTS + 1)
        .await
        .map_err(crate::packages::store_error)?;
    let truncated = points.len() > MAX_POINTS;
    points.truncate(MAX_POINTS);
    Ok(Json(compute(&points, since, until, buckets, truncated)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(ms: i64, dur: u64, ok: bool, plugin: &str, tool: &str) -> InvocationPoint {
        InvocationPoint {
            started_ms: ms,
            duration_ms: dur,
            status: if ok {
                TerminalStatus::Succeeded
            } else {
                TerminalStatus::RetryableFailure
            },
            plugin_id: plugin.into(),
            tool: tool.into(),
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let d: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&d, 50), Some(50));
        assert_eq!(percentile(&d, 99), Some(99));
        assert_eq!(percentile(&[7], 99), Some(7));
        assert_eq!(percentile(&[1, 1000], 50), Some(1));
        assert_eq!(percentile(&[1, 1000], 99), Some(1000));
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn buckets_plugins_and_tools_count_calls_errors_and_latency() {
        // 10 buckets of 100 ms over [1000, 2000).
        let mut points = Vec::new();
        for i in 0..100u64 {
            points.push(point(1_000 + i as i64, i + 1, i % 10 != 0, "a", "a/x"));
        }
        points.push(point(1_950, 5_000, false, "b", "b/y"));
        points.push(point(1_951, 7, true, "b", "b/z"));
        // Outside the window: not counted.
        points.push(point(999, 1, true, "c", "c/w"));
        points.push(point(2_000, 1, true, "c", "c/w"));
        let s = compute(&points, 1_000, 2_000, 10, false);
        assert_eq!((s.bucket_ms, s.series.len(), s.scanned), (100, 10, 102));
        assert_eq!(s.series[0].start, "1970-01-01T00:00:01.000Z");
        assert_eq!(s.series[9].start, "1970-01-01T00:00:01.900Z");
        assert_eq!(
            (
                s.series[0].calls,
                s.series[0].errors,
                s.series[0].p50_ms,
                s.series[0].p99_ms
            ),
            (100, 10, Some(50), Some(99))
        );
        assert_eq!((s.series[5].calls, s.series[5].p50_ms), (0, None));
        assert_eq!((s.series[9].calls, s.series[9].errors), (2, 1));
        assert_eq!(s.series[9].p99_ms, Some(5_000));
        let names: Vec<(&str, u64)> = s
            .plugins
            .iter()
            .map(|p| (p.plugin.as_str(), p.calls))
            .collect();
        assert_eq!(names, [("a", 100), ("b", 2)]);
        assert_eq!(s.tools[0].tool, "a/x");
        assert_eq!((s.tools[1].tool.as_str(), s.tools[1].errors), ("b/y", 1));
        assert_eq!(
            (s.tools[2].tool.as_str(), s.tools[2].plugin.as_str()),
            ("b/z", "b")
        );
        // More than 50 plugins: the 50 busiest.
        let many: Vec<_> = (0..80)
            .flat_map(|p| (0..=p).map(move |n| point(1_000 + n, 1, true, &format!("p{p:02}"), "t")))
            .collect();
        let s = compute(&many, 1_000, 2_000, 1, true);
        assert_eq!(s.plugins.len(), TOP);
        assert_eq!(s.plugins[0].plugin, "p79");
        assert!(s.truncated);
    }

    #[test]
    fn the_window_defaults_to_the_last_hour_and_is_checked() {
        let now = 10_000_000;
        let (since, until, buckets, f) = StatsQuery::default().plan(now).unwrap();
        assert_eq!((since, until, buckets), (now - 3_600_000, now, 60));
        assert_eq!((f.since_ms, f.until_ms), (Some(since), Some(until)));
        let q = StatsQuery::parse("until=2026-01-01T01:00:00Z&buckets=200&plugin=a%2Fb").unwrap();
        let (since, until, buckets, f) = q.plan(now).unwrap();
        assert_eq!(until - since, 3_600_000);
        assert_eq!((buckets, f.plugin_id.as_deref()), (200, Some("a/b")));
        for bad in [
            "buckets=0",
            "buckets=201",
            "buckets=x",
            "since=yesterday",
            "nope=1",
            "tool=a&tool=b",
        ] {
            let got = StatsQuery::parse(bad).and_then(|q| q.plan(now));
            assert!(got.is_err(), "{bad}");
        }
        let q = StatsQuery::parse("since=2026-01-02&until=2026-01-01").unwrap();
        assert!(q.plan(now).is_err());
    }
}
