//! The SSE streams of one MCP session on `/mcp`, resumable as Streamable
//! HTTP 2025-11-25 describes (SEP-1699).
//!
//! Each request answered as SSE is a *stream* of its own (numbered from 1),
//! and the session's `GET` stream is stream 0. A stream outlives the HTTP
//! connection that carries it: a message goes into the session's bounded
//! replay log first, then to the connection attached to its stream, if any.
//!
//! For a session that negotiated 2025-11-25 or later ("resumable"):
//! - every event has an id `TAG-STREAM-SEQ`: `TAG` is random per session
//!   (an id of another session is unknown here), `SEQ` counts per session,
//!   so ids are unique across the session's streams;
//! - a new connection starts with a priming event (an id, the `retry`
//!   field, empty data);
//! - a connection is closed after `close_after` (a `retry` event first),
//!   and a client that falls [`CONN_QUEUE`] events behind is cut off: the
//!   stream goes on, the client resumes it with `GET` + `Last-Event-ID` and
//!   gets what it missed from the log, then the rest;
//! - the log keeps at most [`MAX_EVENTS`] events and [`MAX_BYTES`] bytes
//!   per session, oldest dropped first (an event larger than
//!   [`MAX_EVENT_BYTES`] is sent live only).
//!
//! Older sessions get plain streams: no ids, no priming, never closed early.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

/// Events the replay log of one session keeps.
pub const MAX_EVENTS: usize = 512;
/// Bytes (of event data) the replay log of one session keeps.
pub const MAX_BYTES: usize = 2 * 1024 * 1024;
/// The largest event kept for replay; a larger one is sent live only.
pub const MAX_EVENT_BYTES: usize = 512 * 1024;
/// Events queued for one connection; a client this far behind is cut off
/// (and resumes from the log).
pub const CONN_QUEUE: usize = 64;

/// The session's `GET` stream.
pub const STANDALONE: u64 = 0;

const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How a session's streams behave.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Ids, priming events, replay and early closes (2025-11-25 and later).
    pub resumable: bool,
    /// A connection is closed after this long (`None`: never).
    pub close_after: Option<Duration>,
    /// The SSE `retry` sent before a close and in priming events.
    pub retry: Duration,
}

/// Why a `Last-Event-ID` cannot be resumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// Not an id of this session, or of a stream it no longer keeps.
    #[error(
        "Last-Event-ID {0:?} names no event stream of this MCP session (another session's id, or a stream whose events are no longer kept: a session keeps its last {MAX_EVENTS} events); open GET without Last-Event-ID, or send the request again"
    )]
    Unknown(String),
    /// The stream ended and nothing after the id is kept.
    #[error(
        "the event stream of Last-Event-ID {0:?} has ended and holds no event after it; send the request again if its response was lost"
    )]
    Ended(String),
}

/// The streams of one session; shared by its HTTP handlers.
#[derive(Debug)]
pub struct Hub {
    tag: String,
    opts: Options,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_stream: u64,
    next_seq: u64,
    next_conn: u64,
    log: VecDeque<Stored>,
    bytes: usize,
    streams: HashMap<u64, Stream>,
    standalone_started: bool,
}

#[derive(Debug)]
struct Stored {
    stream: u64,
    seq: u64,
    data: Arc<str>,
}

#[derive(Debug, Default)]
struct Stream {
    /// The connection carrying it now: (connection number, its queue).
    conn: Option<(u64, mpsc::Sender<Bytes>)>,
    ended: bool,
    /// Events of it in the log.
    retained: usize,
}

