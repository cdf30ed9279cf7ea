//! `/mcp` of a real `plugd serve` as Streamable HTTP 2025-11-25: resumable
//! SSE streams (event ids, priming, connections closed early and resumed
//! with `Last-Event-ID`, by raw HTTP and by the official Python SDK client),
//! the per-identity session cap, and resource subscriptions left on the
//! hosted server when the session that held them last ends.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway::{client, initialize, mcp_post, step, workspace};
use crate::http::{Resp, Serve, make_token, request_as};
use crate::support::{Ws, repo, stderr};

/// One SSE event as the client parses it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sse {
    pub(crate) id: Option<String>,
    retry: Option<u64>,
    data: Option<String>,
}

impl Sse {
    pub(crate) fn json(&self) -> Option<Value> {
        serde_json::from_str(self.data.as_deref()?).ok()
    }
}

/// The events of an SSE body (comments skipped; an event with only a
/// `retry` field is kept, as the field is what the test looks for).
pub(crate) fn events(r: &Resp) -> Vec<Sse> {
    let text = r.text();
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut e = Sse::default();
        let mut any = false;
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => e.id = Some(value.to_owned()),
                "retry" => e.retry = value.parse().ok(),
                "data" => {
                    let d = e.data.get_or_insert_with(String::new);
                    if !d.is_empty() {
                        d.push('\n');
                    }
                    d.push_str(value);
                }
                _ => continue,
            }
            any = true;
        }
        if any {
            out.push(e);
        }
    }
    out
}

fn initialize_at(version: &str) -> Value {
    let mut i = initialize();
    i["params"]["protocolVersion"] = json!(version);
    i
}

/// A session of `token` at `version`: its id.
pub(crate) fn open(serve: &Serve, token: &str, version: &str) -> String {
    let r = mcp_post(serve, token, "/mcp", None, &initialize_at(version));
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("mcp-session-id").expect("a session id").to_owned()
}

pub(crate) fn get(serve: &Serve, token: &str, session: &str, last_event_id: Option<&str>) -> Resp {
    let mut headers = vec![("Accept", "text/event-stream"), ("Mcp-Session-Id", session)];
    if let Some(id) = last_event_id {
        headers.push(("Last-Event-ID", id));
    }
    request_as(serve, token, "GET", "/mcp", &headers, None)
}

fn delete(serve: &Serve, token: &str, session: &str) -> u16 {
    request_as(
        serve,
        token,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", session)],
        None,
    )
    .status
}

const SHORT_STREAMS: &str =
    "mcp:\n  http:\n    stream_close_after_ms: 400\n    stream_retry_ms: 25\n";

