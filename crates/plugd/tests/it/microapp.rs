//! microapp dialect: real microapps (the seed's Python hello-world, a Node one,
//! and the configurable `tests/plugins/microapp/app.py`) through the runtime and the CLI.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use plugd_host::dialect::CallContext;
use plugd_host::dialect::microapp::{Vote, call_hook, notify};
use plugd_host::native::ToolError;
use plugd_host::spawn::process_group_alive;
use plugd_host::{CallError, CallToolError, HandshakeError, PluginError, Status};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, quick, repo, stderr, stdout};

/// Writes `extensions.yaml` with `entries` (id, YAML flow mapping of the
/// entry without `path`), each running its own copy of the test microapp.
fn apps(ws: &Ws, entries: &[(&str, &str)]) {
    let mut yaml = String::from("entries:\n");
    for (id, rest) in entries {
        let dir = ws.dir().join("extensions").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            repo().join("tests/plugins/microapp/app.py"),
            dir.join("app.py"),
        )
        .unwrap();
        let rest = rest.trim();
        let sep = if rest.is_empty() { "" } else { ", " };
        yaml.push_str(&format!(
            "  {id}: {{path: extensions/{id}/app.py{sep}{rest}}}\n"
        ));
    }
    std::fs::write(ws.dir().join("extensions.yaml"), yaml).unwrap();
}

/// One approved test microapp `id` with `rest` in its entry.
async fn one(id: &str, rest: &str) -> (Ws, Runtime) {
    let ws = Ws::new();
    apps(&ws, &[(id, rest)]);
    let rt = ws.runtime(quick(30_000));
    rt.approve(id, "test").await.unwrap();
    (ws, rt)
}

