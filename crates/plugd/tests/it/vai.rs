//! VAI dialect: real `vai.rpc.v1` packages (Python stdlib) through the runtime, the internal invocation API and the CLI.
//!
//! Most tests run `tests/plugins/vai/vai_plugin.py MODE`, a configurable
//! plugin that can also lie about itself, print junk, break its framing,
//! ignore cancels and crash; the CLI test runs the `vai-devkit` example.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugd_dialects::vai::{self, CompactRequest, HarnessRequest, InvokeError};
use plugd_host::dialect::CallContext;
use plugd_host::model::ToolError;
use plugd_host::spawn::process_group_alive;
use plugd_host::{CallError, CallToolError, Conn, HostConfig, Status};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, plugd_cmd, quick, repo, stderr, stdout};

/// Tool exports of the test plugin (name, extra lines for the export).
const TOOLS: &[(&str, &str)] = &[
    ("echo", ""),
    ("fail", ""),
    ("proto_error", ""),
    ("bad_body", ""),
    ("sleep", ""),
    ("pid", ""),
    ("crash", ""),
    (
        "scratch",
        "[exports.permissions]\nfilesystem = \"scratch\"\n",
    ),
    ("attack", ""),
    ("serial", "max_concurrency = 1\n"),
];

/// Writes package `test/<name>` running the test plugin in `mode` (with
/// `extra_args` after the identity) into `ws`.
pub(crate) fn package(ws: &Ws, name: &str, mode: &str, extra_args: &[&str]) -> PathBuf {
    let dir = ws.plugin_dir(name);
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/vai/vai_plugin.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    std::fs::write(dir.join("schemas/any.json"), r#"{"type":"object"}"#).unwrap();
    let mut args = vec![
        "python3".to_owned(),
        "plugin.py".to_owned(),
        mode.to_owned(),
        format!("test/{name}"),
        "0.1.0".to_owned(),
    ];
    args.extend(extra_args.iter().map(|s| (*s).to_owned()));
    let mut m = format!(
        "api_version = \"vai.plugin.v1\"\npackage_id = \"test/{name}\"\nversion = \"0.1.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = {}\n",
        serde_json::to_string(&args).unwrap()
    );
    // Worker class: every export of these dialect tests runs in the
    // package's one worker process (`vai_classes.rs` tests the classes).
    for (id, extra) in TOOLS {
        m.push_str(&format!(
            "\n[[exports]]\nid = \"{id}\"\nkind = \"tool\"\ndescription = \"test {id}\"\nexecution_class = \"worker\"\n{extra}\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n"
        ));
    }
    m.push_str("\n[[exports]]\nid = \"notify\"\nkind = \"hook\"\n[exports.hook]\nsubscribes_to = [\"run.completed\", \"fail\"]\n");
    m.push_str("\n[[exports]]\nid = \"window\"\nkind = \"compactor\"\n");
    m.push_str("\n[[exports]]\nid = \"triage\"\nkind = \"harness\"\nexecution_class = \"worker\"\n[exports.harness]\nmode = \"composite\"\nfidelity = \"checkpoint\"\n");
    std::fs::write(dir.join("vai-plugin.toml"), m).unwrap();
    dir
}

/// A runtime over `ws` with `tool_ms` as the tool deadline, and `id` approved.
pub(crate) async fn approved(ws: &Ws, id: &str, config: HostConfig) -> Runtime {
    let rt = ws.runtime(config).await;
    rt.approve(id, "test").await.unwrap();
    rt
}

async fn conn(rt: &Runtime, id: &str) -> Arc<Conn> {
    rt.supervised(id)
        .unwrap()
        .connection(Instant::now() + Duration::from_secs(10))
        .await
        .unwrap()
}

/// Waits until `id` runs again in a process other than `old_pid` (right
/// after a crash the status can still show the dead run for a moment).
async fn restarted(rt: &Runtime, id: &str, old_pid: u64) -> bool {
    let sup = rt.supervised(id).unwrap().clone();
    eventually(
        Duration::from_secs(10),
        || matches!(sup.status(), Status::Running { pid, .. } if u64::from(pid) != old_pid),
    )
    .await
}

fn running_pid(rt: &Runtime, id: &str) -> u64 {
    match rt.supervised(id).unwrap().status() {
        Status::Running { pid, .. } => u64::from(pid),
        other => panic!("{id} is not running: {other:?}"),
    }
}

fn pid_of(v: &Value) -> (u64, u64) {
    let s = &v["structured_output"];
    (s["pid"].as_u64().unwrap(), s["pgid"].as_u64().unwrap())
}

fn tool_err(e: RuntimeError) -> ToolError {
    match e {
        RuntimeError::Call(CallToolError::Tool(t)) => t,
        other => panic!("expected a tool error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_lists_tool_exports_and_a_call_carries_context_and_progress() {
    let ws = Ws::new();
    package(&ws, "good", "good", &[]);
    let rt = approved(&ws, "test/good", quick(10_000)).await;
    let names: Vec<String> = rt.tools().iter().map(|t| t.name.clone()).collect();
    assert!(names.contains(&"test/good/echo".to_owned()), "{names:?}");
    assert_eq!(
        names.len(),
        TOOLS.len(),
        "only tool exports are tools: {names:?}"
    );
    let echo = rt
        .tools()
        .into_iter()
        .find(|t| t.name == "test/good/echo")
        .unwrap();
    assert_eq!(echo.def.wire(), "echo");
    assert_eq!(echo.description, "test echo");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = CallContext {
        trace_id: Some("tr_test".into()),
        org_id: Some("org_1".into()),
        project_id: Some("proj_1".into()),
        session_id: Some("sess_1".into()),
        progress: Some(tx),
        ..CallContext::default()
    };
    let got = rt
        .call_tool_with("test/good/echo", json!({"progress": 3, "q": "x"}), &ctx)
        .await
        .unwrap();
    drop(ctx);
    assert_eq!(got["content"][0]["text"], "echoed");
    assert_eq!(got["is_error"], false);
    let out = &got["structured_output"];
    assert_eq!(out["input"], json!({"progress": 3, "q": "x"}));
    assert!(
        out["tool_execution_id"]
            .as_str()
            .unwrap()
            .starts_with("toolx_")
    );
    let c = &out["context"];
    assert!(
        c["invocation_id"].as_str().unwrap().starts_with("inv_"),
        "{c}"
    );
    assert_eq!(c["trace_id"], "tr_test");
    assert_eq!(c["org_id"], "org_1");
    assert_eq!(c["project_id"], "proj_1");
    assert_eq!(c["session_id"], "sess_1");
    assert_eq!(c["gateway"]["scopes"], json!([]));
    let deadline = c["deadline_at"].as_str().unwrap();
    assert!(
        deadline.len() == 20 && deadline.ends_with('Z') && &deadline[10..11] == "T",
        "{deadline}"
    );
    let mut progress = Vec::new();
    while let Some(ev) = rx.recv().await {
        progress.push(ev["message"].as_str().unwrap().to_owned());
    }
    assert_eq!(progress, ["step 1", "step 2", "step 3"]);

    // The host said hello first, as the seed shows it.
    let pid = rt
        .call_tool("test/good/pid", json!({}), None)
        .await
        .unwrap();
    let hello = &pid["structured_output"]["host_hello"];
    assert_eq!(hello["role"], "host");
    assert_eq!(hello["host"]["name"], "plugd");
    assert_eq!(hello["protocol"], "vai.rpc.v1");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_says_hello_after_the_host_is_accepted() {
    let ws = Ws::new();
    package(&ws, "late", "hello_late", &[]);
    let rt = approved(&ws, "test/late", quick(10_000)).await;
    let got = rt
        .call_tool("test/late/echo", json!({}), None)
        .await
        .unwrap();
    assert_eq!(got["content"][0]["text"], "echoed");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_failure_statuses_are_tool_failures_naming_status_and_retryable() {
    let ws = Ws::new();
    package(&ws, "fails", "good", &[]);
    let rt = approved(&ws, "test/fails", quick(10_000)).await;
    for (status, retryable) in [
        ("failed", false),
        ("retryable_failure", true),
        ("cancelled", false),
    ] {
        let e = tool_err(
            rt.call_tool(
                "test/fails/fail",
                json!({"status": status, "why": "jira is down"}),
                None,
            )
            .await
            .unwrap_err(),
        );
        assert!(
            matches!(&e, ToolError::ExecutionFailed { tool, message, .. }
                if tool == "test/fails/fail"
                && message == &format!("status {status:?} (retryable: {retryable}): jira is down")),
            "{e:?}"
        );
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_failures_surface_their_code_and_malformed_bodies_are_refused() {
    let ws = Ws::new();
    package(&ws, "proto", "good", &[]);
    let rt = approved(&ws, "test/proto", quick(10_000)).await;
    let e = tool_err(
        rt.call_tool("test/proto/proto_error", json!({}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(&e, ToolError::Call(CallError::Remote { error, .. })
            if error.message == "protocol.invalid_frame: missing body"
            && error.data.as_ref().unwrap()["code"] == "protocol.invalid_frame"),
        "{e:?}"
    );
    let e = tool_err(
        rt.call_tool("test/proto/bad_body", json!({}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        e.to_string()
            .contains("answered tool.invoke with a malformed body: no string \"status\""),
        "{e}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_sends_cancel_and_a_plugin_that_acknowledges_stays_alive() {
    let ws = Ws::new();
    package(&ws, "slow", "good", &[]);
    let rt = approved(&ws, "test/slow", quick(500)).await;
    let before = rt
        .call_tool("test/slow/pid", json!({}), None)
        .await
        .unwrap();
    let e = tool_err(
        rt.call_tool("test/slow/sleep", json!({"ms": 10_000}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(e, ToolError::Call(CallError::Timeout { ref method, .. }) if method == "tool.invoke"),
        "{e:?}"
    );
    // Past the cancel grace: the plugin answered "cancelled" in time, so it lives.
    tokio::time::sleep(vai::CANCEL_GRACE + Duration::from_millis(500)).await;
    let after = rt
        .call_tool("test/slow/pid", json!({}), None)
        .await
        .unwrap();
    assert_eq!(pid_of(&before), pid_of(&after), "the same process answers");
    let cancels = &after["structured_output"]["cancels"];
    assert_eq!(cancels.as_array().unwrap().len(), 1, "{cancels}");
    assert_eq!(cancels[0]["reason"], "deadline_exceeded");
    assert!(
        cancels[0]["request_id"]
            .as_str()
            .unwrap()
            .starts_with("req_")
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_ignores_cancel_is_killed_after_the_grace_and_started_again() {
    let ws = Ws::new();
    package(&ws, "stubborn", "ignore_cancel", &[]);
    ws.unsandbox(
        &["test/stubborn"],
        "the test compares process ids the plugin reports with host process ids",
    );
    let rt = approved(&ws, "test/stubborn", quick(500)).await;
    let before = rt
        .call_tool("test/stubborn/pid", json!({}), None)
        .await
        .unwrap();
    let e = tool_err(
        rt.call_tool("test/stubborn/sleep", json!({"ms": 10_000}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(e, ToolError::Call(CallError::Timeout { .. })),
        "{e:?}"
    );
    let pgid = pid_of(&before).1 as u32;
    assert!(
        eventually(vai::CANCEL_GRACE * 4, || !process_group_alive(pgid)).await,
        "the runaway plugin must be killed"
    );
    // A kill for ignoring a cancel is not a crash: idle until needed.
    let sup = rt.supervised("test/stubborn").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            sup.status(),
            Status::Idle
        ))
        .await,
        "{:?}",
        sup.status()
    );
    let after = rt
        .call_tool("test/stubborn/pid", json!({}), None)
        .await
        .unwrap();
    assert_ne!(pid_of(&before).0, pid_of(&after).0);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_fails_the_call_and_the_restart_keeps_tool_handles() {
    let ws = Ws::new();
    package(&ws, "crashy", "good", &[]);
    ws.unsandbox(
        &["test/crashy"],
        "the test compares process ids the plugin reports with host process ids",
    );
    let rt = approved(&ws, "test/crashy", quick(30_000)).await;
    let before = rt
        .call_tool("test/crashy/pid", json!({}), None)
        .await
        .unwrap();
    let t = Instant::now();
    let e = rt
        .call_tool("test/crashy/crash", json!({}), None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("crashed: exit status 3"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(restarted(&rt, "test/crashy", pid_of(&before).0).await);
    let after = rt
        .call_tool("test/crashy/pid", json!({}), None)
        .await
        .unwrap();
    assert_ne!(pid_of(&before).0, pid_of(&after).0);
    let echo = rt
        .call_tool("test/crashy/echo", json!({"a": 1}), None)
        .await
        .unwrap();
    assert_eq!(echo["structured_output"]["input"], json!({"a": 1}));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_or_another_version_is_refused_and_killed() {
    let ws = Ws::new();
    package(&ws, "liar", "impostor", &[]);
    package(&ws, "stale", "old_version", &[]);
    package(&ws, "mute", "no_hello", &[]);
    let rt = ws
        .runtime(HostConfig {
            init_timeout: Duration::from_millis(700),
            ..quick(5_000)
        })
        .await;
    let e = rt
        .approve("test/liar", "test")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("identified itself as \"evil/impostor@0.1.0\"")
            && e.contains("\"test/liar@0.1.0\"")
            && e.contains("impostor is refused"),
        "{e}"
    );
    let e = rt
        .approve("test/stale", "test")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"test/stale@9.9.9\""), "{e}");
    for id in ["test/liar", "test/stale"] {
        let info = rt.plugin(id).await.unwrap();
        assert!(!info.approved, "{id}");
        assert!(rt.supervised(id).unwrap().current().is_none(), "{id}");
    }
    let e = rt
        .approve("test/mute", "test")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not answer hello within"), "{e}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_frames_wrong_protocols_and_unknown_ids_are_skipped() {
    let ws = Ws::new();
    package(&ws, "junky", "junk", &[]);
    let rt = approved(&ws, "test/junky", quick(10_000)).await;
    let got = rt
        .call_tool("test/junky/echo", json!({"a": [1, 2]}), None)
        .await
        .unwrap();
    assert_eq!(got["structured_output"]["input"], json!({"a": [1, 2]}));
    let stats = rt.plugin("test/junky").await.unwrap().stats.unwrap();
    // Non-JSON, missing protocol, wrong protocol, unknown type (an event
    // for a request nobody waits on is dropped by the peer, not counted).
    assert!(stats.junk_frames >= 4, "{stats:?}");
    // "req_999999" and "bogus".
    assert!(stats.unknown_ids >= 2, "{stats:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_framing_drops_the_connection_fast_and_the_plugin_restarts() {
    let ws = Ws::new();
    let kinds = [
        "negative_length",
        "huge_length",
        "bad_header",
        "no_separator",
        "big_header",
    ];
    for kind in kinds {
        package(&ws, &format!("atk-{kind}"), "good", &[]);
    }
    let rt = ws.runtime(quick(30_000)).await;
    for kind in kinds {
        let id = format!("test/atk-{kind}");
        rt.approve(&id, "test").await.unwrap();
        let old_pid = running_pid(&rt, &id);
        let t = Instant::now();
        let e = tool_err(
            rt.call_tool(&format!("{id}/attack"), json!({"kind": kind}), None)
                .await
                .unwrap_err(),
        );
        assert!(
            matches!(e, ToolError::Call(CallError::Closed(ref c)) if !c.expected),
            "{kind}: {e:?}"
        );
        // The deadline is 30 s: the connection was dropped, not timed out.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{kind}: {:?}",
            t.elapsed()
        );
        assert!(restarted(&rt, &id, old_pid).await, "{kind}: not restarted");
        rt.call_tool(&format!("{id}/echo"), json!({}), None)
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_response_fails_its_call_at_once_and_the_stream_recovers() {
    let ws = Ws::new();
    package(&ws, "huge", "good", &[]);
    let rt = approved(&ws, "test/huge", quick(30_000)).await;
    // The plugin answers with a 17 MiB frame (skipped unread: its "req_<n>"
    // id is found in the first bytes, so the call fails now, not at its
    // deadline), then sends a valid answer for the same id, which is dropped.
    let t = std::time::Instant::now();
    let err = rt
        .call_tool("test/huge/attack", json!({"kind": "oversized"}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("over the 16777216-byte limit"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "failed at the deadline, not at once"
    );
    let stats = rt.plugin("test/huge").await.unwrap().stats.unwrap();
    assert_eq!(stats.oversized_frames, 1, "{stats:?}");
    // The stream resynchronised: the same process answers the next call.
    let ok = rt.call_tool("test/huge/pid", json!({}), None).await;
    assert!(ok.is_ok(), "{ok:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_process_behind_even_when_the_plugin_lingers() {
    let ws = Ws::new();
    package(&ws, "polite", "good", &[]);
    package(&ws, "linger", "good", &["linger"]);
    ws.unsandbox(
        &["test/polite", "test/linger"],
        "the test compares process groups the plugins report with host ones",
    );
    let rt = ws.runtime(quick(10_000)).await;
    let mut groups = Vec::new();
    for id in ["test/polite", "test/linger"] {
        rt.approve(id, "test").await.unwrap();
        let pid = rt
            .call_tool(&format!("{id}/pid"), json!({}), None)
            .await
            .unwrap();
        groups.push(pid_of(&pid).1 as u32);
    }
    rt.shutdown().await;
    for pgid in groups {
        assert!(
            eventually(Duration::from_secs(5), || !process_group_alive(pgid)).await,
            "process group {pgid} survived shutdown"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invocation_gets_a_fresh_scratch_dir_removed_afterwards() {
    let ws = Ws::new();
    package(&ws, "scratchy", "good", &[]);
    let rt = approved(&ws, "test/scratchy", quick(10_000)).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let got = rt
            .call_tool("test/scratchy/scratch", json!({}), None)
            .await
            .unwrap();
        let out = &got["structured_output"];
        assert_eq!(out["existed"], true, "{out}");
        let dir = PathBuf::from(out["scratch_dir"].as_str().unwrap());
        assert!(
            dir.starts_with(ws.dir().join(".plugd/state/test__scratchy/scratch")),
            "{}",
            dir.display()
        );
        assert!(!dir.exists(), "{} outlived its invocation", dir.display());
        seen.push(dir);
    }
    assert_ne!(seen[0], seen[1], "every invocation gets its own directory");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_queues_excess_calls_and_refuses_past_the_queue() {
    let ws = Ws::new();
    package(&ws, "serial", "good", &[]);
    let rt = approved(&ws, "test/serial", quick(30_000)).await;
    // 1 running + 8 queued (QUEUE_PER_SLOT × max_concurrency 1).
    let mut calls = Vec::new();
    for _ in 0..1 + vai::QUEUE_PER_SLOT {
        let rt = rt.clone();
        calls.push(tokio::spawn(async move {
            rt.call_tool("test/serial/serial", json!({"ms": 250}), None)
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let e = tool_err(
        rt.call_tool("test/serial/serial", json!({"ms": 1}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(&e, ToolError::Unavailable { message, .. }
            if message.contains("is busy: 1 invocation(s) running (its max_concurrency) and 8 queued")),
        "{e:?}"
    );
    for c in calls {
        let got = c.await.unwrap().unwrap();
        assert_eq!(
            got["structured_output"]["max_running"], 1,
            "never more than max_concurrency at once"
        );
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_compactors_and_harnesses_are_callable_through_the_internal_api() {
    let ws = Ws::new();
    package(&ws, "kinds", "good", &[]);
    let rt = approved(&ws, "test/kinds", quick(10_000)).await;
    let conn = conn(&rt, "test/kinds").await;
    let ctx = CallContext::default();
    let t = Duration::from_secs(10);

    let body = vai::handle_hook(
        &conn,
        "notify",
        "del_123",
        2,
        json!({"type": "run.completed", "subject": {"kind": "run", "id": "run_1"}}),
        &ctx,
        t,
    )
    .await
    .unwrap();
    assert_eq!(body["status"], "ack");
    assert_eq!(body["delivery_id"], "del_123");
    assert_eq!(body["attempt"], 2);
    assert_eq!(body["event_type"], "run.completed");
    assert_eq!(body["has_context"], true);

    let e = vai::handle_hook(
        &conn,
        "notify",
        "del_9",
        1,
        json!({"type": "fail"}),
        &ctx,
        t,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, InvokeError::Failed { status, retryable: true, message, .. }
            if status == "retryable_failure" && message == "slack is down"),
        "{e:?}"
    );
    let e = vai::handle_hook(&conn, "echo", "d", 1, json!({}), &ctx, t)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            InvokeError::WrongKind {
                kind: "tool",
                expected: "hook",
                ..
            }
        ),
        "{e:?}"
    );
    let e = vai::handle_hook(&conn, "nope", "d", 1, json!({}), &ctx, t)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has no export \"nope\""), "{e}");

    let result = vai::compact(
        &conn,
        "window",
        CompactRequest {
            compaction_id: "cmp_1".into(),
            source: json!({"chain_id": "ch_1", "projection": {"transport": "inline", "blocks": [1, 2, 3], "pinned_items": [], "token_estimate": 100}}),
            target: json!({"max_input_tokens": 32000, "target_model": "m"}),
            policy: json!({"retain_system": true}),
        },
        &ctx,
        t,
    )
    .await
    .unwrap();
    assert_eq!(result["summary"]["text"], "compaction cmp_1");
    assert_eq!(result["seed_blocks"][0]["content"][0]["text"], "kept 2");

    let result = vai::run_harness(
        &conn,
        "triage",
        HarnessRequest {
            mode: "start".into(),
            target: json!({"session_id": "s", "chain_id": "ch_9", "execution_id": "e"}),
            trigger: json!({"type": "user_request", "input": []}),
            policy: json!({"max_depth": 4}),
        },
        &ctx,
        t,
    )
    .await
    .unwrap();
    assert_eq!(result["checkpoint"]["data"]["cursor"], 12);
    assert_eq!(result["summary"]["text"], "mode start for ch_9");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vai_devkit_example_works_from_the_cli_and_the_internal_api() {
    let ws = Ws::new();
    crate::support::copy_dir(
        &repo().join("examples/workspace/.plugins/vai-devkit"),
        &ws.plugin_dir("vai-devkit"),
    );
    let o = ws.plugd(&["plugin", "approve", "acme/devkit"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("acme/devkit/text_stats"),
        "{}",
        stdout(&o)
    );

    let show = ws.plugd(&["plugin", "show", "acme/devkit", "--json"]);
    let show: Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(show["dialect"], "vai");
    assert_eq!(show["version"], "0.1.0");

    let list = ws.plugd(&["tool", "list", "--json"]);
    let list: Value = serde_json::from_str(&stdout(&list)).unwrap();
    let tool = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "acme/devkit/text_stats")
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(tool["plugin"], "acme/devkit");
    assert_eq!(tool["input_schema"]["required"], json!(["text"]));

    let o = plugd_cmd(ws.dir())
        .args([
            "tool",
            "call",
            "acme/devkit/text_stats",
            "--json",
            "--args",
            r#"{"text":"one two\nthree"}"#,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let got: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        got["structured_output"],
        json!({"lines": 2, "words": 3, "chars": 13})
    );
    assert!(
        stderr(&o).contains("progress: counting [0/1 (0%)]"),
        "{}",
        stderr(&o)
    );
    // Arguments are validated against the schema file before the call.
    let o = ws.plugd(&["tool", "call", "acme/devkit/text_stats", "--args", "{}"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("\"text\" is a required property"),
        "{}",
        stderr(&o)
    );

    // The hook and the compactor, through the internal API.
    let rt = ws.runtime(quick(10_000)).await;
    let conn = conn(&rt, "acme/devkit").await;
    let ctx = CallContext::default();
    let body = vai::handle_hook(
        &conn,
        "audit_log",
        "del_1",
        1,
        json!({"type": "run.completed"}),
        &ctx,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(body["status"], "ack");
    let result = vai::compact(
        &conn,
        "tail_window",
        CompactRequest {
            compaction_id: "cmp_1".into(),
            source: json!({"chain_id": "ch_1", "projection": {"blocks": [1, 2, 3, 4, 5, 6], "token_estimate": 600}}),
            target: json!({"max_input_tokens": 1000}),
            policy: json!({}),
        },
        &ctx,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(result["seed_blocks"], json!([3, 4, 5, 6]));
    assert_eq!(result["summary"]["text"], "kept the last 4 of 6 blocks");
    rt.shutdown().await;
}
