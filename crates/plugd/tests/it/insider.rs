//! Plugins see a view, not the host: an "insider" plugin without a sandbox
//! (tests/plugins/sandbox_probe.py) under a real `plugd serve` tries to call
//! serve's own API over `.plugd/serve.sock`, append to `plugd.yaml`, read
//! `.plugd/state.db`, the master key file and another plugin's directory,
//! and read serve's `/proc/<pid>/environ`; in the view every attempt fails.
//! The same plugin with the Landlock fallback forced. Then real third-party
//! MCP servers (server-filesystem, server-memory from npm, mcp-server-sqlite
//! from PyPI) given the workspace: they do their ordinary work in it, and
//! `.plugd/state.db` stays out of their reach.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::baseline::{cli, probe};
use crate::http::Serve;
use crate::support::*;

const MASTER_KEY: &str = crate::support::TEST_MASTER_KEY;

/// A workspace with the approved probe plugin `insider`, another plugin's
/// secret, a `plugd.yaml`, and the master key file under its own
/// `XDG_CONFIG_HOME`; the environment for plugd.
struct Insider {
    ws: Ws,
    _config_home: tempfile::TempDir,
    key_file: PathBuf,
    other_secret: PathBuf,
    env: Vec<(&'static str, String)>,
}

const POLICY: &str = "eager: [insider]\n";

fn insider(extra_env: &[(&'static str, &str)]) -> Insider {
    let ws = Ws::new();
    probe(&ws, "insider", &[]);
    std::fs::write(ws.dir().join("plugd.yaml"), POLICY).unwrap();
    let other = ws.plugin_dir("other");
    std::fs::create_dir_all(&other).unwrap();
    let other_secret = other.join("secret.txt");
    std::fs::write(&other_secret, "other plugin's secret").unwrap();
    std::fs::write(ws.dir().join("notes.txt"), "workspace file").unwrap();
    let config_home = tempfile::tempdir().unwrap();
    let key_file = config_home.path().join("plugd/master.key");
    std::fs::create_dir_all(key_file.parent().unwrap()).unwrap();
    std::fs::write(&key_file, MASTER_KEY).unwrap();
    let mut env = vec![
        ("XDG_CONFIG_HOME", config_home.path().display().to_string()),
        ("PLUGD_MASTER_KEY", MASTER_KEY.to_owned()),
    ];
    env.extend(extra_env.iter().map(|(k, v)| (*k, (*v).to_owned())));
    cli(&ws, &["plugin", "approve", "insider"], &env).unwrap();
    Insider {
        ws,
        _config_home: config_home,
        key_file,
        other_secret,
        env,
    }
}

fn start(i: &Insider) -> Serve {
    let env: Vec<(&str, &str)> = i.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Serve::start_with_env(&i.ws, &env)
}

/// One probe through serve's HTTP API (the plugin runs under serve).
fn attempt(serve: &Serve, args: Value) -> Value {
    let r = serve.post("/v1/tools/insider_probe:invoke", &json!({ "args": args }));
    assert_eq!(r.status, 200, "{}", r.json());
    r.json()
}

fn read(serve: &Serve, p: &Path) -> Value {
    attempt(serve, json!({"op": "read", "path": p}))
}

fn error(v: &Value) -> &str {
    v["error"].as_str().unwrap_or_default()
}

#[test]
fn an_insider_plugin_reaches_nothing_of_plugd_in_the_view() {
    if crate::support::sqlite_only("a plugin's reads of the SQLite state file (`.plugd/state.db`)")
    {
        return;
    }
    let i = insider(&[("PLUGD_BASELINE", "view")]);
    let ws = i.ws.dir();
    let serve = start(&i);
    let sock = ws.join(".plugd/serve.sock");
    // The socket is there for everyone outside the view.
    assert!(sock.exists());
    let state_db = ws.join(".plugd/state.db");
    assert!(state_db.is_file());
    // The plugin runs, and sees the workspace.
    assert_eq!(
        read(&serve, &ws.join("notes.txt")),
        json!({"ok": true, "bytes": 14})
    );

    // serve's own API over its socket: there is no socket.
    let api = attempt(
        &serve,
        json!({"op": "unix_get", "path": sock, "target": "/v1/plugins"}),
    );
    assert_eq!(
        api,
        json!({"ok": false, "error": "FileNotFoundError: [Errno 2] No such file or directory"})
    );
    // Its policy: read-only.
    let yaml = ws.join("plugd.yaml");
    let append = attempt(
        &serve,
        json!({"op": "append", "path": yaml, "text": "sandbox: {plugins: {insider: {baseline: false}}}\n"}),
    );
    assert_eq!(
        error(&append),
        format!(
            "OSError: [Errno 30] Read-only file system: '{}'",
            yaml.display()
        ),
        "{append}"
    );
    // State, keys, other plugins: absent.
    for p in [&state_db, &i.key_file, &i.other_secret] {
        assert_eq!(
            read(&serve, p),
            json!({"ok": false, "error": format!("FileNotFoundError: [Errno 2] No such file or directory: '{}'", p.display())}),
            "{}",
            p.display()
        );
    }
    // serve's environment: its pid does not exist in the plugin's PID
    // namespace.
    let pid = serve.child.id();
    let environ = attempt(&serve, json!({"op": "environ_of", "pid": pid}));
    assert_eq!(
        error(&environ),
        format!("FileNotFoundError: [Errno 2] No such file or directory: '/proc/{pid}/environ'"),
        "{environ}"
    );
    // The same read of its own process works (so the one above could pass).
    let whoami = attempt(&serve, json!({"op": "whoami"}));
    let inner = whoami["pid"].as_u64().unwrap();
    assert_eq!(
        attempt(&serve, json!({"op": "environ_of", "pid": inner})),
        json!({"ok": true, "has_master_key": false})
    );

    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert_eq!(std::fs::read_to_string(&yaml).unwrap(), POLICY);
    assert!(!log.contains("containment view cannot be built"), "{log}");
}

/// The host processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| {
            plugd_host::procs::stat(p).is_some_and(|s| s.ppid == pid as i32 && s.state != 'Z')
        })
        .map(|p| p as u32)
        .collect()
}

