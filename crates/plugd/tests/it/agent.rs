//! The agent turn through real processes: `plugd run` and `plugd chat` with
//! the scripted provider (a deterministic replay file, not a model) or the
//! Python LLM plugin, calling real plugins of two dialects (the native
//! `misbehave.py`, the MCP server `mcp_guard.py` that logs every call), with
//! hooks served by a native Python plugin, a Dexto module
//! (`tests/plugins/agent/arg-tagger.mjs`) and the built-ins, and the outbox
//! read back through `plugd outbox list --json`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::{Value, json};

use plugd_agent::agent::{Agent, AgentError, TurnEvent, TurnStatus};
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::hooks::HookContext;

use crate::support::{Ws, plugd_cmd, quick, repo, stderr, stdout};

/// `tk`: the native misbehave plugin (`tk_echo`, `tk_pid`, …) and `guard`:
/// the MCP server whose calls are logged to the returned file. Both approved.
fn two_dialects(ws: &Ws) -> PathBuf {
    ws.misbehave("tk", "good", None, "");
    let log = ws.dir().join("mcp.log");
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&log, "").unwrap();
    let servers = json!({"mcpServers": {"guard": {"command": "python3",
        "args": [repo().join("tests/plugins/hooks/mcp_guard.py"), &log]}}});
    std::fs::write(ws.dir().join(".mcp.json"), servers.to_string()).unwrap();
    approve(ws, "tk");
    approve(ws, "guard");
    log
}

fn approve(ws: &Ws, id: &str) {
    let out = ws.plugd(&["plugin", "approve", id]);
    assert!(out.status.success(), "approve {id}: {}", stderr(&out));
}

/// Writes the script and a plugd.yaml using it, with `extra` YAML appended.
fn scripted(ws: &Ws, steps: Value, extra: &str) {
    std::fs::create_dir_all(ws.dir().join("scripts")).unwrap();
    std::fs::write(
        ws.dir().join("scripts/test.yaml"),
        json!({"steps": steps}).to_string(),
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            "llm:\n  provider: scripted\n  script: \"${{{{workspace_dir}}}}/scripts/test.yaml\"\n{extra}"
        ),
    )
    .unwrap();
}

fn mcp_calls(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `plugd run --json PROMPT [more args]`: the outcome, and the raw output.
fn run_json(ws: &Ws, prompt: &str, more: &[&str]) -> (Value, Output) {
    let mut args = vec!["run", "--json", prompt];
    args.extend(more);
    let out = ws.plugd(&args);
    let text = stdout(&out);
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "run --json printed no JSON ({e}): {text}\nstderr: {}",
            stderr(&out)
        )
    });
    (v, out)
}

/// The guard server's tool `chatty` as registered (`guard/chatty`) is offered
/// to the model as `guard_chatty`.
const CHATTY_FOR_MODEL: &str = "guard_chatty";

