//! Hooks: the built-ins and plugin-served handlers of `plugd.yaml`, driven
//! through `plugd hook run` (and the runtime for restarts). Real children: a
//! native Python plugin serving `hook.on_hook`
//! (`tests/plugins/hooks/hook_plugin.py`), the test microapp voting on
//! `hooks/<name>`, and an MCP server whose tools are bound as hooks
//! (`tests/plugins/hooks/mcp_guard.py`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plugd_agent::hooks::build::build_pipeline;
use plugd_runtime::config::{PlugdConfig, schema_violations};
use plugd_runtime::hooks::{HookContext, HookPoint};
use serde_json::{Value, json};

use crate::support::{Ws, plugd_cmd, quick, repo, stderr, stdout};

/// Writes `plugd.yaml`; every configuration a test expects to load must also
/// satisfy `docs/plugd.schema.json`.
fn config(ws: &Ws, yaml: &str) {
    std::fs::write(ws.dir().join("plugd.yaml"), yaml).unwrap();
}

fn valid_config(ws: &Ws, yaml: &str) {
    let violations = schema_violations(yaml).unwrap();
    assert!(violations.is_empty(), "schema: {violations:?}\n{yaml}");
    config(ws, yaml);
}

/// A native plugin `id` running hook_plugin.py, declaring `hooks`, with
/// `rules` as its hooks.json (plus a log file, returned).
fn native(ws: &Ws, id: &str, hooks: &[&str], rules: Value) -> PathBuf {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/hooks/hook_plugin.py"),
        dir.join("hook_plugin.py"),
    )
    .unwrap();
    let log = ws.dir().join(format!("{id}.log"));
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&log, "").unwrap();
    let mut rules = rules;
    rules["log"] = json!(log);
    std::fs::write(dir.join("hooks.json"), rules.to_string()).unwrap();
    let hooks: Vec<String> = hooks.iter().map(|h| format!("{h:?}")).collect();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"hook_plugin.py\"]\n\n[plugin.extends]\nhooks = [{}]\n",
            hooks.join(", ")
        ),
    )
    .unwrap();
    log
}

/// `.mcp.json` with the guard server `guard` (its calls logged to the returned file).
fn mcp_guard(ws: &Ws) -> PathBuf {
    let log = ws.dir().join("mcp.log");
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&log, "").unwrap();
    let servers = json!({"mcpServers": {"guard": {"command": "python3",
        "args": [repo().join("tests/plugins/hooks/mcp_guard.py"), log]}}});
    std::fs::write(ws.dir().join(".mcp.json"), servers.to_string()).unwrap();
    log
}

fn approve(ws: &Ws, id: &str) {
    let out = ws.plugd(&["plugin", "approve", id]);
    assert!(out.status.success(), "approve {id}: {}", stderr(&out));
}

