//! salmex dialect: real plugins of this contract through the runtime and the CLI.
//!
//! The hostile plugin is `tests/plugins/salmex/misbehave.py` (Python stdlib);
//! the example plugins are `examples/workspace/.plugins/hello-salmex-*`
//! (Node — the seed's `main.js` unchanged —, Python and Bash).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugd_dialects::salmex::config_changed;
use plugd_host::dialect::HostServices;
use plugd_host::model::ToolError;
use plugd_host::spawn::process_group_alive;
use plugd_host::{CallError, CallToolError, NoObserver, PluginError, Status, Supervised};
use plugd_manifest::LoadOptions;
use plugd_manifest::salmex::load_salmex;
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, plugd_cmd, quick, repo, stderr, stdout};

/// The tools of the hostile plugin: (name, risk level, description).
const TOOLS: &[(&str, &str, &str)] = &[
    ("echo", "low", "Echo the arguments"),
    ("sleep", "low", "Sleep {ms}"),
    ("crash", "high", "Exit with status 3"),
    ("fail", "medium", "Fail at the tool level"),
    ("rpc_error", "low", "Answer with a JSON-RPC error"),
    ("progress", "low", "Report progress"),
    ("pid", "low", "Process and group id"),
    ("log", "low", "Send log notifications"),
    ("greet", "low", ""),
    ("spawn_child", "critical", "Start a grandchild"),
    ("frame", "low", "Answer with a malformed frame"),
];

