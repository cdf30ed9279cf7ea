//! OpenID Connect identities acting for an org (issue 28), against the real
//! provider of `oauth.rs` (`tests/fixtures/oidc/provider.mjs`) and the real
//! packages and bindings of `binding_calls.rs`: a group that
//! `auth.role_mapping` maps to an org (erin) and an `org` claim the issuer's
//! `org_claim` names (frank) give exactly that org's catalog on `/mcp` and
//! `GET /v1/tools`, its calls and its records, never another org's; an org
//! claim naming an org plugd does not know (gina), or one that is not an
//! id, is refused (`403`, naming it); a user without an org mapping (bob)
//! keeps the workspace's tools. The agent turn of an org identity (OIDC or
//! org token) offers the model its org's bound exports and calls them
//! through their bindings, never another org's; a workspace identity's turn
//! is unchanged. The model is the scripted provider (a replay file, not a
//! model), whose reply names the tools each turn was offered.

use std::time::Duration;

use serde_json::{Value, json};

use crate::binding_calls::{SECRET, World, call, world_in};
use crate::catalog::{call_tool, listed, open, tool_names};
use crate::oauth::{Idp, now};
use crate::support::eventually_blocking;

/// plugd.yaml: `auth:` for `issuer` with `org_claim`, a group mapped to
/// org_a, a workspace group, and the scripted model.
fn config(issuer: &str) -> String {
    format!(
        r#"auth:
  issuers:
    - issuer: {issuer}
      audience: plugd
      client_id: console
      org_claim: org
  role_mapping:
    - {{group: acme-devs, role: agent, org: org_a}}
    - {{group: partners, role: agent}}
    - {{group: interns, role: agent}}
llm:
  provider: scripted
  script: "${{{{workspace_dir}}}}/scripts/turn.yaml"
"#
    )
}

/// The world of `binding_calls.rs` (acme/kit pulled from a real registry)
/// in the `risky` workspace of `risk.rs`, with [`config`]; org_a binds
/// `whoami` of acme/kit 0.1.0, org_b `whoami` of 0.2.0 and `leak` (which
/// always fails, after reaching the plugin). The script calls `whoami` and
/// `leak`, then replies with the names of the tools it was offered.
fn orgs(idp: &Idp) -> World {
    let ws = crate::risk::workspace(&config(&idp.issuer));
    std::fs::create_dir_all(ws.dir().join("scripts")).unwrap();
    let script = json!({"steps": [
        {"tool_calls": [
            {"name": "whoami", "arguments": {}, "id": "c1"},
            {"name": "leak", "arguments": {}, "id": "c2"}]},
        {"text": "offered: {{tools}}"}
    ]});
    std::fs::write(ws.dir().join("scripts/turn.yaml"), script.to_string()).unwrap();
    let w = world_in(ws, &[]);
    w.secret("org_a", SECRET);
    w.secret("org_b", SECRET);
    w.bind("org_a", None, "0.1.0", 100);
    w.bind("org_b", None, "0.2.0", 100);
    w.bind_package("acme/kit", "leak", "org_b", None, "0.2.0", 100);
    w
}

fn resource(w: &World) -> String {
    format!("http://{}/mcp", w.serve.addr)
}

