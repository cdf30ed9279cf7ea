//! The stdio transport (`plugd mcp`): newline-delimited JSON-RPC on a
//! reader and a writer, as MCP clients spawn a server. Requests run
//! concurrently; responses and notifications go out through one writer
//! task, a line each. Lines over the frame limit are skipped without being
//! buffered and answered with an error. When stdin ends, calls in flight
//! get [`EOF_GRACE`] to finish before they are cancelled.
//!
//! [`process_stdio`] gives the process's own stdin and stdout as
//! non-blocking streams when they are pipes or sockets (what an MCP client
//! spawning `plugd mcp` passes): read and written on the runtime's own
//! event loop, not through tokio's blocking-thread `Stdin`/`Stdout`, which
//! cost a thread hand-off for every read and flush.

use futures_util::StreamExt;
use plugd_wire::framing::{DEFAULT_MAX_FRAME, Frame, FrameDecoder, Framing};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::FramedRead;

use crate::session::{code, error, respond};
use crate::{Session, Sink};

/// A readable end of the process's stdin.
pub type Input = Box<dyn AsyncRead + Unpin + Send>;
/// A writable end of the process's stdout.
pub type Output = Box<dyn AsyncWrite + Unpin + Send>;

/// The process's stdin and stdout as async streams: a pipe or a socket is
/// put in non-blocking mode and polled by the runtime's reactor; anything
/// else (a terminal, a file) goes through tokio's blocking `Stdin`/`Stdout`.
/// The original descriptors stay open (duplicates are registered), so
/// nothing else can take descriptor 0 or 1.
pub fn process_stdio() -> (Input, Output) {
    use std::os::fd::AsFd;
    let input: Input = match reactor_stream(std::io::stdin().as_fd(), true) {
        Some(Ok(Reactor::Pipe(PipeEnd::Read(r)))) => Box::new(r),
        Some(Ok(Reactor::Socket(s))) => Box::new(s),
        Some(Err(e)) => {
            tracing::debug!("stdin stays blocking: {e}");
            Box::new(tokio::io::stdin())
        }
        _ => Box::new(tokio::io::stdin()),
    };
    let output: Output = match reactor_stream(std::io::stdout().as_fd(), false) {
        Some(Ok(Reactor::Pipe(PipeEnd::Write(w)))) => Box::new(w),
        Some(Ok(Reactor::Socket(s))) => Box::new(s),
        Some(Err(e)) => {
            tracing::debug!("stdout stays blocking: {e}");
            Box::new(tokio::io::stdout())
        }
        _ => Box::new(tokio::io::stdout()),
    };
    (input, output)
}

enum PipeEnd {
    Read(tokio::net::unix::pipe::Receiver),
    Write(tokio::net::unix::pipe::Sender),
}

enum Reactor {
    Pipe(PipeEnd),
    Socket(tokio::net::UnixStream),
}

/// `fd` registered with the reactor when it is a FIFO or a Unix socket;
/// `None` for anything else.
fn reactor_stream(fd: std::os::fd::BorrowedFd<'_>, read: bool) -> Option<std::io::Result<Reactor>> {
    use std::os::unix::fs::FileTypeExt;
    let dup = match fd.try_clone_to_owned() {
        Ok(d) => d,
        Err(e) => return Some(Err(e)),
    };
    let file = std::fs::File::from(dup);
    let kind = match file.metadata() {
        Ok(m) => m.file_type(),
        Err(e) => return Some(Err(e)),
    };
    if kind.is_fifo() {
        Some(if read {
            tokio::net::unix::pipe::Receiver::from_file(file)
                .map(|r| Reactor::Pipe(PipeEnd::Read(r)))
        } else {
            tokio::net::unix::pipe::Sender::from_file(file)
                .map(|w| Reactor::Pipe(PipeEnd::Write(w)))
        })
    } else if kind.is_socket() {
        let s = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(file));
        // A TCP socket (inetd style) is not a Unix one: left blocking.
        s.local_addr().ok()?;
        Some(
            s.set_nonblocking(true)
                .and_then(|()| tokio::net::UnixStream::from_std(s))
                .map(Reactor::Socket),
        )
    } else {
        None
    }
}