fn lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `plugd hook run POINT --payload PAYLOAD [--context CTX]`: exit 0 and the JSON outcome.
fn hook_run(ws: &Ws, point: &str, payload: Value, context: Option<Value>) -> Value {
    let payload = payload.to_string();
    let mut args = vec!["hook", "run", point, "--payload", &payload];
    let context = context.map(|c| c.to_string());
    if let Some(c) = &context {
        args.extend(["--context", c]);
    }
    let out = ws.plugd(&args);
    assert!(
        out.status.success(),
        "plugd hook run {point}: {}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "one JSON line: {text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    for k in ["outcome", "payload", "message", "notices"] {
        assert!(v.get(k).is_some(), "{k} missing in {v}");
    }
    v
}

/// `plugd hook run` that must fail: exit 1 and its one stderr line.
fn hook_run_fails(ws: &Ws, point: &str, payload: &str) -> String {
    let out = ws.plugd(&["hook", "run", point, "--payload", payload]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    let err = err.trim();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("plugd: error: "), "{err}");
    err.to_owned()
}

/// Like [`hook_run_fails`] when the plugin's own failure is also logged
/// (the supervisor warns before the error): the one error line.
fn hook_run_fails_logged(ws: &Ws, point: &str, payload: &str) -> String {
    let out = ws.plugd(&["hook", "run", point, "--payload", payload]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("plugd: error: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {err}");
    errors[0].to_owned()
}

fn codes(v: &Value) -> Vec<(String, String)> {
    v["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["handler"].as_str().unwrap_or("-").to_owned(),
                n["code"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

fn pair(h: &str, c: &str) -> (String, String) {
    (h.to_owned(), c.to_owned())
}

#[test]
fn builtins_block_redact_and_truncate_through_the_cli() {
    let ws = Ws::new();
    valid_config(
        &ws,
        "plugins:\n  contentPolicy: {priority: 10, maxInputChars: 100, redactEmails: true, redactApiKeys: true}\n  responseSanitizer: {priority: 900, redactEmails: true, redactApiKeys: true, maxResponseLength: 40}\n",
    );
    let long = "x".repeat(101);
    let v = hook_run(
        &ws,
        "before_llm_request",
        json!({"text": long, "sessionId": "s1"}),
        None,
    );
    assert_eq!(v["outcome"], "blocked");
    assert_eq!(v["message"], "Input exceeds 100 character limit");
    assert_eq!(v["notices"][0]["message"], "Input length: 101, limit: 100");
    assert_eq!(codes(&v), [pair("content_policy", "INPUT_TOO_LONG")]);
    assert_eq!(v["notices"][0]["kind"], "block");

    let v = hook_run(
        &ws,
        "before_llm_request",
        json!({"text": "ana@example.com, key AKIAIOSFODNN7EXAMPLE, ghp_abcdefghijklmnopqrstuvwxyz0123456789", "sessionId": "s1"}),
        None,
    );
    assert_eq!(v["outcome"], "continue");
    assert_eq!(v["message"], Value::Null);
    assert_eq!(
        v["payload"],
        json!({"text": "[EMAIL], key [REDACTED], [REDACTED]", "sessionId": "s1"})
    );
    assert_eq!(
        codes(&v),
        [
            pair("content_policy", "EMAIL_REDACTED"),
            pair("content_policy", "API_KEY_REDACTED")
        ]
    );
    assert_eq!(
        v["notices"][1]["message"],
        "Potential API keys redacted from input"
    );

    let v = hook_run(
        &ws,
        "before_response",
        json!({"content": "reach me at bo@example.org, Bearer abcdefghijklmnopqrstuvwxyz123 ok", "provider": "scripted"}),
        None,
    );
    assert_eq!(v["outcome"], "continue");
    assert_eq!(
        v["payload"]["content"],
        "reach me at [EMAIL], Bearer [REDACTED] o\n[Response truncated]"
    );
    assert_eq!(v["payload"]["provider"], "scripted");
    assert_eq!(
        codes(&v),
        // As in the seed, the sanitizer's redactions add no notice.
        [pair("response_sanitizer", "RESPONSE_TRUNCATED")]
    );
    // A point without handlers lets the payload through unchanged.
    let v = hook_run(
        &ws,
        "before_tool_call",
        json!({"toolName": "t", "args": {}}),
        None,
    );
    assert_eq!(v["outcome"], "continue");
    assert_eq!(v["payload"], json!({"toolName": "t", "args": {}}));
    assert_eq!(v["notices"], json!([]));
}

#[test]
fn the_example_workspace_config_runs_its_builtins() {
    let ws = Ws::new();
    let text = std::fs::read_to_string(repo().join("examples/workspace/plugd.yaml")).unwrap();
    // The example's Dexto module (tenant-auth) comes along.
    std::fs::create_dir_all(ws.dir().join("plugins")).unwrap();
    std::fs::copy(
        repo().join("examples/workspace/plugins/tenant-auth.js"),
        ws.dir().join("plugins/tenant-auth.js"),
    )
    .unwrap();
    valid_config(&ws, &text);
    let v = hook_run(
        &ws,
        "before_llm_request",
        json!({"text": "sk-abcdefghijklmnopqrstuvwxyz"}),
        None,
    );
    assert_eq!(v["payload"]["text"], "[REDACTED]");
    let v = hook_run(
        &ws,
        "before_llm_request",
        json!({"text": "hi"}),
        Some(json!({"tenant_id": "globex"})),
    );
    assert_eq!(v["outcome"], "blocked", "{v}");
    assert_eq!(v["notices"][0]["code"], "QUOTA_EXCEEDED", "{v}");
}

#[test]
fn a_native_hook_denies_a_tool_and_lets_others_through() {
    let ws = Ws::new();
    let log = native(
        &ws,
        "compliance",
        &["tool_guard"],
        json!({"tool_guard": {"block_tools": ["shell_rm"], "reason": "shell_rm is not allowed for tenant acme"}}),
    );
    approve(&ws, "compliance");
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - name: tool-guard\n      plugin: compliance\n      hook: tool_guard\n      point: before_tool_call\n      priority: 20\n      blocking: true\n      on_error: block\n      timeout_ms: 5000\n",
    );
    let v = hook_run(
        &ws,
        "before_tool_call",
        json!({"toolName": "shell_rm", "args": {"path": "/"}}),
        Some(json!({"tenant_id": "acme"})),
    );
    assert_eq!(v["outcome"], "blocked");
    assert_eq!(v["message"], "shell_rm is not allowed for tenant acme");
    assert_eq!(codes(&v), [pair("tool-guard", "HOOK_BLOCKED")]);
    assert_eq!(
        v["notices"][0]["details"],
        json!({"plugin": "compliance", "hook": "tool_guard"})
    );

    let v = hook_run(
        &ws,
        "before_tool_call",
        json!({"toolName": "weather", "args": {"city": "Lima"}}),
        None,
    );
    assert_eq!(v["outcome"], "continue");
    assert_eq!(
        v["payload"],
        json!({"toolName": "weather", "args": {"city": "Lima"}})
    );

    // The plugin got exactly §5.z's params.
    let seen = lines(&log);
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0],
        json!({"plugin_id": "compliance", "hook_name": "tool_guard",
               "event": {"toolName": "shell_rm", "args": {"path": "/"}}})
    );
}

#[test]
fn a_native_hook_transforms_and_signals_no_reply() {
    let ws = Ws::new();
    native(
        &ws,
        "rewriter",
        &["before_message", "quiet", "unknown_to_it"],
        json!({
            "before_message": {"transform_suffix": " [checked]", "field": "body"},
            "quiet": {"no_reply_again": true},
        }),
    );
    approve(&ws, "rewriter");
    valid_config(
        &ws,
        r#"plugins:
  custom:
    - {name: rewrite, plugin: rewriter, hook: before_message, priority: 1}
    - {name: quiet, plugin: rewriter, hook: quiet, point: before_message, priority: 2}
    - {name: silent, plugin: rewriter, hook: unknown_to_it, point: before_message, priority: 3}
"#,
    );
    let v = hook_run(
        &ws,
        "before_message",
        json!({"sender": "alice", "body": "ping"}),
        None,
    );
    assert_eq!(v["outcome"], "continue");
    assert_eq!(
        v["payload"],
        json!({"sender": "alice", "body": "ping [checked]"})
    );
    // `-32601` from the plugin (a hook it does not serve) continues (§5.z),
    // with a warning naming the handler.
    assert_eq!(
        codes(&v),
        [
            pair("quiet", "DO_NOT_REPLY_AGAIN"),
            pair("silent", "HOOK_FAILED")
        ]
    );
    assert_eq!(v["notices"][1]["kind"], "warn");
}

#[test]
fn a_microapp_vote_deny_blocks_and_allow_passes() {
    let ws = Ws::new();
    let dir = ws.dir().join("extensions/mod-app");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/microapp/app.py"),
        dir.join("app.py"),
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("extensions.yaml"),
        "entries:\n  mod-app: {path: extensions/mod-app/app.py}\n",
    )
    .unwrap();
    approve(&ws, "mod-app");
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: moderation, plugin: mod-app, hook: before_send, point: before_message, priority: 5}\n",
    );
    let v = hook_run(&ws, "before_message", json!({"body": "hi"}), None);
    assert_eq!(v["outcome"], "blocked");
    assert_eq!(v["message"], "blocked by test");
    assert_eq!(codes(&v), [pair("moderation", "HOOK_BLOCKED")]);
    assert_eq!(
        v["notices"][0]["details"]["metadata"],
        json!({"event": {"body": "hi"}}),
        "the microapp got the payload as params"
    );
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: moderation, plugin: mod-app, hook: allow_all, point: before_message, priority: 5}\n    - {name: unsure, plugin: mod-app, hook: no_such_hook, point: before_message, priority: 6}\n    - {name: garbage, plugin: mod-app, hook: garbage, point: before_message, priority: 7, blocking: false}\n",
    );
    let v = hook_run(&ws, "before_message", json!({"body": "hi"}), None);
    assert_eq!(v["outcome"], "continue", "{v}");
    // allow and abstain pass; a malformed vote is an error, skipped here
    // because that handler is non-blocking.
    assert_eq!(codes(&v), [pair("garbage", "HOOK_FAILED")]);
    assert!(
        v["notices"][0]["message"]
            .as_str()
            .unwrap()
            .contains("malformed hook decision"),
        "{v}"
    );
}

