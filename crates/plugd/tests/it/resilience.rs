//! Nothing is lost, nothing stalls: one serve per workspace, a state database
//! that vanished or was emptied is refused (and `plugd state reset` recovers),
//! a plugin flooding stderr and dropped publishes while nobody reads serve's
//! stderr cannot stall the API or another plugin's calls, and eager starts
//! wait their turn at the start gate instead of missing their deadline.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStderr, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Ws, plugd_cmd, repo, stderr, stdout};

/// A `plugd serve` whose stderr is a pipe the test reads only when it says so.
struct Serve {
    child: Child,
    addr: SocketAddr,
    /// An admin token for `addr`.
    token: String,
    err: Option<ChildStderr>,
}

impl Serve {
    fn start(ws: &Ws, env: &[(&str, &str)]) -> Serve {
        let token = crate::http::make_token(ws, "admin");
        let mut child = plugd_cmd(ws.dir())
            .envs(env.iter().copied())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The socket's line comes first, then the TCP one.
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0)
            && !line.starts_with("plugd serving on http://")
        {
            line.clear();
        }
        let err = child.stderr.take();
        let Some(url) = line.trim().strip_prefix("plugd serving on http://") else {
            let _ = child.kill();
            let mut log = String::new();
            let _ = err.unwrap().read_to_string(&mut log);
            panic!("no serving line ({line:?}); log:\n{log}");
        };
        Serve {
            addr: url.parse().unwrap(),
            token,
            child,
            err,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts draining stderr; SIGTERM; the whole log once serve exited.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let mut err = self.err.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        });
        term(self.child.id());
        let status = self.child.wait().unwrap();
        (status, reader.join().unwrap())
    }

    fn get(&self, path: &str) -> (u16, Value) {
        http(self, "GET", path, None)
    }

    /// One counter of `GET /metrics`.
    fn metric(&self, name: &str) -> u64 {
        let (code, text) = http_text(self, "GET", "/metrics", None);
        assert_eq!(code, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    }

    fn call(&self, tool: &str, args: Value) -> (u16, Value) {
        http(
            self,
            "POST",
            &format!("/v1/tools/{tool}:invoke"),
            Some(json!({ "args": args })),
        )
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn term(pid: u32) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
}

/// One HTTP/1.1 request (`Connection: close`); a stalled serve fails the
/// test through the 60 s read timeout instead of hanging it.
fn http(serve: &Serve, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let (status, text) = http_text(serve, method, path, body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn http_text(serve: &Serve, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let addr = serve.addr;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        serve.token,
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("{method} {path}: no answer from plugd serve: {e}"));
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad response {text:?}"));
    (status, body.to_owned())
}

/// The flood plugin `flood` (tools flood_go, flood_status, flood_echo) and a
/// well-behaved `calm` one, both approved.
fn flood_workspace() -> Ws {
    let ws = Ws::new();
    let dir = ws.plugin_dir("flood");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/resilience/flood.py"),
        dir.join("flood.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"flood\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"flood.py\"]\n\n[plugin.extends]\ntools = [\"flood_go\", \"flood_status\", \"flood_echo\"]\n",
    )
    .unwrap();
    ws.misbehave("calm", "good", None, "");
    for id in ["flood", "calm"] {
        let o = ws.plugd(&["plugin", "approve", id, "--by", "test"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    ws
}

/// Waits until the flood plugin wrote everything it was asked to, asking
/// `calm` for an echo and serve for its plugin list at every poll: each must
/// be answered while the flood runs and serve's stderr is not read.
fn ride_out_the_flood(serve: &Serve, stderr_lines: u64, publishes: u64) -> u64 {
    let mut answered = 0;
    let done = eventually_blocking(Duration::from_secs(240), || {
        let (code, echo) = serve.call("calm_echo", json!({ "n": answered }));
        assert_eq!(code, 200, "{echo}");
        assert_eq!(echo["echo"]["n"], answered, "{echo}");
        let (code, list) = serve.get("/v1/plugins");
        assert_eq!(code, 200, "{list}");
        answered += 1;
        let (code, status) = serve.call("flood_status", json!({}));
        assert_eq!(code, 200, "{status}");
        status["done"] == true
            && status["stderr_written"] == stderr_lines
            && status["published"] == publishes
    });
    assert!(done, "the flood did not finish");
    answered
}

#[test]
fn a_flood_with_serves_stderr_unread_stalls_nothing_and_the_log_stays_bounded() {
    const N: u64 = 1_000_000;
    let ws = flood_workspace();
    let serve = Serve::start(&ws, &[]);
    let (code, started) = serve.call("flood_go", json!({"stderr": N, "publish": N}));
    assert_eq!(code, 200, "{started}");
    let answered = ride_out_the_flood(&serve, N, N);
    assert!(answered >= 1);
    // Every dropped publish is counted, none lost to the throttling.
    let dropped = eventually_blocking(Duration::from_secs(60), || {
        let (_, p) = serve.get("/v1/plugins/flood");
        p["broker"]["dropped"] == N
    });
    let (_, p) = serve.get("/v1/plugins/flood");
    assert!(dropped, "{p}");
    // Still answering after the flood.
    let (code, echo) = serve.call("calm_echo", json!({"after": true}));
    assert_eq!(
        (code, &echo["echo"]["after"]),
        (200, &json!(true)),
        "{echo}"
    );
    // All but the budget's 1,000 lines (per 10 s) were suppressed, and counted.
    let suppressed = serve.metric("plugd_stderr_lines_suppressed_total");
    assert!(
        (N - 20_000..=N).contains(&suppressed),
        "{suppressed} suppressed"
    );

    let (status, log) = serve.stop();
    assert!(status.success(), "{status:?}\n{}", tail(&log));
    let lines = log.lines().count();
    // 2,000,000 events in; a bounded log out (1,000 stderr lines per plugin
    // per 10 s, one publish warning per interval per topic, summaries).
    assert!(lines < 20_000, "{lines} log lines:\n{}", tail(&log));
    let suppressed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("suppressed") && l.contains("stderr lines"))
        .collect();
    assert!(
        !suppressed.is_empty(),
        "no suppression summary:\n{}",
        tail(&log)
    );
    let summary = log
        .lines()
        .find(|l| l.contains("publishes on agent.x in the last"))
        .unwrap_or_else(|| panic!("no dropped-publish summary:\n{}", tail(&log)));
    assert!(summary.contains("dropped "), "{summary}");
    let full_drop_lines = log
        .lines()
        .filter(|l| l.contains("broker.publish dropped:"))
        .count();
    assert!(
        full_drop_lines < 100,
        "{full_drop_lines} full drop warnings"
    );
}

#[test]
fn serve_counts_log_lines_it_cannot_write_instead_of_blocking() {
    // No stderr budget: every line is logged, and nobody reads serve's
    // stderr, so the bounded log queue must drop (and count) instead of blocking.
    const N: u64 = 200_000;
    let ws = flood_workspace();
    let serve = Serve::start(&ws, &[("PLUGD_STDERR_LOG_LINES", "100000000")]);
    let (code, started) = serve.call("flood_go", json!({"stderr": N, "publish": 0}));
    assert_eq!(code, 200, "{started}");
    ride_out_the_flood(&serve, N, 0);
    assert!(serve.metric("plugd_log_lines_dropped_total") > 0);
    assert_eq!(serve.metric("plugd_stderr_lines_suppressed_total"), 0);
    let (status, log) = serve.stop();
    assert!(status.success(), "{status:?}\n{}", tail(&log));
    let line = log
        .lines()
        .find(|l| l.contains("the log writer dropped") && l.contains("lines in all"))
        .unwrap_or_else(|| panic!("no drop count at exit:\n{}", tail(&log)));
    let n: u64 = line
        .split("dropped ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"));
    assert!(n > 0 && n <= N + 1_000, "{line}");
    let logged = log.lines().filter(|l| l.contains("flood line")).count() as u64;
    // What was written plus what was dropped covers the flood.
    assert!(logged + n >= N, "logged {logged} + dropped {n} < {N}");
}

/// Polls `f` (every 50 ms) until it is true or `limit` passes.
fn eventually_blocking(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[test]
fn a_second_serve_on_one_workspace_is_refused_naming_the_first() {
    if crate::support::sqlite_only("it ends with `plugd state reset` of the SQLite file") {
        return;
    }
    let ws = Ws::new();
    ws.misbehave("calm", "good", None, "");
    assert!(
        ws.plugd(&["plugin", "approve", "calm", "--by", "test"])
            .status
            .success()
    );
    let first = Serve::start(&ws, &[]);
    let record = std::fs::read_to_string(ws.dir().join(".plugd/serve.json")).unwrap();
    let second = ws.plugd(&["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
    let msg = stderr(&second);
    assert!(
        msg.contains(&format!("another plugd serve (pid {})", first.pid())),
        "{msg}"
    );
    assert!(
        !stdout(&second).contains("plugd serving"),
        "{}",
        stdout(&second)
    );
    // Nor can the state be reset under a running serve.
    let reset = ws.plugd(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(1), "{}", stderr(&reset));
    assert!(
        stderr(&reset).contains(&format!("pid {}", first.pid())),
        "{}",
        stderr(&reset)
    );
    assert!(ws.dir().join(".plugd/state.db").exists());
    // The first keeps serving, its record untouched.
    assert_eq!(
        std::fs::read_to_string(ws.dir().join(".plugd/serve.json")).unwrap(),
        record
    );
    let (code, echo) = first.call("calm_echo", json!({"still": "here"}));
    assert_eq!(code, 200, "{echo}");
    let (status, _) = first.stop();
    assert!(status.success());
    assert!(!ws.dir().join(".plugd/serve.json").exists());
    // Once it stopped, a new serve starts.
    let third = Serve::start(&ws, &[]);
    assert_eq!(third.get("/v1/plugins").0, 200);
    // A kill -9 releases the lock too.
    let pid = third.pid();
    let mut third = third;
    third.child.kill().unwrap();
    third.child.wait().unwrap();
    let fourth = Serve::start(&ws, &[]);
    assert_ne!(fourth.pid(), pid);
    assert_eq!(fourth.get("/v1/plugins").0, 200);
}

/// An approved workspace whose state the test then damages with `damage`.
fn approved_workspace() -> Ws {
    let ws = Ws::new();
    ws.misbehave("calm", "good", None, "");
    let o = ws.plugd(&["plugin", "approve", "calm", "--by", "test"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(ws.dir().join(".plugd/state.id").exists());
    ws
}

/// Every state-reading command refuses, saying `what`, and creates nothing.
fn assert_refused(ws: &Ws, what: &str) {
    let state = ws.dir().join(".plugd");
    let before = listing(&state);
    for args in [
        &["plugin", "list"][..],
        &["tool", "call", "calm_echo"],
        &["serve", "--listen", "127.0.0.1:0"],
    ] {
        let o = ws.plugd(args);
        let msg = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {msg}");
        assert!(msg.contains(what), "{args:?}: {msg}");
        assert!(
            msg.contains("state.db") && msg.contains("plugd state reset --yes"),
            "{msg}"
        );
        assert!(msg.contains("backup"), "{msg}");
    }
    // Nothing recreated or replaced (serve.lock is the serve attempt's).
    let mut after = listing(&state);
    after.retain(|(n, _)| n != "serve.lock");
    let mut before = before;
    before.retain(|(n, _)| n != "serve.lock");
    assert_eq!(before, after);
}

fn listing(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    v.sort();
    v
}

/// `plugd state reset --yes` moves the old files aside and the workspace
/// works again from scratch (the plugin needs a new approval).
fn assert_reset_recovers(ws: &Ws, moved: &[&str]) {
    let o = ws.plugd(&["state", "reset"]);
    assert_eq!(o.status.code(), Some(1), "without --yes nothing moves");
    assert!(stderr(&o).contains("--yes"), "{}", stderr(&o));
    let o = ws.plugd(&["state", "reset", "--yes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let aside = std::fs::read_dir(ws.dir().join(".plugd"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("reset-"))
        })
        .expect("a reset-<time> directory");
    for f in moved {
        assert!(aside.join(f).exists(), "{f} not moved aside to {aside:?}");
    }
    let o = ws.plugd(&["plugin", "list", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(list[0]["approved"], false, "{list}");
    assert!(ws.dir().join(".plugd/state.id").exists());
}

#[test]
fn an_empty_state_database_is_refused_not_recreated() {
    if crate::support::sqlite_only("the workspace's SQLite file damaged on purpose") {
        return;
    }
    let ws = approved_workspace();
    let db = ws.dir().join(".plugd/state.db");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(ws.dir().join(format!(".plugd/state.db{suffix}")));
    }
    std::fs::write(&db, b"").unwrap();
    assert_refused(&ws, "is empty (0 bytes)");
    assert_eq!(std::fs::metadata(&db).unwrap().len(), 0);
    assert_reset_recovers(&ws, &["state.db", "state.id"]);
}

#[test]
fn a_deleted_state_database_is_refused_not_recreated() {
    if crate::support::sqlite_only("the workspace's SQLite file damaged on purpose") {
        return;
    }
    let ws = approved_workspace();
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(ws.dir().join(".plugd").join(f));
    }
    assert_refused(&ws, "is missing");
    assert!(!ws.dir().join(".plugd/state.db").exists());
    assert_reset_recovers(&ws, &["state.id"]);
}

#[test]
fn a_garbage_state_database_is_refused_and_left_as_it_is() {
    if crate::support::sqlite_only("the workspace's SQLite file damaged on purpose") {
        return;
    }
    let ws = approved_workspace();
    let db = ws.dir().join(".plugd/state.db");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(ws.dir().join(format!(".plugd/state.db{suffix}")));
    }
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&db, &garbage).unwrap();
    assert_refused(&ws, "is not a usable plugd state database");
    assert_eq!(std::fs::read(&db).unwrap(), garbage, "the file was changed");
    assert_reset_recovers(&ws, &["state.db", "state.id"]);
}

#[test]
fn another_workspaces_state_database_is_refused() {
    if crate::support::sqlite_only("the workspace's SQLite file damaged on purpose") {
        return;
    }
    let ws = approved_workspace();
    let other = approved_workspace();
    // Copy the other workspace's database over this one's.
    for f in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(ws.dir().join(".plugd").join(f));
    }
    let o = other.plugd(&["plugin", "list"]); // checkpoint nothing; the WAL travels along
    assert!(o.status.success());
    for f in ["state.db", "state.db-wal"] {
        let from = other.dir().join(".plugd").join(f);
        if from.exists() {
            std::fs::copy(&from, ws.dir().join(".plugd").join(f)).unwrap();
        }
    }
    let o = ws.plugd(&["plugin", "list"]);
    assert_eq!(o.status.code(), Some(1));
    let msg = stderr(&o);
    assert!(msg.contains("belongs to another workspace"), "{msg}");
    assert!(msg.contains("to adopt it"), "{msg}");
}

#[test]
fn eager_starts_wait_their_turn_instead_of_missing_the_deadline() {
    // Six eager plugins, each taking 600 ms to answer initialize, with a
    // 1.5 s deadline and one start at a time: 3.6 s in all, so a deadline
    // running from serve's start would fail most of them.
    let ws = Ws::new();
    let ids: Vec<String> = (0..6).map(|i| format!("slow{i}")).collect();
    for id in &ids {
        ws.misbehave(
            id,
            "slow_init",
            Some("600"),
            "\n[plugin.supervisor]\nstart = \"eager\"\n",
        );
    }
    let env = [
        ("NEXO_PLUGIN_INIT_TIMEOUT_MS", "1500"),
        ("PLUGD_START_CONCURRENCY", "1"),
    ];
    for id in &ids {
        let o = plugd_cmd(ws.dir())
            .envs(env)
            .args(["plugin", "approve", id, "--by", "test"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let serve = Serve::start(&ws, &env);
    // The API answers while the plugins are still queued.
    let (code, list) = serve.get("/v1/plugins");
    assert_eq!(code, 200, "{list}");
    let states = |list: &Value| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|p| p["state"].as_str().unwrap_or("?").to_owned())
            .collect()
    };
    assert!(
        states(&list).iter().any(|s| s == "starting"),
        "{:?}",
        states(&list)
    );
    let all_running = eventually_blocking(Duration::from_secs(60), || {
        states(&serve.get("/v1/plugins").1)
            .iter()
            .all(|s| s == "running")
    });
    let (_, list) = serve.get("/v1/plugins");
    assert!(all_running, "{list:#}");
    let (status, log) = serve.stop();
    assert!(status.success());
    assert!(
        !log.contains("restarting after"),
        "a start missed its deadline:\n{log}"
    );
}
