//! plugd.yaml `limits:` on a real `plugd serve` with the native misbehave
//! plugin: the 11th call in a 10/min bucket is HTTP `429` with
//! `Retry-After` and `-32029` with `data.retryAfterSeconds` on `/mcp`; two
//! tokens have separate buckets under `per: caller.subject`; a tool no glob
//! names is never limited; a refused `tk_crash` never reaches the plugin
//! (it would exit: the pid stays) and its record says `rate_limited` with
//! a `limit` decision; `per: caller.role` shares one bucket among the
//! tokens of a role; the agent turn's model reads `RATE_LIMITED`. A
//! 3/hour rule makes the refusal and its wait (1200 s) deterministic.

use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{Resp, Serve, make_token, request_as};
use crate::support::{Ws, eventually_blocking, ok};

const LIMITS: &str = r#"limits:
  - name: per-user
    per: caller.subject
    tools: ["tk_p*"]
    rate: 10/min
  - name: hourly
    per: caller.subject
    tools: ["tk_echo", "tk_crash"]
    rate: 3/hour
  - name: per-role
    per: caller.role
    tools: ["tk_fail"]
    rate: 2/hour
"#;

fn workspace() -> Ws {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    ok(&ws.plugd(&["plugin", "approve", "tk"]));
    std::fs::create_dir_all(ws.dir().join("scripts")).unwrap();
    let echo =
        |id: &str| json!({"tool_calls": [{"name": "tk_echo", "arguments": {"n": id}, "id": id}]});
    let steps =
        json!({"steps": [echo("c1"), echo("c2"), echo("c3"), echo("c4"), {"text": "done"}]});
    std::fs::write(ws.dir().join("scripts/test.yaml"), steps.to_string()).unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            "llm:\n  provider: scripted\n  script: \"${{{{workspace_dir}}}}/scripts/test.yaml\"\n{LIMITS}"
        ),
    )
    .unwrap();
    ws
}

fn invoke(serve: &Serve, token: &str, tool: &str, args: Value) -> Resp {
    request_as(
        serve,
        token,
        "POST",
        &format!("/v1/tools/{tool}:invoke"),
        &[("Content-Type", "application/json")],
        Some(json!({ "args": args }).to_string().as_bytes()),
    )
}

fn pid(serve: &Serve, token: &str) -> u64 {
    let r = invoke(serve, token, "tk_pid", json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["pid"].as_u64().unwrap()
}

/// A `/mcp` session of `token`: posts one JSON-RPC message, the answer.
struct Mcp<'a> {
    serve: &'a Serve,
    token: String,
    sid: String,
}

impl<'a> Mcp<'a> {
    fn open(serve: &'a Serve, token: &str) -> Mcp<'a> {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "limits-test", "version": "1"}}});
        let r = request_as(
            serve,
            token,
            "POST",
            "/mcp",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
            ],
            Some(init.to_string().as_bytes()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let sid = r.header("mcp-session-id").unwrap().to_owned();
        let mcp = Mcp {
            serve,
            token: token.to_owned(),
            sid,
        };
        mcp.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn post(&self, msg: &Value) -> Resp {
        request_as(
            self.serve,
            &self.token,
            "POST",
            "/mcp",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("Mcp-Session-Id", self.sid.as_str()),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            Some(msg.to_string().as_bytes()),
        )
    }

    fn call(&self, id: u64, tool: &str) -> Value {
        let r = self.post(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                                  "params": {"name": tool, "arguments": {}}}));
        let text = r.text();
        let line = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .next_back()
            .map_or(text.clone(), |d| d.trim().to_owned());
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {text}"))
    }
}

fn records(ws: &Ws) -> Vec<Value> {
    let listed: Value = serde_json::from_str(&ok(&ws.plugd(&[
        "invocations",
        "list",
        "--json",
        "--limit",
        "500",
    ])))
    .unwrap();
    listed["invocations"].as_array().unwrap().clone()
}

