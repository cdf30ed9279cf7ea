//! `POST /v1/tools/{name}:invoke` with `Accept: text/event-stream`: the call's
//! progress as it happens (`event: progress`, the plugin's progress object),
//! then `event: result` (the result, as the JSON answer would be) or
//! `event: error` (the error body the JSON answer would carry, plus its HTTP
//! `status`). The console's "try it" form uses it.
//!
//! Bounded: progress beyond what the client reads is dropped (counted in a
//! final `dropped` field of the result event when any was), never buffered
//! without limit; a client that goes away cancels the call.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use plugd_host::dialect::CallContext;
use plugd_runtime::governed::{Governed, Surface};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::{ApiError, AppState};

/// Progress events held for a slow reader before more are dropped.
const BUFFER: usize = 64;

/// Runs the call and streams it.
pub(crate) fn invoke(state: AppState, name: String, args: Value, mut ctx: CallContext) -> Response {
    let (progress_tx, mut progress) = mpsc::unbounded_channel();
    ctx.progress = Some(progress_tx);
    let (tx, rx) = mpsc::channel::<Event>(BUFFER);
    tokio::spawn(async move {
        let gov = Governed::new(Surface::Http);
        let call = async {
            state
                .runtime
                .call_tool_governed(&name, args, &ctx, &gov)
                .await
                .outcome
        };
        tokio::pin!(call);
        let mut dropped = 0u64;
        let forward = |p: Value, dropped: &mut u64| {
            let ev = Event::default().event("progress").data(p.to_string());
            if tx.try_send(ev).is_err() {
                *dropped += 1;
            }
        };
        let last = loop {
            tokio::select! {
                // Progress first: what the plugin sent before its result
                // arrives before the result.
                biased;
                Some(p) = progress.recv() => forward(p, &mut dropped),
                // The client left: dropping the call cancels it.
                () = tx.closed() => return,
                r = &mut call => break r,
            }
        };
        while let Ok(p) = progress.try_recv() {
            forward(p, &mut dropped);
        }
        let ev = match last {
            Ok(mut result) => {
                if dropped > 0
                    && let Some(m) = result.as_object_mut()
                {
                    m.insert("dropped_progress".into(), json!(dropped));
                }
                Event::default().event("result").data(result.to_string())
            }
            Err(e) => {
                let err = ApiError::from(e);
                let mut body = err.body();
                body["status"] = json!(err.status.as_u16());
                Event::default().event("error").data(body.to_string())
            }
        };
        let _ = tx.send(ev).await;
    });
    sse(rx)
}

/// The events `rx` receives as a server-sent event stream, with a
/// keep-alive every 15 s; it ends when the sender goes.
pub(crate) fn sse(rx: mpsc::Receiver<Event>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok::<_, Infallible>(ev), rx))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
