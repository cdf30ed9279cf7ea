//! Remote MCP servers over Streamable HTTP, through the plugd binary: the
//! official Python `mcp` SDK's server with its own OAuth 2.1 authorization
//! server on loopback (`tests/plugins/mcp-remote/remote_server.py`), static
//! headers whose values come from plugd's secret store, and a lying raw
//! HTTP server (`hostile_http.py`) for each rule a remote server can break.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Ws, ok, plugd_cmd, stderr, stdout};

/// A fixture server process, killed on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
}

impl Server {
    pub(crate) fn start(script: &str, args: &[&str]) -> Server {
        let (child, url) =
            crate::support::python_server(&format!("tests/plugins/mcp-remote/{script}"), args);
        Server { child, url }
    }

    fn base(&self) -> String {
        self.url.trim_end_matches("/mcp").to_owned()
    }

    pub(crate) fn stats(&self) -> Value {
        let out = http_get(&format!("{}/stats", self.base()));
        serde_json::from_str(&out.1).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test's "browser": one HTTP/1.1 GET over a TCP socket, redirects not
/// followed: (status, body, Location).
pub(crate) fn http_get(url: &str) -> (u16, String, Option<String>) {
    use std::io::Read;
    let rest = url.strip_prefix("http://").expect("loopback http URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let location = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("location")
            .then(|| v.trim().to_owned())
    });
    // uvicorn answers chunked: the fixtures' small JSON comes as one chunk.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let b = body.split_once("\r\n").map_or(body, |(_, b)| b);
        b.rsplit_once("\r\n0\r\n")
            .map_or(b, |(b, _)| b)
            .trim_end()
            .to_owned()
    } else {
        body.to_owned()
    };
    (status, body, location)
}

const KEY: &str = crate::support::TEST_MASTER_KEY;

/// `plugd ARGS` on `ws` with the test's master key.
fn plugd(ws: &Ws, args: &[&str]) -> Output {
    plugd_cmd(ws.dir())
        .env("PLUGD_MASTER_KEY", KEY)
        .env("PLUGD_KEY_FILE", ws.dir().join("no-key-file"))
        .args(args)
        .output()
        .unwrap()
}

/// `plugd tool call remote/TOOL --args ARGS`, which must succeed: its output.
fn call(ws: &Ws, tool: &str, args: &str) -> String {
    ok(&plugd(
        ws,
        &["tool", "call", &format!("remote/{tool}"), "--args", args],
    ))
}

fn remote_ws(entry: Value) -> Ws {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"remote": entry}}).to_string(),
    )
    .unwrap();
    ws
}

/// `plugd mcp login remote`, with this test as the browser: fetch the
/// authorization URL plugd prints, then follow its redirect to plugd.
pub(crate) fn login(ws: &Ws) -> Output {
    login_then(ws, |callback| {
        let (status, body, _) = http_get(callback);
        assert_eq!(status, 200, "{body}");
    })
}

/// `plugd mcp login remote`: fetch the authorization URL plugd prints;
/// as another local user, send plugd's redirect listener forged redirects
/// first (each answered with an error and ignored); then hand the real
/// redirect to `redirect`.
fn login_then(ws: &Ws, redirect: impl FnOnce(&str)) -> Output {
    login_with(ws, &[], redirect)
}

/// [`login_then`] with `extra` arguments (`--user SUBJECT`).
pub(crate) fn login_with(ws: &Ws, extra: &[&str], redirect: impl FnOnce(&str)) -> Output {
    let mut child = plugd_cmd(ws.dir())
        .env("PLUGD_MASTER_KEY", KEY)
        .env("PLUGD_KEY_FILE", ws.dir().join("no-key-file"))
        .args(["mcp", "login", "remote", "--timeout", "30"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let url = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let out = child.wait_with_output().unwrap();
            panic!("login ended before printing a URL: {seen}{}", stdout(&out));
        }
        seen.push_str(&line);
        if let Some(u) = line.strip_prefix("authorize: ") {
            break u.trim().to_owned();
        }
    };
    let (status, _, location) = http_get(&url);
    assert_eq!(status, 302, "the authorization endpoint approves at once");
    let callback = location.expect("a redirect back to plugd");
    assert!(callback.starts_with("http://127.0.0.1:"), "{callback}");
    let listener = callback.split('?').next().unwrap();
    for (forged, want) in [
        (format!("{listener}?code=forged&state=forged"), 400),
        (format!("{listener}?error=access_denied"), 400),
        (listener.replace("/callback", "/favicon.ico"), 404),
    ] {
        assert_eq!(http_get(&forged).0, want, "{forged}");
    }
    redirect(&callback);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let mut out = child.wait_with_output().unwrap();
    out.stderr = format!("{seen}{rest}").into_bytes();
    out
}

