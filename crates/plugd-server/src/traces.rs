//! The span of each HTTP request (OpenTelemetry, see `plugd-telemetry`):
//! `METHOD ROUTE`, a server span that continues the trace of an incoming
//! `traceparent` header, with the method, route pattern and status; a 5xx
//! answer marks it as an error. With traces off at start-up the router has
//! no such layer ([`crate::router`]).

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// Middleware: runs the rest of the stack (auth included) inside the span.
pub async fn trace_request(req: Request, next: Next) -> Response {
    if !plugd_telemetry::enabled() {
        return next.run(req).await;
    }
    let method = req.method().as_str().to_owned();
    // The pattern, not the path: ids and tool names stay out of span names.
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let headers = req.headers().clone();
    plugd_telemetry::http_request(&method, &route, &headers, next.run(req)).await
}
