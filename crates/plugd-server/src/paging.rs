//! Search, filters, sort and pages for the lists served from memory
//! (`GET /v1/plugins`, `/v1/tools`, `/v1/approvals`, `/v1/plugin-packages`,
//! `/v1/plugin-bindings`), for a console with hundreds of rows.
//!
//! A request with none of the parameters below gets the bare JSON array it
//! always got (other clients read that shape). With any of `q`, `limit`,
//! `cursor`, `sort` or a list's own filter, the answer is
//! `{"items": [...the same row objects...], "next_cursor": str|null,
//! "total": n}`, `total` counting every row that matches:
//!
//! - `q`: a case-insensitive substring of any of the list's search fields
//!   (an array field matches when one of its strings does);
//! - a filter (`?state=running`): the row's field equals the value exactly
//!   (`true`/`false` for the boolean ones);
//! - `sort=FIELD` ascending, `sort=-FIELD` descending, over the list's sort
//!   keys (risk levels sort low < medium < high < critical); without it, the
//!   list's own order;
//! - `limit`: 1 to 500, default 50;
//! - `cursor`: the `next_cursor` of the previous page: an opaque offset
//!   bound to the query it was made for (search, filters, sort), so a
//!   changed or made-up cursor is a 400, not a wrong page.
//!
//! An unknown parameter, a repeated one, an unknown sort key, a `limit`
//! out of range or a bad boolean is 400 `bad_request`.
//!
//! | list | `q` searches | filters | sort keys |
//! |------|--------------|---------|-----------|
//! | `GET /v1/plugins` | `id`, `dialect`, `version`, `state`, `tools`, `error` | `state`, `dialect`, `approved` | `id`, `dialect`, `state`, `version`, `approved`, `restarts` |
//! | `GET /v1/tools` | `name`, `plugin`, `description`, `title` | `plugin`, `risk`, `risk_source`, `enabled` (and `all`, as before) | `name`, `plugin`, `risk`, `enabled` |
//! | `GET /v1/approvals` | `id`, `tool`, `plugin`, `args_preview` | `risk`, `plugin`, `tool` | `requested_at`, `expires_at`, `tool`, `plugin`, `risk` |
//! | `GET /v1/plugin-packages` | `package_id`, `version`, `source`, `installed_by`, `digest`, export ids | `package` (`package_id`), `signature` (`signature.status`), `org` (used by that org's bindings) | `package_id`, `version`, `installed_at`, `files`, `size` |
//! | `GET /v1/plugin-bindings` | `binding_id`, `package_id`, `export_id`, `scope.org_id`, `scope.project_id`, `created_by` | `org`, `project` (the scope's), and the older `org_id`, `export_id`, `package_id`, `status` | `binding_id`, `package_id`, `export_id`, `org` (or `org_id`), `project_id`, `status`, `created_at`, `updated_at` |
//!
//! `/v1/tools` lists enabled tools unless `all=true` or an `enabled`
//! filter is given. The older filters of `/v1/tools` (`all`) and
//! `/v1/plugin-bindings` keep the bare answer when given alone.
//!
//! Offsets, not keys: these lists are rebuilt from memory per request and
//! small (hundreds of rows), so a row added or removed between two pages
//! may shift one row across the boundary; the store's lists (invocation
//! records, the audit trail) page by key instead.

use std::cmp::Ordering;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::ApiError;
use crate::error::code;

/// Rows on a page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 50;

/// Most rows on a page.
pub const MAX_LIMIT: usize = 500;

/// How a filter's value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The field's text (or number) equals the value.
    Text,
    /// `true` or `false`.
    Bool,
}

/// One filter of a list: `?param=value` keeps the rows whose field at
/// `pointer` (a JSON Pointer) equals the value.
#[derive(Debug, Clone, Copy)]
pub struct Filter {
    /// The query parameter.
    pub param: &'static str,
    /// Where the field is in a row.
    pub pointer: &'static str,
    /// How the value is read.
    pub kind: Kind,
}

