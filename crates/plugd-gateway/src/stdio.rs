//! The stdio transport (`plugd mcp`): newline-delimited JSON-RPC on a
//! reader and a writer, as MCP clients spawn a server. Requests run
//! concurrently; responses and notifications go out through one writer
//! task, a line each. Lines over the frame limit are skipped without being
//! buffered and answered with an error. When stdin ends, calls in flight
//! get [`EOF_GRACE`] to finish before they are cancelled.

use futures_util::StreamExt;
use plugd_wire::framing::{DEFAULT_MAX_FRAME, Frame, FrameDecoder, Framing};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::FramedRead;

use crate::session::{code, error, respond};
use crate::{Session, Sink};

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

async fn handle(session: Session, msg: Value, tx: Sink) {
    match msg {
        Value::Array(batch) if !batch.is_empty() => {
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
