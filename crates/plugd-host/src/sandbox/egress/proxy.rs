//! plugd's egress proxy for one sandboxed start: an HTTP/1 forward proxy
//! (CONNECT for TLS, absolute-URI requests for plain HTTP) on a Unix socket
//! that only that sandbox sees.
//!
//! Every request is decided by [`EgressPlan::route`]; a refusal is a `403`
//! whose body names the host, the plugin and the plugd.yaml key that would
//! allow it, and is logged with the plugin and the host. A plain HTTP
//! request is forwarded once, in origin form, with `Connection: close`, then
//! the bytes are relayed both ways (the connection stays with the host that
//! was allowed). Limits ([`ProxyLimits`]): request head size and header
//! count (`431`), time to send the head, concurrent connections (`503`),
//! idle time of a relayed connection, connect time. Garbage gets a `400`.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{EgressPlan, Route, split_host_port};

/// The proxy's limits (all per plugin start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Largest request head (request line and headers), in bytes.
    pub max_head: usize,
    /// Most headers in a request head.
    pub max_headers: usize,
    /// Connections open at once.
    pub max_connections: usize,
    /// Time to send a whole request head.
    pub head_timeout: Duration,
    /// A relayed connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Time to connect to the upstream host.
    pub connect_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> ProxyLimits {
        ProxyLimits {
            max_head: 16 * 1024,
            max_headers: 64,
            max_connections: 64,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// A running proxy; dropping it stops it (its open connections too) and
/// removes its socket.
#[derive(Debug)]
pub struct EgressProxy {
    socket: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl EgressProxy {
    /// Starts the proxy of `plugin` for `plan` on a new Unix socket in the
    /// plan's socket directory (created `0700`; the socket is `0600`). Must be
    /// called inside a tokio runtime.
    pub fn start(plugin: &str, plan: &EgressPlan, limits: ProxyLimits) -> io::Result<EgressProxy> {
        let dir = plan
            .socket_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("plugd-egress"));
        std::fs::create_dir_all(&dir)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let socket = unique_socket_path(&dir, plugin)?;
        let std_listener = std::os::unix::net::UnixListener::bind(&socket)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        }
        std_listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(std_listener)?;
        let ctx = Arc::new(Ctx {
            plugin: plugin.to_owned(),
            plan: plan.clone(),
            limits,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
        });
        let task = tokio::spawn(accept_loop(listener, ctx));
        Ok(EgressProxy { socket, task })
    }

    /// The Unix socket the proxy listens on (outside the sandbox).
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `DIR/<plugin>-<n>.sock`, unused, short enough for `sun_path`.
fn unique_socket_path(dir: &Path, plugin: &str) -> io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let safe: String = plugin
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let p = dir.join(format!("{safe}-{}-{n}.sock", std::process::id()));
    if p.as_os_str().len() > 107 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the egress proxy socket path {:?} is longer than a Unix socket allows (107 bytes); use a shorter workspace path",
                p.display().to_string()
            ),
        ));
    }
    let _ = std::fs::remove_file(&p);
    Ok(p)
}

struct Ctx {
    plugin: String,
    plan: EgressPlan,
    limits: ProxyLimits,
    slots: Arc<Semaphore>,
}

async fn accept_loop(listener: UnixListener, ctx: Arc<Ctx>) {
    // Dropped (with every connection task) when the proxy is dropped.
    let mut conns = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        while conns.try_join_next().is_some() {}
        match ctx.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let ctx = ctx.clone();
                conns.spawn(async move {
                    handle(stream, &ctx).await;
                    drop(permit);
                });
            }
            Err(_) => {
                tracing::warn!(
                    plugin = %ctx.plugin,
                    "egress proxy: connection refused, {} connections are already open",
                    ctx.limits.max_connections
                );
                let body = format!(
                    "plugd egress proxy: plugin {:?} has {} connections open already (the most allowed); close some first\n",
                    ctx.plugin, ctx.limits.max_connections
                );
                conns.spawn(async move {
                    let mut s = stream;
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        s.write_all(&reply(503, "Service Unavailable", &body)),
                    )
                    .await;
                });
            }
        }
    }
}

/// A complete response with a text body and `Connection: close`.
pub(crate) fn reply(status: u16, reason: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Plugd-Egress: {}\r\n\r\n{body}",
        body.len(),
        if status == 403 { "refused" } else { "error" }
    )
    .into_bytes()
}

enum HeadError {
    TooLarge,
    Closed,
    Io,
}

