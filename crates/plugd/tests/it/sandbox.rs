//! The sandbox, hostile: a real Python plugin (`tests/plugins/sandbox_probe.py`)
//! under real bubblewrap (and under the Landlock + seccomp fallback) tries to
//! read secrets, write outside its state directory and reach a TCP listener
//! the test opens; every attempt must fail with the specific error.

use std::net::TcpListener;
use std::path::Path;

use serde_json::{Value, json};

use crate::support::*;

/// A native probe plugin `id`; `extra` is appended to its manifest.
fn probe(ws: &Ws, id: &str, extra: &str) {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/sandbox_probe.py"),
        dir.join("sandbox_probe.py"),
    )
    .unwrap();
    let manifest = format!(
        "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"sandbox_probe.py\", \"{id}\"]\n\n[plugin.extends]\ntools = [\"{id}_probe\"]\n{extra}\n"
    );
    std::fs::write(dir.join("nexo-plugin.toml"), manifest).unwrap();
}

const SANDBOX: &str =
    "[plugin.sandbox]\nenabled = true\nnetwork = \"deny\"\nfs_write_paths = [\"${state_dir}\"]\n";

fn approve(ws: &Ws, id: &str, env: &[(&str, &str)]) {
    let out = plugd_cmd(ws.dir())
        .args(["plugin", "approve", id])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "approve {id}: {}", stderr(&out));
}

/// Calls `ID_probe` with `args` through the CLI; `Ok(result)` or `Err(stderr)`.
fn call(ws: &Ws, id: &str, args: Value, env: &[(&str, &str)]) -> Result<Value, String> {
    let out = plugd_cmd(ws.dir())
        .args([
            "tool",
            "call",
            &format!("{id}_probe"),
            "--args",
            &args.to_string(),
        ])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_str(&stdout(&out)).unwrap())
    } else {
        Err(stderr(&out))
    }
}

fn error_of(v: Result<Value, String>) -> String {
    let v = v.unwrap();
    assert_eq!(v["ok"], json!(false), "expected a failure, got {v}");
    v["error"].as_str().unwrap().to_owned()
}

