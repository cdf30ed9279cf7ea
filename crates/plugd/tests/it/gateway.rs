//! The MCP gateway driven by a real MCP client, the official Python SDK
//! (`mcp` 2.3.0, `tests/plugins/gateway/mcp_client.py`): `plugd mcp` on
//! stdio and `/mcp` of a real `plugd serve`, over a workspace with a native
//! (Python), a Salmex (Bash), a VAI and an MCP (server-everything) plugin.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{Serve, make_token, request_as};
use crate::support::{Ws, path_with_venv, repo, stderr};

/// A workspace with one plugin of four dialects, all approved, and
/// `plugd_yaml` as its plugd.yaml.
pub(crate) fn workspace(plugd_yaml: &str) -> Ws {
    let ws = Ws::new();
    ws.example("hello-python");
    ws.example("hello-salmex-bash");
    crate::support::copy_dir(
        &repo().join("examples/workspace/.plugins/vai-devkit"),
        &ws.plugin_dir("vai-devkit"),
    );
    let everything = repo()
        .join(".npm-tools/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        everything.exists(),
        "run ./scripts/test: it installs server-everything"
    );
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"everything": {"command": "node", "args": [everything, "stdio"]}}})
            .to_string(),
    )
    .unwrap();
    std::fs::write(ws.dir().join("plugd.yaml"), plugd_yaml).unwrap();
    for id in [
        "hello_python",
        "hello-salmex-bash",
        "acme/devkit",
        "everything",
    ] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "approve {id}: {}", stderr(&o));
    }
    ws
}

const POLICY: &str =
    "risk:\n  approval_timeout_secs: 2\n  tools:\n    hello_python_add: critical\n";

/// Runs the Python client with `plan`; its report and stderr.
pub(crate) fn client(plan: Value) -> (Value, String) {
    let python = repo().join(".venv/bin/python3");
    #[allow(clippy::disallowed_methods)] // the test drives a real MCP client
    let out = std::process::Command::new(python)
        .arg(repo().join("tests/plugins/gateway/mcp_client.py"))
        .arg(plan.to_string())
        .env("PATH", path_with_venv())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "mcp_client.py failed: {err}");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no report ({e}): {}\n{err}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (report, err)
}

