//! MCP tasks (2025-11-25): tools that require task-augmented calls, called
//! and polled to their end. The real `@modelcontextprotocol/server-everything`
//! (its `simulate-research-query`, through the runtime, the CLI and the
//! gateway with the Python `mcp` client), and a raw JSON-RPC server
//! (`tests/plugins/mcp-tasks/tasks_mcp.py`) with honest and hostile tasks.
//! The Python `mcp` SDK 2.3.0 has no server side for 2025-11-25 tasks (its
//! method tables leave `tasks/*` out), so it cannot serve as a fixture here.

use std::process::Stdio;
use std::time::Duration;

use plugd_host::dialect::CallContext;
use plugd_host::model::ToolError;
use plugd_host::{CallError, CallToolError};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, path_with_venv, quick, repo, stderr, stdout, tool_row};

fn everything() -> Value {
    let js = repo()
        .join(".npm-tools/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        js.exists(),
        "run ./scripts/test: it installs server-everything"
    );
    json!({"command": "node", "args": [js, "stdio"]})
}

fn tasks_server(arg: Option<&str>) -> Value {
    let mut args = vec![json!(repo().join("tests/plugins/mcp-tasks/tasks_mcp.py"))];
    args.extend(arg.map(|a| json!(a)));
    json!({"command": "python3", "args": args})
}

fn mcp_ws(servers: Value) -> Ws {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": servers}).to_string(),
    )
    .unwrap();
    ws
}

/// The fixture server `t`, approved, in a runtime with a 10 s call timeout.
async fn fixture(arg: Option<&str>) -> (Ws, Runtime) {
    let ws = mcp_ws(json!({"t": tasks_server(arg)}));
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("t", "test").await.unwrap();
    (ws, rt)
}

/// Calls `name` with its own deadline.
async fn call_within(
    rt: &Runtime,
    name: &str,
    args: Value,
    ctx: &CallContext,
    ms: u64,
) -> Result<Value, CallToolError> {
    let entry = rt.tools().into_iter().find(|t| t.name == name).unwrap();
    rt.supervised(&entry.plugin)
        .unwrap()
        .call_tool(&entry.def, args, ctx, Some(Duration::from_millis(ms)))
        .await
}

fn text(v: &Value) -> String {
    v["content"]
        .as_array()
        .map(|c| c.iter().filter_map(|i| i["text"].as_str()).collect())
        .unwrap_or_default()
}

async fn log(rt: &Runtime) -> Value {
    rt.call_tool("t/log", json!({}), None).await.unwrap()["structuredContent"].clone()
}

async fn call_err(rt: &Runtime, name: &str) -> String {
    let err = rt.call_tool(name, json!({}), None).await.unwrap_err();
    err.to_string()
}