/// One sort key of a list.
#[derive(Debug, Clone, Copy)]
pub struct SortKey {
    /// The name `sort=` takes.
    pub key: &'static str,
    /// Where the field is in a row.
    pub pointer: &'static str,
    /// Ranks of a field whose text has an order of its own (risk levels).
    pub rank: Option<fn(&str) -> Option<i64>>,
}

/// What a list offers: its search fields, filters and sort keys, and the
/// parameters its handler reads itself.
#[derive(Debug, Clone, Copy)]
pub struct ListSpec {
    /// The list, for messages and cursors (`plugins`).
    pub name: &'static str,
    /// JSON Pointers `q` searches; a `*` segment is every element of an
    /// array (`/exports/*/id`).
    pub search: &'static [&'static str],
    /// Its filters.
    pub filters: &'static [Filter],
    /// Its sort keys.
    pub sorts: &'static [SortKey],
    /// Parameters the handler reads itself that keep the bare answer (the
    /// older filters).
    pub own: &'static [&'static str],
    /// Parameters the handler reads itself that ask for the paged answer.
    pub own_paged: &'static [&'static str],
}

const fn text(param: &'static str, pointer: &'static str) -> Filter {
    Filter {
        param,
        pointer,
        kind: Kind::Text,
    }
}

const fn flag(param: &'static str, pointer: &'static str) -> Filter {
    Filter {
        param,
        pointer,
        kind: Kind::Bool,
    }
}

const fn key(key: &'static str, pointer: &'static str) -> SortKey {
    SortKey {
        key,
        pointer,
        rank: None,
    }
}

/// Risk levels in their order.
fn risk_rank(s: &str) -> Option<i64> {
    ["low", "medium", "high", "critical"]
        .iter()
        .position(|r| *r == s)
        .map(|p| p as i64)
}

/// `GET /v1/plugins`.
pub const PLUGINS: ListSpec = ListSpec {
    name: "plugins",
    search: &[
        "/id", "/dialect", "/version", "/state", "/tools/*", "/error",
    ],
    filters: &[
        text("state", "/state"),
        text("dialect", "/dialect"),
        flag("approved", "/approved"),
    ],
    sorts: &[
        key("id", "/id"),
        key("dialect", "/dialect"),
        key("state", "/state"),
        key("version", "/version"),
        key("approved", "/approved"),
        key("restarts", "/restarts"),
    ],
    own: &[],
    own_paged: &[],
};

/// `GET /v1/tools`.
pub const TOOLS: ListSpec = ListSpec {
    name: "tools",
    search: &["/name", "/plugin", "/description", "/title"],
    filters: &[
        text("plugin", "/plugin"),
        text("risk", "/risk"),
        text("risk_source", "/risk_source"),
        flag("enabled", "/enabled"),
    ],
    sorts: &[
        key("name", "/name"),
        key("plugin", "/plugin"),
        SortKey {
            key: "risk",
            pointer: "/risk",
            rank: Some(risk_rank),
        },
        key("enabled", "/enabled"),
    ],
    own: &["all"],
    own_paged: &[],
};

/// `GET /v1/approvals`.
pub const APPROVALS: ListSpec = ListSpec {
    name: "approvals",
    search: &["/id", "/tool", "/plugin", "/args_preview"],
    filters: &[
        text("risk", "/risk"),
        text("plugin", "/plugin"),
        text("tool", "/tool"),
    ],
    sorts: &[
        key("requested_at", "/requested_at"),
        key("expires_at", "/expires_at"),
        key("tool", "/tool"),
        key("plugin", "/plugin"),
        SortKey {
            key: "risk",
            pointer: "/risk",
            rank: Some(risk_rank),
        },
    ],
    own: &[],
    own_paged: &[],
};

