//! The HTTP API over a real socket: a real `plugd serve --listen 127.0.0.1:0`
//! process (its port read from its `plugd serving on http://…` line), driven
//! with hand-written HTTP/1.1 over `TcpStream` and an admin bearer token made
//! with `plugd token create` before serve starts, in front of real plugins (the
//! Python native example, the Node Salmex example, the seed's tenant-auth
//! Dexto module) and the `scripted` LLM (`tests/plugins/http/turns.yaml`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Ws, plugd_cmd, repo, stderr};

/// A running `plugd serve`; killed on drop if the test did not stop it.
pub(crate) struct Serve {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    /// An admin token for `addr`.
    pub(crate) token: String,
    /// The one-time console login link serve printed.
    pub(crate) console_link: Option<String>,
    log: PathBuf,
}

/// Makes a token of `role` in `ws` with `plugd token create`; its secret.
pub(crate) fn make_token(ws: &Ws, role: &str) -> String {
    make_token_env(ws, role, &[])
}

/// [`make_token`] with extra environment (the state's, the master key's).
pub(crate) fn make_token_env(ws: &Ws, role: &str, env: &[(&str, &str)]) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let name = format!("test-{role}-{}", N.fetch_add(1, Ordering::Relaxed));
    let out = plugd_cmd(ws.dir())
        .envs(env.iter().copied())
        .args(["token", "create", "--name", &name, "--role", role, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "token create: {}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["token"].as_str().unwrap().to_owned()
}

impl Serve {
    /// Starts `plugd serve --listen listen` and waits for its serving line.
    pub(crate) fn start(ws: &Ws, listen: &str) -> Serve {
        Serve::start_env(ws, listen, &[])
    }

    /// [`Serve::start`] on an ephemeral loopback port with extra environment.
    pub(crate) fn start_with_env(ws: &Ws, env: &[(&str, &str)]) -> Serve {
        Serve::start_env(ws, "127.0.0.1:0", env)
    }

    fn start_env(ws: &Ws, listen: &str, env: &[(&str, &str)]) -> Serve {
        let token = make_token_env(ws, "admin", env);
        let log = ws
            .dir()
            .join(format!("serve-{}.log", listen.replace(':', "_")));
        let mut cmd = plugd_cmd(ws.dir());
        cmd.envs(env.iter().copied())
            .args(["serve", "--listen", listen]);
        Serve::spawn(cmd, log, token)
    }

    /// Spawns `cmd` (a `plugd serve --listen` command), logging to `log`,
    /// and waits for its serving line; `token` is the admin token to use.
    pub(crate) fn spawn(mut cmd: std::process::Command, log: PathBuf, token: String) -> Serve {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The socket's line comes first, then the TCP one.
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let mut link = None;
            while r.read_line(&mut line).is_ok_and(|n| n > 0)
                && !line.starts_with("plugd serving on http://")
            {
                if let Some(l) = line.trim().strip_prefix("plugd console: ") {
                    link = Some(l.to_owned());
                }
                line.clear();
            }
            let _ = tx.send((line, link));
        });
        let (line, console_link) = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let Some(url) = line.trim().strip_prefix("plugd serving on http://") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "no serving line from plugd serve ({line:?}); log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        let addr: SocketAddr = url.parse().unwrap();
        Serve {
            child,
            addr,
            token,
            console_link,
            log,
        }
    }

    /// SIGTERM, then the exit status and the log.
    pub(crate) fn stop(mut self) -> (ExitStatus, String) {
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        (
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }

    /// What serve has logged so far.
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn get(&self, path: &str) -> Resp {
        request(self, "GET", path, &[], None)
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> Resp {
        request(
            self,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            Some(body.to_string().as_bytes()),
        )
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One response.
#[derive(Debug)]
pub(crate) struct Resp {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts a JSON error of `status` and `code`; returns the body.
    #[track_caller]
    pub(crate) fn error(&self, status: u16, code: &str) -> Value {
        let v = self.json();
        assert_eq!(self.status, status, "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert_eq!(self.header("content-type"), Some("application/json"), "{v}");
        v
    }
}

pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

/// Writes a request head to `serve` with its admin token.
fn write_head(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    serve: &Serve,
    headers: &[(&str, &str)],
) {
    write_head_as(s, method, path, serve, &serve.token, headers)
}

/// Writes a request head to `serve` with `token`.
pub(crate) fn write_head_as(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    serve: &Serve,
    token: &str,
    headers: &[(&str, &str)],
) {
    // A `Host` among `headers` (a load balancer's address) replaces serve's.
    let mut head = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n")
    } else {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            serve.addr
        )
    };
    // An empty token: no Authorization header at all (a browser's request).
    if !token.is_empty() {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
}

/// Status line and headers.
pub(crate) fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    (status, headers)
}

/// One chunk of a chunked body (`None` at the end).
pub(crate) fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut size = String::new();
    r.read_line(&mut size).unwrap();
    let size = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16)
        .unwrap_or_else(|_| panic!("bad chunk size {size:?}"));
    let mut data = vec![0; size];
    r.read_exact(&mut data).unwrap();
    let mut crlf = [0; 2];
    r.read_exact(&mut crlf).unwrap();
    (size > 0).then_some(data)
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
}

