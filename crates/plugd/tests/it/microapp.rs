//! microapp dialect: real microapps (the seed's Python hello-world, a Node one,
//! and the configurable `tests/plugins/microapp/app.py`) through the runtime and the CLI.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use plugd_dialects::microapp::{Vote, call_hook, notify};
use plugd_host::dialect::CallContext;
use plugd_host::model::ToolError;
use plugd_host::spawn::process_group_alive;
use plugd_host::{CallError, CallToolError, HandshakeError, PluginError, Status};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::http::Serve;
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
    let rt = ws.runtime(quick(30_000)).await;
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
    let info = rt.plugin("agent-creator").await.unwrap();
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
    assert_eq!(
        got["binding_context"],
        json!({"agent_id": "ana", "channel": null, "account_id": null,
               "binding_id": null, "binding_index": null}),
        "a call outside a turn has no channel binding"
    );
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
    let rt = ws.runtime(quick(10_000)).await;
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
        assert!(
            !rt.plugin(id).await.unwrap().approved,
            "{id} stays unapproved"
        );
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
    let stats = rt.plugin("junky").await.unwrap().stats.unwrap();
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
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("granted", "test").await.unwrap();
    rt.approve("bare", "test").await.unwrap();
    let requests = json!({"requests": [
        {"method": "nexo/dispatch", "params": {"to": "+573000000000", "channel": "whatsapp", "body": "Hello"}},
        {"method": "nexo/admin/agents/list", "params": {}},
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
    assert_eq!(
        replies[1]["result"]["agents"][0]["id"], "default",
        "a granted admin method is answered: {replies}"
    );
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
    let rt = ws.runtime(quick(10_000)).await;
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
        let rt = ws.runtime(quick(10_000)).await;
        let info = rt.plugin("pinned").await.unwrap();
        assert_eq!(info.state, "changed", "{changed}");
        assert!(!info.approved);
        drop(rt);
    }
    std::fs::write(ws.dir().join("extensions.yaml"), &yaml).unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    assert!(
        rt.plugin("pinned").await.unwrap().approved,
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
        let rt = ws.runtime(quick(10_000)).await;
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

/// The lines of a JSONL file the test microapp writes in its state
/// directory (none yet: empty).
fn jsonl(ws: &Ws, app: &str, file: &str) -> Vec<Value> {
    std::fs::read_to_string(ws.dir().join(".plugd/state").join(app).join(file))
        .map(|s| {
            s.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (at most 30 s) until `app`'s `file` has at least `n` lines.
fn wait_lines(ws: &Ws, app: &str, file: &str, n: usize) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let got = jsonl(ws, app, file);
        if got.len() >= n || Instant::now() > end {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `(method, role or kind)` of each notification line.
fn shape(lines: &[Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|l| {
            let p = &l["params"];
            let what = p["role"].as_str().or(p["kind"].as_str()).unwrap_or("");
            (l["method"].as_str().unwrap().to_owned(), what.to_owned())
        })
        .collect()
}

#[test]
fn a_channel_turn_gives_microapps_the_binding_the_inbound_and_every_notification() {
    use crate::channels::{Receiver, post, webhook_ws};
    let rx = Receiver::start();
    let (ws, port) = webhook_ws(&rx.url());
    // rec may receive transcripts; deaf may not (it still runs: its tool is
    // called in the same turn).
    let mut yaml = String::from("entries:\n");
    for (id, rest) in [
        ("rec", ", capabilities: [transcripts_subscribe]"),
        ("deaf", ""),
    ] {
        let dir = ws.dir().join("extensions").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            repo().join("tests/plugins/microapp/app.py"),
            dir.join("app.py"),
        )
        .unwrap();
        yaml.push_str(&format!("  {id}: {{path: extensions/{id}/app.py{rest}}}\n"));
    }
    std::fs::write(ws.dir().join("extensions.yaml"), yaml).unwrap();
    for id in ["rec", "deaf"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "approve {id}: {}", stderr(&o));
    }
    std::fs::write(
        ws.dir().join("script.yaml"),
        "steps:\n  - tool_calls:\n      - {name: rec_context, arguments: {}, id: c1}\n      - {name: deaf_echo, arguments: {n: 1}, id: c2}\n  - text: done\n",
    )
    .unwrap();
    let config = |agent: &str| {
        format!(
            "llm: {{provider: scripted, script: \"${{{{workspace_dir}}}}/script.yaml\"}}\ntenant: {{agent_id: {agent}, tenant_id: acme}}\n"
        )
    };
    std::fs::write(ws.dir().join("plugd.yaml"), config("ana")).unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");

    let before = now_ms();
    let first = json!({"from": "+573000000000", "text": "hi"});
    let mut status = 0;
    for _ in 0..300 {
        status = post(port, &first);
        if status != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 202, "the webhook channel never listened on {port}");
    let end = Instant::now() + Duration::from_secs(30);
    while rx.got().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = now_ms();
    assert_eq!(
        rx.got(),
        [json!({"to": "+573000000000", "body": "done"})],
        "the turn ran to its end"
    );

    // The tools/call carried the seed's binding context and inbound reference.
    let calls = jsonl(&ws, "rec", "calls.jsonl");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["tool"], "rec_context");
    assert_eq!(
        calls[0]["binding_context"],
        json!({"agent_id": "ana", "channel": "webhook", "account_id": "acme",
               "binding_id": "webhook:acme", "binding_index": 0})
    );
    let inbound = &calls[0]["inbound"];
    let session = inbound["session_id"].as_str().unwrap().to_owned();
    assert!(session.starts_with("channel-webhook-"), "{inbound}");
    assert_eq!(inbound["kind"], "webhook_message");
    assert_eq!(inbound["from"], "+573000000000");
    let ts = inbound["ts_ms"].as_u64().unwrap();
    assert!(before <= ts && ts <= after, "{before} <= {ts} <= {after}");
    assert_eq!(
        inbound.as_object().unwrap().len(),
        4,
        "exactly the seed's keys: {inbound}"
    );
    let deaf_calls = jsonl(&ws, "deaf", "calls.jsonl");
    assert_eq!(deaf_calls.len(), 1);
    assert_eq!(
        deaf_calls[0]["binding_context"],
        calls[0]["binding_context"]
    );
    assert_eq!(deaf_calls[0]["inbound"], *inbound);

    // Every entry the turn stored, as transcript_appended and agent_event,
    // then the turn's end, in order.
    let notes = wait_lines(&ws, "rec", "notifications.jsonl", 11);
    let t = "nexo/notify/transcript_appended".to_owned();
    let a = "nexo/notify/agent_event".to_owned();
    let ta = "transcript_appended".to_owned();
    let mut expected = Vec::new();
    for role in ["user", "assistant", "tool", "tool", "assistant"] {
        expected.push((t.clone(), role.to_owned()));
        expected.push((a.clone(), ta.clone()));
    }
    expected.push((a.clone(), "turn_completed".to_owned()));
    assert_eq!(shape(&notes), expected, "{notes:#?}");
    let stored = serve.get(&format!("/v1/sessions/{session}")).json();
    let stored = stored["transcript"].as_array().unwrap();
    assert_eq!(stored.len(), 5);
    for (i, entry) in stored.iter().enumerate() {
        let (tn, an) = (&notes[2 * i]["params"], &notes[2 * i + 1]["params"]);
        assert_eq!(
            tn.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["body", "role", "session_id", "ts_ms"]
        );
        assert_eq!(tn["session_id"], session.as_str());
        assert_eq!(tn["role"], entry["role"]);
        assert_eq!(tn["body"], entry["content"]);
        assert!(tn["ts_ms"].as_u64().unwrap() >= ts);
        assert_eq!(an["agent_id"], "ana");
        assert_eq!(an["payload"]["seq"], i + 1);
        assert_eq!(an["payload"]["body"], entry["content"]);
        assert_eq!(an["payload"]["session_id"], session.as_str());
    }
    assert_eq!(notes[0]["params"]["body"], "hi");
    assert_eq!(notes[8]["params"]["body"], "done");
    let done = &notes[10]["params"];
    assert_eq!(done["agent_id"], "ana");
    assert_eq!(done["payload"]["status"], "completed");
    assert_eq!(done["payload"]["reply"], "done");
    assert_eq!(
        done["payload"]["tool_calls"],
        json!([{"tool": "rec_context", "ok": true}, {"tool": "deaf_echo", "ok": true}])
    );

    // An HTTP turn with a tenant: the binding from its context, no channel,
    // no inbound.
    let r = serve.post(
        "/v1/sessions/s-http/messages",
        &json!({"text": "from http", "context": {"agent_id": "zoe", "account_id": "t9"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let calls = jsonl(&ws, "rec", "calls.jsonl");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[1]["binding_context"],
        json!({"agent_id": "zoe", "channel": null, "account_id": "t9",
               "binding_id": null, "binding_index": null})
    );
    assert!(calls[1].get("inbound").is_none(), "{}", calls[1]);

    // A microapp that missed live frames reads the transcript from a seq;
    // one without transcripts_subscribe may not.
    let read = json!({"args": {"requests": [{"method": "nexo/admin/transcripts/read",
        "params": {"session_id": session, "since_seq": 3}}]}});
    let r = serve.post("/v1/tools/rec_outbound:invoke", &read);
    assert_eq!(r.status, 200, "{}", r.text());
    let entries = r.json()[0]["result"]["entries"].clone();
    assert_eq!(entries.as_array().unwrap().len(), 2, "{entries}");
    for (k, e) in entries.as_array().unwrap().iter().enumerate() {
        assert_eq!(e["seq"], 4 + k);
        assert_eq!(e["role"], stored[3 + k]["role"]);
        assert_eq!(e["body"], stored[3 + k]["content"]);
    }
    let r = serve.post("/v1/tools/deaf_outbound:invoke", &read);
    assert_eq!(r.json()[0]["error"]["code"], -32000, "{}", r.text());

    // The agent changes while serve runs: every running microapp gets
    // agents/updated with the new ids, then tools/list again.
    // (`plugd plugin approve` ran each once: its `shutdown` is there.)
    let requests_before: Vec<usize> = ["rec", "deaf"]
        .iter()
        .map(|app| jsonl(&ws, app, "requests.jsonl").len())
        .collect();
    // (The HTTP turn's own 11 notifications first.)
    let before_update = wait_lines(&ws, "rec", "notifications.jsonl", 22).len();
    assert_eq!(before_update, 22);
    std::fs::write(ws.dir().join("plugd.yaml"), config("bea")).unwrap();
    let notes = wait_lines(&ws, "rec", "notifications.jsonl", before_update + 1);
    let last = notes.last().unwrap();
    assert_eq!(last["method"], "agents/updated", "{notes:#?}");
    assert_eq!(last["params"], json!({"agent_ids": ["bea"]}));
    let deaf = wait_lines(&ws, "deaf", "notifications.jsonl", 1);
    // Per-connection order holds: a transcript notification sent to deaf
    // would be before this line.
    assert_eq!(
        deaf,
        [json!({"jsonrpc": "2.0", "method": "agents/updated", "params": {"agent_ids": ["bea"]}})]
    );
    for (app, n) in ["rec", "deaf"].iter().zip(requests_before) {
        let reqs = wait_lines(&ws, app, "requests.jsonl", n + 1);
        assert_eq!(reqs[n..], [json!({"method": "tools/list"})], "{app}");
    }
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

/// A native plugin `vaultchan` serving channel `vault`, with a secret setting
/// `token` and a plain one `level` (it is never started here).
fn vault_channel(ws: &Ws) {
    let dir = ws.plugin_dir("vaultchan");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/channels/errchan.py"),
        dir.join("errchan.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"vaultchan\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"errchan.py\"]\n\n[[plugin.channels.register]]\nkind = \"vault\"\n\n[plugin.extends]\nchannels = [\"vault\"]\n\n[plugin.config_schema]\ntype = \"object\"\n[plugin.config_schema.properties.token]\ntype = \"string\"\nwriteOnly = true\n[plugin.config_schema.properties.level]\ntype = \"integer\"\ndefault = 1\n",
    )
    .unwrap();
}

/// `plugd tool call TOOL --args {"requests": requests} --json` with the
/// master key in `key`; the replies.
fn admin_calls(ws: &Ws, key: &std::path::Path, tool: &str, requests: Value) -> Vec<Value> {
    let o = crate::support::plugd_cmd(ws.dir())
        .env("PLUGD_KEY_FILE", key)
        .env_remove("PLUGD_MASTER_KEY")
        .args([
            "tool",
            "call",
            tool,
            "--args",
            &json!({ "requests": requests }).to_string(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    v.as_array().unwrap().clone()
}

#[test]
fn admin_requests_answer_from_plugd_state_and_unbacked_ones_say_why() {
    let ws = Ws::new();
    vault_channel(&ws);
    apps(
        &ws,
        &[
            (
                "ops",
                "capabilities: [agents_crud, credentials_crud, pairing_initiate, llm_keys_crud, channels_crud]",
            ),
            ("nosy", "capabilities: [dispatch_outbound]"),
        ],
    );
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm: {provider: openai, base_url: \"http://127.0.0.1:9/v1\", model: m1, api_key_env: PLUGD_TEST_UNSET_KEY}\nagent: {system_prompt: be brief}\ntenant: {agent_id: ana}\n",
    )
    .unwrap();
    for id in ["ops", "nosy"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "approve {id}: {}", stderr(&o));
    }
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("master.key");
    crate::support::test_key_file(&key);
    let r = |m: &str, p: Value| json!({"method": m, "params": p});
    let replies = admin_calls(
        &ws,
        &key,
        "ops_outbound",
        json!([
            r("nexo/admin/agents/list", json!({})),
            r("nexo/admin/agents/get", json!({"id": "ana"})),
            r("nexo/admin/agents/get", json!({"id": "zed"})),
            r("nexo/admin/agents/upsert", json!({"id": "zed"})),
            r("nexo/admin/reload", json!({})),
            r("nexo/admin/llm_providers/list", json!({})),
            r("nexo/admin/llm_providers/upsert", json!({"id": "x"})),
            r(
                "nexo/admin/pairing/start",
                json!({"agent_id": "ana", "channel": "vault"})
            ),
            r("nexo/admin/channels/list", json!({})),
            r("nexo/admin/channels/doctor", json!({})),
            r("nexo/admin/channels/approve", json!({})),
            r(
                "nexo/admin/credentials/register",
                json!({"channel": "vault", "payload": {"token": "s3cret"}})
            ),
            r("nexo/admin/credentials/list", json!({})),
            r(
                "nexo/admin/credentials/register",
                json!({"channel": "vault", "payload": {"level": "2"}})
            ),
            r(
                "nexo/admin/credentials/register",
                json!({"channel": "vault", "instance": "b2", "payload": {"token": "x"}})
            ),
            r(
                "nexo/admin/credentials/register",
                json!({"channel": "sms", "payload": {"token": "x"}})
            ),
            r("nexo/admin/credentials/revoke", json!({"channel": "vault"})),
            r("nexo/admin/credentials/list", json!({})),
            r("nexo/admin/agents/list", json!([1, 2])),
            r("nexo/admin/agents/get", json!({"id": "a".repeat(70_000)})),
            r("nexo/admin/agents/frobnicate", json!({})),
        ]),
    );
    let code = |i: usize| replies[i]["error"]["code"].as_i64();
    let msg = |i: usize| {
        replies[i]["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let res = |i: usize| replies[i]["result"].clone();
    assert_eq!(
        res(0),
        json!({"agents": [{"id": "ana", "active": true, "model_provider": "openai", "bindings_count": 1}]}),
        "{replies:#?}"
    );
    let ana = res(1);
    assert_eq!(ana["id"], "ana");
    assert_eq!(ana["model"], "m1");
    assert_eq!(ana["system_prompt"], "be brief");
    assert_eq!(
        ana["inbound_bindings"],
        json!([{"channel": "vault", "plugin": "vaultchan", "instance": null,
                "binding_id": "vault:default", "binding_index": 0}])
    );
    assert_eq!(code(2), Some(-32602));
    assert!(msg(2).contains("unknown agent \"zed\""), "{}", msg(2));
    for i in [3, 4] {
        assert_eq!(code(i), Some(-32601), "{}", replies[i]);
        assert!(msg(i).contains("plugd runs one agent"), "{}", msg(i));
    }
    assert_eq!(
        res(5)["providers"],
        json!([{"id": "openai", "kind": "openai", "model": "m1", "base_url": "http://127.0.0.1:9/v1",
                "api_key_env": "PLUGD_TEST_UNSET_KEY", "api_key_secret": null, "key_present": false,
                "active": true}])
    );
    assert_eq!(code(6), Some(-32601));
    assert!(
        msg(6).contains("api_key_env") && msg(6).contains("api_key_secret"),
        "{}",
        msg(6)
    );
    assert_eq!(code(7), Some(-32601));
    assert!(msg(7).contains("no pairing flow"), "{}", msg(7));
    assert_eq!(
        res(8)["channels"],
        json!([{"channel": "vault", "plugin": "vaultchan", "approved": false, "state": "unapproved",
                "binding_id": "vault:default", "binding_index": 0}])
    );
    let doctor = &res(9)["channels"][0];
    assert_eq!(doctor["ok"], false);
    assert!(
        doctor["issues"][0]
            .as_str()
            .unwrap()
            .contains("plugd plugin approve vaultchan"),
        "{doctor}"
    );
    assert_eq!(code(10), Some(-32601));
    assert_eq!(
        res(11),
        json!({"ok": true, "channel": "vault", "plugin": "vaultchan", "keys": ["token"], "applied": "not_running"})
    );
    assert_eq!(
        res(12)["credentials"],
        json!([{"channel": "vault", "instance": null, "plugin": "vaultchan", "keys": ["token"], "agent_ids": ["ana"]}]),
        "names only, never the secret"
    );
    assert!(!replies[12].to_string().contains("s3cret"));
    assert_eq!(
        code(13),
        Some(-32602),
        "only secret settings are credentials"
    );
    assert!(
        msg(13).contains("\"level\" is not a secret setting"),
        "{}",
        msg(13)
    );
    assert_eq!(code(14), Some(-32602));
    assert!(msg(14).contains("one instance per channel"), "{}", msg(14));
    assert_eq!(code(15), Some(-32602));
    assert!(
        msg(15).contains("unknown channel \"sms\" (channels here: vault)"),
        "{}",
        msg(15)
    );
    assert_eq!(
        res(16),
        json!({"ok": true, "channel": "vault", "plugin": "vaultchan", "removed": ["token"]})
    );
    assert_eq!(res(17)["credentials"][0]["keys"], json!([]));
    assert_eq!(code(18), Some(-32602));
    assert!(msg(18).contains("params must be an object"), "{}", msg(18));
    assert_eq!(code(19), Some(-32602));
    assert!(msg(19).contains("limited to 65536 bytes"), "{}", msg(19));
    assert_eq!(code(20), Some(-32601));
    for (i, reply) in replies.iter().enumerate() {
        assert_ne!(
            code(i),
            Some(-32603),
            "no granted method is 'not implemented': {reply}"
        );
    }

    // The secret reached the store sealed, then left it.
    let o = ws.plugd(&["plugin", "config", "vaultchan", "get", "token", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(got["source"], "unset", "{got}");

    // Without the capability: -32000 naming it, nothing read or changed.
    let replies = admin_calls(
        &ws,
        &key,
        "nosy_outbound",
        json!([
            r("nexo/admin/agents/list", json!({})),
            r(
                "nexo/admin/credentials/register",
                json!({"channel": "vault", "payload": {"token": "evil"}})
            ),
        ]),
    );
    assert_eq!(replies[0]["error"]["code"], -32000, "{replies:#?}");
    assert_eq!(
        replies[0]["error"]["data"],
        json!({"capability": "agents_crud", "method": "nexo/admin/agents/list"})
    );
    assert!(replies[0].get("result").is_none());
    assert_eq!(replies[1]["error"]["code"], -32000);
    let o = ws.plugd(&["plugin", "config", "vaultchan", "get", "token", "--json"]);
    let got: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(got["source"], "unset", "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_registered_in_initialize_are_dispatched_and_a_deny_blocks_the_turn() {
    use plugd_agent::agent::{Agent, TurnStatus};
    use plugd_runtime::config::PlugdConfig;
    use plugd_runtime::hooks::{HookContext, HookPoint};
    let ws = Ws::new();
    apps(
        &ws,
        &[
            (
                "guard",
                "config: {hooks: [before_llm_request, not_a_point], deny_word: forbidden}",
            ),
            // Registers nothing: never asked.
            ("quiet", ""),
        ],
    );
    std::fs::write(ws.dir().join("script.yaml"), "steps:\n  - text: fine\n").unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm: {provider: scripted, script: \"${{workspace_dir}}/script.yaml\"}\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("guard", "test").await.unwrap();
    rt.approve("quiet", "test").await.unwrap();
    // Approval starts nothing for good: the pipeline start launches them.
    rt.shutdown().await;
    drop(rt);
    let rt = ws.runtime(quick(10_000)).await;
    let config = PlugdConfig::load(ws.dir()).unwrap();
    let agent = Agent::from_config(&rt, &config).await.unwrap();
    assert_eq!(
        agent.pipeline().chain(HookPoint::BeforeLlmRequest),
        ["microapp:guard:before_llm_request"]
    );
    for p in HookPoint::ALL
        .into_iter()
        .filter(|p| *p != HookPoint::BeforeLlmRequest)
    {
        assert!(agent.pipeline().chain(p).is_empty(), "{p}");
    }
    let ctx = HookContext::default();
    let out = agent.turn("s-ok", "hello", &ctx, None).await.unwrap();
    assert_eq!(out.status, TurnStatus::Completed, "{out:?}");
    assert_eq!(out.reply.as_deref(), Some("fine"));
    let out = agent
        .turn("s-no", "a forbidden word", &ctx, None)
        .await
        .unwrap();
    assert_eq!(out.status, TurnStatus::Blocked, "{out:?}");
    assert_eq!(out.blocked_at, Some(HookPoint::BeforeLlmRequest));
    assert_eq!(
        out.message.as_deref(),
        Some("before_llm_request: forbidden is not allowed")
    );
    let asked: Vec<Value> = jsonl(&ws, "guard", "requests.jsonl")
        .into_iter()
        .filter(|r| r["method"] != "shutdown")
        .collect();
    assert_eq!(
        asked,
        [
            json!({"method": "hooks/before_llm_request"}),
            json!({"method": "hooks/before_llm_request"})
        ]
    );
    assert!(
        jsonl(&ws, "quiet", "requests.jsonl")
            .iter()
            .all(|r| r["method"] == "shutdown"),
        "a microapp that registered nothing is never asked"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_hooks_registration_fails_the_handshake_naming_the_field() {
    let ws = Ws::new();
    apps(&ws, &[("liar", "config: {hooks: before_message}")]);
    let rt = ws.runtime(quick(10_000)).await;
    let err = rt.approve("liar", "test").await.unwrap_err().to_string();
    assert!(
        err.contains("\"hooks\" must be a list of hook names"),
        "{err}"
    );
}

#[test]
fn a_cli_turn_sends_the_binding_of_its_context_and_no_inbound() {
    let ws = Ws::new();
    apps(&ws, &[("rec", "capabilities: [transcripts_subscribe]")]);
    let o = ws.plugd(&["plugin", "approve", "rec"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(
        ws.dir().join("script.yaml"),
        "steps:\n  - tool_calls:\n      - {name: rec_context, arguments: {}}\n  - text: ok\n",
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm: {provider: scripted, script: \"${{workspace_dir}}/script.yaml\"}\ntenant: {tenant_id: acme}\n",
    )
    .unwrap();
    let o = ws.plugd(&[
        "run",
        "hi",
        "--json",
        "--context",
        r#"{"agent_id": "cli-agent", "channel": "sms", "account_id": ""}"#,
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let calls = jsonl(&ws, "rec", "calls.jsonl");
    assert_eq!(calls.len(), 1, "{calls:?}");
    // A channel the context names but plugd does not serve: no index; an
    // empty account is no account (the tenant is used).
    assert_eq!(
        calls[0]["binding_context"],
        json!({"agent_id": "cli-agent", "channel": "sms", "account_id": "acme",
               "binding_id": "sms:acme", "binding_index": null})
    );
    assert!(calls[0].get("inbound").is_none(), "{}", calls[0]);
    // The turn's transcript reached the microapp before the CLI exited.
    let notes = jsonl(&ws, "rec", "notifications.jsonl");
    let bodies: Vec<&str> = notes
        .iter()
        .filter(|n| n["method"] == "nexo/notify/transcript_appended")
        .map(|n| n["params"]["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies.first(), Some(&"hi"), "{notes:#?}");
    assert_eq!(bodies.last(), Some(&"ok"), "{notes:#?}");
}
