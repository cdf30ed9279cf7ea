//! The console's login and its guards over a real `plugd serve --listen`:
//! tokens and one-time links exchanged for a session cookie, the CSRF token
//! every state-changing cookie request needs, roles kept, revocation and
//! logout ending sessions, the page's security headers, and a tool call's
//! progress streamed as server-sent events (a VAI plugin,
//! `tests/plugins/vai/vai_plugin.py`, reporting progress). Hostile requests
//! throughout: forged cookies and codes, a reused link, cross-origin posts,
//! a cookie without its CSRF token, the socket, oversized and malformed
//! login bodies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{Resp, Serve, make_token, request_as};
use crate::support::{Ws, repo, stderr};

/// A workspace with the Python native example and a VAI plugin (`test/meta`,
/// export `echo`, which reports `progress` steps), both approved.
fn workspace() -> Ws {
    let ws = Ws::new();
    ws.example("hello-python");
    let dir = ws.plugin_dir("meta");
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/vai/vai_plugin.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    std::fs::write(dir.join("schemas/any.json"), r#"{"type":"object"}"#).unwrap();
    std::fs::write(
        dir.join("vai-plugin.toml"),
        "api_version = \"vai.plugin.v1\"\npackage_id = \"test/meta\"\nversion = \"0.1.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = [\"python3\", \"plugin.py\", \"good\", \"test/meta\", \"0.1.0\"]\n\n[[exports]]\nid = \"echo\"\nkind = \"tool\"\ndescription = \"test echo\"\n\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n",
    )
    .unwrap();
    for id in ["hello_python", "test/meta"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    ws
}

/// A request without `Authorization`, with these headers (a browser's).
fn browser(
    serve: &Serve,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Resp {
    let text = body.map(Value::to_string);
    let mut all = headers.to_vec();
    if text.is_some() {
        all.push(("Content-Type", "application/json"));
    }
    request_as(
        serve,
        "",
        method,
        path,
        &all,
        text.as_deref().map(str::as_bytes),
    )
}

/// `name=value` of the session cookie a login answered with.
fn session_cookie(resp: &Resp) -> String {
    let set = resp
        .header("set-cookie")
        .unwrap_or_else(|| panic!("no Set-Cookie: {} {}", resp.status, resp.text()));
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attr), "{attr} missing: {set}");
    }
    set.split(';').next().unwrap().to_owned()
}

