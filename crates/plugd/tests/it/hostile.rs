//! Plugins that crash, hang, flood, print junk and lie, against the runtime.

use std::time::{Duration, Instant};

use plugd_host::model::ToolError;
use plugd_host::spawn::process_group_alive;
use plugd_host::{CallError, CallToolError, Status};
use plugd_runtime::{ArgsError, RuntimeError};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, quick};

const FAST_RESTART: &str = "[plugin.supervisor]\nbackoff_base_ms = 100\nshutdown_timeout_ms = 500\nshutdown_grace_ms = 300\n";

fn pid_of(v: &Value) -> (u64, u64) {
    (v["pid"].as_u64().unwrap(), v["pgid"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_call_fails_every_caller_at_once_and_restart_keeps_tool_handles() {
    let ws = Ws::new();
    ws.misbehave("crashy", "good", None, FAST_RESTART);
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("crashy", "test").await.unwrap();
    let before = rt.call_tool("crashy_pid", json!({}), None).await.unwrap();

    // One call sleeps (in flight) while another crashes the process.
    let sleeper = {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.call_tool("crashy_sleep", json!({"ms": 20_000}), None)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let err = rt
        .call_tool("crashy_crash", json!({}), None)
        .await
        .unwrap_err();
    let crash_latency = t.elapsed();
    let text = err.to_string();
    assert!(
        text.contains("\"crashy\"") && text.contains("crashed: exit status 3"),
        "{text}"
    );
    let in_flight = sleeper.await.unwrap().unwrap_err().to_string();
    assert!(
        in_flight.contains("crashed: exit status 3"),
        "the in-flight call fails too: {in_flight}"
    );
    // The call's deadline is 30 s: failing in under 5 s means the crash, not a timeout, ended it.
    assert!(
        crash_latency < Duration::from_secs(5),
        "took {crash_latency:?}"
    );

    // The supervisor restarts it; the same tool names keep working.
    let sup = rt.supervised("crashy").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            sup.status(),
            Status::Running { .. }
        ))
        .await
    );
    let after = rt.call_tool("crashy_pid", json!({}), None).await.unwrap();
    assert_ne!(
        pid_of(&before).0,
        pid_of(&after).0,
        "a new process serves the same handle"
    );
    let echo = rt
        .call_tool("crashy_echo", json!({"x": 1}), None)
        .await
        .unwrap();
    assert_eq!(echo, json!({"echo": {"x": 1}}));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_call_times_out_and_the_plugin_stays_alive() {
    let ws = Ws::new();
    ws.misbehave("slow", "good", None, "");
    let rt = ws.runtime(quick(400)).await;
    rt.approve("slow", "test").await.unwrap();
    let before = rt.call_tool("slow_pid", json!({}), None).await.unwrap();
    let err = rt
        .call_tool("slow_sleep", json!({"ms": 10_000}), None)
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
        err.to_string()
            .contains("did not answer tool.invoke within"),
        "{err}"
    );
    let after = rt.call_tool("slow_pid", json!({}), None).await.unwrap();
    assert_eq!(before, after, "the same process answers the next call");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_never_answers_tool_calls_times_out_each_call() {
    let ws = Ws::new();
    ws.misbehave("mute", "hang", None, "");
    let rt = ws.runtime(quick(300)).await;
    rt.approve("mute", "test").await.unwrap();
    for _ in 0..3 {
        let err = rt
            .call_tool("mute_echo", json!({}), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did not answer"), "{err}");
    }
    let sup = rt.supervised("mute").unwrap();
    assert!(matches!(sup.status(), Status::Running { .. }));
    assert_eq!(
        sup.current().unwrap().peer.pending_calls(),
        0,
        "abandoned calls leave no pending entry"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_stops_reading_stdin_cannot_hang_callers() {
    let ws = Ws::new();
    ws.misbehave("deaf", "no_read", None, "");
    let rt = ws.runtime(quick(500)).await;
    rt.approve("deaf", "test").await.unwrap();
    // 1 MiB of arguments per call: the pipe (64 KiB) fills, the writer blocks,
    // the queue fills; every caller still gets its timeout.
    let big = json!({"pad": "x".repeat(1 << 20)});
    let t = Instant::now();
    let mut calls = Vec::new();
    for _ in 0..80 {
        let rt = rt.clone();
        let big = big.clone();
        calls.push(tokio::spawn(async move {
            rt.call_tool("deaf_echo", big, None).await
        }));
    }
    for c in calls {
        let err = c.await.unwrap().unwrap_err();
        assert!(
            err.to_string()
                .contains("did not answer tool.invoke within"),
            "{err}"
        );
    }
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "callers hung: {:?}",
        t.elapsed()
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_on_stdout_is_logged_and_skipped() {
    let ws = Ws::new();
    ws.misbehave("junky", "junk", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("junky", "test").await.unwrap();
    let got = rt
        .call_tool("junky_echo", json!({"a": [1, 2]}), None)
        .await
        .unwrap();
    assert_eq!(got, json!({"echo": {"a": [1, 2]}}));
    let stats = rt.plugin("junky").await.unwrap().stats.unwrap();
    assert!(stats.junk_frames >= 3, "{stats:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_line_is_refused_without_buffering_and_the_call_fails_fast() {
    let ws = Ws::new();
    ws.misbehave("huge", "huge_line", None, "");
    let rt = ws.runtime(quick(60_000)).await;
    rt.approve("huge", "test").await.unwrap();
    let t = Instant::now();
    let err = rt
        .call_tool("huge_echo", json!({}), None)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("over the 16777216-byte limit") && text.contains("\"huge\""),
        "{text}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the refused frame ends the call, not its deadline"
    );
    // The stream resynchronises at the next line: the plugin is still usable.
    let ok = rt
        .call_tool("huge_echo", json!({"after": true}), None)
        .await
        .unwrap();
    assert_eq!(ok, json!({"echo": {"after": true}}));
    assert_eq!(
        rt.plugin("huge")
            .await
            .unwrap()
            .stats
            .unwrap()
            .oversized_frames,
        1
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_duplicate_response_ids_are_dropped() {
    let ws = Ws::new();
    ws.misbehave("liar", "unknown_ids", None, "");
    ws.misbehave("twice", "duplicate_ids", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("liar", "test").await.unwrap();
    rt.approve("twice", "test").await.unwrap();
    for i in 0..5 {
        assert_eq!(
            rt.call_tool("liar_echo", json!({"i": i}), None)
                .await
                .unwrap(),
            json!({"echo": {"i": i}})
        );
        assert_eq!(
            rt.call_tool("twice_echo", json!({"i": i}), None)
                .await
                .unwrap(),
            json!({"echo": {"i": i}})
        );
    }
    assert!(rt.plugin("liar").await.unwrap().stats.unwrap().unknown_ids >= 10);
    assert!(rt.plugin("twice").await.unwrap().stats.unwrap().unknown_ids >= 5);
    rt.shutdown().await;
}

async fn approval_error(mode: &str, arg: Option<&str>) -> String {
    let ws = Ws::new();
    ws.misbehave(
        "shady",
        mode,
        arg,
        "[plugin.supervisor]\ninit_timeout_ms = 3000\n",
    );
    let rt = ws.runtime(quick(10_000)).await;
    let err = rt.approve("shady", "test").await.unwrap_err().to_string();
    // Refused: not approved, no tools, nothing left running.
    let info = rt.plugin("shady").await.unwrap();
    assert!(!info.approved && info.tools.is_empty(), "{info:?}");
    assert!(rt.state().approval("shady").await.unwrap().is_none());
    rt.shutdown().await;
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_echoing_another_plugins_id_is_refused() {
    let err = approval_error("wrong_identity", Some("hello_rust")).await;
    assert!(
        err.contains("identified itself as \"hello_rust\"") && err.contains("impostor"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_tool_is_refused() {
    let err = approval_error("undeclared_tool", None).await;
    assert!(
        err.contains("advertised tool \"shady_extra\"")
            && err.contains("not declared in [plugin.extends].tools"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_outside_the_namespace_is_refused() {
    let err = approval_error("unnamespaced_tool", None).await;
    assert!(
        err.contains("\"othername_tool\" outside its namespace"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_during_initialize_reports_the_status_and_stderr() {
    let err = approval_error("exit_during_init", None).await;
    assert!(err.contains("exit status 7"), "{err}");
    assert!(
        err.contains("giving up during initialize"),
        "the stderr tail is in the report: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_initialize_is_killed_at_the_init_deadline() {
    let ws = Ws::new();
    ws.misbehave(
        "sloth",
        "slow_init",
        Some("30000"),
        "[plugin.supervisor]\ninit_timeout_ms = 300\n",
    );
    let rt = ws.runtime(quick(10_000)).await;
    let t = Instant::now();
    let err = rt.approve("sloth", "test").await.unwrap_err().to_string();
    assert!(
        err.contains("did not answer initialize within 300ms"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_ignoring_shutdown_is_killed_with_its_whole_process_group() {
    let ws = Ws::new();
    ws.misbehave("stubborn", "ignore_shutdown", None, FAST_RESTART);
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("stubborn", "test").await.unwrap();
    let (_, pgid) = pid_of(&rt.call_tool("stubborn_pid", json!({}), None).await.unwrap());
    assert!(process_group_alive(pgid as u32));
    let t = Instant::now();
    rt.shutdown().await;
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        t.elapsed()
    );
    // The grandchild (`sleep 300` in the same group) is gone too. It is killed
    // with the group; init may take a moment to reap its zombie.
    assert!(
        eventually(Duration::from_secs(5), || !process_group_alive(pgid as u32)).await,
        "process group {pgid} survived shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_tool_errors_reach_the_caller() {
    let ws = Ws::new();
    ws.misbehave("typed", "good", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("typed", "test").await.unwrap();
    let fail = |code: i64, data: Value| json!({"code": code, "message": "nope", "data": data});
    let err = rt
        .call_tool(
            "typed_fail",
            fail(-33404, json!({"retry_after_ms": 1500})),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Call(CallToolError::Tool(ToolError::Unavailable {
                retry_after_ms: Some(1500),
                ..
            }))
        ),
        "{err:?}"
    );
    let err = rt
        .call_tool(
            "typed_fail",
            fail(-33402, json!({"details": {"city": "required"}})),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Call(CallToolError::Tool(ToolError::ArgumentInvalid { details: Some(d), .. })) if d["city"] == "required"),
        "{err:?}"
    );
    for (code, name) in [
        (-33401, "not found"),
        (-33403, "failed"),
        (-33405, "denied"),
    ] {
        let err = rt
            .call_tool("typed_fail", fail(code, Value::Null), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(name), "{code}: {err}");
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_violations_are_refused_before_the_plugin_is_started() {
    let ws = Ws::new();
    ws.example("hello-python");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("hello_python", "test").await.unwrap();
    rt.shutdown().await;
    let rt = ws.runtime(quick(10_000)).await;
    let err = rt
        .call_tool("hello_python_add", json!({"a": "one", "c": 3}), None)
        .await
        .unwrap_err();
    let RuntimeError::Args(ArgsError::Invalid { errors, .. }) = &err else {
        panic!("{err:?}")
    };
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"/a"), "{paths:?}");
    // Lazy plugin, refused call: it was never started, so never called.
    assert_eq!(
        rt.supervised("hello_python").unwrap().status(),
        Status::Idle
    );
    let sum = rt
        .call_tool("hello_python_add", json!({"a": 2, "b": 3}), None)
        .await
        .unwrap();
    assert!(sum.to_string().contains('5'), "{sum}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_plugin_loses_its_approval() {
    let ws = Ws::new();
    let dir = ws.misbehave("drift", "good", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("drift", "test").await.unwrap();
    assert!(rt.plugin("drift").await.unwrap().approved);
    rt.shutdown().await;

    std::fs::write(
        dir.join("misbehave.py"),
        "import os; os.system('echo pwned')\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    let info = rt.plugin("drift").await.unwrap();
    assert_eq!(info.state, "changed");
    assert!(!info.approved && info.tools.is_empty(), "{info:?}");
    let err = rt
        .call_tool("drift_echo", json!({}), None)
        .await
        .unwrap_err();
    // Withheld, not unknown: the error names the plugin and the changed file.
    assert!(
        matches!(&err, RuntimeError::Changed { plugin, files, .. }
            if plugin == "drift" && files.contains("changed misbehave.py")),
        "{err:?}"
    );

    // A running plugin whose files change cannot restart either.
    std::fs::copy(
        crate::support::repo().join("tests/plugins/misbehave.py"),
        dir.join("misbehave.py"),
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    assert!(
        rt.plugin("drift").await.unwrap().approved,
        "restoring the files restores the approval"
    );
    rt.call_tool("drift_echo", json!({}), None).await.unwrap();
    std::fs::write(dir.join("extra.txt"), "new file").unwrap();
    rt.restart("drift").await.unwrap();
    let err = rt
        .call_tool("drift_echo", json!({}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("files changed since it was approved"), "{err}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_ends_failed_persists_and_a_manual_restart_resets_it() {
    let ws = Ws::new();
    let dir = ws.misbehave(
        "loop",
        "good",
        None,
        "[plugin.supervisor]\nbackoff_base_ms = 50\nbackoff_max_ms = 100\nrestart_attempts = 2\n",
    );
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("loop", "test").await.unwrap();
    rt.shutdown().await;
    // Now make it die shortly after every handshake (late enough that the
    // approval's own handshake completes).
    let manifest = std::fs::read_to_string(dir.join("nexo-plugin.toml")).unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        manifest.replace("\"good\"", "\"crash_after_init\", \"300\""),
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("loop", "test").await.unwrap();
    let sup = rt.supervised("loop").unwrap().clone();
    assert!(
        eventually(Duration::from_secs(15), || matches!(
            sup.status(),
            Status::Failed { .. }
        ))
        .await
    );
    let Status::Failed { reason } = sup.status() else {
        unreachable!()
    };
    assert!(
        reason.contains("gave up after 2 restart attempts") && reason.contains("exit status 9"),
        "{reason}"
    );
    assert!(
        reason.contains("boom"),
        "stderr tail in the failure: {reason}"
    );
    rt.shutdown().await;

    // The failure survives a new plugd process, until `plugin restart`.
    let rt = ws.runtime(quick(10_000)).await;
    assert_eq!(rt.plugin("loop").await.unwrap().state, "failed");
    let err = rt
        .call_tool("loop_echo", json!({}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("plugd plugin restart loop"), "{err}");
    rt.restart("loop").await.unwrap();
    assert_eq!(rt.plugin("loop").await.unwrap().state, "idle");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_flood_is_bounded_and_the_plugin_works() {
    let ws = Ws::new();
    ws.misbehave("noisy", "stderr_flood", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("noisy", "test").await.unwrap();
    assert_eq!(
        rt.call_tool("noisy_echo", json!(1), None).await.ok(),
        None,
        "args must be an object"
    );
    rt.call_tool("noisy_echo", json!({}), None).await.unwrap();
    let conn = rt.supervised("noisy").unwrap().current().unwrap();
    let tail = conn.stderr.lines();
    assert!(tail.len() <= 32, "{}", tail.len());
    assert!(tail.iter().all(|l| l.len() < 5000), "long lines are cut");
    rt.shutdown().await;
}
