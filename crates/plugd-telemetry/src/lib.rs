//! plugd's OpenTelemetry traces: an OTLP/HTTP (protobuf) exporter configured
//! by the standard `OTEL_*` variables, the spans plugd opens (HTTP request,
//! agent turn, hook handler, tool call, plugin round trip) and W3C Trace
//! Context in and out (`traceparent`, `tracestate`).
//!
//! **Off unless asked**: with neither `OTEL_EXPORTER_OTLP_ENDPOINT` nor
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, [`Telemetry::from_env`] installs
//! nothing (no exporter, no batch thread) and every helper here is one
//! relaxed atomic load and then the plain future.
//!
//! Spans are made with the OpenTelemetry API directly, not through the
//! `tracing` bridge: plugd's log lines stay as they are, and the span of a
//! call is carried by its future ([`in_span`]), so a dialect reads the
//! current trace with [`trace_id`] and [`traceparent`] while it runs.

mod export;

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_sdk::propagation::TraceContextPropagator;

pub use export::{Telemetry, TelemetryError};

/// The instrumentation scope of every plugd span.
const SCOPE: &str = "plugd";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported (an OTLP endpoint was configured).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// What a span is about: its `plugd.*` attributes, each set when known.
#[derive(Debug, Default, Clone, Copy)]
pub struct Subject<'a> {
    /// `plugd.plugin.id`.
    pub plugin: Option<&'a str>,
    /// `plugd.dialect` (`native`, `mcp`, `vai`, …).
    pub dialect: Option<&'a str>,
    /// `plugd.export`: the tool (or hook, export) name.
    pub export: Option<&'a str>,
    /// `plugd.binding.id`: the binding a call resolved to, once calls
    /// resolve bindings.
    pub binding: Option<&'a str>,
}

impl Subject<'_> {
    fn attributes(&self) -> Vec<KeyValue> {
        [
            ("plugd.plugin.id", self.plugin),
            ("plugd.dialect", self.dialect),
            ("plugd.export", self.export),
            ("plugd.binding.id", self.binding),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some(KeyValue::new(k, v?.to_owned())))
        .collect()
    }
}

/// Runs `fut` inside a new internal span `name`, a child of the current one,
/// with `subject`'s attributes (computed only when traces are on); an `Err`
/// sets the span's status to error with the error's message.
pub async fn in_span<'s, T, E: Display>(
    name: &'static str,
    subject: impl FnOnce() -> Subject<'s>,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    if !enabled() {
        return fut.await;
    }
    let tracer = global::tracer(SCOPE);
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .with_attributes(subject().attributes())
        .start(&tracer);
    let cx = Context::current_with_span(span);
    let out = fut.with_context(cx.clone()).await;
    let span = cx.span();
    if let Err(e) = &out {
        span.set_status(Status::error(e.to_string()));
    }
    span.end();
    out
}

/// Runs `fut`, the handling of one HTTP request `method` on `route` (the
/// matched route pattern, not the path), inside a server span that continues
/// the trace of the request's `traceparent` header when it has a valid one;
/// `fut` answers with the status recorded on the span (5xx is an error).
pub async fn http_request<B>(
    method: &str,
    route: &str,
    headers: &http::HeaderMap,
    fut: impl Future<Output = http::Response<B>>,
) -> http::Response<B> {
    if !enabled() {
        return fut.await;
    }
    let parent =
        TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    let tracer = global::tracer(SCOPE);
    let span = tracer
        .span_builder(format!("{method} {route}"))
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("http.route", route.to_owned()),
        ])
        .start_with_context(&tracer, &parent);
    let cx = parent.with_span(span);
    let response = fut.with_context(cx.clone()).await;
    let span = cx.span();
    let status = response.status();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status.as_u16()),
    ));
    if status.is_server_error() {
        span.set_status(Status::error(status.to_string()));
    }
    span.end();
    response
}

/// The trace id of the current span as 32 lower-case hex digits (W3C),
/// when traces are on and a span is current.
pub fn trace_id() -> Option<String> {
    if !enabled() {
        return None;
    }
    let cx = Context::current();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The trace id (32 lower-case hex digits) of a W3C `traceparent` header
/// value (`00-<trace id>-<parent id>-<flags>`); `None` when it is not one
/// (wrong shape, upper-case or non-hex digits, an all-zero id). Pure string
/// work: the caller's trace is kept in invocation records whether traces are
/// exported or not.
pub fn trace_id_of(traceparent: &str) -> Option<String> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    // Version ff is invalid; version 00 has exactly four fields.
    let ok = hex(version, 2)
        && version != "ff"
        && (version != "00" || parts.next().is_none())
        && hex(trace, 32)
        && !zero(trace)
        && hex(parent, 16)
        && !zero(parent)
        && hex(flags, 2);
    ok.then(|| trace.to_owned())
}

/// A new random W3C trace id (32 lower-case hex digits, never all zero),
/// for a call whose caller sent none; no OpenTelemetry work.
///
/// Every call without a caller's trace takes one, so no system call per id:
/// each thread seeds a generator (SplitMix64) once from the OS and draws
/// from it. A trace id must be unique, not secret (W3C Trace Context §3.2.2.3
/// asks for randomness so that ids do not collide).
pub fn new_trace_id() -> String {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<Option<u64>> = const { Cell::new(None) };
    }
    let (hi, lo) = STATE.with(|state| {
        let mut x = state.get().unwrap_or_else(seed);
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let pair = (next(), next());
        state.set(Some(x));
        pair
    });
    // Never all zero (an invalid trace id).
    let id = (u128::from(hi) << 64 | u128::from(lo)).max(1);
    format!("{id:032x}")
}

/// A thread's first generator state: from the OS, else from the clock, a
/// process-wide counter and the thread (ids stay unique in this process).
fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_ok() && bytes != [0u8; 8] {
        return u64::from_le_bytes(bytes);
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ n.rotate_left(40) ^ u64::from(std::process::id()).rotate_left(20)
}

/// The W3C `traceparent` (and `tracestate`, when not empty) of the current
/// span, for a request leaving plugd; `None` when traces are off or no span
/// is current.
pub fn traceparent() -> Option<(String, Option<String>)> {
    if !enabled() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&Context::current(), &mut carrier);
    let parent = carrier.remove("traceparent")?;
    let state = carrier.remove("tracestate").filter(|s| !s.is_empty());
    Some((parent, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn off_means_no_span_and_no_context() {
        assert!(!enabled());
        let out: Result<u8, String> = in_span("x", Subject::default, async {
            assert_eq!(trace_id(), None);
            assert_eq!(traceparent(), None);
            Ok(7)
        })
        .await;
        assert_eq!(out, Ok(7));
    }

    #[test]
    fn traceparents_are_parsed_strictly() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            trace_id_of(&format!("00-{t}-00f067aa0ba902b7-01")).as_deref(),
            Some(t)
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(trace_id_of(bad), None, "{bad:?}");
        }
        let (a, b) = (new_trace_id(), new_trace_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(trace_id_of(&format!("00-{a}-00f067aa0ba902b7-01")).is_some());
    }

    #[test]
    fn subject_sets_only_what_is_known() {
        let s = Subject {
            plugin: Some("p"),
            export: Some("p/echo"),
            ..Subject::default()
        };
        let keys: Vec<String> = s.attributes().iter().map(|kv| kv.key.to_string()).collect();
        assert_eq!(keys, ["plugd.plugin.id", "plugd.export"]);
    }
}