/// A whole request and response (`Connection: close`).
fn request(
    serve: &Serve,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Resp {
    request_as(serve, &serve.token, method, path, headers, body)
}

/// One request with `token`; the body read whole (chunked or not).
pub(crate) fn request_as(
    serve: &Serve,
    token: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Resp {
    let mut s = connect(serve.addr);
    let len = body.map(|b| b.len().to_string());
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    if let Some(len) = &len {
        all.push(("Content-Length", len));
    }
    write_head_as(&mut s, method, path, serve, token, &all);
    if let Some(b) = body {
        s.write_all(b).unwrap();
    }
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let mut body = Vec::new();
    if is_chunked(&headers) {
        while let Some(c) = read_chunk(&mut r) {
            body.extend(c);
        }
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Resp {
        status,
        headers,
        body,
    }
}

/// `POST path` with `Accept: text/event-stream`, read as a stream: each SSE
/// event `(event, data)` as it arrives, until `done` or `error`; then the
/// stream must end.
fn sse(serve: &Serve, path: &str, body: &Value) -> Vec<(String, Value)> {
    let mut s = connect(serve.addr);
    let body = body.to_string();
    let len = body.len().to_string();
    write_head(
        &mut s,
        "POST",
        path,
        serve,
        &[
            ("Content-Type", "application/json"),
            ("Accept", "text/event-stream"),
            ("Content-Length", &len),
        ],
    );
    s.write_all(body.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    assert_eq!(status, 200, "{headers:?}");
    let ct = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str());
    assert_eq!(ct, Some("text/event-stream"));
    assert!(is_chunked(&headers), "a stream: {headers:?}");
    let mut pending = String::new();
    let mut events = Vec::new();
    loop {
        let chunk = read_chunk(&mut r).expect("the stream ended before a done or error event");
        pending.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = pending.find("\n\n") {
            let frame: String = pending.drain(..end + 2).collect();
            let mut event = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                } else {
                    assert!(
                        line.starts_with(':') || line.is_empty(),
                        "SSE line {line:?}"
                    );
                }
            }
            let Some(event) = event else { continue }; // a keep-alive comment
            let data: Value = serde_json::from_str(&data).unwrap();
            let last = event == "done" || event == "error";
            events.push((event, data));
            if last {
                assert_eq!(read_chunk(&mut r), None, "nothing after the last event");
                return events;
            }
        }
    }
}

fn approve(ws: &Ws, id: &str) {
    let out = ws.plugd(&["plugin", "approve", id]);
    assert!(out.status.success(), "approve {id}: {}", stderr(&out));
}

fn text_of(v: &Value) -> &str {
    v["content"][0]["text"].as_str().unwrap_or_default()
}

/// The two example plugins approved, plus the tenant-auth Dexto module, the
/// content policy and `extra` in plugd.yaml.
fn workspace(extra: &str) -> Ws {
    let ws = Ws::new();
    ws.example("hello-python");
    ws.example("hello-salmex-node");
    approve(&ws, "hello_python");
    approve(&ws, "hello-salmex-node");
    std::fs::create_dir_all(ws.dir().join("plugins")).unwrap();
    std::fs::copy(
        repo().join("examples/workspace/plugins/tenant-auth.js"),
        ws.dir().join("plugins/tenant-auth.js"),
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            r#"plugins:
  contentPolicy: {{priority: 10, maxInputChars: 200}}
  custom:
    - name: tenant-auth
      module: "${{{{dexto.agent_dir}}}}/plugins/tenant-auth.js"
      blocking: true
      priority: 100
      config: {{enforceQuota: true}}
{extra}"#
        ),
    )
    .unwrap();
    ws
}

