//! One governed call path, whatever the door: a blocking Dexto
//! `before_tool_call` module (`tests/plugins/onepath/guard.mjs`) refuses
//! calls whose arguments say `deny`, and its `after_tool_result` rewrites an
//! echo, on every surface of a real `plugd serve` (HTTP invoke as JSON and
//! SSE, `/mcp`, `plugd mcp` bridged to serve, `plugd tool call` through
//! serve, the agent turn with the scripted LLM) and without serve (`plugd
//! tool call`, `plugd mcp`). The refused tool is the native misbehave
//! plugin's `tk_crash`: had the plugin seen one call, it would have exited,
//! and its pid (read through every surface) would change. The CLI never
//! acts beside serve: a stalled serve (SIGSTOP) makes `plugd plugin revoke`
//! fail naming its pid and the approval stays. Every invocation record has a
//! trace id: the caller's `traceparent` (which a VAI plugin gets as
//! `context.trace_id`, with no OpenTelemetry export), else a new one.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{Resp, Serve, request_as};
use crate::support::{Stopped, Ws, eventually_blocking, ok, plugd_cmd, repo, stderr, stdout};

/// The workspace: the misbehave plugin `tk` approved, the guard module
/// logging to the returned file, and a scripted LLM whose one session walks
/// an echo to rewrite, then a call to refuse.
fn workspace() -> (Ws, PathBuf) {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    ok(&ws.plugd(&["plugin", "approve", "tk"]));
    let log = ws.dir().join("guard.log");
    std::fs::write(&log, "").unwrap();
    std::fs::create_dir_all(ws.dir().join("scripts")).unwrap();
    let steps = json!({"steps": [
        {"tool_calls": [{"name": "tk_echo", "arguments": {"tag": "rewrite"}, "id": "c1"}]},
        {"text": "echoed"},
        {"tool_calls": [{"name": "tk_crash", "arguments": {"deny": true}, "id": "c2"}]},
        {"text": "never reached"}
    ]});
    std::fs::write(ws.dir().join("scripts/test.yaml"), steps.to_string()).unwrap();
    let module = repo().join("tests/plugins/onepath/guard.mjs");
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            "llm:\n  provider: scripted\n  script: \"${{{{workspace_dir}}}}/scripts/test.yaml\"\nplugins:\n  custom:\n    - {{name: guard, module: \"{}\", priority: 10, blocking: true, config: {{log: \"{}\"}}}}\n",
            module.display(),
            log.display()
        ),
    )
    .unwrap();
    (ws, log)
}

fn refusal(surface: &str) -> String {
    format!("one-path guard refused tk_crash from {surface}")
}

/// `POST path` with a JSON body and extra headers, with serve's admin token.
fn post_with(serve: &Serve, path: &str, headers: &[(&str, &str)], body: &Value) -> Resp {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    request_as(
        serve,
        &serve.token,
        "POST",
        path,
        &all,
        Some(body.to_string().as_bytes()),
    )
}

/// The JSON-RPC messages of an MCP HTTP answer (JSON or an event stream).
fn mcp_messages(r: &Resp) -> Vec<Value> {
    let text = r.text();
    if r.header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream"))
    {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else {
        vec![serde_json::from_str(&text).unwrap_or(Value::Null)]
    }
}

fn call_request(id: u64, name: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}})
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"one-path-test","version":"1"}}}"#;

/// The text of a `tools/call` result's first content item.
fn result_text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// `plugd mcp` on `ws` as a child: one request at a time, each answer read
/// before the next request (notifications skipped).
struct StdioMcp {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl StdioMcp {
    fn start(ws: &Ws) -> StdioMcp {
        let mut child = plugd_cmd(ws.dir())
            .arg("mcp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut mcp = StdioMcp { child, out };
        let init: Value = serde_json::from_str(INITIALIZE).unwrap();
        let r = mcp.ask(&init);
        assert!(r["result"]["serverInfo"].is_object(), "{r}");
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, msg: &Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    fn ask(&mut self, msg: &Value) -> Value {
        self.send(msg);
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "plugd mcp closed stdout before answering {msg}");
            let v: Value = serde_json::from_str(line.trim()).unwrap();
            if v.get("id") == msg.get("id") && v.get("method").is_none() {
                return v;
            }
        }
    }

