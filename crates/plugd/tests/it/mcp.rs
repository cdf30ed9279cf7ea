//! mcp dialect: MCP servers over stdio, declared in `.mcp.json`, through the
//! runtime and the CLI. The real `@modelcontextprotocol/server-everything`
//! (installed by scripts/test into `.npm-tools/`) and a hostile Python server
//! (`tests/plugins/mcp/hostile_mcp.py`) that crashes, lies about its protocol
//! version, prints junk, pages endlessly and ignores cancellation and SIGTERM.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use plugd_dialects::mcp::{NOT_SUPPORTED, file_uri};
use plugd_host::dialect::CallContext;
use plugd_host::model::ToolError;
use plugd_host::spawn::process_group_alive;
use plugd_host::{CallError, CallToolError, Status};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, quick, repo, stderr, stdout};

/// `.npm-tools/…/server-everything/dist/index.js`, installed by scripts/test.
fn everything_js() -> PathBuf {
    let p = repo()
        .join(".npm-tools/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        p.exists(),
        "{} is missing: run ./scripts/test, which installs @modelcontextprotocol/server-everything into .npm-tools/",
        p.display()
    );
    p
}

pub(crate) fn everything() -> Value {
    json!({"command": "node", "args": [everything_js(), "stdio"]})
}

fn hostile(mode: &str, arg: Option<&str>) -> Value {
    let script = repo().join("tests/plugins/mcp/hostile_mcp.py");
    let mut args = vec![json!(script), json!(mode)];
    if let Some(a) = arg {
        args.push(json!(a));
    }
    json!({"command": "python3", "args": args})
}

/// A workspace whose `.mcp.json` declares `servers`.
pub(crate) fn mcp_ws(servers: Value) -> Ws {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join(".mcp.json"),
        serde_json::to_vec_pretty(&json!({"mcpServers": servers})).unwrap(),
    )
    .unwrap();
    ws
}

/// A workspace with one hostile server `h`, approved, in a runtime.
async fn approved(mode: &str, arg: Option<&str>, tool_timeout_ms: u64) -> (Ws, Runtime) {
    let ws = mcp_ws(json!({"h": hostile(mode, arg)}));
    let rt = ws.runtime(quick(tool_timeout_ms)).await;
    rt.approve("h", "test").await.unwrap();
    (ws, rt)
}

fn structured(v: &Value) -> &Value {
    &v["structuredContent"]
}

async fn pid_of(rt: &Runtime) -> u64 {
    let v = rt.call_tool("h/pid", json!({}), None).await.unwrap();
    structured(&v)["pgid"].as_u64().unwrap()
}

/// Calls `name` with its own deadline (the runtime's default stays generous,
/// so only this call can time out on a loaded machine).
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

fn is_timeout(err: &CallToolError) -> bool {
    matches!(
        err,
        CallToolError::Tool(ToolError::Call(CallError::Timeout { .. }))
    )
}

