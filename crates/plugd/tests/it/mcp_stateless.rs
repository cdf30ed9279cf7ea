//! The stateless MCP revision 2026-07-28 from plugd's MCP client: a server
//! of the official Python `mcp` SDK 2.x (`MCPServer` as it comes, over
//! stdio and over Streamable HTTP without sessions,
//! `tests/plugins/mcp-stateless/stateless_server.py`) is spoken to with
//! `server/discover` and per-request `_meta`, which the server itself
//! reports; a raw server lying in answer to `server/discover`
//! (`hostile_discover.py`) makes plugd fall back to `initialize`, or fail
//! naming the server and the cause.

use std::process::{Child, Output};

use serde_json::{Value, json};

use crate::support::{Ws, ok, repo, stderr, stdout};

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
    let (child, url) =
        crate::support::python_server("tests/plugins/mcp-stateless/stateless_server.py", &["http"]);
    let server = Server { url, child };
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

// The gateway (`plugd serve`'s `/mcp`) on the stateless revision, in front
// of the same Python SDK server on stdio: its envelope checks, the HTTP
// status of its errors, a hosted server's JSON-RPC error kept whole, and
// `input_required` passed through to the client and its answers back.

/// `_meta` of a 2026-07-28 request from a client declaring `caps`.
fn meta(caps: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "it", "version": "1"},
    })
}

/// A 2026-07-28 POST to `/mcp` of `body`, its header version `version`.
fn post_stateless(
    serve: &crate::http::Serve,
    token: &str,
    version: &str,
    body: &Value,
) -> crate::http::Resp {
    let method = body["method"].as_str().unwrap_or_default().to_owned();
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", version),
        ("Mcp-Method", &method),
    ];
    // The routing header 2026-07-28 requires when the body names something.
    let named = ["name", "uri"]
        .iter()
        .find_map(|k| body["params"][*k].as_str())
        .unwrap_or_default()
        .to_owned();
    if !named.is_empty() {
        headers.push(("Mcp-Name", &named));
    }
    crate::http::request_as(
        serve,
        token,
        "POST",
        "/mcp",
        &headers,
        Some(body.to_string().as_bytes()),
    )
}

/// `plugd serve` hosting the stateless server as `s` (spoken to at
/// 2026-07-28: `stateless: true`), and an agent token.
fn serve_stateless() -> (Ws, crate::http::Serve, String) {
    let ws = ws_with(json!({"command": python(), "args": [fixture("stateless_server.py")]}));
    ok(&ws.plugd(&["plugin", "approve", "s"]));
    let serve = crate::http::Serve::start(&ws, "127.0.0.1:0");
    let token = crate::http::make_token(&ws, "agent");
    (ws, serve, token)
}

