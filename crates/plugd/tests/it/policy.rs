//! Per-tool policy (issue 28) with real processes: plugd.yaml's `policy:`
//! rules over the `risky` Python plugin of `risk.rs` and a real `plugd
//! serve`: a `deny` for one token hides a tool from its `tools/list` on
//! `/mcp` and `GET /v1/tools` and refuses its calls like an unknown tool
//! while another token still sees and calls it; a `require_approval` on an
//! argument makes the call wait in `GET /v1/approvals`; `plugd policy
//! check` explains both; a rule that does not compile refuses the config.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::gateway::{initialize, mcp_post};
use crate::http::{Serve, request_as};
use crate::risk::{runs, workspace};
use crate::support::{Ws, eventually_blocking, plugd_cmd, stderr, stdout};

const POLICY: &str = r#"policy:
  - name: no-lo-for-interns
    when: 'caller.token == "intern" && tool.name == "risky/lo"'
    effect: deny
  - name: etc-needs-approval
    when: 'tool.name == "risky/plain" && args.path.startsWith("/etc")'
    effect: require_approval
"#;

/// A token named `name` of role `agent`; its secret.
fn named_token(ws: &Ws, name: &str) -> String {
    let out = plugd_cmd(ws.dir())
        .args([
            "token", "create", "--name", name, "--role", "agent", "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "token create: {}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["token"].as_str().unwrap().to_owned()
}

fn invoke(serve: &Serve, token: &str, tool: &str, args: Value) -> crate::http::Resp {
    request_as(
        serve,
        token,
        "POST",
        &format!("/v1/tools/{tool}:invoke"),
        &[("Content-Type", "application/json")],
        Some(json!({ "args": args }).to_string().as_bytes()),
    )
}

fn listed(serve: &Serve, token: &str) -> Vec<String> {
    let r = request_as(serve, token, "GET", "/v1/tools", &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// An MCP session of `token`; its id.
fn mcp_session(serve: &Serve, token: &str) -> String {
    let r = mcp_post(serve, token, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("mcp-session-id").unwrap().to_owned()
}

fn mcp_tools(serve: &Serve, token: &str, sid: &str) -> Vec<String> {
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let r = mcp_post(serve, token, "/mcp", Some(sid), &list);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

fn mcp_call(serve: &Serve, token: &str, sid: &str, name: &str) -> Value {
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": name, "arguments": {}}});
    let r = mcp_post(serve, token, "/mcp", Some(sid), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn a_deny_rule_hides_a_tool_from_one_token_on_every_surface() {
    let ws = workspace(POLICY);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let intern = named_token(&ws, "intern");
    let ops = named_token(&ws, "ops");

    // GET /v1/tools.
    let seen = listed(&serve, &ops);
    assert!(seen.contains(&"risky/lo".to_owned()), "{seen:?}");
    let hidden = listed(&serve, &intern);
    assert!(!hidden.contains(&"risky/lo".to_owned()), "{hidden:?}");
    assert_eq!(hidden.len() + 1, seen.len(), "{hidden:?} {seen:?}");

    // HTTP invoke: refused exactly like an unknown tool; ops still calls it.
    let unknown = invoke(&serve, &intern, "risky/nope", json!({}));
    let denied = invoke(&serve, &intern, "risky/lo", json!({}));
    assert_eq!(denied.status, unknown.status, "{}", denied.text());
    assert_eq!(
        denied.json()["error"]["code"],
        unknown.json()["error"]["code"],
        "{}",
        denied.text()
    );
    assert_eq!(runs(&ws, "lo"), 0);
    let r = invoke(&serve, &ops, "risky/lo", json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(runs(&ws, "lo"), 1);

    // /mcp: absent from tools/list, its call answered as an unknown tool.
    let (s_ops, s_intern) = (mcp_session(&serve, &ops), mcp_session(&serve, &intern));
    let all = mcp_tools(&serve, &ops, &s_ops);
    let fewer = mcp_tools(&serve, &intern, &s_intern);
    let gone: Vec<&String> = all.iter().filter(|n| !fewer.contains(n)).collect();
    assert_eq!(gone.len(), 1, "{all:?} {fewer:?}");
    let name = gone[0].clone();
    let v = mcp_call(&serve, &intern, &s_intern, &name);
    let nope = mcp_call(&serve, &intern, &s_intern, "risky_nope");
    assert_eq!(v["error"]["code"], nope["error"]["code"], "{v} {nope}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Unknown tool")),
        "{v}"
    );
    assert_eq!(runs(&ws, "lo"), 1);
    let v = mcp_call(&serve, &ops, &s_ops, &name);
    assert!(v["result"].is_object(), "{v}");
    assert_eq!(runs(&ws, "lo"), 2);

    // The refused HTTP call's record names the rule.
    let mut rows = Vec::new();
    let written = eventually_blocking(Duration::from_secs(10), || {
        rows = serve.get("/v1/invocations?limit=100").json()["invocations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        rows.iter()
            .any(|r| r["tool"] == "risky/lo" && r["caller"] == "token:intern")
    });
    assert!(written, "{rows:#?}");
    let row = rows
        .iter()
        .find(|r| r["tool"] == "risky/lo" && r["caller"] == "token:intern")
        .unwrap();
    assert_eq!(
        row["payload"]["decisions"][0],
        json!({"kind": "policy", "rule": "no-lo-for-interns", "effect": "deny", "decision": "refused"}),
        "{row}"
    );

    // `plugd policy check` explains it (offline, beside serve).
    let out = ws.plugd(&["policy", "check", "--as", "token:intern", "risky/lo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("1. no-lo-for-interns [deny]: matched")
            && text.contains("decision: deny by rule \"no-lo-for-interns\""),
        "{text}"
    );
    let out = ws.plugd(&["policy", "check", "--as", "token:ops", "risky/lo", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["rule"], &v["effect"]),
        (&Value::Null, &json!("allow")),
        "{v}"
    );
    assert_eq!(v["rules"][0]["outcome"], "not matched", "{v}");
}

#[test]
fn a_require_approval_rule_on_arguments_waits_for_an_operator() {
    let ws = workspace(POLICY);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let ops = named_token(&ws, "ops");
    // Listing cannot see the arguments: the tool is listed.
    assert!(listed(&serve, &ops).contains(&"risky/plain".to_owned()));
    // Other arguments run at once (the rule errors without `path`, or is false).
    let r = invoke(&serve, &ops, "risky/plain", json!({"path": "/tmp/x"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = invoke(&serve, &ops, "risky/plain", json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(runs(&ws, "plain"), 2);
    std::thread::scope(|scope| {
        let call =
            scope.spawn(|| invoke(&serve, &ops, "risky/plain", json!({"path": "/etc/passwd"})));
        let end = Instant::now() + Duration::from_secs(30);
        let a = loop {
            let v = serve.get("/v1/approvals").json();
            if let Some(a) = v.as_array().and_then(|a| a.first()) {
                break a.clone();
            }
            assert!(Instant::now() < end, "nothing pending: {v}");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            (&a["tool"], &a["caller"]),
            (&json!("risky/plain"), &json!("token:ops")),
            "{a}"
        );
        assert_eq!(runs(&ws, "plain"), 2, "nothing runs while it waits");
        let id = a["id"].as_str().unwrap().to_owned();
        let r = serve.post(&format!("/v1/approvals/{id}:approve"), &json!({}));
        assert_eq!(r.status, 200, "{:?}", r.json());
        let done = call.join().unwrap();
        assert_eq!(done.status, 200, "{}", done.text());
        assert_eq!(runs(&ws, "plain"), 3);
    });
    let mut rows = Vec::new();
    let written = eventually_blocking(Duration::from_secs(10), || {
        rows = serve.get("/v1/invocations?limit=100").json()["invocations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        rows.iter().any(|r| !r["payload"]["decisions"].is_null())
    });
    assert!(written, "{rows:#?}");
    let row = rows
        .iter()
        .find(|r| !r["payload"]["decisions"].is_null())
        .unwrap();
    assert_eq!(
        row["payload"]["decisions"][0],
        json!({"kind": "policy", "rule": "etc-needs-approval", "effect": "require_approval", "decision": "approved"}),
        "{row}"
    );
    assert_eq!(row["payload"]["decisions"][1]["kind"], "approval", "{row}");

    // `plugd policy check` with the arguments names the rule; without them
    // (listing) the rule errors and does not decide.
    let args = r#"{"path": "/etc/shadow"}"#;
    let out = ws.plugd(&[
        "policy",
        "check",
        "--as",
        "token:ops",
        "risky/plain",
        "--args",
        args,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("decision: require_approval by rule \"etc-needs-approval\""),
        "{text}"
    );
    let out = ws.plugd(&["policy", "check", "--as", "token:ops", "risky/plain"]);
    let text = stdout(&out);
    assert!(
        text.contains("2. etc-needs-approval [require_approval]: error (counts as not matching)")
            && text.contains("decision: allow (no rule matched)"),
        "{text}"
    );
}

#[test]
fn a_rule_that_does_not_compile_refuses_the_config() {
    let bad = "policy:\n  - name: broken-rule\n    when: 'caller.token == '\n    effect: deny\n";
    let ws = workspace("");
    std::fs::write(ws.dir().join("plugd.yaml"), bad).unwrap();
    // The CLI.
    let out = ws.plugd(&["policy", "check", "--as", "token:x", "risky/lo"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("policy rule \"broken-rule\"") && err.contains("does not compile as CEL"),
        "{err}"
    );
    // serve refuses to start.
    let mut child = plugd_cmd(ws.dir())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            child.kill().unwrap();
            panic!("serve started with a policy that does not compile");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success());
    assert!(err.contains("broken-rule"), "{err}");
}

#[test]
fn a_live_change_with_a_bad_rule_is_refused_and_a_new_deny_applies_at_once() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let intern = named_token(&ws, "intern");
    assert!(listed(&serve, &intern).contains(&"risky/lo".to_owned()));
    // A rule that does not compile: the policy in force stays, the log names the rule.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "policy:\n  - name: broken-live\n    when: 'tool.name =='\n    effect: deny\n",
    )
    .unwrap();
    assert!(
        eventually_blocking(Duration::from_secs(20), || serve
            .log_text()
            .contains("broken-live")),
        "{}",
        serve.log_text()
    );
    assert!(listed(&serve, &intern).contains(&"risky/lo".to_owned()));
    // Adding a deny narrows: in force without an approval.
    std::fs::write(ws.dir().join("plugd.yaml"), POLICY).unwrap();
    assert!(
        eventually_blocking(Duration::from_secs(20), || !listed(&serve, &intern)
            .contains(&"risky/lo".to_owned())),
        "{}",
        serve.log_text()
    );
    // Removing it widens: held for an administrator, still in force.
    std::fs::write(ws.dir().join("plugd.yaml"), "").unwrap();
    assert!(
        eventually_blocking(Duration::from_secs(20), || serve
            .log_text()
            .contains("policy: rules removed")),
        "{}",
        serve.log_text()
    );
    assert!(!listed(&serve, &intern).contains(&"risky/lo".to_owned()));
}

#[test]
fn the_agent_does_not_get_a_denied_tool_and_its_call_is_an_unknown_tool() {
    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    let out = ws.plugd(&["plugin", "approve", "tk"]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
    std::fs::create_dir_all(ws.dir().join("scripts")).unwrap();
    let steps = json!([
        {"tool_calls": [
            {"name": "tk_fail", "arguments": {"code": -32000, "message": "disk on fire"}},
            {"name": "no_such_tool", "arguments": {}}
        ]},
        {"text": "I could not do it."}
    ]);
    std::fs::write(
        ws.dir().join("scripts/test.yaml"),
        json!({ "steps": steps }).to_string(),
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm:\n  provider: scripted\n  script: \"${{workspace_dir}}/scripts/test.yaml\"\n\
         policy:\n  - name: no-fail\n    when: 'tool.plugin == \"tk\" && tool.name.endsWith(\"fail\")'\n    effect: deny\n",
    )
    .unwrap();
    let out = ws.plugd(&["run", "--json", "try", "--session", "p1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let calls = v["tool_calls"].as_array().unwrap();
    let (denied, unknown) = (
        calls[0]["result"].as_str().unwrap(),
        calls[1]["result"].as_str().unwrap(),
    );
    assert_eq!(calls[0]["ok"], false, "{v}");
    assert!(!denied.contains("disk on fire"), "the tool never ran: {v}");
    assert_eq!(
        denied.replace("tk_fail", "X"),
        unknown.replace("no_such_tool", "X"),
        "{v}"
    );
}

/// A rule on `caller.role` hides at list time what it refuses at call
/// time: `GET /v1/tools` and `/mcp` `tools/list` evaluate it with the
/// token's role, as `:invoke` and `tools/call` do.
#[test]
fn a_rule_on_the_role_hides_the_tool_it_refuses() {
    let ws = workspace(
        r#"policy:
  - name: agents-keep-off-lo
    when: 'caller.role == "agent" && tool.name == "risky/lo"'
    effect: deny
"#,
    );
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = named_token(&ws, "bot");
    let listed_http = listed(&serve, &agent);
    assert!(
        !listed_http.contains(&"risky/lo".to_owned()),
        "{listed_http:?}"
    );
    assert!(
        listed_http.contains(&"risky/plain".to_owned()),
        "{listed_http:?}"
    );
    let sid = mcp_session(&serve, &agent);
    let names = mcp_tools(&serve, &agent, &sid);
    assert!(!names.iter().any(|n| n.ends_with("lo")), "{names:?}");
    assert!(!names.is_empty(), "{names:?}");
    let r = invoke(&serve, &agent, "risky/lo", json!({}));
    assert_eq!(r.json()["error"]["code"], "unknown_tool", "{}", r.text());
    assert_eq!(runs(&ws, "lo"), 0);
    // The admin (another role) still sees it.
    let admin = serve.get("/v1/tools").json();
    assert!(
        admin
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "risky/lo"),
        "{admin}"
    );
}
