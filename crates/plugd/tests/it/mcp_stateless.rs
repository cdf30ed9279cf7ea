//! The stateless MCP revision 2026-07-28 from plugd's MCP client: a server
//! of the official Python `mcp` SDK 2.x (`MCPServer` as it comes, over
//! stdio and over Streamable HTTP without sessions,
//! `tests/plugins/mcp-stateless/stateless_server.py`) is spoken to with
//! `server/discover` and per-request `_meta`, which the server itself
//! reports; a raw server lying in answer to `server/discover`
//! (`hostile_discover.py`) makes plugd fall back to `initialize`, or fail
//! naming the server and the cause.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use serde_json::{Value, json};

use crate::support::{Ws, ok, path_with_venv, repo, stderr, stdout};

fn fixture(script: &str) -> String {
    repo()
        .join("tests/plugins/mcp-stateless")
        .join(script)
        .display()
        .to_string()
}

fn python() -> String {
    repo().join(".venv/bin/python3").display().to_string()
}

/// A workspace whose `.mcp.json` declares `server` as `s`, with plugd.yaml
/// telling plugd to try the stateless revision first with it (`stateless:
/// true`, what the official SDKs' clients do by default).
fn ws_with(server: Value) -> Ws {
    let ws = ws_default(server);
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "mcp:\n  servers:\n    s:\n      stateless: true\n",
    )
    .unwrap();
    ws
}

/// A workspace whose `.mcp.json` declares `server` as `s`, no plugd.yaml.
fn ws_default(server: Value) -> Ws {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"s": server}}).to_string(),
    )
    .unwrap();
    ws
}

/// `plugd tool call s/TOOL --json` (the whole MCP result).
fn call(ws: &Ws, tool: &str, args: &str) -> Output {
    ws.plugd(&["tool", "call", &format!("s/{tool}"), "--args", args])
}

/// What `s/revision` says the server saw.
fn revision(ws: &Ws) -> Value {
    let out = ok(&call(ws, "revision", "{}"));
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.get("structuredContent")
        .cloned()
        .or_else(|| serde_json::from_str(v["content"][0]["text"].as_str()?).ok())
        .unwrap_or(v)
}

