//! The endpoints the operator console needs (issue 15): a plugin's settings
//! form and its whole-form update, its stderr log (tail and follow), tool
//! enable/disable, and one SSE stream of live changes.
//!
//! | method and path | role | answer |
//! |---|---|---|
//! | `GET /v1/plugins/{id}/config` | viewer | the settings form ([`SettingsForm`]); secrets as `value: null` plus `set` |
//! | `PUT /v1/plugins/{id}/config` | operator | `{"values": {KEY: VALUE or null}}` → all validated, stored together, applied once; the form plus `applied`; 422 `invalid_config` with `details.problems` and nothing stored |
//! | `GET /v1/plugins/{id}/logs` | viewer | `{"plugin", "lines": [{"at", "line"}], "dropped"}` (`?limit=` 1–1000, default 200); SSE `event: log` with `Accept: text/event-stream` |
//! | `POST /v1/tools/{name}:enable`, `:disable` | operator | the tool row plus `changed` |
//! | `GET /v1/events` | viewer | SSE: `plugin`, `tools`, `approvals`, `invocation`, `lagged` |
//!
//! Setting values cross HTTP only in the body of the `PUT` (authenticated,
//! operator only); neither tracing nor the audit trail records bodies, and
//! a problem message never repeats a secret.
//!
//! Streams are bounded: each follower reads a broadcast channel
//! ([`plugd_host::log_ring::FOLLOW_QUEUE`], [`plugd_runtime::events::EVENT_QUEUE`]);
//! one that falls behind gets `event: lagged` with how many it skipped (the
//! page refetches) instead of a growing buffer.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use plugd_host::log_ring::{LogLine, RING_LINES};
use plugd_runtime::PluginRow;
use plugd_runtime::events::RtEvent;
use plugd_runtime::settings_form::{PutError, SettingsForm};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{ApiError, AppState, JsonBody, auth, error};

/// Lines of `GET /v1/plugins/{id}/logs` without `?limit=`.
pub const DEFAULT_LOG_LINES: usize = 200;

/// The SSE keep-alive interval.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What a `GET /v1/plugins/{*rest}` asks for.
pub(crate) enum PluginGet<'a> {
    /// The plugin itself.
    Show(&'a str),
    /// Its settings form.
    Config(&'a str),
    /// Its stderr log.
    Logs(&'a str),
}

/// Splits `rest` into a plugin id and what is asked of it. Ids may contain
/// `/`, so a whole path that is a plugin id wins over a `/config` or
/// `/logs` suffix.
pub(crate) fn split_get<'a>(state: &AppState, rest: &'a str) -> PluginGet<'a> {
    if state.runtime.supervised(rest).is_ok() {
        return PluginGet::Show(rest);
    }
    if let Some(id) = rest.strip_suffix("/config").filter(|i| !i.is_empty()) {
        return PluginGet::Config(id);
    }
    if let Some(id) = rest.strip_suffix("/logs").filter(|i| !i.is_empty()) {
        return PluginGet::Logs(id);
    }
    PluginGet::Show(rest)
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        error::code::INTERNAL,
        format!("cannot encode {what}: {e}"),
    )
}

/// `GET /v1/plugins/{id}/config`.
pub(crate) async fn config_get(state: &AppState, id: &str) -> Result<Response, ApiError> {
    Ok(Json(state.runtime.config_form(id).await?).into_response())
}