/// A plugin `name` running the hostile Salmex plugin in `mode`.
fn hostile(ws: &Ws, name: &str, mode: &str) -> PathBuf {
    let dir = ws.plugin_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/salmex/misbehave.py"),
        dir.join("misbehave.py"),
    )
    .unwrap();
    std::fs::write(dir.join("mode"), mode).unwrap();
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|(n, risk, desc)| {
            let mut t = json!({"name": n, "risk_level": risk, "parameters": {"type": "object"}});
            if !desc.is_empty() {
                t["description"] = json!(desc);
            }
            t
        })
        .collect();
    let manifest = json!({
        "name": name,
        "version": "0.1.0",
        "protocolVersion": "1.0",
        "interpreter": "python3",
        "main": "misbehave.py",
        "capabilities": {"tools": tools},
        "config": {"properties": [
            {"key": "greeting", "type": "string", "default": "Hello"},
            {"key": "token", "type": "secret"}
        ]}
    });
    std::fs::write(
        dir.join("plugin.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    dir
}

fn text_of(v: &Value) -> &str {
    v["content"][0]["text"].as_str().unwrap_or_default()
}

async fn pid_of(rt: &Runtime, plugin: &str) -> (u64, u64) {
    let v = rt
        .call_tool(&format!("{plugin}/pid"), json!({}), None)
        .await
        .unwrap();
    (v["pid"].as_u64().unwrap(), v["pgid"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_registers_the_manifest_tools_namespaced_with_risk_levels() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    let rt = ws.runtime(quick(10_000)).await;
    let info = rt.approve("sx", "test").await.unwrap();
    assert_eq!(info.dialect, "salmex");
    let tools = rt.tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), TOOLS.len(), "{names:?}");
    for (n, risk, desc) in TOOLS {
        let t = tools
            .iter()
            .find(|t| t.name == format!("sx/{n}"))
            .unwrap_or_else(|| panic!("sx/{n} missing from {names:?}"));
        assert_eq!(t.plugin, "sx");
        assert_eq!(t.risk_level.as_deref(), Some(*risk));
        assert_eq!(t.def.wire(), *n, "the wire name is the bare tool name");
        let want = if desc.is_empty() {
            format!("advertised: {n}")
        } else {
            (*desc).to_owned()
        };
        assert_eq!(t.description, want);
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_call_returns_the_result_as_sent_and_config_defaults_arrive() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("sx", "test").await.unwrap();
    let v = rt
        .call_tool("sx/echo", json!({"a": 1, "b": "two"}), None)
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({"content": [{"type": "text", "text": "{\"a\": 1, \"b\": \"two\"}"}]})
    );
    // The config schema's defaults are the initialize config (no value for the secret).
    let v = rt
        .call_tool("sx/greet", json!({"name": "Ada"}), None)
        .await
        .unwrap();
    assert_eq!(text_of(&v), "Hello, Ada!");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_error_results_are_tool_level_failures() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("sx", "test").await.unwrap();
    let err = rt.call_tool("sx/fail", json!({}), None).await.unwrap_err();
    match &err {
        RuntimeError::Call(CallToolError::Tool(ToolError::ExecutionFailed {
            plugin,
            tool,
            message,
        })) => {
            assert_eq!(&**plugin, "sx");
            assert_eq!(tool, "sx/fail");
            assert_eq!(message, "disk full: cannot write /tmp/out");
        }
        other => panic!("{other:?}"),
    }
    // The plugin is fine afterwards.
    rt.call_tool("sx/echo", json!({}), None).await.unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_rpc_errors_are_call_errors_with_the_plugins_message() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("sx", "test").await.unwrap();
    let err = rt
        .call_tool("sx/rpc_error", json!({}), None)
        .await
        .unwrap_err();
    match &err {
        RuntimeError::Call(CallToolError::Tool(ToolError::Call(CallError::Remote {
            method,
            error,
            ..
        }))) => {
            assert_eq!(method, "tools/call");
            assert_eq!(error.code, -32000);
            assert_eq!(error.message, "backend unreachable");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("backend unreachable"), "{err}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_call_times_out_and_the_same_process_serves_the_next() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    let rt = ws.runtime(quick(500)).await;
    rt.approve("sx", "test").await.unwrap();
    let before = pid_of(&rt, "sx").await;
    let err = rt
        .call_tool("sx/sleep", json!({"ms": 10_000}), None)
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
    assert_eq!(pid_of(&rt, "sx").await, before);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_is_reported_and_the_restart_keeps_tool_handles() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    let rt = ws.runtime(quick(30_000)).await;
    // `crash` is a high-risk tool: approve its calls.
    rt.set_approver(std::sync::Arc::new(crate::risk::ApproveAll));
    rt.approve("sx", "test").await.unwrap();
    let (pid, _) = pid_of(&rt, "sx").await;
    let t = Instant::now();
    let err = rt.call_tool("sx/crash", json!({}), None).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("crashed: exit status 3"), "{text}");
    assert!(text.contains("crashing on purpose"), "stderr tail: {text}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the crash, not the 30 s deadline"
    );
    // The supervisor restarts it; the same tool names reach the new process.
    let deadline = Instant::now() + Duration::from_secs(15);
    let pid2 = loop {
        if let Ok(v) = rt.call_tool("sx/pid", json!({}), None).await {
            break v["pid"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "no restart within 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(pid, pid2, "a new process serves the same tool names");
    let v = rt
        .call_tool("sx/greet", json!({"name": "Bo"}), None)
        .await
        .unwrap();
    assert_eq!(text_of(&v), "Hello, Bo!");
    rt.shutdown().await;
}

/// Starts the hostile plugin in `mode` under a bare supervisor; returns the
/// start error's text once the supervisor has settled.
async fn start_error(mode: &str) -> (String, Status) {
    let ws = Ws::new();
    let dir = hostile(&ws, "liar", mode);
    let spec = Arc::new(load_salmex(&dir.join("plugin.json"), &LoadOptions::default()).unwrap());
    let sup = Supervised::new(
        spec,
        Arc::new(quick(10_000)),
        Arc::new(NoObserver),
        HostServices::for_workspace(ws.dir(), plugd_dialects::table()),
    );
    let err = sup
        .connection(Instant::now() + Duration::from_secs(15))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PluginError::Handshake { .. } | PluginError::Failed { .. }
        ),
        "{err:?}"
    );
    (err.to_string(), sup.status())
}

/// The handshake's verdicts as variants are unit-tested in
/// `plugd_dialects::salmex`; here real plugins lie and get refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_and_impersonation_are_permanent_refusals() {
    for (mode, fragment) in [
        (
            "wrong_version",
            "protocolVersion \"2.0\" is not \"1.0\"; the plugin speaks another protocol",
        ),
        (
            "impostor",
            "advertised tool \"other-plugin/say_hello\" outside its namespace",
        ),
        (
            "undeclared",
            "advertised tool \"sneaky\", which is not declared in capabilities.tools of plugin.json",
        ),
    ] {
        let (err, status) = start_error(mode).await;
        assert!(err.contains(fragment), "{mode}: {err}");
        assert!(
            matches!(status, Status::Failed { .. }),
            "{mode}: refused for good, not retried: {status:?}"
        );
    }

    // Through the runtime: the approval is not kept.
    let ws = Ws::new();
    hostile(&ws, "liar", "impostor");
    let rt = ws.runtime(quick(10_000)).await;
    let err = rt.approve("liar", "test").await.unwrap_err();
    assert!(
        err.to_string().contains("\"other-plugin/say_hello\""),
        "{err}"
    );
    assert!(!rt.plugin("liar").await.unwrap().approved);
    assert!(rt.tools().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_kill_the_plugin_fail_callers_fast_and_spare_the_others() {
    let cases: &[(&str, &str)] = &[
        (
            "non_numeric",
            "bad Content-Length header: Content-Length \"twelve\" is not a non-negative integer",
        ),
        (
            "negative",
            "bad Content-Length header: Content-Length \"-5\" is not a non-negative integer",
        ),
        ("huge_number", "is too large"),
        (
            "no_blank_line",
            "header block exceeds 8192 bytes without a blank line",
        ),
        (
            "header_flood",
            "header block exceeds 8192 bytes without a blank line",
        ),
        ("oversized", "over the 16777216-byte limit"),
        ("oversized_stall", "over the 16777216-byte limit"),
    ];
    let ws = Ws::new();
    for (kind, _) in cases {
        hostile(&ws, &format!("bad-{}", kind.replace('_', "-")), "good");
    }
    ws.example("hello-salmex-python");
    let rt = ws.runtime(quick(30_000)).await;
    for (kind, _) in cases {
        rt.approve(&format!("bad-{}", kind.replace('_', "-")), "test")
            .await
            .unwrap();
    }
    rt.approve("hello-salmex-python", "test").await.unwrap();

    let mut calls = Vec::new();
    for (kind, _) in cases {
        let id = format!("bad-{}", kind.replace('_', "-"));
        let (_, pgid) = pid_of(&rt, &id).await;
        let rt = rt.clone();
        let kind = (*kind).to_owned();
        calls.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = rt
                .call_tool(&format!("{id}/frame"), json!({"kind": kind}), None)
                .await;
            (r, t.elapsed(), pgid)
        }));
    }
    // Meanwhile the well-behaved plugin keeps answering.
    for i in 0..5 {
        let v = rt
            .call_tool(
                "hello-salmex-python/say_hello",
                json!({"name": i.to_string()}),
                None,
            )
            .await
            .unwrap();
        assert_eq!(text_of(&v), format!("Hello, {i}!"));
    }
    for ((kind, fragment), call) in cases.iter().zip(calls) {
        let (result, took, pgid) = call.await.unwrap();
        let err = result.unwrap_err().to_string();
        assert!(err.contains(fragment), "{kind}: {err}");
        // The deadline is 30 s: well under it means the violation ended the call.
        assert!(took < Duration::from_secs(10), "{kind} took {took:?}");
        assert!(
            eventually(Duration::from_secs(5), || !process_group_alive(pgid as u32)).await,
            "{kind}: the plugin's process group is still alive"
        );
    }
    let v = rt
        .call_tool(
            "hello-salmex-python/say_hello",
            json!({"name": "after"}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(text_of(&v), "Hello, after!");
    // A broken plugin is restarted and serves again.
    let sup = rt.supervised("bad-negative").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            sup.status(),
            Status::Running { .. }
        ))
        .await,
        "{:?}",
        sup.status()
    );
    rt.call_tool("bad-negative/echo", json!({}), None)
        .await
        .unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_initialize_reply_refuses_the_approval_with_the_cause() {
    let ws = Ws::new();
    hostile(&ws, "sx", "init_frame:negative");
    let rt = ws.runtime(quick(10_000)).await;
    let t = Instant::now();
    let err = rt.approve("sx", "test").await.unwrap_err().to_string();
    assert!(
        err.contains("Content-Length \"-5\" is not a non-negative integer"),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(!rt.plugin("sx").await.unwrap().approved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_process_behind() {
    // A plugin that exits on the shutdown notification, with a grandchild.
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    // One that ignores it: killed after the grace period.
    hostile(&ws, "stubborn", "ignore_shutdown");
    let rt = ws.runtime(quick(10_000)).await;
    // `spawn_child` is a critical-risk tool: approve its calls.
    rt.set_approver(std::sync::Arc::new(crate::risk::ApproveAll));
    rt.approve("sx", "test").await.unwrap();
    rt.approve("stubborn", "test").await.unwrap();
    let v = rt
        .call_tool("sx/spawn_child", json!({}), None)
        .await
        .unwrap();
    let pgid = v["pgid"].as_u64().unwrap() as u32;
    let v = rt
        .call_tool("stubborn/spawn_child", json!({}), None)
        .await
        .unwrap();
    let stubborn_pgid = v["pgid"].as_u64().unwrap() as u32;
    assert!(process_group_alive(pgid) && process_group_alive(stubborn_pgid));
    rt.shutdown().await;
    for g in [pgid, stubborn_pgid] {
        assert!(
            eventually(Duration::from_secs(5), || !process_group_alive(g)).await,
            "process group {g} outlived the shutdown"
        );
    }
    assert!(matches!(
        rt.supervised("stubborn").unwrap().status(),
        Status::Stopped
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_changed_reaches_the_running_plugin() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    ws.example("hello-salmex-python");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("sx", "test").await.unwrap();
    rt.approve("hello-salmex-python", "test").await.unwrap();
    for (plugin, tool) in [
        ("sx", "sx/greet"),
        ("hello-salmex-python", "hello-salmex-python/say_hello"),
    ] {
        let v = rt
            .call_tool(tool, json!({"name": "Cy"}), None)
            .await
            .unwrap();
        assert_eq!(text_of(&v), "Hello, Cy!");
        let conn = rt.supervised(plugin).unwrap().current().unwrap();
        assert!(config_changed(&conn, json!({"greeting": "Howdy"})));
        // Notifications and calls share one ordered stream: the next call sees it.
        let v = rt
            .call_tool(tool, json!({"name": "Cy"}), None)
            .await
            .unwrap();
        assert_eq!(text_of(&v), "Howdy, Cy!", "{plugin}");
    }
    rt.shutdown().await;
}

/// `s` without ANSI colour sequences.
fn plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn json_out(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "plugd failed: {}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

#[test]
fn progress_and_logs_reach_the_cli() {
    let ws = Ws::new();
    hostile(&ws, "sx", "good");
    let o = ws.plugd(&["plugin", "approve", "sx"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ws.plugd(&["tool", "call", "sx/progress", "--args", r#"{"steps":3}"#]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    for line in [
        "progress: step 1 [1/3 (33%)]",
        "progress: step 2 [2/3 (67%)]",
        "progress: step 3 [3/3 (100%)]",
        "progress: almost done",
    ] {
        assert!(err.lines().any(|l| l == line), "{line:?} not in:\n{err}");
    }
    assert!(stdout(&o).contains("done"));

    let o = plugd_cmd(ws.dir())
        .args(["--log", "info", "tool", "call", "sx/log", "--args", "{}"])
        .output()
        .unwrap();
    let err = plain(&stderr(&o));
    assert!(o.status.success(), "{err}");
    let warn = err
        .lines()
        .find(|l| l.contains("careful: low on widgets"))
        .unwrap_or_else(|| panic!("log.warn missing:\n{err}"));
    assert!(
        warn.contains("WARN") && warn.contains("plugin=\"sx\""),
        "{warn}"
    );
    let error = err
        .lines()
        .find(|l| l.contains("widget 7 failed"))
        .unwrap_or_else(|| panic!("log.error missing:\n{err}"));
    assert!(
        error.contains("ERROR")
            && error.contains("{\"widget\":7}")
            && error.contains("plugin=\"sx\""),
        "{error}"
    );
}

#[test]
fn the_example_plugins_in_node_python_and_bash_work_through_the_cli() {
    let ws = Ws::new();
    let ids = [
        "hello-salmex-node",
        "hello-salmex-python",
        "hello-salmex-bash",
    ];
    for id in ids {
        ws.example(id);
    }
    let list = json_out(&ws.plugd(&["plugin", "list", "--json"]));
    for p in list.as_array().unwrap() {
        assert_eq!(p["dialect"], "salmex", "{p}");
    }
    for id in ids {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "approve {id}: {}", stderr(&o));
    }
    let tools = json_out(&ws.plugd(&["tool", "list", "--json"]));
    for id in ids {
        let name = format!("{id}/say_hello");
        let t = tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} missing: {tools}"));
        assert_eq!(t["risk_level"], "low");
        assert_eq!(t["plugin"], id);
        assert_eq!(t["description"], "Greet someone by name");
        let out =
            json_out(&ws.plugd(&["tool", "call", &name, "--args", r#"{"name":"x"}"#, "--json"]));
        assert_eq!(out["content"][0]["text"], "Hello, x!", "{name}: {out}");
        // Non-ASCII arguments: the seed's main.js measures Content-Length in
        // UTF-16 units, so the host sends ASCII-only JSON (\u escapes).
        let out = json_out(&ws.plugd(&[
            "tool",
            "call",
            &name,
            "--args",
            r#"{"name":"Zoë 😀"}"#,
            "--json",
        ]));
        assert_eq!(out["content"][0]["text"], "Hello, Zoë 😀!", "{name}: {out}");
    }
    // The schema from plugin.json is enforced before the plugin is called.
    let o = ws.plugd(&[
        "tool",
        "call",
        "hello-salmex-node/say_hello",
        "--args",
        "{}",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("do not match its input schema"),
        "{}",
        stderr(&o)
    );
}
