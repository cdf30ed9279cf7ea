//! The socket knows who is a plugin, and serve's listeners hold against
//! clients without credentials, all with a real `plugd serve`:
//!
//! * a real Python plugin whose containment is off (so `.plugd/serve.sock`
//!   is reachable) asks the socket for `GET /v1/plugins` from its own
//!   process and from a double-forked, `setsid` grandchild orphaned to
//!   serve: both get `403` before their request is read, serve's log names
//!   the plugin and the pid, and the CLI still works; once with plugin
//!   cgroups, once with `PLUGD_CGROUP=off` (ancestry through `/proc`);
//! * 300 idle connections and 60 slowloris ones without a token do not keep
//!   a token holder's 150 sequential calls out, and serve's log stays small
//!   (one line, then a summary per interval);
//! * serve with stdout and stderr in files writes no console login link,
//!   and `plugd console` prints one that works;
//! * serve without `--listen` has one TCP listener, the delegation one: it
//!   answers an admin token `404` on `/v1/plugins` and serves a run's
//!   delegation token its chain;
//! * `plugd state reset --yes` under a live serve refuses and moves nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::{Serve, make_token};
use crate::support::{Ws, copy_dir, eventually_blocking, plugd_cmd, repo, stderr, stdout};

/// Native plugin `id` running tests/plugins/socket_probe.py, with the
/// containment baseline off for it (so it can reach the socket at all).
fn socket_probe(ws: &Ws, id: &str) {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/socket_probe.py"),
        dir.join("socket_probe.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"socket_probe.py\", \"{id}\"]\n\n[plugin.extends]\ntools = [\"{id}_probe\"]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            "# the probe must reach .plugd/serve.sock: only the peer check stands in its way\nsandbox:\n  plugins:\n    {id}: {{baseline: false}}\n"
        ),
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", id]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The probe's answer for `via` (`self` or `grandchild`), called through
/// serve's TCP API so the plugin runs under serve.
fn probe(serve: &Serve, id: &str, sock: &Path, via: &str) -> Value {
    let r = serve.post(
        &format!("/v1/tools/{id}_probe:invoke"),
        &json!({"args": {"socket": sock, "via": via}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    // The tool's result, whatever envelope the API puts around it.
    if v.get("pid").is_some() {
        v
    } else {
        v["result"].clone()
    }
}

fn plugin_processes_are_refused_on_the_socket(env: &[(&str, &str)]) {
    let ws = Ws::new();
    let id = "sockprobe";
    socket_probe(&ws, id);
    let serve = Serve::start_with_env(&ws, env);
    let serve_pid = serve.child.id() as i32;
    let sock = ws.dir().join(".plugd/serve.sock");
    for via in ["self", "grandchild"] {
        let got = probe(&serve, id, &sock, via);
        assert_eq!(got["status"], 403, "{via}: {got}");
        let body: Value = serde_json::from_str(got["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "forbidden", "{via}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("plugin {id}'s process may not use plugd's socket"))
                && message.contains("delegated tokens"),
            "{via}: {message}"
        );
        // Nothing of the API answered: no plugin list in the body.
        assert!(!got["body"].as_str().unwrap().contains("\"dialect\""));
        let pid = got["pid"].as_i64().unwrap();
        if via == "grandchild" {
            // It was an orphan then, re-parented to serve (the subreaper).
            assert_eq!(got["ppid"], serve_pid, "{got}");
        }
        // The first refusal of an interval is logged in full, later ones in
        // the interval's summary line (which quotes the last one).
        let line =
            format!("refused a connection to plugd's socket from plugin {id}'s process (pid {pid}");
        let named = eventually_blocking(Duration::from_secs(15), || {
            serve.log_text().lines().any(|l| l.contains(&line))
        });
        assert!(
            named,
            "{via}: serve's log does not name the plugin and pid {pid}:\n{}",
            serve.log_text()
        );
    }
    // The operator's CLI still goes through the same socket.
    let out = ws.plugd(&["plugin", "restart", id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("(via plugd serve pid {serve_pid})")),
        "{}",
        stdout(&out)
    );
    let out = ws.plugd(&["plugin", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["id"], id, "{rows}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_plugin_and_its_orphaned_grandchild_are_refused_on_the_socket_by_cgroup() {
    plugin_processes_are_refused_on_the_socket(&[]);
}

#[test]
fn a_plugin_and_its_orphaned_grandchild_are_refused_on_the_socket_by_ancestry() {
    plugin_processes_are_refused_on_the_socket(&[("PLUGD_CGROUP", "off")]);
}

/// Opens a connection that never sends anything (non-blocking, to poll).
fn idle(addr: SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_nonblocking(true).ok()?;
    Some(s)
}

/// Whether serve closed (or answered) `s`.
fn closed(mut s: &TcpStream) -> bool {
    let mut b = [0u8; 64];
    !matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Copies a fixture directory (one level of subdirectories).
#[test]
fn connections_without_a_token_cannot_starve_a_token_holder() {
    let ws = Ws::new();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let addr = serve.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // 300 idle connections, reopened as serve closes them.
    let idle_holder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = (0..300).filter_map(|_| idle(addr)).collect();
            let mut opened = held.len();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                held.retain(|s| !closed(s));
                while held.len() < 300 {
                    match idle(addr) {
                        Some(s) => held.push(s),
                        None => break,
                    }
                    opened += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            opened
        })
    };
    // 60 slowloris connections: a partial head, then a byte every 300 ms.
    let slow_holder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut slow: Vec<TcpStream> = (0..60)
                .filter_map(|_| {
                    let mut s = idle(addr)?;
                    s.set_nonblocking(false).ok()?;
                    s.write_all(b"GET /v1/plugins HTTP/1.1\r\nHost: x\r\n")
                        .ok()?;
                    Some(s)
                })
                .collect();
            let mut dropped = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let before = slow.len();
                slow.retain_mut(|s| s.write_all(b"X").is_ok());
                dropped += before - slow.len();
                std::thread::sleep(Duration::from_millis(300));
            }
            dropped
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let mut refused = Vec::new();
    for i in 0..150 {
        let r = serve.get("/v1/plugins");
        if r.status != 200 {
            refused.push((i, r.status, r.text()));
        }
    }
    let took = started.elapsed();
    // Long enough for serve's unauthenticated timeout (5 s) to close the
    // slow ones, and for the first summary interval (10 s) to end.
    let summarized = eventually_blocking(Duration::from_secs(20), || {
        serve.log_text().contains(" more in the last 10 s")
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = idle_holder.join().unwrap();
    let dropped = slow_holder.join().unwrap();
    assert!(refused.is_empty(), "token holder refused: {refused:?}");
    assert!(opened >= 300, "{opened}");
    let log = serve.log_text();
    assert!(summarized, "no summary line:\n{log}");
    assert!(
        log.contains("closed an unauthenticated connection from 127.0.0.1"),
        "{log}"
    );
    assert!(
        log.len() < 64 * 1024,
        "serve logged {} bytes for {opened} idle and 60 slow connections",
        log.len()
    );
    // Measured here: 150 calls in about 0.3 s beside some 2,400 idle
    // connections opened, and a log under 1 KiB.
    assert!(took < Duration::from_secs(30), "150 calls took {took:?}");
    assert_eq!(dropped, 60, "serve left slow connections open");
}

/// Starts `plugd serve` with `args`, stdout and stderr into files; waits for
/// `ready` in stdout. The child and the two files' paths.
fn serve_to_files(
    ws: &Ws,
    args: &[&str],
    ready: &str,
) -> (Child, std::path::PathBuf, std::path::PathBuf) {
    let out = ws.dir().join("serve.out");
    let err = ws.dir().join("serve.err");
    let child = plugd_cmd(ws.dir())
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let seen = eventually_blocking(Duration::from_secs(60), || {
        std::fs::read_to_string(&out).is_ok_and(|t| t.contains(ready))
    });
    assert!(
        seen,
        "no {ready:?} from serve:\n{}\n{}",
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    (child, out, err)
}

fn stop(mut child: Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

/// One request; status and body.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn a_login_link_never_reaches_a_log_file_and_plugd_console_prints_one_that_works() {
    let ws = Ws::new();
    let (serve, out, err) = serve_to_files(
        &ws,
        &["--listen", "127.0.0.1:0"],
        "plugd serving on http://",
    );
    let printed = std::fs::read_to_string(&out).unwrap();
    let logged = std::fs::read_to_string(&err).unwrap();
    for (name, text) in [("stdout", &printed), ("stderr", &logged)] {
        assert!(
            !text.contains("#code=") && !text.contains("/console/login"),
            "a login link in serve's {name}:\n{text}"
        );
    }
    let addr: SocketAddr = printed
        .lines()
        .find_map(|l| l.strip_prefix("plugd serving on http://"))
        .unwrap()
        .parse()
        .unwrap();
    // Where the console is, and how to get in, are said instead.
    assert!(printed.contains("plugd console"), "{printed}");
    let o = ws.plugd(&["console"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let link = stdout(&o).trim().to_owned();
    let code = link
        .strip_prefix(&format!("http://{addr}/console/login#code="))
        .unwrap_or_else(|| panic!("{link}"));
    let (status, body) = http(
        addr,
        "POST",
        "/console/login",
        "Content-Type: application/json\r\n",
        &json!({"code": code}).to_string(),
    );
    assert_eq!(status, 204, "{body}");
    stop(serve);
    // Nor did the link `plugd console` printed reach serve's log.
    assert!(!std::fs::read_to_string(&err).unwrap().contains(code));
}

/// The listening TCP sockets (`local address`) among `pid`'s descriptors,
/// from `/proc/<pid>/net/tcp{,6}` and the socket inodes of `/proc/<pid>/fd`.
fn tcp_listeners(pid: u32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|t| {
            t.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect();
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address rem_address st ... inode (field 9)
            if f.get(3) == Some(&"0A") && f.get(9).is_some_and(|i| inodes.iter().any(|x| x == i)) {
                out.push(f[1].to_owned());
            }
        }
    }
    out
}

/// `127.0.0.1:PORT` from a `/proc/net/tcp` local address (`0100007F:1F90`).
fn decode_v4(local: &str) -> Option<SocketAddr> {
    let (ip, port) = local.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    Some(SocketAddr::from((ip.to_le_bytes(), port)))
}

/// One request over the workspace socket; status and body.
fn over_socket(sock: &Path, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.to_string();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let (_, rest) = text.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(rest).unwrap_or(Value::Null))
}

#[test]
fn serve_without_listen_opens_only_the_narrow_delegation_listener() {
    let ws = Ws::new();
    copy_dir(
        &repo().join("tests/plugins/chains/leaky"),
        &ws.plugin_dir("leaky"),
    );
    ws.unsandbox(
        &["test/leaky"],
        "the fixture writes what it saw to a file the test names",
    );
    let out = ws.plugd(&["plugin", "approve", "test/leaky"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let admin = make_token(&ws, "admin");
    let (serve, _out, err) = serve_to_files(&ws, &[], "plugd serving on unix:");
    let listening = tcp_listeners(serve.id());
    assert_eq!(
        listening.len(),
        1,
        "one TCP listener expected: {listening:?}"
    );
    let delegated = decode_v4(&listening[0]).unwrap();
    assert!(delegated.ip().is_loopback(), "{delegated}");
    // Not the API: an admin token finds no /v1/plugins there, and gets 401
    // on a delegated route; neither the health check nor MCP is there.
    let bearer = format!("Authorization: Bearer {admin}\r\n");
    let (status, body) = http(delegated, "GET", "/v1/plugins", &bearer, "");
    assert_eq!(status, 404, "{body}");
    for path in ["/healthz", "/mcp", "/v1/tools", "/console/"] {
        assert_eq!(http(delegated, "GET", path, &bearer, "").0, 404, "{path}");
    }
    let (status, body) = http(delegated, "GET", "/v1/sessions", &bearer, "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("delegation tokens"), "{body}");
    assert_eq!(http(delegated, "GET", "/v1/sessions", "", "").0, 401);
    // A run's delegation token reads its chain there (through the socket:
    // there is no other way in).
    let out_dir = tempfile::tempdir().unwrap();
    let seen_file = out_dir.path().join("seen.json");
    let (status, run) = over_socket(
        &ws.dir().join(".plugd/serve.sock"),
        "POST",
        "/v1/runs",
        &json!({"session_id": "narrow-1", "harness": "test/leaky/leak", "input": seen_file.display().to_string()}),
    );
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&seen_file).unwrap()).unwrap();
    assert_eq!(seen["base_url"], format!("http://{delegated}"), "{seen}");
    assert_eq!(seen["read_chain"], 200, "{seen}");
    assert_eq!(seen["tools"], 403, "{seen}");
    stop(serve);
    let log = std::fs::read_to_string(&err).unwrap();
    assert!(!log.contains(&admin), "the token in serve's log");
}

#[test]
fn state_reset_refuses_while_serve_runs_and_moves_nothing() {
    if crate::support::sqlite_only("`plugd state reset` moves the SQLite file aside") {
        return;
    }
    let ws = Ws::new();
    let (serve, _out, _err) = serve_to_files(&ws, &[], "plugd serving on unix:");
    let db = ws.dir().join(".plugd/state.db");
    let before = std::fs::metadata(&db).unwrap();
    let out = ws.plugd(&["state", "reset", "--yes"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let msg = stderr(&out);
    assert!(
        msg.contains(&format!("plugd serve (pid {})", serve.id())) && msg.contains("stop it first"),
        "{msg}"
    );
    use std::os::unix::fs::MetadataExt;
    let after = std::fs::metadata(&db).expect("the database is still in place");
    assert_eq!(before.ino(), after.ino(), "the same file");
    let asides: Vec<String> = std::fs::read_dir(ws.dir().join(".plugd"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("reset-"))
        .collect();
    assert!(asides.is_empty(), "{asides:?}");
    // serve is still answering on its socket.
    let out = ws.plugd(&["plugin", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stop(serve);
    // Once serve is gone, the reset goes through.
    let out = ws.plugd(&["state", "reset", "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!db.exists());
}
