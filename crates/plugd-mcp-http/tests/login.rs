//! `plugd mcp login`'s OAuth mechanics over real loopback HTTP: a tiny
//! authorization server and MCP server in the test (std threads, one
//! request per connection), and the test as the browser and as another
//! local user who reaches the redirect listener first.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugd_mcp_http::oauth::{
    self, CALLBACK_CONNECTIONS, CALLBACK_HEAD, ClientSettings, Login, MAX_DOCUMENT, OAuthError,
    Stored,
};
use reqwest::Url;
use serde_json::json;

/// Which document the fixture pads to how many bytes.
#[derive(Clone, Copy)]
enum Pad {
    None,
    ResourceMetadata(usize),
    ServerMetadata(usize),
}

/// The fixture's MCP server (`/mcp`, always `401`) and authorization
/// server: its base URL, and the codes its token endpoint received.
struct Fixture {
    base: String,
    codes: Arc<Mutex<Vec<String>>>,
}

impl Fixture {
    fn start(pad: Pad) -> Fixture {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let codes = Arc::new(Mutex::new(Vec::new()));
        let (b, c) = (base.clone(), codes.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (b, c) = (b.clone(), c.clone());
                std::thread::spawn(move || serve_fixture(stream, &b, pad, &c));
            }
        });
        Fixture { base, codes }
    }

    fn server(&self) -> Url {
        Url::parse(&format!("{}/mcp", self.base)).unwrap()
    }

    fn codes(&self) -> Vec<String> {
        self.codes.lock().unwrap().clone()
    }
}

/// `doc` as JSON, padded with a `padding` member to exactly `size` bytes.
fn padded(doc: serde_json::Value, size: Option<usize>) -> Vec<u8> {
    let text = doc.to_string();
    let Some(size) = size else {
        return text.into_bytes();
    };
    let head = format!("{},\"padding\":\"", &text[..text.len() - 1]);
    let fill = size - head.len() - 2;
    format!("{head}{}\"}}", "x".repeat(fill)).into_bytes()
}

fn serve_fixture(mut s: TcpStream, base: &str, pad: Pad, codes: &Mutex<Vec<String>>) {
    let Some((method, target, body)) = read_request(&mut s) else {
        return;
    };
    let path = target.split('?').next().unwrap_or_default();
    let (status, extra, body): (u16, String, Vec<u8>) = match (method.as_str(), path) {
        ("POST", "/mcp") => (
            401,
            format!(
                "WWW-Authenticate: Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\"\r\n"
            ),
            Vec::new(),
        ),
        ("GET", "/.well-known/oauth-protected-resource/mcp") => {
            let size = match pad {
                Pad::ResourceMetadata(n) => Some(n),
                _ => None,
            };
            let doc = json!({"resource": format!("{base}/mcp"), "authorization_servers": [base]});
            (200, String::new(), padded(doc, size))
        }
        ("GET", "/.well-known/oauth-authorization-server") => {
            let size = match pad {
                Pad::ServerMetadata(n) => Some(n),
                _ => None,
            };
            let doc = json!({
                "issuer": base,
                "authorization_endpoint": format!("{base}/authorize"),
                "token_endpoint": format!("{base}/token"),
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
            });
            (200, String::new(), padded(doc, size))
        }
        ("POST", "/token") => {
            let form: Vec<(String, String)> =
                url::form_urlencoded::parse(&body).into_owned().collect();
            if let Some((_, code)) = form.iter().find(|(k, _)| k == "code") {
                codes.lock().unwrap().push(code.clone());
            }
            let doc = json!({"access_token": "at-1", "token_type": "bearer", "expires_in": 60});
            (200, String::new(), doc.to_string().into_bytes())
        }
        _ => (404, String::new(), Vec::new()),
    };
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(&body);
}