fn login(serve: &Serve, token: &str) -> (String, String) {
    let r = browser(
        serve,
        "POST",
        "/console/login",
        &[],
        Some(&json!({"token": token})),
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let cookie = session_cookie(&r);
    let s = browser(
        serve,
        "GET",
        "/console/session",
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(s.status, 200, "{}", s.text());
    let csrf = s.json()["csrf"].as_str().unwrap().to_owned();
    assert_eq!(csrf.len(), 64);
    (cookie, csrf)
}

#[test]
fn a_token_login_gives_a_cookie_that_needs_its_csrf_token_to_change_anything() {
    let ws = workspace();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let operator = make_token(&ws, "operator");
    let (cookie, csrf) = login(&serve, &operator);
    let who = browser(
        &serve,
        "GET",
        "/console/session",
        &[("Cookie", &cookie)],
        None,
    )
    .json();
    assert_eq!(who["role"], "operator", "{who}");
    assert!(
        who["identity"].as_str().unwrap().starts_with("token:"),
        "{who}"
    );
    // The cookie reads like the token does.
    let plugins = browser(&serve, "GET", "/v1/plugins", &[("Cookie", &cookie)], None);
    assert_eq!(plugins.status, 200, "{}", plugins.text());
    assert!(plugins.text().contains("hello_python"));

    let restart = "/v1/plugins/hello_python:restart";
    // Without the CSRF token, with a wrong one: refused, nothing done.
    browser(
        &serve,
        "POST",
        restart,
        &[("Cookie", &cookie)],
        Some(&json!({})),
    )
    .error(403, "csrf");
    let wrong = "0".repeat(64);
    browser(
        &serve,
        "POST",
        restart,
        &[("Cookie", &cookie), ("X-Plugd-CSRF", &wrong)],
        Some(&json!({})),
    )
    .error(403, "csrf");
    // Another session's CSRF token does not fit this session.
    let (_, other_csrf) = login(&serve, &operator);
    browser(
        &serve,
        "POST",
        restart,
        &[("Cookie", &cookie), ("X-Plugd-CSRF", &other_csrf)],
        Some(&json!({})),
    )
    .error(403, "csrf");
    // A cross-origin page with the right token is still refused.
    browser(
        &serve,
        "POST",
        restart,
        &[
            ("Cookie", &cookie),
            ("X-Plugd-CSRF", &csrf),
            ("Origin", "http://evil.example"),
        ],
        Some(&json!({})),
    )
    .error(403, "cross_origin");
    // With it: done, and audited as the token's identity.
    let ok = browser(
        &serve,
        "POST",
        restart,
        &[("Cookie", &cookie), ("X-Plugd-CSRF", &csrf)],
        Some(&json!({})),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    // The role holds: an operator may not invoke, whatever the cookie.
    browser(
        &serve,
        "POST",
        "/v1/tools/hello_python_greet:invoke",
        &[("Cookie", &cookie), ("X-Plugd-CSRF", &csrf)],
        Some(&json!({"args": {"name": "x"}})),
    )
    .error(403, "forbidden");
    // A viewer's session reads and changes nothing.
    let (vcookie, vcsrf) = login(&serve, &make_token(&ws, "viewer"));
    browser(
        &serve,
        "POST",
        restart,
        &[("Cookie", &vcookie), ("X-Plugd-CSRF", &vcsrf)],
        Some(&json!({})),
    )
    .error(403, "forbidden");
    // Logging out ends the session; the cookie is cleared.
    let out = browser(
        &serve,
        "POST",
        "/console/logout",
        &[("Cookie", &cookie), ("X-Plugd-CSRF", &csrf)],
        Some(&json!({})),
    );
    assert_eq!(out.status, 204, "{}", out.text());
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    browser(&serve, "GET", "/v1/plugins", &[("Cookie", &cookie)], None)
        .error(401, "unauthenticated");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains(&operator), "the token reached the log");
}

#[test]
fn wrong_tokens_forged_cookies_and_revoked_tokens_get_nothing() {
    let ws = workspace();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // A wrong token: 401 and no cookie.
    let bad = browser(
        &serve,
        "POST",
        "/console/login",
        &[],
        Some(&json!({"token": "plugd_0000000000000000_00"})),
    );
    bad.error(401, "unauthenticated");
    assert!(bad.header("set-cookie").is_none());
    // Malformed bodies: both fields, neither, not JSON, extra fields.
    for body in [
        json!({"token": "a", "code": "b"}),
        json!({}),
        json!({"token": "a", "admin": true}),
        json!(["token"]),
    ] {
        let r = browser(&serve, "POST", "/console/login", &[], Some(&body));
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.header("set-cookie").is_none());
    }
    // An oversized login body is refused before it is read whole.
    let huge = json!({"token": "x".repeat(3 << 20)});
    let r = browser(&serve, "POST", "/console/login", &[], Some(&huge));
    assert_eq!(r.status, 413, "{}", r.text());
    // A forged session id, another port's cookie name, a cookie-looking
    // Authorization: all unauthenticated.
    let port = serve.addr.port();
    for cookie in [
        format!("plugd_console_{port}={}", "a".repeat(64)),
        format!("plugd_console_{}=x", port.wrapping_add(1)),
        format!("plugd_console_{port}="),
    ] {
        browser(&serve, "GET", "/v1/plugins", &[("Cookie", &cookie)], None)
            .error(401, "unauthenticated");
    }
    // Revoking the token ends the sessions it opened.
    let agent = make_token(&ws, "agent");
    let (cookie, _) = login(&serve, &agent);
    let list = ws.plugd(&["token", "list", "--json"]);
    let tokens: Value = serde_json::from_slice(&list.stdout).unwrap();
    let id = tokens
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "agent")
        .find_map(|t| t["id"].as_str())
        .unwrap()
        .to_owned();
    let o = ws.plugd(&["token", "revoke", &id]);
    assert!(o.status.success(), "{}", stderr(&o));
    let gone = browser(
        &serve,
        "GET",
        "/console/session",
        &[("Cookie", &cookie)],
        None,
    );
    gone.error(401, "unauthenticated");
    assert!(gone.text().contains("revoked"), "{}", gone.text());
    // Over the socket there is nothing to log in to.
    let sock = ws.dir().join(".plugd/serve.sock");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let body = json!({"token": serve.token}).to_string();
    write!(
        s,
        "POST /console/login HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("set-cookie"),
        "{answer}"
    );
}