/// `PUT /v1/plugins/{*rest}`: only `{id}/config`, body `{"values": {KEY:
/// VALUE or null}}`. The shape is checked by hand so that no error message
/// repeats a value sent (a secret in the wrong place).
pub(crate) async fn plugin_put(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    method: Method,
    uri: Uri,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Value>, ApiError> {
    let Some(id) = rest.strip_suffix("/config").filter(|i| !i.is_empty()) else {
        return Err(ApiError::no_route(method.as_str(), uri.path()));
    };
    let shape = || {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            error::code::INVALID_BODY,
            "the body must be {\"values\": {KEY: VALUE or null, …}}: an object with only \"values\", itself an object",
        )
    };
    let values = match body {
        Value::Object(mut map) if map.len() == 1 => match map.remove("values") {
            Some(Value::Object(values)) => values,
            _ => return Err(shape()),
        },
        _ => return Err(shape()),
    };
    let (form, applied) = match state.runtime.config_put(id, &values).await {
        Ok(r) => r,
        Err(PutError::Invalid { plugin, problems }) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                error::code::INVALID_CONFIG,
                format!(
                    "plugin {plugin:?} settings: {} invalid, nothing was stored: {}",
                    if problems.len() == 1 {
                        "1 value is".to_owned()
                    } else {
                        format!("{} values are", problems.len())
                    },
                    problems
                        .iter()
                        .map(|p| format!("{}: {}", p.key, p.message))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            )
            .with_details(json!({ "problems": problems })));
        }
        Err(PutError::Runtime(e)) => return Err(e.into()),
        Err(e) => return Err(internal("the settings", e)),
    };
    let mut out = form_value(&form)?;
    if let Some(map) = out.as_object_mut() {
        map.insert("applied".into(), json!(applied));
    }
    Ok(Json(out))
}

fn form_value(form: &SettingsForm) -> Result<Value, ApiError> {
    serde_json::to_value(form).map_err(|e| internal("the settings form", e))
}

/// `?limit=N` (1..=1000, default 200).
fn log_limit(query: Option<&str>) -> Result<usize, ApiError> {
    let mut limit = DEFAULT_LOG_LINES;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "limit" {
            limit = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=RING_LINES).contains(n))
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        error::code::BAD_REQUEST,
                        format!("limit={v:?} is not a number from 1 to {RING_LINES}"),
                    )
                })?;
        }
    }
    Ok(limit)
}

fn line_json(l: &LogLine) -> Value {
    json!({
        "at": plugd_control::invocations::rfc3339_ms(i64::try_from(l.at_ms).unwrap_or(i64::MAX)),
        "line": &*l.line,
    })
}

/// `GET /v1/plugins/{id}/logs`.
pub(crate) fn logs(
    state: &AppState,
    id: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let limit = log_limit(query)?;
    let ring = state.runtime.supervised(id)?.log().clone();
    if !crate::wants_sse(headers) {
        let (lines, dropped) = ring.tail(limit);
        return Ok(Json(json!({
            "plugin": id,
            "lines": lines.iter().map(line_json).collect::<Vec<_>>(),
            "dropped": dropped,
        }))
        .into_response());
    }
    let (tail, rx) = ring.follow(limit);
    let first = futures_util::stream::iter(
        tail.into_iter()
            .map(|l| Ok::<_, Infallible>(log_event(&l)))
            .collect::<Vec<_>>(),
    );
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        let event = match rx.recv().await {
            Ok(l) => log_event(&l),
            Err(RecvError::Lagged(n)) => lagged(n),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(event), rx))
    });
    Ok(sse(futures_util::StreamExt::chain(first, rest)))
}

fn log_event(l: &LogLine) -> Event {
    Event::default().event("log").data(line_json(l).to_string())
}

fn lagged(n: u64) -> Event {
    Event::default()
        .event("lagged")
        .data(json!({ "skipped": n }).to_string())
}

fn sse<S: Stream<Item = Result<Event, Infallible>> + Send + 'static>(stream: S) -> Response {
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("ping"))
        .into_response()
}

/// `POST /v1/tools/{name}:enable|disable`.
pub(crate) async fn set_enabled(
    state: &AppState,
    name: &str,
    enabled: bool,
    who: &auth::Identity,
) -> Result<Json<Value>, ApiError> {
    let (view, changed) = state
        .runtime
        .set_tool_enabled(name, enabled, who.by())
        .await?;
    let mut row = serde_json::to_value(&view).map_err(|e| internal("the tool row", e))?;
    if let Some(map) = row.as_object_mut() {
        map.insert("changed".into(), Value::Bool(changed));
    }
    Ok(Json(row))
}