#[test]
fn an_mcp_tool_bound_as_a_hook() {
    let ws = Ws::new();
    let log = mcp_guard(&ws);
    approve(&ws, "guard");
    valid_config(
        &ws,
        "tenant: {tenant_id: acme, agent_id: support}\nplugins:\n  custom:\n    - {name: words, plugin: guard, tool: guard, point: before_llm_request, priority: 5}\n    - {name: words-out, plugin: guard, tool: guard/structured, hook: before_response, priority: 6}\n",
    );
    let v = hook_run(
        &ws,
        "before_llm_request",
        json!({"text": "a forbidden plan"}),
        Some(json!({"user_id": "ana"})),
    );
    assert_eq!(v["outcome"], "blocked");
    assert_eq!(v["message"], "forbidden word");
    assert_eq!(codes(&v), [pair("words", "FORBIDDEN")]);
    let v = hook_run(&ws, "before_llm_request", json!({"text": "hello"}), None);
    assert_eq!(v["outcome"], "continue");
    assert_eq!(v["payload"]["text"], "hello [mcp]");
    assert_eq!(codes(&v), [pair("words", "MCP_SEEN")]);
    // structuredContent works the same way.
    let v = hook_run(&ws, "before_response", json!({"content": "bye"}), None);
    assert_eq!(v["payload"]["content"], "bye [mcp]");

    let seen = lines(&log);
    assert_eq!(seen[0]["tool"], "guard");
    assert_eq!(seen[0]["arguments"]["point"], "before_llm_request");
    assert_eq!(
        seen[0]["arguments"]["payload"],
        json!({"text": "a forbidden plan"})
    );
    let ctx = &seen[0]["arguments"]["context"];
    assert_eq!(
        (&ctx["tenant_id"], &ctx["agent_id"], &ctx["user_id"]),
        (&json!("acme"), &json!("support"), &json!("ana")),
        "plugd.yaml's tenant defaults plus --context"
    );

    // A tool-level failure and a reply that is not a verdict are handler
    // errors: blocking handlers fail closed.
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: broken, plugin: guard, tool: broken, point: before_llm_request, priority: 5}\n",
    );
    let v = hook_run(&ws, "before_llm_request", json!({"text": "hello"}), None);
    assert_eq!(v["outcome"], "blocked");
    assert_eq!(codes(&v), [pair("broken", "HOOK_FAILED")]);
    assert!(
        v["message"].as_str().unwrap().contains("guard broke"),
        "{v}"
    );
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: chatty, plugin: guard, tool: chatty, point: before_llm_request, priority: 5}\n",
    );
    let v = hook_run(&ws, "before_llm_request", json!({"text": "hello"}), None);
    assert_eq!(v["outcome"], "blocked");
    assert!(v["message"].as_str().unwrap().contains("not JSON"), "{v}");
}