#[test]
fn a_login_link_works_once_and_plugd_console_prints_another() {
    let ws = workspace();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // serve's stdout is a pipe here: it prints no live link (only on a
    // terminal); `plugd console` asks the running serve for one.
    assert_eq!(serve.console_link, None);
    let o = ws.plugd(&["console"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let link = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let prefix = format!("http://{}/console/login#code=", serve.addr);
    let code = link
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{link} does not start with {prefix}"));
    assert_eq!(code.len(), 64);
    let use_code = |code: &str| {
        browser(
            &serve,
            "POST",
            "/console/login",
            &[],
            Some(&json!({"code": code})),
        )
    };
    let first = use_code(code);
    assert_eq!(first.status, 204, "{}", first.text());
    let cookie = session_cookie(&first);
    let who = browser(
        &serve,
        "GET",
        "/console/session",
        &[("Cookie", &cookie)],
        None,
    )
    .json();
    assert_eq!(who["role"], "admin", "serve's own user: {who}");
    // Spent: the same code again, and a forged one, are refused.
    use_code(code).error(401, "unauthenticated");
    use_code(&"f".repeat(64)).error(401, "unauthenticated");
    // `plugd console` asks the running serve for a fresh one.
    let o = ws.plugd(&["console"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let printed = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let again = printed
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{printed}"));
    assert_ne!(again, code);
    assert_eq!(use_code(again).status, 204);
    // Links are for serve's user: a token may not mint them.
    let operator = make_token(&ws, "operator");
    let r = request_as(
        &serve,
        &operator,
        "POST",
        "/console/links",
        &[],
        Some(b"{}"),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    drop(serve);
    // Without a serve, or without --listen, `plugd console` says what to do.
    let o = ws.plugd(&["console"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("plugd serve --listen"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_page_is_public_static_and_locked_down() {
    let ws = workspace();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    for path in ["/console/", "/console/login", "/console"] {
        let r = browser(&serve, "GET", path, &[], None);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
        let csp = r.header("content-security-policy").unwrap();
        assert!(
            csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert!(r.text().contains("/console/assets/app.js"));
    }
    let js = browser(&serve, "GET", "/console/assets/app.js", &[], None);
    assert_eq!(
        js.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert!(js.text().contains("X-Plugd-CSRF"));
    // No data without a login; nothing else under /console is public.
    browser(&serve, "GET", "/console/session", &[], None).error(401, "unauthenticated");
    let missing = browser(&serve, "GET", "/console/assets/secret.db", &[], None);
    assert_eq!(missing.status, 404, "{}", missing.text());
    // A page on another host name (DNS rebinding) gets nothing.
    let mut s = TcpStream::connect(serve.addr).unwrap();
    write!(
        s,
        "GET /console/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("forbidden_host"), "{answer}");
}

/// Reads SSE events `(event, data)` from `POST path` until the stream ends.
fn sse_events(serve: &Serve, token: &str, path: &str, body: &Value) -> Vec<(String, Value)> {
    let mut s = TcpStream::connect(serve.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        serve.addr,
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line);
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("text/event-stream"), "{head}");
    assert!(lower.contains("transfer-encoding: chunked"), "{head}");
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        r.read_line(&mut size).unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        let mut chunk = vec![0; size + 2];
        r.read_exact(&mut chunk).unwrap();
        if size == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..size]);
    }
    let text = String::from_utf8(body).unwrap();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let (mut ev, mut data) = (String::new(), String::new());
        for line in block.lines() {
            if let Some(e) = line.strip_prefix("event:") {
                ev = e.trim().to_owned();
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.trim_start());
            }
        }
        if !ev.is_empty() {
            events.push((ev, serde_json::from_str(&data).unwrap_or(Value::Null)));
        }
    }
    events
}

#[test]
fn a_tool_call_streams_its_progress_then_its_result() {
    let ws = workspace();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let events = sse_events(
        &serve,
        &agent,
        "/v1/tools/test/meta/echo:invoke",
        &json!({"args": {"progress": 3}}),
    );
    let kinds: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        kinds,
        ["progress", "progress", "progress", "result"],
        "{events:?}"
    );
    let (_, result) = &events[3];
    assert!(result.to_string().contains("echoed"), "{result}");
    // An error ends the stream as `error`, with the JSON answer's body.
    let events = sse_events(
        &serve,
        &agent,
        "/v1/tools/nope:invoke",
        &json!({"args": {}}),
    );
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "error");
    assert_eq!(events[0].1["status"], 404, "{:?}", events[0]);
    assert_eq!(events[0].1["error"]["code"], "unknown_tool");
}