/// One request: method, target, body (by `Content-Length`).
fn read_request(s: &mut TcpStream) -> Option<(String, String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut first = head.split_whitespace();
    let (method, target) = (first.next()?.to_owned(), first.next()?.to_owned());
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    s.read_exact(&mut body).ok()?;
    Some((method, target, body))
}

/// Sends `bytes` to `addr` and reads the answer to its end: the status
/// (`0`: closed unanswered) and the whole text.
fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// `GET target` at `addr`: the status.
fn get(addr: SocketAddr, target: &str) -> u16 {
    let req = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    raw(addr, req.as_bytes()).0
}

/// A login begun at the fixture (client `plugd-test`, pre-registered): the
/// runtime, the login, its listener's address and its state.
fn begin(f: &Fixture) -> (tokio::runtime::Runtime, Login, SocketAddr, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let settings = ClientSettings {
        client_id: Some("plugd-test".into()),
        ..ClientSettings::default()
    };
    let login = rt.block_on(oauth::begin(&f.server(), &settings)).unwrap();
    let addr = login.local_addr().unwrap();
    let param = |name: &str| {
        login
            .url
            .query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
            .unwrap_or_else(|| panic!("no {name} in {}", login.url))
    };
    let state = param("state");
    assert_eq!(
        param("redirect_uri"),
        format!("http://127.0.0.1:{}/callback", addr.port()),
        "the redirect names the exact port bound"
    );
    (rt, login, addr, state)
}

fn finish(
    rt: &tokio::runtime::Runtime,
    login: Login,
    secs: u64,
) -> tokio::task::JoinHandle<Result<Stored, OAuthError>> {
    rt.spawn(login.finish(Duration::from_secs(secs)))
}

#[test]
fn the_redirect_listener_is_on_loopback_at_the_port_the_redirect_names() {
    let f = Fixture::start(Pad::None);
    let (_rt, _login, addr, _) = begin(&f);
    assert_eq!(addr.ip(), std::net::Ipv4Addr::LOCALHOST);
    // A fixed port (`"callbackPort"`) is the one bound and named.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let settings = ClientSettings {
        client_id: Some("plugd-test".into()),
        callback_port: port,
        ..ClientSettings::default()
    };
    let login = rt.block_on(oauth::begin(&f.server(), &settings)).unwrap();
    assert_eq!(
        login.local_addr().unwrap(),
        SocketAddr::from(([127, 0, 0, 1], port))
    );
    assert!(
        login
            .url
            .as_str()
            .contains(&format!("127.0.0.1%3A{port}%2Fcallback")),
        "{}",
        login.url
    );
}

#[test]
fn wrong_state_and_junk_requests_are_ignored_and_the_right_redirect_completes_the_login() {
    let f = Fixture::start(Pad::None);
    let (rt, login, addr, state) = begin(&f);
    let done = finish(&rt, login, 30);
    // Another local user gets there first, with everything but the state.
    let idle = TcpStream::connect(addr).unwrap(); // sends nothing, stays open
    assert_eq!(get(addr, "/callback?state=forged&code=evil"), 400);
    assert_eq!(get(addr, "/callback?code=evil"), 400);
    assert_eq!(get(addr, "/callback?error=access_denied"), 400);
    assert_eq!(get(addr, "/callback?error=access_denied&state=forged"), 400);
    assert_eq!(get(addr, "/callback"), 400);
    assert_eq!(get(addr, "/favicon.ico"), 404);
    assert_eq!(get(addr, &format!("/other?state={state}&code=evil")), 404);
    // A POST with the right state is not a browser's redirect; its body
    // (announced at 1 GB) is never read.
    let post = format!(
        "POST /callback?state={state}&code=evil HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000000000\r\n\r\n"
    );
    assert_eq!(raw(addr, post.as_bytes()).0, 405);
    // A head over the limit is refused unread.
    let huge = format!(
        "GET /callback?state={state}&code=evil HTTP/1.1\r\nHost: {addr}\r\nX-Junk: {}\r\n\r\n",
        "j".repeat(CALLBACK_HEAD * 4)
    );
    assert_eq!(raw(addr, huge.as_bytes()).0, 431);
    let (status, _) = raw(addr, b"\x00\x01\x02 not http at all\r\n\r\n");
    assert!(status == 400 || status == 0, "{status}");
    assert!(!done.is_finished(), "nothing of that ended the login");
    // The browser's redirect, the right state.
    assert_eq!(
        get(addr, &format!("/callback?code=good&state={state}")),
        200
    );
    let stored = rt.block_on(done).unwrap().unwrap();
    assert_eq!(stored.access_token, "at-1");
    assert_eq!(
        f.codes(),
        ["good"],
        "only the right redirect's code was used"
    );
    drop(idle);
}

