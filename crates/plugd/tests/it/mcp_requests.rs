//! What hosted MCP servers ask of plugd outside gateway calls, and calls
//! failed by a runaway kill, with a real server written with the Python
//! `mcp` SDK (`tests/plugins/mcp-requests/requests_server.py`): a tool that
//! ignores cancellation, a read-only and a non-idempotent slow tool, a tool
//! that elicits a form and one that samples. Elicitation is answered on a
//! real pseudo-terminal (`plugd tool call`) and as a pending approval of a
//! real `plugd serve`; sampling reaches the OpenAI-compatible HTTP double of
//! the `llm` tests, which stands in for a real model server (none can run
//! here).

use std::time::{Duration, Instant};

use plugd_host::dialect::CallContext;
use plugd_host::{CallToolError, Status};
use plugd_runtime::Runtime;
use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, quick, repo, stderr};

/// A workspace whose `.mcp.json` declares the server as `req`, with
/// `yaml` as plugd.yaml.
fn workspace(yaml: &str) -> Ws {
    let ws = Ws::new();
    let script = repo().join("tests/plugins/mcp-requests/requests_server.py");
    // The venv's interpreter: the runtime tests do not put it on PATH.
    let python = repo().join(".venv/bin/python3");
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"req": {"command": python, "args": [script]}}}).to_string(),
    )
    .unwrap();
    if !yaml.is_empty() {
        std::fs::write(ws.dir().join("plugd.yaml"), yaml).unwrap();
    }
    ws
}

async fn approved(ws: &Ws) -> Runtime {
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("req", "test").await.unwrap();
    rt
}

/// Calls `name` with its own deadline.
async fn call_within(
    rt: &Runtime,
    name: &str,
    args: Value,
    ms: u64,
) -> Result<Value, CallToolError> {
    let entry = rt.tools().into_iter().find(|t| t.name == name).unwrap();
    rt.supervised(&entry.plugin)
        .unwrap()
        .call_tool(
            &entry.def,
            args,
            &CallContext::default(),
            Some(Duration::from_millis(ms)),
        )
        .await
}