fn tool_names(rt: &Runtime) -> Vec<String> {
    rt.tools().iter().map(|t| t.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_negotiates_and_lists_namespaced_tools() {
    let (_ws, rt) = approved("good", None, 10_000).await;
    let names = tool_names(&rt);
    for t in ["h/echo", "h/fail", "h/sleep", "h/ask"] {
        assert!(names.contains(&t.to_owned()), "{t} missing from {names:?}");
    }
    let echo = rt.tools().into_iter().find(|t| t.name == "h/echo").unwrap();
    assert_eq!(
        echo.def.wire(),
        "echo",
        "the MCP tool name goes on the wire"
    );
    assert_eq!(echo.def.input_schema["required"], json!(["message"]));
    let info = rt.plugin("h").await.unwrap();
    assert_eq!(info.dialect, "mcp");
    assert!(info.approved);

    // What plugd sent: the offer, its identity and capabilities, then initialized.
    let client = rt.call_tool("h/client", json!({}), None).await.unwrap();
    let init = &structured(&client)["initialize"];
    assert_eq!(init["protocolVersion"], "2025-11-25");
    assert_eq!(init["clientInfo"]["name"], "plugd");
    assert!(init["clientInfo"]["version"].is_string());
    assert_eq!(
        init["capabilities"],
        json!({"elicitation": {}, "sampling": {}}),
        "no roots are offered unless plugd.yaml configures them; elicitation and sampling are (answered during gateway calls)"
    );
    assert_eq!(structured(&client)["initialized"], true);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_returns_the_whole_result_and_is_error_is_a_tool_failure() {
    let (_ws, rt) = approved("good", None, 10_000).await;
    let got = rt
        .call_tool("h/echo", json!({"message": "hi"}), None)
        .await
        .unwrap();
    assert_eq!(got["content"][0]["text"], "Echo: hi");
    assert_eq!(structured(&got), &json!({"echo": {"message": "hi"}}));

    let err = rt.call_tool("h/fail", json!({}), None).await.unwrap_err();
    match &err {
        RuntimeError::Call(CallToolError::Tool(ToolError::ExecutionFailed {
            plugin,
            tool,
            message,
        })) => {
            assert_eq!((&**plugin, tool.as_str()), ("h", "h/fail"));
            assert_eq!(message, "it broke on purpose");
        }
        other => panic!("{other:?}"),
    }
    // Arguments are checked against inputSchema before the server sees them.
    let err = rt.call_tool("h/echo", json!({}), None).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Args(_)), "{err:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonrpc_error_reaches_the_caller_as_a_protocol_error() {
    let (_ws, rt) = approved("good", None, 10_000).await;
    let err = rt
        .call_tool("h/proto_error", json!({}), None)
        .await
        .unwrap_err();
    match &err {
        RuntimeError::Call(CallToolError::Tool(ToolError::Call(CallError::Remote {
            method,
            error,
            ..
        }))) => {
            assert_eq!(method, "tools/call");
            assert_eq!(error.code, -32602);
            assert_eq!(error.message, "no such thing: proto_error");
        }
        other => panic!("{other:?}"),
    }
    // The connection is fine afterwards.
    rt.call_tool("h/echo", json!({"message": "x"}), None)
        .await
        .unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_sends_cancelled_and_a_quiet_server_stays_alive() {
    let (_ws, rt) = approved("good", None, 1000).await;
    let before = pid_of(&rt).await;
    let err = rt
        .call_tool("h/sleep", json!({"ms": 5000}), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Call(CallToolError::Tool(ToolError::Call(
                CallError::Timeout { .. }
            )))
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("did not answer tools/call within"),
        "{err}"
    );
    // The cancel is queued as the caller gives up; ask until the server saw it.
    let mut seen = Vec::new();
    for _ in 0..50 {
        let got = rt.call_tool("h/cancels", json!({}), None).await.unwrap();
        seen = structured(&got)["cancelled"].as_array().unwrap().clone();
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0]["requestId"].is_i64(), "{seen:?}");
    assert_eq!(seen[0]["reason"], "deadline_exceeded");
    // It went quiet: past the grace period it is still the same process.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(pid_of(&rt).await, before);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_keeps_working_after_cancel_is_killed() {
    let (_ws, rt) = approved("ignore_cancel", None, 10_000).await;
    let sup = rt.supervised("h").unwrap().clone();
    // More rounds than the restart budget (3): a kill for ignoring a cancel
    // is plugd's decision, not a crash, so it never leads to `failed`.
    for round in 0..4 {
        let pgid = pid_of(&rt).await;
        let err = call_within(&rt, "h/sleep", json!({"ms": 20_000}), 300)
            .await
            .unwrap_err();
        assert!(is_timeout(&err), "{err:?}");
        // Progress keeps coming for the cancelled call; past the 2 s grace the
        // whole group is killed (long before the 20 s sleep would end).
        assert!(
            eventually(Duration::from_secs(10), || !process_group_alive(
                pgid as u32
            ))
            .await,
            "round {round}: the runaway server {pgid} is still alive"
        );
        assert!(
            eventually(Duration::from_secs(5), || matches!(
                sup.status(),
                Status::Idle
            ))
            .await,
            "round {round}: {:?}",
            sup.status()
        );
    }
    // It starts again on the next call; handles keep working.
    rt.call_tool("h/echo", json!({"message": "again"}), None)
        .await
        .unwrap();
    assert!(
        matches!(sup.status(), Status::Running { .. }),
        "{:?}",
        sup.status()
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_fails_the_call_and_the_restart_keeps_tool_handles() {
    let (_ws, rt) = approved("good", None, 30_000).await;
    let before = pid_of(&rt).await;
    let t = Instant::now();
    let err = rt.call_tool("h/crash", json!({}), None).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("crashed: exit status 3") && text.contains("crashing on purpose"),
        "{text}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the crash, not the 30 s deadline, ended it"
    );
    let sup = rt.supervised("h").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            sup.status(),
            Status::Running { pid, .. } if pid as u64 != before
        ))
        .await,
        "{:?}",
        sup.status()
    );
    assert_ne!(
        pid_of(&rt).await,
        before,
        "a new process serves the same handles"
    );
    rt.call_tool("h/echo", json!({"message": "x"}), None)
        .await
        .unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_protocol_version_is_refused_and_the_server_killed() {
    let ws = Ws::new();
    let pid_file = ws.dir().join("pid");
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&pid_file, "").unwrap();
    let mut entry = hostile("version", Some("1999-01-01"));
    entry["env"] = json!({"HOSTILE_PID_FILE": pid_file});
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {
            "h": entry,
            "old": hostile("version", Some("2025-03-26")),
            "oldest": hostile("version", Some("2024-11-05")),
        }})
        .to_string(),
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    let err = rt.approve("h", "test").await.unwrap_err().to_string();
    assert!(
        err.contains("unsupported MCP protocol version \"1999-01-01\"")
            && err.contains("2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05"),
        "{err}"
    );
    let info = rt.plugin("h").await.unwrap();
    assert!(!info.approved && info.tools.is_empty(), "{info:?}");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !process_group_alive(pid)).await,
        "the refused server {pid} is still alive"
    );
    // Older revisions plugd accepts, down to 2024-11-05 (still answered by
    // many published servers; both official SDK clients accept it).
    for old in ["old", "oldest"] {
        rt.approve(old, "test").await.unwrap();
        let got = rt
            .call_tool(&format!("{old}/echo"), json!({"message": "x"}), None)
            .await
            .unwrap();
        assert_eq!(got["content"][0]["text"], "Echo: x", "{got}");
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_on_stdout_is_counted_and_skipped() {
    let (_ws, rt) = approved("junk", None, 10_000).await;
    let got = rt
        .call_tool("h/echo", json!({"message": "through junk"}), None)
        .await
        .unwrap();
    assert_eq!(got["content"][0]["text"], "Echo: through junk");
    let stats = rt.plugin("h").await.unwrap().stats.unwrap();
    assert!(stats.junk_frames >= 3, "{stats:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_pages_are_followed_and_endless_paging_is_refused() {
    let (_ws, rt) = approved("paged", Some("2"), 10_000).await;
    let names = tool_names(&rt);
    assert_eq!(names.len(), 12, "six pages of two: {names:?}");
    rt.call_tool("h/client", json!({}), None).await.unwrap();
    rt.shutdown().await;

    let ws = mcp_ws(json!({"h": hostile("endless_pages", None)}));
    let rt = ws.runtime(quick(10_000)).await;
    let err = rt.approve("h", "test").await.unwrap_err().to_string();
    assert!(err.contains("still had more pages after 100"), "{err}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_puts_the_new_tool_in_the_registry() {
    // A tool new since approval waits for re-approval unless the server
    // accepts new tools (see tool_pins.rs for the default).
    let ws = mcp_ws(json!({"h": hostile("good", None)}));
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "mcp:\n  servers:\n    h:\n      accept_new_tools: true\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("h", "test").await.unwrap();
    assert!(!tool_names(&rt).contains(&"h/added".to_owned()));
    rt.call_tool("h/add_tool", json!({}), None).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || tool_names(&rt)
            .contains(&"h/added".to_owned()))
        .await,
        "{:?}",
        tool_names(&rt)
    );
    let got = rt.call_tool("h/added", json!({}), None).await.unwrap();
    assert_eq!(structured(&got), &json!({"added": true}));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_requests_get_ping_roots_and_polite_refusals() {
    let (_ws, rt) = approved("good", None, 10_000).await;
    let got = rt.call_tool("h/ask", json!({}), None).await.unwrap();
    let got = structured(&got);
    assert_eq!(got["ping"], json!({"result": {}}));
    // No roots configured: the workspace is never offered.
    let e = &got["roots/list"]["error"];
    assert_eq!(e["code"], -32601, "{got}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("plugd.yaml mcp.servers.h.roots"),
        "{got}"
    );
    assert!(got["roots/list"]["result"].is_null(), "{got}");
    // Outside a gateway call: sampling needs the operator's consent, and a
    // runtime with no elicitor (no terminal, no serve) has nobody to ask.
    for (method, wants) in [
        ("sampling/createMessage", "set mcp.servers.h.sampling: true"),
        (
            "elicitation/create",
            "plugd has nobody to ask server \"h\"'s question",
        ),
    ] {
        let e = &got[method]["error"];
        assert_eq!(e["code"], NOT_SUPPORTED, "{got}");
        assert!(e["message"].as_str().unwrap().contains(wants), "{got}");
    }
    assert_eq!(got["bogus/method"]["error"]["code"], -32601, "{got}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_does_not_eat_the_call_deadline() {
    // The server takes 1.5 s to answer initialize; the call's deadline is 1 s.
    let (_ws, rt) = approved("slow_start", Some("1500"), 10_000).await;
    rt.supervised("h").unwrap().stop().await;
    let started = Instant::now();
    let got = call_within(&rt, "h/echo", json!({"message": "late"}), 1_000)
        .await
        .unwrap();
    assert_eq!(got["content"][0]["text"], "Echo: late", "{got}");
    assert!(started.elapsed() >= Duration::from_millis(1_500));
    // A call that does time out reports the deadline it was given.
    rt.supervised("h").unwrap().stop().await;
    let err = call_within(&rt, "h/sleep", json!({"ms": 5_000}), 700)
        .await
        .unwrap_err();
    assert!(is_timeout(&err), "{err:?}");
    assert!(err.to_string().contains("700ms"), "{err}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_roots_are_declared_and_answered_in_order() {
    let ws = mcp_ws(json!({"h": hostile("good", None), "other": hostile("good", None)}));
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.dir().join("data")).unwrap();
    // A root given through a symlink is offered as the directory it names.
    std::os::unix::fs::symlink(outside.path(), ws.dir().join("link")).unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "mcp:\n  servers:\n    h:\n      roots: [data, link]\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("h", "test").await.unwrap();
    rt.approve("other", "test").await.unwrap();
    let client = rt.call_tool("h/client", json!({}), None).await.unwrap();
    assert_eq!(
        structured(&client)["initialize"]["capabilities"],
        json!({"roots": {"listChanged": true}, "elicitation": {}, "sampling": {}})
    );
    let got = rt.call_tool("h/ask", json!({}), None).await.unwrap();
    let roots = &structured(&got)["roots/list"]["result"]["roots"];
    assert_eq!(
        roots,
        &json!([
            {"uri": file_uri(&ws.dir().join("data").canonicalize().unwrap()), "name": "data"},
            {"uri": file_uri(&outside.path().canonicalize().unwrap()),
             "name": outside.path().canonicalize().unwrap().file_name().unwrap().to_str().unwrap()},
        ]),
        "{got}"
    );
    // Roots are per server: the other one is offered none.
    let got = rt.call_tool("other/ask", json!({}), None).await.unwrap();
    assert_eq!(
        structured(&got)["roots/list"]["error"]["code"],
        -32601,
        "{got}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_terminates_then_kills_the_group_with_no_orphan() {
    // A server that exits on SIGTERM.
    let (_ws, rt) = approved("good", None, 10_000).await;
    let pgid = pid_of(&rt).await;
    rt.shutdown().await;
    assert!(eventually(Duration::from_secs(5), || !process_group_alive(pgid as u32)).await);

    // One that ignores SIGTERM and has a grandchild: SIGKILL after the grace.
    let (_ws, rt) = approved("ignore_term", None, 10_000).await;
    let pgid = pid_of(&rt).await;
    assert!(process_group_alive(pgid as u32));
    let t = Instant::now();
    rt.shutdown().await;
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(5), || !process_group_alive(pgid as u32)).await,
        "process group {pgid} survived shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_entry_is_listed_broken_and_the_others_work() {
    let ws = mcp_ws(json!({
        "h": hostile("good", None),
        "remote": {"type": "sse", "url": "https://example.com/sse"},
    }));
    let rt = ws.runtime(quick(10_000)).await;
    let plugins = rt.plugins().await.unwrap();
    let remote = plugins.iter().find(|p| p.id == "remote").unwrap();
    assert!(
        remote
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("mcpServers.remote.type: the legacy HTTP+SSE transport"),
        "{remote:?}"
    );
    rt.approve("h", "test").await.unwrap();
    rt.call_tool("h/echo", json!({"message": "x"}), None)
        .await
        .unwrap();
    rt.shutdown().await;
    // Editing the entry withdraws the approval (it is what the digest pins).
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"h": hostile("junk", None)}}).to_string(),
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    assert_eq!(rt.plugin("h").await.unwrap().state, "changed");
    rt.shutdown().await;
}