#[test]
fn a_whole_turn_calls_a_native_and_an_mcp_tool_and_records_the_events() {
    let ws = Ws::new();
    let log = two_dialects(&ws);
    vai_recorder(&ws);
    scripted(
        &ws,
        json!([
            {"expect_user_contains": "both", "tool_calls": [
                {"name": "tk_echo", "arguments": {"x": 1}, "id": "c1"},
                {"name": CHATTY_FOR_MODEL, "arguments": {"point": "p", "payload": {"q": 2}}, "id": "c2"}
            ]},
            {"text": "Both tools answered."}
        ]),
        "",
    );
    let (v, out) = run_json(&ws, "call both tools", &["--session", "t1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["status"], "completed");
    assert_eq!(v["session_id"], "t1");
    assert_eq!(v["reply"], "Both tools answered.");
    assert_eq!(v["rounds"], 2);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{v}");
    assert_eq!(calls[0]["tool"], "tk_echo");
    assert_eq!(calls[0]["ok"], true);
    assert_eq!(calls[0]["result"], json!({"echo": {"x": 1}}));
    // The registry name comes back from the provider-safe one.
    assert_eq!(calls[1]["tool"], "guard/chatty");
    assert_eq!(calls[1]["ok"], true, "{v}");
    let seen = mcp_calls(&log);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["tool"], "chatty");
    assert_eq!(seen[0]["arguments"]["payload"], json!({"q": 2}));

    // Outbox: session.created, tool.completed twice, run.completed.
    let out = ws.plugd(&["outbox", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<Value> = serde_json::from_str(&stdout(&out)).unwrap();
    let mut types: Vec<&str> = rows
        .iter()
        .map(|r| r["event_type"].as_str().unwrap())
        .collect();
    types.sort_unstable();
    assert_eq!(
        types,
        [
            "run.completed",
            "session.created",
            "tool.completed",
            "tool.completed"
        ],
        "{rows:?}"
    );
}

/// A VAI package subscribing one hook export to the agent's events (never
/// started here: `plugd run` records deliveries; `plugd serve` would deliver).
fn vai_recorder(ws: &Ws) {
    let dir = ws.plugin_dir("recorder");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/outbox/outbox_plugin.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    let records = ws.dir().join("records.jsonl");
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&records, "").unwrap();
    let entry = json!(["python3", "plugin.py", "ack", records.display().to_string()]);
    std::fs::write(
        dir.join("vai-plugin.toml"),
        format!(
            "api_version = \"vai.plugin.v1\"\npackage_id = \"test/recorder\"\nversion = \"0.1.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = {entry}\n\n[[exports]]\nid = \"all\"\nkind = \"hook\"\n[exports.hook]\nsubscribes_to = [\"run.completed\", \"tool.completed\", \"session.created\"]\n"
        ),
    )
    .unwrap();
}

#[test]
fn a_blocking_hook_denies_the_tool_which_is_never_called() {
    let ws = Ws::new();
    let log = two_dialects(&ws);
    // A native hook plugin that blocks guard/chatty before the call.
    let dir = ws.plugin_dir("deny");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/hooks/hook_plugin.py"),
        dir.join("hook_plugin.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("hooks.json"),
        json!({"before_tool_call": {"block_tools": ["guard/chatty"], "reason": "chatty is not allowed"}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"deny\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"hook_plugin.py\"]\n\n[plugin.extends]\nhooks = [\"before_tool_call\"]\n",
    )
    .unwrap();
    approve(&ws, "deny");
    scripted(
        &ws,
        json!([
            {"tool_calls": [{"name": CHATTY_FOR_MODEL, "arguments": {"point": "p", "payload": {}}}]},
            {"text": "never reached"}
        ]),
        "plugins:\n  custom:\n    - {name: deny, plugin: deny, hook: before_tool_call, priority: 10, blocking: true}\n",
    );
    // Plain: exit 3, the message on stderr, nothing on stdout.
    let out = ws.plugd(&["run", "use chatty", "--session", "b1"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("plugd: blocked at before_tool_call: chatty is not allowed"),
        "{err}"
    );
    // JSON: the outcome printed, still exit 3.
    let (v, out) = run_json(&ws, "use chatty", &["--session", "b2"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(v["status"], "blocked");
    assert_eq!(v["blocked_at"], "before_tool_call");
    assert_eq!(v["message"], "chatty is not allowed");
    assert_eq!(v["reply"], Value::Null);
    assert!(v["tool_calls"].as_array().unwrap().is_empty());
    assert!(mcp_calls(&log).is_empty(), "the tool was called");
}

/// `after_tool_result` can rewrite what the model sees of a tool's result, or
/// block the turn before the result reaches the model.
#[test]
fn after_tool_result_rewrites_or_blocks_what_the_model_sees() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    approve(&ws, "tk");
    let module = repo().join("tests/plugins/agent/result-guard.mjs");
    let guard = format!(
        "plugins:\n  custom:\n    - {{name: result-guard, module: \"{}\", priority: 10, blocking: true}}\n",
        module.display()
    );
    scripted(
        &ws,
        json!([
            {"tool_calls": [{"name": "tk_echo", "arguments": {"token": "secret-123"}}]},
            {"text": "done"}
        ]),
        &guard,
    );
    let (v, out) = run_json(&ws, "fetch the token", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let call = &v["tool_calls"][0];
    assert_eq!(
        call["args"],
        json!({"token": "secret-123"}),
        "the tool got the real args: {v}"
    );
    assert_eq!(
        call["result"],
        json!({"redacted": true}),
        "the model saw the rewrite: {v}"
    );
    assert!(v["notices"].to_string().contains("RESULT_REDACTED"), "{v}");

    scripted(
        &ws,
        json!([
            {"tool_calls": [{"name": "tk_echo", "arguments": {"block": true}}]},
            {"text": "never reached"}
        ]),
        &guard,
    );
    let (v, out) = run_json(&ws, "try the blocked one", &[]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "a blocked turn exits 3: {}",
        stderr(&out)
    );
    assert_eq!(v["status"], "blocked", "{v}");
    assert_eq!(v["blocked_at"], "after_tool_result", "{v}");
    assert_eq!(v["reply"], Value::Null, "{v}");
    assert!(v["notices"].to_string().contains("RESULT_BLOCKED"), "{v}");
}

#[test]
fn modifying_hooks_run_in_priority_order_and_the_tool_gets_their_args() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    approve(&ws, "tk");
    let module = repo().join("tests/plugins/agent/arg-tagger.mjs");
    let module = module.display();
    scripted(
        &ws,
        json!([
            {"tool_calls": [{"name": "tk_echo", "arguments": {"trail": ">"}}]},
            {"text": "tagged"}
        ]),
        &format!(
            "plugins:\n  custom:\n    - {{name: tag-a, module: \"{module}\", priority: 30, config: {{tag: A}}}}\n    - {{name: tag-b, module: \"{module}\", priority: 20, config: {{tag: B}}}}\n    - {{name: tag-c, module: \"{module}\", priority: 40, config: {{tag: C}}}}\n"
        ),
    );
    let (v, out) = run_json(&ws, "tag it", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let call = &v["tool_calls"][0];
    assert_eq!(call["args"], json!({"trail": ">BAC"}), "{v}");
    assert_eq!(call["result"], json!({"echo": {"trail": ">BAC"}}));
    let codes: Vec<&str> = v["notices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["code"].as_str())
        // The risk gate's notice of the (default medium) tool call.
        .filter(|c| *c != "MEDIUM_RISK_TOOL")
        .collect();
    assert_eq!(codes, ["TAGGED_B", "TAGGED_A", "TAGGED_C"]);
    // A generated session id was used and reported.
    let id = v["session_id"].as_str().unwrap();
    assert!(id.starts_with("s_"), "{id}");
    assert!(stderr(&out).contains(&format!("plugd: session {id}")));
}

#[test]
fn a_blocking_hook_that_times_out_blocks_the_turn() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    approve(&ws, "tk");
    let dir = ws.plugin_dir("slow");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/hooks/hook_plugin.py"),
        dir.join("hook_plugin.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("hooks.json"),
        json!({"before_tool_call": {"sleep_ms": 5000}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"slow\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"hook_plugin.py\"]\n\n[plugin.extends]\nhooks = [\"before_tool_call\"]\n",
    )
    .unwrap();
    approve(&ws, "slow");
    scripted(
        &ws,
        json!([
            {"tool_calls": [{"name": "tk_pid", "arguments": {}}]},
            {"text": "never"}
        ]),
        // A native hook fails closed only when the operator says so (nexo §5.z).
        "plugins:\n  custom:\n    - {name: slow, plugin: slow, hook: before_tool_call, priority: 10, blocking: true, timeout_ms: 300, on_error: block}\n",
    );
    let (v, out) = run_json(&ws, "go", &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(v["status"], "blocked");
    assert_eq!(v["blocked_at"], "before_tool_call");
    assert!(
        v["message"].as_str().unwrap().contains("slow"),
        "the message names the handler: {v}"
    );
    assert!(v["tool_calls"].as_array().unwrap().is_empty());
}

#[test]
fn built_ins_redact_what_the_model_gets_and_truncate_the_reply() {
    let ws = Ws::new();
    let long = "word ".repeat(40);
    scripted(
        &ws,
        json!([
            // The scripted provider fails the call unless the model got the redacted text.
            {"expect_user_contains": "mail [EMAIL] please", "text": long},
        ]),
        "plugins:\n  contentPolicy: {priority: 10, redactEmails: true}\n  responseSanitizer: {priority: 900, maxResponseLength: 30}\n",
    );
    let (v, out) = run_json(&ws, "mail ada@example.com please", &["--session", "r1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.starts_with("word word"), "{reply}");
    assert!(reply.len() < long.len(), "not truncated: {reply}");
    let codes: Vec<&str> = v["notices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["code"].as_str())
        .collect();
    assert_eq!(codes, ["EMAIL_REDACTED", "RESPONSE_TRUNCATED"], "{v}");
    // The stored transcript holds the redacted text, never the address.
    // Neither do the outbox events: nothing under .plugd, and nothing in the
    // state store (SQLite or the cluster's database), holds the address.
    assert!(
        !String::from_utf8_lossy(&ws.state_bytes()).contains("ada@example.com"),
        "the state store holds the unredacted address"
    );
    for f in std::fs::read_dir(ws.dir().join(".plugd"))
        .into_iter()
        .flatten()
    {
        let path = f.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !String::from_utf8_lossy(&bytes).contains("ada@example.com"),
                "{} holds the unredacted address",
                path.display()
            );
        }
    }
}

#[test]
fn the_transcript_survives_a_new_process_and_too_many_rounds_is_an_error() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    approve(&ws, "tk");
    scripted(
        &ws,
        json!([
            {"expect_user_contains": "first", "text": "one"},
            {"expect_user_contains": "second", "text": "two"},
            {"tool_calls": [{"name": "tk_pid", "arguments": {}}]},
            {"tool_calls": [{"name": "tk_pid", "arguments": {}}]},
            {"tool_calls": [{"name": "tk_pid", "arguments": {}}]}
        ]),
        "agent:\n  max_tool_rounds: 2\n",
    );
    let out = ws.plugd(&["run", "first", "--session", "keep.me-1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "one\n");
    // A second process answers with step 2: it read the stored transcript.
    let out = ws.plugd(&["run", "second", "--session", "keep.me-1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "two\n");
    // Round three onwards calls tools forever; the limit is 2.
    let out = ws.plugd(&["run", "loop", "--session", "keep.me-1"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("more than 2 rounds of tool calls"),
        "{}",
        stderr(&out)
    );
    // A bad session id is refused with the rule.
    let out = ws.plugd(&["run", "x", "--session", "no/slash"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("invalid session id"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn chat_streams_a_plugin_providers_deltas_from_piped_stdin() {
    let ws = Ws::new();
    let dir = ws.plugin_dir("llmplug");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/llm/llm_plugin.py"),
        dir.join("llm_plugin.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"llmplug\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"llm_plugin.py\"]\n\n[plugin.extends]\nllm_providers = [\"echo_llm\"]\n",
    )
    .unwrap();
    approve(&ws, "llmplug");
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm: {provider: plugin, plugin: llmplug, name: echo_llm, model: m1}\nplugins:\n  contentPolicy: {priority: 10, redactEmails: true}\n",
    )
    .unwrap();
    let mut child = plugd_cmd(ws.dir())
        .args(["chat", "--session", "c1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello there\nwrite to bob@example.com\n/exit\nnot sent\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "echo[echo_llm/m1]: hello there",
            "echo[echo_llm/m1]: write to [EMAIL]"
        ],
        "{text}\nstderr: {}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("[notice before_llm_request] EMAIL_REDACTED"),
        "{err}"
    );
}

/// A workspace whose LLM is the streaming echo provider of
/// `tests/plugins/llm/llm_plugin.py`, approved, with `extra` appended to
/// plugd.yaml; the runtime spawns python3 from PATH (the venv's).
async fn echo_llm_agent(ws: &Ws, extra: &str) -> (plugd_runtime::Runtime, Agent) {
    let dir = ws.plugin_dir("llmplug");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/llm/llm_plugin.py"),
        dir.join("llm_plugin.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"llmplug\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"llm_plugin.py\"]\n\n[plugin.extends]\nllm_providers = [\"echo_llm\"]\n",
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!("llm: {{provider: plugin, plugin: llmplug, name: echo_llm, model: m1}}\n{extra}"),
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("llmplug", "test").await.unwrap();
    let config = PlugdConfig::load(ws.dir()).unwrap();
    let agent = Agent::from_config(&rt, &config).await.unwrap();
    (rt, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_events_stream_deltas_then_done_and_the_session_is_readable() {
    let ws = Ws::new();
    let (rt, agent) = echo_llm_agent(&ws, "").await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let outcome = agent
        .turn(
            "st-1",
            "one two three four",
            &HookContext::default(),
            Some(tx),
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, TurnStatus::Completed);
    assert_eq!(
        outcome.reply.as_deref(),
        Some("echo[echo_llm/m1]: one two three four")
    );
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::Delta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(deltas.len() > 1, "streamed in pieces: {deltas:?}");
    assert_eq!(deltas.concat(), "echo[echo_llm/m1]: one two three four");
    assert!(matches!(events.last(), Some(TurnEvent::Done { outcome: o }) if **o == outcome));

    let session = agent.session("st-1").await.unwrap().unwrap();
    let roles: Vec<&str> = session.transcript.iter().map(|e| e.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant"]);
    assert!(agent.session("unknown").await.unwrap().is_none());
    assert!(matches!(
        agent.session("bad id").await,
        Err(AgentError::BadSession(_))
    ));
    rt.shutdown().await;
}

#[test]
fn a_failing_or_unknown_tool_is_a_result_the_model_sees_not_a_crash() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    approve(&ws, "tk");
    scripted(
        &ws,
        json!([
            {"tool_calls": [
                {"name": "tk_fail", "arguments": {"code": -32000, "message": "disk on fire"}},
                {"name": "no_such_tool", "arguments": {}}
            ]},
            {"text": "I could not do it."}
        ]),
        "",
    );
    let (v, out) = run_json(&ws, "try", &["--session", "f1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["status"], "completed");
    assert_eq!(v["reply"], "I could not do it.");
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["ok"], false);
    assert!(
        calls[0]["result"]
            .as_str()
            .unwrap()
            .contains("disk on fire"),
        "{v}"
    );
    assert_eq!(calls[1]["ok"], false);
    assert!(
        calls[1]["result"]
            .as_str()
            .unwrap()
            .contains("no_such_tool"),
        "{v}"
    );
}

/// Regression: streamed text used to reach the caller before
/// `before_response` ran, so a response sanitizer could be bypassed over
/// `plugd chat` or SSE. With handlers on that point the reply is held back
/// and sent once, sanitized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_never_bypasses_the_response_sanitizer() {
    let ws = Ws::new();
    let (rt, agent) = echo_llm_agent(
        &ws,
        "plugins:\n  responseSanitizer: {priority: 900, redactEmails: true}\n",
    )
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The echo provider repeats the input, email address included.
    let outcome = agent
        .turn(
            "st-2",
            "write to bob@example.com",
            &HookContext::default(),
            Some(tx),
        )
        .await
        .unwrap();
    let reply = outcome.reply.clone().unwrap();
    assert!(
        reply.contains("[EMAIL]") && !reply.contains("bob@example.com"),
        "{reply}"
    );
    let mut deltas = String::new();
    while let Some(e) = rx.recv().await {
        if let TurnEvent::Delta { text } = e {
            deltas.push_str(&text);
        }
    }
    assert!(
        !deltas.contains("bob@example.com"),
        "raw text leaked: {deltas:?}"
    );
    assert_eq!(
        deltas, reply,
        "the caller still gets the whole (sanitized) reply"
    );
    rt.shutdown().await;
}