/// `GET /v1/events`.
pub(crate) async fn events(State(state): State<AppState>) -> Response {
    let rx = state.runtime.subscribe_events();
    let pending = state
        .runtime
        .pending_approvals()
        .await
        .map_or(0, |p| p.len());
    let first = futures_util::stream::iter([Ok::<_, Infallible>(
        Event::default()
            .event("approvals")
            .data(json!({ "pending": pending }).to_string()),
    )]);
    let rt = state.runtime.clone();
    let rest = futures_util::stream::unfold((rx, rt), |(mut rx, rt)| async move {
        loop {
            let event = match rx.recv().await {
                Ok(ev) => match translate(&rt, &ev).await {
                    Some(e) => e,
                    None => continue,
                },
                Err(RecvError::Lagged(n)) => lagged(n),
                Err(RecvError::Closed) => return None,
            };
            return Some((Ok::<_, Infallible>(event), (rx, rt)));
        }
    });
    sse(futures_util::StreamExt::chain(first, rest))
}

/// The SSE event of one runtime change, read as it is now (`None`: nothing
/// to say, e.g. a plugin row that cannot be read).
async fn translate(rt: &plugd_runtime::Runtime, ev: &RtEvent) -> Option<Event> {
    let (kind, data) = match ev {
        RtEvent::Plugin(id) => {
            let info = rt.plugin_brief(id).await.ok()?;
            ("plugin", serde_json::to_value(PluginRow::live(&info)).ok()?)
        }
        RtEvent::Tools => ("tools", json!({})),
        RtEvent::Approvals(n) => ("approvals", json!({ "pending": n })),
        RtEvent::Invocation(r) => ("invocation", serde_json::to_value(&**r).ok()?),
        _ => return None,
    };
    Some(Event::default().event(kind).data(data.to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::Request;
    use futures_util::StreamExt;
    use plugd_agent::hooks::build::build_pipeline;
    use plugd_host::HostConfig;
    use plugd_runtime::config::PlugdConfig;
    use plugd_runtime::events::EVENT_QUEUE;
    use tower::ServiceExt;

    use super::*;
    use crate::{AppState, auth, router};

    /// The next SSE frame of `body` (skipping keep-alive comments).
    async fn frame(body: &mut axum::body::BodyDataStream) -> String {
        loop {
            let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
                .await
                .expect("a frame in time")
                .expect("the stream goes on")
                .unwrap();
            let text = String::from_utf8_lossy(&chunk).into_owned();
            if !text.starts_with(':') {
                return text;
            }
        }
    }

    #[tokio::test]
    async fn an_events_client_that_does_not_read_skips_instead_of_buffering() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = plugd_agent::open(tmp.path(), HostConfig::default())
            .await
            .unwrap();
        let config = PlugdConfig::load(tmp.path()).unwrap();
        let pipeline = Arc::new(build_pipeline(&config, &rt).await.unwrap());
        let app = router(AppState::new(rt.clone(), pipeline, Arc::new(config), None));
        let mut req = Request::get("/v1/events").body(Body::empty()).unwrap();
        req.extensions_mut().insert(auth::Peer::local_owner());
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body().into_data_stream();
        assert_eq!(
            frame(&mut body).await,
            "event: approvals\ndata: {\"pending\":0}\n\n"
        );
        // Far more events than the channel holds, while the body is not read.
        let sent = EVENT_QUEUE * 3;
        for _ in 0..sent {
            rt.plugin_changed("gone");
        }
        assert_eq!(
            frame(&mut body).await,
            format!(
                "event: lagged\ndata: {{\"skipped\":{}}}\n\n",
                sent - EVENT_QUEUE
            )
        );
    }
}
