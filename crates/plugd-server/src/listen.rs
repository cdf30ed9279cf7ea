//! serve's listeners: the Unix socket `.plugd/serve.sock` (peer uid checked
//! by [`crate::auth`]) and the optional TCP `--listen`, each with header,
//! body and send timeouts and a cap on concurrent connections.
//!
//! Each accepted connection gets its [`Peer`] (taken from the kernel at
//! accept time: `SO_PEERCRED` for the socket) as a request extension, runs
//! HTTP/1.1 through hyper with `header_read_timeout` (which also bounds how
//! long a keep-alive connection may sit idle), and its stream is wrapped so
//! that a write the client does not drain for `send_timeout` fails the
//! connection. A connection beyond `max_connections` gets a `503` and is
//! closed at once, so slow or idle clients cannot exhaust serve.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Sleep;
use tower::ServiceExt;

use crate::auth::Peer;

/// The socket's file name under the workspace's `.plugd/`.
pub const SOCKET_FILE: &str = "serve.sock";

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
}

impl Limits {
    /// From plugd.yaml's `http:` section.
    pub fn from_config(c: &plugd_runtime::config::HttpConfig) -> Limits {
        Limits {
            header_timeout: Duration::from_secs(c.header_timeout_secs),
            send_timeout: Duration::from_secs(c.send_timeout_secs),
            max_connections: c.max_connections.max(1),
        }
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

/// Answers a connection over the cap with `503` and closes it.
async fn refuse_busy<S: AsyncWrite + Unpin>(mut stream: S, max: usize) {
    let body = serde_json::json!({"error": {
        "code": crate::error::code::TOO_MANY_CONNECTIONS,
        "message": format!("plugd serve already has {max} open connections (http.max_connections); retry later"),
    }})
    .to_string();
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(resp.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Runs one connection to its end (or to a graceful close on shutdown).
async fn serve_connection<S>(
    stream: S,
    peer: Peer,
    app: Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stop = shutdown.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        let call = app.clone().oneshot(req.map(Body::new));
        let mut stop = stop.clone();
        // In flight at shutdown: its own answer within DRAIN, else a 503
        // (never a connection closed without an answer).
        async move {
            tokio::select! {
                r = call => r,
                _ = async {
                    if stop.wait_for(|s| *s).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(DRAIN).await;
                } => Ok(shutting_down()),
            }
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
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!("connection closed: {e}");
            }
        }
        _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN + CLOSE, conn).await;
        }
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

/// Accepts on `listener` until `shutdown` turns true, serving `app` with
/// `limits`; then waits (up to 5 s) for open connections to finish.
pub async fn run(
    listener: Listener,
    app: Router,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(
                ?peer,
                max = limits.max_connections,
                "too many connections; refused one"
            );
            tokio::spawn(async move {
                match conn {
                    Conn::Unix(s) => refuse_busy(s, limits.max_connections).await,
                    Conn::Tcp(s) => refuse_busy(s, limits.max_connections).await,
                }
            });
            continue;
        };
        let app = app.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            match conn {
                Conn::Unix(s) => serve_connection(s, peer, app, limits, shutdown).await,
                Conn::Tcp(s) => serve_connection(s, peer, app, limits, shutdown).await,
            }
            drop(permit);
        });
    }
    // Wait for the connections to drain (each closes itself within DRAIN).
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(DRAIN + CLOSE + CLOSE, slots.acquire_many(all)).await;
    Ok(())
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