/// How long calls in flight may finish once stdin closed.
pub const EOF_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `session` over `input`/`output` until `input` ends or a write
/// fails; then every call still in flight is cancelled.
pub async fn serve<R, W>(session: Session, input: R, output: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::BufWriter::new(output);
        while let Some(msg) = rx.recv().await {
            let mut line = msg.to_string().into_bytes();
            line.push(b'\n');
            out.write_all(&line).await?;
            if rx.is_empty() {
                out.flush().await?;
            }
        }
        out.flush().await
    });
    session.set_notifier(tx.clone());
    let mut frames = FramedRead::new(input, FrameDecoder::new(Framing::Lines, DEFAULT_MAX_FRAME));
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(frame) = frames.next().await {
        if writer.is_finished() {
            break;
        }
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "MCP stdio input cannot be read further");
                break;
            }
        };
        let bytes = match frame {
            Frame::Data(b) => b,
            Frame::Oversized { len, .. } => {
                let _ = tx.send(respond(
                    Value::Null,
                    Err(error(
                        code::INVALID_REQUEST,
                        format!(
                            "a message of {len} bytes or more; the limit is {DEFAULT_MAX_FRAME}"
                        ),
                    )),
                ));
                continue;
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let msg: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                let _ = tx.send(respond(
                    Value::Null,
                    Err(json!({"code": -32700, "message": format!("parse error: {e}")})),
                ));
                continue;
            }
        };
        let (s, t) = (session.clone(), tx.clone());
        tasks.spawn(async move { handle(s, msg, t).await });
        // Reap what finished so a long session does not pile up handles.
        while tasks.try_join_next().is_some() {}
    }
    // The client closed its end: answer what is in flight (a piped script
    // reads the answers), within a bound, then cancel the rest.
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(EOF_GRACE, drain).await.is_err() {
        tracing::info!("MCP stdin closed; cancelling the calls still running after {EOF_GRACE:?}");
    }
    session.close();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(tx);
    session.set_closed();
    match writer.await {
        Ok(r) => r,
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// The one MCP revision with JSON-RPC batches.
const BATCH_REVISION: &str = "2025-03-26";

/// Why a batch is refused whole, if it is: on a revision without batching
/// (any but [`BATCH_REVISION`] once `initialize` settled one) or over
/// `mcp.http.max_batch_items` messages (the default; the same bound as
/// `/mcp`).
fn refuse_batch(session: &Session, len: usize) -> Option<String> {
    let max = plugd_runtime::mcp_config::DEFAULT_MAX_BATCH_ITEMS;
    match session.protocol_version() {
        Some(v) if v != BATCH_REVISION => Some(format!(
            "JSON-RPC batches are not part of MCP revision {v} (only {BATCH_REVISION} has them); send one message per line"
        )),
        _ if len > max => Some(format!(
            "a JSON-RPC batch of {len} messages; at most {max} may be sent in one: send them on several lines"
        )),
        _ => None,
    }
}

async fn handle(session: Session, msg: Value, tx: Sink) {
    match msg {
        Value::Array(batch) if !batch.is_empty() => {
            if let Some(why) = refuse_batch(&session, batch.len()) {
                let _ = tx.send(respond(Value::Null, Err(error(code::INVALID_REQUEST, why))));
                return;
            }
            let mut out = Vec::new();
            for m in batch {
                if let Some(r) = session.handle(m, Some(tx.clone())).await {
                    out.push(r);
                }
            }
            if !out.is_empty() {
                let _ = tx.send(Value::Array(out));
            }
        }
        msg => {
            if let Some(r) = session.handle(msg, Some(tx.clone())).await {
                let _ = tx.send(r);
            }
        }
    }
}