/// Runs the TypeScript SDK client with `plan`; its report.
pub(crate) fn ts_client(plan: Value) -> Value {
    #[allow(clippy::disallowed_methods)] // the test drives a real MCP client
    let out = std::process::Command::new("node")
        .arg(repo().join("tests/plugins/gateway/ts_client.mjs"))
        .arg(plan.to_string())
        .env("PATH", path_with_venv())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "ts_client.mjs failed: {err}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no report ({e}): {}\n{err}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A stdio plan: `plugd mcp [extra…]` on `ws`.
pub(crate) fn stdio_plan(ws: &Ws, extra: &[&str], elicit: Option<&str>, steps: Value) -> Value {
    let mut args = vec![
        "--workspace".to_owned(),
        ws.dir().display().to_string(),
        "mcp".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    json!({
        "transport": "stdio",
        "command": env!("CARGO_BIN_EXE_plugd"),
        "args": args,
        "env": crate::support::client_env(ws),
        "mode": "legacy",
        "elicit": elicit,
        "steps": steps,
    })
}

pub(crate) fn step(report: &Value, i: usize) -> &Value {
    &report["steps"][i]
}

pub(crate) fn names(list: &Value) -> Vec<String> {
    list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_python_sdk_lists_and_calls_every_dialect_through_plugd_mcp() {
    let ws = workspace(POLICY);
    let (report, _) = client(stdio_plan(
        &ws,
        &[],
        Some("accept"),
        json!([
            {"op": "list"},
            {"op": "call", "name": "hello_python_greet", "args": {"name": "mcp"}},
            {"op": "call", "name": "hello-salmex-bash__say_hello", "args": {"name": "mcp"}},
            {"op": "call", "name": "acme__devkit__text_stats", "args": {"text": "one two\nthree"}},
            {"op": "call", "name": "everything__echo", "args": {"message": "hi"}},
            {"op": "call", "name": "everything__trigger-long-running-operation", "args": {"duration": 1, "steps": 2}, "progress": true},
            {"op": "call", "name": "hello_python_add", "args": {"a": 2, "b": 3}},
            {"op": "call", "name": "hello_python_greet", "args": {"name": 7}},
            {"op": "call", "name": "no_such_tool", "args": {}},
        ]),
    ));
    assert_eq!(report["protocol_version"], "2025-11-25", "{report}");
    assert_eq!(report["server_info"]["name"], "plugd");
    let listed = names(step(&report, 0));
    for n in [
        "hello_python_greet",
        "hello_python_add",
        "hello-salmex-bash__say_hello",
        "acme__devkit__text_stats",
        "everything__echo",
    ] {
        assert!(
            listed.contains(&n.to_owned()),
            "{n} missing from {listed:?}"
        );
    }
    let tools = step(&report, 0)["tools"].as_array().unwrap();
    let add = tools
        .iter()
        .find(|t| t["name"] == "hello_python_add")
        .unwrap();
    assert_eq!(
        add["annotations"]["destructiveHint"], true,
        "critical tools are marked: {add}"
    );
    assert_eq!(add["_meta"]["plugd/risk"], "critical");
    let echo = tools
        .iter()
        .find(|t| t["name"] == "everything__echo")
        .unwrap();
    assert_eq!(echo["_meta"]["plugd/tool"], "everything/echo");

    assert_eq!(step(&report, 1)["text"], "Hello, mcp!", "{report}");
    assert!(
        step(&report, 2)["text"].as_str().unwrap().contains("mcp"),
        "{report}"
    );
    assert_eq!(step(&report, 3)["is_error"], false, "{report}");
    assert_eq!(step(&report, 3)["structured"]["words"], 3, "{report}");
    assert_eq!(step(&report, 4)["text"], "Echo: hi", "{report}");
    let progress = step(&report, 5)["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 2, "one notification per step: {report}");
    assert!(progress[0]["progress"].as_f64() < progress[1]["progress"].as_f64());
    // The critical call was put to the client's user, who approved it.
    assert_eq!(
        report["elicitations"].as_array().unwrap().len(),
        1,
        "{report}"
    );
    assert!(
        report["elicitations"][0]
            .as_str()
            .unwrap()
            .contains("hello_python_add")
    );
    assert_eq!(step(&report, 6)["is_error"], false, "{report}");
    assert!(
        step(&report, 6)["text"].as_str().unwrap().contains('5'),
        "{report}"
    );
    // Bad arguments are a tool error the model can read; an unknown tool a protocol error.
    assert_eq!(step(&report, 7)["is_error"], true, "{report}");
    assert!(
        step(&report, 7)["text"]
            .as_str()
            .unwrap()
            .contains("input schema"),
        "{report}"
    );
    assert!(
        step(&report, 8)["error"]
            .as_str()
            .unwrap()
            .contains("Unknown tool: no_such_tool"),
        "{report}"
    );
}

#[test]
fn the_hooks_of_plugd_yaml_guard_gateway_calls() {
    let ws = workspace(
        "plugins:\n  custom:\n    - name: guard\n      module: \"${{dexto.agent_dir}}/guard.mjs\"\n      enabled: true\n      blocking: true\n      priority: 5\n",
    );
    std::fs::copy(
        repo().join("tests/plugins/gateway/guard.mjs"),
        ws.dir().join("guard.mjs"),
    )
    .unwrap();
    let (report, _) = client(stdio_plan(
        &ws,
        &[],
        None,
        json!([
            {"op": "call", "name": "hello_python_add", "args": {"a": 101, "b": 1}},
            {"op": "call", "name": "hello_python_add", "args": {"a": 1, "b": 1}},
            {"op": "call", "name": "hello_python_greet", "args": {"name": "eve"}},
            {"op": "call", "name": "everything__echo", "args": {"message": "secret"}},
        ]),
    ));
    // Blocked before the plugin: a tool error with the hook's message.
    assert_eq!(step(&report, 0)["is_error"], true, "{report}");
    assert!(
        step(&report, 0)["text"]
            .as_str()
            .unwrap()
            .contains("too big for the guard"),
        "{report}"
    );
    assert!(
        step(&report, 1)["text"].as_str().unwrap().contains('2'),
        "{report}"
    );
    // Arguments modified before the call, results after it.
    assert_eq!(
        step(&report, 2)["text"],
        "Hello, eve (guarded)!",
        "{report}"
    );
    assert_eq!(step(&report, 3)["text"], "redacted by guard", "{report}");
}

#[test]
fn a_declined_or_unanswerable_approval_denies_the_call_and_the_plugin_never_runs_it() {
    let ws = workspace(POLICY);
    let call = json!([{"op": "call", "name": "hello_python_add", "args": {"a": 1, "b": 1}}]);
    let (report, _) = client(stdio_plan(&ws, &[], Some("decline"), call.clone()));
    assert_eq!(step(&report, 0)["is_error"], true, "{report}");
    assert!(
        step(&report, 0)["text"]
            .as_str()
            .unwrap()
            .contains("declined"),
        "{report}"
    );
    // A client without elicitation: the call waits as a pending approval,
    // and nobody approves it within plugd.yaml's 2 s.
    let (report, _) = client(stdio_plan(&ws, &[], None, call));
    assert_eq!(step(&report, 0)["is_error"], true, "{report}");
    let text = step(&report, 0)["text"].as_str().unwrap();
    assert!(
        text.contains("nobody approved it") && text.contains("plugd approvals approve"),
        "{text}"
    );
    assert!(report["elicitations"].as_array().unwrap().is_empty());
}

#[test]
fn a_profile_limits_what_is_listed_and_called_and_an_unknown_one_is_refused() {
    let ws = workspace(&format!(
        "{POLICY}mcp:\n  profiles:\n    greet:\n      tools: [\"*greet*\", \"*/say_hello\"]\n    ev:\n      plugins: [everything, hello-salmex-bash]\n      bare_names: true\n"
    ));
    let (report, _) = client(stdio_plan(
        &ws,
        &["--profile", "greet"],
        None,
        json!([
            {"op": "list"},
            {"op": "call", "name": "everything__echo", "args": {"message": "x"}},
            {"op": "call", "name": "hello_python_greet", "args": {"name": "p"}},
        ]),
    ));
    let mut listed = names(step(&report, 0));
    listed.sort();
    assert_eq!(
        listed,
        ["hello-salmex-bash__say_hello", "hello_python_greet"],
        "{report}"
    );
    // Outside the profile, a tool does not exist.
    assert!(
        step(&report, 1)["error"]
            .as_str()
            .unwrap()
            .contains("Unknown tool"),
        "{report}"
    );
    assert_eq!(step(&report, 2)["text"], "Hello, p!", "{report}");

    // A bare-names view serves the plugins' own names.
    let (report, _) = client(stdio_plan(
        &ws,
        &["--profile", "ev"],
        None,
        json!([
            {"op": "list"},
            {"op": "call", "name": "echo", "args": {"message": "bare"}},
            {"op": "call", "name": "say_hello", "args": {"name": "b"}},
        ]),
    ));
    let listed = names(step(&report, 0));
    assert!(
        listed.contains(&"echo".to_owned()) && listed.contains(&"say_hello".to_owned()),
        "{listed:?}"
    );
    assert!(
        !listed
            .iter()
            .any(|n| n.contains("__") || n.starts_with("hello_python")),
        "{listed:?}"
    );
    assert_eq!(step(&report, 1)["text"], "Echo: bare", "{report}");
    assert_eq!(step(&report, 2)["text"], "Hello, b!", "{report}");

    let o = ws.plugd(&["mcp", "--profile", "nope"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no MCP profile \"nope\"") && stderr(&o).contains("greet"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_stateless_revision_is_found_by_server_discover_and_served() {
    let ws = workspace(POLICY);
    let mut plan = stdio_plan(
        &ws,
        &[],
        None,
        json!([
            {"op": "list"},
            {"op": "call", "name": "everything__echo", "args": {"message": "modern"}},
        ]),
    );
    plan["mode"] = json!("auto");
    let (report, _) = client(plan);
    assert_eq!(report["protocol_version"], "2026-07-28", "{report}");
    assert!(names(step(&report, 0)).contains(&"everything__echo".to_owned()));
    assert_eq!(step(&report, 1)["text"], "Echo: modern", "{report}");
}

#[test]
fn a_client_cancel_reaches_the_call_and_the_gateway_keeps_serving() {
    let ws = workspace(POLICY);
    let (report, err) = client(stdio_plan(
        &ws,
        &[],
        None,
        json!([
            {"op": "call", "name": "hello_python_greet", "args": {"name": "slow", "delay_ms": 20000}, "timeout": 1},
            {"op": "call", "name": "hello_python_greet", "args": {"name": "after"}},
        ]),
    ));
    assert!(step(&report, 0)["error"].is_string(), "{report}");
    assert!(err.contains("MCP client cancelled a request"), "{err}");
    assert_eq!(step(&report, 1)["text"], "Hello, after!", "{report}");
}

#[test]
fn hosted_servers_resources_and_prompts_are_served_with_their_origin_in_the_name() {
    let ws = workspace(POLICY);
    let (report, _) = client(stdio_plan(
        &ws,
        &[],
        None,
        json!([
            {"op": "resources"},
            {"op": "templates"},
            {"op": "read", "uri": "plugd:///everything/demo://resource/static/document/features.md"},
            {"op": "read", "uri": "plugd:///everything/demo://resource/dynamic/text/7"},
            {"op": "read", "uri": "plugd:///nobody/demo://x"},
            {"op": "prompts"},
            {"op": "get_prompt", "name": "everything__args-prompt", "args": {"city": "Paris"}},
            {"op": "complete_prompt", "name": "everything__completable-prompt", "argument": {"name": "department", "value": "E"}},
            {"op": "get_prompt", "name": "nobody__x"},
        ]),
    ));
    let uris: Vec<&str> = step(&report, 0)["result"]["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"))
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert!(
        uris.contains(&"plugd:///everything/demo://resource/static/document/features.md"),
        "{uris:?}"
    );
    assert!(
        uris.iter().all(|u| u.starts_with("plugd:///everything/")),
        "{uris:?}"
    );
    let templates = step(&report, 1)["result"]["resourceTemplates"].to_string();
    assert!(
        templates.contains("plugd:///everything/demo://resource/dynamic/text/{resourceId}"),
        "{templates}"
    );
    let read = &step(&report, 2)["result"]["contents"][0];
    assert_eq!(
        read["uri"], "plugd:///everything/demo://resource/static/document/features.md",
        "{report}"
    );
    assert!(
        read["text"].as_str().is_some_and(|t| !t.is_empty()),
        "{report}"
    );
    assert_eq!(
        step(&report, 3)["result"]["contents"][0]["uri"],
        "plugd:///everything/demo://resource/dynamic/text/7"
    );
    assert!(
        step(&report, 4)["error"]
            .as_str()
            .unwrap()
            .contains("Resource not found"),
        "{report}"
    );
    let prompts = step(&report, 5)["result"]["prompts"].to_string();
    assert!(prompts.contains("everything__args-prompt"), "{prompts}");
    assert_eq!(
        step(&report, 6)["result"]["messages"][0]["content"]["text"],
        "What's weather in Paris?",
        "{report}"
    );
    assert_eq!(
        step(&report, 7)["result"]["completion"]["values"],
        json!(["Engineering"]),
        "{report}"
    );
    assert!(
        step(&report, 8)["error"]
            .as_str()
            .unwrap()
            .contains("Unknown prompt"),
        "{report}"
    );
}

#[test]
fn a_hosted_servers_questions_and_log_lines_reach_the_gateways_client() {
    // The conformance fixture server (the official Python SDK) elicits,
    // samples and logs during its calls; plugd passes each to the client
    // that made the call.
    let ws = Ws::new();
    for f in [".mcp.json", "conformance_server.py"] {
        std::fs::copy(
            repo().join("tests/conformance/workspace").join(f),
            ws.dir().join(f),
        )
        .unwrap();
    }
    let o = ws.plugd(&["plugin", "approve", "conformance"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let steps = json!([
        {"op": "call", "name": "conformance__test_elicitation", "args": {"message": "who are you?"}},
        {"op": "call", "name": "conformance__test_sampling", "args": {"prompt": "say hi"}},
        {"op": "call", "name": "conformance__test_tool_with_logging", "args": {}},
    ]);
    let mut plan = stdio_plan(&ws, &[], Some("accept"), steps.clone());
    plan["sample"] = json!("hi from the client");
    let (report, _) = client(plan);
    assert_eq!(report["elicitations"], json!(["who are you?"]), "{report}");
    assert!(
        step(&report, 0)["text"]
            .as_str()
            .unwrap()
            .contains("accept"),
        "{report}"
    );
    assert!(
        step(&report, 0)["text"]
            .as_str()
            .unwrap()
            .contains("ada@example.org"),
        "{report}"
    );
    assert_eq!(report["samplings"], json!(["say hi"]), "{report}");
    assert_eq!(
        step(&report, 1)["text"],
        "LLM response: hi from the client",
        "{report}"
    );
    let logs = report["logs"].to_string();
    assert!(
        logs.contains("Tool execution started") && logs.contains("Tool execution completed"),
        "{report}"
    );

    // A client without those capabilities: the server is told no one can
    // answer, and its tool fails saying so; the sampling refusal, which the
    // SDK server answers as a JSON-RPC error, reaches the client as one,
    // the server's message kept.
    let (report, _) = client(stdio_plan(&ws, &[], None, steps));
    assert_eq!(step(&report, 0)["is_error"], true, "{report}");
    assert!(
        step(&report, 1)["error"]
            .as_str()
            .is_some_and(|e| e.contains("plugd does not sample")),
        "{report}"
    );
    assert_eq!(step(&report, 2)["is_error"], false, "{report}");
}

#[test]
fn the_typescript_sdk_lists_and_calls_through_stdio_and_http() {
    let ws = workspace(POLICY);
    let steps = json!([
        {"op": "list"},
        {"op": "call", "name": "hello_python_greet", "args": {"name": "ts"}},
        {"op": "call", "name": "hello-salmex-bash__say_hello", "args": {"name": "ts"}},
        {"op": "call", "name": "acme__devkit__text_stats", "args": {"text": "a b"}},
        {"op": "call", "name": "everything__trigger-long-running-operation", "args": {"duration": 1, "steps": 2}, "progress": true},
        {"op": "call", "name": "hello_python_add", "args": {"a": 20, "b": 22}},
    ]);
    let report = ts_client(stdio_plan(&ws, &[], Some("accept"), steps));
    assert_eq!(report["server_info"]["name"], "plugd", "{report}");
    assert!(
        names(step(&report, 0)).contains(&"everything__echo".to_owned()),
        "{report}"
    );
    assert_eq!(step(&report, 1)["text"], "Hello, ts!", "{report}");
    assert!(
        step(&report, 2)["text"].as_str().unwrap().contains("ts"),
        "{report}"
    );
    assert_eq!(step(&report, 3)["structured"]["words"], 2, "{report}");
    // plugd writes both progress notifications before the response (the
    // Python client sees both, every run); the TypeScript SDK runs notification handlers in a microtask
    // but responses at once, so a progress read in the same chunk as the
    // response is dropped by the SDK ("unknown token"). At least the first
    // arrives.
    let progress = step(&report, 4)["progress"].as_array().unwrap();
    assert!(!progress.is_empty() && progress.len() <= 2, "{report}");
    assert_eq!(
        report["elicitations"].as_array().unwrap().len(),
        1,
        "{report}"
    );
    assert!(
        step(&report, 5)["text"].as_str().unwrap().contains("42"),
        "{report}"
    );

    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let report = ts_client(json!({
        "transport": "http",
        "url": format!("http://{}/mcp", serve.addr),
        "token": token,
        "elicit": null,
        "steps": [
            {"op": "list"},
            {"op": "call", "name": "everything__echo", "args": {"message": "ts over http"}},
            {"op": "call", "name": "everything__trigger-long-running-operation", "args": {"duration": 1, "steps": 2}, "progress": true},
        ],
    }));
    assert!(
        names(step(&report, 0)).contains(&"hello_python_greet".to_owned()),
        "{report}"
    );
    assert_eq!(step(&report, 1)["text"], "Echo: ts over http", "{report}");
    let progress = step(&report, 2)["progress"].as_array().unwrap();
    assert!(!progress.is_empty() && progress.len() <= 2, "{report}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

/// A raw MCP POST to `path` with `token`, optional session id.
pub(crate) fn mcp_post(
    serve: &Serve,
    token: &str,
    path: &str,
    session: Option<&str>,
    body: &Value,
) -> crate::http::Resp {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    if let Some(s) = session {
        headers.push(("Mcp-Session-Id", s));
    }
    request_as(
        serve,
        token,
        "POST",
        path,
        &headers,
        Some(body.to_string().as_bytes()),
    )
}

pub(crate) fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

#[test]
fn http_sessions_need_a_token_and_belong_to_the_identity_that_opened_them() {
    let ws = workspace(&format!(
        "{POLICY}mcp:\n  profiles:\n    greet:\n      tools: [\"*greet*\"]\n"
    ));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let alice = make_token(&ws, "agent");
    let bob = make_token(&ws, "agent");
    let viewer = make_token(&ws, "viewer");

    let r = mcp_post(
        &serve,
        "plugd_0000000000000000_00",
        "/mcp",
        None,
        &initialize(),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    let r = mcp_post(&serve, &viewer, "/mcp", None, &initialize());
    assert_eq!(
        r.status,
        403,
        "a viewer may not open MCP sessions: {}",
        r.text()
    );

    let r = mcp_post(&serve, &alice, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["protocolVersion"], "2025-06-18");
    let sid = r.header("mcp-session-id").expect("a session id").to_owned();
    assert!(sid.len() >= 32, "session ids are unguessable: {sid}");

    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let r = mcp_post(&serve, &alice, "/mcp", Some(&sid), &list);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["result"]["tools"].as_array().unwrap().len() >= 5);
    // Another identity cannot use it, nor tell it exists.
    let r = mcp_post(&serve, &bob, "/mcp", Some(&sid), &list);
    r.error(404, "mcp_session_not_found");
    let r = mcp_post(&serve, &alice, "/mcp", None, &list);
    r.error(400, "mcp_session_required");
    let r = mcp_post(&serve, &alice, "/mcp", Some("feedface"), &list);
    r.error(404, "mcp_session_not_found");
    // The same session under another profile path is not the same session.
    let r = mcp_post(&serve, &alice, "/mcp/other", Some(&sid), &list);
    assert_eq!(r.status, 404, "{}", r.text());
    // A notification is accepted without a body.
    let r = mcp_post(
        &serve,
        &alice,
        "/mcp",
        Some(&sid),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    // Malformed JSON is the API's error, not a crash.
    let r = request_as(
        &serve,
        &alice,
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Mcp-Session-Id", &sid),
        ],
        Some(b"{nope"),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    // A foreign Origin is refused (DNS rebinding).
    let r = request_as(
        &serve,
        &alice,
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Origin", "http://evil.example"),
        ],
        Some(initialize().to_string().as_bytes()),
    );
    assert_eq!(r.status, 403, "{}", r.text());

    let r = request_as(
        &serve,
        &bob,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &sid)],
        None,
    );
    assert_eq!(
        r.status,
        404,
        "bob cannot end alice's session: {}",
        r.text()
    );
    let r = request_as(
        &serve,
        &alice,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &sid)],
        None,
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let r = mcp_post(&serve, &alice, "/mcp", Some(&sid), &list);
    r.error(404, "mcp_session_not_found");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn the_python_sdk_over_http_calls_tools_and_hears_list_changed_after_a_revoke() {
    let ws = workspace(POLICY);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let go = ws.dir().join("go");
    let plan = json!({
        "transport": "http",
        "url": format!("http://{}/mcp", serve.addr),
        "token": token,
        "mode": "legacy",
        "elicit": null,
        "steps": [
            {"op": "list"},
            {"op": "call", "name": "everything__echo", "args": {"message": "over http"}},
            {"op": "call", "name": "everything__trigger-long-running-operation", "args": {"duration": 1, "steps": 2}, "progress": true},
            {"op": "touch", "path": go},
            {"op": "wait_changed", "timeout": 20},
            {"op": "list"},
        ],
    });
    let driver = std::thread::spawn({
        let go = go.clone();
        let dir = ws.dir().to_owned();
        move || {
            assert!(
                wait_for(&go, Duration::from_secs(60)),
                "the client never got to its wait"
            );
            let o = crate::support::plugd_cmd(&dir)
                .args(["plugin", "revoke", "hello_python"])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    });
    let (report, _) = client(plan);
    driver.join().unwrap();
    assert_eq!(step(&report, 1)["text"], "Echo: over http", "{report}");
    assert_eq!(
        step(&report, 2)["progress"].as_array().unwrap().len(),
        2,
        "{report}"
    );
    assert!(report["list_changed"].as_u64().unwrap() >= 1, "{report}");
    let after = names(step(&report, 5));
    assert!(
        !after.contains(&"hello_python_greet".to_owned()),
        "{after:?}"
    );
    assert!(after.contains(&"everything__echo".to_owned()), "{after:?}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("MCP tool call"), "calls are logged: {log}");
}

fn wait_for(path: &Path, limit: Duration) -> bool {
    crate::support::eventually_blocking(limit, || path.exists())
}

#[test]
fn hostile_stdio_input_gets_errors_and_the_gateway_keeps_serving() {
    use std::io::{BufRead, BufReader, Write};
    let ws = Ws::new();
    ws.example("hello-python");
    let o = ws.plugd(&["plugin", "approve", "hello_python"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut child = crate::support::plugd_cmd(ws.dir())
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next =
        move || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let mut send = move |line: &str| {
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    };
    // Before initialize, a request other than ping is refused.
    send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    let r = next();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("initialize"),
        "{r}"
    );
    send("this is not json");
    assert_eq!(next()["error"]["code"], -32700);
    send("[1, 2]");
    let r = next();
    assert_eq!(r[0]["error"]["code"], -32600, "{r}");
    send(r#"{"jsonrpc":"1.0","id":2,"method":"ping"}"#);
    assert_eq!(next()["error"]["code"], -32600);
    send(r#"{"jsonrpc":"2.0","id":{"no":"objects"},"method":"ping"}"#);
    assert_eq!(next()["error"]["code"], -32600);
    // A line over the 16 MiB frame limit is skipped unbuffered and answered.
    send(&format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(17 << 20)
    ));
    let r = next();
    assert!(
        r["error"]["message"].as_str().unwrap().contains("limit"),
        "{r}"
    );
    // Lies that need no answer: a cancel of nothing, a response to nothing.
    send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999}}"#);
    send(r#"{"jsonrpc":"2.0","id":"plugd-77","result":{"action":"accept"}}"#);
    send(
        r#"{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":"1999-01-01","capabilities":[],"clientInfo":7}}"#,
    );
    let r = next();
    assert_eq!(
        r["result"]["protocolVersion"], "2025-11-25",
        "an unknown revision gets the newest: {r}"
    );
    // No batches on a revision without them: refused whole, nothing runs.
    send(
        r#"[{"jsonrpc":"2.0","id":41,"method":"ping"},{"jsonrpc":"2.0","id":42,"method":"ping"}]"#,
    );
    let r = next();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not part of MCP revision 2025-11-25"),
        "{r}"
    );
    send(
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"hello_python_greet","arguments":[1]}}"#,
    );
    assert_eq!(next()["error"]["code"], -32602);
    send(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"../../etc/passwd"}}"#);
    assert_eq!(next()["error"]["code"], -32602);
    send(
        r#"{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"plugd:///../../x"}}"#,
    );
    assert_eq!(next()["error"]["code"], -32002);
    send(
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"hello_python_greet","arguments":{"name":"still here"}}}"#,
    );
    let r = next();
    assert_eq!(
        r["result"]["content"][0]["text"], "Hello, still here!",
        "{r}"
    );
    drop(send);
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "plugd mcp exits cleanly when stdin closes: {status}"
    );
}