#[test]
fn a_closed_stream_is_resumed_with_last_event_id_until_its_response() {
    let ws = workspace(SHORT_STREAMS);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let other = make_token(&ws, "agent");
    let sid = open(&serve, &token, "2025-11-25");

    // 1.6 s of work in 4 steps: the 400 ms connection closes mid-call.
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "everything__trigger-long-running-operation",
        "arguments": {"duration": 1.6, "steps": 4},
        "_meta": {"progressToken": "p"}}});
    let r = mcp_post(&serve, &token, "/mcp", Some(&sid), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    );
    let first = events(&r);
    // The priming event: an id, the retry field, empty data, first.
    assert!(
        first[0].id.is_some() && first[0].retry == Some(25) && first[0].data.as_deref() == Some(""),
        "{first:?}"
    );
    // Closed before the response, with a retry field last.
    assert!(
        first
            .iter()
            .all(|e| e.json().is_none_or(|m| m.get("result").is_none())),
        "{first:?}"
    );
    assert_eq!(first.last().unwrap().retry, Some(25), "{first:?}");

    let mut all = first.clone();
    let mut last = first.iter().rev().find_map(|e| e.id.clone()).unwrap();
    let mut response = None;
    for _ in 0..40 {
        // Another identity cannot resume it (nor learn the session exists).
        let r = get(&serve, &other, &sid, Some(&last));
        assert_eq!(r.status, 404, "{}", r.text());
        let r = get(&serve, &token, &sid, Some(&last));
        assert_eq!(r.status, 200, "{}", r.text());
        let got = events(&r);
        all.extend(got.iter().cloned());
        if let Some(id) = got.iter().rev().find_map(|e| e.id.clone()) {
            last = id;
        }
        response = got
            .iter()
            .filter_map(Sse::json)
            .find(|m| m["id"] == 7 && m.get("result").is_some());
        if response.is_some() {
            break;
        }
    }
    let response = response.expect("the response, on a resumed connection");
    assert!(
        response["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("completed"),
        "{response}"
    );
    // Every message exactly once, every id unique, progress in order.
    let ids: Vec<&String> = all.iter().filter_map(|e| e.id.as_ref()).collect();
    assert_eq!(
        ids.len(),
        ids.iter().collect::<HashSet<_>>().len(),
        "{ids:?}"
    );
    let progress: Vec<f64> = all
        .iter()
        .filter_map(Sse::json)
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"]["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(progress.len(), 4, "{all:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    // The stream ended with its response: resuming after it is refused.
    let r = get(&serve, &token, &sid, Some(&last));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ended")
    );

    // Ids this session cannot resume: a JSON-RPC error, 400.
    let theirs = open(&serve, &other, "2025-11-25");
    let foreign = events(&get(&serve, &other, &theirs, None))[0]
        .id
        .clone()
        .expect("the GET stream is primed too");
    for bad in [foreign.as_str(), "nonsense", "1-2-3", &"7".repeat(4000)] {
        let r = get(&serve, &token, &sid, Some(bad));
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        let body = r.json();
        assert_eq!(body["jsonrpc"], "2.0");
        assert_eq!(body["error"]["code"], -32000);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("names no event stream of this MCP session"),
            "{body}"
        );
    }
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn the_get_stream_is_resumed_with_what_it_missed() {
    let ws = workspace(SHORT_STREAMS);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let sid = open(&serve, &token, "2025-11-25");
    let first = events(&get(&serve, &token, &sid, None));
    let primed = first[0].id.clone().expect("a priming event");
    // While no connection carries the GET stream, the catalog changes.
    let o = ws.plugd(&["plugin", "revoke", "hello_python"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut seen = Vec::new();
    for _ in 0..20 {
        let got = events(&get(&serve, &token, &sid, Some(&primed)));
        seen = got.iter().filter_map(Sse::json).collect();
        if !seen.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seen.iter()
            .any(|m| m["method"] == "notifications/tools/list_changed"),
        "the list change sent while disconnected is replayed: {seen:?}"
    );
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn an_older_session_gets_plain_streams() {
    let ws = workspace(SHORT_STREAMS);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let sid = open(&serve, &token, "2025-06-18");
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "everything__trigger-long-running-operation",
        "arguments": {"duration": 0.6, "steps": 2},
        "_meta": {"progressToken": 1}}});
    let r = mcp_post(&serve, &token, "/mcp", Some(&sid), &call);
    let got = events(&r);
    // No ids, no priming, no retry, and not closed at 400 ms: a 2025-06-18
    // client cannot resume.
    assert!(
        got.iter().all(|e| e.id.is_none() && e.retry.is_none()),
        "{got:?}"
    );
    assert!(
        got.iter()
            .filter_map(Sse::json)
            .any(|m| m["id"] == 3 && m.get("result").is_some()),
        "{got:?}"
    );
    let r = get(&serve, &token, &sid, Some("0-1-1"));
    assert_eq!(r.status, 400, "{}", r.text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn the_python_sdk_resumes_closed_streams_on_its_own() {
    let ws = workspace(SHORT_STREAMS);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let plan = json!({
        "transport": "http",
        "url": format!("http://{}/mcp", serve.addr),
        "token": token,
        "mode": "legacy",
        "elicit": null,
        "steps": [
            {"op": "call", "name": "everything__trigger-long-running-operation", "args": {"duration": 1.5, "steps": 3}, "progress": true, "timeout": 20},
            {"op": "call", "name": "everything__echo", "args": {"message": "after"}},
        ],
    });
    let (report, _) = client(plan);
    assert_eq!(step(&report, 0)["is_error"], false, "{report}");
    assert!(
        step(&report, 0)["text"]
            .as_str()
            .unwrap()
            .contains("completed"),
        "{report}"
    );
    assert_eq!(
        step(&report, 0)["progress"].as_array().unwrap().len(),
        3,
        "{report}"
    );
    assert_eq!(step(&report, 1)["text"], "Echo: after", "{report}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn one_identity_holds_at_most_its_share_of_sessions() {
    let ws = workspace("mcp:\n  http:\n    max_sessions_per_identity: 3\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let alice = make_token(&ws, "agent");
    let bob = make_token(&ws, "agent");
    let held: Vec<String> = (0..3).map(|_| open(&serve, &alice, "2025-11-25")).collect();
    let mut init = initialize_at("2025-11-25");
    init["id"] = json!("fourth");
    let r = mcp_post(&serve, &alice, "/mcp", None, &init);
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.header("mcp-session-id").is_none());
    let body = r.json();
    assert_eq!(body["id"], "fourth", "{body}");
    assert_eq!(body["error"]["code"], -32000, "{body}");
    assert_eq!(body["error"]["data"]["limit"], 3, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    for needle in [
        "3 open MCP sessions",
        "mcp.http.max_sessions_per_identity",
        "DELETE /mcp",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message}");
    }
    // Others are not affected; a session ended frees a slot.
    open(&serve, &bob, "2025-11-25");
    assert_eq!(delete(&serve, &alice, &held[0]), 204);
    open(&serve, &alice, "2025-11-25");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn the_default_share_is_64_sessions() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let alice = make_token(&ws, "agent");
    for _ in 0..64 {
        open(&serve, &alice, "2025-06-18");
    }
    let r = mcp_post(&serve, &alice, "/mcp", None, &initialize());
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["data"]["limit"], 64);
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

/// A workspace hosting `tests/plugins/mcp/resources_mcp.py` as server `r`.
fn resources_ws() -> Ws {
    let ws = Ws::new();
    let server = repo().join("tests/plugins/mcp/resources_mcp.py");
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"r": {"command": "python3", "args": [server, "good"]}}}).to_string(),
    )
    .unwrap();
    let o = ws.plugd(&["plugin", "approve", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    ws
}

/// The request methods server `r` received, asked through `session`.
fn seen(serve: &Serve, token: &str, session: &str) -> Vec<String> {
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "r__seen", "arguments": {}}});
    let r = mcp_post(serve, token, "/mcp", Some(session), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    let reply = if r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        events(&r)
            .iter()
            .filter_map(Sse::json)
            .find(|m| m["id"] == 9)
            .unwrap()
    } else {
        r.json()
    };
    reply["result"]["structuredContent"]["methods"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_session_ended_with_subscriptions_leaves_them_when_it_held_the_last() {
    let ws = resources_ws();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let subscribe = json!({"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": "plugd:///r/mem://text"}});
    let (a, b) = (
        open(&serve, &token, "2025-06-18"),
        open(&serve, &token, "2025-06-18"),
    );
    for s in [&a, &b] {
        let r = mcp_post(&serve, &token, "/mcp", Some(s), &subscribe);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json().get("result").is_some(), "{}", r.text());
    }
    // `a` ends without unsubscribing: `b` still holds the URI.
    assert_eq!(delete(&serve, &token, &a), 204);
    let watcher = open(&serve, &token, "2025-06-18");
    let methods = seen(&serve, &token, &watcher);
    assert!(
        methods.contains(&"resources/subscribe".to_owned()),
        "{methods:?}"
    );
    assert!(
        !methods.contains(&"resources/unsubscribe".to_owned()),
        "{methods:?}"
    );
    // `b` ends too: the server is told.
    assert_eq!(delete(&serve, &token, &b), 204);
    let told = crate::support::eventually_blocking(Duration::from_secs(10), || {
        seen(&serve, &token, &watcher).contains(&"resources/unsubscribe".to_owned())
    });
    assert!(told, "resources/unsubscribe after the last holder ended");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}