/// `GET /v1/plugin-packages` (`org` is read by its handler: the packages
/// that org's bindings use).
pub const PACKAGES: ListSpec = ListSpec {
    name: "packages",
    search: &[
        "/package_id",
        "/version",
        "/source",
        "/installed_by",
        "/digest",
        "/exports/*/id",
    ],
    filters: &[
        text("package", "/package_id"),
        text("signature", "/signature/status"),
    ],
    sorts: &[
        key("package_id", "/package_id"),
        key("version", "/version"),
        key("installed_at", "/installed_at"),
        key("files", "/files"),
        key("size", "/size"),
    ],
    own: &[],
    own_paged: &["org"],
};

/// `GET /v1/plugin-bindings` (its older filters `org_id`, `export_id`,
/// `package_id`, `status` are the store's, read by its handler).
pub const BINDINGS: ListSpec = ListSpec {
    name: "bindings",
    search: &[
        "/binding_id",
        "/package_id",
        "/export_id",
        "/scope/org_id",
        "/scope/project_id",
        "/created_by",
    ],
    filters: &[
        text("org", "/scope/org_id"),
        text("project", "/scope/project_id"),
    ],
    sorts: &[
        key("binding_id", "/binding_id"),
        key("package_id", "/package_id"),
        key("export_id", "/export_id"),
        key("org", "/scope/org_id"),
        key("org_id", "/scope/org_id"),
        key("project_id", "/scope/project_id"),
        key("status", "/status"),
        key("created_at", "/created_at"),
        key("updated_at", "/updated_at"),
    ],
    own: &["org_id", "export_id", "package_id", "status"],
    own_paged: &[],
};

fn bad(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code::BAD_REQUEST, message)
}

/// A parsed list query (see the module documentation).
#[derive(Debug, Clone)]
pub struct PageQuery {
    spec: ListSpec,
    /// `q`, lower case.
    q: Option<String>,
    /// (index into the spec's filters, the value wanted).
    filters: Vec<(usize, Value)>,
    /// (index into the spec's sort keys, descending).
    sort: Option<(usize, bool)>,
    limit: usize,
    offset: usize,
    paged: bool,
    /// The handler's own parameters, decoded.
    own: Vec<(String, String)>,
    /// The handler's own parameters as sent (`a=b&c=d`), for handlers that
    /// parse them themselves.
    own_raw: String,
}

