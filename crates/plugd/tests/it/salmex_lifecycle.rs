//! Seed 004's lifecycle order with the seed's own Node `main.js`
//! (`tests/plugins/salmex/seed-hello-node/`): discovery → approval →
//! configuration → first call, locally and through a running `plugd serve`;
//! and operator start/stop that holds until started again.

use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, repo, stderr, stdout};

const ID: &str = "hello-node";
const TOOL: &str = "hello-node/say_hello";

/// A workspace holding the seed plugin, whose `greeting` setting is required.
fn seed_ws() -> Ws {
    let ws = Ws::new();
    let to = ws.plugin_dir(ID);
    std::fs::create_dir_all(&to).unwrap();
    for f in ["plugin.json", "main.js"] {
        std::fs::copy(
            repo().join("tests/plugins/salmex/seed-hello-node").join(f),
            to.join(f),
        )
        .unwrap();
    }
    ws
}

fn ok_json(ws: &Ws, args: &[&str]) -> Value {
    let out = ws.plugd(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"))
}

fn row<'a>(list: &'a Value, id: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {list}"))
}

#[test]
fn approve_before_configure_then_the_first_call_starts_it_locally() {
    let ws = seed_ws();
    let out = ws.plugd(&["plugin", "approve", ID]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
    assert!(
        stdout(&out).contains("not started, it needs configuration: required setting \"greeting\""),
        "{}",
        stdout(&out)
    );

    // Approved, its tools listed from plugin.json, waiting for configuration.
    let list = ok_json(&ws, &["plugin", "list", "--json"]);
    let p = row(&list, ID);
    assert_eq!(p["approved"], true, "{p}");
    assert_eq!(p["state"], "unconfigured", "{p}");
    assert_eq!(p["tools"], json!([TOOL]), "{p}");
    let why = p["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("required setting \"greeting\" is not set")
            && why.contains("plugd plugin config hello-node set greeting VALUE"),
        "{p}"
    );
    let out = ws.plugd(&["plugin", "show", ID]);
    assert!(
        stdout(&out).contains("state:     unconfigured"),
        "{}",
        stdout(&out)
    );
    let tools = ok_json(&ws, &["tool", "list", "--json"]);
    assert!(tools.to_string().contains(TOOL), "{tools}");

    // A call before configuration says what to set.
    let out = ws.plugd(&["tool", "call", TOOL, "--args", r#"{"name":"Ada"}"#]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("plugd plugin config hello-node set greeting"),
        "{}",
        stderr(&out)
    );

    let out = ws.plugd(&["plugin", "config", ID, "set", "greeting", "Howdy"]);
    assert!(out.status.success(), "config set: {}", stderr(&out));
    let list = ok_json(&ws, &["plugin", "list", "--json"]);
    assert_ne!(row(&list, ID)["state"], "unconfigured", "{list}");

    let v = ok_json(
        &ws,
        &[
            "tool",
            "call",
            TOOL,
            "--args",
            r#"{"name":"Ada"}"#,
            "--json",
        ],
    );
    assert_eq!(v["content"][0]["text"], "Howdy, Ada!", "{v}");
}

#[test]
fn approve_before_configure_then_the_first_call_starts_it_under_serve() {
    let ws = seed_ws();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let out = ws.plugd(&["plugin", "approve", ID]);
    assert!(out.status.success(), "approve via serve: {}", stderr(&out));
    assert!(stdout(&out).contains("via plugd serve"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("it needs configuration"),
        "{}",
        stdout(&out)
    );

    let r = serve.get("/v1/plugins");
    assert_eq!(r.status, 200);
    let list = r.json();
    let p = row(&list, ID);
    assert_eq!(
        (&p["approved"], &p["state"]),
        (&json!(true), &json!("unconfigured")),
        "{p}"
    );
    let r = serve.get("/v1/tools");
    assert!(r.text().contains(TOOL), "{}", r.text());

    let r = serve.post(
        &format!("/v1/tools/{TOOL}:invoke"),
        &json!({"args": {"name": "Ada"}}),
    );
    let v = r.json();
    assert_eq!(r.status, 503, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plugd plugin config hello-node set greeting"),
        "{v}"
    );

    let out = ws.plugd(&["plugin", "config", ID, "set", "greeting", "Howdy"]);
    assert!(out.status.success(), "config set: {}", stderr(&out));
    let r = serve.post(
        &format!("/v1/tools/{TOOL}:invoke"),
        &json!({"args": {"name": "Grace"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], "Howdy, Grace!");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

/// Approved and configured: ready for its first call.
fn configured_ws() -> Ws {
    let ws = seed_ws();
    for args in [
        &["plugin", "approve", ID][..],
        &["plugin", "config", ID, "set", "greeting", "Howdy"],
    ] {
        let out = ws.plugd(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    ws
}

#[test]
fn an_operator_stop_holds_locally_until_start() {
    let ws = configured_ws();
    let call = [
        "tool",
        "call",
        TOOL,
        "--args",
        r#"{"name":"Ada"}"#,
        "--json",
    ];
    let out = ws.plugd(&["plugin", "stop", ID]);
    assert!(out.status.success(), "stop: {}", stderr(&out));
    let list = ok_json(&ws, &["plugin", "list", "--json"]);
    let p = row(&list, ID);
    assert_eq!(p["state"], "stopped", "{p}");
    assert!(
        p["error"]
            .as_str()
            .is_some_and(|e| e.contains("plugd plugin start hello-node")),
        "{p}"
    );

    // The next process's call does not start it lazily.
    let out = ws.plugd(&call);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(v["code"], "plugin_stopped", "{v}");
    assert_eq!(v["details"]["plugin"], ID, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("run `plugd plugin start hello-node` to start it"),
        "{v}"
    );
    // Nor does a configuration change.
    let out = ws.plugd(&["plugin", "config", ID, "set", "greeting", "Hi"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(ws.plugd(&call).status.code(), Some(7));

    let out = ws.plugd(&["plugin", "start", ID]);
    assert!(out.status.success(), "start: {}", stderr(&out));
    let v = ok_json(&ws, &call);
    assert_eq!(v["content"][0]["text"], "Hi, Ada!", "{v}");
    // Unknown ids are refused by name.
    let out = ws.plugd(&["plugin", "stop", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no plugin \"nope\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_operator_stop_holds_under_serve_and_across_its_restart_until_start() {
    let ws = configured_ws();
    let invoke = |serve: &Serve| {
        serve.post(
            &format!("/v1/tools/{TOOL}:invoke"),
            &json!({"args": {"name": "Ada"}}),
        )
    };
    let state = |serve: &Serve| serve.get(&format!("/v1/plugins/{ID}")).json()["state"].clone();
    let mut serve = Serve::start(&ws, "127.0.0.1:0");
    assert_eq!(invoke(&serve).status, 200);
    assert_eq!(state(&serve), "running");

    // Stop through the CLI, which goes through serve.
    let out = ws.plugd(&["plugin", "stop", ID]);
    assert!(out.status.success(), "stop: {}", stderr(&out));
    assert!(stdout(&out).contains("via plugd serve"), "{}", stdout(&out));
    assert_eq!(state(&serve), "stopped");
    let v = invoke(&serve).error(503, "plugin_stopped");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plugd plugin start hello-node"),
        "{v}"
    );
    // Still stopped a moment later, and after a configuration change.
    let out = ws.plugd(&["plugin", "config", ID, "set", "greeting", "Hi"]);
    assert!(out.status.success(), "{}", stderr(&out));
    invoke(&serve).error(503, "plugin_stopped");

    // An agent token may call tools but not start plugins.
    let admin = std::mem::replace(&mut serve.token, crate::http::make_token(&ws, "agent"));
    serve
        .post(&format!("/v1/plugins/{ID}:start"), &json!({}))
        .error(403, "forbidden");
    serve.token = admin;

    // A new serve keeps the stop.
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    assert_eq!(state(&serve), "stopped");
    invoke(&serve).error(503, "plugin_stopped");

    // Start over HTTP: running now, and the call works with the new greeting.
    let r = serve.post(&format!("/v1/plugins/{ID}:start"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "running", "{}", r.text());
    let r = invoke(&serve);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], "Hi, Ada!");
    // And :stop over HTTP too.
    let r = serve.post(&format!("/v1/plugins/{ID}:stop"), &json!({}));
    assert_eq!(
        (r.status, r.json()["state"].clone()),
        (200, json!("stopped"))
    );
    invoke(&serve).error(503, "plugin_stopped");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}