#[test]
fn serve_lists_invokes_and_runs_hooks_over_a_socket() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    assert!(serve.addr.ip().is_loopback() && serve.addr.port() != 0);

    let r = serve.get("/v1/plugins");
    assert_eq!(r.status, 200);
    let plugins = r.json();
    let mut ids: Vec<(&str, bool)> = plugins
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["approved"].as_bool().unwrap()))
        .collect();
    ids.sort();
    assert_eq!(ids, [("hello-salmex-node", true), ("hello_python", true)]);

    let r = serve.get("/v1/tools");
    assert_eq!(r.status, 200);
    let names: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    for want in [
        "hello_python_greet",
        "hello_python_add",
        "hello-salmex-node/say_hello",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }

    // A native tool, and a Salmex tool whose name has a slash.
    let r = serve.post(
        "/v1/tools/hello_python_greet:invoke",
        &json!({"args": {"name": "Ada"}}),
    );
    assert_eq!(
        (r.status, text_of(&r.json())),
        (200, "Hello, Ada!"),
        "{}",
        r.json()
    );
    let r = serve.post(
        "/v1/tools/hello-salmex-node/say_hello:invoke",
        &json!({"args": {"name": "Grace"}, "agent_id": "support"}),
    );
    assert_eq!(
        (r.status, text_of(&r.json())),
        (200, "Hello, Grace!"),
        "{}",
        r.json()
    );
    let r = serve.post(
        "/v1/tools/hello_python_add:invoke",
        &json!({"args": {"a": 2, "b": 3}}),
    );
    assert_eq!(r.json()["sum"], 5);

    // Refusals.
    let v = serve
        .post(
            "/v1/tools/hello_python_greet:invoke",
            &json!({"args": {"name": 3}}),
        )
        .error(422, "invalid_arguments");
    assert_eq!(v["error"]["details"]["fields"][0]["path"], "/name", "{v}");
    serve
        .post("/v1/tools/nope/nothing:invoke", &json!({"args": {}}))
        .error(404, "unknown_tool");
    let bad = "{\n  \"args\": {\"name\": Ada}\n}";
    let r = request(
        &serve,
        "POST",
        "/v1/tools/hello_python_greet:invoke",
        &[("Content-Type", "application/json")],
        Some(bad.as_bytes()),
    );
    let v = r.error(400, "malformed_json");
    assert_eq!(
        v["error"]["details"],
        json!({"line": 2, "column": 20}),
        "{v}"
    );
    let r = request(
        &serve,
        "POST",
        "/v1/tools/hello_python_greet:invoke",
        &[("Content-Type", "text/plain")],
        Some(b"{}"),
    );
    r.error(415, "unsupported_media_type");
    // Over the 1 MiB default: refused from the declared length, before the
    // body is read (no bytes sent, so the close is clean).
    let mut s = connect(serve.addr);
    write_head(
        &mut s,
        "POST",
        "/v1/tools/hello_python_greet:invoke",
        &serve,
        &[
            ("Content-Type", "application/json"),
            ("Content-Length", "2097152"),
        ],
    );
    let mut r = BufReader::new(s);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 413);

    // Hook runs: 200 whether the chain continues or blocks.
    let r = serve.post(
        "/v1/hooks/before_llm_request:run",
        &json!({"payload": {"text": "hello"}, "context": {"tenant_id": "acme"}}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        json!({"outcome": "continue", "payload": {"text": "hello"}, "message": null, "notices": []})
    );
    let r = serve.post(
        "/v1/hooks/before_llm_request:run",
        &json!({"payload": {"text": "hello"}, "context": {"tenant_id": "globex"}}),
    );
    let v = r.json();
    assert_eq!((r.status, &v["outcome"]), (200, &json!("blocked")), "{v}");
    assert_eq!(v["notices"][0]["code"], "QUOTA_EXCEEDED", "{v}");
    assert_eq!(v["notices"][0]["handler"], "tenant-auth", "{v}");
    let r = serve.post(
        "/v1/hooks/before_llm_request:run",
        &json!({"payload": {"text": "x".repeat(201)}}),
    );
    let v = r.json();
    assert_eq!((r.status, &v["outcome"]), (200, &json!("blocked")), "{v}");
    assert_eq!(v["notices"][0]["code"], "INPUT_TOO_LONG", "{v}");
    let v = serve
        .post("/v1/hooks/before_lunch:run", &json!({"payload": {}}))
        .error(404, "unknown_hook_point");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"before_lunch\""),
        "{v}"
    );

    // No llm: section: the sessions endpoints say so.
    serve
        .post("/v1/sessions/s1/messages", &json!({"text": "hi"}))
        .error(503, "llm_not_configured");

    let (status, log) = serve.stop();
    assert!(
        status.success(),
        "serve exits 0 on SIGTERM: {status:?}\n{log}"
    );
    let http = log.find("stopping the HTTP API").expect(&log);
    let plugins = log.find("all plugins stopped").expect(&log);
    assert!(http < plugins, "the API stops before the plugins:\n{log}");
}

