//! `plugd plugin approve|revoke|restart` against a running `plugd serve`: real
//! serve and CLI processes on one workspace; the CLI finds serve through
//! `.plugd/serve.json` and acts on serve's runtime (a failure cleared in
//! serve, a revoked plugin's process group gone), ignores a stale record, and
//! reports serve's errors instead of falling back.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, eventually_blocking, stderr, stdout};

const LOOP: &str = "[plugin.supervisor]\nstart = \"eager\"\nrestart_attempts = 1\nbackoff_base_ms = 50\nbackoff_max_ms = 100\n";
const GOOD: &str =
    "[plugin.supervisor]\nstart = \"eager\"\nshutdown_timeout_ms = 500\nshutdown_grace_ms = 300\n";

fn serve_json(ws: &Ws) -> std::path::PathBuf {
    ws.dir().join(".plugd/serve.json")
}

fn row<'a>(plugins: &'a Value, id: &str) -> &'a Value {
    plugins
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == id))
        .unwrap_or_else(|| panic!("no row {id} in {plugins}"))
}

fn tool_names(serve: &Serve) -> Vec<String> {
    let v = serve.get("/v1/tools").json();
    v.as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn plugin_commands_act_inside_a_running_serve() {
    let ws = Ws::new();
    // Lives 1.5 s after every handshake: the approval below succeeds, then
    // serve's eager start crash-loops into `failed` (one restart attempt).
    ws.misbehave("loop", "crash_after_init", Some("1500"), LOOP);
    ws.misbehave("good", "good", None, GOOD);
    for id in ["loop", "good"] {
        let out = ws.plugd(&["plugin", "approve", id]);
        assert!(out.status.success(), "approve {id}: {}", stderr(&out));
        assert!(
            !stdout(&out).contains("via plugd serve"),
            "{}",
            stdout(&out)
        );
    }

    let serve = Serve::start(&ws, "127.0.0.1:0");
    let pid = serve.child.id();
    let via = format!("(via plugd serve pid {pid})");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(serve_json(&ws)).unwrap()).unwrap();
    assert_eq!(record["pid"], pid, "{record}");
    assert_eq!(record["addr"], serve.addr.to_string(), "{record}");
    let socket = ws.dir().join(".plugd/serve.sock");
    assert_eq!(record["socket"], socket.to_str().unwrap(), "{record}");
    assert!(record["started_at"].as_str().is_some_and(|s| !s.is_empty()));
    let mode = std::fs::metadata(serve_json(&ws))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    // Serve drives `loop` to failed.
    assert!(
        eventually_blocking(Duration::from_secs(30), || {
            row(&serve.get("/v1/plugins").json(), "loop")["state"] == "failed"
        }),
        "{}",
        serve.get("/v1/plugins").json()
    );

    // The CLI's restart resets it in serve.
    let out = ws.plugd(&["plugin", "restart", "loop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("restarted loop: failure cleared") && stdout(&out).contains(&via),
        "{}",
        stdout(&out)
    );
    let plugins = serve.get("/v1/plugins").json();
    assert_ne!(row(&plugins, "loop")["state"], "failed", "{plugins}");
    assert_eq!(row(&plugins, "loop")["error"], Value::Null, "{plugins}");

    // The CLI's revoke stops serve's running `good`.
    let r = serve.post("/v1/tools/good_pid:invoke", &json!({"args": {}}));
    assert_eq!(r.status, 200, "{:?}", r.json());
    let pgid = r.json()["pgid"].as_u64().unwrap() as u32;
    assert!(plugd_host::spawn::process_group_alive(pgid));
    assert!(tool_names(&serve).iter().any(|t| t == "good_echo"));
    let out = ws.plugd(&["plugin", "revoke", "good"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), format!("revoked good {via}"));
    assert!(
        eventually_blocking(Duration::from_secs(10), || {
            !plugd_host::spawn::process_group_alive(pgid)
        }),
        "group {pgid} of the revoked plugin still alive"
    );
    assert!(
        !tool_names(&serve).iter().any(|t| t.starts_with("good_")),
        "{:?}",
        tool_names(&serve)
    );
    assert_eq!(
        row(&serve.get("/v1/plugins").json(), "good")["approved"],
        false
    );
    let out = ws.plugd(&["plugin", "revoke", "good"]);
    assert_eq!(stdout(&out).trim(), format!("good was not approved {via}"));

    // Approving through serve brings its tools back there.
    let out = ws.plugd(&["plugin", "approve", "good", "--by", "ops"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("approved good (sha256:") && stdout(&out).contains(&via),
        "{}",
        stdout(&out)
    );
    assert!(tool_names(&serve).iter().any(|t| t == "good_echo"));

    // Tool toggles act in serve too: gone from serve's list the moment the
    // command returns (a local write reached serve only at its next check).
    let out = ws.plugd(&["tool", "disable", "good_echo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("disabled tool good_echo of plugin good")
            && stdout(&out).contains(&via),
        "{}",
        stdout(&out)
    );
    assert!(!tool_names(&serve).iter().any(|t| t == "good_echo"));
    let out = ws.plugd(&["tool", "disable", "good_echo"]);
    assert!(stdout(&out).contains("was already disabled") && stdout(&out).contains(&via));
    let out = ws.plugd(&["tool", "enable", "good_echo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        format!("enabled tool good_echo of plugin good {via}")
    );
    assert!(tool_names(&serve).iter().any(|t| t == "good_echo"));
    let out = ws.plugd(&["tool", "disable", "nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("plugd serve") && stderr(&out).contains("unknown_tool"),
        "{}",
        stderr(&out)
    );

    // Serve's errors are the CLI's errors: no silent local fallback.
    let out = ws.plugd(&["plugin", "restart", "nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("plugd serve") && err.contains("unknown_plugin") && err.contains("\"nope\""),
        "{err}"
    );

    // The endpoints' own errors.
    for action in ["approve", "revoke", "restart"] {
        serve
            .post(&format!("/v1/plugins/nope:{action}"), &json!({}))
            .error(404, "unknown_plugin");
        serve
            .post(&format!("/v1/plugins/@acme/nope:{action}"), &json!({}))
            .error(404, "unknown_plugin");
    }
    serve
        .post("/v1/plugins/good:explode", &json!({}))
        .error(404, "not_found");
    let r = serve.post("/v1/plugins/loop:restart", &json!({}));
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["id"], "loop");

    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(!serve_json(&ws).exists(), "serve.json left behind");
}

#[test]
fn a_stale_serve_record_is_ignored_and_replaced() {
    let ws = Ws::new();
    ws.misbehave("good", "good", None, "");
    let out = ws.plugd(&["plugin", "approve", "good"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::create_dir_all(ws.dir().join(".plugd")).unwrap();

    // A dead pid.
    #[allow(clippy::disallowed_methods)] // a short-lived real process for its pid
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    // A free port nobody answers on.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for pid in [dead, std::process::id()] {
        std::fs::write(
            serve_json(&ws),
            json!({"pid": pid, "addr": free.to_string(), "started_at": "2026-01-01T00:00:00Z"})
                .to_string(),
        )
        .unwrap();
        let out = ws.plugd(&["plugin", "restart", "good"]);
        assert!(out.status.success(), "pid {pid}: {}", stderr(&out));
        assert_eq!(
            stdout(&out).trim(),
            "restarted good: failure cleared, restart budget reset"
        );
    }

    let serve = Serve::start(&ws, "127.0.0.1:0");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(serve_json(&ws)).unwrap()).unwrap();
    assert_eq!(record["pid"], serve.child.id(), "{record}");
    let out = ws.plugd(&["plugin", "restart", "good"]);
    assert!(
        stdout(&out).contains(&format!("(via plugd serve pid {})", serve.child.id())),
        "{}",
        stdout(&out)
    );
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(!serve_json(&ws).exists());
}
