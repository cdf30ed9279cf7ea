//! Sessions, chains and runs (seed 003) with real processes and sockets:
//! the example harness `acme/threads/triage` acting through its delegated
//! token (allowed and refused scopes, a child run), a token used after its
//! invocation ended, a long session compacted by the example compactor into
//! a derived chain with a durable `chain.compacted` delivery, and the
//! canonical API's refusals (wrong scope, other org, compacted chain,
//! malformed blocks).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{Serve, make_token, request_as};
use crate::support::{Ws, copy_dir, eventually_blocking, repo, stderr, stdout};

/// A workspace with the example package `acme/threads` approved.
fn threads_ws(plugd_yaml: &str) -> Ws {
    let ws = Ws::new();
    copy_dir(
        &repo().join("examples/workspace/.plugins/acme-threads"),
        &ws.plugin_dir("acme-threads"),
    );
    std::fs::write(ws.dir().join("plugd.yaml"), plugd_yaml).unwrap();
    let out = ws.plugd(&["plugin", "approve", "acme/threads"]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
    ws
}

/// One HTTP/1.1 request to `addr` with a bearer token; status and JSON body.
fn call(
    addr: SocketAddr,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let payload = body.map(Value::to_string).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n"
    );
    if body.is_some() {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            payload.len()
        ));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(payload.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // Chunked bodies: take the JSON between the first '{' and the last '}'.
    let json = match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) if b > a => serde_json::from_str(&body[a..=b]).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    (status, json)
}