#[test]
fn serve_refuses_non_loopback_addresses() {
    let ws = Ws::new();
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let out = ws.plugd(&["serve", "--listen", addr]);
        assert_eq!(out.status.code(), Some(1), "{addr}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!(
                "plugd: error: refusing to listen on {addr}: it is not a loopback address"
            )),
            "{addr}: {err}"
        );
    }
    for (listen, ip) in [("127.0.0.1:0", "127.0.0.1"), ("[::1]:0", "::1")] {
        let serve = Serve::start(&ws, listen);
        assert_eq!(serve.addr.ip().to_string(), ip);
        let r = serve.get("/v1/tools");
        assert_eq!((r.status, r.json()), (200, json!([])));
        let (status, log) = serve.stop();
        assert!(status.success(), "{listen}: {status:?}\n{log}");
    }
}

#[test]
fn sessions_follow_the_agent_contract() {
    let ws = workspace("llm: {provider: scripted, script: \"${{workspace_dir}}/turns.yaml\"}\n");
    std::fs::copy(
        repo().join("tests/plugins/http/turns.yaml"),
        ws.dir().join("turns.yaml"),
    )
    .unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");

    serve
        .get("/v1/sessions/never-seen")
        .error(404, "unknown_session");

    // One turn: the scripted model calls the Python tool, then answers.
    let r = serve.post(
        "/v1/sessions/s1/messages",
        &json!({"text": "please greet Ada"}),
    );
    {
        let v = r.json();
        assert_eq!(r.status, 200, "{v}");
        assert_eq!(v["session_id"], "s1");
        assert_eq!(v["status"], "completed", "{v}");
        assert_eq!(v["reply"], "I greeted Ada.", "{v}");
        assert_eq!(v["tool_calls"][0]["tool"], "hello_python_greet", "{v}");
        assert_eq!(v["tool_calls"][0]["ok"], true, "{v}");
        assert!(
            v["tool_calls"][0]["result"]
                .to_string()
                .contains("Hello, Ada!"),
            "{v}"
        );
        let r = serve.get("/v1/sessions/s1");
        let s = r.json();
        assert_eq!((r.status, &s["id"]), (200, &json!("s1")), "{s}");
        let roles: Vec<&str> = s["transcript"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["role"].as_str().unwrap())
            .filter(|r| *r != "system")
            .collect();
        assert_eq!(roles.first(), Some(&"user"), "{s}");
        assert_eq!(roles.last(), Some(&"assistant"), "{s}");
        assert!(roles.contains(&"tool"), "{s}");
    }

    // The same turn as a stream of SSE events, `done` last.
    let events = sse(
        &serve,
        "/v1/sessions/s2/messages",
        &json!({"text": "greet Ada"}),
    );
    let (last, data) = events.last().unwrap();
    {
        assert_eq!(last, "done", "{events:?}");
        for (event, data) in &events {
            assert_eq!(data["type"], json!(event), "event name = its type: {data}");
        }
        let outcome = &data["outcome"];
        assert_eq!(outcome["status"], "completed", "{outcome}");
        assert_eq!(outcome["reply"], "I greeted Ada.", "{outcome}");
        let kinds: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
        let call = kinds
            .iter()
            .position(|k| *k == "tool_call")
            .expect("a tool_call event");
        let result = kinds
            .iter()
            .position(|k| *k == "tool_result")
            .expect("a tool_result event");
        assert!(call < result, "{kinds:?}");
        assert_eq!(events[call].1["tool"], "hello_python_greet");
        assert_eq!(events[result].1["ok"], true);
        let deltas: String = events
            .iter()
            .filter(|(e, _)| e == "delta")
            .map(|(_, d)| d["text"].as_str().unwrap())
            .collect();
        assert!(
            deltas.is_empty() || deltas == "I greeted Ada.",
            "{deltas:?}"
        );
    }

    // Blocked turns: 429 for a quota notice, 401 for an unauthorized one,
    // 403 otherwise, with the outcome in the body.
    for (session, text, context, status, code, notice) in [
        (
            "q1",
            "greet Ada".to_owned(),
            json!({"tenant_id": "globex"}),
            429,
            "quota_exceeded",
            "QUOTA_EXCEEDED",
        ),
        (
            "u1",
            "greet Ada".to_owned(),
            json!({"tenant_id": "mallory"}),
            401,
            "unauthorized",
            "UNAUTHORIZED",
        ),
        (
            "l1",
            "x".repeat(201),
            json!({}),
            403,
            "turn_blocked",
            "INPUT_TOO_LONG",
        ),
    ] {
        let r = serve.post(
            &format!("/v1/sessions/{session}/messages"),
            &json!({"text": text, "context": context}),
        );
        let v = r.error(status, code);
        assert_eq!(v["outcome"]["status"], "blocked", "{v}");
        assert_eq!(v["outcome"]["blocked_at"], "before_llm_request", "{v}");
        let codes: Vec<&str> = v["outcome"]["notices"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["code"].as_str())
            .collect();
        assert!(codes.contains(&notice), "{v}");
    }

    let (status, log) = serve.stop();
    assert!(status.success(), "{status:?}\n{log}");
}