#[test]
fn a_refusal_with_the_right_state_ends_the_login_naming_the_error() {
    let f = Fixture::start(Pad::None);
    let (rt, login, addr, state) = begin(&f);
    let done = finish(&rt, login, 30);
    assert_eq!(
        get(
            addr,
            &format!(
                "/callback?error=access_denied&error_description=the+user+said+no&state={state}"
            )
        ),
        400
    );
    let e = rt.block_on(done).unwrap().unwrap_err().to_string();
    assert!(
        e.contains("refused: \"access_denied\" (\"the user said no\")"),
        "{e}"
    );
    assert!(f.codes().is_empty(), "no token was asked");
}

#[test]
fn a_redirect_with_a_wrong_state_never_completes_the_login() {
    let f = Fixture::start(Pad::None);
    let (rt, login, addr, state) = begin(&f);
    let done = finish(&rt, login, 2);
    let wrong = format!("{state}x");
    assert_eq!(get(addr, &format!("/callback?code=c&state={wrong}")), 400);
    let e = rt.block_on(done).unwrap().unwrap_err().to_string();
    assert!(
        e.contains("nobody completed the authorization within 2 s (1 redirect with a wrong state was ignored)"),
        "{e}"
    );
    assert!(f.codes().is_empty(), "{:?}", f.codes());
}

#[test]
fn the_redirect_listener_serves_a_bounded_number_of_connections() {
    let f = Fixture::start(Pad::None);
    let (rt, login, addr, state) = begin(&f);
    let done = finish(&rt, login, 30);
    let idle: Vec<TcpStream> = (0..CALLBACK_CONNECTIONS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // One more is closed unanswered while they are open.
    let (status, text) = raw(
        addr,
        format!("GET /callback?code=c&state={state} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status, 0, "{text}");
    drop(idle);
    // Once they are gone, the redirect is served.
    let mut status = 0;
    for _ in 0..100 {
        status = get(addr, &format!("/callback?code=after&state={state}"));
        if status != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(status, 200);
    rt.block_on(done).unwrap().unwrap();
    assert_eq!(f.codes(), ["after"]);
}

#[test]
fn metadata_documents_over_256_kib_are_refused_naming_the_url_and_the_limit() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = oauth::http_client().unwrap();
    let settings = ClientSettings::default();
    for (pad, path) in [
        (
            Pad::ResourceMetadata as fn(usize) -> Pad,
            "/.well-known/oauth-protected-resource/mcp",
        ),
        (
            Pad::ServerMetadata,
            "/.well-known/oauth-authorization-server",
        ),
    ] {
        // Exactly the limit is read.
        let f = Fixture::start(pad(MAX_DOCUMENT));
        let found = rt.block_on(oauth::discover(&http, &f.server(), &settings));
        assert!(found.is_ok(), "{path}: {found:?}");
        // One byte more is not.
        let f = Fixture::start(pad(MAX_DOCUMENT + 1));
        let e = rt
            .block_on(oauth::discover(&http, &f.server(), &settings))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{}{path}", f.base))
                && e.contains("over 262144 bytes, the limit for OAuth documents"),
            "{e}"
        );
    }
}