#[test]
fn oidc_identities_get_their_orgs_catalog_and_unknown_orgs_are_refused() {
    let idp = Idp::start();
    let w = orgs(&idp);
    let s = &w.serve;
    let erin = idp.token("erin", &resource(&w));
    let frank = idp.token("frank", &resource(&w));

    // erin (acme-devs → agent in org_a): org_a's export, only it.
    let sid = open(s, &erin, "/mcp", "2025-06-18");
    assert_eq!(tool_names(s, &erin, "/mcp", &sid), ["whoami"]);
    let r = call_tool(s, &erin, "/mcp", &sid, "whoami", json!({}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    let out = &r["result"]["structuredContent"];
    assert_eq!(
        (&out["org_id"], &out["version"]),
        (&json!("org_a"), &json!("0.1.0")),
        "{r}"
    );
    let r = call_tool(s, &erin, "/mcp", &sid, "leak", json!({}));
    assert_eq!(r["error"]["message"], "Unknown tool: leak", "{r}");
    let rows = listed(s, &erin);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["name"], "whoami");
    // The same export through :invoke, in org_a's scope; another org's
    // export is not found.
    let r = call(
        s,
        &erin,
        "POST",
        "/v1/plugin-tools/whoami:invoke",
        Some(r#"{"input": {}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["structured_output"]["org_id"],
        "org_a",
        "{}",
        r.text()
    );
    let r = call(
        s,
        &erin,
        "POST",
        "/v1/plugin-tools/leak:invoke",
        Some(r#"{"input": {}, "org_id": "org_b"}"#),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    // Lists are scoped by org: erin's records are org_a's, named after her.
    let records = || -> Vec<Value> {
        let r = call(s, &erin, "GET", "/v1/invocations?limit=50", None);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["invocations"].as_array().unwrap().clone()
    };
    assert!(eventually_blocking(Duration::from_secs(5), || records()
        .len()
        >= 2));
    let mine = records();
    assert!(mine.iter().all(|i| i["org_id"] == "org_a"), "{mine:?}");
    assert!(
        mine.iter()
            .any(|i| i["caller"].as_str().is_some_and(|c| c.ends_with("/erin"))),
        "{mine:?}"
    );

    // frank (partners, org claim org_b): org_b's exports, its bindings.
    let sid = open(s, &frank, "/mcp", "2025-06-18");
    assert_eq!(tool_names(s, &frank, "/mcp", &sid), ["leak", "whoami"]);
    let r = call_tool(s, &frank, "/mcp", &sid, "whoami", json!({}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    let out = &r["result"]["structuredContent"];
    assert_eq!(
        (&out["org_id"], &out["version"]),
        (&json!("org_b"), &json!("0.2.0")),
        "{r}"
    );
    // leak reaches org_b's plugin (which refuses it), unlike erin's call.
    let r = call_tool(s, &frank, "/mcp", &sid, "leak", json!({}));
    assert!(r.to_string().contains("refused token"), "{r}");
    let rows = listed(s, &frank);
    assert_eq!(rows.len(), 2, "{rows:?}");
    // An org identity reaches no workspace route.
    assert_eq!(call(s, &frank, "GET", "/v1/plugins", None).status, 404);

    // gina (org claim "ghost", no binding names it): refused, named; never
    // widened to the workspace.
    let gina = idp.token("gina", &resource(&w));
    for (method, path) in [("GET", "/v1/tools"), ("POST", "/mcp")] {
        let r = call(s, &gina, method, path, None);
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("\"ghost\""), "{message}");
    }
    // A hostile org claim (not an id) is refused the same way.
    let hostile = idp.sign(
        json!({"iss": idp.issuer, "sub": "mallory", "aud": "plugd", "exp": now() + 300,
               "iat": now(), "groups": ["partners"], "org": "../org_a"}),
        false,
    );
    let r = call(s, &hostile, "GET", "/v1/tools", None);
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("not an id"), "{}", r.text());

    // bob (interns, no org): the workspace's tools, no org's export.
    let bob = idp.token("bob", &resource(&w));
    let rows = listed(s, &bob);
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert!(names.contains(&"risky/lo"), "{names:?}");
    assert!(
        !names.contains(&"whoami") && !names.contains(&"leak"),
        "{names:?}"
    );

    let serve = w.serve;
    let (_, log) = serve.stop();
    assert!(log.contains("unknown_org"), "{log}");
}

/// One turn of session `session` as `token`: the outcome.
fn turn(w: &World, token: &str, session: &str) -> Value {
    let r = call(
        &w.serve,
        token,
        "POST",
        &format!("/v1/sessions/{session}/messages"),
        Some(r#"{"text": "call both"}"#),
    );
    assert_eq!(r.status, 200, "{session}: {}", r.text());
    r.json()
}

fn calls(outcome: &Value) -> Vec<(String, bool, Value)> {
    outcome["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("{outcome}"))
        .iter()
        .map(|c| {
            (
                c["tool"].as_str().unwrap().to_owned(),
                c["ok"].as_bool().unwrap(),
                c["result"].clone(),
            )
        })
        .collect()
}

#[test]
fn an_org_identitys_agent_turn_offers_and_calls_its_orgs_exports_only() {
    let idp = Idp::start();
    let w = orgs(&idp);
    let erin = idp.token("erin", &resource(&w));
    let org_b = w.token("agent", "org_b", &[]);

    // erin (OIDC, org_a): offered whoami only; it runs through org_a's
    // binding; leak (org_b's) is an unknown tool, never dispatched.
    let out = turn(&w, &erin, "t-erin");
    assert_eq!(out["reply"], "offered: whoami", "{out}");
    let c = calls(&out);
    assert_eq!((c[0].0.as_str(), c[0].1), ("whoami", true), "{out}");
    let got = &c[0].2["structured_output"];
    assert_eq!(
        (&got["org_id"], &got["version"]),
        (&json!("org_a"), &json!("0.1.0")),
        "{out}"
    );
    assert_eq!(got["session_id"], "t-erin", "{out}");
    assert_eq!((c[1].0.as_str(), c[1].1), ("leak", false), "{out}");
    let why = c[1].2.as_str().unwrap();
    assert!(
        why.contains("no tool \"leak\"") && !why.contains("refused"),
        "{out}"
    );

    // An org_b token: its own bindings (0.2.0), and leak reaches its plugin.
    let out = turn(&w, &org_b, "t-org-b");
    assert_eq!(out["reply"], "offered: leak, whoami", "{out}");
    let c = calls(&out);
    assert_eq!((c[0].0.as_str(), c[0].1), ("whoami", true), "{out}");
    let got = &c[0].2["structured_output"];
    assert_eq!(
        (&got["org_id"], &got["version"]),
        (&json!("org_b"), &json!("0.2.0")),
        "{out}"
    );
    assert_eq!((c[1].0.as_str(), c[1].1), ("leak", false), "{out}");
    assert!(c[1].2.to_string().contains("refused token"), "{out}");

    // The session is org_a's: erin reads it, org_b does not see it and
    // cannot continue it (404, as if it did not exist).
    let r = call(&w.serve, &erin, "GET", "/v1/sessions?limit=50", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("t-erin") && !r.text().contains("t-org-b"),
        "{}",
        r.text()
    );
    let r = call(&w.serve, &org_b, "GET", "/v1/sessions?limit=50", None);
    assert!(!r.text().contains("t-erin"), "{}", r.text());
    let r = call(
        &w.serve,
        &org_b,
        "POST",
        "/v1/sessions/t-erin/messages",
        Some(r#"{"text": "again"}"#),
    );
    assert_eq!(r.status, 404, "{}", r.text());

    // The workspace identity's turn is unchanged: the workspace's tools
    // (the risky plugin's), no org's export.
    let out = turn(&w, &w.serve.token, "t-ws");
    let reply = out["reply"].as_str().unwrap();
    assert!(reply.contains("risky_lo"), "{reply}");
    assert!(
        !reply.contains("whoami") && !reply.contains("leak"),
        "{reply}"
    );
    assert!(calls(&out).iter().all(|c| !c.1), "{out}");

    // The org turns' calls were governed and recorded with their org and
    // the agent surface.
    let records = |token: &str| -> Vec<Value> {
        let r = call(&w.serve, token, "GET", "/v1/invocations?limit=50", None);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["invocations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["surface"] == "agent")
            .cloned()
            .collect()
    };
    assert!(eventually_blocking(Duration::from_secs(5), || {
        !records(&erin).is_empty() && !records(&org_b).is_empty()
    }));
    let a = records(&erin);
    assert!(a.iter().all(|i| i["org_id"] == "org_a"), "{a:?}");
    let b = records(&org_b);
    assert!(b.iter().all(|i| i["org_id"] == "org_b"), "{b:?}");
}