#[test]
fn stateless_requests_get_their_envelope_checked_and_the_revisions_statuses() {
    let (_ws, serve, token) = serve_stateless();
    let discover = |params: Value, id: i64| json!({"jsonrpc": "2.0", "id": id, "method": "server/discover", "params": params});
    // No _meta, no clientCapabilities: -32602, 400, the id kept.
    for (params, id) in [
        (json!({}), 101),
        (
            json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
            104,
        ),
    ] {
        let r = post_stateless(&serve, &token, "2026-07-28", &discover(params, id));
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], -32602, "{}", r.text());
        assert_eq!(r.json()["id"], id, "{}", r.text());
    }
    // A version plugd lacks: -32022 naming what it speaks and echoing the ask.
    let mut m = meta(json!({}));
    m["io.modelcontextprotocol/protocolVersion"] = json!("v999.0.0");
    let r = post_stateless(
        &serve,
        &token,
        "v999.0.0",
        &discover(json!({"_meta": m}), 301),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], -32022, "{e}");
    assert_eq!(e["data"]["requested"], "v999.0.0", "{e}");
    assert!(
        e["data"]["supported"]
            .as_array()
            .unwrap()
            .contains(&json!("2026-07-28")),
        "{e}"
    );
    // The header says another version than _meta: -32020.
    let r = post_stateless(
        &serve,
        &token,
        "2026-07-28",
        &discover(json!({"_meta": m}), 302),
    );
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (400, json!(-32020)),
        "{}",
        r.text()
    );
    // Discover identifies plugd in the result's _meta; no clientInfo needed.
    let mut m = meta(json!({}));
    m.as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientInfo");
    let r = post_stateless(
        &serve,
        &token,
        "2026-07-28",
        &discover(json!({"_meta": m}), 105),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "plugd",
        "{}",
        r.text()
    );
    // Methods 2026-07-28 removed, and unknown ones: 404 with -32601.
    for method in [
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "no/such",
    ] {
        let body = json!({"jsonrpc": "2.0", "id": 500, "method": method, "params": {"_meta": meta(json!({}))}});
        let r = post_stateless(&serve, &token, "2026-07-28", &body);
        assert_eq!(r.status, 404, "{method}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], -32601, "{method}: {}", r.text());
        assert_eq!(r.json()["id"], 500, "{method}: {}", r.text());
    }
    // The routing headers are required on this revision: none, 400 -32020.
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"_meta": meta(json!({}))}});
    let r = crate::http::request_as(
        &serve,
        &token,
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("MCP-Protocol-Version", "2026-07-28"),
        ],
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (400, json!(-32020)),
        "{}",
        r.text()
    );
    // Cacheable results carry the revision's cache hints, resources/read too.
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": "plugd:///s/note://stateless", "_meta": meta(json!({}))}});
    let r = post_stateless(&serve, &token, "2026-07-28", &body);
    let res = &r.json()["result"];
    assert_eq!(
        (res["cacheScope"].clone(), res["ttlMs"].clone()),
        (json!("private"), json!(0)),
        "{}",
        r.text()
    );
    // A URI no server has: -32602 with the URI (SEP-2164).
    let body = json!({"jsonrpc": "2.0", "id": 8, "method": "resources/read", "params": {"uri": "plugd:///nobody/x", "_meta": meta(json!({}))}});
    let r = post_stateless(&serve, &token, "2026-07-28", &body);
    assert_eq!(r.json()["error"]["code"], -32602, "{}", r.text());
    assert_eq!(
        r.json()["error"]["data"]["uri"],
        "plugd:///nobody/x",
        "{}",
        r.text()
    );
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_hosted_servers_error_reply_keeps_its_code_and_data_through_the_gateway() {
    let (_ws, serve, token) = serve_stateless();
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "s__refuse", "arguments": {}, "_meta": meta(json!({}))}});
    let r = post_stateless(&serve, &token, "2026-07-28", &call);
    let e = &r.json()["error"];
    assert_eq!(e["code"], -32042, "{}", r.text());
    assert_eq!(e["message"], "refused on purpose", "{}", r.text());
    assert_eq!(
        e["data"],
        json!({"why": "a test", "retry": false}),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["id"], 3, "{}", r.text());
    // The same on a 2025-11-25 session.
    let r = crate::gateway::mcp_post(&serve, &token, "/mcp", None, &crate::gateway::initialize());
    let session = r.header("mcp-session-id").expect("a session").to_owned();
    let mut call = call.clone();
    call["params"].as_object_mut().unwrap().remove("_meta");
    let r = crate::gateway::mcp_post(&serve, &token, "/mcp", Some(&session), &call);
    let reply = if r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        let data = r
            .text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|m| m["id"] == 3);
        data.unwrap_or_else(|| panic!("{}", r.text()))
    } else {
        r.json()
    };
    assert_eq!(reply["error"]["code"], -32042, "{reply}");
    assert_eq!(reply["error"]["data"]["why"], "a test", "{reply}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn input_required_passes_through_the_gateway_and_the_answers_come_back() {
    let (_ws, serve, token) = serve_stateless();
    let call = |extra: Value| {
        let mut params = json!({"name": "s__ask_name", "arguments": {}, "_meta": meta(json!({"elicitation": {}}))});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": params})
    };
    // Round 1: the server's question reaches the client as it asked it.
    let r = post_stateless(&serve, &token, "2026-07-28", &call(json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    let first = r.json()["result"].clone();
    assert_eq!(first["resultType"], "input_required", "{first}");
    assert_eq!(
        first["inputRequests"]["name"]["method"], "elicitation/create",
        "{first}"
    );
    let state = first["requestState"]
        .as_str()
        .expect("the server's sealed state")
        .to_owned();
    // Round 2: the answer and the state go back; the server saw the
    // client's own capabilities, not plugd's.
    let answer = json!({"inputResponses": {"name": {"action": "accept", "content": {"name": "Ada"}}}, "requestState": state});
    let r = post_stateless(&serve, &token, "2026-07-28", &call(answer));
    let done = &r.json()["result"];
    assert_eq!(done["resultType"], "complete", "{}", r.text());
    assert_eq!(
        done["content"][0]["text"],
        "Hello, Ada! (asked of an elicitation client)",
        "{}",
        r.text()
    );
    // A tampered state is the server's -32602, kept.
    let answer = json!({"inputResponses": {"name": {"action": "accept", "content": {"name": "Ada"}}}, "requestState": format!("{state}x")});
    let r = post_stateless(&serve, &token, "2026-07-28", &call(answer));
    assert_eq!(r.json()["error"]["code"], -32602, "{}", r.text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}