impl PageQuery {
    /// Reads `query` for the list `spec`.
    pub fn parse(spec: ListSpec, query: Option<&str>) -> Result<PageQuery, ApiError> {
        let mut q = PageQuery {
            spec,
            q: None,
            filters: Vec::new(),
            sort: None,
            limit: DEFAULT_LIMIT,
            offset: 0,
            paged: false,
            own: Vec::new(),
            own_raw: String::new(),
        };
        let mut seen: Vec<String> = Vec::new();
        let mut cursor = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (
                crate::invocations::decode(k)?,
                crate::invocations::decode(v)?,
            );
            if seen.contains(&k) {
                return Err(bad(format!("query parameter {k:?} is given twice")));
            }
            seen.push(k.clone());
            if spec.own.contains(&k.as_str()) || spec.own_paged.contains(&k.as_str()) {
                q.paged |= spec.own_paged.contains(&k.as_str());
                if !q.own_raw.is_empty() {
                    q.own_raw.push('&');
                }
                q.own_raw.push_str(pair);
                q.own.push((k, v));
                continue;
            }
            q.paged = true;
            match k.as_str() {
                "q" => q.q = Some(v.to_lowercase()),
                "limit" => {
                    q.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            bad(format!("limit={v:?} is out of range; use 1 to {MAX_LIMIT}"))
                        })?;
                }
                "cursor" => cursor = Some(v),
                "sort" => {
                    let (name, desc) = match v.strip_prefix('-') {
                        Some(n) => (n, true),
                        None => (v.as_str(), false),
                    };
                    let i = spec.sorts.iter().position(|s| s.key == name).ok_or_else(|| {
                        bad(format!(
                            "sort={v:?}: {} cannot be sorted by {name:?}; use one of {} (with - before it for descending)",
                            spec.name,
                            spec.sorts.iter().map(|s| s.key).collect::<Vec<_>>().join(", ")
                        ))
                    })?;
                    q.sort = Some((i, desc));
                }
                other => {
                    let Some(i) = spec.filters.iter().position(|f| f.param == other) else {
                        return Err(bad(format!(
                            "unknown query parameter {other:?} for {}; use q, limit, cursor, sort{}",
                            spec.name,
                            spec.filters
                                .iter()
                                .map(|f| f.param)
                                .chain(spec.own.iter().copied())
                                .chain(spec.own_paged.iter().copied())
                                .map(|p| format!(", {p}"))
                                .collect::<String>()
                        )));
                    };
                    let want = match spec.filters[i].kind {
                        Kind::Text => Value::String(v),
                        Kind::Bool => match v.as_str() {
                            "true" => Value::Bool(true),
                            "false" => Value::Bool(false),
                            _ => {
                                return Err(bad(format!("{other}={v:?}: use true or false")));
                            }
                        },
                    };
                    q.filters.push((i, want));
                }
            }
        }
        if let Some(c) = cursor {
            q.offset = q.decode_cursor(&c)?;
        }
        Ok(q)
    }

    /// Whether the paged answer is asked for.
    pub fn paged(&self) -> bool {
        self.paged
    }

    /// The value of the handler's own parameter `name`, decoded.
    pub fn own(&self, name: &str) -> Option<&str> {
        self.own
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The handler's own parameters as sent (`a=b&c=d`).
    pub fn own_raw(&self) -> &str {
        &self.own_raw
    }

    /// Whether filter `param` is given.
    pub fn has_filter(&self, param: &str) -> bool {
        self.filters
            .iter()
            .any(|(i, _)| self.spec.filters[*i].param == param)
    }

    /// What a cursor is bound to: the list, the search, filters and sort
    /// and the handler's own parameters (not the page size).
    fn fingerprint(&self) -> u64 {
        let mut filters: Vec<String> = self
            .filters
            .iter()
            .map(|(i, v)| format!("{}={v}", self.spec.filters[*i].param))
            .collect();
        filters.sort();
        let mut own: Vec<String> = self.own.iter().map(|(k, v)| format!("{k}={v}")).collect();
        own.sort();
        let text = format!(
            "{}\n{:?}\n{}\n{:?}\n{}",
            self.spec.name,
            self.q,
            filters.join("&"),
            self.sort.map(|(i, d)| (self.spec.sorts[i].key, d)),
            own.join("&")
        );
        fnv1a(text.as_bytes())
    }

    fn check(&self, offset: u64) -> u64 {
        let mut bytes = self.fingerprint().to_le_bytes().to_vec();
        bytes.extend_from_slice(&offset.to_le_bytes());
        fnv1a(&bytes)
    }

    /// The cursor of the page starting at `offset`: its offset and a check
    /// over the offset and the query, both in hex.
    fn encode_cursor(&self, offset: usize) -> String {
        let offset = offset as u64;
        format!("{offset:016x}{:016x}", self.check(offset))
    }

    fn decode_cursor(&self, c: &str) -> Result<usize, ApiError> {
        let refused = || {
            bad(format!(
                "cursor {c:?} is not a cursor of this {} query; pass the next_cursor of the previous page as is, with the same q, filters and sort",
                self.spec.name
            ))
        };
        if c.len() != 32 || !c.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(refused());
        }
        let offset = u64::from_str_radix(&c[..16], 16).map_err(|_| refused())?;
        let check = u64::from_str_radix(&c[16..], 16).map_err(|_| refused())?;
        if check != self.check(offset) {
            return Err(refused());
        }
        usize::try_from(offset).map_err(|_| refused())
    }

    /// Whether `row` is kept by `q` and the filters.
    fn keeps(&self, row: &Value) -> bool {
        let q_ok = self.q.as_deref().is_none_or(|q| {
            self.spec.search.iter().any(|p| {
                values_at(row, p)
                    .iter()
                    .any(|v| v.as_str().is_some_and(|s| s.to_lowercase().contains(q)))
            })
        });
        q_ok && self.filters.iter().all(|(i, want)| {
            let got = row.pointer(self.spec.filters[*i].pointer);
            match (got, want) {
                (Some(Value::Number(n)), Value::String(w)) => n.to_string() == *w,
                (Some(g), w) => g == w,
                (None, _) => false,
            }
        })
    }

    /// The paged answer over `rows` (the list's rows, as JSON, in its
    /// order): `{"items", "next_cursor", "total"}`.
    pub fn answer(&self, rows: Vec<Value>) -> Value {
        let mut rows: Vec<Value> = rows.into_iter().filter(|r| self.keeps(r)).collect();
        if let Some((i, desc)) = self.sort {
            let key = self.spec.sorts[i];
            let mut keyed: Vec<(SortVal, Value)> = rows
                .into_iter()
                .map(|r| (SortVal::of(r.pointer(key.pointer), key.rank), r))
                .collect();
            keyed.sort_by(|a, b| {
                let o = a.0.order(&b.0);
                if desc { o.reverse() } else { o }
            });
            rows = keyed.into_iter().map(|(_, r)| r).collect();
        }
        let total = rows.len();
        let end = self.offset.saturating_add(self.limit).min(total);
        let items: Vec<Value> = if self.offset < total {
            rows.drain(self.offset..end).collect()
        } else {
            Vec::new()
        };
        let next_cursor = (end < total).then(|| self.encode_cursor(end));
        json!({"items": items, "next_cursor": next_cursor, "total": total})
    }
}

