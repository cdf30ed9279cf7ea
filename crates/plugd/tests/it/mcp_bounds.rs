//! What one token cannot do to a real `plugd serve` (issue 25): exhaust
//! its memory with JSON-RPC batches on `/mcp` (capped by
//! `mcp.http.max_batch_items`/`max_batch_bytes`, refused on revisions
//! without batches; serve's RSS read from `/proc/PID/status`), run another
//! tool than its `Mcp-Name` header says.

use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway::{initialize, mcp_post};
use crate::http::{Resp, Serve, make_token, request_as};
use crate::support::Ws;

/// A workspace with the native misbehave plugin `tk` (`tk_echo`,
/// `tk_sleep`, `tk_pid`, …) approved.
pub(crate) fn tk_ws(plugd_yaml: &str) -> Ws {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    std::fs::write(ws.dir().join("plugd.yaml"), plugd_yaml).unwrap();
    let out = ws.plugd(&["plugin", "approve", "tk"]);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    ws
}

/// A session of `token` at `version`.
fn open(serve: &Serve, token: &str, version: &str) -> String {
    let mut init = initialize();
    init["params"]["protocolVersion"] = json!(version);
    let r = mcp_post(serve, token, "/mcp", None, &init);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["protocolVersion"], version);
    r.header("mcp-session-id").unwrap().to_owned()
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn batch_of(n: usize, method: &str) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"jsonrpc": "2.0", "id": i + 1, "method": method}))
            .collect(),
    )
}

/// A JSON-RPC error answered with HTTP 400; its `error`.
#[track_caller]
fn rpc_400(r: &Resp, data_code: &str) -> Value {
    assert_eq!(r.status, 400, "{}", r.text());
    let body = r.json();
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    let code = if data_code == "header_mismatch" {
        -32020 // 2026-07-28's HeaderMismatch
    } else {
        -32600
    };
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["data"]["code"], data_code, "{body}");
    body["error"].clone()
}

/// The most serve's peak RSS may grow while six clients send ~1 MB
/// batches over and over (each such batch once cost ~320 MB).
const BOMB_GROWTH_KIB: u64 = 64 * 1024;

