//! serve's listeners: the Unix socket `.plugd/serve.sock` (peer uid checked
//! by [`crate::auth`], plugin processes refused here) and the optional TCP
//! `--listen` (and the delegation listener), each with header, body and
//! send timeouts and caps on connections.
//!
//! Each accepted connection gets its [`Peer`] (taken from the kernel at
//! accept time: `SO_PEERCRED` for the socket) and its [`ConnAuth`] as
//! request extensions, runs HTTP/1.1 through hyper with
//! `header_read_timeout` (which also bounds how long a keep-alive
//! connection may sit idle), and its stream is wrapped so that a write the
//! client does not drain for `send_timeout` fails the connection.
//!
//! **The socket's peer check.** Before anything a socket peer sends is
//! read, its process is looked up ([`plugd_host::procs::plugin_of`]: plugin
//! cgroup, else ancestry through `/proc`): a plugin's process, or a
//! descendant of one (double-forked, `setsid` or not), whatever its uid,
//! gets `403` naming the plugin and is closed; so does a peer whose
//! process cannot be looked up (fails closed). Plugins reach plugd's API
//! through delegated tokens only. Limits: a process started outside plugd's
//! process tree and cgroups (handed to another daemon: `systemd-run`, `at`,
//! a container engine) is not recognised; the first layer is the mount
//! namespace in which plugins do not see the socket at all.
//!
//! **Caps.** Per listener at most `max_connections` open connections, at
//! most `max_connections_per_peer` of them from one peer (a uid on the
//! socket, an address on TCP), and at most `max_unauthenticated` TCP
//! connections that have not yet shown valid credentials. A connection
//! leaves that pool once a request on it authenticated (the auth
//! middleware calls [`ConnAuth::authenticated`]); one still in it after
//! `unauthenticated_timeout` is closed. When a cap is reached, the oldest
//! unauthenticated connection (idle ones first) is closed to admit the new
//! one, so nobody without a token can starve token holders. A connection
//! whose credentials are being checked (one store read, bounded by the
//! store's timeout; [`ConnAuth::verifying`]) is not closed for room, nor, by
//! the unauthenticated quota, one open for less than
//! [`UNAUTHENTICATED_GRACE`] (its first request may not have been read):
//! when only such connections fill the quota, the new one is admitted over
//! it (a burst of token holders must not evict itself); only when
//! authenticated connections fill a cap does a new one get `503` and is
//! closed. Refusals, evictions and time-outs are logged once and then as
//! one summary line per interval ([`plugd_host::throttle`]).
//!
//! Why one file: every listener (the Unix socket with its peer check, TCP)
//! goes through one accept loop with one set of limits and one shutdown; the
//! routes are elsewhere.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use plugd_host::throttle::Throttle;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::time::Sleep;
use tower::ServiceExt;

use crate::auth::Peer;

/// The socket's file name under the workspace's `.plugd/`.
pub const SOCKET_FILE: &str = plugd_runtime::serve_record::SOCKET_FILE;

/// How long serve waits for open connections after a shutdown request:
/// a request in flight gets this long to finish, then is answered `503`
/// ([`shutting_down`]); its connection then closes within [`CLOSE`].
const DRAIN: Duration = Duration::from_secs(5);

/// How long a connection has, after [`DRAIN`], to write its last answers.
const CLOSE: Duration = Duration::from_secs(1);

/// The answer of a request still running when the shutdown grace ends.
fn shutting_down() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    crate::ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        crate::error::code::SHUTTING_DOWN,
        format!(
            "plugd serve is shutting down and this request did not finish within the {} s grace; retry it once serve is back",
            DRAIN.as_secs()
        ),
    )
    .into_response()
}

/// Connection limits of a listener (plugd.yaml `http:`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time to receive a request head (also the keep-alive idle limit).
    pub header_timeout: Duration,
    /// Time a response write may stay blocked.
    pub send_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections one peer (a uid on the socket, an address on TCP) may
    /// hold at once (at most `max_connections`).
    pub max_per_peer: usize,
    /// TCP connections that have not shown valid credentials yet, at once
    /// (kept below `max_connections`); `None`: every connection counts as
    /// authenticated (a server without the auth middleware).
    pub max_unauthenticated: Option<usize>,
    /// How long a TCP connection may stay without valid credentials.
    pub unauthenticated_timeout: Duration,
    /// How young a connection is spared by the unauthenticated quota
    /// ([`UNAUTHENTICATED_GRACE`]).
    pub unauthenticated_grace: Duration,
}