#[test]
fn a_harness_acts_only_through_its_delegated_token() {
    let ws = threads_ws("# the example harness reaches plugd's API on loopback\n");
    let out = ws.plugd(&[
        "run",
        "--harness",
        "acme/threads/triage",
        "--session",
        "bug-42",
        "--input",
        "fix the login redirect",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "harness run: {}\n{}",
        stderr(&out),
        stdout(&out)
    );
    let run: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["kind"], "harness");
    assert_eq!(run["harness"], "acme/threads/triage");
    // Its events reached the caller as progress.
    let err = stderr(&out);
    assert!(err.contains("[progress] reading session bug-42"), "{err}");
    // It read and appended through the API: three blocks on the head chain.
    let chain = run["chain_id"].as_str().unwrap();
    let shown = ws.plugd(&["chain", "show", chain, "--json"]);
    let chain_json: Value = serde_json::from_str(&stdout(&shown)).unwrap();
    let blocks = chain_json["blocks"].as_array().unwrap();
    let kinds: Vec<&str> = blocks.iter().map(|b| b["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["input", "output", "output"]);
    assert_eq!(blocks[1]["open_task"], true);
    assert!(
        blocks[0]["created_by"]
            .as_str()
            .unwrap()
            .starts_with("delegated:acme/threads/triage:inv_")
    );
    // It started a child run below its own, within its policy.
    let runs = ws.plugd(&["run", "list", "--session", "bug-42", "--json"]);
    let runs: Value = serde_json::from_str(&stdout(&runs)).unwrap();
    let child = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["parent_run_id"] == run["id"])
        .expect("a child run")
        .clone();
    assert_eq!(child["depth"], 1);
    assert_eq!(child["status"], "succeeded");
    assert_eq!(run["checkpoint"]["data"]["child_run"], child["id"]);
    // A scope it was not granted was refused, naming the scope.
    let note = &run["artifacts"][0];
    assert_eq!(note["status"], 403, "{note}");
    assert!(
        note["message"]
            .as_str()
            .unwrap()
            .contains("needs the scope compactions:write")
    );
    // The token is in no record plugd keeps.
    let db = ws.state_bytes();
    assert!(
        !String::from_utf8_lossy(&db).contains("vai_dlg_"),
        "a token in the state store"
    );
    // `continue` is in this harness's supports; a bogus mode is refused.
    let again = ws.plugd(&[
        "run",
        "--harness",
        "acme/threads/triage",
        "--session",
        "bug-42",
        "--mode",
        "continue",
        "--input",
        "and the logout",
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("4 blocks read") || stdout(&again).contains("3 blocks read"),
        "{}",
        stdout(&again)
    );
    let bogus = ws.plugd(&[
        "run",
        "--harness",
        "acme/threads/triage",
        "--session",
        "bug-42",
        "--mode",
        "restart",
    ]);
    assert!(!bogus.status.success());
    assert!(
        stderr(&bogus).contains("not start or continue"),
        "{}",
        stderr(&bogus)
    );
    let shown = ws.plugd(&["session", "show", "bug-42"]);
    assert!(stdout(&shown).contains("(head)"), "{}", stdout(&shown));
    // plugin show names each harness's fidelity and supports, and the scopes.
    let show = stdout(&ws.plugd(&["plugin", "show", "acme/threads"]));
    assert!(
        show.contains("harness: fidelity=checkpoint supports=[continue]"),
        "{show}"
    );
    assert!(
        show.contains("delegated scopes: sessions:read, chains:read, chains:write, runs:write"),
        "{show}"
    );
}

#[test]
fn a_delegation_token_dies_with_its_invocation_and_reaches_only_its_scopes() {
    let ws = Ws::new();
    copy_dir(
        &repo().join("tests/plugins/chains/leaky"),
        &ws.plugin_dir("leaky"),
    );
    ws.unsandbox(
        &["test/leaky"],
        "the fixture writes what it saw to a file the test names",
    );
    let out = ws.plugd(&["plugin", "approve", "test/leaky"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // Outside the workspace: the containment baseline keeps plugins out of it.
    let out_dir = tempfile::tempdir().unwrap();
    let seen_file = out_dir.path().join("seen.json");
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "leak-1", "harness": "test/leaky/leak", "input": seen_file.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let run = r.json();
    assert_eq!(run["status"], "succeeded", "{run}");
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&seen_file).unwrap()).unwrap();
    // Granted: what it asked for that plugd knows; the rest left out.
    assert_eq!(seen["scopes"], json!(["chains:read"]));
    assert_eq!(seen["context"]["run_id"], run["id"]);
    assert_eq!(seen["context"]["session_id"], "leak-1");
    assert_eq!(seen["read_chain"], 200);
    assert_eq!(seen["append"], 403, "chains:write was not granted");
    assert_eq!(seen["tools"], 403, "no other route is open to it");
    assert_eq!(
        seen["other_session"], 403,
        "outside its invocation, existing or not"
    );
    // After the invocation: the same token is refused everywhere.
    let token = seen["token"].as_str().unwrap();
    assert!(token.starts_with("vai_dlg_") && token.len() == 72);
    let base: SocketAddr = seen["base_url"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let chain = seen["context"]["chain_id"].as_str().unwrap();
    let (status, body) = call(base, token, "GET", &format!("/v1/chains/{chain}"), None);
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invocation ended"),
        "{body}"
    );
    let late = request_as(
        &serve,
        token,
        "GET",
        &format!("/v1/chains/{chain}"),
        &[],
        None,
    );
    assert_eq!(late.status, 401);
    // Forged tokens: same answer.
    for forged in ["vai_dlg_", "vai_dlg_00", &format!("{}0", &token[..71])] {
        assert_eq!(
            call(base, forged, "GET", "/v1/sessions", None).0,
            401,
            "{forged}"
        );
    }
    // A harness's child runs stop at its policy's max_child_runs; it cannot
    // hang runs below another run.
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "leak-2", "harness": "test/leaky/greedy",
                "input": out_dir.path().join("child.json").display().to_string(),
                "policy": {"max_depth": 2, "max_child_runs": 4, "allow_compaction": false}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let greedy = r.json();
    // First a child harness (one of the four), then external children.
    assert_eq!(greedy["artifacts"][0]["child_harness"], 201, "{greedy}");
    assert_eq!(
        greedy["artifacts"][0]["statuses"],
        json!([201, 201, 201, 403]),
        "{greedy}"
    );
    assert_eq!(greedy["artifacts"][0]["other_parent"], 403);
    // The child harness got no token: its own scope (chains:read) is not
    // among its parent's (runs:write, runs:read).
    let child: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("child.json")).unwrap())
            .unwrap();
    assert_eq!(child, json!({"token": null, "scopes": []}), "{child}");
    // A lying harness and a silent one end their runs as failed, never running.
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "leak-3", "harness": "test/leaky/liar"}),
    );
    let liar = r.json();
    assert_eq!(liar["status"], "failed", "{liar}");
    assert!(
        liar["error"]
            .as_str()
            .unwrap()
            .contains("unknown status \"exploded\""),
        "{liar}"
    );
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "leak-3", "harness": "test/leaky/sleepy"}),
    );
    let sleepy = r.json();
    assert_eq!(sleepy["status"], "retryable_failure", "{sleepy}");
    assert!(sleepy["ended_at"].is_string());
    // The token the plugin printed is hidden in its logs.
    let logs = serve.get("/v1/plugins/test/leaky/logs");
    assert!(
        logs.text().contains("my token is vai_dlg_••••"),
        "{}",
        logs.text()
    );
    assert!(
        !logs.text().contains(&token[8..]),
        "the token in the log ring"
    );
}