#[test]
fn batches_are_capped_refused_where_the_revision_has_none_and_serve_stays_small() {
    let ws = tk_ws("# defaults: 32 messages, 256 KiB per batch\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let old = open(&serve, &agent, "2025-03-26");
    // A small batch on 2025-03-26 still works: one answer per request.
    let r = mcp_post(&serve, &agent, "/mcp", Some(&old), &batch_of(32, "ping"));
    assert_eq!(r.status, 200, "{}", r.text());
    let answers = r.json();
    assert_eq!(answers.as_array().unwrap().len(), 32, "{answers}");
    assert!(
        answers
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["result"] == json!({}))
    );
    let list = json!([{"jsonrpc": "2.0", "id": "l", "method": "tools/list"},
                      {"jsonrpc": "2.0", "method": "notifications/initialized"}]);
    let r = mcp_post(&serve, &agent, "/mcp", Some(&old), &list);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()[0]["id"], "l");
    assert!(r.json()[0]["result"]["tools"].as_array().unwrap().len() >= 5);
    // One more message, or more bytes, than the caps: refused whole.
    let e = rpc_400(
        &mcp_post(&serve, &agent, "/mcp", Some(&old), &batch_of(33, "ping")),
        "batch_too_large",
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("mcp.http.max_batch_items"),
        "{e}"
    );
    let fat: Vec<Value> = (0..4)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "ping", "params": {"pad": "x".repeat(70_000)}}))
        .collect();
    let e = rpc_400(
        &mcp_post(&serve, &agent, "/mcp", Some(&old), &Value::Array(fat)),
        "batch_too_large",
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("mcp.http.max_batch_bytes"),
        "{e}"
    );
    rpc_400(
        &mcp_post(&serve, &agent, "/mcp", Some(&old), &json!([])),
        "empty_batch",
    );
    // Revisions without batches refuse even a small one.
    for version in ["2025-06-18", "2025-11-25"] {
        let s = open(&serve, &agent, version);
        let e = rpc_400(
            &mcp_post(&serve, &agent, "/mcp", Some(&s), &batch_of(2, "ping")),
            "batch_not_supported",
        );
        assert!(e["message"].as_str().unwrap().contains(version), "{e}");
        // ...and a single message still works there.
        let r = mcp_post(
            &serve,
            &agent,
            "/mcp",
            Some(&s),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // The bomb: six clients, ~0.95 MB batches of tools/list, five each.
    let pid = serve.child.id();
    let (rss_before, _) = memory_kib(pid);
    let bomb = {
        let mut items = Vec::new();
        let mut len = 2;
        let mut i = 0;
        while len < 950_000 {
            let item = json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"});
            len += item.to_string().len() + 1;
            items.push(item);
            i += 1;
        }
        Value::Array(items).to_string()
    };
    assert!(bomb.len() > 900_000 && bomb.len() < 1_000_000);
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                for _ in 0..5 {
                    let r = request_as(
                        &serve,
                        &agent,
                        "POST",
                        "/mcp",
                        &[
                            ("Content-Type", "application/json"),
                            ("Accept", "application/json, text/event-stream"),
                            ("Mcp-Session-Id", &old),
                        ],
                        Some(bomb.as_bytes()),
                    );
                    rpc_400(&r, "batch_too_large");
                }
            });
        }
    });
    let (rss_after, hwm) = memory_kib(pid);
    assert!(
        hwm.saturating_sub(rss_before) < BOMB_GROWTH_KIB,
        "serve's peak RSS grew {} KiB (before {rss_before}, peak {hwm}, after {rss_after}); the bound is {BOMB_GROWTH_KIB}",
        hwm.saturating_sub(rss_before)
    );
    // Still serving.
    let r = mcp_post(&serve, &agent, "/mcp", Some(&old), &batch_of(2, "ping"));
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The invocation records of tool `tool` (every call leaves one).
fn records(serve: &Serve, tool: &str) -> usize {
    let r = serve.get(&format!("/v1/invocations?tool={tool}&limit=500"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["invocations"].as_array().unwrap().len()
}

#[test]
fn routing_headers_must_say_what_the_body_says_and_a_mismatch_runs_nothing() {
    let ws = tk_ws("# nothing\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let call = |name: &str| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": name, "arguments": {"said": "hi"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}})
    };
    let post = |body: &Value, method: &str, name: &str| {
        request_as(
            &serve,
            &agent,
            "POST",
            "/mcp",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", method),
                ("Mcp-Name", name),
            ],
            Some(body.to_string().as_bytes()),
        )
    };
    // Headers naming tk_pid, a body calling tk_echo: 400, tk_echo never runs.
    let e = rpc_400(
        &post(&call("tk_echo"), "tools/call", "tk_pid"),
        "header_mismatch",
    );
    assert!(e["message"].as_str().unwrap().contains("Mcp-Name"), "{e}");
    let e = rpc_400(
        &post(&call("tk_echo"), "tools/list", "tk_echo"),
        "header_mismatch",
    );
    assert!(e["message"].as_str().unwrap().contains("Mcp-Method"), "{e}");
    // The base64 form must decode to the body's name too.
    rpc_400(
        &post(&call("tk_echo"), "tools/call", "=?base64?dGtfcGlk?="),
        "header_mismatch",
    );
    // Matching headers (plain and base64): the call runs, and is recorded.
    let r = post(&call("tk_echo"), "tools/call", "tk_echo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["result"]["structuredContent"]["echo"]["said"],
        "hi",
        "{}",
        r.text()
    );
    let r = post(&call("tk_echo"), "tools/call", "=?base64?dGtfZWNobw==?=");
    assert_eq!(r.status, 200, "{}", r.text());
    let recorded = crate::support::eventually_blocking(Duration::from_secs(10), || {
        records(&serve, "tk_echo") == 2
    });
    assert!(
        recorded,
        "{} records of tk_echo",
        records(&serve, "tk_echo")
    );
    // Only the two calls whose headers matched ran.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(records(&serve, "tk_echo"), 2);
    assert_eq!(records(&serve, "tk_pid"), 0);
}