#[test]
fn the_view_is_restarted_after_a_crash_and_on_request_and_stopped_with_serve() {
    let i = insider(&[("PLUGD_BASELINE", "view")]);
    let serve = start(&i);
    let serve_pid = serve.child.id();
    assert_eq!(attempt(&serve, json!({"op": "whoami"}))["ok"], json!(true));
    // serve's child is bwrap; the plugin is inside its PID namespace.
    let first = children_of(serve_pid);
    assert_eq!(first.len(), 1, "{first:?}");
    let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    assert_eq!(comm(first[0]).trim(), "bwrap");
    let gone = |p: u32| plugd_host::procs::stat(p as i32).is_none_or(|s| s.state == 'Z');

    // A crash: killed by SIGKILL inside, bwrap exits 128 + 9, plugd says so
    // and starts it again.
    let r = serve.post(
        "/v1/tools/insider_probe:invoke",
        &json!({"args": {"op": "die", "signal": 9}}),
    );
    assert_ne!(r.status, 200, "{}", r.text());
    assert!(
        r.text()
            .contains("exit status 137 (the sandboxed program was killed by signal 9 (SIGKILL))"),
        "{}",
        r.text()
    );
    assert!(eventually_blocking(
        std::time::Duration::from_secs(10),
        || gone(first[0])
    ));
    assert!(
        eventually_blocking(std::time::Duration::from_secs(30), || {
            serve
                .post(
                    "/v1/tools/insider_probe:invoke",
                    &json!({"args": {"op": "whoami"}}),
                )
                .status
                == 200
        }),
        "not restarted after the crash"
    );
    let second = children_of(serve_pid);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);

    // A restart on request replaces the whole view.
    let r = serve.post("/v1/plugins/insider:restart", &json!({}));
    assert!(r.status < 300, "{}", r.text());
    assert!(eventually_blocking(
        std::time::Duration::from_secs(10),
        || gone(second[0])
    ));
    assert_eq!(attempt(&serve, json!({"op": "whoami"}))["ok"], json!(true));
    let third = children_of(serve_pid);
    assert_eq!(third.len(), 1, "{third:?}");
    assert_ne!(third, second);

    // Stopping serve stops it.
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(eventually_blocking(
        std::time::Duration::from_secs(10),
        || gone(third[0])
    ));
}

