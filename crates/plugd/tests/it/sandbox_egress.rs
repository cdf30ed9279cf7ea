//! The egress allowlist, hostile: a real Python (urllib) VAI package under
//! real bubblewrap whose only way out is plugd's egress proxy, against two
//! real loopback HTTP servers under different names (`allowed.localhost`,
//! `other.localhost`): the listed one answers through the proxy, the other
//! is refused with a 403 and never sees a connection, and the plugin can
//! neither connect to either port directly nor lie, overflow or garble its
//! way past the proxy, nor reach another plugin's proxy socket.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::*;

/// A loopback HTTP server that answers `served by NAME: <request line>` and
/// counts the connections it accepted.
struct Upstream {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Upstream {
    fn start(name: &'static str) -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut s) = conn else { continue };
                counter.fetch_add(1, Ordering::SeqCst);
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let line = text.lines().next().unwrap_or_default().to_owned();
                let host = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Host: "))
                    .unwrap_or("-")
                    .to_owned();
                let body = format!("served by {name}: {line} (Host {host})");
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Upstream { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A VAI package `test/<name>` (tools `offline`, network none, and
/// `online`, network egress): the sandbox probe.
fn package(ws: &Ws, name: &str) {
    package_as(ws, name, "worker");
}

/// [`package`] with both exports of execution class `class`.
fn package_as(ws: &Ws, name: &str, class: &str) {
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
         \n[[exports]]\nid = \"offline\"\nkind = \"tool\"\nexecution_class = \"{class}\"\ndescription = \"no network\"\n[exports.permissions]\nnetwork = \"none\"\nfilesystem = \"none\"\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n\
         \n[[exports]]\nid = \"online\"\nkind = \"tool\"\nexecution_class = \"{class}\"\ndescription = \"egress\"\n[exports.permissions]\nnetwork = \"egress\"\nfilesystem = \"none\"\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n"
    );
    std::fs::write(dir.join("vai-plugin.toml"), m).unwrap();
    let out = ws.plugd(&["plugin", "approve", &format!("test/{name}")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

fn online(ws: &Ws, name: &str, input: Value) -> Value {
    online_logged(ws, name, input).0
}

/// [`online`], and what plugd logged on stderr meanwhile.
fn online_logged(ws: &Ws, name: &str, input: Value) -> (Value, String) {
    let tool = format!("test/{name}/online");
    let args = input.to_string();
    let out = ws.plugd(&["tool", "call", &tool, "--args", &args, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let r = v
        .get("structured_output")
        .cloned()
        .unwrap_or_else(|| panic!("no structured_output in {v}"));
    (r, stderr(&out))
}

/// What the proxy answers to `data` sent as-is from inside the sandbox.
fn raw(ws: &Ws, data: &str) -> String {
    let v = online(ws, "probe", json!({"op": "raw", "data": data}));
    assert_eq!(v["ok"], json!(true), "{v}");
    v["reply"].as_str().unwrap().to_owned()
}

#[test]
fn an_egress_allowlist_lets_the_plugin_reach_only_the_listed_domain() {
    let allowed = Upstream::start("allowed");
    let other = Upstream::start("other");
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    test/probe:\n      egress_allow: [\"allowed.localhost\"]\n",
    )
    .unwrap();
    package(&ws, "probe");

    // The effective permissions show the allowlist and the proxy variables.
    let show = stdout(&ws.plugd(&["plugin", "show", "test/probe"]));
    assert!(
        show.contains(
            "  network:   proxy (only through plugd's egress proxy) to: allowed.localhost\n"
        ),
        "{show}"
    );
    assert!(
        show.contains("    online: network=egress filesystem=none -> network=egress filesystem=none egress_allow=[allowed.localhost]"),
        "{show}"
    );
    assert!(
        show.contains(
            " HTTP_PROXY HTTPS_PROXY ALL_PROXY http_proxy https_proxy all_proxy NO_PROXY no_proxy"
        ),
        "{show}"
    );
    assert!(
        show.contains("--unshare-net")
            && show.contains(
                "/run/plugd/egress-bridge __egress-bridge 3128 /run/plugd/egress.sock -- "
            ),
        "{show}"
    );

    // urllib through HTTP_PROXY: the listed name answers.
    let ok = online(
        &ws,
        "probe",
        json!({"op": "fetch", "url": format!("http://allowed.localhost:{}/x?y=1", allowed.port)}),
    );
    assert_eq!(ok["ok"], json!(true), "{ok}");
    assert_eq!(
        ok["body"],
        json!(format!(
            "served by allowed: GET /x?y=1 HTTP/1.1 (Host allowed.localhost:{})",
            allowed.port
        ))
    );
    assert_eq!(allowed.hits(), 1);

    // The other name is refused by the proxy, naming the domain and the key.
    let (refused, log) = online_logged(
        &ws,
        "probe",
        json!({"op": "fetch", "url": format!("http://other.localhost:{}/", other.port)}),
    );
    assert_eq!(refused["status"], json!(403), "{refused}");
    assert_eq!(
        refused["body"],
        json!(format!(
            "plugd egress proxy: plugin \"test/probe\" may not reach \"other.localhost\" (port {}): not on the allowlist; allow it with sandbox.plugins.test/probe.egress_allow (or sandbox.plugins.test/probe.grants.<export>.egress_allow) in plugd.yaml\n",
            other.port
        ))
    );
    // ... and logs the refusal with the plugin and the domain.
    let line = log
        .lines()
        .find(|l| l.contains("egress refused"))
        .unwrap_or_else(|| panic!("no refusal logged: {log}"));
    assert!(
        line.contains("test/probe") && line.contains("other.localhost"),
        "{line}"
    );
    // TLS goes through CONNECT: refused the same way.
    let connect = raw(
        &ws,
        &format!(
            "CONNECT other.localhost:{} HTTP/1.1\r\nHost: other.localhost:{}\r\n\r\n",
            other.port, other.port
        ),
    );
    assert!(
        connect.starts_with("HTTP/1.1 403 Forbidden\r\n"),
        "{connect}"
    );
    assert!(
        connect.contains("may not reach \"other.localhost\""),
        "{connect}"
    );
    // An allowed CONNECT tunnels the bytes that follow it.
    let tunnel = raw(
        &ws,
        &format!(
            "CONNECT allowed.localhost:{p} HTTP/1.1\r\n\r\nGET /t HTTP/1.1\r\nHost: allowed.localhost:{p}\r\n\r\n",
            p = allowed.port
        ),
    );
    assert!(
        tunnel.starts_with("HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK\r\n"),
        "{tunnel}"
    );
    assert!(
        tunnel.ends_with(&format!(
            "served by allowed: GET /t HTTP/1.1 (Host allowed.localhost:{})",
            allowed.port
        )),
        "{tunnel}"
    );
    // An IP literal of the allowed server is not the allowed name.
    let literal = raw(
        &ws,
        &format!(
            "GET http://127.0.0.1:{p}/ HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n\r\n",
            p = allowed.port
        ),
    );
    assert!(
        literal.starts_with("HTTP/1.1 403 Forbidden\r\n"),
        "{literal}"
    );
    assert!(
        literal.contains("an IP literal is allowed only when it is listed itself"),
        "{literal}"
    );
    // A Host header that names the allowed host for a refused target.
    let lying = raw(
        &ws,
        &format!(
            "GET http://other.localhost:{}/ HTTP/1.1\r\nHost: allowed.localhost:{}\r\n\r\n",
            other.port, allowed.port
        ),
    );
    assert!(lying.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{lying}");
    assert!(
        lying.contains("does not name the host the request goes to"),
        "{lying}"
    );
    // Oversized, malformed and relative request lines.
    let huge = raw(
        &ws,
        &format!(
            "GET http://allowed.localhost:{}/{} HTTP/1.1\r\n\r\n",
            allowed.port,
            "a".repeat(20_000)
        ),
    );
    assert!(
        huge.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{huge}"
    );
    assert!(huge.contains("larger than 16384 bytes"), "{huge}");
    let garbage = raw(&ws, "\u{1}\u{2} nonsense \u{7f}\r\n\r\n");
    assert!(
        garbage.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{garbage}"
    );
    let relative = raw(
        &ws,
        "GET /etc/passwd HTTP/1.1\r\nHost: allowed.localhost\r\n\r\n",
    );
    assert!(
        relative.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{relative}"
    );
    assert!(
        relative.contains("is not an absolute http:// URL"),
        "{relative}"
    );
    // Not a single byte reached the refused server, and the allowed one saw
    // only the two requests that were allowed.
    assert_eq!(other.hits(), 0);
    assert_eq!(allowed.hits(), 2);

    // No direct way out: the sandbox's loopback is its own.
    for port in [allowed.port, other.port] {
        let direct = online(&ws, "probe", json!({"op": "connect", "port": port}));
        assert_eq!(
            direct["error"],
            json!("ConnectionRefusedError: [Errno 111] Connection refused"),
            "{direct}"
        );
    }
    assert_eq!(other.hits(), 0);
    assert_eq!(allowed.hits(), 2);
}

#[test]
fn a_plugin_cannot_reach_the_proxy_socket_of_another_plugin() {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    test/probe:\n      egress_allow: [\"allowed.localhost\"]\n    test/wide:\n      egress_allow: [\"other.localhost\"]\n",
    )
    .unwrap();
    package(&ws, "probe");
    package(&ws, "wide");
    // `test/wide` runs inside serve, with its proxy socket in .plugd/egress.
    let serve = Serve::start_with_env(&ws, &[]);
    let out = ws.plugd(&["plugin", "start", "test/wide"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = ws.dir().join(".plugd/egress");
    let sockets: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("test_wide-")
        })
        .collect();
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let wide = &sockets[0];
    // It is live: plugd (outside every sandbox) can connect to it.
    std::os::unix::net::UnixStream::connect(wide).unwrap();
    // From inside `test/probe`'s sandbox it does not exist; its own does.
    let theirs = online(
        &ws,
        "probe",
        json!({"op": "unix", "path": wide.display().to_string()}),
    );
    assert_eq!(
        theirs["error"],
        json!("FileNotFoundError: [Errno 2] No such file or directory"),
        "{theirs}"
    );
    let own = online(
        &ws,
        "probe",
        json!({"op": "unix", "path": "/run/plugd/egress.sock"}),
    );
    assert_eq!(own["ok"], json!(true), "{own}");
    let (_, log) = serve.stop();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn without_an_allowlist_egress_keeps_the_host_network() {
    let allowed = Upstream::start("allowed");
    let ws = Ws::new();
    package(&ws, "probe");
    let show = stdout(&ws.plugd(&["plugin", "show", "test/probe"]));
    assert!(show.contains("  network:   host\n"), "{show}");
    assert!(!show.contains("HTTP_PROXY"), "{show}");
    assert!(!show.contains("egress_allow="), "{show}");
    let direct = online(&ws, "probe", json!({"op": "connect", "port": allowed.port}));
    assert_eq!(direct["ok"], json!(true), "{direct}");
}

#[test]
fn a_bad_egress_allowlist_is_refused_naming_the_entry() {
    let ws = Ws::new();
    package(&ws, "probe");
    for (yaml, says) in [
        (
            "egress_allow: [\"https://api.example.com\"]",
            "sandbox.plugins.test/probe.egress_allow[0]",
        ),
        (
            "egress_allow: [\"*.com\"]",
            "allows a whole top-level domain",
        ),
        (
            "network: deny\n      egress_allow: [\"a.example\"]",
            "network: deny allows no egress at all",
        ),
        (
            "grants:\n        online: {network: none, egress_allow: [\"a.example\"]}",
            "sandbox.plugins.test/probe.grants.online.egress_allow",
        ),
    ] {
        std::fs::write(
            ws.dir().join("plugd.yaml"),
            format!("sandbox:\n  plugins:\n    test/probe:\n      {yaml}\n"),
        )
        .unwrap();
        let out = ws.plugd(&["plugin", "show", "test/probe"]);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert!(text.contains(says), "{yaml}: {text}");
    }
    // Per export: the grant's allowlist is the export's egress.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    test/probe:\n      grants:\n        online: {egress_allow: [\"api.example.com:443\"]}\n",
    )
    .unwrap();
    let show = stdout(&ws.plugd(&["plugin", "show", "test/probe"]));
    assert!(
        show.contains(
            "  network:   proxy (only through plugd's egress proxy) to: api.example.com:443\n"
        ),
        "{show}"
    );
}

#[test]
fn the_landlock_fallback_refuses_an_egress_allowlist() {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  fallback: landlock\n  plugins:\n    test/probe:\n      egress_allow: [\"allowed.localhost\"]\n",
    )
    .unwrap();
    package(&ws, "probe");
    let no_bwrap = [("PLUGD_BWRAP", "/nonexistent/bwrap")];
    let out = plugd_cmd(ws.dir())
        .args(["plugin", "show", "test/probe"])
        .envs(no_bwrap)
        .output()
        .unwrap();
    let show = stdout(&out);
    assert!(
        show.contains("  sandbox:   refused (plugin \"test/probe\" may reach the network only through plugd's egress proxy (an egress allowlist) but bubblewrap not found at \"/nonexistent/bwrap\""),
        "{show}"
    );
    let out = plugd_cmd(ws.dir())
        .args([
            "tool",
            "call",
            "test/probe/online",
            "--args",
            "{\"op\":\"connect\",\"port\":1}",
        ])
        .envs(no_bwrap)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the Landlock fallback cannot enforce it: install bubblewrap"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_isolated_export_gets_its_own_allowlisted_proxy_and_its_neighbour_no_network() {
    let allowed = Upstream::start("allowed");
    let ws = Ws::new();
    package_as(&ws, "probe", "isolated");
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            "sandbox:\n  plugins:\n    test/probe:\n      grants:\n        online: {{egress_allow: [\"allowed.localhost:{}\"]}}\n",
            allowed.port
        ),
    )
    .unwrap();
    let show = stdout(&ws.plugd(&["plugin", "show", "test/probe"]));
    assert!(
        show.contains("isolated:online: exports online; sandbox bwrap, network proxy"),
        "{show}"
    );
    assert!(
        show.contains("isolated:offline: exports offline; sandbox bwrap, network deny"),
        "{show}"
    );
    // Through its own process's proxy, the listed name answers.
    let fetched = online(
        &ws,
        "probe",
        json!({"op": "fetch", "url": format!("http://allowed.localhost:{}/", allowed.port)}),
    );
    assert_eq!(fetched["status"], json!(200), "{fetched}");
}