    /// Closes stdin and waits: the exit status and stderr.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut err);
        (status, err)
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

fn guard_log(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn is_trace_id(v: &Value) -> bool {
    v.as_str().is_some_and(|t| {
        t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()) && t != "0".repeat(32)
    })
}

#[test]
fn every_surface_passes_the_hooks_and_a_refused_call_never_reaches_the_plugin() {
    let (ws, log) = workspace();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let pid = serve
        .post("/v1/tools/tk_pid:invoke", &json!({"args": {}}))
        .json()["pid"]
        .as_u64()
        .unwrap();
    let deny = json!({"args": {"deny": true}});
    let rewrite = json!({"args": {"tag": "rewrite"}});

    // HTTP invoke, JSON: a typed 403 with the hook's message.
    let v = serve
        .post("/v1/tools/tk_crash:invoke", &deny)
        .error(403, "blocked_by_hook");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(&refusal("http")), "{v}");
    assert_eq!(v["error"]["details"]["point"], "before_tool_call", "{v}");
    let r = serve.post("/v1/tools/tk_echo:invoke", &rewrite);
    assert_eq!(r.json(), json!({"rewritten": true, "surface": "http"}));

    // HTTP invoke, SSE: the same error as its `error` event.
    let sse = [("Accept", "text/event-stream")];
    let text = post_with(&serve, "/v1/tools/tk_crash:invoke", &sse, &deny).text();
    assert!(
        text.contains("event: error") && text.contains("blocked_by_hook"),
        "{text}"
    );
    assert!(text.contains(&refusal("http")), "{text}");
    let text = post_with(&serve, "/v1/tools/tk_echo:invoke", &sse, &rewrite).text();
    assert!(
        text.contains("event: result") && text.contains(r#""rewritten":true"#),
        "{text}"
    );

    // /mcp on serve: a tool error result carrying the message.
    let accept = [("Accept", "application/json, text/event-stream")];
    let init: Value = serde_json::from_str(INITIALIZE).unwrap();
    let r = post_with(&serve, "/mcp", &accept, &init);
    assert_eq!(r.status, 200, "{}", r.text());
    let sid = r.header("mcp-session-id").unwrap().to_owned();
    let session = [
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", sid.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(
        post_with(&serve, "/mcp", &session, &initialized).status,
        202
    );
    let r = post_with(
        &serve,
        "/mcp",
        &session,
        &call_request(1, "tk_crash", json!({"deny": true})),
    );
    let answer = &mcp_messages(&r)[0];
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(
        result_text(&answer["result"]).contains(&refusal("mcp")),
        "{answer}"
    );
    let r = post_with(
        &serve,
        "/mcp",
        &session,
        &call_request(2, "tk_echo", json!({"tag": "rewrite"})),
    );
    let answer = &mcp_messages(&r)[0];
    let text = serde_json::to_string(&answer["result"]).unwrap();
    assert!(
        text.contains("rewritten") && !text.contains("\"isError\":true"),
        "{answer}"
    );

    // `plugd mcp` under serve: a bridge to serve's gateway, serve's plugin.
    let mut mcp = StdioMcp::start(&ws);
    let listed = mcp.ask(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"tk_pid"), "{listed}");
    let r = mcp.ask(&call_request(2, "tk_crash", json!({"deny": true})));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(result_text(&r["result"]).contains(&refusal("mcp")), "{r}");
    let r = mcp.ask(&call_request(3, "tk_echo", json!({"tag": "rewrite"})));
    assert!(r["result"].to_string().contains("rewritten"), "{r}");
    let r = mcp.ask(&call_request(4, "tk_pid", json!({})));
    let seen: Value = serde_json::from_str(&result_text(&r["result"])).unwrap_or(r.clone());
    assert_eq!(
        seen["pid"]
            .as_u64()
            .or(r["result"]["structuredContent"]["pid"].as_u64()),
        Some(pid),
        "plugd mcp under serve reached another process: {r}"
    );
    let (status, err) = mcp.finish();
    assert!(status.success(), "{err}");

