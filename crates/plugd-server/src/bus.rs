//! The bus over HTTP: `POST /v1/bus/publish` and `GET /v1/bus/tail/{pattern}`
//! (server-sent events), what `plugd bus publish|tail` use.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use plugd_host::bus::{Event, check_pattern, topic_matches};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ApiError, AppState, JsonBody, error};

/// Events a tail may fall behind before it sheds.
const TAIL_DEPTH: usize = 1024;

/// `POST /v1/bus/publish` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// The subject (no wildcards).
    pub subject: String,
    /// What the event carries.
    #[serde(default)]
    pub payload: Value,
    /// Who publishes (default `operator`).
    #[serde(default)]
    pub source: Option<String>,
    /// The session it belongs to.
    #[serde(default)]
    pub session_id: Option<String>,
}

fn bad_subject(e: &plugd_host::bus::SubjectError) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        error::code::BAD_REQUEST,
        e.to_string(),
    )
}

/// Publishes one event; answers `{event, delivered, shed}`.
///
/// An `agent` token publishes only on subjects plugd.yaml grants to it
/// (`broker.grants."token:NAME".publish`), and always as itself (`source`
/// is its identity); admins publish anywhere, as any source.
pub(crate) async fn publish(
    State(state): State<AppState>,
    axum::Extension(who): axum::Extension<crate::auth::Identity>,
    JsonBody(body): JsonBody<PublishRequest>,
) -> Result<Json<Value>, ApiError> {
    let source = if who.role == plugd_store::tokens::Role::Admin {
        body.source.unwrap_or_else(|| "operator".into())
    } else {
        let granted = state
            .config
            .broker
            .grants
            .get(&who.name)
            .is_some_and(|g| g.publish.iter().any(|p| topic_matches(p, &body.subject)));
        if !granted {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                error::code::FORBIDDEN,
                format!(
                    "{} may not publish on {:?}: grant it in plugd.yaml broker.grants.\"{}\".publish",
                    who.name, body.subject, who.name
                ),
            ));
        }
        who.name.clone()
    };
    let mut event = Event::new(body.subject, source, body.payload);
    event.session_id = body.session_id;
    let (event, published) = state.runtime.publish(event).map_err(|e| bad_subject(&e))?;
    Ok(Json(json!({
        "event": event,
        "delivered": published.delivered,
        "shed": published.shed,
    })))
}

/// Streams every event matching `pattern` as SSE `event: bus` with the event
/// as JSON, until the client goes away.
pub(crate) async fn tail(
    State(state): State<AppState>,
    Path(pattern): Path<String>,
) -> Result<Response, ApiError> {
    check_pattern(&pattern).map_err(|e| bad_subject(&e))?;
    let sub = state
        .runtime
        .bus()
        .subscribe(&pattern, TAIL_DEPTH)
        .map_err(|e| bad_subject(&e))?;
    let stream = futures_util::stream::unfold(sub, |mut sub| async move {
        let event = sub.recv().await?;
        let data = serde_json::to_string(&event).unwrap_or_default();
        Some((
            Ok::<_, Infallible>(SseEvent::default().event("bus").data(data)),
            sub,
        ))
    });
    // A comment first, so a client sees the subscription is in place.
    let ready = futures_util::stream::once(async {
        Ok::<_, Infallible>(SseEvent::default().comment("subscribed"))
    });
    use futures_util::StreamExt as _;
    Ok(Sse::new(ready.chain(stream))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// `GET /metrics`: per-plugin counters in the Prometheus text format.
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let plugins = state.runtime.plugins().await.unwrap_or_default();
    let mut out = String::new();
    let mut family = |name: &str, help: &str, rows: &[(String, u64)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (plugin, v) in rows {
            out.push_str(&format!("{name}{{plugin=\"{}\"}} {v}\n", label(plugin)));
        }
    };
    let peer = |f: fn(&plugd_host::PeerStats) -> u64| -> Vec<(String, u64)> {
        plugins
            .iter()
            .filter_map(|p| p.stats.as_ref().map(|s| (p.id.clone(), f(s))))
            .collect()
    };
    let broker = |f: fn(&plugd_host::native_host::BrokerStats) -> u64| -> Vec<(String, u64)> {
        plugins
            .iter()
            .filter_map(|p| p.broker.as_ref().map(|s| (p.id.clone(), f(s))))
            .collect()
    };
    family(
        "plugd_notifications_shed_total",
        "Notifications to the plugin shed because its queue was full.",
        &peer(|s| s.shed_notifications),
    );
    family(
        "plugd_junk_frames_total",
        "Lines from the plugin that were not JSON-RPC.",
        &peer(|s| s.junk_frames),
    );
    family(
        "plugd_oversized_frames_total",
        "Frames from the plugin refused for their size.",
        &peer(|s| s.oversized_frames),
    );
    family(
        "plugd_broker_published_total",
        "Events the plugin published on the bus.",
        &broker(|s| s.published),
    );
    family(
        "plugd_broker_dropped_total",
        "Publishes of the plugin dropped (outside its allowlist or malformed).",
        &broker(|s| s.dropped),
    );
    family(
        "plugd_broker_delivered_total",
        "Bus events delivered to the plugin.",
        &broker(|s| s.delivered),
    );
    family(
        "plugd_broker_shed_total",
        "Bus events for the plugin shed because its queue was full.",
        &broker(|s| s.shed),
    );
    for (name, help, v) in [
        (
            "plugd_log_lines_dropped_total",
            "Log lines serve dropped because its stderr was not read fast enough.",
            plugd_host::log_stats::log_lines_dropped(),
        ),
        (
            "plugd_stderr_lines_suppressed_total",
            "Plugin stderr lines not logged because the plugin exceeded its log budget.",
            plugd_host::log_stats::stderr_lines_suppressed(),
        ),
    ] {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
        ));
    }
    for (name, help, v) in state.runtime.bus().node_counters() {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
        ));
    }
    crate::channels::metrics(&mut out, &state.runtime.channel_stats());
    crate::invocations::metrics(&mut out, state.runtime.invocations().stats());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

pub(crate) fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