/// The pin plugin `id` runs from (`plugd plugin show --json`'s `cwd`).
fn pin_of(ws: &Ws, id: &str) -> std::path::PathBuf {
    let out = ws.plugd(&["plugin", "show", id, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cwd = std::path::PathBuf::from(v["cwd"].as_str().unwrap());
    assert!(cwd.starts_with(ws.dir().join(".plugd/pins")), "{cwd:?}");
    cwd
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A file under /root the test creates (and removes), so "a file under /root"
/// exists on the host for sure.
struct RootFile(std::path::PathBuf);
impl RootFile {
    fn new() -> RootFile {
        let p =
            std::path::PathBuf::from(format!("/root/.plugd-sandbox-test-{}", std::process::id()));
        std::fs::write(&p, "root secret").unwrap();
        RootFile(p)
    }
}
impl Drop for RootFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_bwrap_sandboxed_plugin_cannot_read_secrets_other_plugins_or_host_env() {
    let ws = Ws::new();
    probe(&ws, "boxed", SANDBOX);
    let other = ws.plugin_dir("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("secret.txt"), "other plugin's secret").unwrap();
    let root_file = RootFile::new();
    let env = [("PLUGD_TEST_HOST_SECRET", "hunter2")];
    approve(&ws, "boxed", &env);

    let show = stdout(&ws.plugd(&["plugin", "show", "boxed"]));
    assert!(show.contains("  sandbox:   bwrap ("), "{show}");
    assert!(
        show.contains("  runs as:   /usr/bin/bwrap --die-with-parent --unshare-pid"),
        "{show}"
    );
    assert!(
        show.contains(" --unshare-net --proc /proc --dev /dev --tmpfs /tmp "),
        "{show}"
    );
    assert!(
        show.contains("-- /usr/bin/python3 sandbox_probe.py boxed\n"),
        "{show}"
    );
    assert!(show.contains("  network:   deny"), "{show}");
    assert!(show.contains("  user:      nobody (65534)"), "{show}");
    // The command is the python3 visible in the sandbox, not a pyenv shim.
    assert!(!show.contains("command:   /root/"), "{show}");

    let who = call(&ws, "boxed", json!({"op": "whoami"}), &env).unwrap();
    assert_eq!(
        (who["uid"].clone(), who["gid"].clone()),
        (json!(65534), json!(65534))
    );

    for (p, shown) in [
        ("/etc/shadow".to_owned(), "'/etc/shadow'".to_owned()),
        (path(&root_file.0), format!("'{}'", path(&root_file.0))),
        (
            path(&other.join("secret.txt")),
            format!("'{}'", path(&other.join("secret.txt"))),
        ),
    ] {
        assert_eq!(
            error_of(call(&ws, "boxed", json!({"op": "read", "path": p}), &env)),
            format!("FileNotFoundError: [Errno 2] No such file or directory: {shown}"),
        );
    }
    let secret = call(
        &ws,
        "boxed",
        json!({"op": "env", "name": "PLUGD_TEST_HOST_SECRET"}),
        &env,
    )
    .unwrap();
    assert_eq!(secret["value"], Value::Null);
}

#[test]
fn a_bwrap_sandboxed_plugin_writes_only_its_state_dir() {
    let ws = Ws::new();
    probe(&ws, "boxed", SANDBOX);
    approve(&ws, "boxed", &[]);
    let state = ws.dir().join(".plugd/state/boxed");
    let ok = call(
        &ws,
        "boxed",
        json!({"op": "write", "path": path(&state.join("out.txt"))}),
        &[],
    );
    assert_eq!(ok.unwrap()["ok"], json!(true));
    assert_eq!(std::fs::read_to_string(state.join("out.txt")).unwrap(), "x");

    // Its own code (the pin it runs from) is read-only; the mutable source
    // directory is not even visible.
    let own = pin_of(&ws, "boxed").join("planted.py");
    assert_eq!(
        error_of(call(
            &ws,
            "boxed",
            json!({"op": "write", "path": path(&own)}),
            &[]
        )),
        format!(
            "OSError: [Errno 30] Read-only file system: '{}'",
            path(&own)
        )
    );
    let source = ws.plugin_dir("boxed").join("planted.py");
    assert_eq!(
        error_of(call(
            &ws,
            "boxed",
            json!({"op": "write", "path": path(&source)}),
            &[]
        )),
        format!(
            "FileNotFoundError: [Errno 2] No such file or directory: '{}'",
            path(&source)
        )
    );
    assert_eq!(
        error_of(call(
            &ws,
            "boxed",
            json!({"op": "write", "path": "/usr/planted"}),
            &[]
        )),
        "OSError: [Errno 30] Read-only file system: '/usr/planted'"
    );
    // The workspace itself is not in the sandbox: a write there lands in the
    // sandbox's private tmpfs, never on the host.
    let outside = ws.dir().join("planted.txt");
    let _ = call(
        &ws,
        "boxed",
        json!({"op": "write", "path": path(&outside)}),
        &[],
    );
    assert!(!outside.exists());
    assert!(!ws.plugin_dir("boxed").join("planted.py").exists());
}

#[test]
fn network_deny_blocks_a_loopback_listener_that_an_unsandboxed_plugin_reaches() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    probe(&ws, "boxed", SANDBOX);
    probe(&ws, "plain", "");
    approve(&ws, "boxed", &[]);
    approve(&ws, "plain", &[]);
    let plain = call(&ws, "plain", json!({"op": "connect", "port": port}), &[]).unwrap();
    assert_eq!(
        plain["ok"],
        json!(true),
        "the listener is reachable: {plain}"
    );
    // bwrap --unshare-net: a fresh namespace whose loopback has no listener.
    assert_eq!(
        error_of(call(
            &ws,
            "boxed",
            json!({"op": "connect", "port": port}),
            &[]
        )),
        "ConnectionRefusedError: [Errno 111] Connection refused"
    );
}

#[test]
fn sandbox_paths_reaching_the_denylist_through_dotdot_or_symlinks_are_refused_at_load() {
    let ws = Ws::new();
    probe(
        &ws,
        "dotdot",
        "[plugin.sandbox]\nenabled = true\nfs_read_paths = [\"/usr/../etc/shadow\"]\n",
    );
    let link = ws.dir().join("etc-link");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    probe(
        &ws,
        "linked",
        &format!(
            "[plugin.sandbox]\nenabled = true\nfs_read_paths = [\"{}/sudoers\"]\n",
            path(&link)
        ),
    );
    let root_link = ws.dir().join("home-link");
    std::os::unix::fs::symlink("/root", &root_link).unwrap();
    probe(
        &ws,
        "rootlink",
        &format!(
            "[plugin.sandbox]\nenabled = true\nfs_write_paths = [\"{}/.ssh\"]\n",
            path(&root_link)
        ),
    );
    let show = |id: &str| {
        let out = ws.plugd(&["plugin", "show", id]);
        assert!(!out.status.success());
        stderr(&out)
    };
    let e = show("dotdot");
    assert!(e.contains("plugin.sandbox.fs_read_paths[0]"), "{e}");
    assert!(e.contains("\"/usr/../etc/shadow\""), "{e}");
    assert!(e.contains("\"/etc/shadow\""), "{e}");
    let e = show("linked");
    assert!(e.contains("plugin.sandbox.fs_read_paths[0]"), "{e}");
    assert!(e.contains("/etc/sudoers"), "{e}");
    let e = show("rootlink");
    assert!(e.contains("plugin.sandbox.fs_write_paths[0]"), "{e}");
    assert!(e.contains("\"/root\""), "{e}");
}

#[test]
fn sandbox_require_refuses_an_unsandboxed_plugin_and_operator_policy_sandboxes_it() {
    let ws = Ws::new();
    probe(&ws, "plain", "");
    approve(&ws, "plain", &[]);
    let require = [("NEXO_PLUGIN_SANDBOX_REQUIRE", "1")];
    let err = call(&ws, "plain", json!({"op": "whoami"}), &require).unwrap_err();
    assert!(
        err.contains("plugin \"plain\" may not start: it runs without a sandbox and the operator requires one (NEXO_PLUGIN_SANDBOX_REQUIRE=1)"),
        "{err}"
    );
    // The operator sandboxes the same plugin from plugd.yaml (any dialect).
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    plain:\n      network: deny\n      limits: {open_files: 64}\n",
    )
    .unwrap();
    ws.plugd(&["plugin", "restart", "plain"]);
    let show = stdout(&ws.plugd(&["plugin", "show", "plain"]));
    assert!(
        show.contains("  from:      plugd.yaml sandbox.plugins.plain"),
        "{show}"
    );
    assert!(show.contains("  limits:    open_files=64"), "{show}");
    assert_eq!(
        error_of(call(
            &ws,
            "plain",
            json!({"op": "read", "path": "/etc/shadow"}),
            &require
        )),
        "FileNotFoundError: [Errno 2] No such file or directory: '/etc/shadow'"
    );
}

#[test]
fn missing_bwrap_fails_closed_and_the_allowed_fallback_still_contains_the_plugin() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    probe(&ws, "boxed", SANDBOX);
    let no_bwrap = [("PLUGD_BWRAP", "/nonexistent/bwrap")];
    let out = plugd_cmd(ws.dir())
        .args(["plugin", "approve", "boxed"])
        .envs(no_bwrap)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("plugin \"boxed\" asks for a sandbox but bubblewrap not found at \"/nonexistent/bwrap\" (PLUGD_BWRAP); install bubblewrap (apt install bubblewrap), or allow the Landlock+seccomp fallback"),
        "{e}"
    );

    let fallback = [
        ("PLUGD_BWRAP", "/nonexistent/bwrap"),
        ("PLUGD_SANDBOX_FALLBACK", "landlock"),
    ];
    approve(&ws, "boxed", &fallback);
    let show = stdout(
        &plugd_cmd(ws.dir())
            .args(["plugin", "show", "boxed"])
            .envs(fallback)
            .output()
            .unwrap(),
    );
    assert!(show.contains("  sandbox:   landlock+seccomp"), "{show}");
    let root_file = RootFile::new();
    let other = ws.plugin_dir("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("secret.txt"), "s").unwrap();
    for p in [
        "/etc/shadow".to_owned(),
        path(&root_file.0),
        path(&other.join("secret.txt")),
    ] {
        assert_eq!(
            error_of(call(
                &ws,
                "boxed",
                json!({"op": "read", "path": p}),
                &fallback
            )),
            format!("PermissionError: [Errno 13] Permission denied: '{p}'")
        );
    }
    let outside = ws.dir().join("planted.txt");
    assert_eq!(
        error_of(call(
            &ws,
            "boxed",
            json!({"op": "write", "path": path(&outside)}),
            &fallback
        )),
        format!(
            "PermissionError: [Errno 13] Permission denied: '{}'",
            path(&outside)
        )
    );
    let state = ws.dir().join(".plugd/state/boxed/ok.txt");
    let ok = call(
        &ws,
        "boxed",
        json!({"op": "write", "path": path(&state)}),
        &fallback,
    )
    .unwrap();
    assert_eq!(ok["ok"], json!(true));
    // Landlock scope: no signal reaches plugd from inside (an unsandboxed
    // plugin's does).
    probe(&ws, "plain", "");
    approve(&ws, "plain", &[]);
    let plain = call(&ws, "plain", json!({"op": "signal_parent"}), &[]).unwrap();
    assert_eq!(plain["ok"], json!(true), "{plain}");
    assert_eq!(
        error_of(call(
            &ws,
            "boxed",
            json!({"op": "signal_parent"}),
            &fallback
        )),
        "PermissionError: [Errno 1] Operation not permitted"
    );
    // seccomp: no socket family but AF_UNIX.
    assert_eq!(
        error_of(call(
            &ws,
            "boxed",
            json!({"op": "connect", "port": port}),
            &fallback
        )),
        "PermissionError: [Errno 1] Operation not permitted"
    );
}

#[test]
fn a_plugin_over_its_cpu_limit_is_reported_as_such() {
    let ws = Ws::new();
    probe(
        &ws,
        "burner",
        &format!("{SANDBOX}\n[plugin.limits]\ncpu_seconds = 1\n"),
    );
    approve(&ws, "burner", &[]);
    let show = stdout(&ws.plugd(&["plugin", "show", "burner"]));
    assert!(show.contains("  limits:    cpu_seconds=1"), "{show}");
    let err = call(&ws, "burner", json!({"op": "burn"}), &[]).unwrap_err();
    assert!(
        err.contains("plugin \"burner\" crashed: exit status 152 (the sandboxed program was killed by signal 24 (SIGXCPU)): the plugin exceeded its CPU limit of 1 s (limits.cpu_seconds)"),
        "{err}"
    );
}

#[test]
fn address_space_and_open_file_limits_hold_inside_the_plugin() {
    let ws = Ws::new();
    probe(
        &ws,
        "small",
        "[plugin.limits]\naddress_space_mb = 512\nopen_files = 32\n",
    );
    approve(&ws, "small", &[]);
    let show = stdout(&ws.plugd(&["plugin", "show", "small"]));
    assert!(
        show.contains("  limits:    address_space_mb=512 open_files=32"),
        "{show}"
    );
    let fits = call(&ws, "small", json!({"op": "alloc", "mb": 16}), &[]).unwrap();
    assert_eq!(fits["ok"], json!(true));
    assert_eq!(
        error_of(call(&ws, "small", json!({"op": "alloc", "mb": 1024}), &[])),
        "MemoryError: "
    );
    assert_eq!(
        error_of(call(&ws, "small", json!({"op": "open_many", "n": 64}), &[])),
        "OSError: [Errno 24] Too many open files: '/dev/null'"
    );
}

#[test]
fn operator_policy_sandboxes_a_salmex_plugin() {
    let ws = Ws::new();
    ws.example("hello-salmex-python");
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    hello-salmex-python: {network: deny}\n",
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", "hello-salmex-python"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let show = stdout(&ws.plugd(&["plugin", "show", "hello-salmex-python"]));
    assert!(show.contains("  sandbox:   bwrap ("), "{show}");
    assert!(
        show.contains("  from:      plugd.yaml sandbox.plugins.hello-salmex-python"),
        "{show}"
    );
    let tools = stdout(&ws.plugd(&["tool", "list"]));
    let name = tools
        .split_whitespace()
        .find(|w| w.starts_with("hello-salmex-python/"))
        .unwrap_or_else(|| panic!("no salmex tool in {tools}"))
        .to_owned();
    let out = ws.plugd(&["tool", "call", &name, "--args", r#"{"name":"Ada"}"#]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A VAI package `test/<name>` with two tool exports: `offline` (network
/// none, filesystem scratch) and `online` (network egress, filesystem none).
fn vai_probe(ws: &Ws, name: &str) {
    let dir = ws.plugin_dir(name);
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/vai/vai_probe.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    std::fs::write(dir.join("schemas/any.json"), r#"{"type":"object"}"#).unwrap();
    let m = format!(
        "api_version = \"vai.plugin.v1\"\npackage_id = \"test/{name}\"\nversion = \"0.1.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = [\"python3\", \"plugin.py\", \"test/{name}\", \"0.1.0\"]\n\
         \n[[exports]]\nid = \"offline\"\nkind = \"tool\"\ndescription = \"no network\"\n[exports.permissions]\nnetwork = \"none\"\nfilesystem = \"scratch\"\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n\
         \n[[exports]]\nid = \"online\"\nkind = \"tool\"\ndescription = \"egress\"\n[exports.permissions]\nnetwork = \"egress\"\nfilesystem = \"none\"\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n"
    );
    std::fs::write(dir.join("vai-plugin.toml"), m).unwrap();
}

fn vai_call(ws: &Ws, tool: &str, input: Value) -> Value {
    let out = ws.plugd(&["tool", "call", tool, "--args", &input.to_string(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    v.get("structured_output")
        .cloned()
        .unwrap_or_else(|| panic!("no structured_output in {v}"))
}

#[test]
fn vai_permissions_become_the_sandbox_and_grants_narrow_them() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    vai_probe(&ws, "probe");
    let id = "test/probe";
    // Sandboxed by the operator, with the requested permissions granted:
    // each export (isolated by default) gets a process with its own.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    test/probe: {}\n",
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let show = stdout(&ws.plugd(&["plugin", "show", id]));
    assert!(show.contains("  sandbox:   bwrap ("), "{show}");
    assert!(
        show.contains(
            "    offline: network=none filesystem=scratch -> network=none filesystem=scratch; isolated -> isolated, isolated:offline (a process per invocation)"
        ),
        "{show}"
    );
    assert!(
        show.contains(
            "    online: network=egress filesystem=none -> network=egress filesystem=none; isolated -> isolated, isolated:online"
        ),
        "{show}"
    );
    assert!(
        show.contains(
            "    isolated:online: exports online; sandbox bwrap, network host, writable -"
        ),
        "{show}"
    );
    // The worker process serves no export here: it gets nothing.
    assert!(show.contains("  network:   deny"), "{show}");
    let online = vai_call(
        &ws,
        "test/probe/online",
        json!({"op": "connect", "port": port}),
    );
    assert_eq!(online["ok"], json!(true), "{online}");
    // Writable: the invocation's scratch directory only.
    let scratch = vai_call(
        &ws,
        "test/probe/offline",
        json!({"op": "write", "path": "SCRATCH/f"}),
    );
    assert_eq!(scratch["ok"], json!(true), "{scratch}");
    let pkg = pin_of(&ws, "test/probe").join("planted");
    let planted = vai_call(
        &ws,
        "test/probe/offline",
        json!({"op": "write", "path": path(&pkg)}),
    );
    assert_eq!(
        planted["error"],
        json!(format!(
            "OSError: [Errno 30] Read-only file system: '{}'",
            path(&pkg)
        ))
    );

    // The operator grants `online` no network: its process gets none.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    test/probe:\n      grants:\n        online: {network: none}\n",
    )
    .unwrap();
    ws.plugd(&["plugin", "restart", id]);
    let show = stdout(&ws.plugd(&["plugin", "show", id]));
    assert!(
        show.contains("    online: network=egress filesystem=none -> network=none filesystem=none"),
        "{show}"
    );
    assert!(
        show.contains(
            "    isolated:online: exports online; sandbox bwrap, network deny, writable -"
        ),
        "{show}"
    );
    let online = vai_call(
        &ws,
        "test/probe/online",
        json!({"op": "connect", "port": port}),
    );
    assert_eq!(
        online["error"],
        json!("ConnectionRefusedError: [Errno 111] Connection refused")
    );
    let offline = vai_call(
        &ws,
        "test/probe/offline",
        json!({"op": "connect", "port": port}),
    );
    assert_eq!(
        offline["error"],
        json!("ConnectionRefusedError: [Errno 111] Connection refused")
    );
}

#[test]
fn host_network_needs_the_operator_capability_and_then_reaches_the_listener() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    probe(
        &ws,
        "hostnet",
        "[plugin.sandbox]\nenabled = true\nnetwork = \"host\"\n",
    );
    let out = ws.plugd(&["plugin", "show", "hostnet"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("plugin.sandbox.network: network \"host\" needs the operator capability NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1"),
        "{e}"
    );
    let allow = [("NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW", "1")];
    approve(&ws, "hostnet", &allow);
    let ok = call(
        &ws,
        "hostnet",
        json!({"op": "connect", "port": port}),
        &allow,
    )
    .unwrap();
    assert_eq!(ok["ok"], json!(true), "{ok}");
    // Still sandboxed: the filesystem is as narrow as with network deny.
    assert_eq!(
        error_of(call(
            &ws,
            "hostnet",
            json!({"op": "read", "path": "/etc/shadow"}),
            &allow
        )),
        "FileNotFoundError: [Errno 2] No such file or directory: '/etc/shadow'"
    );
}

#[test]
fn the_sandboxed_example_cannot_peek_at_shadow_but_reads_its_own_code() {
    let ws = Ws::new();
    let dir = ws.example("sandboxed-python");
    approve(&ws, "sandboxed_python", &[]);
    let peek = |p: &str| {
        let out = ws.plugd(&[
            "tool",
            "call",
            "sandboxed_python_peek",
            "--args",
            &json!({ "path": p }).to_string(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()
    };
    assert_eq!(
        peek("/etc/shadow"),
        json!({"path": "/etc/shadow", "readable": false, "error": "[Errno 2] No such file or directory: '/etc/shadow'"})
    );
    // Its own code, in the pin it runs from; not the mutable source.
    let own = path(&pin_of(&ws, "sandboxed_python").join("plugin.py"));
    assert_eq!(peek(&own)["readable"], json!(true));
    let source = path(&dir.join("plugin.py"));
    assert_eq!(peek(&source)["readable"], json!(false));
}

#[test]
fn a_program_only_reachable_through_a_denylisted_path_is_refused() {
    let bin = std::path::PathBuf::from(format!("/root/.plugd-sandbox-bin-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(bin.clone());
    let tool = bin.join("probe-python");
    std::os::unix::fs::symlink("/usr/bin/python3", &tool).unwrap();
    let ws = Ws::new();
    probe(&ws, "hidden", SANDBOX);
    let manifest = ws.plugin_dir("hidden").join("nexo-plugin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap().replace(
        "command = \"python3\"",
        &format!("command = \"{}\"", path(&tool)),
    );
    std::fs::write(&manifest, text).unwrap();
    let out = ws.plugd(&["plugin", "approve", "hidden"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains(&format!(
            "plugin \"hidden\": command \"{}\" resolves only to paths the sandbox cannot show: \"{}\"",
            path(&tool),
            path(&tool)
        )),
        "{e}"
    );
    assert!(e.contains("touches the denylisted path \"/root\""), "{e}");
}

#[test]
fn vai_permissions_are_enforced_without_any_operator_policy() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    vai_probe(&ws, "quiet");
    // Keep only the export without network.
    let manifest = ws.plugin_dir("quiet").join("vai-plugin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let offline_only = text.split("\n[[exports]]\nid = \"online\"").next().unwrap();
    std::fs::write(&manifest, offline_only).unwrap();
    let id = "test/quiet";
    let out = ws.plugd(&["plugin", "approve", id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let show = stdout(&ws.plugd(&["plugin", "show", id]));
    assert!(show.contains("  sandbox:   bwrap ("), "{show}");
    assert!(show.contains("  network:   deny"), "{show}");
    let denied = vai_call(
        &ws,
        "test/quiet/offline",
        json!({"op": "connect", "port": port}),
    );
    assert_eq!(
        denied["error"],
        json!("ConnectionRefusedError: [Errno 111] Connection refused")
    );
    let secret = vai_call(
        &ws,
        "test/quiet/offline",
        json!({"op": "read", "path": "/etc/shadow"}),
    );
    assert!(
        secret["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("FileNotFoundError: [Errno 2]")),
        "{secret}"
    );

    // Only the operator's explicit opt-out lifts it, and show says so.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    test/quiet: {enabled: false}\n",
    )
    .unwrap();
    ws.plugd(&["plugin", "restart", id]);
    let show = stdout(&ws.plugd(&["plugin", "show", id]));
    assert!(
        show.contains("VAI permissions are NOT enforced: plugd.yaml sandbox.plugins.test/quiet.enabled is false"),
        "{show}"
    );
    let open = vai_call(
        &ws,
        "test/quiet/offline",
        json!({"op": "connect", "port": port}),
    );
    assert_eq!(open["ok"], json!(true), "{open}");
}