/// `rows` as JSON values, for [`PageQuery::answer`].
pub fn rows_json<T: serde::Serialize>(rows: &[T]) -> Result<Vec<Value>, ApiError> {
    rows.iter()
        .map(|r| {
            serde_json::to_value(r).map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    code::INTERNAL,
                    format!("cannot encode a row: {e}"),
                )
            })
        })
        .collect()
}

/// The values at `pointer` in `row`, a `*` segment standing for every
/// element of an array.
fn values_at<'a>(row: &'a Value, pointer: &str) -> Vec<&'a Value> {
    let mut at = vec![row];
    for seg in pointer.split('/').skip(1) {
        at = at
            .into_iter()
            .flat_map(|v| -> Vec<&Value> {
                match (seg, v) {
                    ("*", Value::Array(a)) => a.iter().collect(),
                    (_, Value::Object(m)) => m.get(seg).into_iter().collect(),
                    (_, Value::Array(a)) => seg
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| a.get(i))
                        .into_iter()
                        .collect(),
                    _ => Vec::new(),
                }
            })
            .collect();
    }
    at
}

/// A row's sort value: absent or null first, then booleans, numbers, ranked
/// text and text (case-insensitive, then exact).
#[derive(Debug, PartialEq, PartialOrd)]
enum SortVal {
    Missing,
    Bool(bool),
    Num(f64),
    Rank(i64),
    Text(String, String),
}

impl SortVal {
    fn of(v: Option<&Value>, rank: Option<fn(&str) -> Option<i64>>) -> SortVal {
        match v {
            None | Some(Value::Null) => SortVal::Missing,
            Some(Value::Bool(b)) => SortVal::Bool(*b),
            Some(Value::Number(n)) => SortVal::Num(n.as_f64().unwrap_or(0.0)),
            Some(Value::String(s)) => match rank.and_then(|r| r(s)) {
                Some(r) => SortVal::Rank(r),
                None => SortVal::Text(s.to_lowercase(), s.clone()),
            },
            Some(other) => SortVal::Text(other.to_string(), other.to_string()),
        }
    }

