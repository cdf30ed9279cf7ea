//! Typed tool errors (-33401..-33405) through every surface: a real nexoai
//! SDK plugin (`tests/plugins/http/typed_errors.py`) raises each one; a real
//! `plugd serve` maps it to its HTTP status, code, details and `Retry-After`;
//! `plugd tool call --json` prints it as one JSON object on stderr with the
//! class's exit code. Lying `retry_after_ms` values are clamped or dropped.

use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, repo, stderr};

/// A workspace with the `typed` plugin approved.
fn typed_ws() -> Ws {
    let ws = Ws::new();
    let dir = ws.plugin_dir("typed");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/http/typed_errors.py"),
        dir.join("typed_errors.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"typed\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"typed_errors.py\"]\n\n[plugin.extends]\ntools = [\"typed_raise\"]\n",
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", "typed"]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
    ws
}

fn raise(serve: &Serve, args: Value) -> crate::http::Resp {
    serve.post("/v1/tools/typed_raise:invoke", &json!({ "args": args }))
}

#[test]
fn each_typed_tool_error_keeps_its_class_over_http() {
    let ws = typed_ws();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let named = |v: &Value, rpc: i64| {
        assert_eq!(v["error"]["details"]["plugin"], "typed", "{v}");
        assert_eq!(v["error"]["details"]["tool"], "typed_raise", "{v}");
        assert_eq!(v["error"]["details"]["rpc_code"], rpc, "{v}");
    };

    let r = raise(&serve, json!({"kind": "ok"}));
    assert_eq!(r.status, 200, "{}", r.text());

    let v = raise(&serve, json!({"kind": "not_found"})).error(404, "tool_not_found");
    named(&v, -33401);

    let v = raise(&serve, json!({"kind": "invalid"})).error(422, "invalid_arguments");
    named(&v, -33402);
    assert_eq!(
        v["error"]["details"]["fields"],
        json!({"field": "city", "why": "missing"}),
        "{v}"
    );

    let v = raise(&serve, json!({"kind": "failed"})).error(502, "tool_failed");
    named(&v, -33403);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upstream API returned 500"),
        "{v}"
    );

    let r = raise(
        &serve,
        json!({"kind": "unavailable", "retry_after_ms": 1500}),
    );
    let v = r.error(503, "tool_unavailable");
    named(&v, -33404);
    assert_eq!(v["error"]["details"]["retry_after_ms"], 1500, "{v}");
    assert_eq!(r.header("retry-after"), Some("2"), "rounded up to seconds");

    let v = raise(&serve, json!({"kind": "denied"})).error(403, "tool_denied");
    named(&v, -33405);

    // The plugin is still serving after every typed error.
    assert_eq!(raise(&serve, json!({"kind": "ok"})).status, 200);
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_lying_retry_after_is_clamped_or_dropped_never_a_panic() {
    let ws = typed_ws();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // (what the plugin sends, the retry_after_ms plugd reports, Retry-After)
    let cases = [
        (json!(1e308), Some(3_600_000), Some("3600")),
        (json!(u64::MAX), Some(3_600_000), Some("3600")),
        (json!(2.5), Some(3), Some("1")),
        (json!(0), Some(0), Some("0")),
        (json!(-5000), None, None),
        (json!("5000"), None, None),
        (json!({"ms": 1}), None, None),
        (Value::Null, None, None),
    ];
    for (sent, ms, header) in cases {
        let r = raise(
            &serve,
            json!({"kind": "unavailable", "retry_after_ms": sent}),
        );
        let v = r.error(503, "tool_unavailable");
        assert_eq!(
            v["error"]["details"].get("retry_after_ms").cloned(),
            ms.map(|m: u64| json!(m)),
            "sent {sent}: {v}"
        );
        assert_eq!(r.header("retry-after"), header, "sent {sent}: {v}");
    }
    assert_eq!(raise(&serve, json!({"kind": "ok"})).status, 200);
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn tool_call_json_prints_the_error_object_on_stderr_with_class_exit_codes() {
    let ws = typed_ws();
    // (kind, code, exit code)
    let cases = [
        ("not_found", "tool_not_found", 4),
        ("invalid", "invalid_arguments", 5),
        ("failed", "tool_failed", 6),
        ("unavailable", "tool_unavailable", 7),
        ("denied", "tool_denied", 8),
    ];
    for (kind, code, exit) in cases {
        let args = json!({"kind": kind, "retry_after_ms": 1e308}).to_string();
        let out = ws.plugd(&["tool", "call", "typed_raise", "--args", &args, "--json"]);
        assert_eq!(out.status.code(), Some(exit), "{kind}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{kind}: nothing on stdout");
        let err = stderr(&out);
        let line = err.lines().last().unwrap_or_default();
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{kind}: stderr's last line is not JSON ({e}): {err}"));
        assert_eq!(v["code"], code, "{v}");
        assert_eq!(v["details"]["plugin"], "typed", "{v}");
        assert!(
            v["message"].as_str().is_some_and(|m| m.contains("typed")),
            "{v}"
        );
        if kind == "unavailable" {
            assert_eq!(v["details"]["retry_after_ms"], 3_600_000, "{v}");
            assert_eq!(v["http_status"], 503, "{v}");
        }
        if kind == "invalid" {
            assert_eq!(v["details"]["fields"]["field"], "city", "{v}");
        }
    }
    // An unknown tool and bad --args are classed too.
    let out = ws.plugd(&["tool", "call", "typed_nope", "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(v["code"], "unknown_tool", "{v}");
    let out = ws.plugd(&["tool", "call", "typed_raise", "--args", "[1]", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(v["code"], "error", "{v}");
    // Without --json: the one-line error and exit 1, as before.
    let out = ws.plugd(&[
        "tool",
        "call",
        "typed_raise",
        "--args",
        r#"{"kind":"denied"}"#,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("plugd: error: "),
        "{}",
        stderr(&out)
    );
}

/// A plugin that dies mid-call keeps plugd's own class: 503
/// `plugin_unavailable` naming the plugin, never a typed tool error.
#[test]
fn a_crash_mid_call_is_plugin_unavailable_not_a_tool_error() {
    let ws = Ws::new();
    ws.misbehave("boom", "good", None, "");
    let out = ws.plugd(&["plugin", "approve", "boom"]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let v = serve
        .post("/v1/tools/boom_crash:invoke", &json!({"args": {}}))
        .error(503, "plugin_unavailable");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("boom"),
        "{v}"
    );
    assert!(v["error"].get("details").is_none(), "{v}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    // The CLI classes it the same way.
    let out = ws.plugd(&["tool", "call", "boom_crash", "--json"]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stderr(&out).lines().last().unwrap()).unwrap();
    assert_eq!(v["code"], "plugin_unavailable", "{v}");
}
