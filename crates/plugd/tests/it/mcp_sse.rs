//! The opt-in legacy HTTP+SSE transport (MCP 2024-11-05: `GET /sse` +
//! `POST /messages`) and CORS on the MCP paths, on a real `plugd serve`:
//! the official Python SDK's `sse_client` lists and calls tools through it;
//! raw HTTP checks the refusals (no or a wrong token, another identity's
//! session, an oversized body, a batch, a foreign `Origin`, the settings
//! off) and the preflight and headers an allowed origin gets.

use std::io::BufReader;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::gateway::{client, initialize, mcp_post, step, workspace};
use crate::http::{Serve, connect, make_token, read_chunk, read_head, request_as, write_head_as};

const LEGACY_ON: &str = "mcp:\n  http:\n    legacy_sse: true\n";

/// An open `GET /sse` stream, read event by event.
struct Stream {
    r: BufReader<TcpStream>,
    buf: String,
}

impl Stream {
    /// Opens `path` with `token` (and `extra` headers); the status and,
    /// on 200, the stream.
    fn open(
        serve: &Serve,
        token: &str,
        path: &str,
        extra: &[(&str, &str)],
    ) -> (u16, Option<Stream>) {
        let mut s = connect(serve.addr);
        let mut headers = vec![("Accept", "text/event-stream")];
        headers.extend_from_slice(extra);
        write_head_as(&mut s, "GET", path, serve, token, &headers);
        let mut r = BufReader::new(s);
        let (status, _) = read_head(&mut r);
        let stream = (status == 200).then(|| Stream {
            r,
            buf: String::new(),
        });
        (status, stream)
    }

    /// The next event `(name, data)`, comments skipped.
    fn next(&mut self) -> (String, String) {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut name = "message".to_owned();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if block.lines().all(|l| l.starts_with(':') || l.is_empty()) {
                    continue;
                }
                return (name, data);
            }
            let chunk = read_chunk(&mut self.r).expect("the stream ended");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next `message` event's JSON.
    fn message(&mut self) -> Value {
        let (name, data) = self.next();
        assert_eq!(name, "message", "{data}");
        serde_json::from_str(&data).unwrap()
    }
}

fn post(serve: &Serve, token: &str, path: &str, body: &Value) -> crate::http::Resp {
    request_as(
        serve,
        token,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        Some(body.to_string().as_bytes()),
    )
}

