//! Who may talk to `plugd serve`, tried with real processes: the socket's
//! modes, a real second Unix user (created here, removed after) refused on
//! the socket and without a token on TCP, each role over TCP, the CLI over
//! the socket with no extra step, and connections that dawdle (slow headers,
//! slow bodies, too many at once).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::{Serve, make_token};
use crate::support::{Ws, stderr, stdout};

/// A Unix user made for one test with `useradd`, deleted on drop.
struct OtherUser {
    name: String,
    uid: u32,
}

impl OtherUser {
    fn create() -> OtherUser {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("plugdt{}x{n}", std::process::id() % 100_000);
        let _ = run("userdel", &[&name]);
        let out = run(
            "useradd",
            &[
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                &name,
            ],
        );
        assert!(out.status.success(), "useradd {name}: {}", stderr(&out));
        let out = run("id", &["-u", &name]);
        let uid = stdout(&out).trim().parse().unwrap();
        assert_ne!(uid, 0);
        OtherUser { name, uid }
    }

    /// Runs python3 `code` as this user; its output.
    fn python(&self, code: &str, args: &[&str]) -> Output {
        let mut all = vec!["-u", &self.name, "--", "/usr/bin/python3", "-c", code];
        all.extend_from_slice(args);
        run("runuser", &all)
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        let _ = run("userdel", &[&self.name]);
    }
}

fn run(program: &str, args: &[&str]) -> Output {
    #[allow(clippy::disallowed_methods)] // system tools of the test setup
    std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap()
}

/// A client in Python: one HTTP request over a Unix socket (`unix:PATH`) or
/// TCP (`HOST:PORT`); prints the status and body, or `error: ...`.
const CLIENT: &str = r#"
import socket, sys
target, method, path, token = sys.argv[1:5]
try:
    if target.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX); s.connect(target[5:]); host = "localhost"
    else:
        h, p = target.rsplit(":", 1); s = socket.create_connection((h, int(p))); host = target
    auth = f"Authorization: Bearer {token}\r\n" if token != "-" else ""
    body = "{}" if method == "POST" else ""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    data = b""
    while True:
        c = s.recv(65536)
        if not c: break
        data += c
    head, _, rest = data.partition(b"\r\n\r\n")
    print(head.split()[1].decode(), rest.decode())
except OSError as e:
    print("error:", e)
"#;

fn serve_socket_only(ws: &Ws) -> std::process::Child {
    let mut child = crate::support::plugd_cmd(ws.dir())
        .arg("serve")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).is_ok_and(|n| n == 1) && b[0] != b'\n' {
        line.push(b[0]);
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    assert!(line.starts_with("plugd serving on unix:"), "{line:?}");
    child
}