fn tool_err(err: RuntimeError) -> ToolError {
    match err {
        RuntimeError::Call(CallToolError::Tool(e)) => e,
        other => panic!("expected a tool error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_sends_id_state_dir_and_config_and_lists_prefixed_tools() {
    let (ws, rt) = one("agent-creator", "config: {mode: good, model: small}").await;
    let names: Vec<String> = rt.tools().iter().map(|t| t.name.clone()).collect();
    assert!(
        names.contains(&"agent_creator_echo".to_owned()),
        "{names:?}"
    );
    assert!(names.iter().all(|n| n.starts_with("agent_creator_")));
    let init = rt
        .call_tool("agent_creator_state", json!({}), None)
        .await
        .unwrap();
    assert_eq!(init["extension_id"], "agent-creator");
    assert_eq!(init["config"], json!({"mode": "good", "model": "small"}));
    let state_dir = PathBuf::from(init["state_dir"].as_str().unwrap());
    assert_eq!(
        state_dir,
        ws.dir()
            .canonicalize()
            .unwrap()
            .join(".plugd/state/agent-creator")
    );
    assert!(state_dir.is_dir(), "the state directory is created");
    let info = rt.plugin("agent-creator").unwrap();
    assert_eq!(info.dialect, "microapp");
    assert_eq!(
        info.dir,
        ws.dir()
            .canonicalize()
            .unwrap()
            .join("extensions/agent-creator")
    );
    // tools/list on refresh, validated the same way.
    let sup = rt.supervised("agent-creator").unwrap().clone();
    let tools = sup.refresh_tools().await.unwrap();
    assert_eq!(tools.len(), names.len());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_returns_the_output_and_carries_binding_and_inbound() {
    let (_ws, rt) = one("ctx", "").await;
    let got = rt
        .call_tool("ctx_echo", json!({"x": [1, 2]}), None)
        .await
        .unwrap();
    assert_eq!(got, json!({"echo": {"x": [1, 2]}}));

    // From ctx.agent_id; no inbound when there is none.
    let got = rt
        .call_tool("ctx_context", json!({}), Some("ana"))
        .await
        .unwrap();
    assert_eq!(got["binding_context"], json!({"agent_id": "ana"}));
    assert_eq!(got["inbound"], "absent");

    let binding = json!({"agent_id": "ana", "channel": "whatsapp", "account_id": "acme",
        "binding_id": "whatsapp:acme", "binding_index": 0});
    let inbound =
        json!({"kind": "whatsapp_message", "from": "+573000000000", "ts_ms": 1, "session_id": "s"});
    let ctx = CallContext {
        agent_id: Some("ignored".into()),
        binding: Some(binding.clone()),
        inbound: Some(inbound.clone()),
        ..CallContext::default()
    };
    let got = rt
        .call_tool_with("ctx_context", json!({}), &ctx)
        .await
        .unwrap();
    assert_eq!(got["binding_context"], binding);
    assert_eq!(got["inbound"], inbound);
    assert_eq!(
        got["keys"],
        json!(["args", "binding_context", "inbound", "tool"])
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_reply_is_a_tool_level_failure() {
    let (_ws, rt) = one("failing", "").await;
    let err = tool_err(
        rt.call_tool("failing_fail", json!({}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(&err, ToolError::ExecutionFailed { tool, message, .. }
            if tool == "failing_fail" && message == "the tool failed on purpose"),
        "{err:?}"
    );
    // A reply with neither output nor error.
    let err = tool_err(
        rt.call_tool("failing_bad_reply", json!({}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(&err, ToolError::ExecutionFailed { message, .. } if message.contains("malformed tools/call reply")),
        "{err:?}"
    );
    // The process is fine afterwards.
    rt.call_tool("failing_echo", json!({}), None).await.unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_rpc_error_stays_a_protocol_error() {
    let (_ws, rt) = one("rpc", "").await;
    let err = tool_err(
        rt.call_tool("rpc_rpc_error", json!({}), None)
            .await
            .unwrap_err(),
    );
    match &err {
        ToolError::Call(CallError::Remote { error, method, .. }) => {
            assert_eq!(error.code, -32099);
            assert_eq!(error.message, "microapp internal error");
            assert_eq!(method, "tools/call");
        }
        other => panic!("{other:?}"),
    }
    // The seed's reserved codes that mean "arguments" and "later".
    let err = tool_err(
        rt.call_tool(
            "rpc_code",
            json!({"code": -32001, "data": {"field": "name"}}),
            None,
        )
        .await
        .unwrap_err(),
    );
    assert!(
        matches!(&err, ToolError::ArgumentInvalid { details: Some(d), .. } if d["field"] == "name"),
        "{err:?}"
    );
    let err = tool_err(
        rt.call_tool(
            "rpc_code",
            json!({"code": -32003, "data": {"retry_after_ms": 50}}),
            None,
        )
        .await
        .unwrap_err(),
    );
    assert!(
        matches!(
            &err,
            ToolError::Unavailable {
                retry_after_ms: Some(50),
                ..
            }
        ),
        "{err:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_secs_ends_the_call_and_the_process_lives() {
    let (_ws, rt) = one("slow", "timeout_secs: 1").await;
    let before = rt.call_tool("slow_pid", json!({}), None).await.unwrap();
    let t = Instant::now();
    let err = tool_err(
        rt.call_tool("slow_sleep", json!({"ms": 20_000}), None)
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(&err, ToolError::Call(CallError::Timeout { after, .. }) if *after <= Duration::from_secs(1)),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("did not answer tools/call within"),
        "{err}"
    );
    // 1 s, not the 30 s default nor the 20 s sleep.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let after = rt.call_tool("slow_pid", json!({}), None).await.unwrap();
    assert_eq!(before, after, "the same process answers the next call");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_restarts_the_microapp_and_tool_handles_keep_working() {
    let (_ws, rt) = one("crashy", "").await;
    let before = rt.call_tool("crashy_pid", json!({}), None).await.unwrap();
    let err = rt
        .call_tool("crashy_crash", json!({}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("crashed: exit status 3") && err.contains("crashing on purpose"),
        "{err}"
    );
    // Wait for the new process, not the old one still reported running
    // until the supervisor notices the exit.
    let sup = rt.supervised("crashy").unwrap().clone();
    let old_pid = before["pid"].as_u64().unwrap() as u32;
    assert!(
        eventually(Duration::from_secs(15), || matches!(
            sup.status(),
            Status::Running { pid, .. } if pid != old_pid
        ))
        .await,
        "{:?}",
        sup.status()
    );
    let after = rt.call_tool("crashy_pid", json!({}), None).await.unwrap();
    assert_ne!(
        before["pid"], after["pid"],
        "a new process serves the handle"
    );
    assert_eq!(
        rt.call_tool("crashy_echo", json!({"a": 1}), None)
            .await
            .unwrap(),
        json!({"echo": {"a": 1}})
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_and_tools_outside_the_prefix_are_refused() {
    let ws = Ws::new();
    apps(
        &ws,
        &[
            ("impostor", "config: {mode: impostor}"),
            ("outside", "config: {mode: outside}"),
            ("garbled", "config: {mode: malformed}"),
            ("drifting", "config: {mode: list_outside}"),
        ],
    );
    let rt = ws.runtime(quick(10_000));
    let err = rt
        .approve("impostor", "test")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("identified itself as \"someone-else\"") && err.contains("impostor"),
        "{err}"
    );
    let err = rt.approve("outside", "test").await.unwrap_err().to_string();
    assert!(
        err.contains("advertised tool \"create\" outside its namespace")
            && err.contains("must start with \"outside_\""),
        "{err}"
    );
    let err = rt.approve("garbled", "test").await.unwrap_err().to_string();
    assert!(
        err.contains("malformed initialize reply")
            && err.contains("expected an object {tools, version}, got \"hello\""),
        "{err}"
    );
    for id in ["impostor", "outside", "garbled"] {
        assert!(!rt.plugin(id).unwrap().approved, "{id} stays unapproved");
    }
    // tools/list is held to the same rule.
    rt.approve("drifting", "test").await.unwrap();
    let sup = rt.supervised("drifting").unwrap().clone();
    let err = sup.refresh_tools().await.unwrap_err();
    assert!(
        matches!(&err, PluginError::Handshake { source: HandshakeError::Namespace { tool, .. }, .. } if tool == "stray"),
        "{err:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_are_skipped_and_counted() {
    let (_ws, rt) = one("junky", "config: {mode: junk}").await;
    let got = rt
        .call_tool("junky_echo", json!({"a": 1}), None)
        .await
        .unwrap();
    assert_eq!(got, json!({"echo": {"a": 1}}));
    let stats = rt.plugin("junky").unwrap().stats.unwrap();
    assert!(stats.junk_frames >= 6, "{stats:?}");
    assert!(stats.unknown_ids >= 2, "{stats:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_process_of_the_group() {
    let (_ws, rt) = one("tidy", "").await;
    let child = rt.call_tool("tidy_spawn", json!({}), None).await.unwrap()["child"]
        .as_u64()
        .unwrap();
    let pid = rt.call_tool("tidy_pid", json!({}), None).await.unwrap();
    let pgid = pid["pgid"].as_u64().unwrap() as u32;
    assert!(child > 0 && process_group_alive(pgid));
    rt.shutdown().await;
    assert!(
        eventually(Duration::from_secs(5), || !process_group_alive(pgid)).await,
        "the grandchild {child} outlived the shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_microapp_ignoring_shutdown_and_sigterm_is_killed_after_ten_seconds() {
    let (_ws, rt) = one("stubborn", "config: {mode: stubborn}").await;
    rt.call_tool("stubborn_spawn", json!({}), None)
        .await
        .unwrap();
    let pgid = rt.call_tool("stubborn_pid", json!({}), None).await.unwrap()["pgid"]
        .as_u64()
        .unwrap() as u32;
    let t = Instant::now();
    rt.shutdown().await;
    let took = t.elapsed();
    assert!(
        eventually(Duration::from_secs(5), || !process_group_alive(pgid)).await,
        "process group {pgid} survived"
    );
    // 5 s for the reply, SIGTERM (ignored), 5 s grace, then SIGKILL.
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(30),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_requests_are_answered_by_capability() {
    let ws = Ws::new();
    apps(
        &ws,
        &[
            ("granted", "capabilities: [dispatch_outbound, agents_crud]"),
            ("bare", ""),
        ],
    );
    let rt = ws.runtime(quick(30_000));
    rt.approve("granted", "test").await.unwrap();
    rt.approve("bare", "test").await.unwrap();
    let requests = json!({"requests": [
        {"method": "nexo/dispatch", "params": {"to": "+573000000000", "channel": "whatsapp", "body": "Hello"}},
        {"method": "nexo/admin/agents_list", "params": {}},
        {"method": "nexo/admin/credentials_list", "params": {}},
        {"method": "nexo/teleport", "params": {}},
        {"id": 42, "method": "nexo/dispatch", "params": {"channel": "whatsapp"}},
    ]});
    let replies = rt
        .call_tool("granted_outbound", requests.clone(), None)
        .await
        .unwrap();
    let code = |i: usize| replies[i]["error"]["code"].as_i64().unwrap();
    let msg = |i: usize| replies[i]["error"]["message"].as_str().unwrap().to_owned();
    assert_eq!(replies[0]["id"], "app:1", "the id is echoed");
    assert_eq!(code(0), -32603);
    assert!(
        msg(0).contains("no channel \"whatsapp\" is available in this plugd"),
        "{}",
        msg(0)
    );
    assert_eq!(code(1), -32603);
    assert!(msg(1).contains("nexo/admin/agents_list"), "{}", msg(1));
    assert_eq!(code(2), -32000);
    assert!(
        msg(2).contains("capability credentials_crud not granted"),
        "{}",
        msg(2)
    );
    assert_eq!(code(3), -32601);
    assert_eq!(code(4), -32600, "ids must start with app:");
    assert_eq!(replies[4]["id"], 42);

    let replies = rt.call_tool("bare_outbound", requests, None).await.unwrap();
    assert_eq!(replies[0]["error"]["code"], -32000);
    assert!(
        replies[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("capability dispatch_outbound not granted"),
        "{replies}"
    );
    assert_eq!(replies[1]["error"]["code"], -32000);
    assert_eq!(replies[3]["error"]["code"], -32601);

    // The microapp also wrote what it got to its state directory.
    let written =
        std::fs::read_to_string(ws.dir().join(".plugd/state/granted/replies.jsonl")).unwrap();
    assert_eq!(written.lines().count(), 5);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_reach_only_microapps_holding_the_capability() {
    let (ws, rt) = one("listener", "capabilities: [transcripts_subscribe]").await;
    let conn = rt.supervised("listener").unwrap().current().unwrap();
    assert_eq!(
        notify(&conn, "agents/updated", json!({"agent_ids": ["ana"]})),
        Ok(true)
    );
    assert_eq!(
        notify(
            &conn,
            "nexo/notify/transcript_appended",
            json!({"session_id": "s", "role": "user", "body": "hi", "ts_ms": 1})
        ),
        Ok(true)
    );
    let err = notify(
        &conn,
        "nexo/notify/token_rotated",
        json!({"old_hash": "a", "new": "b"}),
    )
    .unwrap_err();
    assert!(
        err.contains("capability \"credentials_crud\" not granted"),
        "{err}"
    );
    let err = notify(&conn, "nexo/notify/pairing_status_changed", json!({})).unwrap_err();
    assert!(err.contains("pairing_initiate"), "{err}");
    let err = notify(&conn, "nexo/notify/unheard_of", json!({})).unwrap_err();
    assert!(err.contains("is not a microapp notification"), "{err}");

    let file = ws.dir().join(".plugd/state/listener/notifications.jsonl");
    let got = || {
        std::fs::read_to_string(&file)
            .map(|s| s.lines().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert!(
        eventually(Duration::from_secs(5), || got().len() == 2).await,
        "{:?}",
        got()
    );
    let methods: Vec<String> = got()
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["method"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        methods,
        ["agents/updated", "nexo/notify/transcript_appended"]
    );
    // Still serving calls.
    rt.call_tool("listener_echo", json!({}), None)
        .await
        .unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_votes_are_typed_and_garbage_is_an_error() {
    let (_ws, rt) = one("hooky", "").await;
    let conn = rt.supervised("hooky").unwrap().current().unwrap();
    let t = Duration::from_secs(5);
    let v = call_hook(&conn, "before_send", json!({"body": "x"}), t)
        .await
        .unwrap();
    assert_eq!(v.vote, Vote::Deny);
    assert_eq!(v.reason.as_deref(), Some("blocked by test"));
    assert_eq!(v.metadata, Some(json!({"event": {"body": "x"}})));
    let v = call_hook(&conn, "allow_all", json!({}), t).await.unwrap();
    assert_eq!(v.vote, Vote::Allow);
    let v = call_hook(&conn, "never_registered", json!({}), t)
        .await
        .unwrap();
    assert_eq!(v.vote, Vote::Abstain, "-32601 is an abstention");
    for hook in ["garbage", "weird"] {
        let err = call_hook(&conn, hook, json!({}), t).await.unwrap_err();
        assert!(
            matches!(&err, ToolError::ExecutionFailed { message, .. } if message.contains("malformed hook decision")),
            "{hook}: {err:?}"
        );
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_config_or_capabilities_needs_a_new_approval() {
    let ws = Ws::new();
    apps(&ws, &[("pinned", "config: {a: 1}")]);
    let rt = ws.runtime(quick(10_000));
    rt.approve("pinned", "test").await.unwrap();
    rt.shutdown().await;
    drop(rt);
    let yaml = std::fs::read_to_string(ws.dir().join("extensions.yaml")).unwrap();
    for changed in [
        yaml.replace("{a: 1}", "{a: 2}"),
        yaml.replace(
            "config: {a: 1}",
            "config: {a: 1}, capabilities: [agents_crud]",
        ),
    ] {
        std::fs::write(ws.dir().join("extensions.yaml"), &changed).unwrap();
        let rt = ws.runtime(quick(10_000));
        let info = rt.plugin("pinned").unwrap();
        assert_eq!(info.state, "changed", "{changed}");
        assert!(!info.approved);
        drop(rt);
    }
    std::fs::write(ws.dir().join("extensions.yaml"), &yaml).unwrap();
    let rt = ws.runtime(quick(10_000));
    assert!(
        rt.plugin("pinned").unwrap().approved,
        "the original entry is still approved"
    );
}

fn copy_examples(ws: &Ws) {
    let from = repo().join("examples/workspace");
    std::fs::copy(
        from.join("extensions.yaml"),
        ws.dir().join("extensions.yaml"),
    )
    .unwrap();
    for app in ["hello", "hello-ts"] {
        let to = ws.dir().join("extensions").join(app);
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(from.join("extensions").join(app)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

fn json_out(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "plugd failed: {}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

#[test]
fn the_example_microapps_load_and_their_tools_are_callable_from_the_cli() {
    let ws = Ws::new();
    copy_examples(&ws);
    let list = json_out(&ws.plugd(&["plugin", "list", "--json"]));
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    for p in list {
        assert_eq!(p["dialect"], "microapp", "{p}");
        assert_eq!(p["state"], "unapproved", "{p}");
    }
    for id in ["hello", "hello-ts"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "approve {id}: {}", stderr(&o));
    }
    let tools = json_out(&ws.plugd(&["tool", "list", "--json"]));
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["hello_ts_greet", "hello_world_greet"]);
    // The seed's unchanged Python example (it would crash on tools/list or a
    // notification: the host sends neither at start-up).
    let out = json_out(&ws.plugd(&[
        "tool",
        "call",
        "hello_world_greet",
        "--args",
        r#"{"name":"Ada"}"#,
        "--json",
    ]));
    assert_eq!(out, json!({"greeting": "hello, Ada"}));
    let out = json_out(&ws.plugd(&[
        "tool",
        "call",
        "hello_ts_greet",
        "--args",
        r#"{"name":"Bo"}"#,
        "--json",
    ]));
    assert_eq!(out, json!({"greeting": "hello, Bo"}));
    // The schema is enforced before the microapp sees the call.
    let o = ws.plugd(&["tool", "call", "hello_world_greet", "--args", "{}"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("do not match its input schema"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_hello_world_passes_the_prefix_rule_under_matching_ids_only() {
    // Each id in its own workspace (hello_world and hello-world share a prefix).
    for (id, ok) in [
        ("hello", true),
        ("hello_world", true),
        ("hello-world", true),
        ("greeter", false),
    ] {
        let ws = Ws::new();
        copy_examples(&ws);
        std::fs::write(
            ws.dir().join("extensions.yaml"),
            format!("entries:\n  {id}:\n    path: extensions/hello/main.py\n"),
        )
        .unwrap();
        let rt = ws.runtime(quick(10_000));
        match rt.approve(id, "test").await {
            Ok(_) if ok => {
                let out = rt
                    .call_tool("hello_world_greet", json!({"name": "Cy"}), None)
                    .await
                    .unwrap();
                assert_eq!(out, json!({"greeting": "hello, Cy"}), "{id}");
            }
            Err(e) if !ok => {
                let e = e.to_string();
                assert!(
                    e.contains("advertised tool \"hello_world_greet\" outside its namespace"),
                    "{id}: {e}"
                );
            }
            other => panic!("{id}: {other:?}"),
        }
        rt.shutdown().await;
    }
}

#[test]
fn plugin_show_names_the_interpreter_and_a_bad_entry_does_not_hide_the_others() {
    let ws = Ws::new();
    copy_examples(&ws);
    let mut yaml = std::fs::read_to_string(ws.dir().join("extensions.yaml")).unwrap();
    yaml.push_str("  broken:\n    path: ../outside.py\n  typo:\n    path: extensions/hello/main.py\n    capabilites: []\n");
    std::fs::write(ws.dir().join("extensions.yaml"), yaml).unwrap();
    let list = json_out(&ws.plugd(&["plugin", "list", "--json"]));
    let by = |id: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing: {list}"))
            .clone()
    };
    assert_eq!(by("hello")["state"], "unapproved");
    assert_eq!(by("broken")["state"], "invalid");
    assert!(
        by("broken")["error"]
            .as_str()
            .unwrap()
            .contains("entries.broken.path"),
        "{list}"
    );
    let typo = by("typo")["error"].as_str().unwrap().to_owned();
    assert!(
        typo.contains("entries.typo.capabilites") && typo.contains("(line "),
        "{typo}"
    );
    let show = json_out(&ws.plugd(&["plugin", "show", "hello-ts", "--json"]));
    let cmd = show["command"].as_array().unwrap();
    assert!(cmd[0].as_str().unwrap().ends_with("/node"), "{show}");
    assert!(
        cmd[1]
            .as_str()
            .unwrap()
            .ends_with("extensions/hello-ts/main.js"),
        "{show}"
    );
}