// The real server: @modelcontextprotocol/server-everything 2026.8.31.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_tools_are_listed_and_callable() {
    let ws = mcp_ws(json!({"everything": everything()}));
    // The operator offers this server one directory as its root.
    std::fs::create_dir(ws.dir().join("shared")).unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "mcp:\n  servers:\n    everything:\n      roots: [shared]\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(20_000)).await;
    rt.approve("everything", "test").await.unwrap();
    let names = tool_names(&rt);
    for t in [
        "everything/echo",
        "everything/get-sum",
        "everything/trigger-long-running-operation",
    ] {
        assert!(names.contains(&t.to_owned()), "{t} missing from {names:?}");
    }
    // Registered once the server knows plugd offers roots (after initialized).
    assert!(
        eventually(Duration::from_secs(5), || tool_names(&rt)
            .contains(&"everything/get-roots-list".to_owned()))
        .await,
        "{:?}",
        tool_names(&rt)
    );
    let echo = rt
        .call_tool("everything/echo", json!({"message": "hi"}), None)
        .await
        .unwrap();
    assert_eq!(echo["content"][0]["text"], "Echo: hi", "{echo}");
    let sum = rt
        .call_tool("everything/get-sum", json!({"a": 2, "b": 3}), None)
        .await
        .unwrap();
    assert_eq!(
        sum["content"][0]["text"], "The sum of 2 and 3 is 5.",
        "{sum}"
    );
    let roots = rt
        .call_tool("everything/get-roots-list", json!({}), None)
        .await
        .unwrap();
    let shared = file_uri(&ws.dir().join("shared").canonicalize().unwrap());
    let workspace = file_uri(&ws.dir().canonicalize().unwrap());
    let text = roots.to_string();
    assert!(
        text.contains(&shared),
        "the server got the configured root: {roots}"
    );
    assert_eq!(
        text.matches(&workspace).count(),
        text.matches(&shared).count(),
        "the workspace itself is never offered, only the configured root: {roots}"
    );

    // Progress reaches the caller.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = CallContext {
        progress: Some(tx),
        ..CallContext::default()
    };
    let done = rt
        .call_tool_with(
            "everything/trigger-long-running-operation",
            json!({"duration": 1, "steps": 4}),
            &ctx,
        )
        .await
        .unwrap();
    assert!(
        done.to_string()
            .contains("Long running operation completed"),
        "{done}"
    );
    drop(ctx);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    let steps: Vec<(f64, f64)> = events
        .iter()
        .map(|e| {
            (
                e["progress"].as_f64().unwrap(),
                e["total"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)],
        "{events:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_keeps_reporting_progress_after_cancel_and_is_killed() {
    let ws = mcp_ws(json!({"everything": everything()}));
    let rt = ws.runtime(quick(20_000)).await;
    rt.approve("everything", "test").await.unwrap();
    let sup = rt.supervised("everything").unwrap().clone();
    let Status::Running { pid, .. } = sup.status() else {
        panic!("{:?}", sup.status())
    };
    let err = call_within(
        &rt,
        "everything/trigger-long-running-operation",
        json!({"duration": 30, "steps": 30}),
        1500,
    )
    .await
    .unwrap_err();
    assert!(is_timeout(&err), "{err:?}");
    // The server aborts the request (no response) but its tool keeps sending
    // progress for it every second; past the 2 s grace plugd kills it.
    assert!(
        eventually(Duration::from_secs(10), || !process_group_alive(pid)).await,
        "server-everything ({pid}) still runs after ignoring the cancel"
    );
    // Not a crash: idle until the next call starts it again.
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            sup.status(),
            Status::Idle
        ))
        .await,
        "{:?}",
        sup.status()
    );
    rt.call_tool("everything/echo", json!({"message": "back"}), None)
        .await
        .unwrap();
    assert!(
        matches!(sup.status(), Status::Running { pid: p, .. } if p != pid),
        "{:?}",
        sup.status()
    );
    rt.shutdown().await;
}