impl Hub {
    /// The streams of a new session.
    pub fn new(opts: Options) -> Arc<Hub> {
        // Unique per session in this process (the counter), and not the
        // same across restarts (the random part).
        static SESSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let random = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(n);
            h.finish() as u16
        };
        Arc::new(Hub {
            tag: format!("{n:x}{random:04x}"),
            opts,
            state: Mutex::new(State {
                next_stream: 1,
                next_seq: 1,
                ..State::default()
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn id(&self, stream: u64, seq: u64) -> String {
        format!("{}-{stream}-{seq}", self.tag)
    }

    fn event(&self, stream: u64, seq: u64, data: &str) -> Bytes {
        let id = self.opts.resumable.then(|| self.id(stream, seq));
        frame(id.as_deref(), None, Some(data))
    }

    /// A new stream for one request.
    pub fn open(&self) -> u64 {
        let mut s = self.lock();
        let n = s.next_stream;
        s.next_stream += 1;
        s.streams.insert(n, Stream::default());
        n
    }

    /// Marks the `GET` stream started; `true` the first time.
    pub fn start_standalone(&self) -> bool {
        let mut s = self.lock();
        s.streams.entry(STANDALONE).or_default();
        !std::mem::replace(&mut s.standalone_started, true)
    }

    /// Sends `msg` on `stream` (the last one of it when `end`).
    pub fn emit(&self, stream: u64, msg: &Value, end: bool) {
        let data: Arc<str> = msg.to_string().into();
        let mut guard = self.lock();
        let s = &mut *guard;
        let Some(st) = s.streams.get_mut(&stream) else {
            return;
        };
        if st.ended {
            return;
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        st.ended = end;
        if let Some((_, tx)) = &st.conn
            && tx.try_send(self.event(stream, seq, &data)).is_err()
        {
            // Full (the client does not read) or gone: it resumes from the log.
            st.conn = None;
        }
        if end {
            st.conn = None;
        }
        let keep = self.opts.resumable && data.len() <= MAX_EVENT_BYTES;
        if keep {
            st.retained += 1;
            s.bytes += data.len();
            s.log.push_back(Stored { stream, seq, data });
            evict(s);
        } else if end && st.retained == 0 {
            s.streams.remove(&stream);
        }
    }

    /// Ends `stream` without a last message (a cancelled request).
    pub fn end(&self, stream: u64) {
        let mut s = self.lock();
        if let Some(st) = s.streams.get_mut(&stream) {
            st.ended = true;
            st.conn = None;
            if st.retained == 0 {
                s.streams.remove(&stream);
            }
        }
    }

    /// Closes every connection (the session ended).
    pub fn close_all(&self) {
        let mut s = self.lock();
        for st in s.streams.values_mut() {
            st.conn = None;
        }
    }

    /// An SSE response carrying `stream` from now on: a priming event
    /// first (resumable sessions), then what is emitted.
    pub fn connect(self: &Arc<Self>, stream: u64) -> Response {
        let mut s = self.lock();
        let mut first = Vec::new();
        if self.opts.resumable {
            let seq = s.next_seq;
            s.next_seq += 1;
            first.push(frame(
                Some(&self.id(stream, seq)),
                Some(self.opts.retry),
                Some(""),
            ));
        }
        self.attach(s, stream, first)
    }

    /// An SSE response resuming the stream `last_event_id` is an event of:
    /// the kept events after it, then the rest of the stream.
    pub fn resume(self: &Arc<Self>, last_event_id: &str) -> Result<Response, ResumeError> {
        let unknown = || ResumeError::Unknown(clip(last_event_id));
        let (stream, seq) = self.parse(last_event_id).ok_or_else(unknown)?;
        let s = self.lock();
        let Some(st) = s.streams.get(&stream) else {
            return Err(unknown());
        };
        let replay: Vec<Bytes> = s
            .log
            .iter()
            .filter(|e| e.stream == stream && e.seq > seq)
            .map(|e| self.event(e.stream, e.seq, &e.data))
            .collect();
        if st.ended && replay.is_empty() {
            return Err(ResumeError::Ended(clip(last_event_id)));
        }
        Ok(self.attach(s, stream, replay))
    }

    fn parse(&self, id: &str) -> Option<(u64, u64)> {
        if !self.opts.resumable || id.len() > 64 {
            return None;
        }
        let mut parts = id.splitn(3, '-');
        if parts.next()? != self.tag {
            return None;
        }
        let stream = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        Some((stream, seq))
    }

    /// The response of a new connection of `stream`, starting with `first`;
    /// it replaces the stream's previous connection.
    fn attach(
        self: &Arc<Self>,
        mut s: MutexGuard<'_, State>,
        stream: u64,
        first: Vec<Bytes>,
    ) -> Response {
        let conn = s.next_conn;
        s.next_conn += 1;
        let ended = s.streams.get(&stream).is_none_or(|st| st.ended);
        let rx = if ended {
            None
        } else {
            let (tx, rx) = mpsc::channel(CONN_QUEUE);
            if let Some(st) = s.streams.get_mut(&stream) {
                st.conn = Some((conn, tx));
            }
            Some(rx)
        };
        drop(s);
        let now = tokio::time::Instant::now();
        let conn = Conn {
            first: first.into(),
            rx,
            close_at: self
                .opts
                .close_after
                .filter(|_| self.opts.resumable)
                .map(|after| now + after),
            retry: self.opts.retry,
            detach: Detach {
                hub: Arc::downgrade(self),
                stream,
                conn,
            },
        };
        let body = futures_util::stream::unfold(conn, Conn::next);
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            axum::body::Body::from_stream(body.map(Ok::<_, Infallible>)),
        )
            .into_response()
    }
}

/// One SSE event: `id`, `retry` and `data` fields when given (a `data`
/// field even when empty: a priming event has one).
fn frame(id: Option<&str>, retry: Option<Duration>, data: Option<&str>) -> Bytes {
    let mut out = String::with_capacity(data.map_or(0, str::len) + 48);
    if let Some(id) = id {
        out.push_str("id: ");
        out.push_str(id);
        out.push('\n');
    }
    if let Some(r) = retry {
        out.push_str(&format!("retry: {}\n", r.as_millis()));
    }
    if let Some(data) = data {
        out.push_str("event: message\n");
        if data.is_empty() {
            out.push_str("data: \n");
        }
        for line in data.lines() {
            out.push_str("data: ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push('\n');
    Bytes::from(out)
}

/// The state of one connection's body.
struct Conn {
    first: VecDeque<Bytes>,
    rx: Option<mpsc::Receiver<Bytes>>,
    close_at: Option<tokio::time::Instant>,
    retry: Duration,
    detach: Detach,
}

impl Conn {
    /// The next bytes of the body: `first`, then the stream's events, a
    /// keep-alive comment when idle, and at `close_at` a `retry` and the end.
    async fn next(mut self) -> Option<(Bytes, Conn)> {
        if let Some(b) = self.first.pop_front() {
            return Some((b, self));
        }
        let mut rx = self.rx.take()?;
        let close_at = self.close_at;
        let close = async move {
            match close_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            e = rx.recv() => {
                let e = e?;
                self.rx = Some(rx);
                Some((e, self))
            }
            () = tokio::time::sleep(KEEP_ALIVE) => {
                self.rx = Some(rx);
                Some((Bytes::from_static(b":\n\n"), self))
            }
            () = close => {
                self.detach.now();
                // `rx` stays None: the body ends after this event.
                Some((frame(None, Some(self.retry), None), self))
            }
        }
    }
}

/// Detaches a connection from its stream when its response is dropped (the
/// client went away, or the response ended).
struct Detach {
    hub: Weak<Hub>,
    stream: u64,
    conn: u64,
}

impl Detach {
    fn now(&self) {
        if let Some(hub) = self.hub.upgrade() {
            let mut s = hub.lock();
            if let Some(st) = s.streams.get_mut(&self.stream)
                && st.conn.as_ref().is_some_and(|(c, _)| *c == self.conn)
            {
                st.conn = None;
            }
        }
    }
}

impl Drop for Detach {
    fn drop(&mut self) {
        self.now();
    }
}

/// Drops the oldest events while the log is over its bounds, and the
/// streams that ended and have nothing left in it.
fn evict(s: &mut State) {
    while s.log.len() > MAX_EVENTS || s.bytes > MAX_BYTES {
        let Some(old) = s.log.pop_front() else {
            break;
        };
        s.bytes -= old.data.len();
        if let Some(st) = s.streams.get_mut(&old.stream) {
            st.retained -= 1;
            if st.ended && st.retained == 0 {
                s.streams.remove(&old.stream);
            }
        }
    }
}

fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hub() -> Arc<Hub> {
        Hub::new(Options {
            resumable: true,
            close_after: None,
            retry: Duration::from_millis(10),
        })
    }

    #[test]
    fn ids_of_another_session_or_garbage_are_unknown() {
        let (a, b) = (hub(), hub());
        let n = a.open();
        a.emit(n, &json!({"a": 1}), false);
        let theirs = format!("{}-{n}-1", b.tag);
        for id in [theirs.as_str(), "", "x", "1-1-1", &"9".repeat(100)] {
            assert!(matches!(a.resume(id), Err(ResumeError::Unknown(_))), "{id}");
        }
        assert!(a.resume(&a.id(n, 0)).is_ok());
    }

    #[test]
    fn the_log_is_bounded_and_forgets_ended_streams() {
        let h = hub();
        let first = h.open();
        h.emit(first, &json!({"id": 1, "result": {}}), true);
        for _ in 0..MAX_EVENTS + 10 {
            let n = h.open();
            h.emit(n, &json!({"x": "y"}), false);
        }
        let s = h.lock();
        assert_eq!(s.log.len(), MAX_EVENTS);
        assert!(!s.streams.contains_key(&first), "ended and evicted");
        drop(s);
        assert!(matches!(
            h.resume(&h.id(first, 0)),
            Err(ResumeError::Unknown(_))
        ));
        let big = "z".repeat(MAX_BYTES / 4);
        let n = h.open();
        for _ in 0..8 {
            h.emit(n, &json!(big), false);
        }
        assert!(h.lock().bytes <= MAX_BYTES);
    }

    #[test]
    fn an_ended_stream_with_nothing_after_the_id_is_refused() {
        let h = hub();
        let n = h.open();
        h.emit(n, &json!({"id": 1, "result": {}}), true);
        let last = h.lock().log.back().map(|e| e.seq).unwrap();
        assert!(
            h.resume(&h.id(n, last - 1)).is_ok(),
            "the response is replayed"
        );
        assert!(matches!(
            h.resume(&h.id(n, last)),
            Err(ResumeError::Ended(_))
        ));
    }
}
