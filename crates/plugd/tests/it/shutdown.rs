//! `plugd serve` stopped (SIGTERM) with HTTP calls in flight: each gets an
//! answer, its result within the grace or a `503 shutting_down`, never an
//! empty reply; plugins are stopped only after that.

use std::time::Duration;

use serde_json::json;

use crate::http::{Serve, request_as};
use crate::mcp_bounds::tk_ws;

#[test]
fn a_call_in_flight_at_sigterm_gets_its_result_or_a_503_never_an_empty_reply() {
    let ws = tk_ws("# nothing\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let invoke = |ms: u64| {
        let body = json!({"args": {"ms": ms}}).to_string();
        request_as(
            &serve,
            &serve.token,
            "POST",
            "/v1/tools/tk_sleep:invoke",
            &[("Content-Type", "application/json")],
            Some(body.as_bytes()),
        )
    };
    // Warm the plugin so both calls are in flight when the signal comes.
    let r = invoke(1);
    assert_eq!(r.status, 200, "{}", r.text());
    let (quick, slow) = std::thread::scope(|scope| {
        let quick = scope.spawn(|| invoke(1500));
        let slow = scope.spawn(|| invoke(30_000));
        std::thread::sleep(Duration::from_millis(500));
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(serve.child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        (quick.join().unwrap(), slow.join().unwrap())
    });
    // Within the grace: its result.
    assert_eq!(quick.status, 200, "{}", quick.text());
    assert_eq!(quick.json()["slept_ms"], 1500, "{}", quick.text());
    // Past it: a 503 naming the shutdown.
    let e = slow.error(503, "shutting_down");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{e}"
    );
    // Plugins were stopped only after the HTTP calls were answered.
    let (_, log) = serve.stop();
    let http = log
        .find("stopping the HTTP API")
        .expect("the HTTP stop in the log");
    let plugins = log
        .find("shutting plugins down")
        .expect("the plugin stop in the log");
    assert!(http < plugins, "{log}");
}
