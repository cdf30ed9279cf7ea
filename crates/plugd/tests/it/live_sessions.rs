//! MCP and console sessions kept in the state store: a real `plugd serve` stopped and started again keeps serving them, still only to their owner; ended sessions stay ended; the store holds no console session id nor token.

use serde_json::{Value, json};

use crate::gateway::{initialize, mcp_post, workspace};
use crate::http::{Serve, make_token, request_as};
use crate::support::stderr;

fn call(serve: &Serve, token: &str, session: &str, id: i64) -> crate::http::Resp {
    mcp_post(
        serve,
        token,
        "/mcp",
        Some(session),
        &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "hello_python_greet", "arguments": {"name": "again"}}}),
    )
}

/// The reply of a call answered as JSON or as one SSE event.
fn reply(r: &crate::http::Resp) -> Value {
    let text = r.text();
    match text.lines().find_map(|l| l.strip_prefix("data: ")) {
        Some(data) => serde_json::from_str(data).unwrap(),
        None => serde_json::from_str(&text).unwrap(),
    }
}

/// Whether `needle` occurs anywhere in the workspace's state database files.
fn in_state_db(ws: &crate::support::Ws, needle: &str) -> bool {
    let dir = ws.dir().join(".plugd");
    std::fs::read_dir(&dir).unwrap().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("state.db")
            && std::fs::read(e.path())
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
    })
}

#[test]
fn an_mcp_session_outlives_a_restart_of_serve_for_its_owner_only() {
    let ws = workspace("");
    let alice = make_token(&ws, "agent");
    let bob = make_token(&ws, "agent");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let r = mcp_post(&serve, &alice, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    let session = r.header("mcp-session-id").expect("a session id").to_owned();
    let first = call(&serve, &alice, &session, 2);
    assert_eq!(first.status, 200, "{}", first.text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    // (An MCP session id is no credential by itself, every request needs
    // its owner's token too, and invocation records name it; the console's
    // cookie is one, and the console test below checks it is not stored.)

    // A new serve process: no initialize, the same session id.
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let again = call(&serve, &alice, &session, 3);
    assert_eq!(again.status, 200, "{}", again.text());
    let body = reply(&again);
    assert_eq!(body["id"], 3, "{body}");
    assert!(
        body["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("again")),
        "{body}"
    );
    // The negotiated revision came back with it: a batch is refused as
    // for any 2025-06-18 session.
    let batch = mcp_post(
        &serve,
        &alice,
        "/mcp",
        Some(&session),
        &json!([{"jsonrpc": "2.0", "id": 9, "method": "tools/list"}]),
    );
    assert!(
        batch.text().contains("batch_not_supported"),
        "{}",
        batch.text()
    );
    // Someone else's token gets 404, as on the serve that opened it.
    let stolen = call(&serve, &bob, &session, 4);
    assert_eq!(stolen.status, 404, "{}", stolen.text());
    // DELETE by the owner ends it here and in the store.
    let del = request_as(
        &serve,
        &alice,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        None,
    );
    assert_eq!(del.status, 204, "{}", del.text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let gone = call(&serve, &alice, &session, 5);
    assert_eq!(gone.status, 404, "{}", gone.text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_console_session_outlives_a_restart_and_ends_with_its_token() {
    let ws = workspace("");
    let operator = make_token(&ws, "operator");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let login = request_as(
        &serve,
        "",
        "POST",
        "/console/login",
        &[("Content-Type", "application/json")],
        Some(json!({"token": operator}).to_string().as_bytes()),
    );
    assert_eq!(login.status, 204, "{}", login.text());
    let set = login.header("set-cookie").expect("a cookie").to_owned();
    let id = set
        .split(';')
        .next()
        .and_then(|kv| kv.split_once('='))
        .map(|(_, v)| v.to_owned())
        .unwrap();
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(
        !in_state_db(&ws, &id),
        "the state database holds the cookie's session id"
    );
    assert!(
        !in_state_db(&ws, &operator),
        "the state database holds the token"
    );

    let serve = Serve::start(&ws, "127.0.0.1:0");
    let cookie = format!("plugd_console_{}={id}", serve.addr.port());
    let who = request_as(
        &serve,
        "",
        "GET",
        "/console/session",
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(who.status, 200, "{}", who.text());
    assert_eq!(who.json()["role"], "operator", "{}", who.text());
    // The token revoked (by the CLI, through serve): the session ends.
    let name = ws.plugd(&["token", "list", "--json"]);
    assert!(name.status.success(), "{}", stderr(&name));
    let tokens: Value = serde_json::from_slice(&name.stdout).unwrap();
    let op = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["role"] == "operator")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = ws.plugd(&["token", "revoke", &op]);
    assert!(out.status.success(), "{}", stderr(&out));
    let after = request_as(
        &serve,
        "",
        "GET",
        "/console/session",
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(after.status, 401, "{}", after.text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}
