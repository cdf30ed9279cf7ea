//! The audit trail over HTTP: `GET /v1/audit`, the state-changing requests
//! [`crate::auth`] recorded (identity, role, method, path, status), newest
//! first, for the console's audit page. Admin only (a viewer gets 403
//! `forbidden`; an org token 404); reading it is not itself audited.
//!
//! Query: `limit` (1 to 500, default 50), `cursor` (the previous page's
//! `next_cursor`), `identity` (exactly, `token:NAME` or a Unix user), `q`
//! (a case-insensitive substring of the identity, the method or the path),
//! `status` (`404`, or a class: `2xx`, `4xx`, `5xx`), `since` and `until`
//! (RFC 3339 UTC or a date, as `GET /v1/invocations` takes them; entries
//! are stamped to the second). Answer: `{"entries": [{"seq", "at",
//! "identity", "role", "method", "path", "status"}], "next_cursor":
//! str|null}`. Pages are keyed by `seq`, so none repeats or skips an entry
//! while new ones arrive.
//!
//! Errors: an unknown or repeated parameter, a bad `limit`, `status`,
//! time or cursor → 400 `bad_request`.

use axum::extract::{RawQuery, State};
use axum::routing::get;
use axum::{Json, Router};
use plugd_control::store::tokens::{MAX_AUDIT_PAGE, parse_audit_cursor};
use plugd_store::tokens::{AuditFilter, AuditPage, StatusMatch};

use crate::invocations::{bad, decode, time};
use crate::{ApiError, AppState};

/// Entries on a page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 50;

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/v1/audit", get(list))
}

/// The store filter `query` asks for.
pub fn filter(query: &str) -> Result<AuditFilter, ApiError> {
    let mut f = AuditFilter {
        limit: DEFAULT_LIMIT,
        ..AuditFilter::default()
    };
    let mut seen: Vec<String> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (decode(k)?, decode(v)?);
        if seen.contains(&k) {
            return Err(bad(format!("query parameter {k:?} is given twice")));
        }
        seen.push(k.clone());
        match k.as_str() {
            "limit" => {
                f.limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_AUDIT_PAGE).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "limit={v:?} is out of range; use 1 to {MAX_AUDIT_PAGE}"
                        ))
                    })?;
            }
            "cursor" => f.before_seq = Some(parse_audit_cursor(&v).map_err(bad)?),
            "identity" => f.identity = Some(v),
            "q" => f.q = Some(v).filter(|q| !q.is_empty()),
            "status" => f.status = Some(v.parse::<StatusMatch>().map_err(bad)?),
            "since" => f.since_ms = time("since", Some(v))?,
            "until" => f.until_ms = time("until", Some(v))?,
            other => {
                return Err(bad(format!(
                    "unknown query parameter {other:?}; the parameters are limit, cursor, identity, q, status, since and until"
                )));
            }
        }
    }
    Ok(f)
}

async fn list(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<AuditPage>, ApiError> {
    let f = filter(query.as_deref().unwrap_or(""))?;
    Ok(Json(
        state
            .runtime
            .state()
            .audit_page(&f)
            .await
            .map_err(crate::packages::store_error)?,
    ))
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[test]
    fn a_query_becomes_an_audit_filter_or_a_400() {
        let f =
            filter("limit=10&status=4xx&q=TOKENS&identity=token%3Aci&since=2026-01-01").unwrap();
        assert_eq!(f.limit, 10);
        assert_eq!(f.status, Some(StatusMatch::Class(4)));
        assert_eq!(
            (f.q.as_deref(), f.identity.as_deref()),
            (Some("TOKENS"), Some("token:ci"))
        );
        assert_eq!(f.since_ms, Some(1_767_225_600_000));
        assert_eq!(filter("").unwrap().limit, DEFAULT_LIMIT);
        assert_eq!(
            filter("status=201").unwrap().status,
            Some(StatusMatch::Exact(201))
        );
        let c = plugd_control::store::tokens::audit_cursor(77);
        assert_eq!(filter(&format!("cursor={c}")).unwrap().before_seq, Some(77));
        for bad in [
            "limit=0",
            "limit=501",
            "status=6xx",
            "status=20",
            "status=ok",
            "cursor=77",
            "cursor=azz",
            "since=yesterday",
            "until=2026-01-01T00:00:00",
            "who=me",
            "q=a&q=b",
        ] {
            let e = filter(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