#[test]
fn a_modifying_chain_runs_in_priority_order_across_plugins() {
    let ws = Ws::new();
    let native_log = native(
        &ws,
        "tagger",
        &["tag"],
        json!({"tag": {"append": " [native]", "field": "text"}}),
    );
    let mcp_log = mcp_guard(&ws);
    approve(&ws, "tagger");
    approve(&ws, "guard");
    // File order is not priority order.
    valid_config(
        &ws,
        r#"plugins:
  custom:
    - {name: mcp-last, plugin: guard, tool: guard, point: before_llm_request, priority: 30}
    - {name: native-second, plugin: tagger, hook: tag, point: before_llm_request, priority: 20}
  contentPolicy: {priority: 10, redactEmails: true}
"#,
    );
    let v = hook_run(
        &ws,
        "before_llm_request",
        json!({"text": "mail ana@example.com", "sessionId": "s"}),
        None,
    );
    assert_eq!(v["outcome"], "continue");
    assert_eq!(
        v["payload"],
        json!({"text": "mail [EMAIL] [native] [mcp]", "sessionId": "s"})
    );
    assert_eq!(
        codes(&v),
        [
            pair("content_policy", "EMAIL_REDACTED"),
            pair("mcp-last", "MCP_SEEN")
        ]
    );
    // Each handler saw the previous one's output.
    assert_eq!(lines(&native_log)[0]["event"]["text"], "mail [EMAIL]");
    assert_eq!(
        lines(&mcp_log)[0]["arguments"]["payload"]["text"],
        "mail [EMAIL] [native]"
    );
    let out = ws.plugd(&["hook", "check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("before_llm_request    content_policy -> native-second -> mcp-last"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_timing_out_blocking_hook_blocks_and_a_non_blocking_one_is_skipped() {
    let ws = Ws::new();
    native(&ws, "slow", &["slow"], json!({"slow": {"sleep_ms": 20000}}));
    approve(&ws, "slow");
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: slow-guard, plugin: slow, hook: slow, point: before_tool_call, priority: 1, timeout_ms: 300, on_error: block}\n",
    );
    let started = Instant::now();
    let v = hook_run(
        &ws,
        "before_tool_call",
        json!({"toolName": "t", "args": {}}),
        None,
    );
    assert_eq!(v["outcome"], "blocked");
    assert_eq!(codes(&v), [pair("slow-guard", "HOOK_TIMEOUT")]);
    assert!(
        v["message"].as_str().unwrap().contains("\"slow-guard\""),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the 20 s hook was not waited for"
    );

    native(
        &ws,
        "tagger",
        &["tag"],
        json!({"tag": {"append": " [after]", "field": "text"}}),
    );
    approve(&ws, "tagger");
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: slow-audit, plugin: slow, hook: slow, point: before_llm_request, priority: 1, timeout_ms: 300, blocking: false}\n    - {name: tag, plugin: tagger, hook: tag, point: before_llm_request, priority: 2}\n",
    );
    let v = hook_run(&ws, "before_llm_request", json!({"text": "go"}), None);
    assert_eq!(v["outcome"], "continue");
    assert_eq!(v["payload"]["text"], "go [after]", "the chain went on");
    assert_eq!(codes(&v), [pair("slow-audit", "HOOK_TIMEOUT")]);
    assert_eq!(v["notices"][0]["kind"], "warn");
}