fn pid_in(v: &Value) -> u64 {
    v["structuredContent"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in {v}"))
}

/// Makes the server ignore a cancel: `stubborn` times out after `ms` and
/// keeps sending progress, so plugd kills it after the 2 s grace.
async fn runaway(rt: &Runtime, ms: u64) {
    let err = call_within(rt, "req/stubborn", json!({"seconds": 6}), ms)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("did not answer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_an_ignored_cancel_spends_no_restart_budget() {
    let ws = workspace("");
    let rt = approved(&ws).await;
    let sup = rt.supervised("req").unwrap().clone();
    let attempts = sup.spec().supervisor.restart_attempts;
    let mut states = sup.watch();
    let seen: std::sync::Arc<std::sync::Mutex<Vec<&str>>> = std::sync::Arc::default();
    let log = seen.clone();
    let watcher = tokio::spawn(async move {
        while states.changed().await.is_ok() {
            let name = states.borrow_and_update().name();
            log.lock().unwrap().push(name);
        }
    });
    let mut pids = Vec::new();
    // One more kill than the restart budget allows crashes.
    for _ in 0..=attempts {
        let v = rt.call_tool("req/pid", json!({}), None).await.unwrap();
        pids.push(pid_in(&v));
        runaway(&rt, 300).await;
        let sup2 = sup.clone();
        assert!(
            crate::support::eventually(Duration::from_secs(10), || sup2.status() == Status::Idle)
                .await,
            "the killed server goes idle, not into backoff: {:?}",
            sup.status()
        );
    }
    let v = rt.call_tool("req/pid", json!({}), None).await.unwrap();
    pids.push(pid_in(&v));
    pids.dedup();
    assert_eq!(
        pids.len(),
        attempts as usize + 2,
        "a new process each time: {pids:?}"
    );
    watcher.abort();
    rt.shutdown().await;
    let states = seen.lock().unwrap().clone();
    assert!(states.contains(&"idle"), "{states:?}");
    assert!(
        !states.iter().any(|s| *s == "backoff" || *s == "failed"),
        "a runaway kill is not a crash: {states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_failed_by_a_runaway_kill_are_retried_only_when_safe() {
    let ws = workspace("");
    let rt = approved(&ws).await;
    let first = pid_in(&rt.call_tool("req/pid", json!({}), None).await.unwrap());
    let started = Instant::now();
    let (read, write, short, ()) = tokio::join!(
        // Read-only: retried on the restarted server, within its deadline.
        call_within(&rt, "req/slow_read", json!({"ms": 4000}), 20_000),
        // Not read-only or idempotent: failed, saying why.
        call_within(&rt, "req/slow_write", json!({"ms": 4000}), 20_000),
        // Read-only, but its deadline leaves no room for the retry.
        call_within(&rt, "req/slow_read", json!({"ms": 4000}), 4_000),
        runaway(&rt, 300),
    );
    let read = read.unwrap();
    assert_ne!(pid_in(&read), first, "answered by the restarted server");
    assert!(started.elapsed() < Duration::from_secs(20));
    let write = write.unwrap_err().to_string();
    for wants in [
        "ignored its cancel",
        "tool \"req/stubborn\"",
        "tool \"req/slow_write\" was not retried",
        "not marked read-only or idempotent",
    ] {
        assert!(write.contains(wants), "{wants:?} not in {write}");
    }
    // The retry keeps the original deadline: either no time was left to
    // retry (said so), or the retry ran out at that deadline (on a loaded
    // machine the restart can take most of what was left).
    let short = short.unwrap_err().to_string();
    let refused = short.contains("ignored its cancel") && short.contains("within its 4s deadline");
    let timed_out = short.contains("did not answer tools/call within");
    assert!(
        refused || timed_out,
        "the retry keeps the original deadline: {short}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_is_refused_unless_the_operator_allows_it() {
    let (base, seen) = crate::llm::double().await;
    let llm = format!("llm:\n  provider: openai\n  base_url: {base}\n  model: test-model\n");
    let ws = workspace(&llm);
    let rt = approved(&ws).await;
    let v = rt
        .call_tool("req/sample", json!({"prompt": "hello"}), None)
        .await
        .unwrap();
    let err = v["structuredContent"]["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("mcp.servers.req.sampling: true"),
        "the refusal says how to allow it: {v}"
    );
    assert!(
        seen.lock().unwrap().bodies().is_empty(),
        "no model was asked"
    );
    rt.shutdown().await;

    let ws = workspace(&format!(
        "{llm}mcp:\n  servers:\n    req:\n      sampling: true\n      sampling_max_tokens: 64\n"
    ));
    let rt = approved(&ws).await;
    let v = rt
        .call_tool(
            "req/sample",
            json!({"prompt": "hello", "max_tokens": 5000}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        v["structuredContent"],
        json!({"role": "assistant", "text": "echo: hello", "model": "test-model", "stopReason": "endTurn"}),
        "{v}"
    );
    let body = seen.lock().unwrap().bodies()[0].clone();
    assert_eq!(body["max_tokens"], 64, "maxTokens cut to the bound: {body}");
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    );
    // An image cannot be passed on as text: refused, never dropped.
    let v = rt
        .call_tool("req/sample", json!({"prompt": "x", "image": true}), None)
        .await
        .unwrap();
    let err = v["structuredContent"]["error"].as_str().unwrap_or_default();
    assert!(err.contains("is image") && err.contains("text only"), "{v}");
    assert_eq!(seen.lock().unwrap().bodies().len(), 1);
    rt.shutdown().await;
}

fn approve_cli(ws: &Ws) {
    let out = ws.plugd(&["plugin", "approve", "req"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn elicitation_on_a_terminal_checks_the_form_before_sending_it() {
    let ws = workspace("");
    approve_cli(&ws);
    let args = r#"{"message":"who are you?"}"#;
    let r = crate::risk::on_a_terminal(
        &ws,
        &["tool", "call", "req/ask", "--args", args],
        &[
            ("[a]ccept, [d]ecline or [c]ancel?", "a\n"),
            ("age [integer]", "-3\n"),
            ("name (Your name)", "Ann\n"),
            ("try again", "\n"),
            ("age [integer]", "7\n"),
            ("name (Your name)", "Ann\n"),
        ],
    );
    let out = r["output"].as_str().unwrap();
    assert_eq!(r["code"], 0, "{r}");
    assert!(
        out.contains("MCP server \"req\" asks: who are you?"),
        "{out}"
    );
    assert!(out.contains("/age"), "the mismatch is named: {out}");
    let result: Value =
        serde_json::from_str(&out[out.find("\r\n{").unwrap()..].replace("\r\n", "\n"))
            .unwrap_or_else(|e| panic!("no result ({e}): {out}"));
    assert_eq!(
        result["structuredContent"],
        json!({"action": "accept", "content": {"name": "Ann", "age": 7}}),
        "{out}"
    );
    let r = crate::risk::on_a_terminal(
        &ws,
        &["tool", "call", "req/ask", "--args", args],
        &[("[a]ccept, [d]ecline or [c]ancel?", "d\n")],
    );
    assert!(
        r["output"].as_str().unwrap().contains(
            r#""action": "decline"
"#
            .trim_end()
        ),
        "{r}"
    );
    // No terminal: nobody is asked, and the server is told where it could be.
    let out = ws.plugd(&["tool", "call", "req/ask", "--args", args]);
    let text = format!("{}{}", crate::support::stdout(&out), stderr(&out));
    assert!(text.contains("not a terminal"), "{text}");
}

/// Polls `GET /v1/approvals` until an elicitation waits; returns it.
fn pending_question(serve: &Serve) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let v = serve.get("/v1/approvals").json();
        if let Some(a) = v.as_array().and_then(|a| a.first()) {
            return a.clone();
        }
        assert!(Instant::now() < end, "nothing pending: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn elicitation_under_serve_is_a_pending_approval_answered_with_checked_content() {
    let ws = workspace("risk:\n  approval_timeout_secs: 2\n");
    approve_cli(&ws);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let invoke = || {
        serve.post(
            "/v1/tools/req/ask:invoke",
            &json!({"args": {"message": "name?"}}),
        )
    };
    std::thread::scope(|scope| {
        let call = scope.spawn(invoke);
        let a = pending_question(&serve);
        assert_eq!(
            (&a["tool"], &a["plugin"], &a["risk"]),
            (
                &json!("elicitation/create"),
                &json!("req"),
                &json!("elicitation")
            ),
            "{a}"
        );
        let shown: Value = serde_json::from_str(a["args_preview"].as_str().unwrap()).unwrap();
        assert_eq!(shown["message"], "name?");
        assert_eq!(
            shown["requestedSchema"]["required"],
            json!(["name"]),
            "{shown}"
        );
        let id = a["id"].as_str().unwrap().to_owned();
        // Content that does not match the schema is refused; it still waits.
        let v = serve
            .post(
                &format!("/v1/approvals/{id}:approve"),
                &json!({"content": {"name": "Bo", "age": -1}}),
            )
            .error(422, "invalid_arguments");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("/age"),
            "{v}"
        );
        let r = serve.post(
            &format!("/v1/approvals/{id}:approve"),
            &json!({"content": {"name": "Bo", "age": 3}}),
        );
        assert_eq!(r.status, 200, "{:?}", r.json());
        let done = call.join().unwrap();
        assert_eq!(done.status, 200, "{:?}", done.json());
        assert_eq!(
            done.json()["structuredContent"],
            json!({"action": "accept", "content": {"name": "Bo", "age": 3}}),
            "{:?}",
            done.json()
        );
        assert_eq!(
            done.json()["structuredContent"],
            json!({"action": "accept", "content": {"name": "Bo", "age": 3}})
        );
        // Denied: decline; `plugd approvals deny --reason cancel`: cancel.
        let call = scope.spawn(invoke);
        let id = pending_question(&serve)["id"].as_str().unwrap().to_owned();
        let out = ws.plugd(&["approvals", "deny", &id]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            call.join().unwrap().json()["structuredContent"]["action"],
            "decline"
        );
        let call = scope.spawn(invoke);
        let id = pending_question(&serve)["id"].as_str().unwrap().to_owned();
        let out = ws.plugd(&["approvals", "deny", &id, "--reason", "cancel"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            call.join().unwrap().json()["structuredContent"]["action"],
            "cancel"
        );
        // Nobody answers within risk.approval_timeout_secs: cancel.
        let started = Instant::now();
        let done = invoke();
        assert_eq!(
            done.json()["structuredContent"]["action"],
            "cancel",
            "{:?}",
            done.json()
        );
        assert!(started.elapsed() >= Duration::from_secs(2));
    });
    let (_, log) = serve.stop();
    assert!(log.contains("MCP server asks a person"), "{log}");
}