#[test]
fn the_canonical_api_checks_scope_shape_and_lineage() {
    let ws = threads_ws("# nothing to configure\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // Sessions appear as turns or runs create them; an external run makes one.
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "s-api", "input": "by hand"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let run = r.json();
    assert_eq!(run["kind"], "external");
    let chain = run["chain_id"].as_str().unwrap().to_owned();
    let ok = serve.post(
        &format!("/v1/chains/{chain}/blocks"),
        &json!({"blocks": [{"kind": "system", "content": "be brief"}, {"kind": "input", "content": [{"type": "text", "text": "hi"}], "pinned": true}]}),
    );
    assert_eq!(ok.status, 201, "{}", ok.text());
    assert_eq!(ok.json()["seqs"], json!([1, 2]));
    for (bad, why) in [
        (json!({"blocks": []}), "send 1 to"),
        (json!({"blocks": [{"kind": "sermon"}]}), "not one of"),
        (
            json!({"blocks": [{"kind": "input", "seq": 9}]}),
            "set by plugd",
        ),
        (
            json!({"blocks": [{"kind": "input", "content": "x".repeat(300_000)}]}),
            "the limit is",
        ),
        (json!({"blocks": "no"}), ""),
    ] {
        let r = serve.post(&format!("/v1/chains/{chain}/blocks"), &bad);
        assert!(
            r.status == 400 || r.status == 413 || r.status == 422,
            "{bad}: {} {}",
            r.status,
            r.text()
        );
        assert!(r.text().contains(why), "{}", r.text());
    }
    let missing = serve.post(
        "/v1/chains/ch_nope/blocks",
        &json!({"blocks": [{"kind": "input"}]}),
    );
    assert_eq!(missing.status, 404);
    // PATCH ends the run once.
    let patched = request_as(
        &serve,
        &serve.token,
        "PATCH",
        &format!("/v1/runs/{}", run["id"].as_str().unwrap()),
        &[("Content-Type", "application/json")],
        Some(br#"{"status": "succeeded", "summary": {"text": "done"}}"#),
    );
    assert_eq!(patched.status, 200, "{}", patched.text());
    assert_eq!(patched.json()["status"], "succeeded");
    let bad_status = request_as(
        &serve,
        &serve.token,
        "PATCH",
        &format!("/v1/runs/{}", run["id"].as_str().unwrap()),
        &[("Content-Type", "application/json")],
        Some(br#"{"status": "exploded"}"#),
    );
    assert_eq!(bad_status.status, 400);
    // A viewer reads but does not write; an org token sees no workspace session.
    let viewer = make_token(&ws, "viewer");
    assert_eq!(
        request_as(&serve, &viewer, "GET", "/v1/sessions/s-api", &[], None).status,
        200
    );
    let w = request_as(
        &serve,
        &viewer,
        "POST",
        &format!("/v1/chains/{chain}/blocks"),
        &[("Content-Type", "application/json")],
        Some(br#"{"blocks": [{"kind": "input"}]}"#),
    );
    assert_eq!(w.status, 403);
    let org = ws.plugd(&[
        "token", "create", "--name", "acme-t", "--role", "agent", "--org", "acme", "--json",
    ]);
    assert!(org.status.success(), "{}", stderr(&org));
    let org: Value = serde_json::from_str(&stdout(&org)).unwrap();
    let org = org["token"].as_str().unwrap();
    assert_eq!(
        request_as(&serve, org, "GET", "/v1/sessions/s-api", &[], None).status,
        404
    );
    assert_eq!(
        request_as(
            &serve,
            org,
            "GET",
            &format!("/v1/chains/{chain}"),
            &[],
            None
        )
        .status,
        404
    );
    let list = request_as(&serve, org, "GET", "/v1/sessions", &[], None).json();
    assert_eq!(list["sessions"], json!([]));
    // It records runs in its own org, and starts no workspace harness.
    let own = request_as(
        &serve,
        org,
        "POST",
        "/v1/runs",
        &[("Content-Type", "application/json")],
        Some(br#"{"session_id": "acme-1", "input": "by the org"}"#),
    );
    assert_eq!(own.status, 201, "{}", own.text());
    let seen = request_as(&serve, org, "GET", "/v1/sessions/acme-1", &[], None).json();
    assert_eq!(seen["org_id"], "acme");
    assert_eq!(serve.get("/v1/sessions/acme-1").json()["org_id"], "acme");
    let run = request_as(
        &serve,
        org,
        "POST",
        "/v1/runs",
        &[("Content-Type", "application/json")],
        Some(br#"{"session_id": "acme-1", "harness": "acme/threads/triage"}"#),
    );
    assert_eq!(run.status, 403, "{}", run.text());
    assert!(run.text().contains("workspace plugin"), "{}", run.text());
    // A session's view: its chains and the transcript of its head.
    let s = serve.get("/v1/sessions/s-api").json();
    assert_eq!(s["head_chain_id"], chain.as_str());
    assert_eq!(s["chains"][0]["blocks"], 2);
    assert_eq!(s["transcript"][1]["role"], "user");
    // A harness run streamed: its events as progress, then the run.
    let body =
        json!({"session_id": "s-sse", "harness": "acme/threads/triage", "input": "stream it"});
    let sse = request_as(
        &serve,
        &serve.token,
        "POST",
        "/v1/runs",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "text/event-stream"),
        ],
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(sse.status, 200, "{}", sse.text());
    let text = sse.text();
    let progress = text.find("event: progress").expect("progress events");
    let end = text.find("event: run").expect("the run at the end");
    assert!(
        progress < end && text.contains("\"status\":\"succeeded\""),
        "{text}"
    );
    assert!(text.contains("reading session s-sse"), "{text}");
    // Unknown harness, wrong kind: refused before anything runs.
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "s-x", "harness": "acme/threads/nope"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "s-x", "harness": "acme/threads/sliding_window"}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains("is a compactor, not a harness"),
        "{}",
        r.text()
    );
    // Compaction needs a configured compactor.
    let c = serve.post("/v1/compactions", &json!({"session_id": "s-api"}));
    assert_eq!(c.status, 409, "{}", c.text());
    assert!(c.text().contains("agent.compactor"));
}

#[test]
fn a_long_session_is_compacted_into_a_derived_chain_and_hooks_hear_of_it() {
    let mut steps = String::from("steps:\n");
    for i in 0..30 {
        steps.push_str(&format!(
            "  - text: \"answer {i}: the quick brown fox jumps over the lazy dog again and again\"\n"
        ));
    }
    let ws = threads_ws(
        "llm:\n  provider: scripted\n  script: \"${{workspace_dir}}/steps.yaml\"\nagent:\n  compactor:\n    export: acme/threads/sliding_window\n    max_input_tokens: 200\n    on_failure: fail\n",
    );
    std::fs::write(ws.dir().join("steps.yaml"), steps).unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let mut compacted = None;
    for i in 0..12 {
        let r = serve.post(
            "/v1/sessions/long-1/messages",
            &json!({"text": format!("question {i}: what did the fox do this time, in detail?")}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let outcome = r.json();
        if let Some(c) = outcome["compaction_id"].as_str() {
            compacted = Some((c.to_owned(), outcome));
            break;
        }
    }
    let (compaction, outcome) =
        compacted.expect("the session outgrew 200 tokens and was compacted");
    assert!(
        outcome["notices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["code"] == "CHAIN_COMPACTED")
    );
    let s = serve.get("/v1/sessions/long-1").json();
    let chains = s["chains"].as_array().unwrap();
    assert_eq!(chains.len(), 2, "{s}");
    let (source, derived) = (&chains[0], &chains[1]);
    assert_eq!(source["status"], "superseded");
    assert_eq!(derived["parent_chain_id"], source["id"]);
    assert_eq!(derived["compaction_id"], compaction.as_str());
    assert_eq!(s["head_chain_id"], derived["id"]);
    assert_eq!(
        outcome["chain_id"], derived["id"],
        "the turn went on on the derived chain"
    );
    // The source was never rewritten; the derived chain starts with the seed.
    let src = serve
        .get(&format!("/v1/chains/{}", source["id"].as_str().unwrap()))
        .json();
    let dst = serve
        .get(&format!("/v1/chains/{}", derived["id"].as_str().unwrap()))
        .json();
    let seeded = dst["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| {
            b["created_by"]
                .as_str()
                .unwrap_or("")
                .starts_with("compactor:")
        })
        .count();
    assert!(
        seeded > 0 && src["blocks"].as_array().unwrap().len() > seeded,
        "{src}\n{dst}"
    );
    let seed_summary = dst["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["summary_of"].is_number())
        .expect("the compactor's summary block");
    assert!(
        seed_summary["created_by"]
            .as_str()
            .unwrap()
            .starts_with("compactor:acme/threads/sliding_window")
    );
    // Written by the configured (scripted) model through llm:complete.
    let summary_text = seed_summary["content"][0]["text"].as_str().unwrap();
    assert!(
        summary_text.contains("summarised by the model): answer"),
        "{summary_text}"
    );
    let list = serve.get("/v1/sessions/long-1/compactions").json();
    assert_eq!(list["compactions"][0]["id"], compaction.as_str());
    assert_eq!(list["compactions"][0]["derived_chain_id"], derived["id"]);
    // Appending to the superseded chain is refused.
    let stale = serve.post(
        &format!("/v1/chains/{}/blocks", source["id"].as_str().unwrap()),
        &json!({"blocks": [{"kind": "input", "content": "late"}]}),
    );
    assert_eq!(stale.status, 409, "{}", stale.text());
    // The durable chain.compacted event reached the subscribed hook.
    let delivered = eventually_blocking(Duration::from_secs(20), || {
        let out = ws.plugd(&["outbox", "list", "--json"]);
        let rows: Value = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
        rows.as_array().is_some_and(|r| {
            r.iter()
                .any(|d| d["event_type"] == "chain.compacted" && d["status"] == "delivered")
        })
    });
    assert!(
        delivered,
        "{}",
        stdout(&ws.plugd(&["outbox", "list", "--json"]))
    );
    let logs = serve.get("/v1/plugins/acme/threads/logs").text();
    assert!(logs.contains("notify: chain.compacted"), "{logs}");
}

#[test]
fn an_installed_package_serves_as_harness_and_compactor() {
    let mut steps = String::from("steps:\n");
    for i in 0..20 {
        steps.push_str(&format!(
            "  - text: \"reply {i}: a fairly long answer so that the chain grows past its small budget\"\n"
        ));
    }
    let ws = Ws::new();
    std::fs::write(ws.dir().join("steps.yaml"), steps).unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm:\n  provider: scripted\n  script: \"${{workspace_dir}}/steps.yaml\"\nagent:\n  compactor:\n    export: acme/threads/sliding_window\n    max_input_tokens: 150\n    on_failure: fail\n",
    )
    .unwrap();
    // Installed from its directory (no registry), not a workspace plugin.
    let src = repo().join("examples/workspace/.plugins/acme-threads");
    let out = ws.plugd(&["package", "install", src.to_str().unwrap()]);
    assert!(out.status.success(), "install: {}", stderr(&out));
    assert!(!ws.plugin_dir("acme-threads").exists());
    let out = ws.plugd(&[
        "run",
        "--harness",
        "acme/threads/triage",
        "--session",
        "pkg-1",
        "--input",
        "from the package",
        "--json",
    ]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), stdout(&out));
    let run: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(
        run["artifacts"][0]["status"], 403,
        "its token still has only its scopes"
    );
    // Turns until the installed compactor derives a chain.
    let mut compacted = false;
    for i in 0..10 {
        let out = ws.plugd(&[
            "run",
            &format!("question {i} about the package, in some detail please"),
            "--session",
            "pkg-1",
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let outcome: Value = serde_json::from_str(&stdout(&out)).unwrap();
        if outcome["compaction_id"].is_string() {
            compacted = true;
            break;
        }
    }
    assert!(compacted, "the installed compactor never ran");
    let shown: Value =
        serde_json::from_str(&stdout(&ws.plugd(&["session", "show", "pkg-1", "--json"]))).unwrap();
    assert_eq!(
        shown["compactions"][0]["compactor"],
        "acme/threads/sliding_window"
    );
    assert_eq!(shown["compactions"][0]["status"], "succeeded");
    assert_eq!(shown["chains"].as_array().unwrap().len(), 2, "{shown}");
}

#[test]
fn a_delegation_token_stays_in_its_invocations_session_chain_and_run() {
    let ws = Ws::new();
    copy_dir(
        &repo().join("tests/plugins/chains/leaky"),
        &ws.plugin_dir("leaky"),
    );
    ws.unsandbox(
        &["test/leaky"],
        "the fixture writes what it saw to a file the test names",
    );
    let out = ws.plugd(&["plugin", "approve", "test/leaky"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // Session B, with a chain and a run, is someone else's.
    let r = serve.post("/v1/runs", &json!({"session_id": "sess-b", "input": "b's"}));
    assert_eq!(r.status, 201, "{}", r.text());
    let b = r.json();
    let b_chain = b["chain_id"].as_str().unwrap().to_owned();
    let b_run = b["id"].as_str().unwrap().to_owned();
    let b_blocks = || serve.get(&format!("/v1/chains/{b_chain}")).json()["blocks"].clone();
    let before = b_blocks();
    // The harness runs in session A with every chain/run scope.
    let out_dir = tempfile::tempdir().unwrap();
    let seen_file = out_dir.path().join("nosy.json");
    let input = format!("{}\nsess-b\n{b_chain}\n{b_run}", seen_file.display());
    let r = serve.post(
        "/v1/runs",
        &json!({"session_id": "sess-a", "harness": "test/leaky/nosy", "input": input}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["status"], "succeeded", "{}", r.text());
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&seen_file).unwrap()).unwrap();
    // Its own session, chain and run: open.
    for (what, status) in [
        ("own_session", 200),
        ("own_chain", 200),
        ("own_append", 201),
        ("own_runs", 200),
        ("own_run", 200),
        ("own_child", 201),
    ] {
        assert_eq!(seen[what], status, "{what}: {seen}");
    }
    // Session B, its chain and its run: 403, reading as writing; and a
    // record that does not exist answers the same (no existence oracle).
    for what in [
        "other_session",
        "other_compactions",
        "other_chain",
        "other_blocks",
        "other_append",
        "other_runs",
        "other_run",
        "other_run_patch",
        "other_run_create",
        "missing_chain",
    ] {
        assert_eq!(seen[what], 403, "{what}: {seen}");
    }
    // Nothing reached B.
    assert_eq!(b_blocks(), before);
    let b_now = serve.get(&format!("/v1/runs/{b_run}")).json();
    assert_eq!(b_now["status"], "running", "{b_now}");
    let runs = serve.get("/v1/runs?session_id=sess-b").json();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
}