impl Limits {
    /// From plugd.yaml's `http:` section.
    pub fn from_config(c: &plugd_runtime::config::HttpConfig) -> Limits {
        Limits {
            header_timeout: Duration::from_secs(c.header_timeout_secs),
            send_timeout: Duration::from_secs(c.send_timeout_secs),
            max_connections: c.max_connections.max(1),
            max_per_peer: c.max_connections_per_peer.max(1),
            max_unauthenticated: Some(c.max_unauthenticated.max(1)),
            unauthenticated_timeout: Duration::from_secs(c.unauthenticated_timeout_secs.max(1)),
            unauthenticated_grace: UNAUTHENTICATED_GRACE,
        }
    }

    /// For a server that authenticates nobody (the bench's floor): no pool
    /// of unauthenticated connections, no time limit for them.
    pub fn without_auth_quota(self) -> Limits {
        Limits {
            max_unauthenticated: None,
            ..self
        }
    }

    /// The per-peer cap in effect.
    fn per_peer(&self) -> usize {
        self.max_per_peer.clamp(1, self.max_connections.max(1))
    }

    /// The unauthenticated quota in effect: below `max_connections`, so
    /// unauthenticated connections alone never fill the listener.
    fn unauthenticated_quota(&self) -> Option<usize> {
        self.max_unauthenticated
            .map(|q| q.min(self.max_connections.saturating_sub(1)).max(1))
    }
}

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// Another process answers on the socket.
    #[error(
        "{path} is in use by a running plugd serve; stop it first (or use its CLI commands, which reach it)"
    )]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// An OS error while preparing, binding or securing it.
    #[error("cannot listen on {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The Unix socket of a workspace: bound with mode 0600 inside a 0700
/// directory, removed on drop if it is still the one this process made.
#[derive(Debug)]
pub struct UnixSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
    ino: u64,
}