/// What `plugd mcp login remote` says before it contacts `url`, for an
/// entry not approved yet.
fn unapproved_line(url: &str) -> String {
    format!(
        "plugd: logging in to remote at {url} (not approved yet: login only fetches OAuth metadata and tokens; run `plugd plugin approve remote` before it runs)\n"
    )
}

#[test]
fn a_remote_server_is_listed_called_and_its_sessions_ended() {
    let server = Server::start("remote_server.py", &["--no-auth"]);
    let ws = remote_ws(json!({"type": "http", "url": server.url}));
    let approved = ok(&plugd(&ws, &["plugin", "approve", "remote"]));
    assert!(approved.contains("remote/echo"), "{approved}");
    let list = ok(&plugd(&ws, &["tool", "list", "--json"]));
    let list: Value = serde_json::from_str(&list).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"remote/echo") && names.contains(&"remote/count"),
        "{names:?}"
    );
    let out = call(&ws, "echo", r#"{"text":"über"}"#);
    assert!(out.contains("remote echo: über"), "{out}");
    // A call whose answer streams (progress first) over SSE.
    let out = call(&ws, "count", r#"{"n":4}"#);
    assert!(out.contains("counted to 4"), "{out}");
    // The plugin row says where it runs.
    let rows = ok(&plugd(&ws, &["plugin", "list", "--json"]));
    assert!(rows.contains("\"remote\""), "{rows}");
}

#[test]
fn header_values_come_from_the_secret_store_and_are_never_printed() {
    let secret = "s3cret-header-value-4242";
    let server = Server::start(
        "remote_server.py",
        &["--no-auth", "--header", &format!("X-Api-Key={secret}")],
    );
    let ws = remote_ws(json!({
        "url": server.url,
        "headers": {"X-Api-Key": "${acme/api-key}"}
    }));
    // What approving would send where is shown before anything is sent.
    let show = ok(&plugd(&ws, &["plugin", "show", "remote"]));
    assert!(
        show.contains(&format!("remote:    {}", server.url)),
        "{show}"
    );
    assert!(
        show.contains("header:    X-Api-Key: ${acme/api-key} (sends secret acme/api-key)"),
        "{show}"
    );
    // Not set yet: the start is refused, naming the secret and the command.
    let refused = plugd(&ws, &["plugin", "approve", "remote"]);
    assert!(!refused.status.success());
    let text = stderr(&refused);
    assert!(
        text.contains(
            "\"acme/api-key\", which is not set; set it with `plugd secrets set acme/api-key`"
        ),
        "{text}"
    );
    assert_eq!(
        server.stats()["header_misses"],
        0,
        "nothing was sent without it"
    );
    let mut set = plugd_cmd(ws.dir())
        .env("PLUGD_MASTER_KEY", KEY)
        .env("PLUGD_KEY_FILE", ws.dir().join("no-key-file"))
        .args(["secrets", "set", "acme/api-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    set.stdin
        .take()
        .unwrap()
        .write_all(secret.as_bytes())
        .unwrap();
    ok(&set.wait_with_output().unwrap());
    ok(&plugd(&ws, &["plugin", "approve", "remote"]));
    let out = plugd(
        &ws,
        &["tool", "call", "remote/echo", "--args", r#"{"text":"k"}"#],
    );
    assert!(ok(&out).contains("remote echo: k"));
    assert_eq!(server.stats()["header_misses"], 0);
    // The value is in no file of the workspace in clear and in no output.
    for o in [
        &out,
        &plugd(&ws, &["plugin", "list"]),
        &plugd(&ws, &["plugin", "show", "remote"]),
    ] {
        assert!(!stdout(o).contains(secret) && !stderr(o).contains(secret));
    }
    assert_no_clear_text(ws.dir(), secret);
}

fn assert_no_clear_text(dir: &Path, needle: &str) {
    for entry in walk(dir) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{} holds {needle:?} in clear",
            entry.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn oauth_login_authorizes_plugd_and_expired_tokens_are_refreshed_and_kept_sealed() {
    // Access tokens live 2 s: every later start must refresh.
    let server = Server::start("remote_server.py", &["--token-ttl", "2"]);
    let ws = remote_ws(json!({"type": "http", "url": server.url}));
    // Before a login the server refuses plugd, and the error says what to run.
    let refused = plugd(&ws, &["plugin", "approve", "remote"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("401 Unauthorized")
            && stderr(&refused).contains("`plugd mcp login remote`"),
        "{}",
        stderr(&refused)
    );
    let out = login(&ws);
    let said = ok(&out);
    assert!(
        said.contains("authorized plugd at remote (scope mcp:tools"),
        "{said}\n{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).starts_with(&unapproved_line(&server.url)),
        "{}",
        stderr(&out)
    );
    let stats = server.stats();
    assert_eq!(
        stats["registrations"], 1,
        "plugd registered itself: {stats}"
    );
    assert_eq!(stats["codes"], 1, "{stats}");
    assert_eq!(
        stats["resources"],
        json!([server.url]),
        "the authorization asked for this server as the resource (RFC 8707)"
    );
    ok(&plugd(&ws, &["plugin", "approve", "remote"]));
    std::thread::sleep(Duration::from_millis(2500));
    let out = call(&ws, "echo", r#"{"text":"later"}"#);
    assert!(out.contains("remote echo: later"), "{out}");
    std::thread::sleep(Duration::from_millis(2500));
    let out = call(&ws, "echo", r#"{"text":"later still"}"#);
    assert!(out.contains("remote echo: later still"), "{out}");
    let stats = server.stats();
    assert!(
        stats["refreshes"].as_u64().unwrap() >= 2,
        "each later start refreshed the rotated token it stored: {stats}"
    );
    assert_eq!(
        stats["rejected_tokens"], 0,
        "no expired token was sent: {stats}"
    );
    // Shown masked; stored sealed (no token in clear anywhere in the workspace).
    let show = ok(&plugd(&ws, &["plugin", "config", "remote", "show"]));
    assert!(
        show.contains("oauth.credentials") && show.contains("••••"),
        "{show}"
    );
    assert_no_clear_text(ws.dir(), "at-");
    assert_no_clear_text(ws.dir(), "rt-");
    // Once approved, a login says where it goes, without the caveat.
    let again = login(&ws);
    ok(&again);
    assert!(
        stderr(&again).starts_with(&format!("plugd: logging in to remote at {}\n", server.url)),
        "{}",
        stderr(&again)
    );
    // Logout forgets them; the next start is refused again.
    ok(&plugd(&ws, &["mcp", "logout", "remote"]));
    let refused = plugd(
        &ws,
        &["tool", "call", "remote/echo", "--args", r#"{"text":"x"}"#],
    );
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("plugd mcp login remote"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn a_refusal_carrying_the_logins_state_fails_the_login_naming_the_error() {
    let server = Server::start("remote_server.py", &[]);
    let ws = remote_ws(json!({"type": "http", "url": server.url}));
    let out = login_then(&ws, |callback| {
        let (listener, query) = callback.split_once('?').unwrap();
        let state = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("state="))
            .expect("the redirect carries the state");
        let refused = format!(
            "{listener}?error=access_denied&error_description=the+user+said+no&state={state}"
        );
        assert_eq!(http_get(&refused).0, 400);
    });
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(text.starts_with(&unapproved_line(&server.url)), "{text}");
    assert!(
        text.contains("the authorization server refused: \"access_denied\" (\"the user said no\")"),
        "{text}"
    );
    assert_eq!(server.stats()["codes"], 0, "no code was exchanged");
    let show = ok(&plugd(&ws, &["plugin", "config", "remote", "show"]));
    assert!(!show.contains("••••"), "nothing was stored: {show}");
}

#[test]
fn login_refuses_servers_that_are_not_remote_and_unknown_ones() {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"local": {"command": "python3", "args": ["-c", "pass"]}}})
            .to_string(),
    )
    .unwrap();
    let out = plugd(&ws, &["mcp", "login", "local"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not a remote MCP server"),
        "{}",
        stderr(&out)
    );
    let out = plugd(&ws, &["mcp", "login", "nope"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("nope"), "{}", stderr(&out));
}

/// Calls `remote/t` on a hostile server with a 64 KiB frame limit and a 10 s
/// tool timeout; the output and how long it took.
fn hostile_call(mode: &str) -> (Server, Ws, Output, Duration) {
    let server = Server::start("hostile_http.py", &[mode]);
    let ws = remote_ws(json!({"type": "http", "url": server.url}));
    ok(&plugd(&ws, &["plugin", "approve", "remote"]));
    let started = Instant::now();
    let out = plugd_cmd(ws.dir())
        .env("PLUGD_MAX_FRAME_BYTES", "65536")
        .env("NEXO_PLUGIN_TOOL_TIMEOUT_MS", "10000")
        .args(["tool", "call", "remote/t"])
        .output()
        .unwrap();
    (server, ws, out, started.elapsed())
}

#[test]
fn hostile_remote_servers_fail_the_call_naming_the_server_and_the_cause() {
    for (mode, want) in [
        ("huge-json", "over 65536 bytes (the frame limit)"),
        ("huge-event", "over 65536 bytes (the frame limit)"),
        ("endless", "frame limit"),
        ("wrong-type", "content type \"text/html\""),
        (
            "http-500",
            "HTTP 500 Internal Server Error: boom: the backend fell over",
        ),
        ("no-answer", "closed the stream before answering"),
        ("redirect", "HTTP 307"),
    ] {
        let (server, _ws, out, took) = hostile_call(mode);
        assert!(!out.status.success(), "{mode}: {}", stdout(&out));
        let text = stderr(&out);
        assert!(
            text.contains("MCP server \"remote\"") && text.contains(want),
            "{mode}: {text}"
        );
        assert!(
            took < Duration::from_secs(9),
            "{mode} took {took:?}: no hang"
        );
        if mode == "redirect" {
            assert_eq!(
                server.stats()["redirect_followed"],
                0,
                "a redirect is never followed"
            );
        }
    }
}

#[test]
fn a_session_id_outside_visible_ascii_is_refused() {
    let server = Server::start("hostile_http.py", &["bad-session"]);
    let ws = remote_ws(json!({"type": "http", "url": server.url}));
    let out = plugd(&ws, &["plugin", "approve", "remote"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("session id with characters outside visible ASCII"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_stream_closed_before_its_answer_is_resumed_with_last_event_id() {
    let (server, _ws, out, _) = hostile_call("resume");
    assert!(ok(&out).contains("resumed answer"));
    assert_eq!(server.stats()["last_event_ids"], json!(["e1"]));
}

#[test]
fn an_expired_session_fails_one_call_and_the_next_gets_a_new_session() {
    let (server, ws, out, _) = hostile_call("expire");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("ended the session (404)"),
        "{}",
        stderr(&out)
    );
    // Within one serve-less CLI run the restart happens on the next call.
    let again = plugd_cmd(ws.dir())
        .args(["tool", "call", "remote/t"])
        .output()
        .unwrap();
    assert!(ok(&again).contains("fine"));
    let sessions = server.stats()["sessions"].as_array().unwrap().len();
    assert!(sessions >= 2, "a new session was started");
}