#[test]
fn the_eleventh_call_in_a_minute_is_refused_on_every_surface_before_the_plugin() {
    let ws = workspace();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let (a, b) = (serve.token.clone(), make_token(&ws, "agent"));

    // HTTP: ten calls pass, the eleventh is 429 with Retry-After (the next
    // token is 6 s after the first call, whole seconds rounded up).
    let first = pid(&serve, &a);
    for _ in 0..9 {
        assert_eq!(pid(&serve, &a), first);
    }
    let r = invoke(&serve, &a, "tk_pid", json!({}));
    let v = r.error(429, "rate_limited");
    let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=6).contains(&after), "Retry-After {after}: {v}");
    assert_eq!(v["error"]["details"]["rule"], "per-user", "{v}");
    let ms = v["error"]["details"]["retry_after_ms"].as_u64().unwrap();
    assert!(ms <= 6_000 && ms.div_ceil(1000) == after, "{v}");

    // A tool no rule names is never limited; another token has its own
    // bucket under `per: caller.subject`.
    for _ in 0..15 {
        let r = invoke(&serve, &a, "tk_sleep", json!({"ms": 0}));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(pid(&serve, &b), first);

    // /mcp: b's bucket is the same whatever the door (1 used above); the
    // 11th call is JSON-RPC -32029 with data.retryAfterSeconds.
    let mcp = Mcp::open(&serve, &b);
    for id in 1..=9 {
        let answer = mcp.call(id, "tk_pid");
        assert!(answer["result"].is_object(), "{answer}");
    }
    let answer = mcp.call(10, "tk_pid");
    assert_eq!(answer["error"]["code"], -32029, "{answer}");
    let secs = answer["error"]["data"]["retryAfterSeconds"]
        .as_u64()
        .unwrap();
    assert!((1..=6).contains(&secs), "{answer}");
    assert_eq!(answer["error"]["data"]["rule"], "per-user", "{answer}");

    // The hourly rule: three calls, then tk_crash is refused for 20 min
    // without reaching the plugin (which would exit on it).
    for _ in 0..3 {
        let r = invoke(&serve, &a, "tk_echo", json!({}));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = invoke(&serve, &a, "tk_crash", json!({}));
    let v = r.error(429, "rate_limited");
    assert_eq!(v["error"]["details"]["rule"], "hourly", "{v}");
    let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1199..=1200).contains(&after), "Retry-After {after}: {v}");
    let c = make_token(&ws, "agent");
    assert_eq!(
        pid(&serve, &c),
        first,
        "the refused tk_crash reached the plugin"
    );

    // `per: caller.role`: every admin token shares one bucket, an agent
    // token has another (tk_fail fails, but each call takes its token).
    for _ in 0..2 {
        let r = invoke(&serve, &a, "tk_fail", json!({}));
        assert_ne!(r.status, 429, "{}", r.text());
    }
    let r = invoke(&serve, &a, "tk_fail", json!({}));
    assert_eq!(
        r.error(429, "rate_limited")["error"]["details"]["rule"],
        "per-role"
    );
    let r = invoke(&serve, &c, "tk_fail", json!({}));
    assert_ne!(r.status, 429, "{}", r.text());
    let other_admin = make_token(&ws, "admin");
    invoke(&serve, &other_admin, "tk_fail", json!({})).error(429, "rate_limited");

    // The agent turn: the fourth echo of the turn is refused; the model
    // reads RATE_LIMITED as the tool's result and the turn carries the notice.
    let d = make_token(&ws, "admin");
    let r = request_as(
        &serve,
        &d,
        "POST",
        "/v1/sessions/lim-1/messages",
        &[("Content-Type", "application/json")],
        Some(json!({"text": "echo four times"}).to_string().as_bytes()),
    );
    let turn = r.json();
    assert_eq!(r.status, 200, "{turn}");
    let calls = turn["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 4, "{turn}");
    assert!(calls[..3].iter().all(|c| c["ok"] == true), "{turn}");
    assert_eq!(calls[3]["ok"], false, "{turn}");
    assert!(
        calls[3]["result"]
            .as_str()
            .unwrap()
            .contains("RATE_LIMITED"),
        "{turn}"
    );
    assert!(
        turn["notices"].to_string().contains("RATE_LIMITED"),
        "{turn}"
    );

    // Records: every refused call failed with rate_limited and its rule's
    // decision; the tk_crash one waits 20 minutes.
    let settled = eventually_blocking(Duration::from_secs(10), || {
        records(&ws)
            .iter()
            .filter(|r| r["error_code"] == "rate_limited")
            .count()
            == 6
    });
    let rows = records(&ws);
    assert!(settled, "{rows:#?}");
    let refused: Vec<&Value> = rows
        .iter()
        .filter(|r| r["error_code"] == "rate_limited")
        .collect();
    let mut surfaces: Vec<&str> = refused
        .iter()
        .map(|r| r["surface"].as_str().unwrap())
        .collect();
    surfaces.sort();
    assert_eq!(
        surfaces,
        ["agent", "http", "http", "http", "http", "mcp"],
        "{refused:#?}"
    );
    for r in &refused {
        assert_eq!(r["status"], "failed", "{r}");
        let d = &r["payload"]["decisions"];
        assert_eq!(d.as_array().map(Vec::len), Some(1), "{r}");
        assert_eq!(d[0]["kind"], "limit", "{r}");
        assert_eq!(d[0]["decision"], "refused", "{r}");
        assert!(d[0]["retry_after_ms"].as_u64().is_some(), "{r}");
        assert_eq!(r["payload"]["error"]["code"], "rate_limited", "{r}");
    }
    let crash = refused.iter().find(|r| r["tool"] == "tk_crash").unwrap();
    assert_eq!(
        crash["payload"]["decisions"][0]["rule"], "hourly",
        "{crash}"
    );
    let wait = crash["payload"]["decisions"][0]["retry_after_ms"]
        .as_u64()
        .unwrap();
    assert!((1_190_000..=1_200_000).contains(&wait), "{crash}");
    assert!(
        rows.iter()
            .filter(|r| r["tool"] == "tk_sleep")
            .all(|r| r["status"] == "succeeded"),
        "{rows:#?}"
    );
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_bad_limits_rule_is_refused_naming_the_rule_and_field() {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "limits:\n  - name: per-user\n    per: caller.email\n    tools: [\"*\"]\n    rate: 10/min\n",
    )
    .unwrap();
    let out = ws.plugd(&["tool", "list"]);
    assert!(!out.status.success());
    let err = crate::support::stderr(&out);
    assert!(err.contains("limits[0] (per-user).per"), "{err}");
    assert!(err.contains("caller.subject"), "{err}");
}

#[test]
fn a_limits_change_applies_to_a_running_serve_at_once() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    ok(&ws.plugd(&["plugin", "approve", "tk"]));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let a = serve.token.clone();
    for _ in 0..5 {
        assert_eq!(invoke(&serve, &a, "tk_echo", json!({})).status, 200);
    }
    // A neutral change: in force within the gate's tick, no approval asked.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "limits:\n  - {name: live, per: tool.name, tools: [tk_echo], rate: 1/hour}\n",
    )
    .unwrap();
    let limited = eventually_blocking(Duration::from_secs(15), || {
        invoke(&serve, &a, "tk_echo", json!({})).status == 429
    });
    assert!(limited, "{}", serve.log_text());
    let r = invoke(&serve, &a, "tk_echo", json!({}));
    assert_eq!(
        r.error(429, "rate_limited")["error"]["details"]["rule"],
        "live"
    );
    // Removed: calls pass again.
    std::fs::write(ws.dir().join("plugd.yaml"), "").unwrap();
    let passing = eventually_blocking(Duration::from_secs(15), || {
        invoke(&serve, &a, "tk_echo", json!({})).status == 200
    });
    assert!(passing, "{}", serve.log_text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}
