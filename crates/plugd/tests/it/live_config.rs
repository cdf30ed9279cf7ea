//! Policy is consent: plugd.yaml changes under a running `plugd serve`. A
//! change that narrows (a risk raised) gates the next call within seconds;
//! one that widens (a risk lowered, the containment baseline off) is held,
//! shown by `plugd config diff` and put in force only by `plugd config
//! approve` of exactly that text; a plugin directory added while serve
//! runs is listed, approved through serve and called.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::Serve;
use crate::risk::{runs, workspace};
use crate::support::*;

/// Polls `GET /v1/config` until it holds a change; returns it.
fn held(serve: &Serve) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = serve.get("/v1/config").json();
        if !v["pending"].is_null() {
            return v["pending"].clone();
        }
        assert!(Instant::now() < deadline, "nothing held: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_risk_raised_under_serve_gates_the_next_call_and_lowering_it_waits_for_approval() {
    let base = "risk:\n  approval_timeout_secs: 1\n";
    let ws = workspace(base);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let invoke = || serve.post("/v1/tools/risky/plain:invoke", &json!({"args": {}}));
    assert_eq!(invoke().status, 200);
    assert_eq!(runs(&ws, "plain"), 1);

    // Narrowing: in force at once, the next call waits for an operator.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!("{base}  tools:\n    risky/plain: critical\n"),
    )
    .unwrap();
    let written = Instant::now();
    let mut ran = 1;
    loop {
        let r = invoke();
        if r.status == 403 {
            r.error(403, "approval_timed_out");
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        ran += 1;
        assert!(
            written.elapsed() < Duration::from_secs(5),
            "a risk raised in plugd.yaml did not gate calls within 5 s"
        );
    }
    assert_eq!(runs(&ws, "plain"), ran, "a gated call ran");
    let tools = serve.get("/v1/tools?all=true").json();
    let row = tools
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == "risky/plain"))
        .cloned()
        .unwrap_or_else(|| panic!("no risky/plain in {tools}"));
    assert_eq!(row["risk"], "critical", "{row}");
    assert!(serve.get("/v1/config").json()["pending"].is_null());

    // Widening: back to the declared `low` is held; the call stays gated.
    std::fs::write(ws.dir().join("plugd.yaml"), base).unwrap();
    let pending = held(&serve);
    let widening = pending["verdict"]["widening"].to_string();
    assert!(
        widening.contains("risk.tools.risky/plain: critical -> (declared)"),
        "{pending}"
    );
    invoke().error(403, "approval_timed_out");
    assert_eq!(runs(&ws, "plain"), ran);
    let digest = pending["digest"].as_str().unwrap().to_owned();
    let diff = ok(&ws.plugd(&["config", "diff"]));
    assert!(
        diff.contains("-  tools:") && diff.contains(&digest),
        "{diff}"
    );
    let out = ws.plugd(&["config", "approve", &digest]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(invoke().status, 200);
    assert_eq!(runs(&ws, "plain"), ran + 1);
    let (_, log) = serve.stop();
    assert!(log.contains("held plugd.yaml change approved"), "{log}");
}

