//! Changes to approved plugins under `plugd serve` (inotify, and the polling
//! fallback) and without it, and approving many plugins at once: real serve
//! and CLI processes, real Python plugins.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, eventually_blocking, stderr, stdout};

const EAGER: &str =
    "[plugin.supervisor]\nstart = \"eager\"\nshutdown_timeout_ms = 500\nshutdown_grace_ms = 300\n";

fn tool_names(serve: &Serve) -> Vec<String> {
    serve
        .get("/v1/tools")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

fn state_of(serve: &Serve, id: &str) -> Value {
    let rows = serve.get("/v1/plugins").json();
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no row {id} in {rows}"))
}

fn approve(ws: &Ws, ids: &[&str]) -> std::process::Output {
    let mut args = vec!["plugin", "approve"];
    args.extend_from_slice(ids);
    ws.plugd(&args)
}

/// The pid the plugin reports through a tool call over HTTP.
fn plugin_pid(serve: &Serve, id: &str) -> u32 {
    let r = serve.post(&format!("/v1/tools/{id}_pid:invoke"), &json!({"args": {}}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["result"]["pid"]
        .as_u64()
        .or_else(|| r.json()["pid"].as_u64())
        .unwrap_or_else(|| panic!("no pid in {}", r.text())) as u32
}

fn alive(pid: u32) -> bool {
    // A zombie is dead for this purpose; plugd reaps its children.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// After `change` under serve: the plugin's process is gone, its tools are
/// gone, its state is `changed`, and a call over HTTP and through the CLI
/// fails naming `needle` (a file) and `plugd plugin approve w`. Then a
/// re-approval through serve brings the tools back.
fn assert_withheld_then_reapprove(ws: &Ws, serve: &Serve, needle: &str, change: impl FnOnce()) {
    let pid = plugin_pid(serve, "w");
    change();
    assert!(
        eventually_blocking(Duration::from_secs(5), || !tool_names(serve)
            .contains(&"w_pid".to_owned())),
        "tools still listed after the change ({needle})"
    );
    assert!(
        eventually_blocking(Duration::from_secs(5), || !alive(pid)),
        "plugin process {pid} still runs after the change ({needle})"
    );
    let row = state_of(serve, "w");
    assert_eq!(row["state"], "changed", "{row}");
    assert!(
        row["error"].as_str().unwrap_or("").contains(needle),
        "{row}"
    );

    let r = serve.post("/v1/tools/w_pid:invoke", &json!({"args": {}}));
    let body = r.error(409, "plugin_changed");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{message}");
    assert!(message.contains("plugd plugin approve w"), "{message}");
    assert!(message.contains("\"w\""), "{message}");

    let out = ws.plugd(&["tool", "call", "w_pid", "--args", "{}"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains(needle), "{err}");
    assert!(err.contains("plugd plugin approve w"), "{err}");

    let out = approve(ws, &["w"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("via plugd serve pid"),
        "{}",
        stdout(&out)
    );
    assert!(
        eventually_blocking(Duration::from_secs(5), || tool_names(serve)
            .contains(&"w_pid".to_owned())),
        "tools not back after re-approval ({needle})"
    );
    assert_eq!(state_of(serve, "w")["approved"], true);
    let new_pid = plugin_pid(serve, "w");
    assert_ne!(new_pid, pid);
}

#[test]
fn edits_under_serve_stop_the_plugin_and_name_the_file() {
    let ws = Ws::new();
    let dir = ws.misbehave("w", "good", None, EAGER);
    std::fs::create_dir(dir.join("lib")).unwrap();
    std::fs::write(dir.join("lib/data.txt"), "one\n").unwrap();
    let out = approve(&ws, &["w"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    assert!(
        eventually_blocking(Duration::from_secs(10), || state_of(&serve, "w")["state"]
            == "running"),
        "{}",
        state_of(&serve, "w")
    );

    // An in-place edit of the entry file.
    let entry = dir.join("misbehave.py");
    let mut text = std::fs::read_to_string(&entry).unwrap();
    text.push_str("\n# edited\n");
    assert_withheld_then_reapprove(&ws, &serve, "changed misbehave.py", || {
        std::fs::write(&entry, &text).unwrap()
    });

    // An editor's atomic replace: write a temporary file, rename it over.
    text.push_str("# replaced\n");
    assert_withheld_then_reapprove(&ws, &serve, "changed misbehave.py", || {
        std::fs::write(dir.join(".misbehave.py.swp"), &text).unwrap();
        std::fs::rename(dir.join(".misbehave.py.swp"), &entry).unwrap();
    });

    // A file added in a subdirectory that exists since approval.
    assert_withheld_then_reapprove(&ws, &serve, "added lib/extra.py", || {
        std::fs::write(dir.join("lib/extra.py"), "print('x')\n").unwrap()
    });

    // A removed file.
    assert_withheld_then_reapprove(&ws, &serve, "removed lib/data.txt", || {
        std::fs::remove_file(dir.join("lib/data.txt")).unwrap()
    });

    // A new directory, then a file inside it (the new directory is watched).
    assert_withheld_then_reapprove(&ws, &serve, "added new", || {
        std::fs::create_dir(dir.join("new")).unwrap()
    });
    assert_withheld_then_reapprove(&ws, &serve, "added new/inner.txt", || {
        std::fs::write(dir.join("new/inner.txt"), "x").unwrap()
    });

    // A symlink added, then retargeted.
    assert_withheld_then_reapprove(&ws, &serve, "added link.py", || {
        std::os::unix::fs::symlink("misbehave.py", dir.join("link.py")).unwrap()
    });
    assert_withheld_then_reapprove(&ws, &serve, "changed link.py", || {
        std::fs::remove_file(dir.join("link.py")).unwrap();
        std::os::unix::fs::symlink("nexo-plugin.toml", dir.join("link.py")).unwrap();
    });

    // Undoing a change gives the tools back without a new approval.
    let has_pid = |serve: &Serve| tool_names(serve).contains(&"w_pid".to_owned());
    std::fs::write(dir.join("undo.txt"), "x").unwrap();
    assert!(eventually_blocking(Duration::from_secs(5), || !has_pid(
        &serve
    )));
    std::fs::remove_file(dir.join("undo.txt")).unwrap();
    assert!(eventually_blocking(Duration::from_secs(5), || has_pid(
        &serve
    )));
    assert_eq!(state_of(&serve, "w")["approved"], true);
    assert_ne!(state_of(&serve, "w")["state"], "stopped");
    plugin_pid(&serve, "w");

    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("files changed since approval"), "{log}");
}

#[test]
fn a_plugin_over_the_watch_limit_is_polled() {
    let ws = Ws::new();
    let dir = ws.misbehave("w", "good", None, EAGER);
    let out = approve(&ws, &["w"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // No inotify watch allowed: the plugin is polled every second instead.
    let serve = Serve::start_with_env(&ws, &[("PLUGD_WATCH_MAX_DIRS", "0")]);
    assert!(eventually_blocking(Duration::from_secs(10), || state_of(
        &serve, "w"
    )["state"]
        == "running"));
    assert_withheld_then_reapprove(&ws, &serve, "added added.txt", || {
        std::fs::write(dir.join("added.txt"), "x").unwrap()
    });
    let (_, log) = serve.stop();
    assert!(log.contains("polling it every"), "{log}");
    assert!(log.contains("PLUGD_WATCH_MAX_DIRS"), "{log}");
}

#[test]
fn a_changed_plugin_names_the_file_without_serve() {
    let ws = Ws::new();
    let dir = ws.misbehave("w", "good", None, "");
    let out = approve(&ws, &["w"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ws.plugd(&["tool", "call", "w_pid", "--args", "{}"]);
    assert!(out.status.success(), "{}", stderr(&out));

    std::fs::write(dir.join("misbehave.py"), "import sys\nsys.exit(0)\n").unwrap();
    let out = ws.plugd(&["tool", "call", "w_pid", "--args", "{}"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("changed misbehave.py"), "{err}");
    assert!(err.contains("plugd plugin approve w"), "{err}");
    assert!(!err.contains("no tool"), "{err}");

    let out = ws.plugd(&["plugin", "list", "--json"]);
    let rows: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(rows[0]["state"], "changed", "{rows}");
    assert!(
        rows[0]["error"]
            .as_str()
            .unwrap()
            .contains("changed misbehave.py"),
        "{rows}"
    );
    // A truly unknown tool still says so.
    let out = ws.plugd(&["tool", "call", "nope_x", "--args", "{}"]);
    assert!(
        stderr(&out).contains("no tool \"nope_x\""),
        "{}",
        stderr(&out)
    );
}

fn three_plugins_and_a_broken_one(ws: &Ws) {
    for id in ["a", "b", "c"] {
        ws.misbehave(id, "good", None, "");
    }
    let broken = ws.plugin_dir("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("nexo-plugin.toml"), "[plugin]\nid = 3\n").unwrap();
}

#[test]
fn approve_many_ids_and_all_report_each_plugin() {
    let ws = Ws::new();
    three_plugins_and_a_broken_one(&ws);

    let out = approve(&ws, &["a", "b"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("approved a (sha256:"), "{text}");
    assert!(text.contains("approved b (sha256:"), "{text}");
    assert!(text.contains("approved 2 of 2 plugins"), "{text}");

    // --all: c is approved, broken fails and is named; a and b are left alone.
    let out = ws.plugd(&["plugin", "approve", "--all", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("approved c (sha256:"), "{text}");
    assert!(text.contains("failed broken:"), "{text}");
    assert!(!text.contains("approved a "), "{text}");
    assert!(
        text.contains("approved 1 of 2 plugins; failed: broken"),
        "{text}"
    );
    assert!(
        stderr(&out).contains("1 of 2 approvals failed: broken"),
        "{}",
        stderr(&out)
    );

    let out = ws.plugd(&["plugin", "list", "--json"]);
    let rows: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let approved: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["approved"] == true)
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(approved, ["a", "b", "c"], "{rows}");

    // An unknown id among several fails alone, named.
    let out = approve(&ws, &["a", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("failed nope:"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("approved a (sha256:"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn approve_all_goes_through_serve() {
    let ws = Ws::new();
    three_plugins_and_a_broken_one(&ws);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let out = ws.plugd(&["plugin", "approve", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    let via = format!("(via plugd serve pid {})", serve.child.id());
    for id in ["a", "b", "c"] {
        assert!(text.contains(&format!("approved {id} (sha256:")), "{text}");
    }
    assert!(text.contains(&via), "{text}");
    assert!(text.contains("failed broken:"), "{text}");
    // Serve's runtime has the tools: approvals happened there.
    let tools = tool_names(&serve);
    for t in ["a_pid", "b_pid", "c_pid"] {
        assert!(tools.contains(&t.to_owned()), "{tools:?}");
    }
    assert!(Path::new(&ws.dir().join(".plugd/listings")).is_dir());
}