#[test]
fn a_failing_native_hook_continues_unless_the_operator_marks_it_fail_closed() {
    // nexo §5.z: every hook.on_hook failure (crash, malformed reply, a
    // JSON-RPC error such as -32601, a timeout) continues; `on_error: block`
    // in plugd.yaml is the operator's fail-closed switch.
    let ws = Ws::new();
    native(
        &ws,
        "flaky",
        &["crash", "junk", "weird", "missing", "slow"],
        json!({"crash": {"crash": true}, "junk": {"reply": "yes"},
               "weird": {"reply": {"decision": "maybe"}},
               "missing": {"error": {"code": -32601, "message": "method not found: hook.on_hook"}},
               "slow": {"sleep_ms": 20000}}),
    );
    approve(&ws, "flaky");
    for hook in ["crash", "junk", "weird", "missing", "slow"] {
        let timeout = if hook == "slow" {
            ", timeout_ms: 300"
        } else {
            ""
        };
        valid_config(
            &ws,
            &format!(
                "plugins:\n  custom:\n    - {{name: h, plugin: flaky, hook: {hook}, point: before_message, priority: 1{timeout}}}\n"
            ),
        );
        let v = hook_run(&ws, "before_message", json!({"body": "x"}), None);
        assert_eq!(v["outcome"], "continue", "{hook}: {v}");
        assert_eq!(v["payload"]["body"], "x", "{hook}: {v}");
        assert_eq!(v["notices"][0]["kind"], "warn", "{hook}: {v}");
        valid_config(
            &ws,
            &format!(
                "plugins:\n  custom:\n    - {{name: h, plugin: flaky, hook: {hook}, point: before_message, priority: 1, on_error: block{timeout}}}\n"
            ),
        );
        let v = hook_run(&ws, "before_message", json!({"body": "x"}), None);
        assert_eq!(v["outcome"], "blocked", "{hook}: {v}");
        let code = if hook == "slow" {
            "HOOK_TIMEOUT"
        } else {
            "HOOK_FAILED"
        };
        assert_eq!(codes(&v), [pair("h", code)], "{hook}");
    }
}