/// Reads until the end of the request head; returns the head and the bytes
/// read after it.
async fn read_head(s: &mut UnixStream, max: usize) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.map_err(|_| HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = find(&buf[from..], b"\r\n\r\n") {
            let end = from + i + 4;
            if end > max {
                return Err(HeadError::TooLarge);
            }
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > max {
            return Err(HeadError::TooLarge);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A parsed request, as far as the proxy needs it.
struct Request {
    connect: bool,
    host: String,
    port: u16,
    /// The request line in origin form (plain HTTP only).
    request_line: String,
    /// The `Host` header's value (the authority when the client sent none).
    host_header: Vec<u8>,
    /// The other headers to send upstream, each ending in CRLF.
    headers: Vec<u8>,
}

impl Request {
    /// The head to send upstream, with `host` as its `Host` header and
    /// `Connection: close`.
    fn upstream_head(&self, host: &[u8]) -> Vec<u8> {
        let mut h = self.request_line.clone().into_bytes();
        h.extend_from_slice(b"Host: ");
        h.extend_from_slice(host);
        h.extend_from_slice(b"\r\n");
        h.extend_from_slice(&self.headers);
        h.extend_from_slice(b"Connection: close\r\n\r\n");
        h
    }
}

/// `Err((status, reason, message))`.
type Bad = (u16, &'static str, String);

fn parse(head: &[u8], max_headers: usize) -> Result<Request, Bad> {
    let bad = |m: String| (400, "Bad Request", m);
    let mut headers = vec![httparse::EMPTY_HEADER; max_headers];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad("an incomplete request head".into())),
        Err(httparse::Error::TooManyHeaders) => {
            return Err((
                431,
                "Request Header Fields Too Large",
                format!("more than {max_headers} headers"),
            ));
        }
        Err(e) => return Err(bad(format!("a malformed request ({e})"))),
    }
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let version = req.version.unwrap_or(1);
    let hosts: Vec<&[u8]> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| h.value)
        .collect();
    if hosts.len() > 1 {
        return Err(bad("more than one Host header".into()));
    }
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let (authority, origin_path, default_port) = if connect {
        (target, "", None)
    } else {
        let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
        if lower.starts_with("https://") {
            return Err(bad(
                "an https:// URL in a plain request; use CONNECT for TLS (HTTPS_PROXY does that)"
                    .into(),
            ));
        }
        let Some(rest) = lower.starts_with("http://").then(|| &target[7..]) else {
            return Err(bad(format!(
                "request target {:?} is not an absolute http:// URL; plugd's egress proxy forwards absolute URLs and CONNECT only",
                truncate(target)
            )));
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let path = &rest[end..];
        let path = if path.is_empty() || path.starts_with('#') {
            "/"
        } else {
            path
        };
        (&rest[..end], path, Some(80))
    };
    if authority.contains('@') {
        return Err(bad(
            "user information in the request target is not forwarded".into(),
        ));
    }
    let Some((host, port)) = split_host_port(authority) else {
        return Err(bad(format!("a bad port in {:?}", truncate(authority))));
    };
    let Some(port) = port.or(default_port).filter(|p| *p != 0) else {
        return Err(bad(format!(
            "CONNECT {:?} has no port",
            truncate(authority)
        )));
    };
    if host.is_empty() {
        return Err(bad("the request names no host".into()));
    }
    let host_n = super::normalize_host(host);
    if let Some(h) = hosts.first() {
        let h = std::str::from_utf8(h).map_err(|_| bad("a Host header that is not text".into()))?;
        let same = match split_host_port(h.trim()) {
            Some((hh, hp)) => {
                super::normalize_host(hh) == host_n && hp.or(default_port).unwrap_or(port) == port
            }
            None => false,
        };
        if !same {
            return Err(bad(format!(
                "the Host header ({:?}) does not name the host the request goes to ({:?})",
                truncate(h),
                truncate(authority)
            )));
        }
    }
    let mut headers = Vec::new();
    for h in req.headers.iter() {
        let n = h.name.to_ascii_lowercase();
        if matches!(
            n.as_str(),
            "host" | "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive"
        ) {
            continue;
        }
        headers.extend_from_slice(h.name.as_bytes());
        headers.extend_from_slice(b": ");
        headers.extend_from_slice(h.value);
        headers.extend_from_slice(b"\r\n");
    }
    Ok(Request {
        connect,
        host: host_n,
        port,
        request_line: format!("{method} {origin_path} HTTP/1.{version}\r\n"),
        host_header: hosts
            .first()
            .map_or_else(|| authority.as_bytes().to_vec(), |h| h.to_vec()),
        headers,
    })
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

async fn handle(mut client: UnixStream, ctx: &Ctx) {
    let limits = &ctx.limits;
    let head = tokio::time::timeout(limits.head_timeout, read_head(&mut client, limits.max_head));
    let (head, rest) = match head.await {
        Err(_) => {
            let m = format!(
                "plugd egress proxy: the request head did not arrive within {} s\n",
                limits.head_timeout.as_secs()
            );
            return send(&mut client, 408, "Request Timeout", &m).await;
        }
        Ok(Err(HeadError::TooLarge)) => {
            let m = format!(
                "plugd egress proxy: the request head is larger than {} bytes\n",
                limits.max_head
            );
            return send(&mut client, 431, "Request Header Fields Too Large", &m).await;
        }
        Ok(Err(HeadError::Closed | HeadError::Io)) => return,
        Ok(Ok(h)) => h,
    };
    let req = match parse(&head, limits.max_headers) {
        Ok(r) => r,
        Err((status, reason, m)) => {
            return send(
                &mut client,
                status,
                reason,
                &format!("plugd egress proxy: {m}\n"),
            )
            .await;
        }
    };
    let route = match ctx.plan.route(&req.host, req.port) {
        Ok(r) => r,
        Err(why) => return refuse(&mut client, ctx, &req, &why).await,
    };
    // plugd's listener checks Host: the gateway is asked for by its address.
    let host_header = match &route {
        Route::Gateway(a) => a.to_string().into_bytes(),
        _ => req.host_header.clone(),
    };
    let addrs = match route {
        Route::Gateway(a) => vec![a],
        Route::Addrs(a) => a,
        Route::Loopback(port) => vec![
            SocketAddr::from(([127, 0, 0, 1], port)),
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
        ],
        Route::Resolve { host, port } => {
            let found = tokio::time::timeout(
                limits.connect_timeout,
                tokio::net::lookup_host((host.as_str(), port)),
            )
            .await;
            let found: Vec<SocketAddr> = match found {
                Ok(Ok(it)) => it.collect(),
                _ => {
                    let m = format!("plugd egress proxy: cannot resolve {host:?}\n");
                    return send(&mut client, 502, "Bad Gateway", &m).await;
                }
            };
            let usable: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| ctx.plan.may_use(a.ip(), port))
                .collect();
            if usable.is_empty() {
                let list: Vec<String> = found.iter().map(|a| a.ip().to_string()).collect();
                let why = format!(
                    "it resolves only to internal addresses ({}), which are allowed only when listed themselves",
                    list.join(", ")
                );
                return refuse(&mut client, ctx, &req, &why).await;
            }
            usable
        }
    };
    let mut upstream = None;
    let mut last_err = String::from("no address");
    for a in &addrs {
        match tokio::time::timeout(limits.connect_timeout, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                upstream = Some(s);
                break;
            }
            Ok(Err(e)) => last_err = e.to_string(),
            Err(_) => last_err = "connect timed out".to_owned(),
        }
    }
    let Some(mut upstream) = upstream else {
        let m = format!(
            "plugd egress proxy: cannot connect to {}:{}: {last_err}\n",
            req.host, req.port
        );
        return send(&mut client, 502, "Bad Gateway", &m).await;
    };
    let first = if req.connect {
        if client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        rest
    } else {
        let mut h = req.upstream_head(&host_header);
        h.extend_from_slice(&rest);
        h
    };
    if !first.is_empty() && upstream.write_all(&first).await.is_err() {
        return;
    }
    relay(client, upstream, limits.idle_timeout).await;
}

async fn send(client: &mut UnixStream, status: u16, reason: &str, body: &str) {
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        client.write_all(&reply(status, reason, body)),
    )
    .await;
    let _ = client.shutdown().await;
}