#[test]
fn the_python_sdk_lists_and_calls_tools_over_legacy_sse() {
    let ws = workspace(LEGACY_ON);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let plan = json!({
        "transport": "sse",
        "url": format!("http://{}/sse", serve.addr),
        "token": token,
        "mode": "legacy",
        "elicit": null,
        "steps": [
            {"op": "list"},
            {"op": "call", "name": "everything__echo", "args": {"message": "over sse"}},
        ],
    });
    let (report, _) = client(plan);
    let tools: Vec<&str> = step(&report, 0)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(tools.contains(&"everything__echo"), "{report}");
    assert!(tools.contains(&"hello_python_greet"), "{report}");
    assert_eq!(step(&report, 1)["is_error"], false, "{report}");
    assert_eq!(step(&report, 1)["text"], "Echo: over sse", "{report}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn legacy_sse_sessions_are_bound_to_their_identity_and_bounded() {
    let ws = workspace(LEGACY_ON);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let alice = make_token(&ws, "agent");
    let bob = make_token(&ws, "agent");
    let viewer = make_token(&ws, "viewer");

    // No token, a wrong one, a role without the right: no stream.
    assert_eq!(Stream::open(&serve, "", "/sse", &[]).0, 401);
    assert_eq!(Stream::open(&serve, "plugd_wrong", "/sse", &[]).0, 401);
    assert_eq!(Stream::open(&serve, &viewer, "/sse", &[]).0, 403);
    // A foreign Origin is refused even on GET (DNS rebinding).
    let (status, _) = Stream::open(&serve, &alice, "/sse", &[("Origin", "http://evil.example")]);
    assert_eq!(status, 403);

    let (status, stream) = Stream::open(&serve, &alice, "/sse", &[]);
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let (name, endpoint) = stream.next();
    assert_eq!(name, "endpoint");
    assert!(endpoint.starts_with("/messages?sessionId="), "{endpoint}");

    // Another identity, or a wrong token, does not reach the session.
    post(&serve, &bob, &endpoint, &initialize()).error(404, "mcp_session_not_found");
    assert_eq!(
        post(&serve, "plugd_wrong", &endpoint, &initialize()).status,
        401
    );
    post(&serve, &alice, "/messages?sessionId=nope", &initialize())
        .error(404, "mcp_session_not_found");

    // The owner's messages are accepted; responses come on the stream.
    let r = post(&serve, &alice, &endpoint, &initialize());
    assert_eq!(r.status, 202, "{}", r.text());
    let init = stream.message();
    assert_eq!(init["id"], 1, "{init}");
    assert!(init["result"]["protocolVersion"].is_string(), "{init}");
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(&serve, &alice, &endpoint, &note).status, 202);
    let list = json!({"jsonrpc": "2.0", "id": "l", "method": "tools/list"});
    assert_eq!(post(&serve, &alice, &endpoint, &list).status, 202);
    let listed = stream.message();
    assert_eq!(listed["id"], "l", "{listed}");
    assert!(
        listed["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{listed}"
    );

    // Bounded like /mcp: the body limit, no batches.
    let mut s = connect(serve.addr);
    write_head_as(
        &mut s,
        "POST",
        &endpoint,
        &serve,
        &alice,
        &[
            ("Content-Type", "application/json"),
            ("Content-Length", "2097152"),
        ],
    );
    assert_eq!(read_head(&mut BufReader::new(s)).0, 413);
    let batch = json!([list.clone(), list.clone()]);
    assert_eq!(post(&serve, &alice, &endpoint, &batch).status, 400);

    // The stream closed ends the session.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        let r = post(&serve, &alice, &endpoint, &list);
        if r.status == 404 {
            break;
        }
        assert_eq!(r.status, 202, "{}", r.text());
        assert!(Instant::now() < deadline, "the session outlived its stream");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn legacy_sse_counts_against_the_identitys_share_of_sessions() {
    let ws = workspace("mcp:\n  http:\n    legacy_sse: true\n    max_sessions_per_identity: 2\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let alice = make_token(&ws, "agent");
    let r = mcp_post(&serve, &alice, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    let (status, held) = Stream::open(&serve, &alice, "/sse", &[]);
    assert_eq!(status, 200);
    assert_eq!(Stream::open(&serve, &alice, "/sse", &[]).0, 429);
    let r = mcp_post(&serve, &alice, "/mcp", None, &initialize());
    assert_eq!(r.status, 429, "{}", r.text());
    drop(held);
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn legacy_sse_and_cors_are_off_by_default() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let alice = make_token(&ws, "agent");
    let viewer = make_token(&ws, "viewer");
    assert_eq!(Stream::open(&serve, &alice, "/sse", &[]).0, 404);
    assert_eq!(Stream::open(&serve, &viewer, "/sse", &[]).0, 404);
    post(&serve, &alice, "/messages?sessionId=x", &initialize()).error(404, "not_found");
    let r = request_as(
        &serve,
        &alice,
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Origin", "http://app.example"),
        ],
        Some(initialize().to_string().as_bytes()),
    );
    r.error(403, "cross_origin");
    assert!(r.header("access-control-allow-origin").is_none());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn cors_answers_allowed_origins_only() {
    let ws = workspace("mcp:\n  http:\n    cors_allowed_origins: [\"http://app.example\"]\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let alice = make_token(&ws, "agent");
    let preflight = |origin: &str| {
        request_as(
            &serve,
            "",
            "OPTIONS",
            "/mcp",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type, mcp-session-id",
                ),
            ],
            None,
        )
    };
    let ok = preflight("http://app.example");
    assert_eq!(ok.status, 204, "{}", ok.text());
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    let allowed = ok.header("access-control-allow-headers").unwrap();
    for h in [
        "Authorization",
        "Content-Type",
        "Mcp-Session-Id",
        "Mcp-Protocol-Version",
        "Mcp-Method",
        "Mcp-Name",
        "Last-Event-ID",
    ] {
        assert!(allowed.contains(h), "{h} in {allowed}");
    }
    assert!(
        ok.header("access-control-allow-methods")
            .is_some_and(|m| m.contains("POST"))
    );
    let bad = preflight("http://evil.example");
    assert_eq!(bad.status, 403, "{}", bad.text());
    assert!(bad.header("access-control-allow-origin").is_none());

    let call = |origin: &str, path: &str| {
        request_as(
            &serve,
            &alice,
            "POST",
            path,
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("Origin", origin),
                ("Sec-Fetch-Site", "cross-site"),
            ],
            Some(initialize().to_string().as_bytes()),
        )
    };
    let r = call("http://app.example", "/mcp");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("mcp-session-id").is_some());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert_eq!(
        r.header("access-control-expose-headers"),
        Some("Mcp-Session-Id")
    );
    assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
    // A refusal of an allowed origin is readable too.
    let r = request_as(
        &serve,
        "plugd_wrong",
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Origin", "http://app.example"),
        ],
        Some(b"{}"),
    );
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    // Another origin keeps today's refusal; CORS is for the MCP paths only.
    let r = call("http://evil.example", "/mcp");
    r.error(403, "cross_origin");
    assert!(r.header("access-control-allow-origin").is_none());
    let r = call("http://app.example", "/v1/tools/hello_python_greet:invoke");
    r.error(403, "cross_origin");
    assert!(r.header("access-control-allow-origin").is_none());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}