#[test]
fn the_socket_admits_only_its_owner_and_root() {
    let ws = Ws::new();
    ws.example("hello-bash");
    let mut serve = serve_socket_only(&ws);
    let sock = ws.dir().join(".plugd/serve.sock");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&sock), 0o600);
    assert_eq!(mode(&ws.dir().join(".plugd")), 0o700);

    // The owner's CLI goes through the socket, no token, no extra step, and
    // the approval is recorded as the socket peer's user.
    let out = ws.plugd(&["plugin", "approve", "hello_bash", "--by", "mallory"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("(via plugd serve pid {})", serve.id())),
        "{}",
        stdout(&out)
    );
    let out = ws.plugd(&["plugin", "show", "hello_bash", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["approval"]["approved_by"], "root", "{v}");

    let other = OtherUser::create();
    let target = format!("unix:{}", sock.display());
    // Another user cannot even reach the socket (0700 directory, 0600 socket).
    let out = other.python(CLIENT, &[&target, "GET", "/v1/plugins", "-"]);
    assert!(
        stdout(&out).contains("Permission denied"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // Even when an operator opens the modes up, the peer uid check refuses it.
    for p in [ws.dir(), &ws.dir().join(".plugd")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    for (method, path) in [
        ("GET", "/v1/plugins"),
        ("POST", "/v1/plugins/hello_bash:revoke"),
    ] {
        let out = other.python(CLIENT, &[&target, method, path, "-"]);
        let text = stdout(&out);
        assert!(
            text.starts_with("403 "),
            "{method} {path}: {text}{}",
            stderr(&out)
        );
        assert!(text.contains(&format!("uid {}", other.uid)), "{text}");
    }
    // Nothing changed: the plugin is still approved.
    let out = ws.plugd(&["plugin", "list", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["approved"], true, "{v}");
    let _ = serve.kill();
    let _ = serve.wait();
}

#[test]
fn tcp_needs_a_token_and_roles_limit_what_it_does() {
    let ws = Ws::new();
    ws.example("hello-bash");
    let approve = ws.plugd(&["plugin", "approve", "hello_bash"]);
    assert!(approve.status.success(), "{}", stderr(&approve));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let target = serve.addr.to_string();
    let other = OtherUser::create();
    // Another local user on TCP without a token: 401 saying how to get one.
    let out = other.python(
        CLIENT,
        &[&target, "POST", "/v1/plugins/hello_bash:revoke", "-"],
    );
    let text = stdout(&out);
    assert!(text.starts_with("401 "), "{text}{}", stderr(&out));
    assert!(text.contains("plugd token create"), "{text}");
    let out = other.python(CLIENT, &[&target, "GET", "/healthz", "-"]);
    assert!(stdout(&out).starts_with("200 "), "{}", stdout(&out));

    let viewer = make_token(&ws, "viewer");
    let agent = make_token(&ws, "agent");
    let operator = make_token(&ws, "operator");
    let invoke = ("POST", "/v1/tools/hello_bash_greet:invoke");
    let revoke = ("POST", "/v1/plugins/hello_bash:revoke");
    let restart = ("POST", "/v1/plugins/hello_bash:restart");
    // (token, request, expected status)
    let cases = [
        (&viewer, ("GET", "/v1/tools"), 200),
        (&viewer, invoke, 403),
        (&viewer, restart, 403),
        (&agent, restart, 403),
        (&operator, invoke, 403),
        (&operator, restart, 200),
    ];
    for (token, (method, path), want) in cases {
        let out = other.python(CLIENT, &[&target, method, path, token]);
        let text = stdout(&out);
        assert!(
            text.starts_with(&format!("{want} ")),
            "{method} {path}: {text}"
        );
        if want == 403 {
            assert!(text.contains("role"), "names the role: {text}");
        }
    }
    // The agent invokes with arguments (a raw request with a body).
    let body = json!({"args": {"name": "Ada"}}).to_string();
    let r = raw(&serve, &agent, "POST", invoke.1, &body);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("Ada"), "{r}");
    // A revoked token stops working at once, without restarting serve.
    let listed = ws.plugd(&["token", "list", "--json"]);
    let tokens: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["role"] == "operator")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = ws.plugd(&["token", "revoke", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = other.python(CLIENT, &[&target, revoke.0, revoke.1, &operator]);
    assert!(stdout(&out).starts_with("401 "), "{}", stdout(&out));
    assert!(stdout(&out).contains("revoked"), "{}", stdout(&out));
    // The plugin is still approved: no refused request changed anything.
    assert_eq!(serve.get("/v1/plugins").json()[0]["approved"], true);
    // The token list never shows a secret.
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&operator[20..]));
}

/// One raw request with `token`; the whole response text.
fn raw(serve: &Serve, token: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(serve.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        serve.addr,
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Reads until the server closes `s` (or `limit` passes); true when closed.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let end = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn slow_and_idle_connections_are_closed_and_capped() {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "http: {header_timeout_secs: 1, body_timeout_secs: 1}\n",
    )
    .unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // 30 slowloris connections: a partial head, a byte now and then.
    let mut slow: Vec<TcpStream> = (0..30)
        .map(|_| {
            let mut s = TcpStream::connect(serve.addr).unwrap();
            s.write_all(b"GET /v1/plugins HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    // An idle keep-alive connection after one full request.
    let mut idle = TcpStream::connect(serve.addr).unwrap();
    write!(
        idle,
        "GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n",
        serve.addr
    )
    .unwrap();
    // A body that never completes.
    let mut body = TcpStream::connect(serve.addr).unwrap();
    write!(
        body,
        "POST /v1/bus/publish HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"sub",
        serve.addr, serve.token
    )
    .unwrap();
    // While they dawdle, a real request is answered.
    assert_eq!(serve.get("/v1/plugins").status, 200);
    for s in &mut slow {
        let _ = s.write_all(b"X-a: b\r\n");
    }
    for (i, s) in slow.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(10)),
            "slow connection {i} still open"
        );
    }
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)),
        "idle keep-alive still open"
    );
    let mut text = String::new();
    body.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = body.read_to_string(&mut text);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout_secs"), "{text}");

    drop(serve);

    // Over the cap: with 5 authenticated keep-alive connections held open
    // (well within the default 10 s header timeout), the 6th gets 503 at
    // once. (Connections without credentials never fill the cap: the oldest
    // of them is closed to make room, see peer_check.rs.)
    let ws = Ws::new();
    std::fs::write(ws.dir().join("plugd.yaml"), "http: {max_connections: 5}\n").unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let held: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut s = TcpStream::connect(serve.addr).unwrap();
            write!(
                s,
                "GET /v1/plugins HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
                serve.addr, serve.token
            )
            .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut b = [0u8; 4096];
            let n = s.read(&mut b).unwrap();
            assert!(b[..n].starts_with(b"HTTP/1.1 200"));
            s
        })
        .collect();
    let mut text = String::new();
    // Accepting is asynchronous: poll until the cap is seen (bounded).
    let seen = crate::support::eventually_blocking(Duration::from_secs(5), || {
        let mut extra = TcpStream::connect(serve.addr).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        text.clear();
        let _ = extra.read_to_string(&mut text);
        text.starts_with("HTTP/1.1 503")
    });
    assert!(seen, "no 503 beyond 5 connections: {text:?}");
    assert!(text.contains("too_many_connections"), "{text}");
    drop(held);
    // Once they are gone, requests are served again.
    assert!(
        crate::support::eventually_blocking(Duration::from_secs(5), || {
            serve.get("/healthz").status == 200
        }),
        "serve did not recover after the held connections closed"
    );
}
