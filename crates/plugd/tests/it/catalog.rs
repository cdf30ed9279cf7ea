//! One catalog and tool search (issue 28) over a real `plugd serve`: org
//! tokens' MCP clients (HTTP `/mcp`) list and call the exports bound to
//! their org (the `vai.rpc.v1` Python package of `binding_calls.rs`, pushed
//! to a real `docker-registry` and pulled), never another org's; `GET
//! /v1/tools` shows them; an MCP session keeps the binding it first
//! resolved to when the rollout moves. A `discovery: search` profile over
//! the real `risky` Python plugin of `risk.rs`: `tools/list` holds only
//! `search_tools`, a search finds a tool by a word of its description, the
//! session hears `notifications/tools/list_changed` on its stream and
//! lists the tool afterwards, calls work found or not, a tool plugd.yaml's
//! `policy:` denies is never found, and hostile arguments are refused with
//! a readable tool error. A `policy:` deny naming an org hides a bound
//! export from that org's lists and refuses its calls as unknown.

use std::time::Duration;

use serde_json::{Value, json};

use crate::binding_calls::{SECRET, call, world};
use crate::gateway::mcp_post;
use crate::gateway_http::{Sse, events};
use crate::http::{Resp, Serve, make_token, request_as};
use crate::support::eventually_blocking;

/// An MCP session of `token` at `path` (`/mcp`, `/mcp/PROFILE`) on
/// revision `version`; its id.
pub(crate) fn open(serve: &Serve, token: &str, path: &str, version: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let r = mcp_post(serve, token, path, None, &init);
    assert_eq!(r.status, 200, "{}", r.text());
    let sid = r.header("mcp-session-id").expect("a session id").to_owned();
    let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(mcp_post(serve, token, path, Some(&sid), &done).status, 202);
    sid
}

/// The result (or error) of request `method` with `params` in session
/// `sid`: the JSON-RPC response.
fn rpc(serve: &Serve, token: &str, path: &str, sid: &str, method: &str, params: Value) -> Value {
    let msg = json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params});
    let r = mcp_post(serve, token, path, Some(sid), &msg);
    assert_eq!(r.status, 200, "{}", r.text());
    if r.header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        return events(&r)
            .iter()
            .filter_map(Sse::json)
            .find(|m| m.get("id") == Some(&json!(9)))
            .expect("the response on the stream");
    }
    r.json()
}