async fn refuse(client: &mut UnixStream, ctx: &Ctx, req: &Request, why: &str) {
    tracing::warn!(
        plugin = %ctx.plugin,
        domain = %req.host,
        port = req.port,
        "egress refused: {why}"
    );
    let body = format!(
        "plugd egress proxy: plugin {:?} may not reach {:?} (port {}): {why}; allow it with {} in plugd.yaml\n",
        ctx.plugin, req.host, req.port, ctx.plan.config_key
    );
    send(client, 403, "Forbidden", &body).await;
}

/// Copies both ways until both sides are done, or nothing moved for `idle`.
async fn relay<A, B>(a: A, b: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let moved = AtomicU64::new(0);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let both = async {
        tokio::join!(pump(ar, bw, &moved), pump(br, aw, &moved));
    };
    let watchdog = async {
        let mut seen = u64::MAX;
        loop {
            tokio::time::sleep(idle).await;
            let now = moved.load(Ordering::Relaxed);
            if now == seen {
                return;
            }
            seen = now;
        }
    };
    tokio::select! {
        () = both => {}
        () = watchdog => {}
    }
}

async fn pump<R, W>(mut r: R, mut w: W, moved: &AtomicU64)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if w.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                moved.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(head: &str) -> Result<Request, Bad> {
        parse(head.as_bytes(), 8)
    }

    #[test]
    fn absolute_uris_become_origin_form_with_connection_close() {
        let r = p("GET http://Allowed.localhost:8080/a?b=1 HTTP/1.1\r\nHost: allowed.localhost:8080\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nX-A: 1\r\n\r\n").unwrap();
        assert!(!r.connect);
        assert_eq!((r.host.as_str(), r.port), ("allowed.localhost", 8080));
        assert_eq!(
            String::from_utf8(r.upstream_head(&r.host_header)).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: allowed.localhost:8080\r\nX-A: 1\r\nConnection: close\r\n\r\n"
        );
        let r = p("GET http://h.example HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(
            String::from_utf8(r.upstream_head(&r.host_header)).unwrap(),
            "GET / HTTP/1.0\r\nHost: h.example\r\nConnection: close\r\n\r\n"
        );
        let r = p("CONNECT [::1]:443 HTTP/1.1\r\n\r\n").unwrap();
        assert!(r.connect);
        assert_eq!((r.host.as_str(), r.port), ("::1", 443));
    }

    #[test]
    fn lying_or_malformed_requests_are_bad_requests() {
        for (head, status, says) in [
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n",
                400,
                "does not name the host",
            ),
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: a.example:81\r\n\r\n",
                400,
                "does not name the host",
            ),
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
                400,
                "more than one Host",
            ),
            (
                "CONNECT a.example:443 HTTP/1.1\r\nHost: b.example:443\r\n\r\n",
                400,
                "does not name the host",
            ),
            ("CONNECT a.example HTTP/1.1\r\n\r\n", 400, "has no port"),
            ("CONNECT a.example:0 HTTP/1.1\r\n\r\n", 400, "has no port"),
            ("CONNECT a.example:x HTTP/1.1\r\n\r\n", 400, "a bad port"),
            (
                "GET /relative HTTP/1.1\r\nHost: a.example\r\n\r\n",
                400,
                "not an absolute http:// URL",
            ),
            (
                "GET https://a.example/ HTTP/1.1\r\n\r\n",
                400,
                "use CONNECT",
            ),
            (
                "GET http://user@a.example/ HTTP/1.1\r\n\r\n",
                400,
                "user information",
            ),
            ("GET http:///x HTTP/1.1\r\n\r\n", 400, "names no host"),
            ("\x00\x01garbage\r\n\r\n", 400, "malformed"),
            (
                "GET http://a.example/ HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: 1\r\nH: 1\r\nI: 1\r\n\r\n",
                431,
                "more than 8 headers",
            ),
        ] {
            match p(head) {
                Ok(_) => panic!("{head:?} parsed"),
                Err((s, _, m)) => {
                    assert_eq!(s, status, "{head:?}: {m}");
                    assert!(m.contains(says), "{head:?}: {m}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics_the_parser(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let _ = parse(&bytes, 16);
        }

        #[test]
        fn garbage_targets_never_panic_the_policy(target in "\\PC{0,80}", port in 0u16..) {
            let plan = EgressPlan { allow: vec!["*.example.org".into(), "10.0.0.1".into()], ..EgressPlan::default() };
            let _ = plan.route(&target, port);
            let _ = super::super::EgressRule::parse(&target);
            let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
            let _ = parse(head.as_bytes(), 16);
        }
    }

    /// A plain HTTP server on loopback that answers with the request line.
    fn upstream() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for conn in l.incoming() {
                let Ok(mut s) = conn else { continue };
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let host = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Host: "))
                    .unwrap_or("-");
                let body = format!("{} (Host {host})", text.lines().next().unwrap_or_default());
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        port
    }

    fn socket_dir() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        std::env::temp_dir().join(format!(
            "plugd-egress-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn start(plan: EgressPlan, limits: ProxyLimits) -> EgressProxy {
        let plan = EgressPlan {
            socket_dir: Some(socket_dir()),
            config_key: "sandbox.plugins.p.egress_allow".into(),
            ..plan
        };
        EgressProxy::start("p", &plan, limits).unwrap()
    }

    async fn exchange(proxy: &EgressProxy, data: &[u8]) -> String {
        let mut s = UnixStream::connect(proxy.socket()).await.unwrap();
        s.write_all(data).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn the_gateway_route_reaches_plugds_listener_and_nothing_else() {
        let port = upstream();
        let plan = EgressPlan {
            gateway: Some(SocketAddr::from(([127, 0, 0, 1], port))),
            ..EgressPlan::default()
        };
        let proxy = start(plan, ProxyLimits::default());
        let got = exchange(
            &proxy,
            b"GET http://plugd.internal/v1/sessions?x=1 HTTP/1.1\r\nHost: plugd.internal\r\n\r\n",
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        // Asked for by its own address: plugd's listener checks Host.
        assert!(
            got.ends_with(&format!(
                "GET /v1/sessions?x=1 HTTP/1.1 (Host 127.0.0.1:{port})"
            )),
            "{got}"
        );
        // By its own address and port (the `base_url` plugd gives plugins):
        // the gateway route too.
        let got = exchange(
            &proxy,
            format!(
                "GET http://127.0.0.1:{port}/v1/runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        // The same server under its loopback name, or that address on
        // another port: refused.
        for target in [
            format!("http://allowed.localhost:{port}/"),
            format!("http://127.0.0.1:{}/", port.wrapping_add(1)),
        ] {
            let got = exchange(&proxy, format!("GET {target} HTTP/1.1\r\n\r\n").as_bytes()).await;
            assert!(got.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{got}");
            assert!(
                got.contains("allow it with sandbox.plugins.p.egress_allow in plugd.yaml"),
                "{got}"
            );
        }
        // The gateway name on another port is not the gateway.
        let got = exchange(
            &proxy,
            format!("CONNECT plugd.internal:{port} HTTP/1.1\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            got.contains("plugd.internal is reachable on port 80 only"),
            "{got}"
        );
        let socket = proxy.socket().to_path_buf();
        assert!(socket.exists());
        drop(proxy);
        assert!(!socket.exists(), "the socket outlives its proxy");
    }

    #[tokio::test]
    async fn a_listed_name_that_resolves_to_loopback_is_refused() {
        // glibc resolves these spellings of 127.0.0.1 as names (inet_aton):
        // a listed name must not lead to plugd's own loopback listeners.
        let port = upstream();
        let plan = EgressPlan {
            allow: vec!["0x7f.0.0.1".into(), "2130706433".into()],
            ..EgressPlan::default()
        };
        let proxy = start(plan, ProxyLimits::default());
        for name in ["0x7f.0.0.1", "2130706433"] {
            let got = exchange(
                &proxy,
                format!("GET http://{name}:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert!(got.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{got}");
            assert!(
                got.contains("it resolves only to internal addresses (127.0.0.1)"),
                "{got}"
            );
        }
        // Listing the address itself is the operator's way to allow it.
        let plan = EgressPlan {
            allow: vec!["2130706433".into(), "127.0.0.1".into()],
            ..EgressPlan::default()
        };
        let proxy = start(plan, ProxyLimits::default());
        let got = exchange(
            &proxy,
            format!("GET http://2130706433:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_answered_503() {
        let limits = ProxyLimits {
            max_connections: 2,
            head_timeout: Duration::from_secs(600),
            ..ProxyLimits::default()
        };
        let proxy = start(EgressPlan::default(), limits);
        // Two silent connections hold both slots.
        let _a = UnixStream::connect(proxy.socket()).await.unwrap();
        let _b = UnixStream::connect(proxy.socket()).await.unwrap();
        let got = exchange(&proxy, b"").await;
        assert!(
            got.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{got}"
        );
        assert!(got.contains("has 2 connections open already"), "{got}");
    }

    #[tokio::test]
    async fn a_silent_client_gets_408_and_an_idle_tunnel_is_closed() {
        let limits = ProxyLimits {
            head_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(100),
            ..ProxyLimits::default()
        };
        // Half a request head, then nothing.
        let proxy = start(EgressPlan::default(), limits);
        let mut s = UnixStream::connect(proxy.socket()).await.unwrap();
        s.write_all(b"GET http://a.example/ HTTP/1.1\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{out}");
        // A tunnel to a server that never speaks: closed once idle.
        let quiet = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = quiet.local_addr().unwrap().port();
        let plan = EgressPlan {
            allow: vec!["quiet.localhost".into()],
            ..EgressPlan::default()
        };
        let proxy = start(plan, limits);
        let mut s = UnixStream::connect(proxy.socket()).await.unwrap();
        s.write_all(format!("CONNECT quiet.localhost:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "HTTP/1.1 200 Connection Established\r\n\r\n");
        drop(quiet);
    }
}