#[test]
fn nexo_plugin_hook_timeout_ms_sets_a_native_hooks_deadline() {
    let ws = Ws::new();
    native(
        &ws,
        "sleepy",
        &["slow"],
        json!({"slow": {"sleep_ms": 20000}}),
    );
    approve(&ws, "sleepy");
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: s, plugin: sleepy, hook: slow, point: before_message, priority: 1, on_error: block}\n",
    );
    let started = Instant::now();
    let out = plugd_cmd(ws.dir())
        .env("NEXO_PLUGIN_HOOK_TIMEOUT_MS", "400")
        .args([
            "hook",
            "run",
            "before_message",
            "--payload",
            r#"{"body": "x"}"#,
        ])
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: {} {}", stdout(&out), stderr(&out)));
    assert_eq!(v["outcome"], "blocked", "{v}");
    assert_eq!(codes(&v), [pair("s", "HOOK_TIMEOUT")]);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the 5 s default was used: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_priority_clash_stops_start_up_naming_both() {
    let ws = Ws::new();
    valid_config(
        &ws,
        "plugins:\n  contentPolicy: {priority: 10}\n  custom:\n    - {name: off, plugin: ghost, hook: before_llm_request, priority: 10, enabled: false}\n    - {name: pii, plugin: ghost, hook: before_llm_request, priority: 10}\n",
    );
    let e = hook_run_fails(&ws, "before_llm_request", "{}");
    assert!(
        e.contains("contentPolicy") && e.contains("\"pii\"") && e.contains("priority 10"),
        "{e}"
    );
    assert!(!e.contains("\"off\""), "disabled entries are exempt: {e}");
}