impl UnixSocket {
    /// Binds `state_dir/serve.sock`. A socket file nobody answers on (left
    /// by a killed serve) is replaced; one that answers is
    /// [`SocketError::InUse`].
    pub fn bind(state_dir: &Path) -> Result<UnixSocket, SocketError> {
        use std::os::unix::fs::MetadataExt;
        let path = state_dir.join(SOCKET_FILE);
        let io = |source| SocketError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(io(io::Error::other(
                        "a file that is not a socket is in the way; move it aside",
                    )));
                }
                if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                    return Err(SocketError::InUse { path });
                }
                std::fs::remove_file(&path).map_err(io)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        // Bind with a umask-independent mode: a socket is created with the
        // process umask applied, so narrow it first, then set 0600 exactly.
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
        let bound = UnixListener::bind(&path);
        rustix::process::umask(old);
        let listener = bound.map_err(io)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        let ino = std::fs::symlink_metadata(&path).map_err(io)?.ino();
        Ok(UnixSocket {
            listener: Some(listener),
            path,
            ino,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the listener to serve on (the file stays owned by `self`).
    pub fn take(&mut self) -> Option<UnixListener> {
        self.listener.take()
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        // Only the socket this process bound: a later serve may own the path.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A stream whose writes fail when the peer leaves them blocked for longer
/// than the send timeout.
struct Guarded<S> {
    inner: S,
    send_timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> Guarded<S> {
    fn new(inner: S, send_timeout: Duration) -> Self {
        Guarded {
            inner,
            send_timeout,
            stalled: None,
        }
    }

    /// After a pending write: arm the stall timer, or fail when it ran out.
    fn check_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let timeout = self.send_timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read the response in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.check_stall(cx).map(|r| r.map(|()| 0)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.check_stall(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Writes a canned JSON error response and closes the stream (1 s at most:
/// a refused client that does not read is not waited for). What the client
/// sent meanwhile is discarded unparsed (closing with unread input would
/// reset the connection and lose the answer).
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    status: &str,
    code: &str,
    message: &str,
) {
    let body = serde_json::json!({"error": {"code": code, "message": message}}).to_string();
    let retry = if status.starts_with("503") {
        "retry-after: 1\r\n"
    } else {
        ""
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{retry}connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(resp.as_bytes()).await;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        while left > 0 {
            match tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Who a connection counts against for the per-peer cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    /// A socket peer's uid.
    Uid(u32),
    /// A TCP peer's address (without the port).
    Addr(std::net::IpAddr),
}

impl PeerKey {
    fn of(peer: &Peer) -> PeerKey {
        match peer {
            Peer::Unix { uid, .. } => PeerKey::Uid(*uid),
            Peer::Tcp { remote, .. } => PeerKey::Addr(remote.ip().to_canonical()),
        }
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerKey::Uid(uid) => write!(f, "uid {uid}"),
            PeerKey::Addr(ip) => write!(f, "{ip}"),
        }
    }
}

/// How long a new connection may wait without credentials before the
/// unauthenticated quota may close it for room: a burst of clients connects
/// faster than their first requests are read, and one of them must not be
/// closed with its request unread. Over the quota meanwhile, new ones are
/// admitted (the connection caps still hold).
pub const UNAUTHENTICATED_GRACE: Duration = Duration::from_millis(250);

/// A connection's authentication state, shared between its task and the
/// requests on it (a request extension). The auth middleware calls
/// [`ConnAuth::authenticated`] once a request on the connection presented
/// valid credentials: from then on the connection is no longer in the
/// listener's pool of unauthenticated connections (so it is never closed to
/// make room, nor timed out as unauthenticated).
#[derive(Clone)]
pub struct ConnAuth(Arc<ConnInner>);

struct ConnInner {
    table: Arc<Table>,
    id: u64,
    peer: PeerKey,
    opened: tokio::time::Instant,
    /// A request on it authenticated (or it never needed to: a socket peer).
    authenticated: AtomicBool,
    /// Its counts were given back (closed, or evicted to make room).
    released: AtomicBool,
    /// Requests running on it now.
    busy: AtomicUsize,
    /// Requests on it whose credentials are being checked now.
    verifying: AtomicUsize,
    /// Told when it was evicted.
    evicted: tokio::sync::Notify,
}

impl std::fmt::Debug for ConnAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnAuth")
            .field("id", &self.0.id)
            .field("peer", &self.0.peer)
            .field("authenticated", &self.is_authenticated())
            .finish()
    }
}

impl ConnAuth {
    /// Marks the connection authenticated: it leaves the unauthenticated pool.
    pub fn authenticated(&self) {
        if !self.0.authenticated.swap(true, Ordering::AcqRel) {
            let mut st = self.0.table.lock();
            st.unauth.remove(&self.0.id);
        }
    }

    /// Whether a request on it authenticated.
    pub fn is_authenticated(&self) -> bool {
        self.0.authenticated.load(Ordering::Acquire)
    }

    /// Marks a request on it as having presented credentials that are
    /// being checked, until the guard drops: meanwhile the connection is
    /// not closed to make room for others.
    pub fn verifying(&self) -> Verifying {
        self.0.verifying.fetch_add(1, Ordering::AcqRel);
        Verifying(self.0.clone())
    }
}

/// See [`ConnAuth::verifying`].
pub struct Verifying(Arc<ConnInner>);

impl Drop for Verifying {
    fn drop(&mut self) {
        self.0.verifying.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Gives the connection's counts back when its task ends.
struct Slot(ConnAuth);

impl Drop for Slot {
    fn drop(&mut self) {
        let inner = &self.0.0;
        let mut st = inner.table.lock();
        st.release(inner);
        let empty = st.open == 0;
        drop(st);
        if empty {
            inner.table.drained.notify_waiters();
        }
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// `max_connections` authenticated connections are open.
    Full,
    /// Its peer holds `max_connections_per_peer` authenticated connections.
    PeerFull,
}

#[derive(Default)]
struct TableState {
    next_id: u64,
    open: usize,
    per_peer: HashMap<PeerKey, usize>,
    /// The unauthenticated connections, oldest first (ids grow).
    unauth: BTreeMap<u64, Arc<ConnInner>>,
}

impl TableState {
    /// Gives back what `conn` counts (once).
    fn release(&mut self, conn: &ConnInner) {
        if conn.released.swap(true, Ordering::AcqRel) {
            return;
        }
        self.open = self.open.saturating_sub(1);
        if let Some(n) = self.per_peer.get_mut(&conn.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_peer.remove(&conn.peer);
            }
        }
        self.unauth.remove(&conn.id);
    }

    /// The unauthenticated connection to close for room (of `peer` only,
    /// when given): the oldest idle one, else the oldest; never one whose
    /// credentials are being checked.
    fn victim(&self, peer: Option<PeerKey>) -> Option<Arc<ConnInner>> {
        self.victim_aged(peer, Duration::ZERO)
    }

    /// [`TableState::victim`] among the connections open for at least
    /// `grace` (one younger may not have been read yet).
    fn victim_aged(&self, peer: Option<PeerKey>, grace: Duration) -> Option<Arc<ConnInner>> {
        let mut mine = self
            .unauth
            .values()
            .filter(|c| peer.is_none_or(|p| c.peer == p))
            .filter(|c| c.verifying.load(Ordering::Acquire) == 0)
            .filter(|c| c.opened.elapsed() >= grace);
        let oldest = mine.clone().next().cloned();
        mine.find(|c| c.busy.load(Ordering::Acquire) == 0)
            .cloned()
            .or(oldest)
    }

    /// Closes `conn` to make room (its task sees the notification).
    fn evict(&mut self, conn: &Arc<ConnInner>) {
        self.release(conn);
        conn.evicted.notify_one();
    }
}

/// The open connections of one listener and its limits.
struct Table {
    limits: Limits,
    state: Mutex<TableState>,
    drained: tokio::sync::Notify,
    /// Refusals, evictions and timeouts: one line, then a summary per interval.
    warnings: Throttle,
}

impl Table {
    fn new(limits: Limits) -> Arc<Table> {
        let summary: plugd_host::throttle::Summary = Arc::new(|key, n, last| {
            tracing::warn!(
                "{key}: {} more in the last {} s (last: {last})",
                plugd_host::throttle::thousands(n),
                plugd_host::throttle::WARN_INTERVAL.as_secs()
            );
        });
        Arc::new(Table {
            limits,
            state: Mutex::default(),
            drained: tokio::sync::Notify::new(),
            warnings: Throttle::new(plugd_host::throttle::WARN_INTERVAL, summary),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs `line` in full the first time `key` happens in an interval,
    /// else counts it for the interval's summary.
    fn warn(&self, key: &str, line: &str) {
        if self.warnings.hit(key, line) {
            tracing::warn!("{line}");
        }
    }

    /// Admits a connection of `peer` (`unauthenticated`: it must still show
    /// credentials), closing unauthenticated ones to make room when a cap is
    /// reached; refuses it when only authenticated connections fill the cap.
    fn admit(self: &Arc<Self>, peer: PeerKey, unauthenticated: bool) -> Result<ConnAuth, Refusal> {
        let limits = self.limits;
        let mut st = self.lock();
        let mut evicted = Vec::new();
        if st.open >= limits.max_connections {
            let victim = st.victim(None).ok_or(Refusal::Full)?;
            st.evict(&victim);
            evicted.push(victim);
        }
        if st.per_peer.get(&peer).copied().unwrap_or(0) >= limits.per_peer() {
            let victim = st.victim(Some(peer)).ok_or(Refusal::PeerFull)?;
            st.evict(&victim);
            evicted.push(victim);
        }
        let quota = limits.unauthenticated_quota();
        if unauthenticated
            && let Some(quota) = quota
            && st.unauth.len() >= quota
            && let Some(victim) = st.victim_aged(None, limits.unauthenticated_grace)
        {
            st.evict(&victim);
            evicted.push(victim);
        }
        st.next_id += 1;
        let conn = Arc::new(ConnInner {
            table: self.clone(),
            id: st.next_id,
            peer,
            opened: tokio::time::Instant::now(),
            authenticated: AtomicBool::new(!unauthenticated || quota.is_none()),
            released: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            verifying: AtomicUsize::new(0),
            evicted: tokio::sync::Notify::new(),
        });
        st.open += 1;
        *st.per_peer.entry(peer).or_default() += 1;
        if !conn.authenticated.load(Ordering::Acquire) {
            st.unauth.insert(conn.id, conn.clone());
        }
        drop(st);
        for v in evicted {
            self.warn(
                "closed unauthenticated connections to admit new ones",
                &format!(
                    "closed an unauthenticated connection from {} (open {} ms, no valid credentials yet) to admit a new one: at most {} connections may wait without credentials (plugd.yaml http.max_unauthenticated)",
                    v.peer,
                    v.opened.elapsed().as_millis(),
                    quota.unwrap_or(limits.max_connections)
                ),
            );
        }
        Ok(ConnAuth(conn))
    }

    /// Waits until every connection closed (or `limit` passes).
    async fn drain(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let notified = self.drained.notified();
                if self.lock().open == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }
}

/// Runs one connection to its end (or to a graceful close on shutdown, or
/// to its eviction, or to its unauthenticated time running out).
async fn serve_connection<S>(
    stream: S,
    peer: Peer,
    app: Router,
    limits: Limits,
    auth: ConnAuth,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ext = auth.clone();
    let stop = shutdown.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        req.extensions_mut().insert(ext.clone());
        let busy = Busy::start(&ext);
        let call = app.clone().oneshot(req.map(Body::new));
        let mut stop = stop.clone();
        // In flight at shutdown: its own answer within DRAIN, else a 503
        // (never a connection closed without an answer).
        async move {
            let r = tokio::select! {
                r = call => r,
                _ = async {
                    if stop.wait_for(|s| *s).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(DRAIN).await;
                } => Ok(shutting_down()),
            };
            drop(busy);
            r
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(64 * 1024);
    let io = TokioIo::new(Guarded::new(stream, limits.send_timeout));
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let inner = auth.0.clone();
    let timed_out = async {
        tokio::time::sleep(limits.unauthenticated_timeout).await;
        if auth.is_authenticated() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!("connection closed: {e}");
            }
        }
        () = inner.evicted.notified() => {}
        () = timed_out => {
            inner.table.warn(
                "closed unauthenticated connections that timed out",
                &format!(
                    "closed a connection from {} that showed no valid credentials within {} s (plugd.yaml http.unauthenticated_timeout_secs)",
                    inner.peer,
                    limits.unauthenticated_timeout.as_secs()
                ),
            );
        }
        _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN + CLOSE, conn).await;
        }
    }
}

/// Counts a request running on a connection (an evicted connection is the
/// oldest idle one when there is one).
struct Busy(ConnAuth);

impl Busy {
    fn start(c: &ConnAuth) -> Busy {
        c.0.busy.fetch_add(1, Ordering::AcqRel);
        Busy(c.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A listener serve accepts on.
#[derive(Debug)]
pub enum Listener {
    /// The workspace socket.
    Unix(UnixListener),
    /// `--listen`.
    Tcp(TcpListener),
}

fn unix_peer(stream: &UnixStream) -> io::Result<Peer> {
    let cred = stream.peer_cred()?;
    Ok(Peer::Unix {
        uid: cred.uid(),
        pid: cred.pid(),
    })
}

/// The socket's peer check: a process of a plugin (or a descendant of one)
/// is refused before anything it sends is read; so is a peer whose process
/// cannot be looked up (fails closed). `Ok` for any other peer.
fn check_socket_peer(pid: Option<i32>) -> Result<(), (String, String, String)> {
    let Some(pid) = pid else {
        return Err((
            "refused socket peers without a pid".to_owned(),
            "refused a socket peer whose pid the kernel did not give; plugd cannot tell whether it is a plugin's process".to_owned(),
            "plugd cannot tell whether this process is a plugin's (no peer pid), so it may not use plugd's socket".to_owned(),
        ));
    };
    match plugd_host::procs::plugin_of(pid) {
        Ok(None) => Ok(()),
        Ok(Some(found)) => {
            let who = found
                .plugin
                .as_deref()
                .map_or_else(|| "an unknown plugin".to_owned(), |p| format!("plugin {p}"));
            Err((
                format!("refused socket connections from {who}'s processes"),
                format!(
                    "refused a connection to plugd's socket from {who}'s process (pid {pid}, {}): plugins reach plugd's API through delegated tokens only",
                    found.how
                ),
                format!(
                    "{who}'s process may not use plugd's socket; plugins reach plugd's API through delegated tokens"
                ),
            ))
        }
        Err(e) => Err((
            "refused socket peers that could not be looked up".to_owned(),
            format!(
                "refused a connection to plugd's socket from pid {pid}: {e}; plugd cannot tell whether it is a plugin's process, so it fails closed"
            ),
            format!(
                "plugd cannot tell whether process {pid} is a plugin's ({e}), so it may not use plugd's socket"
            ),
        )),
    }
}

/// Accepts on `listener` until `shutdown` turns true, serving `app` with
/// `limits`; then waits (up to 5 s) for open connections to finish.
pub async fn run(
    listener: Listener,
    app: Router,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let table = Table::new(limits);
    let mut stop = shutdown.clone();
    loop {
        let accepted = tokio::select! {
            a = accept(&listener) => a,
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => break,
        };
        let (conn, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let app = app.clone();
        let shutdown = shutdown.clone();
        let table = table.clone();
        tokio::spawn(async move {
            match conn {
                Conn::Unix(s) => {
                    if let Peer::Unix { pid, .. } = &peer
                        && let Err((key, line, message)) = check_socket_peer(*pid)
                    {
                        table.warn(&key, &line);
                        refuse(s, "403 Forbidden", crate::error::code::FORBIDDEN, &message).await;
                        return;
                    }
                    if let Some(auth) = admit(&table, &peer, false) {
                        let _slot = Slot(auth.clone());
                        serve_connection(s, peer, app, limits, auth, shutdown).await;
                    } else {
                        refuse_busy(s, &table, &peer).await;
                    }
                }
                Conn::Tcp(s) => {
                    if let Some(auth) = admit(&table, &peer, true) {
                        let _slot = Slot(auth.clone());
                        serve_connection(s, peer, app, limits, auth, shutdown).await;
                    } else {
                        refuse_busy(s, &table, &peer).await;
                    }
                }
            }
        });
    }
    // Wait for the connections to drain (each closes itself within DRAIN).
    table.drain(DRAIN + CLOSE + CLOSE).await;
    Ok(())
}

/// [`Table::admit`], logging (throttled) a refusal; `None` when refused.
fn admit(table: &Arc<Table>, peer: &Peer, unauthenticated: bool) -> Option<ConnAuth> {
    let key = PeerKey::of(peer);
    match table.admit(key, unauthenticated) {
        Ok(auth) => Some(auth),
        Err(why) => {
            let limits = table.limits;
            let (k, line) = match why {
                Refusal::Full => (
                    "refused connections over http.max_connections".to_owned(),
                    format!(
                        "refused a connection from {key}: {} connections are open (plugd.yaml http.max_connections)",
                        limits.max_connections
                    ),
                ),
                Refusal::PeerFull => (
                    format!("refused connections from {key} over http.max_connections_per_peer"),
                    format!(
                        "refused a connection from {key}: it holds {} connections already (plugd.yaml http.max_connections_per_peer)",
                        limits.per_peer()
                    ),
                ),
            };
            table.warn(&k, &line);
            None
        }
    }
}

/// Answers a connection over a cap with `503` and closes it.
async fn refuse_busy<S: AsyncRead + AsyncWrite + Unpin>(stream: S, table: &Table, peer: &Peer) {
    let limits = table.limits;
    let key = PeerKey::of(peer);
    let per_peer = table.lock().per_peer.get(&key).copied().unwrap_or(0);
    let message = if per_peer >= limits.per_peer() {
        format!(
            "{key} already holds {} open connections to plugd serve (http.max_connections_per_peer); close some or retry later",
            limits.per_peer()
        )
    } else {
        format!(
            "plugd serve already has {} open connections (http.max_connections); retry later",
            limits.max_connections
        )
    };
    refuse(
        stream,
        "503 Service Unavailable",
        crate::error::code::TOO_MANY_CONNECTIONS,
        &message,
    )
    .await;
}

enum Conn {
    Unix(UnixStream),
    Tcp(tokio::net::TcpStream),
}

async fn accept(listener: &Listener) -> io::Result<(Conn, Peer)> {
    match listener {
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            // A peer whose credentials cannot be read is refused, never trusted.
            let peer = unix_peer(&s)?;
            Ok((Conn::Unix(s), peer))
        }
        Listener::Tcp(l) => {
            let (s, remote) = l.accept().await?;
            let local = s.local_addr()?;
            let _ = s.set_nodelay(true);
            Ok((Conn::Tcp(s), Peer::Tcp { remote, local }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_the_peer_never_drains_fails_after_the_send_timeout() {
        // A 64-byte pipe whose far end never reads.
        let (near, _far) = tokio::io::duplex(64);
        let mut g = Guarded::new(near, Duration::from_millis(200));
        let started = tokio::time::Instant::now();
        let err = g.write_all(&[0u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_reader_that_keeps_up_is_never_timed_out() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut g = Guarded::new(near, Duration::from_millis(100));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 16];
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                match tokio::io::AsyncReadExt::read(&mut far, &mut buf).await {
                    Ok(0) | Err(_) => break got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        // 4 KiB in 16-byte reads every 5 ms takes far longer than 100 ms in
        // all, but no single write waits that long.
        g.write_all(&[7u8; 4096]).await.unwrap();
        g.shutdown().await.unwrap();
        drop(g);
        assert_eq!(reader.await.unwrap().len(), 4096);
    }

    fn limits(max: usize, per_peer: usize, unauth: usize) -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(10),
            max_connections: max,
            max_per_peer: per_peer,
            max_unauthenticated: Some(unauth),
            unauthenticated_timeout: Duration::from_secs(5),
            unauthenticated_grace: Duration::ZERO,
        }
    }

    const A: PeerKey = PeerKey::Addr(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    const B: PeerKey = PeerKey::Addr(std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2)));

    #[tokio::test]
    async fn unauthenticated_connections_make_room_and_never_starve_authenticated_ones() {
        let table = Table::new(limits(10, 10, 3));
        // Five connections without credentials: the pool keeps the newest three.
        let idle: Vec<ConnAuth> = (0..5).map(|_| table.admit(A, true).unwrap()).collect();
        assert_eq!(table.lock().open, 3);
        assert_eq!(table.lock().unauth.len(), 3);
        let evicted: Vec<bool> = idle
            .iter()
            .map(|c| c.0.released.load(Ordering::Acquire))
            .collect();
        assert_eq!(evicted, [true, true, false, false, false], "oldest first");
        // A busy one is spared while an idle one is left.
        idle[2].0.busy.fetch_add(1, Ordering::AcqRel);
        // One authenticates: it leaves the pool and is never evicted.
        let token_holder = table.admit(A, true).unwrap();
        assert!(
            idle[3].0.released.load(Ordering::Acquire),
            "the oldest idle one"
        );
        assert!(!idle[2].0.released.load(Ordering::Acquire), "busy: spared");
        token_holder.authenticated();
        for _ in 0..50 {
            table.admit(A, true).unwrap();
        }
        assert!(!token_holder.0.released.load(Ordering::Acquire));
        assert_eq!(table.lock().unauth.len(), 3);
        assert_eq!(table.lock().open, 4);
        // Closing gives its counts back once.
        drop(Slot(token_holder.clone()));
        drop(Slot(token_holder));
        assert_eq!(table.lock().open, 3);
    }

    #[tokio::test]
    async fn connections_whose_credentials_are_being_checked_are_never_closed_for_room() {
        let table = Table::new(limits(10, 10, 3));
        let pool: Vec<ConnAuth> = (0..3).map(|_| table.admit(A, true).unwrap()).collect();
        let checks: Vec<Verifying> = pool.iter().map(ConnAuth::verifying).collect();
        // Every pooled one is being checked: the new one is admitted over
        // the quota, nobody is closed.
        let late = table.admit(A, true).unwrap();
        assert!(pool.iter().all(|c| !c.0.released.load(Ordering::Acquire)));
        assert_eq!(table.lock().unauth.len(), 4);
        // A check ended without credentials: that one may go again, the
        // oldest first.
        drop(checks);
        let _next = table.admit(A, true).unwrap();
        assert!(pool[0].0.released.load(Ordering::Acquire));
        assert!(!late.0.released.load(Ordering::Acquire));
        // The connection cap still holds: a full listener of connections
        // being checked refuses the next one rather than closing one.
        let table = Table::new(limits(2, 2, 32));
        let first = table.admit(A, true).unwrap();
        let _first_check = first.verifying();
        let second = table.admit(A, true).unwrap();
        let _second_check = second.verifying();
        assert_eq!(table.lock().open, 2);
        assert_eq!(table.admit(B, true).unwrap_err(), Refusal::Full);
        assert!(!first.0.released.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn a_burst_of_new_connections_is_admitted_over_the_quota_not_closed() {
        let mut l = limits(10, 10, 3);
        l.unauthenticated_grace = Duration::from_secs(3600);
        let table = Table::new(l);
        // Six at once, none read yet: all admitted, none closed.
        let burst: Vec<ConnAuth> = (0..6).map(|_| table.admit(A, true).unwrap()).collect();
        assert!(burst.iter().all(|c| !c.0.released.load(Ordering::Acquire)));
        assert_eq!(table.lock().unauth.len(), 6);
        // The connection cap still holds.
        let more: Vec<ConnAuth> = (0..4).map(|_| table.admit(A, true).unwrap()).collect();
        assert_eq!(table.lock().open, 10);
        assert!(
            table.admit(A, true).is_ok(),
            "the cap closes the oldest idle one"
        );
        assert!(burst[0].0.released.load(Ordering::Acquire));
        drop(more);
    }

    #[tokio::test]
    async fn only_authenticated_connections_make_a_cap_refuse() {
        // The quota stays below the cap: unauthenticated ones never fill it.
        let table = Table::new(limits(3, 3, 32));
        assert_eq!(table.limits.unauthenticated_quota(), Some(2));
        for _ in 0..10 {
            table.admit(A, true).unwrap();
        }
        assert_eq!(table.lock().open, 2);
        let held: Vec<ConnAuth> = (0..3)
            .map(|_| {
                let c = table.admit(A, true).unwrap();
                c.authenticated();
                c
            })
            .collect();
        assert_eq!(table.lock().open, 3, "the unauthenticated ones made room");
        assert_eq!(table.admit(A, true).unwrap_err(), Refusal::Full);
        drop(Slot(held[0].clone()));
        assert!(table.admit(A, true).is_ok());
        // Per peer: two authenticated connections of A fill A's cap, not B's.
        let table = Table::new(limits(10, 2, 5));
        for _ in 0..2 {
            table.admit(A, true).unwrap().authenticated();
        }
        assert_eq!(table.admit(A, true).unwrap_err(), Refusal::PeerFull);
        assert!(table.admit(B, true).is_ok());
        // A socket peer is authenticated by its credentials at accept.
        let uid = PeerKey::Uid(1000);
        let c = table.admit(uid, false).unwrap();
        assert!(c.is_authenticated());
        assert!(!table.lock().unauth.contains_key(&c.0.id));
    }

    /// A one-route app on `listener` with `limits`; the stop sender.
    fn serve_app(listener: Listener, limits: Limits) -> watch::Sender<bool> {
        let app = Router::new().route(
            "/who",
            axum::routing::get(|req: axum::extract::Request| async move {
                if let Some(c) = req.extensions().get::<ConnAuth>() {
                    c.authenticated();
                }
                "ok"
            }),
        );
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(run(listener, app, limits, stopped));
        stop
    }

    #[tokio::test]
    async fn a_child_process_of_plugd_is_refused_on_the_socket_before_its_request_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut socket = UnixSocket::bind(&dir.path().join(".plugd")).unwrap();
        let path = socket.path().to_owned();
        let _stop = serve_app(Listener::Unix(socket.take().unwrap()), limits(8, 8, 4));
        // This process itself is not a plugin: served.
        let mut s = UnixStream::connect(&path).await.unwrap();
        s.write_all(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut answer)
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // A child of this process (what a plugin of plugd is) is refused
        // without sending anything.
        let script = format!(
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); print(s.makefile().read())",
            path.display().to_string()
        );
        #[allow(clippy::disallowed_methods)] // a test's own child
        let out = tokio::process::Command::new("python3")
            .args(["-c", &script])
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("HTTP/1.1 403"), "{text}");
        assert!(text.contains("may not use plugd's socket"), "{text}");
    }

    #[tokio::test]
    async fn idle_connections_without_credentials_are_closed_early() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut l = limits(8, 8, 4);
        l.unauthenticated_timeout = Duration::from_millis(300);
        let _stop = serve_app(Listener::Tcp(tcp), l);
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(
            Duration::from_secs(3),
            tokio::io::AsyncReadExt::read(&mut idle, &mut buf),
        )
        .await
        .expect("closed within the unauthenticated timeout")
        .unwrap_or(0);
        assert_eq!(n, 0);
        // One that authenticated stays past it (keep-alive).
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut got = vec![0u8; 256];
        let n = tokio::io::AsyncReadExt::read(&mut s, &mut got)
            .await
            .unwrap();
        assert!(got[..n].starts_with(b"HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(700)).await;
        s.write_all(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut rest = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut rest)
            .await
            .unwrap();
        assert!(rest.starts_with("HTTP/1.1 200"), "{rest}");
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join(".plugd");
        let first = UnixSocket::bind(&state).unwrap();
        let path = first.path().to_owned();
        assert!(matches!(
            UnixSocket::bind(&state),
            Err(SocketError::InUse { .. })
        ));
        drop(first);
        assert!(!path.exists(), "the owner removes its socket");
        // A socket file nobody listens on (a killed serve's) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let second = UnixSocket::bind(&state).unwrap();
        let meta = std::fs::metadata(second.path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // A file that is not a socket is never removed.
        drop(second);
        std::fs::write(&path, "keep me").unwrap();
        assert!(UnixSocket::bind(&state).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
    }
}