// The fixture: honest tasks.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_tool_is_called_as_a_task_polled_and_its_progress_kept() {
    let (_ws, rt) = fixture(None).await;
    let slow = rt.tools().into_iter().find(|t| t.name == "t/slow").unwrap();
    assert_eq!(
        slow.def.meta.as_ref().unwrap().execution.as_ref().unwrap()["taskSupport"],
        "required",
        "listed, marked as task-based"
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = CallContext {
        progress: Some(tx),
        ..CallContext::default()
    };
    let done = call_within(&rt, "t/slow", json!({"ms": 600, "steps": 3}), &ctx, 10_000)
        .await
        .unwrap();
    assert_eq!(text(&done), "slow done after 3 steps", "{done}");
    drop(ctx);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e["message"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(
        events,
        ["step 1", "step 2", "step 3"],
        "progress sent after the CreateTaskResult reaches the caller"
    );

    let log = log(&rt).await;
    assert_eq!(
        log["task_params"][0],
        json!({"ttl": 10_000}),
        "the task asks for the call's timeout as its ttl: {log}"
    );
    let methods: Vec<&str> = log["methods"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let first_get = methods.iter().position(|m| *m == "tasks/get").unwrap();
    let result = methods.iter().position(|m| *m == "tasks/result").unwrap();
    assert!(first_get < result, "polled, then fetched: {methods:?}");
    let gets = log["gets"]["task-1"].as_u64().unwrap();
    // pollInterval is 100 ms over a 600 ms task: a handful of polls, not a flood.
    assert!((1..=20).contains(&gets), "{gets} tasks/get: {log}");
    assert!(
        log["cancelled"].as_array().unwrap().is_empty(),
        "a finished task is not cancelled: {log}"
    );

    // optional: the plain way; a server that answers plainly is believed.
    let plain = rt.call_tool("t/plain", json!({}), None).await.unwrap();
    assert_eq!(text(&plain), "plain: task=False", "{plain}");
    let anyway = rt.call_tool("t/no_task", json!({}), None).await.unwrap();
    assert_eq!(text(&anyway), "plain anyway", "{anyway}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_is_a_tool_failure_and_input_required_reaches_the_request_routing() {
    let (_ws, rt) = fixture(None).await;
    let err = rt.call_tool("t/fail", json!({}), None).await.unwrap_err();
    assert!(
        matches!(
            &err,
            RuntimeError::Call(CallToolError::Tool(ToolError::ExecutionFailed { message, .. }))
                if message == "it broke in the task"
        ),
        "{err:?}"
    );
    // input_required: plugd calls tasks/result, the server's elicitation
    // comes meanwhile and is answered as any other (nobody to ask here).
    let asked = rt.call_tool("t/ask", json!({}), None).await.unwrap();
    let t = text(&asked);
    assert!(
        t.starts_with("answer: ") && t.contains("-32001") && t.contains("nobody to ask"),
        "{asked}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_notification_ends_the_wait_before_the_poll_interval_but_a_flood_does_not_flood_polls()
 {
    let (_ws, rt) = fixture(None).await;
    // pollInterval 600000 is clamped to 5 s; the task ends after 200 ms and
    // says so: the call finishes inside a 4 s deadline only if the
    // notification woke the poll.
    let done = call_within(
        &rt,
        "t/notified",
        json!({"ms": 200}),
        &CallContext::default(),
        4_000,
    )
    .await
    .unwrap();
    assert_eq!(text(&done), "notified done");
    assert_eq!(log(&rt).await["gets"]["task-1"], 1);
    // A flood of status notifications is not a flood of polls: at most one
    // tasks/get per 50 ms over the ~500 ms the flood lasts (measured: on a
    // loaded machine the flood takes longer, and so may the polls).
    let began = std::time::Instant::now();
    let done = rt.call_tool("t/flood", json!({}), None).await.unwrap();
    let took = began.elapsed();
    assert_eq!(text(&done), "flood done");
    let gets = log(&rt).await["gets"]["task-2"].as_u64().unwrap();
    let most = (took.as_millis() as u64 / 50 + 2).max(20);
    assert!((1..=most).contains(&gets), "{gets} tasks/get in {took:?}");
    rt.shutdown().await;
}

// The fixture: hostile tasks.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_or_broken_tasks_end_the_call_with_an_error_naming_server_and_cause() {
    let (_ws, rt) = fixture(None).await;
    for (tool, cause) in [
        ("t/liar", "its status \"done\" is none of working"),
        ("t/other_id", "describes task \"someone-else\""),
        (
            "t/unknown",
            "tasks/get answered error -32602: Failed to retrieve task: Task not found",
        ),
        (
            "t/get_error",
            "tasks/get answered error -32603: task store on fire",
        ),
        (
            "t/bad_create",
            "malformed CreateTaskResult: its \"taskId\" must be a string",
        ),
    ] {
        let err = call_err(&rt, tool).await;
        assert!(
            err.contains("plugin \"t\"") && err.contains(cause),
            "{tool}: {err}"
        );
    }
    // A result over the frame limit is refused, not buffered.
    let err = call_err(&rt, "t/huge").await;
    assert!(
        err.contains("plugin \"t\"") && err.contains("tasks/result") && err.contains("limit"),
        "{err}"
    );
    // Tasks plugd gave up on while they ran are cancelled (liar, other_id,
    // unknown and get_error were working); none that had ended.
    let log = log(&rt).await;
    let cancelled = log["cancelled"].to_string();
    for t in ["task-1", "task-2", "task-3", "task-4"] {
        assert!(cancelled.contains(&format!("\"{t}\"")), "{t}: {log}");
    }
    assert!(!cancelled.contains("task-5"), "huge had completed: {log}");
    // Still the same healthy server.
    rt.call_tool("t/plain", json!({}), None).await.unwrap();
    rt.shutdown().await;
}

fn is_timeout(err: &CallToolError) -> bool {
    matches!(
        err,
        CallToolError::Tool(ToolError::Call(CallError::Timeout { .. }))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_never_ends_is_bounded_by_the_deadline_and_cancelled() {
    let (_ws, rt) = fixture(None).await;
    let ctx = CallContext::default();
    let err = call_within(&rt, "t/forever", json!({}), &ctx, 1_000)
        .await
        .unwrap_err();
    assert!(is_timeout(&err), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("plugin \"t\"") && msg.contains("task \"task-1\", last status working"),
        "{msg}"
    );
    // Completed, but its result never comes: bounded too, and not cancelled.
    let err = call_within(&rt, "t/stuck", json!({}), &ctx, 1_000)
        .await
        .unwrap_err();
    assert!(is_timeout(&err), "{err:?}");
    // A caller that goes away cancels the task too.
    let gone = tokio::time::timeout(
        Duration::from_millis(500),
        rt.call_tool("t/forever", json!({}), None),
    )
    .await;
    assert!(gone.is_err(), "{gone:?}");
    let mut last = Value::Null;
    for _ in 0..50 {
        last = log(&rt).await;
        if last["cancelled"] == json!(["task-1", "task-3"]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        last["cancelled"],
        json!(["task-1", "task-3"]),
        "cancelled at the deadline and when the caller left, not once completed: {last}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tasks_cancel_is_not_sent_one() {
    let (_ws, rt) = fixture(Some("nocancel")).await;
    let err = call_within(&rt, "t/forever", json!({}), &CallContext::default(), 500)
        .await
        .unwrap_err();
    assert!(is_timeout(&err), "{err:?}");
    let log = log(&rt).await;
    assert!(
        !log["methods"].to_string().contains("tasks/cancel"),
        "{log}"
    );
    rt.shutdown().await;
}

// The real server.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_research_runs_as_a_task_with_its_input_required_step() {
    let ws = mcp_ws(json!({"everything": everything()}));
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("everything", "test").await.unwrap();
    // Registered once the server knows its client (after initialized).
    let name = "everything/simulate-research-query";
    assert!(
        eventually(Duration::from_secs(10), || rt
            .tools()
            .iter()
            .any(|t| t.name == name))
        .await,
        "{:?}",
        rt.tools().iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    let done = rt
        .call_tool(name, json!({"topic": "rust"}), None)
        .await
        .unwrap();
    let t = text(&done);
    assert!(
        t.contains("# Research Report: rust") && t.contains("`working` → `completed`"),
        "{done}"
    );
    // Ambiguous: the task goes input_required and elicits through
    // tasks/result; plugd (no client behind this call) answers that nobody
    // can be asked, and the server carries on with its default.
    let done = rt
        .call_tool(name, json!({"topic": "python", "ambiguous": true}), None)
        .await
        .unwrap();
    let t = text(&done);
    assert!(
        t.contains("`input_required` → `working` → `completed`")
            && t.contains("elicitation unavailable"),
        "{done}"
    );
    rt.shutdown().await;
}

#[test]
fn server_everything_task_tool_is_listed_and_called_through_the_cli() {
    let ws = mcp_ws(json!({"everything": everything()}));
    let o = ws.plugd(&["plugin", "approve", "everything"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ws.plugd(&[
        "tool",
        "call",
        "everything/simulate-research-query",
        "--args",
        r#"{"topic":"cli"}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Research Report: cli"),
        "{}",
        stdout(&o)
    );
    assert!(!stderr(&o).contains("hidden"), "{}", stderr(&o));
    let list: Value =
        serde_json::from_str(&stdout(&ws.plugd(&["tool", "list", "--json"]))).unwrap();
    let row = tool_row(&list, "everything/simulate-research-query");
    assert_eq!(row["execution"]["taskSupport"], "required", "{row}");
}

#[test]
fn a_task_only_tool_is_called_by_an_mcp_client_through_the_gateway() {
    let ws = mcp_ws(json!({"everything": everything()}));
    let o = ws.plugd(&["plugin", "approve", "everything"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = json!({
        "transport": "stdio",
        "command": env!("CARGO_BIN_EXE_plugd"),
        "args": ["--workspace", ws.dir(), "mcp"],
        "env": crate::support::client_env(&ws),
        "mode": "legacy",
        "elicit": "decline",
        "steps": [
            {"op": "list"},
            {"op": "call", "name": "everything__simulate-research-query",
             "args": {"topic": "python", "ambiguous": true}, "timeout": 60},
        ],
    });
    #[allow(clippy::disallowed_methods)] // the test drives a real MCP client
    let out = std::process::Command::new(repo().join(".venv/bin/python3"))
        .arg(repo().join("tests/plugins/gateway/mcp_client.py"))
        .arg(plan.to_string())
        .env("PATH", path_with_venv())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mcp_client.py failed: {err}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tool = report["steps"][0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "everything__simulate-research-query")
        .unwrap_or_else(|| panic!("not listed: {report}"));
    assert!(
        tool.get("execution").is_none(),
        "the gateway calls the task itself; its clients call plainly: {tool}"
    );
    let call = &report["steps"][1];
    assert_eq!(call["is_error"], false, "{report}\n{err}");
    assert!(
        call["text"]
            .as_str()
            .unwrap()
            .contains("User declined - using default interpretation"),
        "the client's answer reached the task: {report}"
    );
    let asked = report["elicitations"].to_string();
    assert!(
        asked.contains("could have multiple interpretations"),
        "{report}"
    );
}
