//! The operator console in a real browser (issue 15): a real `plugd serve
//! --listen 127.0.0.1:0` with real plugins, and headless Chromium driven
//! through chromedriver (crate::browser); every test also checks in the
//! browser's network log that no request left loopback.

use serde_json::Value;

use crate::browser::Browser;
use crate::http::Serve;
use crate::support::Ws;

/// The harness itself, on a page serve has without the console: the browser
/// shows `/healthz`'s JSON, the performance log lists that one request (to
/// loopback) with its body, and screenshots are PNGs of the viewport's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_harness_reads_healthz_and_its_network_log() {
    let ws = Ws::new();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let b = Browser::start().await;
    let url = format!("http://{}/healthz", serve.addr);
    b.goto(&url).await;
    let text = b.wait_text("body", |t| t.contains("status")).await;
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["status"], "ok", "{text}");

    let requests = b.assert_only_loopback(serve.addr).await;
    let health: Vec<_> = requests.iter().filter(|r| r.url == url).collect();
    assert_eq!(health.len(), 1, "{requests:#?}");
    assert_eq!(health[0].method, "GET");
    assert_eq!(health[0].status, Some(200), "{requests:#?}");
    let bodies = b.response_bodies().await;
    let body = bodies
        .iter()
        .find(|(u, _)| *u == url)
        .unwrap_or_else(|| panic!("no body for {url}: {bodies:?}"));
    let v: Value = serde_json::from_str(&body.1).unwrap();
    assert_eq!(v["status"], "ok");

    // A request to another host would be caught: the check is not vacuous.
    let other = b.js(
        "return fetch('http://127.0.0.2:9/x').then(() => 'sent', () => 'failed');",
        vec![],
    )
    .await;
    assert!(other == "failed" || other == "sent", "{other}");
    let all = b.requests().await;
    assert!(
        all.iter().any(|r| r.url == "http://127.0.0.2:9/x"),
        "the log missed a fetch: {all:#?}"
    );

    for (w, h) in [(1280u32, 800u32), (390, 844)] {
        b.viewport(w, h, w < 500).await;
        let png = b
            .screenshot_to(&b.scratch().join(format!("healthz-{w}.png")))
            .await;
        let (pw, ph) = png_size(&png);
        assert_eq!((pw, ph), (w, h), "screenshot of a {w}x{h} viewport");
    }
    b.close().await;
}

/// Width and height of a PNG (its IHDR chunk).
pub(crate) fn png_size(png: &[u8]) -> (u32, u32) {
    let be = |i: usize| u32::from_be_bytes(png[i..i + 4].try_into().unwrap());
    assert_eq!(&png[12..16], b"IHDR");
    (be(16), be(20))
}