#[test]
fn server_everything_through_the_cli() {
    let ws = mcp_ws(json!({"everything": everything()}));
    let o = ws.plugd(&["plugin", "approve", "everything"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ws.plugd(&["tool", "list", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tools: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"everything/echo") && names.contains(&"everything/get-sum"),
        "{names:?}"
    );

    let o = ws.plugd(&[
        "tool",
        "call",
        "everything/echo",
        "--args",
        r#"{"message":"cli"}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Echo: cli"), "{}", stdout(&o));
    let o = ws.plugd(&[
        "tool",
        "call",
        "everything/get-sum",
        "--args",
        r#"{"a":40,"b":2}"#,
    ]);
    assert!(
        stdout(&o).contains("The sum of 40 and 2 is 42."),
        "{}",
        stdout(&o)
    );
    let o = ws.plugd(&[
        "tool",
        "call",
        "everything/trigger-long-running-operation",
        "--args",
        r#"{"duration":1,"steps":2}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("progress: 1/2") && err.contains("progress: 2/2"),
        "{err}"
    );
    // server-everything sends tools/list_changed once it knows the client;
    // a refresh racing the CLI's shutdown is not a failure worth a warning.
    for _ in 0..3 {
        let o = ws.plugd(&[
            "tool",
            "call",
            "everything/echo",
            "--args",
            r#"{"message":"x"}"#,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            !stderr(&o).contains("catalog refresh failed"),
            "{}",
            stderr(&o)
        );
    }
}

// Tool metadata: title, annotations, outputSchema and icons.

#[test]
fn tool_metadata_is_kept_and_annotations_inform_the_default_risk() {
    let ws = mcp_ws(json!({"h": hostile("meta", None)}));
    let o = ws.plugd(&["plugin", "approve", "h"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // What was dropped is named, tool and field.
    let err = stderr(&o) + &stdout(&o) + &stdout(&ws.plugd(&["plugin", "show", "h"]));
    for field in ["title", "annotations.readOnlyHint", "icons", "outputSchema"] {
        assert!(
            err.contains(&format!("tool \"liar\": its {field} is ignored")),
            "{field} not reported: {err}"
        );
    }
    assert!(
        err.contains("tool \"task_only\" hidden: it requires task-augmented calls"),
        "{err}"
    );
    let list: Value =
        serde_json::from_str(&stdout(&ws.plugd(&["tool", "list", "--json"]))).unwrap();
    assert!(
        !list.to_string().contains("h/task_only"),
        "a task-only tool is not offered: {list}"
    );
    let o = ws.plugd(&["tool", "call", "h/task_ok"]);
    assert!(
        o.status.success(),
        "a tool with optional task support is called plainly: {}",
        stderr(&o)
    );
    let row = |name: &str| crate::support::tool_row(&list, name);
    let reader = row("h/reader");
    assert_eq!(reader["title"], "Read things", "{reader}");
    assert_eq!(reader["annotations"]["readOnlyHint"], true, "{reader}");
    assert_eq!(reader["icons"][0]["mimeType"], "image/png", "{reader}");
    assert_eq!(
        row("h/typed")["output_schema"]["required"],
        json!(["count"])
    );
    // The documented mapping; an unannotated tool stays at the default.
    for (tool, risk, source) in [
        ("h/reader", "low", "annotations"),
        ("h/wiper", "high", "annotations"),
        ("h/gentle", "medium", "annotations"),
        // Its lying readOnlyHint ("yes") is dropped; destructiveHint stands.
        ("h/liar", "high", "annotations"),
        ("h/echo", "medium", "default"),
    ] {
        let r = row(tool);
        assert_eq!(
            (r["risk"].as_str(), r["risk_source"].as_str()),
            (Some(risk), Some(source)),
            "{r}"
        );
    }
    let liar = row("h/liar");
    assert!(
        liar.get("title").is_none()
            && liar.get("icons").is_none()
            && liar.get("output_schema").is_none(),
        "malformed metadata is not kept: {liar}"
    );
    // plugd.yaml still overrides annotations.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "risk:\n  tools:\n    h/wiper: low\n",
    )
    .unwrap();
    let list: Value =
        serde_json::from_str(&stdout(&ws.plugd(&["tool", "list", "--json"]))).unwrap();
    let wiper = crate::support::tool_row(&list, "h/wiper");
    assert_eq!(
        (wiper["risk"].as_str(), wiper["risk_source"].as_str()),
        (Some("low"), Some("config"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_content_is_checked_against_the_output_schema() {
    let (_ws, rt) = approved("meta", None, 10_000).await;
    let ok = rt
        .call_tool("h/typed", json!({"n": 3}), None)
        .await
        .unwrap();
    assert_eq!(structured(&ok), &json!({"count": 3}));
    for (args, tool, want) in [
        (json!({"n": -1}), "h/typed", "structuredContent/count"),
        (json!({}), "h/untyped", "has no structuredContent"),
    ] {
        let err = rt.call_tool(tool, args, None).await.unwrap_err();
        match &err {
            RuntimeError::Call(CallToolError::Tool(ToolError::ExecutionFailed {
                plugin,
                tool: t,
                message,
            })) => {
                assert_eq!((&**plugin, t.as_str()), ("h", tool));
                assert!(message.contains(want), "{message}");
            }
            other => panic!("{tool}: {other:?}"),
        }
    }
    // A tool without an outputSchema is not checked; an error result is
    // not checked either (fail has none, typed's schema is not applied to it).
    rt.call_tool("h/echo", json!({"message": "x"}), None)
        .await
        .unwrap();
    rt.shutdown().await;
}

#[test]
fn serve_tells_servers_when_plugd_yaml_changes_their_roots() {
    use crate::http::Serve;
    let ws = mcp_ws(json!({"h": hostile("good", None), "bare": hostile("good", None)}));
    for d in ["a", "b"] {
        std::fs::create_dir(ws.dir().join(d)).unwrap();
    }
    let uri = |d: &str| file_uri(&ws.dir().join(d).canonicalize().unwrap());
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "mcp:\n  servers:\n    h:\n      roots: [a]\n",
    )
    .unwrap();
    for id in ["h", "bare"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let call = |tool: &str| {
        let r = serve.post(&format!("/v1/tools/{tool}:invoke"), &json!({"args": {}}));
        assert_eq!(r.status, 200, "{tool}: {}", r.text());
        r.json()["structuredContent"].clone()
    };
    assert_eq!(
        call("h/ask")["roots/list"]["result"]["roots"][0]["uri"],
        uri("a")
    );
    call("bare/notes"); // started, without roots
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "mcp:\n  servers:\n    h:\n      roots: [b]\n    bare:\n      roots: [a]\n",
    )
    .unwrap();
    // New roots widen what a server is offered: held until an operator
    // approves the change, and nothing is sent before.
    let deadline = Instant::now() + Duration::from_secs(10);
    let digest = loop {
        let v = serve.get("/v1/config").json();
        if let Some(d) = v["pending"]["digest"].as_str() {
            break d.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the roots change was not held: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        call("h/ask")["roots/list"]["result"]["roots"][0]["uri"],
        uri("a")
    );
    let o = ws.plugd(&["config", "approve", &digest]);
    assert!(o.status.success(), "{}", stderr(&o));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !call("h/notes")["notes"]
        .to_string()
        .contains("notifications/roots/list_changed")
    {
        assert!(
            Instant::now() < deadline,
            "no roots/list_changed: {}",
            call("h/notes")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let roots = &call("h/ask")["roots/list"]["result"]["roots"];
    assert_eq!(roots, &json!([{"uri": uri("b"), "name": "b"}]));
    // A server started without roots is not told (it was not offered the
    // capability); it gets them from its next start.
    assert!(
        !call("bare/notes")["notes"]
            .to_string()
            .contains("roots/list_changed")
    );
    assert_eq!(call("bare/ask")["roots/list"]["error"]["code"], -32601);
    let (status, log) = serve.stop();
    assert!(log.contains("roots/list_changed sent"), "{status:?} {log}");
}