#[test]
fn with_the_landlock_fallback_forced_the_insider_reads_are_refused() {
    if crate::support::sqlite_only("a plugin's reads of the SQLite state file (`.plugd/state.db`)")
    {
        return;
    }
    let i = insider(&[("PLUGD_BASELINE", "landlock")]);
    let ws = i.ws.dir();
    let show = cli(&i.ws, &["plugin", "show", "insider"], &i.env).unwrap();
    assert!(
        show.contains("  baseline:  on, landlock (ABI ")
            && show.contains("), fallback: forced by PLUGD_BASELINE=landlock"),
        "{show}"
    );
    assert!(show.contains("not covered: writes to plugd.yaml"), "{show}");
    let serve = start(&i);
    let state_db = ws.join(".plugd/state.db");
    for p in [&state_db, &i.key_file, &i.other_secret] {
        assert_eq!(
            read(&serve, p),
            json!({"ok": false, "error": format!("PermissionError: [Errno 13] Permission denied: '{}'", p.display())}),
            "{}",
            p.display()
        );
    }
    // Landlock does not govern connect() on serve's socket: serve's peer
    // check refuses the plugin's process there, naming it.
    let api = attempt(
        &serve,
        json!({"op": "unix_get", "path": ws.join(".plugd/serve.sock"), "target": "/v1/plugins"}),
    );
    let answer = api["status"].as_str().unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 403"), "{api}");
    assert!(
        eventually_blocking(std::time::Duration::from_secs(5), || serve
            .log_text()
            .contains(
                "refused a connection to plugd's socket from plugin insider's process"
            )),
        "{}",
        serve.log_text()
    );
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn without_a_usable_bwrap_the_view_falls_back_to_landlock_or_refuses_under_require() {
    if crate::support::sqlite_only("a plugin's reads of the SQLite state file (`.plugd/state.db`)")
    {
        return;
    }
    let i = insider(&[]);
    let ws = i.ws.dir();
    let no_bwrap = |mode: &str| -> Vec<(&'static str, String)> {
        let mut env = i.env.clone();
        env.push(("PLUGD_BASELINE", mode.to_owned()));
        env.push(("PLUGD_BWRAP", "/nonexistent/bwrap".to_owned()));
        env
    };
    let state_db = ws.join(".plugd/state.db");
    let args = json!({"op": "read", "path": state_db}).to_string();
    let call = ["tool", "call", "insider_probe", "--args", &args];
    // Best effort (the default): the Landlock fallback, said in show.
    let out = cli(&i.ws, &call, &no_bwrap("view")).unwrap();
    assert!(out.contains("Permission denied"), "{out}");
    let show = cli(&i.ws, &["plugin", "show", "insider"], &no_bwrap("view")).unwrap();
    assert!(
        show.contains("  baseline:  on, landlock (ABI ")
            && show.contains("fallback: bubblewrap not found at \"/nonexistent/bwrap\""),
        "{show}"
    );
    assert!(show.contains("not covered: writes to plugd.yaml"), "{show}");
    // `sandbox.baseline: require`: refused, naming why.
    std::fs::write(
        ws.join("plugd.yaml"),
        "eager: [insider]\nsandbox:\n  baseline: require\n",
    )
    .unwrap();
    let err = cli(&i.ws, &call, &no_bwrap("view")).unwrap_err();
    assert!(
        err.contains("the view that hides plugd from it cannot be built")
            && err.contains("sandbox: {baseline: require}"),
        "{err}"
    );
    let show = cli(&i.ws, &["plugin", "show", "insider"], &no_bwrap("view")).unwrap();
    assert!(
        show.contains("  baseline:  refused: the view cannot be built"),
        "{show}"
    );
    // With the fallback forced by the operator, require means Landlock
    // (after the restart the failed start asks for).
    cli(
        &i.ws,
        &["plugin", "restart", "insider"],
        &no_bwrap("landlock"),
    )
    .unwrap();
    let out = cli(&i.ws, &call, &no_bwrap("landlock")).unwrap();
    assert!(out.contains("Permission denied"), "{out}");
}

/// The installed npm package's entry point (scripts/test installs it).
fn npm_tool(package: &str) -> PathBuf {
    let p = repo().join(format!(
        ".npm-tools/node_modules/@modelcontextprotocol/{package}/dist/index.js"
    ));
    assert!(
        p.exists(),
        "{} is missing: run ./scripts/test, which installs @modelcontextprotocol/{package} into .npm-tools/",
        p.display()
    );
    p
}

/// `mcp-server-sqlite` in its own venv (scripts/test creates it).
fn sqlite_server() -> PathBuf {
    let p = repo().join(".venv-mcp-sqlite/bin/mcp-server-sqlite");
    assert!(
        p.exists(),
        "{} is missing: run ./scripts/test, which installs mcp-server-sqlite into .venv-mcp-sqlite/",
        p.display()
    );
    p
}

/// The environment of the CLI in the view (the suite's default is Landlock).
fn view_env() -> [(&'static str, String); 2] {
    [
        ("PLUGD_MASTER_KEY", MASTER_KEY.to_owned()),
        ("PLUGD_BASELINE", "view".to_owned()),
    ]
}

/// `plugd tool call NAME --args ARGS --yes`: the result, or the error.
fn tool(ws: &Ws, name: &str, args: Value) -> Result<Value, String> {
    cli(
        ws,
        &["tool", "call", name, "--args", &args.to_string(), "--yes"],
        &view_env(),
    )
    .map(|out| serde_json::from_str(&out).unwrap())
}

fn text(v: &Value) -> String {
    v["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn third_party_servers_do_their_work_in_the_workspace_and_not_in_plugd() {
    if crate::support::sqlite_only("a plugin's reads of the SQLite state file (`.plugd/state.db`)")
    {
        return;
    }
    let ws = Ws::new();
    let dir = ws.dir().canonicalize().unwrap();
    let memory = dir.join("memory.jsonl");
    let db = dir.join("data.db");
    std::fs::write(
        dir.join(".mcp.json"),
        serde_json::to_vec_pretty(&json!({"mcpServers": {
            "fs": {"command": "node", "args": [npm_tool("server-filesystem"), dir]},
            "sqlite": {"command": sqlite_server(), "args": ["--db-path", db]},
            "memory": {"command": "node", "args": [npm_tool("server-memory")],
                       "env": {"MEMORY_FILE_PATH": memory}},
            // The memory server pointed at plugd's state database.
            "spy": {"command": "node", "args": [npm_tool("server-memory")],
                    "env": {"MEMORY_FILE_PATH": dir.join(".plugd/state.db")}},
        }}))
        .unwrap(),
    )
    .unwrap();
    for id in ["fs", "sqlite", "memory", "spy"] {
        cli(&ws, &["plugin", "approve", id], &view_env()).unwrap();
    }
    let state_db = dir.join(".plugd/state.db");
    assert!(
        std::fs::read(&state_db)
            .unwrap()
            .starts_with(b"SQLite format 3\0")
    );

    // server-filesystem lists the workspace, creates a file and a directory.
    let listing = text(&tool(&ws, "fs/list_directory", json!({"path": dir})).unwrap());
    assert!(listing.contains("[FILE] .mcp.json"), "{listing}");
    tool(
        &ws,
        "fs/write_file",
        json!({"path": dir.join("notes.md"), "content": "# notes\n"}),
    )
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.md")).unwrap(),
        "# notes\n"
    );
    tool(
        &ws,
        "fs/create_directory",
        json!({"path": dir.join("docs/drafts")}),
    )
    .unwrap();
    assert!(dir.join("docs/drafts").is_dir());
    let listing = text(&tool(&ws, "fs/list_directory", json!({"path": dir})).unwrap());
    assert!(
        listing.contains("[FILE] notes.md") && listing.contains("[DIR] docs"),
        "{listing}"
    );
    // ... but plugd's state database is not there for it.
    let err = tool(&ws, "fs/read_text_file", json!({"path": state_db})).unwrap_err();
    assert!(err.contains("ENOENT: no such file or directory"), "{err}");

    // mcp-server-sqlite creates and writes its database in the workspace.
    tool(
        &ws,
        "sqlite/create_table",
        json!({"query": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"}),
    )
    .unwrap();
    tool(
        &ws,
        "sqlite/write_query",
        json!({"query": "INSERT INTO notes (body) VALUES ('from the view')"}),
    )
    .unwrap();
    let rows = text(
        &tool(
            &ws,
            "sqlite/read_query",
            json!({"query": "SELECT body FROM notes"}),
        )
        .unwrap(),
    );
    assert!(rows.contains("from the view"), "{rows}");
    assert!(
        std::fs::read(&db)
            .unwrap()
            .starts_with(b"SQLite format 3\0")
    );
    // ... and cannot attach plugd's.
    let attach = tool(
        &ws,
        "sqlite/write_query",
        json!({"query": format!("ATTACH DATABASE '{}' AS plugd", state_db.display())}),
    );
    let attach = match attach {
        Ok(v) => text(&v),
        Err(e) => e,
    };
    assert!(attach.contains("unable to open database"), "{attach}");

    // server-memory saves its graph in the workspace.
    tool(
        &ws,
        "memory/create_entities",
        json!({"entities": [{"name": "ada", "entityType": "person", "observations": ["wrote the first program"]}]}),
    )
    .unwrap();
    let saved = std::fs::read_to_string(&memory).unwrap();
    assert!(
        saved.contains("\"name\":\"ada\"") && saved.contains("wrote the first program"),
        "{saved}"
    );
    // Pointed at plugd's state database, it finds nothing there (a readable
    // SQLite file would fail its JSON parse).
    let graph = tool(&ws, "spy/read_graph", json!({})).unwrap();
    assert_eq!(
        graph["structuredContent"],
        json!({"entities": [], "relations": []}),
        "{graph}"
    );
}