    fn order(&self, other: &SortVal) -> Ordering {
        self.partial_cmp(other).unwrap_or(Ordering::Equal)
    }
}

/// FNV-1a, 64 bits: a stable checksum (not a secret; a cursor is not a
/// capability, only a page of what the caller may list anyway).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 300 plugin-like rows: `p000` … `p299`, every 7th failed, every 3rd
    /// approved, one of them (`p123`) with the tool `needle_tool`.
    fn plugins() -> Vec<Value> {
        (0..300)
            .map(|i| {
                let dialect = ["native", "mcp", "vai"][i % 3];
                let tools = if i == 123 {
                    vec!["needle_tool".to_owned()]
                } else {
                    vec![format!("p{i:03}_t")]
                };
                json!({
                    "id": format!("p{i:03}"),
                    "dialect": dialect,
                    "state": if i % 7 == 0 { "failed" } else { "running" },
                    "approved": i % 3 == 0,
                    "version": null,
                    "tools": tools,
                    "restarts": (i * 37) % 11,
                    "error": null,
                })
            })
            .collect()
    }

    fn query(s: &str) -> PageQuery {
        PageQuery::parse(PLUGINS, Some(s)).unwrap()
    }

    #[test]
    fn no_parameter_keeps_the_bare_answer_and_any_asks_for_pages() {
        assert!(!PageQuery::parse(PLUGINS, None).unwrap().paged());
        assert!(!PageQuery::parse(PLUGINS, Some("")).unwrap().paged());
        for s in [
            "q=x",
            "limit=5",
            "sort=-id",
            "state=failed",
            "approved=true",
        ] {
            assert!(query(s).paged(), "{s}");
        }
        // The older filters alone keep the bare answer.
        let t = PageQuery::parse(TOOLS, Some("all=true")).unwrap();
        assert!(!t.paged());
        assert_eq!(t.own("all"), Some("true"));
        let b = PageQuery::parse(BINDINGS, Some("status=active&org_id=o%5F1")).unwrap();
        assert!(!b.paged());
        assert_eq!(b.own_raw(), "status=active&org_id=o%5F1");
        assert!(PageQuery::parse(PACKAGES, Some("org=o1")).unwrap().paged());
    }

    #[test]
    fn pages_reach_the_last_one_with_every_row_exactly_once() {
        let rows = plugins();
        for (limit, sort) in [(7, ""), (50, "&sort=-restarts"), (500, "&sort=id"), (1, "")] {
            let mut seen = Vec::new();
            let mut cursor: Option<String> = None;
            let mut pages = 0;
            loop {
                let mut s = format!("limit={limit}{sort}");
                if let Some(c) = &cursor {
                    s.push_str(&format!("&cursor={c}"));
                }
                let page = query(&s).answer(rows.clone());
                pages += 1;
                assert_eq!(page["total"], 300);
                let items = page["items"].as_array().unwrap();
                assert!(items.len() <= limit && !items.is_empty());
                seen.extend(items.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
            assert_eq!(pages, 300_usize.div_ceil(limit), "limit {limit}");
            let mut unique = seen.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(
                (seen.len(), unique.len()),
                (300, 300),
                "limit {limit}{sort}"
            );
        }
    }

    #[test]
    fn search_and_filters_find_one_row_among_many() {
        let rows = plugins();
        let page = query("q=NEEDLE").answer(rows.clone());
        assert_eq!(page["total"], 1);
        assert_eq!(page["items"][0]["id"], "p123");
        assert_eq!(page["next_cursor"], Value::Null);
        let page = query("q=p12&limit=500").answer(rows.clone());
        // p120..p129 (by id and by tool, each counted once).
        assert_eq!(page["total"], 10);
        // failed (every 7th: 43) and approved (every 3rd): every 21st, 15.
        let page = query("state=failed&approved=true&limit=500").answer(rows.clone());
        assert_eq!(page["total"], 15);
        assert!(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["state"] == "failed" && r["approved"] == true)
        );
        let page = query("state=failed&dialect=mcp&q=p28").answer(rows.clone());
        assert_eq!(
            (page["total"].clone(), page["items"][0]["id"].clone()),
            (json!(1), json!("p280"))
        );
        let page = query("dialect=vai&state=failed").answer(rows);
        // i % 3 == 2 and i % 7 == 0: i ≡ 14 (mod 21), 14 of them under 300.
        assert_eq!(page["total"], 14);
    }

    #[test]
    fn sort_orders_by_the_key_and_keeps_ties_in_list_order() {
        let rows = plugins();
        let page = query("sort=-id&limit=3").answer(rows.clone());
        let ids: Vec<&str> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["p299", "p298", "p297"]);
        let page = query("sort=restarts&limit=500").answer(rows);
        let r: Vec<u64> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["restarts"].as_u64().unwrap())
            .collect();
        assert!(r.windows(2).all(|w| w[0] <= w[1]));
        let tools = vec![
            json!({"name": "a", "risk": "high"}),
            json!({"name": "b", "risk": "low"}),
            json!({"name": "c", "risk": "critical"}),
            json!({"name": "d", "risk": "medium"}),
        ];
        let page = PageQuery::parse(TOOLS, Some("sort=-risk"))
            .unwrap()
            .answer(tools);
        let names: Vec<&str> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["c", "a", "d", "b"]);
    }

    #[test]
    fn a_tampered_or_foreign_cursor_and_bad_parameters_are_400() {
        let rows = plugins();
        let first = query("limit=10&state=running").answer(rows);
        let c = first["next_cursor"].as_str().unwrap().to_owned();
        assert!(
            PageQuery::parse(PLUGINS, Some(&format!("limit=10&state=running&cursor={c}"))).is_ok()
        );
        // Another page size is fine: the cursor is bound to the query, not the size.
        assert!(
            PageQuery::parse(PLUGINS, Some(&format!("limit=20&state=running&cursor={c}"))).is_ok()
        );
        let mut flipped = c.clone().into_bytes();
        flipped[15] = if flipped[15] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        for bad in [
            format!("state=running&cursor={flipped}"),
            format!("state=failed&cursor={c}"),
            format!("cursor={c}"),
            "cursor=abc".to_owned(),
            "cursor=".to_owned(),
            "limit=0".to_owned(),
            "limit=501".to_owned(),
            "limit=x".to_owned(),
            "sort=nope".to_owned(),
            "sort=-".to_owned(),
            "approved=yes".to_owned(),
            "frobnicate=1".to_owned(),
            "q=a&q=b".to_owned(),
            "q=%zz".to_owned(),
        ] {
            let e = PageQuery::parse(PLUGINS, Some(&bad)).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::BAD_REQUEST, "bad_request"),
                "{bad}"
            );
        }
        let e = PageQuery::parse(PLUGINS, Some("sort=nope")).unwrap_err();
        assert!(e.message.contains("restarts"), "{}", e.message);
        assert!(PageQuery::parse(TOOLS, Some("state=x")).is_err());
    }

    #[test]
    fn wildcard_pointers_search_arrays_of_objects() {
        let row =
            json!({"exports": [{"id": "jira_search"}, {"id": "b"}], "package_id": "acme/kit"});
        let q = PageQuery::parse(PACKAGES, Some("q=JIRA")).unwrap();
        assert!(q.keeps(&row));
        let q = PageQuery::parse(PACKAGES, Some("q=zzz")).unwrap();
        assert!(!q.keeps(&row));
        let signed = json!({"signature": {"status": "verified"}});
        assert!(
            PageQuery::parse(PACKAGES, Some("signature=verified"))
                .unwrap()
                .keeps(&signed)
        );
        assert!(
            !PageQuery::parse(PACKAGES, Some("signature=unsigned"))
                .unwrap()
                .keeps(&signed)
        );
    }
}
