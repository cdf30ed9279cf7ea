//! The page's files, compiled into the binary (no CDN, nothing fetched at
//! run time), and the headers they are served with.

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The app shell: every console URL answers with it; the script routes.
pub const INDEX_HTML: &str = include_str!("../assets/index.html");
/// The whole front end, an ES module with no dependencies.
pub const APP_JS: &str = include_str!("../assets/app.js");
/// The style sheet.
pub const APP_CSS: &str = include_str!("../assets/app.css");
/// The favicon (so the browser does not ask for `/favicon.ico`).
pub const ICON_SVG: &str = include_str!("../assets/icon.svg");

/// The console's Content-Security-Policy: its own scripts and styles only,
/// no inline code, no framing, requests to this origin only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; manifest-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Serves `body` as `content_type` with the console's security headers.
pub fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Assets change with the binary; the browser asks again each time.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    page("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    page("text/css; charset=utf-8", APP_CSS)
}

async fn icon() -> Response {
    page("image/svg+xml", ICON_SVG)
}

/// The routes of the page and its assets (public: they hold no data).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/login", get(index))
        .route("/console/assets/app.js", get(app_js))
        .route("/console/assets/app.css", get(app_css))
        .route("/console/assets/icon.svg", get(icon))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_code_and_loads_only_its_own_assets() {
        assert!(INDEX_HTML.contains(r#"src="/console/assets/app.js""#));
        assert!(INDEX_HTML.contains(r#"href="/console/assets/app.css""#));
        // CSP forbids inline scripts and styles: the shell must not need them.
        assert!(!INDEX_HTML.contains("<script>"), "no inline script");
        assert!(!INDEX_HTML.contains("style="), "no inline style");
        assert!(!INDEX_HTML.contains("<style"), "no style element");
        // The SVG namespace is a name the DOM needs, never fetched: the one
        // absolute URL allowed, once.
        const SVG_NS: &str = "'http://www.w3.org/2000/svg'";
        assert_eq!(APP_JS.matches(SVG_NS).count(), 1);
        let app_js = APP_JS.replacen(SVG_NS, "", 1);
        for text in [INDEX_HTML, app_js.as_str(), APP_CSS] {
            assert!(
                !text.contains("http://") && !text.contains("https://"),
                "no absolute URL: nothing is fetched from elsewhere"
            );
        }
        // The script builds no HTML from strings (XSS through plugin data).
        assert!(
            !APP_JS.contains("innerHTML"),
            "the page sets text, never HTML"
        );
        assert!(!APP_JS.contains("eval("), "no eval");
    }
}
