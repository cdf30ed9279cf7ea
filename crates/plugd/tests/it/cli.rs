//! The `plugd` binary: the JSON interfaces other checks rely on, every example
//! plugin (including the third-party `nexoai` SDK one), exit codes, and a
//! clean stop of `plugd serve` on Ctrl-C.

use std::process::Stdio;
use std::time::{Duration, Instant};

use plugd_host::spawn::process_group_alive;
use serde_json::Value;

use crate::support::{Ws, plugd_cmd, stderr, stdout};

fn json_out(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "plugd failed: {}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

#[test]
fn every_example_plugin_loads_and_its_tool_is_callable() {
    let ws = Ws::new();
    for ex in [
        "hello-rust",
        "hello-python",
        "hello-node",
        "hello-bash",
        "hello-nexoai",
    ] {
        ws.example(ex);
    }
    // Nothing is listed before approval.
    let list = json_out(&ws.plugd(&["plugin", "list", "--json"]));
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 5);
    for p in list {
        for key in ["id", "dialect", "state", "approved"] {
            assert!(p.get(key).is_some(), "plugin list --json lacks {key}: {p}");
        }
        assert_eq!(p["approved"], false);
        assert_eq!(p["dialect"], "native");
        assert_eq!(p["state"], "unapproved");
    }
    assert_eq!(
        json_out(&ws.plugd(&["tool", "list", "--json"])),
        Value::Array(vec![])
    );

    for id in [
        "hello_rust",
        "hello_python",
        "hello_node",
        "hello_bash",
        "hello_nexoai",
    ] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "approve {id}: {}", stderr(&o));
    }
    let tools = json_out(&ws.plugd(&["tool", "list", "--json"]));
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for t in tools.as_array().unwrap() {
        for key in ["name", "plugin", "description", "input_schema"] {
            assert!(t.get(key).is_some(), "tool list --json lacks {key}: {t}");
        }
    }
    for want in [
        "hello_rust_greet",
        "hello_python_greet",
        "hello_node_greet",
        "hello_bash_greet",
        "hello_nexoai_weather",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }

    for (tool, args, expect) in [
        ("hello_rust_greet", r#"{"name":"Ada"}"#, "Hello, Ada!"),
        ("hello_python_greet", r#"{"name":"Bo"}"#, "Hello, Bo!"),
        ("hello_node_greet", r#"{"name":"Cy"}"#, "Hello, Cy!"),
        ("hello_bash_greet", r#"{"name":"Di"}"#, "Hello, Di!"),
        (
            "hello_nexoai_weather",
            r#"{"city":"Oslo"}"#,
            "Sunny in Oslo",
        ),
    ] {
        let out = json_out(&ws.plugd(&["tool", "call", tool, "--args", args, "--json"]));
        assert_eq!(out["content"][0]["text"], expect, "{tool}: {out}");
    }

    // The nexoai SDK's typed error (-33402, raised with no city) reaches the CLI.
    let o = ws.plugd(&[
        "tool",
        "call",
        "hello_nexoai_weather",
        "--args",
        r#"{"city":""}"#,
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("rejected its arguments"), "{err}");
}

#[test]
fn errors_exit_non_zero_with_one_line() {
    let ws = Ws::new();
    ws.example("hello-python");
    for (args, needle) in [
        (vec!["tool", "call", "nope_tool"], "no tool \"nope_tool\""),
        (vec!["plugin", "approve", "ghost"], "no plugin \"ghost\""),
        (
            vec!["tool", "call", "x", "--args", "{not json"],
            "--args is not valid JSON",
        ),
        (
            vec!["tool", "call", "x", "--args", "[1]"],
            "must be a JSON object",
        ),
    ] {
        let o = ws.plugd(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
        assert!(
            err.starts_with("plugd: error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_broken_manifest_is_listed_with_its_reason_and_others_still_work() {
    let ws = Ws::new();
    ws.example("hello-python");
    let bad = ws.plugin_dir("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("nexo-plugin.toml"),
        "[plugin]\nid = \"bad\"\nversion = \"0.1.0\"\n[plugin.entrypoint]\ncommand = \"../../bin/sh\"\n",
    )
    .unwrap();
    let list = json_out(&ws.plugd(&["plugin", "list", "--json"]));
    let bad = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "bad")
        .unwrap();
    assert_eq!(bad["state"], "invalid");
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("escapes the plugin directory"),
        "{bad}"
    );
    let o = ws.plugd(&["plugin", "approve", "hello_python"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn plugin_show_prints_the_exact_command_and_environment() {
    let ws = Ws::new();
    ws.example("hello-python");
    let show = json_out(&ws.plugd(&["plugin", "show", "hello_python", "--json"]));
    let command = show["command"].as_array().unwrap();
    assert!(command[0].as_str().unwrap().ends_with("python3"), "{show}");
    assert_eq!(command[1], "plugin.py");
    let env = show["env"].as_object().unwrap();
    assert!(env.contains_key("PATH"));
    assert_eq!(env["PYTHONDONTWRITEBYTECODE"], "1");
    for (k, _) in env {
        assert!(
            [
                "PATH",
                "HOME",
                "LANG",
                "PYTHONDONTWRITEBYTECODE",
                "PYTHONUNBUFFERED"
            ]
            .contains(&k.as_str()),
            "{k}"
        );
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, ...
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split_whitespace().nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            out.push(child);
        }
    }
    out
}

#[test]
fn ctrl_c_of_serve_shuts_every_plugin_down_with_no_orphan() {
    let ws = Ws::new();
    ws.misbehave(
        "eager_a",
        "good",
        None,
        "[plugin.supervisor]\nstart = \"eager\"\n",
    );
    ws.misbehave(
        "eager_b",
        "ignore_shutdown",
        None,
        "[plugin.supervisor]\nstart = \"eager\"\nshutdown_timeout_ms = 300\nshutdown_grace_ms = 300\n",
    );
    for id in ["eager_a", "eager_b"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let mut serve = plugd_cmd(ws.dir())
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = serve.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut kids = Vec::new();
    while Instant::now() < deadline {
        kids = children_of(pid);
        if kids.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(kids.len(), 2, "both eager plugins run under serve");
    // Let the handshakes finish, then Ctrl-C.
    std::thread::sleep(Duration::from_millis(500));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let status = serve.wait().unwrap();
    let mut log = String::new();
    std::io::Read::read_to_string(serve.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(
        status.success(),
        "serve exits 0 after Ctrl-C: {status:?}\n{log}"
    );
    assert!(log.contains("all plugins stopped"), "{log}");
    // Killed groups may leave a zombie for init to reap for a moment.
    let end = Instant::now() + Duration::from_secs(5);
    while kids.iter().any(|k| process_group_alive(*k)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    for kid in kids {
        assert!(
            !process_group_alive(kid),
            "plugin group {kid} outlived plugd serve\n{log}"
        );
    }
}

#[test]
fn bench_reports_every_measurement() {
    let ws = Ws::new();
    let o = ws.plugd(&[
        "bench",
        "--json",
        "--iterations",
        "200",
        "--duration-ms",
        "100",
        "--cold-starts",
        "2",
        "--idle-plugins",
        "2",
    ]);
    let r = json_out(&o);
    for key in ["raw_pipe", "plugin_pipe", "plugd_sequential"] {
        assert!(r[key]["p50_us"].as_f64().unwrap() > 0.0, "{key}: {r}");
        assert!(r[key]["p99_us"].as_f64().unwrap() >= r[key]["p50_us"].as_f64().unwrap());
    }
    assert!(r["p50_ratio"].as_f64().unwrap() > 0.0);
    // The same line to the plugin itself, over a raw pipe with no plugd.
    assert!(
        r["plugin_pipe"]["p50_us"].as_f64().unwrap() > 0.0
            && r["p50_ratio_plugin"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    let levels: Vec<u64> = r["throughput"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["in_flight"].as_u64().unwrap())
        .collect();
    assert_eq!(levels, [1, 16, 64]);
    assert!(
        r["throughput"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["calls_per_sec"].as_f64().unwrap() > 0.0)
    );
    let cold: Vec<&str> = r["cold_start"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["plugin"].as_str().unwrap())
        .collect();
    assert_eq!(cold, ["hello_rust", "hello_python"]);
    assert!(r["host_kib_per_idle_plugin"].is_number());
}