#[test]
fn config_errors_name_the_key_line_and_fix() {
    let ws = Ws::new();
    config(
        &ws,
        "plugins:\n  custom:\n    - name: audit\n      priority: 1\n      module: /opt/a.js\n      blockng: true\n",
    );
    let e = hook_run_fails(&ws, "before_llm_request", "{}");
    assert!(e.contains("blockng") && e.contains("line 6"), "{e}");

    config(
        &ws,
        "plugins:\n  custom:\n    - name: audit\n      priority: 1\n      module: plugins/audit.js\n",
    );
    let e = hook_run_fails(&ws, "before_llm_request", "{}");
    assert!(
        e.contains("\"plugins/audit.js\" is a relative path")
            && e.contains("${{dexto.agent_dir}}/plugins/audit.js")
            && e.contains("line 5"),
        "{e}"
    );

    config(
        &ws,
        "plugins:\n  custom:\n    - {name: both, priority: 1, module: /opt/a.js, plugin: p, hook: before_message}\n",
    );
    let e = hook_run_fails(&ws, "before_llm_request", "{}");
    assert!(
        e.contains("both module and plugin are set") && e.contains("\"both\""),
        "{e}"
    );

    // Bad POINT and JSON are one-line errors too.
    config(&ws, "");
    let e = hook_run_fails(&ws, "beforeToolCall", "{}");
    assert!(e.contains("unknown hook point \"beforeToolCall\""), "{e}");
    let e = hook_run_fails(&ws, "before_tool_call", "{not json");
    assert!(e.contains("--payload is not valid JSON"), "{e}");
    let e = hook_run_fails(&ws, "before_tool_call", "[1]");
    assert!(e.contains("must be a JSON object"), "{e}");
}

#[test]
fn handlers_that_cannot_load_stop_start_up_naming_them() {
    let ws = Ws::new();
    let entry = |name: &str, rest: &str| {
        format!("plugins:\n  custom:\n    - {{name: {name}, priority: 1, {rest}}}\n")
    };
    valid_config(
        &ws,
        &entry("ghostly", "plugin: ghost, hook: before_message"),
    );
    let e = hook_run_fails(&ws, "before_message", "{}");
    assert!(
        e.contains("hook handler \"ghostly\" failed to initialize")
            && e.contains("no plugin \"ghost\""),
        "{e}"
    );

    native(&ws, "pending", &["h"], json!({"h": {"reply": {}}}));
    valid_config(
        &ws,
        &entry("waiting", "plugin: pending, hook: h, point: before_message"),
    );
    let e = hook_run_fails(&ws, "before_message", "{}");
    assert!(
        e.contains("\"waiting\"")
            && e.contains("unapproved")
            && e.contains("plugd plugin approve pending"),
        "{e}"
    );

    approve(&ws, "pending");
    valid_config(
        &ws,
        &entry("typo", "plugin: pending, hook: hh, point: before_message"),
    );
    let e = hook_run_fails(&ws, "before_message", "{}");
    assert!(
        e.contains("\"typo\"")
            && e.contains("does not declare hook \"hh\"")
            && e.contains("it declares: h"),
        "{e}"
    );

    // An MCP server has no hook method: it needs tool:.
    mcp_guard(&ws);
    approve(&ws, "guard");
    valid_config(&ws, &entry("nohook", "plugin: guard, hook: before_message"));
    let e = hook_run_fails(&ws, "before_message", "{}");
    assert!(
        e.contains("\"nohook\"")
            && e.contains("(dialect mcp) has no hook method")
            && e.contains("tool:"),
        "{e}"
    );
    valid_config(
        &ws,
        &entry("notool", "plugin: guard, tool: nope, point: before_message"),
    );
    let e = hook_run_fails(&ws, "before_message", "{}");
    assert!(
        e.contains("\"notool\"") && e.contains("no tool \"nope\"") && e.contains("guard/guard"),
        "{e}"
    );

    // A Dexto module that does not exist, and one that cannot load.
    valid_config(
        &ws,
        &entry(
            "tenant-auth",
            "module: \"${{dexto.agent_dir}}/plugins/missing.js\"",
        ),
    );
    let e = hook_run_fails(&ws, "before_message", "{}");
    assert!(
        e.contains("\"tenant-auth\" failed to initialize") && e.contains("missing.js"),
        "{e}"
    );
    std::fs::create_dir_all(ws.dir().join("plugins")).unwrap();
    std::fs::write(
        ws.dir().join("plugins/not-a-class.js"),
        "export default 42;\n",
    )
    .unwrap();
    valid_config(
        &ws,
        &entry(
            "tenant-auth",
            "module: \"${{dexto.agent_dir}}/plugins/not-a-class.js\"",
        ),
    );
    let e = hook_run_fails(&ws, "before_message", "{}");
    assert!(
        e.contains("hook handler \"tenant-auth\" failed to initialize"),
        "{e}"
    );
}

