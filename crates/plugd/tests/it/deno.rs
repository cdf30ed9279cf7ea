//! `interpreter: "deno"`: a real Deno plugin (`tests/plugins/salmex/deno-probe`)
//! runs under `deno run` with permission flags derived from its effective
//! permissions: it reads its own directory but not the rest of the machine,
//! writes only its state directory, and connects out only because its
//! effective network is `host` (no sandbox). scripts/test installs Deno.

use std::net::TcpListener;

use serde_json::Value;

use crate::support::{Ws, repo, stderr, stdout};

const ID: &str = "deno-probe";

/// Deno is installed by scripts/test (`ensure_deno`, into /usr/local/bin
/// where the sandbox sees it); a machine without it fails here, saying so.
fn require_deno() {
    #[allow(clippy::disallowed_methods)] // probing the machine for the interpreter
    let ok = std::process::Command::new("deno")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "deno is not on PATH: run ./scripts/test, which installs Deno into /usr/local/bin"
    );
}

/// A workspace holding the Deno probe plugin (not yet approved).
fn probe_ws() -> Ws {
    let ws = Ws::new();
    let to = ws.plugin_dir(ID);
    std::fs::create_dir_all(&to).unwrap();
    for f in ["plugin.json", "main.ts"] {
        std::fs::copy(
            repo().join("tests/plugins/salmex/deno-probe").join(f),
            to.join(f),
        )
        .unwrap();
    }
    ws
}

fn call(ws: &Ws, tool: &str, args: &str) -> (Option<i32>, String) {
    let out = ws.plugd(&[
        "tool",
        "call",
        &format!("{ID}/{tool}"),
        "--args",
        args,
        "--json",
    ]);
    let text = if out.status.success() {
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    } else {
        stderr(&out)
    };
    (out.status.code(), text)
}

#[test]
fn deno_plugins_run_with_permissions_derived_from_the_effective_ones() {
    let ws = probe_ws();
    require_deno();
    let out = ws.plugd(&["plugin", "approve", ID]);
    assert!(out.status.success(), "approve: {}", stderr(&out));

    // The command line shows the flags.
    let out = ws.plugd(&["plugin", "show", ID, "--json"]);
    let show: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let args: Vec<&str> = show["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&args[1..3], ["run", "--no-prompt"], "{args:?}");
    assert!(
        args.iter().any(|a| a.starts_with("--allow-read=")),
        "{args:?}"
    );
    assert!(args.contains(&"--allow-net"), "{args:?}");
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--allow-env") || a.starts_with("--allow-run") || *a == "-A"),
        "{args:?}"
    );
    assert_eq!(args.last(), Some(&"main.ts"), "{args:?}");

    assert_eq!(
        call(&ws, "say_hello", r#"{"name":"Ada"}"#),
        (Some(0), "Hello, Ada!".to_owned())
    );
    // Its own directory: readable.
    let (code, text) = call(&ws, "read", r#"{"path":"plugin.json"}"#);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("deno-probe"), "{text}");
    // Elsewhere: Deno refuses (no sandbox here, so this is Deno's own check).
    let secret = ws.dir().join("outside.txt");
    std::fs::write(&secret, "secret").unwrap();
    let (code, text) = call(
        &ws,
        "read",
        &format!(r#"{{"path":{:?}}}"#, secret.display().to_string()),
    );
    assert_eq!(code, Some(6), "{text}");
    assert!(
        text.contains("read access") && !text.contains("\"secret\""),
        "{text}"
    );
    // Writes: not into its (pinned) directory, yes into its state directory.
    let (code, text) = call(&ws, "write", r#"{"path":"dropped.txt"}"#);
    assert_eq!(code, Some(6), "{text}");
    assert!(text.contains("write access"), "{text}");
    let state = ws.dir().join(".plugd/state").join(ID);
    std::fs::create_dir_all(&state).unwrap();
    let target = state.join("out.txt");
    let (code, text) = call(
        &ws,
        "write",
        &format!(r#"{{"path":{:?}}}"#, target.display().to_string()),
    );
    assert_eq!((code, text.as_str()), (Some(0), "written"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "probe");
    // Network: granted (effective network `host` without a sandbox).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (code, text) = call(&ws, "connect", &format!(r#"{{"port":{port}}}"#));
    assert_eq!((code, text.as_str()), (Some(0), "connected"));
}

#[test]
fn a_sandboxed_deno_plugin_without_network_gets_no_net_permission() {
    require_deno();
    let ws = probe_ws();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!("sandbox:\n  fallback: landlock\n  plugins:\n    {ID}: {{enabled: true, network: deny}}\n"),
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "show", ID, "--json"]);
    let show: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(show["permissions"]["network"], "deny", "{show}");
    let args: Vec<&str> = show["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--no-remote"), "{args:?}");
    assert!(!args.contains(&"--allow-net"), "{args:?}");
    let out = ws.plugd(&["plugin", "approve", ID]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (code, text) = call(&ws, "connect", &format!(r#"{{"port":{port}}}"#));
    assert_eq!(code, Some(6), "{text}");
    assert!(text.contains("net access"), "{text}");
}