    // `plugd tool call` under serve: through serve, in serve's process.
    let out = ws.plugd(&["tool", "call", "tk_crash", "--args", r#"{"deny":true}"#]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains(&refusal("http")), "{}", stderr(&out));
    let out = ws.plugd(&[
        "tool",
        "call",
        "tk_crash",
        "--args",
        r#"{"deny":true}"#,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let e: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(e["code"], "blocked_by_hook", "{e}");
    assert_eq!(e["http_status"], 403, "{e}");
    let out = ws.plugd(&["tool", "call", "tk_pid", "--args", "{}"]);
    let got: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(
        got["pid"].as_u64(),
        Some(pid),
        "a second copy of the plugin ran"
    );
    let out = ws.plugd(&["tool", "call", "tk_echo", "--args", r#"{"tag":"rewrite"}"#]);
    assert!(ok(&out).contains("rewritten"));

    // The agent turn: the rewrite reaches the model, the refusal blocks.
    let r = serve.post("/v1/sessions/op-1/messages", &json!({"text": "echo it"}));
    let turn = r.json();
    assert_eq!(r.status, 200, "{turn}");
    assert_eq!(
        turn["tool_calls"][0]["result"],
        json!({"rewritten": true, "surface": "agent"}),
        "{turn}"
    );
    let r = serve.post("/v1/sessions/op-1/messages", &json!({"text": "crash it"}));
    let v = r.error(403, "turn_blocked");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&refusal("agent")),
        "{v}"
    );
    assert_eq!(v["outcome"]["blocked_at"], "before_tool_call", "{v}");

    // The plugin never saw a refused call: the same process answers.
    let again = serve
        .post("/v1/tools/tk_pid:invoke", &json!({"args": {}}))
        .json()["pid"]
        .as_u64();
    assert_eq!(again, Some(pid));
    let mut surfaces = std::collections::BTreeSet::new();
    let settled = eventually_blocking(Duration::from_secs(10), || {
        let rows = records(&ws);
        let refused: Vec<&Value> = rows.iter().filter(|r| r["tool"] == "tk_crash").collect();
        surfaces = refused
            .iter()
            .filter_map(|r| r["surface"].as_str().map(str::to_owned))
            .collect();
        refused.len() == 7
            && refused
                .iter()
                .all(|r| r["error_code"] == "blocked_by_hook" && r["status"] == "failed")
    });
    assert!(settled, "{:#?}", records(&ws));
    assert_eq!(
        surfaces.into_iter().collect::<Vec<_>>(),
        ["agent", "http", "mcp"],
        "by serve's surfaces"
    );
    let rows = records(&ws);
    assert!(
        rows.iter().all(|r| is_trace_id(&r["trace_id"])),
        "{rows:#?}"
    );
    let pid_via_mcp = rows
        .iter()
        .find(|r| r["tool"] == "tk_pid" && r["surface"] == "mcp");
    assert!(
        pid_via_mcp.is_some(),
        "the bridged call's record: {rows:#?}"
    );
    let (status, serve_log) = serve.stop();
    assert!(status.success(), "{serve_log}");

    // Without serve: `plugd tool call` and `plugd mcp` run the hooks here.
    let out = ws.plugd(&["tool", "call", "tk_crash", "--args", r#"{"deny":true}"#]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&refusal("cli")), "{}", stderr(&out));
    let out = ws.plugd(&["tool", "call", "tk_echo", "--args", r#"{"tag":"rewrite"}"#]);
    let got: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(got, json!({"rewritten": true, "surface": "cli"}));
    let mut mcp = StdioMcp::start(&ws);
    let r = mcp.ask(&call_request(1, "tk_crash", json!({"deny": true})));
    assert!(result_text(&r["result"]).contains(&refusal("mcp")), "{r}");
    let (status, err) = mcp.finish();
    assert!(status.success(), "{err}");
    let rows = records(&ws);
    let refused: Vec<&Value> = rows.iter().filter(|r| r["tool"] == "tk_crash").collect();
    assert_eq!(refused.len(), 9, "{rows:#?}");
    assert!(refused.iter().all(|r| r["error_code"] == "blocked_by_hook"));
    assert!(refused.iter().any(|r| r["surface"] == "cli"));
    // Every refused record names the hook that blocked and why, and keeps
    // the error; every rewritten echo names the change (whatever the door).
    for r in &refused {
        let why = refusal(r["surface"].as_str().unwrap_or_default());
        let d = &r["payload"]["decisions"];
        assert_eq!(
            d,
            &json!([{"kind": "hook", "point": "before_tool_call", "decision": "blocked",
                     "hook": "guard", "reason": why}]),
            "{r}"
        );
        let error = &r["payload"]["error"];
        assert_eq!(error["code"], "blocked_by_hook", "{r}");
        assert!(error["message"].as_str().unwrap().contains(&why), "{r}");
    }
    let echoes: Vec<&Value> = rows.iter().filter(|r| r["tool"] == "tk_echo").collect();
    assert!(!echoes.is_empty());
    for r in echoes {
        assert_eq!(
            r["payload"],
            json!({"decisions": [{"kind": "hook", "point": "after_tool_result",
                                  "decision": "modified_result"}]}),
            "{r}"
        );
    }
    // The hook saw every surface in its context, with the call's trace.
    let seen = guard_log(&log);
    for surface in ["http", "mcp", "agent", "cli"] {
        assert!(
            seen.iter().any(|l| l["surface"] == surface
                && l["point"] == "before_tool_call"
                && is_trace_id(&l["traceId"])),
            "{surface}: {seen:#?}"
        );
    }
}

#[test]
fn a_stalled_serve_makes_the_cli_fail_naming_it_and_nothing_changes() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    ok(&ws.plugd(&["plugin", "approve", "tk"]));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let pid = serve.child.id();
    {
        let _stalled = Stopped::stop(pid);
        for args in [
            &["plugin", "revoke", "tk"][..],
            &["tool", "call", "tk_pid", "--args", "{}"],
        ] {
            let out = ws.plugd(args);
            assert!(!out.status.success(), "{args:?}: {}", stdout(&out));
            let err = stderr(&out);
            assert!(
                err.contains(&format!("plugd serve (pid {pid})")) && err.contains("did not answer"),
                "{args:?}: {err}"
            );
            assert!(!stdout(&out).contains("revoked"), "{}", stdout(&out));
        }
    }
    let plugins = serve.get("/v1/plugins").json();
    let tk = plugins
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "tk")
        .unwrap();
    assert_eq!(tk["approved"], true, "{tk}");
    // Answering again, serve does it.
    let out = ws.plugd(&["plugin", "revoke", "tk"]);
    assert!(
        ok(&out).contains(&format!("via plugd serve pid {pid}")),
        "{}",
        stdout(&out)
    );
}

#[test]
fn every_record_has_a_trace_id_and_a_vai_plugin_gets_the_callers() {
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let ws = Ws::new();
    crate::vai::package(&ws, "traced", "good", &[]);
    ws.misbehave("tk", "good", None, "");
    for id in ["test/traced", "tk"] {
        ok(&ws.plugd(&["plugin", "approve", id]));
    }
    // No OTEL_* variable: nothing is exported.
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let parent = format!("00-{TRACE}-00f067aa0ba902b7-01");
    let r = post_with(
        &serve,
        "/v1/tools/test/traced/echo:invoke",
        &[("traceparent", parent.as_str())],
        &json!({"args": {"q": "x"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["structured_output"]["context"]["trace_id"], TRACE, "{v}");
    for _ in 0..2 {
        let r = serve.post("/v1/tools/tk_echo:invoke", &json!({"args": {}}));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut rows = Vec::new();
    let all = eventually_blocking(Duration::from_secs(10), || {
        rows = records(&ws);
        rows.len() == 3
    });
    assert!(all, "{rows:#?}");
    let traced = rows
        .iter()
        .find(|r| r["tool"] == "test/traced/echo")
        .unwrap();
    assert_eq!(traced["trace_id"], TRACE, "{traced}");
    let fresh: Vec<&str> = rows
        .iter()
        .filter(|r| r["tool"] == "tk_echo")
        .map(|r| r["trace_id"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(fresh.len(), 2);
    assert!(fresh.iter().all(|t| is_trace_id(&json!(t))), "{fresh:?}");
    assert_ne!(fresh[0], fresh[1]);
    assert!(!fresh.contains(&TRACE));
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains("exporting traces"), "{log}");
}