#[test]
fn a_plugin_whose_handshake_fails_stops_start_up() {
    // An MCP entry pins its declaration, not the script outside the
    // workspace, so the script can break after approval.
    let ws = Ws::new();
    let script = ws.dir().join("server.py");
    std::fs::copy(repo().join("tests/plugins/hooks/mcp_guard.py"), &script).unwrap();
    let servers = json!({"mcpServers": {"guard": {"command": "python3", "args": [script]}}});
    std::fs::write(ws.dir().join(".mcp.json"), servers.to_string()).unwrap();
    approve(&ws, "guard");
    std::fs::write(
        &script,
        "import sys\nsys.stderr.write('cannot start today\\n')\nsys.exit(3)\n",
    )
    .unwrap();
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: words, plugin: guard, tool: guard, point: before_message, priority: 1}\n",
    );
    let e = hook_run_fails_logged(&ws, "before_message", "{}");
    assert!(
        e.contains("hook handler \"words\" failed to initialize")
            && e.contains("plugin \"guard\" failed to start")
            && e.contains("cannot start today"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_handlers_survive_a_plugin_restart() {
    let ws = Ws::new();
    native(
        &ws,
        "compliance",
        &["tool_guard", "crash"],
        json!({"tool_guard": {"block_tools": ["shell_rm"], "reason": "no"}, "crash": {"crash": true}}),
    );
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("compliance", "test").await.unwrap();
    valid_config(
        &ws,
        "plugins:\n  custom:\n    - {name: guard, plugin: compliance, hook: tool_guard, point: before_tool_call, priority: 1}\n    - {name: crasher, plugin: compliance, hook: crash, point: before_message, priority: 2, on_error: block}\n",
    );
    let config = PlugdConfig::load(rt.dir()).unwrap();
    let pipeline = build_pipeline(&config, &rt).await.unwrap();
    let payload = json!({"toolName": "shell_rm", "args": {}});
    let ctx = HookContext::default();
    let pid = |rt: &plugd_runtime::Runtime| match rt.supervised("compliance").unwrap().status() {
        plugd_host::Status::Running { pid, .. } => Some(pid),
        _ => None,
    };
    assert!(
        pipeline
            .run(HookPoint::BeforeToolCall, payload.clone(), &ctx)
            .await
            .is_blocked()
    );
    let first = pid(&rt).unwrap();

    rt.restart("compliance").await.unwrap();
    let out = pipeline
        .run(HookPoint::BeforeToolCall, payload.clone(), &ctx)
        .await;
    assert!(out.is_blocked(), "after a restart: {out:?}");
    assert_eq!(out.message.as_deref(), Some("no"));
    let second = pid(&rt).unwrap();
    assert_ne!(first, second, "a new process served it");

    // A crash fails that run (closed), and the next run gets a restarted plugin.
    let out = pipeline
        .run(HookPoint::BeforeMessage, json!({"body": "x"}), &ctx)
        .await;
    assert!(out.is_blocked());
    assert_eq!(out.notices[0].code.as_deref(), Some("HOOK_FAILED"));
    let mut ok = false;
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        let out = pipeline
            .run(HookPoint::BeforeToolCall, payload.clone(), &ctx)
            .await;
        if out.message.as_deref() == Some("no") {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the handler works again after the crash restart");
    assert_ne!(pid(&rt), Some(second));
    pipeline.cleanup().await;
    rt.shutdown().await;
}