pub(crate) fn tool_names(serve: &Serve, token: &str, path: &str, sid: &str) -> Vec<String> {
    let r = rpc(serve, token, path, sid, "tools/list", json!({}));
    r["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {r}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

pub(crate) fn call_tool(
    serve: &Serve,
    token: &str,
    path: &str,
    sid: &str,
    name: &str,
    args: Value,
) -> Value {
    rpc(
        serve,
        token,
        path,
        sid,
        "tools/call",
        json!({"name": name, "arguments": args}),
    )
}

pub(crate) fn listed(serve: &Serve, token: &str) -> Vec<Value> {
    let r = request_as(serve, token, "GET", "/v1/tools", &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().as_array().unwrap().clone()
}

#[test]
fn an_org_token_lists_and_calls_its_bound_exports_and_never_another_orgs() {
    let w = world(&[]);
    w.secret("org_a", SECRET);
    w.secret("org_b", SECRET);
    let mine = w.bind("org_a", None, "0.1.0", 100);
    let theirs = w.bind_package("acme/kit", "leak", "org_b", None, "0.2.0", 100);
    let a = w.token("agent", "org_a", &[]);
    let b = w.token("agent", "org_b", &[]);
    let s = &w.serve;

    // /mcp: org_a's client sees its export under its export id, only it.
    let sid = open(s, &a, "/mcp", "2025-06-18");
    assert_eq!(tool_names(s, &a, "/mcp", &sid), ["whoami"]);
    let r = call_tool(s, &a, "/mcp", &sid, "whoami", json!({}));
    let out = &r["result"]["structuredContent"];
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(out["org_id"], "org_a", "{r}");
    assert_eq!(out["version"], "0.1.0", "{r}");
    assert_eq!(out["session_id"], format!("mcp-{sid}"), "{r}");
    // The binding's secret reached the plugin, and is masked in the answer.
    assert_eq!(out["reversed"], SECRET.chars().rev().collect::<String>());
    assert!(!r.to_string().contains(SECRET), "{r}");

    // Another org's export is absent and refused exactly like a tool that
    // does not exist.
    let leak = call_tool(s, &a, "/mcp", &sid, "leak", json!({}));
    let nope = call_tool(s, &a, "/mcp", &sid, "no_such_tool", json!({}));
    assert_eq!(leak["error"]["code"], nope["error"]["code"], "{leak}");
    assert_eq!(leak["error"]["message"], "Unknown tool: leak", "{leak}");
    assert_eq!(nope["error"]["message"], "Unknown tool: no_such_tool");
    // A workspace tool name is no way around it either.
    let sid_b = open(s, &b, "/mcp", "2025-06-18");
    assert_eq!(tool_names(s, &b, "/mcp", &sid_b), ["leak"]);
    let r = call_tool(s, &b, "/mcp", &sid_b, "whoami", json!({}));
    assert_eq!(r["error"]["message"], "Unknown tool: whoami", "{r}");

    // GET /v1/tools: the same view, named the same, with its binding.
    let rows = listed(s, &a);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["name"], "whoami");
    assert_eq!(rows[0]["binding_id"], mine.binding_id.as_str());
    assert_eq!(rows[0]["package_version"], "0.1.0");
    let rows = listed(s, &b);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["binding_id"], theirs.binding_id.as_str());
    // The workspace identity's view is unchanged: the workspace's tools
    // (none here), not the orgs' exports.
    assert!(listed(s, &s.token).is_empty());

    // The call took the governed path: one record of org_a, made by /mcp
    // (records are written off the call's path: wait for it).
    let records = || -> Vec<Value> {
        let r = call(s, &a, "GET", "/v1/invocations?limit=50", None);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["invocations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["surface"] == "mcp")
            .cloned()
            .collect()
    };
    assert!(eventually_blocking(Duration::from_secs(5), || !records().is_empty()));
    let mcp = records();
    assert_eq!(mcp.len(), 1, "{mcp:?}");
    assert_eq!(mcp[0]["binding_id"], mine.binding_id.as_str(), "{mcp:?}");
    assert_eq!(mcp[0]["org_id"], "org_a", "{mcp:?}");
}

#[test]
fn a_policy_deny_hides_a_bound_export_from_the_list_and_refuses_its_call() {
    let ws = crate::support::Ws::new();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "policy:\n  - name: no-leak-for-org-a\n    when: 'caller.org == \"org_a\" && tool.plugin == \"acme/kit\" && tool.name.endsWith(\"leak\")'\n    effect: deny\n",
    )
    .unwrap();
    let w = crate::binding_calls::world_in(ws, &[]);
    for org in ["org_a", "org_b"] {
        w.secret(org, SECRET);
        w.bind(org, None, "0.1.0", 100);
        w.bind_package("acme/kit", "leak", org, None, "0.1.0", 100);
    }
    let a = w.token("agent", "org_a", &[]);
    let b = w.token("agent", "org_b", &[]);
    let s = &w.serve;

    // org_a: the denied export is not listed, and its call is an unknown
    // tool's; org_b, which the rule does not name, has both.
    let sid = open(s, &a, "/mcp", "2025-06-18");
    assert_eq!(tool_names(s, &a, "/mcp", &sid), ["whoami"]);
    let r = call_tool(s, &a, "/mcp", &sid, "leak", json!({}));
    assert_eq!(r["error"]["message"], "Unknown tool: leak", "{r}");
    let names: Vec<Value> = listed(s, &a).iter().map(|t| t["name"].clone()).collect();
    assert_eq!(names, [json!("whoami")]);
    let sid_b = open(s, &b, "/mcp", "2025-06-18");
    assert_eq!(tool_names(s, &b, "/mcp", &sid_b), ["leak", "whoami"]);
    assert_eq!(listed(s, &b).len(), 2);
}

#[test]
fn an_mcp_session_keeps_the_binding_it_first_resolved_to() {
    let w = world(&[]);
    w.secret("org_a", SECRET);
    let one = w.bind("org_a", None, "0.1.0", 50);
    let two = w.bind("org_a", None, "0.2.0", 50);
    let a = w.token("agent", "org_a", &[]);
    let s = &w.serve;
    let version_of = |id: &str| {
        if id == one.binding_id {
            "0.1.0"
        } else {
            "0.2.0"
        }
    };

    // Sessions, each with the version its first call resolved to.
    let both = [one.clone(), two.clone()];
    let mut sessions = Vec::new();
    for _ in 0..12 {
        let sid = open(s, &a, "/mcp", "2025-06-18");
        let r = call_tool(s, &a, "/mcp", &sid, "whoami", json!({}));
        let got = r["result"]["structuredContent"]["version"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_owned();
        // The first resolution is the SHA-256 rule's, keyed by the session.
        let rule = plugd_control::bindings::select(&both, &format!("mcp-{sid}")).unwrap();
        assert_eq!(got, version_of(&rule.binding_id), "session {sid}");
        sessions.push((sid, got));
    }

    // The rollout moves: 0.2.0 takes 100 against 0.1.0's 50. The rule
    // would now send some sessions elsewhere; each keeps its version while
    // its binding still applies.
    let two = w.patch(
        &two.binding_id,
        &json!({"rollout": {"traffic_percent": 100}}),
    );
    let both = [one.clone(), two.clone()];
    let mut moved_by_rule = 0;
    for (sid, got) in &sessions {
        let rule = plugd_control::bindings::select(&both, &format!("mcp-{sid}")).unwrap();
        if version_of(&rule.binding_id) != got {
            moved_by_rule += 1;
        }
        for _ in 0..2 {
            let r = call_tool(s, &a, "/mcp", sid, "whoami", json!({}));
            assert_eq!(
                r["result"]["structuredContent"]["version"],
                got.as_str(),
                "session {sid}: {r}"
            );
        }
    }
    assert!(
        moved_by_rule > 0 || sessions.iter().all(|(_, v)| v == "0.2.0"),
        "no session would have moved; the check proves nothing: {sessions:?}"
    );

    // A binding that no longer applies (disabled) is left: the session's
    // next call resolves anew, to the one that still does.
    w.patch(&one.binding_id, &json!({"status": "disabled"}));
    for (sid, _) in &sessions {
        let r = call_tool(s, &a, "/mcp", sid, "whoami", json!({}));
        assert_eq!(r["result"]["structuredContent"]["version"], "0.2.0", "{r}");
    }
}

/// A `discovery: search` profile `found` over the `risky` plugin, short
/// SSE connections (so a test reads the session's stream in steps), and a
/// policy that denies `risky/plain` to everyone.
const SEARCH_YAML: &str = r#"mcp:
  http:
    stream_close_after_ms: 400
    stream_retry_ms: 25
  profiles:
    found:
      plugins: [risky]
      discovery: search
    listed:
      plugins: [risky]
policy:
  - name: no-plain
    when: 'tool.name == "risky/plain"'
    effect: deny
"#;

const FOUND: &str = "/mcp/found";

fn search(serve: &Serve, token: &str, sid: &str, args: Value) -> Value {
    let r = call_tool(serve, token, FOUND, sid, "search_tools", args);
    r["result"].clone()
}

fn found_names(result: &Value) -> Vec<String> {
    result["structuredContent"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {result}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The session's stream (`GET`), resumed after `last`; its messages.
fn stream(serve: &Serve, token: &str, sid: &str, last: Option<&str>) -> (Vec<Sse>, Resp) {
    let mut headers = vec![("Accept", "text/event-stream"), ("Mcp-Session-Id", sid)];
    if let Some(id) = last {
        headers.push(("Last-Event-ID", id));
    }
    let r = request_as(serve, token, "GET", FOUND, &headers, None);
    assert_eq!(r.status, 200, "{}", r.text());
    (events(&r), r)
}

#[test]
fn a_search_profile_lists_search_tools_and_loads_what_a_search_finds() {
    let ws = crate::risk::workspace(SEARCH_YAML);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let token = make_token(&ws, "agent");
    let s = &serve;
    let sid = open(s, &token, FOUND, "2025-11-25");
    let (first, _) = stream(s, &token, &sid, None);
    let primed = first[0].id.clone().expect("a priming event");

    // Only the search tool, with its schema.
    let r = rpc(s, &token, FOUND, &sid, "tools/list", json!({}));
    let tools = r["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{r}");
    assert_eq!(tools[0]["name"], "search_tools");
    assert_eq!(tools[0]["inputSchema"]["required"], json!(["query"]));
    // The same plugin under a list profile: every tool but the denied one.
    let listed_sid = open(s, &token, "/mcp/listed", "2025-06-18");
    let mut all = tool_names(s, &token, "/mcp/listed", &listed_sid);
    all.sort();
    assert_eq!(all, ["risky__crit", "risky__hi", "risky__lo", "risky__med"]);

    // A word of a description finds its tool, with what a client needs.
    let got = search(s, &token, &sid, json!({"query": "medium"}));
    assert_eq!(got["isError"], false, "{got}");
    assert_eq!(found_names(&got), ["risky__med"]);
    let hit = &got["structuredContent"]["tools"][0];
    assert_eq!(hit["description"], "a medium tool");
    assert_eq!(hit["inputSchema"]["type"], "object");

    // The session hears that its list changed, and the list has it now.
    let mut heard = false;
    for _ in 0..40 {
        let (got, _) = stream(s, &token, &sid, Some(&primed));
        if got
            .iter()
            .filter_map(Sse::json)
            .any(|m| m["method"] == "notifications/tools/list_changed")
        {
            heard = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(heard, "no notifications/tools/list_changed");
    assert_eq!(
        tool_names(s, &token, FOUND, &sid),
        ["search_tools", "risky__med"]
    );
    let r = call_tool(s, &token, FOUND, &sid, "risky__med", json!({}));
    assert_eq!(r["result"]["content"][0]["text"], "ran med", "{r}");
    // A tool the session may see is callable before any search found it.
    let r = call_tool(s, &token, FOUND, &sid, "risky__lo", json!({}));
    assert_eq!(r["result"]["content"][0]["text"], "ran lo", "{r}");

    // The denied tool is never found, whatever the words, and is refused
    // like a tool that does not exist; a huge limit is bounded.
    let got = search(
        s,
        &token,
        &sid,
        json!({"query": "low", "limit": 1_000_000_000u64}),
    );
    assert_eq!(found_names(&got), ["risky__lo"], "{got}");
    let got = search(
        s,
        &token,
        &sid,
        json!({"query": "plain risky tool", "limit": 50}),
    );
    let names = found_names(&got);
    assert!(!names.iter().any(|n| n.contains("plain")), "{names:?}");
    assert_eq!(names.len(), 4, "{names:?}");
    let plain = call_tool(s, &token, FOUND, &sid, "risky__plain", json!({}));
    assert_eq!(
        plain["error"]["message"], "Unknown tool: risky__plain",
        "{plain}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.dir().join("ran-plain")).unwrap(),
        "",
        "the denied tool never ran"
    );

    // Hostile arguments: a readable tool error each, and the session goes on.
    for (args, says) in [
        (json!({"query": "x".repeat(64 * 1024)}), "at most 512"),
        (json!({"query": 7}), "must be a string"),
        (json!({"query": {"$ne": 1}}), "must be a string"),
        (json!({"query": "%%% ;;;"}), "holds no word"),
        (json!({"query": "low", "limit": -5}), "whole number"),
        (json!({"query": "low", "limit": "all"}), "whole number"),
        (json!({}), "needs a \"query\""),
        (json!({"query": "low", "sql": "drop"}), "no argument"),
    ] {
        let got = search(s, &token, &sid, args);
        assert_eq!(got["isError"], true, "{got}");
        let text = got["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(says), "{says:?} in {text}");
        assert!(text.len() < 400, "{text}");
    }
    let got = search(s, &token, &sid, json!({"query": "critical"}));
    assert_eq!(found_names(&got), ["risky__crit"]);
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");

    // The session outlives serve: rebuilt from the state store, it still
    // lists what its searches found (the broad search found all four).
    let serve = Serve::start(&ws, "127.0.0.1:0");
    assert_eq!(
        tool_names(&serve, &token, FOUND, &sid),
        [
            "search_tools",
            "risky__crit",
            "risky__hi",
            "risky__lo",
            "risky__med"
        ]
    );
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}