#[test]
fn turning_the_baseline_off_does_nothing_until_plugd_config_approve() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let baseline =
        || serve.get("/v1/plugins/risky").json()["permissions"]["baseline"]["state"].clone();
    assert_ne!(baseline(), "off");
    let status = ok(&ws.plugd(&["config", "status"]));
    assert!(status.contains("held:     nothing"), "{status}");

    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    risky: {baseline: false}\n",
    )
    .unwrap();
    let pending = held(&serve);
    assert_eq!(
        pending["verdict"]["widening"],
        json!(["sandbox.plugins.risky.baseline: true -> false"])
    );
    // Still in force: the baseline.
    assert_ne!(baseline(), "off");
    let diff = ok(&ws.plugd(&["config", "diff"]));
    assert!(
        diff.contains("+    risky: {baseline: false}")
            && diff.contains("widens: sandbox.plugins.risky.baseline: true -> false"),
        "{diff}"
    );
    // Only the text reviewed can be approved.
    let out = ws.plugd(&["config", "approve", "sha256:0000"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not sha256:0000"), "{}", stderr(&out));
    assert_ne!(baseline(), "off");
    // A later edit replaces what is held; approving the old digest fails.
    let digest = pending["digest"].as_str().unwrap().to_owned();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    risky: {baseline: false}\n# reviewed\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let newer = loop {
        let p = held(&serve);
        if p["digest"] != digest.as_str() {
            break p;
        }
        assert!(Instant::now() < deadline, "the edit was not picked up");
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = ws.plugd(&["config", "approve", &digest]);
    assert!(!out.status.success(), "a stale digest was approved");
    let out = ws.plugd(&["config", "approve", newer["digest"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(baseline(), "off");
    let status = ok(&ws.plugd(&["config", "status"]));
    assert!(status.contains("held:     nothing"), "{status}");
    // Back on narrows: in force without an approval.
    std::fs::remove_file(ws.dir().join("plugd.yaml")).unwrap();
    assert!(eventually_blocking(Duration::from_secs(5), || baseline() != "off"));
}

#[test]
fn a_plugin_directory_added_under_serve_is_listed_approved_and_called() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let from = ws.plugin_dir("risky");
    let to = ws.plugin_dir("risky2");
    std::fs::create_dir_all(&to).unwrap();
    std::fs::copy(from.join("main.py"), to.join("main.py")).unwrap();
    let manifest = std::fs::read_to_string(from.join("plugin.json"))
        .unwrap()
        .replace("\"name\":\"risky\"", "\"name\":\"risky2\"");
    assert!(manifest.contains("risky2"), "{manifest}");
    std::fs::write(to.join("plugin.json"), manifest).unwrap();
    let listed = || {
        serve.get("/v1/plugins").json().as_array().and_then(|a| {
            a.iter()
                .find(|p| p["id"] == "risky2")
                .map(|p| p["approved"].clone())
        })
    };
    assert!(
        eventually_blocking(Duration::from_secs(10), || listed().is_some()),
        "serve did not list the new plugin"
    );
    assert_eq!(listed(), Some(json!(false)));
    serve
        .post("/v1/tools/risky2/plain:invoke", &json!({"args": {}}))
        .error(404, "unknown_tool");
    let out = ws.plugd(&["plugin", "approve", "risky2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(listed(), Some(json!(true)));
    let r = serve.post("/v1/tools/risky2/plain:invoke", &json!({"args": {}}));
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, log) = serve.stop();
    assert!(log.contains("new plugin found in the workspace"), "{log}");
}

#[test]
fn an_approved_narrower_mcp_profile_counts_from_the_next_session() {
    use crate::gateway::{initialize, mcp_post};
    let profile = |tools: &str| format!("mcp:\n  profiles:\n    p:\n      tools: [{tools}]\n");
    let ws = workspace(&profile("\"risky/plain\", \"risky/lo\""));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = crate::http::make_token(&ws, "agent");
    let listed = || {
        let r = mcp_post(&serve, &agent, "/mcp/p", None, &initialize());
        assert_eq!(r.status, 200, "{}", r.text());
        let sid = r.header("mcp-session-id").unwrap().to_owned();
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        let r = mcp_post(&serve, &agent, "/mcp/p", Some(&sid), &list);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["result"]["tools"].as_array().unwrap().len()
    };
    assert_eq!(listed(), 2);
    std::fs::write(ws.dir().join("plugd.yaml"), profile("\"risky/plain\"")).unwrap();
    let pending = held(&serve);
    assert_eq!(listed(), 2, "a held change is not in force");
    let out = ws.plugd(&["config", "approve", pending["digest"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(listed(), 1);
}

/// An edit made while serve is stopped is weighed at the next start like
/// one made under it: turning the baseline off is held (the last serve's
/// text stays in force, remembered under `.plugd/`), raising a risk is in
/// force at once.
#[test]
fn an_edit_made_while_serve_was_stopped_is_weighed_at_the_next_start() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let _ = serve.stop();
    let remembered = ws.dir().join(".plugd/plugd.yaml.in-force");
    assert!(
        remembered.exists(),
        "serve did not remember the text in force"
    );
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    risky: {baseline: false}\nrisk:\n  approval_timeout_secs: 1\n  tools:\n    risky/plain: critical\n",
    )
    .unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let baseline =
        || serve.get("/v1/plugins/risky").json()["permissions"]["baseline"]["state"].clone();
    let pending = held(&serve);
    let widening = pending["verdict"]["widening"].to_string();
    assert!(
        widening.contains("sandbox.plugins.risky.baseline: true -> false"),
        "{pending}"
    );
    assert_ne!(
        baseline(),
        "off",
        "a widening edit made while stopped is in force"
    );
    // The whole text is held (it widens), so the raised risk waits too:
    // the operator reviews it as one change.
    let out = ws.plugd(&["config", "approve", pending["digest"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(baseline(), "off");
    serve
        .post("/v1/tools/risky/plain:invoke", &json!({"args": {}}))
        .error(403, "approval_timed_out");
    let (_, log) = serve.stop();
    assert!(
        log.contains("plugd.yaml changed while serve was stopped"),
        "{log}"
    );

    // Narrowing only (the risk back up after lowering it under no serve is
    // not narrowing; raising one is): in force at the next start.
    let text = "sandbox:\n  plugins:\n    risky: {baseline: false}\nrisk:\n  approval_timeout_secs: 1\n  tools:\n    risky/plain: critical\n    risky/lo: critical\n";
    std::fs::write(ws.dir().join("plugd.yaml"), text).unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    assert!(eventually_blocking(Duration::from_secs(5), || {
        serve
            .get("/v1/tools?all=true")
            .json()
            .as_array()
            .is_some_and(|a| {
                a.iter()
                    .any(|t| t["name"] == "risky/lo" && t["risk"] == "critical")
            })
    }));
    assert!(serve.get("/v1/config").json()["pending"].is_null());
}