/// The behaviour shared by both transports: listed, called (with progress
/// and errors), resources and prompts, all at 2026-07-28.
fn speaks_stateless(ws: &Ws) -> Value {
    let approved = ok(&ws.plugd(&["plugin", "approve", "s"]));
    assert!(approved.contains("s/echo"), "{approved}");
    let list: Value = serde_json::from_str(&ok(&ws.plugd(&["tool", "list", "--json"]))).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for t in ["s/echo", "s/revision", "s/fail"] {
        assert!(names.contains(&t), "{names:?}");
    }

    let o = call(ws, "echo", r#"{"text":"über"}"#);
    assert!(ok(&o).contains("über"), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("half [1/2") && stderr(&o).contains("done [2/2"),
        "progress reaches the caller: {}",
        stderr(&o)
    );

    let o = call(ws, "fail", "{}");
    assert!(!o.status.success());
    // The SDK reports a raised exception without its text.
    assert!(
        stderr(&o).contains("tool \"s/fail\" failed: Error executing tool fail"),
        "{}",
        stderr(&o)
    );

    let o = ok(&ws.plugd(&["resource", "read", "s", "note://stateless"]));
    assert!(o.contains("read over 2026-07-28"), "{o}");
    let o = ok(&ws.plugd(&["prompt", "get", "s", "greet", "--arg", "name=Ada"]));
    assert!(o.contains("Hello, Ada!"), "{o}");

    let seen = revision(ws);
    assert_eq!(seen["protocolVersion"], "2026-07-28", "{seen}");
    assert!(
        seen["clientCapabilities"]["elicitation"].is_object(),
        "the request carried plugd's capabilities: {seen}"
    );
    seen
}

#[test]
fn a_python_sdk_server_on_stdio_is_spoken_to_statelessly() {
    let ws = ws_with(json!({"command": python(), "args": [fixture("stateless_server.py")]}));
    let seen = speaks_stateless(&ws);
    assert!(
        seen["mcpMethodHeader"].is_null(),
        "stdio has no headers: {seen}"
    );
}

#[test]
fn by_default_a_server_speaking_both_keeps_the_handshake_and_its_session_features() {
    // The SDK 2.3.0 stdio server speaks both; at 2026-07-28 it would refuse
    // server requests and subscriptions, so the default keeps the handshake.
    let ws = ws_default(json!({"command": python(), "args": [fixture("stateless_server.py")]}));
    ok(&ws.plugd(&["plugin", "approve", "s"]));
    let seen = revision(&ws);
    assert_eq!(seen["protocolVersion"], "2025-11-25", "{seen}");
    // `stateless: false` never tries 2026-07-28, even for a server without
    // the handshake: it fails, saying what the server answered.
    let only = ws_default(
        json!({"command": python(), "args": [fixture("hostile_discover.py"), "stateless-only"]}),
    );
    std::fs::write(
        only.dir().join("plugd.yaml"),
        "mcp:\n  servers:\n    s:\n      stateless: false\n",
    )
    .unwrap();
    let o = only.plugd(&["plugin", "approve", "s"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("-32022") || stderr(&o).contains("Unsupported protocol version"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn by_default_a_server_refusing_the_handshake_is_asked_with_discover() {
    let ws = ws_default(
        json!({"command": python(), "args": [fixture("hostile_discover.py"), "stateless-only"]}),
    );
    ok(&ws.plugd(&["plugin", "approve", "s"]));
    let (methods, _) = seen_methods(&ws);
    assert_eq!(
        &methods[..2],
        ["initialize", "server/discover"],
        "the handshake first, then discover: {methods:?}"
    );
    assert!(
        !methods.contains(&"notifications/initialized".to_owned()),
        "{methods:?}"
    );
}

/// The fixture's HTTP server, killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_python_sdk_server_over_stateless_http_gets_the_revision_in_headers() {
    #[allow(clippy::disallowed_methods)] // the test's own fixture server
    let mut child = Command::new(python())
        .args([fixture("stateless_server.py"), "http".into()])
        .env("PATH", path_with_venv())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let server = Server {
        url: line
            .strip_prefix("url: ")
            .unwrap_or_else(|| panic!("printed {line:?}"))
            .trim()
            .to_owned(),
        child,
    };
    let ws = ws_with(json!({"type": "http", "url": server.url}));
    let seen = speaks_stateless(&ws);
    assert_eq!(seen["mcpProtocolVersionHeader"], "2026-07-28", "{seen}");
    assert_eq!(seen["mcpMethodHeader"], "tools/call", "{seen}");
    assert_eq!(seen["mcpNameHeader"], "revision", "{seen}");
    assert!(seen["sessionHeader"].is_null(), "no session: {seen}");
}

fn hostile(mode: &str) -> Ws {
    ws_with(json!({"command": python(), "args": [fixture("hostile_discover.py"), mode]}))
}

/// The methods the hostile server received, from its `seen` tool.
fn seen_methods(ws: &Ws) -> (Vec<String>, String) {
    let o = call(ws, "seen", "{}");
    let out = ok(&o);
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let methods = serde_json::from_value(v["structuredContent"]["methods"].clone())
        .unwrap_or_else(|e| panic!("{e}: {v}"));
    (methods, stderr(&o))
}

#[test]
fn lies_in_answer_to_discover_fall_back_to_initialize_with_the_cause_named() {
    for (mode, cause) in [
        ("garbage", Some("not a result object")),
        ("huge", Some("frame")),
        ("many", None),
        ("stateful", None),
    ] {
        let ws = hostile(mode);
        ok(&ws.plugd(&["plugin", "approve", "s"]));
        let (methods, log) = seen_methods(&ws);
        assert_eq!(
            methods[..3],
            ["server/discover", "initialize", "notifications/initialized"],
            "{mode}: discover, then the handshake as before: {methods:?}"
        );
        match cause {
            Some(cause) => assert!(
                log.contains("speaking MCP with the initialize handshake") && log.contains(cause),
                "{mode}: the fallback is reported with its cause: {log}"
            ),
            None => assert!(
                !log.contains("speaking MCP with the initialize handshake"),
                "{mode}: a legacy advertisement is no warning: {log}"
            ),
        }
    }
}

#[test]
fn a_server_speaking_only_unknown_revisions_is_refused_by_name() {
    let ws = hostile("modern-only");
    let o = ws.plugd(&["plugin", "approve", "s"]);
    let o = if o.status.success() {
        call(&ws, "seen", "{}")
    } else {
        o
    };
    assert!(!o.status.success(), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("\"s\"") && err.contains("2099-01-01") && err.contains("2026-07-28"),
        "names the server, its revisions and plugd's: {err}"
    );
}

#[test]
fn a_server_silent_on_discover_is_spoken_to_after_the_bound() {
    let ws = hostile("silent");
    ok(&ws.plugd(&["plugin", "approve", "s"]));
    let (methods, log) = seen_methods(&ws);
    assert_eq!(
        methods[..2],
        ["server/discover", "initialize"],
        "{methods:?}"
    );
    assert!(
        log.contains("did not answer server/discover within"),
        "{log}"
    );
}

#[test]
fn an_input_required_result_fails_the_call_saying_what_was_asked() {
    let ws = hostile("input");
    ok(&ws.plugd(&["plugin", "approve", "s"]));
    let o = call(&ws, "seen", "{}");
    assert!(!o.status.success(), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("input_required") && err.contains("elicitation/create"),
        "{err}"
    );
}
