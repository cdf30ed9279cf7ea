//! A multiplexed, bidirectional JSON-RPC 2.0 connection to one plugin.
//!
//! A [`Peer`] runs a reader task over any byte transport that cuts frames
//! ([`plugd_wire::FrameDecoder`]) and routes them; frames to the child go
//! out through [`crate::peer_out`]: written by the sender itself while the
//! pipe is idle, else queued (bounded) for a writer task. Writing and
//! reading never share a task, so a child that stops reading cannot stop
//! its replies from being read, and the reverse.
//!
//! * Host request ids come from a per-peer counter and are never reused.
//! * [`Peer::call`] bounds the enqueue, the write and the wait by one deadline;
//!   a caller that gives up (timeout or drop) removes its pending entry.
//! * Requests from the child are served on their own tasks, so one slow host
//!   service never delays another reply.
//! * The queue to the child holds [`DEFAULT_QUEUE_DEPTH`] frames: requests and
//!   responses wait for room (bounded by their deadline), notifications are
//!   shed when it is full and each shed is counted and logged.
//! * Non-JSON output, responses with unknown ids and oversized frames are
//!   logged with the plugin id, counted and skipped.
//!
//! **Why one file** (~870 product lines): the peer's reader task, pending
//! map, event routes and cancel bookkeeping share one `Inner` and its
//! invariants (an id is never reused, a pending entry is removed by
//! whoever gives up, only notifications are shed); the envelope it speaks
//! is already apart (`protocol.rs`).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use plugd_wire::{ErrorObject, Frame, FrameDecoder, Framing, Id};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::codec::FramedRead;

use crate::peer_out::{PeerOut, Refused};
use crate::protocol::{Incoming, JsonRpc, Protocol};

/// Default depth of the host-to-child queue (nexo contract §8).
pub const DEFAULT_QUEUE_DEPTH: usize = 64;

/// How long a cancelled request is remembered (to spot a plugin still
/// working on it).
const CANCEL_MEMORY: Duration = Duration::from_secs(300);

/// Most cancelled requests remembered at once.
const MAX_CANCELLED: usize = 4096;

/// The future a [`Handler`] returns for a child-to-host request.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, ErrorObject>> + Send>>;

/// A child-to-host request as it arrived, with a way to talk back while it
/// is served.
#[derive(Debug)]
pub struct Request {
    /// The child's id (echoed in the response; streams correlate their
    /// notifications with it, e.g. `llm.complete.delta {request_id}`).
    pub id: Id,
    /// Method.
    pub method: String,
    /// Parameters.
    pub params: Option<Value>,
    /// Notifications to the child while the request is served.
    pub notifier: Notifier,
}

/// Sends notifications to the child for one request being served: each waits
/// for room in the queue (a stream's pieces are never shed) and all of them
/// go out before the request's response.
#[derive(Clone)]
pub struct Notifier {
    inner: std::sync::Weak<Inner>,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Notifier")
    }
}

impl Notifier {
    /// Queues a notification, waiting for room; `false` once the connection
    /// is gone.
    pub async fn send(&self, method: &str, params: Option<Value>) -> bool {
        let Some(inner) = self.inner.upgrade() else {
            return false;
        };
        let protocol = &*inner.config.protocol;
        let frame = frame(protocol, protocol.encode_notification(method, params));
        inner.out.send(frame, inner.quiet()).await.is_ok()
    }
}

/// Serves what the child sends to the host.
pub trait Handler: Send + Sync + 'static {
    /// A child-to-host request; runs on its own task.
    fn request(&self, method: String, params: Option<Value>) -> HandlerFuture {
        let _ = params;
        Box::pin(async move {
            Err(ErrorObject::new(
                plugd_wire::codes::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
            ))
        })
    }

    /// A child-to-host request with its id and a [`Notifier`]; by default
    /// [`Handler::request`]. Override it to stream to the child while serving.
    fn handle(&self, request: Request) -> HandlerFuture {
        self.request(request.method, request.params)
    }

    /// A child-to-host notification; must not block.
    fn notification(&self, method: String, params: Option<Value>) {
        let _ = (method, params);
    }
}

/// A handler that answers every request with `-32601` and ignores notifications.
#[derive(Debug, Default)]
pub struct NoHandler;
impl Handler for NoHandler {}

/// What happens after the host cancels a request it gave up on.
#[derive(Debug, Clone, Copy)]
pub struct CancelPolicy {
    /// How long the plugin has to stop working on it.
    pub grace: Duration,
    /// `true`: the plugin must answer the cancelled request (VAI's terminal
    /// `cancelled` response) within `grace`. `false`: it must go quiet (MCP);
    /// any response or event for it after `grace` counts as still working.
    pub expects_ack: bool,
}

/// Called with a reason when a plugin keeps working on a cancelled request
/// past the grace period; the supervisor kills the process.
pub type RunawayHook = Arc<dyn Fn(String) + Send + Sync>;

/// Settings of one peer.
#[derive(Clone)]
pub struct PeerConfig {
    /// The plugin id, attached to every log line and error.
    pub plugin: Arc<str>,
    /// The wire envelope (and its framing).
    pub protocol: Arc<dyn Protocol>,
    /// Largest frame accepted from the child.
    pub max_frame: usize,
    /// Depth of the host-to-child queue.
    pub queue_depth: usize,
    /// Cancel behaviour; `None` when the contract has no cancel.
    pub cancel: Option<CancelPolicy>,
    /// What to do with a plugin that ignores a cancel.
    pub on_runaway: Option<RunawayHook>,
}

impl fmt::Debug for PeerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerConfig")
            .field("plugin", &self.plugin)
            .field("framing", &self.protocol.framing())
            .field("max_frame", &self.max_frame)
            .field("queue_depth", &self.queue_depth)
            .field("cancel", &self.cancel)
            .finish()
    }
}

impl PeerConfig {
    /// Defaults for a plugin speaking JSON-RPC with `framing`: 16 MiB
    /// frames, a 64-frame queue, no cancel.
    pub fn new(plugin: &str, framing: Framing) -> Self {
        Self::with_protocol(plugin, Arc::new(JsonRpc { framing }))
    }

    /// Defaults for a plugin speaking `protocol`.
    pub fn with_protocol(plugin: &str, protocol: Arc<dyn Protocol>) -> Self {
        PeerConfig {
            plugin: plugin.into(),
            protocol,
            max_frame: plugd_wire::DEFAULT_MAX_FRAME,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            cancel: None,
            on_runaway: None,
        }
    }
}

/// Why a connection ended; shared by every call it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The plugin id.
    pub plugin: Arc<str>,
    /// What happened, e.g. `exit status 3` or `stdout closed`.
    pub cause: String,
    /// The last lines the plugin wrote to stderr (secrets already scrubbed).
    pub stderr_tail: Vec<String>,
    /// `true` when the host asked for it (shutdown), `false` for a crash.
    pub expected: bool,
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin {:?} ", &*self.plugin)?;
        if self.expected {
            write!(f, "was shut down ({})", self.cause)?;
        } else {
            write!(f, "crashed: {}", self.cause)?;
        }
        if !self.stderr_tail.is_empty() {
            let tail: Vec<&str> = self
                .stderr_tail
                .iter()
                .rev()
                .take(5)
                .rev()
                .map(String::as_str)
                .collect();
            write!(f, "; last stderr: {}", tail.join(" | "))?;
        }
        Ok(())
    }
}

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The plugin answered with a JSON-RPC error.
    #[error("plugin {plugin:?} answered {method} with an error: {error}")]
    Remote {
        /// Plugin id.
        plugin: Arc<str>,
        /// The method called.
        method: String,
        /// The error object, as sent (boxed: it can carry arbitrary data).
        error: Box<ErrorObject>,
    },
    /// No answer within the deadline (it covers queueing, writing and waiting).
    #[error(
        "plugin {plugin:?} did not answer {method} within {after:?} (id {id}); the call was abandoned"
    )]
    Timeout {
        /// Plugin id.
        plugin: Arc<str>,
        /// The method called.
        method: String,
        /// The deadline that passed.
        after: Duration,
        /// The abandoned request id (dialects may send a cancel for it).
        id: i64,
    },
    /// The connection ended before the answer came.
    #[error("{0}")]
    Closed(Arc<Closed>),
    /// The answer was larger than the frame limit and was refused.
    #[error(
        "plugin {plugin:?} answered {method} with a {len}-byte frame, over the {limit}-byte limit; the frame was refused"
    )]
    FrameTooLarge {
        /// Plugin id.
        plugin: Arc<str>,
        /// The method called.
        method: String,
        /// The frame's size.
        len: u64,
        /// The limit.
        limit: usize,
    },
}

/// Counters of what the peer skipped or shed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerStats {
    /// Notifications shed because the queue to the child was full.
    pub shed_notifications: u64,
    /// Lines on stdout that were not JSON-RPC.
    pub junk_frames: u64,
    /// Responses whose id matched no pending call.
    pub unknown_ids: u64,
    /// Frames refused for exceeding the size limit.
    pub oversized_frames: u64,
}

#[derive(Debug, Default)]
struct Counters {
    shed: AtomicU64,
    junk: AtomicU64,
    unknown: AtomicU64,
    oversized: AtomicU64,
}

struct PendingCall {
    method: Arc<str>,
    tx: oneshot::Sender<Result<Value, CallError>>,
    events: Option<mpsc::UnboundedSender<Value>>,
}

#[derive(Default)]
struct State {
    pending: HashMap<i64, PendingCall>,
    /// Requests the host cancelled, and when.
    cancelled: HashMap<i64, std::time::Instant>,
    /// Answered requests whose events still reach their caller
    /// ([`Peer::call_routed`]).
    routes: HashMap<i64, mpsc::UnboundedSender<Value>>,
    closed: Option<Arc<Closed>>,
}

struct Inner {
    config: PeerConfig,
    next_id: AtomicI64,
    state: Mutex<State>,
    out: PeerOut,
    counters: Counters,
    closed_tx: watch::Sender<Option<Arc<Closed>>>,
    reader_done: watch::Sender<Option<String>>,
    /// The request whose cancel the plugin ignored, once one did.
    runaway: Mutex<Option<i64>>,
}

/// One side of a JSON-RPC connection to a plugin. Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    inner: Arc<Inner>,
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer")
            .field("plugin", &self.inner.config.plugin)
            .finish()
    }
}

impl Peer {
    /// Starts the reader task and the way out (its writer task) over a
    /// transport.
    pub fn start<R, W>(config: PeerConfig, reader: R, writer: W, handler: Arc<dyn Handler>) -> Peer
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let out = PeerOut::start(config.plugin.clone(), config.queue_depth, writer);
        let inner = Arc::new(Inner {
            config,
            next_id: AtomicI64::new(1),
            state: Mutex::new(State::default()),
            out,
            counters: Counters::default(),
            closed_tx: watch::channel(None).0,
            reader_done: watch::channel(None).0,
            runaway: Mutex::new(None),
        });
        tokio::spawn(read_loop(inner.clone(), reader, handler));
        Peer { inner }
    }

    /// An in-memory pair of transports for tests: the host end runs a
    /// [`Peer`], the returned end is the "child" side.
    pub fn memory(
        config: PeerConfig,
        handler: Arc<dyn Handler>,
    ) -> (Peer, tokio::io::DuplexStream) {
        let (host, child) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(host);
        (Peer::start(config, r, w, handler), child)
    }

    /// The largest frame this peer reads from the plugin.
    pub fn max_frame(&self) -> usize {
        self.inner.config.max_frame
    }

    /// The plugin id.
    pub fn plugin(&self) -> &Arc<str> {
        &self.inner.config.plugin
    }

    /// Sends a request and waits for its result. `timeout` covers queueing,
    /// writing and waiting.
    pub async fn call(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        self.call_with(method, params, timeout, None).await
    }

    /// [`Peer::call`], with the request's events (progress) sent to `events`.
    /// If the caller gives up (deadline, or the future is dropped) and the
    /// protocol has a cancel, the plugin is told.
    pub async fn call_with(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        events: Option<mpsc::UnboundedSender<Value>>,
    ) -> Result<Value, CallError> {
        self.exchange(method, params, timeout, events, None).await
    }

    /// [`Peer::call_with`] for a request whose events outlive its response
    /// (an MCP task-augmented `tools/call`: its progress token stays valid
    /// for the task's life). Events naming the request reach `events` from
    /// before it is sent until the returned [`EventRoute`] drops.
    pub async fn call_routed(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        events: mpsc::UnboundedSender<Value>,
    ) -> Result<(Value, EventRoute), CallError> {
        let mut route = None;
        let result = self
            .exchange(method, params, timeout, Some(events), Some(&mut route))
            .await;
        let route = route.expect("exchange registers the route before sending");
        result.map(|v| (v, route))
    }

    async fn exchange(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        events: Option<mpsc::UnboundedSender<Value>>,
        route: Option<&mut Option<EventRoute>>,
    ) -> Result<Value, CallError> {
        let inner = &self.inner;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(route) = route {
            if let Some(sink) = &events {
                inner.lock().routes.insert(id, sink.clone());
            }
            *route = Some(EventRoute {
                inner: inner.clone(),
                id,
            });
        }
        let (tx, rx) = oneshot::channel();
        // The only call waiting: the caller writes its request itself (no
        // wake-up of the writer task); with others waiting, the writer
        // task writes what gathered in one write.
        let alone = {
            let mut state = inner.lock();
            if let Some(closed) = &state.closed {
                return Err(CallError::Closed(closed.clone()));
            }
            state.pending.insert(
                id,
                PendingCall {
                    method: method.into(),
                    tx,
                    events,
                },
            );
            state.pending.len() == 1
        };
        let guard = PendingGuard {
            inner: inner.clone(),
            id,
            reason: "caller gone",
        };
        let frame = frame(
            &*inner.config.protocol,
            inner.config.protocol.encode_request(id, method, params),
        );
        let exchange = async {
            if inner.out.send(frame, alone).await.is_err() {
                return Err(CallError::Closed(self.wait_closed().await));
            }
            match rx.await {
                Ok(result) => result,
                Err(_) => Err(CallError::Closed(self.wait_closed().await)),
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => {
                let mut guard = guard;
                guard.reason = "deadline_exceeded";
                drop(guard);
                Err(CallError::Timeout {
                    plugin: inner.config.plugin.clone(),
                    method: method.to_owned(),
                    after: timeout,
                    id,
                })
            }
        }
    }

    /// Queues a raw, already encoded payload (framed here), waiting for room.
    /// For dialect frames that are not requests (VAI `hello`, `shutdown`).
    pub async fn send_payload(&self, payload: Vec<u8>) -> Result<(), Arc<Closed>> {
        let frame = frame(&*self.inner.config.protocol, payload);
        if self
            .inner
            .out
            .send(frame, self.inner.quiet())
            .await
            .is_err()
        {
            return Err(self.wait_closed().await);
        }
        Ok(())
    }

    /// Queues a notification. When the queue is full the notification is
    /// shed (counted and logged) and `false` is returned.
    pub fn notify(&self, method: &str, params: Option<Value>) -> bool {
        let protocol = &*self.inner.config.protocol;
        let frame = frame(protocol, protocol.encode_notification(method, params));
        match self.inner.out.try_send(frame, self.inner.quiet()) {
            Ok(()) => true,
            Err(Refused::Full) => {
                let n = self.inner.counters.shed.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(plugin = %self.inner.config.plugin, method, shed_total = n,
                    "queue to plugin full; notification shed");
                false
            }
            Err(Refused::Closed) => false,
        }
    }

    /// Marks the connection closed and fails every pending call with `why`.
    /// The first reason wins; later calls are ignored.
    pub fn close(&self, why: Closed) -> Arc<Closed> {
        let why = Arc::new(why);
        let pending = {
            let mut state = self.inner.lock();
            if let Some(existing) = &state.closed {
                return existing.clone();
            }
            state.closed = Some(why.clone());
            std::mem::take(&mut state.pending)
        };
        for (_, call) in pending {
            let _ = call.tx.send(Err(CallError::Closed(why.clone())));
        }
        self.inner.closed_tx.send_replace(Some(why.clone()));
        why
    }

    /// The closure reason, if the connection is closed.
    pub fn closed_reason(&self) -> Option<Arc<Closed>> {
        self.inner.lock().closed.clone()
    }

    /// Resolves when the connection is closed.
    pub async fn wait_closed(&self) -> Arc<Closed> {
        first_some(&self.inner.closed_tx).await
    }

    /// Resolves when the reader hits end of stream or a fatal framing error,
    /// with a description of which.
    pub async fn wait_reader_done(&self) -> String {
        first_some(&self.inner.reader_done).await
    }

    /// How the reader ended, if it has (`stdout closed` or `unreadable output: …`).
    pub fn reader_end(&self) -> Option<String> {
        self.inner.reader_done.borrow().clone()
    }

    /// Counters of skipped and shed frames.
    pub fn stats(&self) -> PeerStats {
        let c = &self.inner.counters;
        PeerStats {
            shed_notifications: c.shed.load(Ordering::Relaxed),
            junk_frames: c.junk.load(Ordering::Relaxed),
            unknown_ids: c.unknown.load(Ordering::Relaxed),
            oversized_frames: c.oversized.load(Ordering::Relaxed),
        }
    }

    /// The host request id of the call whose cancel the plugin ignored
    /// (the first one, when several did), once the peer reported a
    /// runaway; the supervisor names it to the other calls the kill failed.
    pub fn runaway_request(&self) -> Option<i64> {
        *self.inner.runaway.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of calls waiting for an answer.
    pub fn pending_calls(&self) -> usize {
        self.inner.lock().pending.len()
    }
}

impl Inner {
    fn runaway(&self, id: i64, why: String) {
        tracing::warn!(plugin = %self.config.plugin, "plugin ignores cancellation: {why}; killing it");
        self.runaway
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(id);
        if let Some(hook) = &self.config.on_runaway {
            hook(why);
        }
    }

    /// Bookkeeping for traffic about a cancelled request: `true` when it is
    /// about one (so it is not "unknown"), and a runaway is reported when it
    /// arrives after the grace period of a contract that expects silence.
    fn after_cancel(&self, id: i64, terminal: bool) -> bool {
        let Some(policy) = self.config.cancel else {
            return false;
        };
        let at = {
            let mut state = self.lock();
            let at = state.cancelled.get(&id).copied();
            if terminal {
                state.cancelled.remove(&id);
            }
            at
        };
        let Some(at) = at else { return false };
        if !policy.expects_ack && at.elapsed() > policy.grace {
            self.runaway(
                id,
                format!(
                    "request {id} still active {:?} after it was cancelled",
                    at.elapsed()
                ),
            );
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No call waits for an answer: a frame may be written by its sender.
    fn quiet(&self) -> bool {
        self.lock().pending.is_empty()
    }

    fn complete(&self, id: i64, result: impl FnOnce(&str) -> Result<Value, CallError>) -> bool {
        let call = self.lock().pending.remove(&id);
        match call {
            Some(call) => {
                let _ = call.tx.send(result(&call.method));
                true
            }
            None => false,
        }
    }
}

/// Resolves with the first `Some` a watch channel holds.
async fn first_some<T: Clone>(tx: &watch::Sender<Option<T>>) -> T {
    let mut rx = tx.subscribe();
    loop {
        if let Some(v) = rx.borrow_and_update().clone() {
            return v;
        }
        // The sender is borrowed by the caller, so it cannot be dropped.
        let _ = rx.changed().await;
    }
}

/// Keeps the events of an answered request flowing to its caller until it
/// drops ([`Peer::call_routed`]).
pub struct EventRoute {
    inner: Arc<Inner>,
    id: i64,
}

impl fmt::Debug for EventRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventRoute").field("id", &self.id).finish()
    }
}

impl EventRoute {
    /// The request's id (the progress token of an MCP `tools/call`).
    pub fn id(&self) -> i64 {
        self.id
    }
}

impl Drop for EventRoute {
    fn drop(&mut self) {
        self.inner.lock().routes.remove(&self.id);
    }
}

/// Removes a pending call when its caller stops waiting; if the call was
/// still unanswered, cancels it on the wire (when the protocol can).
struct PendingGuard {
    inner: Arc<Inner>,
    id: i64,
    reason: &'static str,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let abandoned = {
            let mut state = self.inner.lock();
            let abandoned = state.pending.remove(&self.id).is_some() && state.closed.is_none();
            if abandoned && self.inner.config.cancel.is_some() {
                // Forget old cancels (a contract expecting silence never
                // removes them) so the map stays bounded.
                state.cancelled.retain(|_, at| at.elapsed() < CANCEL_MEMORY);
                if state.cancelled.len() < MAX_CANCELLED {
                    state.cancelled.insert(self.id, std::time::Instant::now());
                }
            }
            abandoned
        };
        if !abandoned {
            return;
        }
        let protocol = &*self.inner.config.protocol;
        let Some(payload) = protocol.encode_cancel(self.id, self.reason) else {
            return;
        };
        let frame = frame(protocol, payload);
        let inner = self.inner.clone();
        let id = self.id;
        // Drop cannot wait; a cancel is control traffic and must not be shed.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = inner.out.send(frame, false).await;
                let Some(policy) = inner.config.cancel else {
                    return;
                };
                if policy.expects_ack {
                    tokio::time::sleep(policy.grace).await;
                    let still = inner.lock().cancelled.remove(&id).is_some();
                    if still {
                        inner.runaway(
                            id,
                            format!(
                                "request {id} was cancelled and not answered within {:?}",
                                policy.grace
                            ),
                        );
                    }
                }
            });
        }
    }
}

fn frame(protocol: &dyn Protocol, payload: Vec<u8>) -> Bytes {
    let mut buf = BytesMut::with_capacity(payload.len() + 32);
    plugd_wire::encode_frame(protocol.framing(), &payload, &mut buf);
    buf.freeze()
}

async fn read_loop<R: AsyncRead + Unpin>(inner: Arc<Inner>, reader: R, handler: Arc<dyn Handler>) {
    let plugin = inner.config.plugin.clone();
    let decoder = FrameDecoder::new(inner.config.protocol.framing(), inner.config.max_frame);
    let mut frames = FramedRead::with_capacity(reader, decoder, 64 * 1024);
    let end = loop {
        match frames.next().await {
            None => break "stdout closed".to_owned(),
            Some(Err(e)) => {
                tracing::error!(plugin = %plugin, error = %e, "unreadable output from plugin; connection dropped");
                break format!("unreadable output: {e}");
            }
            Some(Ok(Frame::Data(bytes))) => dispatch(&inner, &handler, &bytes),
            Some(Ok(Frame::Oversized { len, prefix })) => {
                inner.counters.oversized.fetch_add(1, Ordering::Relaxed);
                let limit = inner.config.max_frame;
                let answered = inner.config.protocol.sniff_id(&prefix).is_some_and(|id| {
                    inner.complete(id, |method| {
                        Err(CallError::FrameTooLarge {
                            plugin: plugin.clone(),
                            method: method.to_owned(),
                            len,
                            limit,
                        })
                    })
                });
                tracing::error!(plugin = %plugin, len, limit, failed_call = answered,
                    "plugin sent a frame over the size limit; it was skipped unread");
            }
        }
    };
    inner.reader_done.send_replace(Some(end));
}

fn dispatch(inner: &Arc<Inner>, handler: &Arc<dyn Handler>, bytes: &[u8]) {
    let plugin = &inner.config.plugin;
    match inner.config.protocol.decode(bytes) {
        Ok(Incoming::Response {
            id,
            raw_id,
            outcome,
        }) => {
            let known = id.is_some_and(|n| {
                inner.complete(n, |method| {
                    outcome.map_err(|error| CallError::Remote {
                        plugin: plugin.clone(),
                        method: method.to_owned(),
                        error: Box::new(error),
                    })
                })
            });
            let late = !known && id.is_some_and(|n| inner.after_cancel(n, true));
            if !known && !late {
                let n = inner.counters.unknown.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(plugin = %plugin, id = %raw_id, unknown_total = n,
                    "response with an unknown or already answered id; dropped");
            }
        }
        Ok(Incoming::Request { id, method, params }) => {
            let fut = handler.handle(Request {
                id: id.clone(),
                method,
                params,
                notifier: Notifier {
                    inner: Arc::downgrade(inner),
                },
            });
            let inner = inner.clone();
            tokio::spawn(async move {
                let outcome = fut.await;
                let protocol = &*inner.config.protocol;
                let frame = frame(protocol, protocol.encode_response(id, outcome));
                // Responses are never dropped: wait for room in the queue.
                let _ = inner.out.send(frame, inner.quiet()).await;
            });
        }
        Ok(Incoming::Notification { method, params }) => handler.notification(method, params),
        Ok(Incoming::Event { request_id, event }) => {
            let sink = {
                let state = inner.lock();
                match request_id {
                    Some(id) => state
                        .pending
                        .get(&id)
                        .and_then(|p| p.events.clone())
                        .or_else(|| state.routes.get(&id).cloned()),
                    None => {
                        let mut with_sink = state.pending.values().filter_map(|p| p.events.clone());
                        match (with_sink.next(), with_sink.next()) {
                            (Some(one), None) => Some(one),
                            _ => None,
                        }
                    }
                }
            };
            match sink {
                Some(sink) => {
                    let _ = sink.send(event);
                }
                None => {
                    let about_cancelled =
                        request_id.is_some_and(|id| inner.after_cancel(id, false));
                    if !about_cancelled {
                        tracing::debug!(plugin = %plugin, ?request_id, "event for no waiting call; dropped");
                    }
                }
            }
        }
        Err(e) => {
            let n = inner.counters.junk.fetch_add(1, Ordering::Relaxed) + 1;
            let preview = String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned();
            tracing::warn!(plugin = %plugin, error = %e, line = %preview, junk_total = n,
                "plugin wrote something that is not a valid frame on stdout; skipped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[test]
    fn sniffs_ids() {
        assert_eq!(
            crate::protocol::sniff_jsonrpc_id(br#"{"jsonrpc":"2.0","id": 42,"result":"xxxx"#),
            Some(42)
        );
        use crate::protocol::sniff_jsonrpc_id as sniff_id;
        assert_eq!(sniff_id(br#"{"id":-3,"#), Some(-3));
        assert_eq!(sniff_id(br#"{"jsonrpc":"2.0","result":"aaaa"#), None);
        assert_eq!(sniff_id(br#"{"id":"str""#), None);
    }

    /// A child written against the in-memory transport: answers `echo`,
    /// never answers `hang`, asks the host `slow` and `fast` concurrently.
    async fn fake_child(io: tokio::io::DuplexStream) {
        let (r, mut w) = tokio::io::split(io);
        let mut lines = BufReader::new(r).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["method"] == "echo" {
                let reply = json!({"jsonrpc":"2.0","id":v["id"],"result":v["params"]});
                w.write_all(format!("{reply}\n").as_bytes()).await.unwrap();
            }
        }
    }

    #[tokio::test]
    async fn call_and_timeout_and_pending_cleanup() {
        let (peer, child) = Peer::memory(PeerConfig::new("t", Framing::Lines), Arc::new(NoHandler));
        tokio::spawn(fake_child(child));
        let got = peer
            .call("echo", Some(json!({"x":1})), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got, json!({"x":1}));
        let err = peer
            .call("hang", None, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CallError::Timeout { ref method, .. } if method == "hang"),
            "{err}"
        );
        assert_eq!(
            peer.pending_calls(),
            0,
            "a caller that gives up removes its entry"
        );
        // Ids are unique and increasing.
        let a = peer
            .call("hang", None, Duration::from_millis(1))
            .await
            .unwrap_err();
        let b = peer
            .call("hang", None, Duration::from_millis(1))
            .await
            .unwrap_err();
        match (a, b) {
            (CallError::Timeout { id: ia, .. }, CallError::Timeout { id: ib, .. }) => {
                assert!(ib > ia)
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn close_fails_pending_calls_with_the_reason() {
        let (peer, _child) =
            Peer::memory(PeerConfig::new("t", Framing::Lines), Arc::new(NoHandler));
        let p2 = peer.clone();
        let call = tokio::spawn(async move { p2.call("x", None, Duration::from_secs(30)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        peer.close(Closed {
            plugin: "t".into(),
            cause: "exit status 3".into(),
            stderr_tail: vec!["boom".into()],
            expected: false,
        });
        let err = call.await.unwrap().unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("crashed: exit status 3") && text.contains("boom"),
            "{text}"
        );
        // Later calls fail at once.
        let err = peer
            .call("x", None, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Closed(_)));
    }

    #[tokio::test]
    async fn notifications_are_shed_when_the_queue_is_full() {
        let mut config = PeerConfig::new("t", Framing::Lines);
        config.queue_depth = 4;
        // The child never reads, and the duplex buffer is small: the writer blocks.
        let (host, _child) = tokio::io::duplex(64);
        let (r, w) = tokio::io::split(host);
        let peer = Peer::start(config, r, w, Arc::new(NoHandler));
        let mut sent = 0;
        for _ in 0..100 {
            if peer.notify("broker.event", Some(json!({"pad": "x".repeat(100)}))) {
                sent += 1;
            }
            tokio::task::yield_now().await;
        }
        let shed = peer.stats().shed_notifications;
        assert!(shed > 0, "some notifications must be shed");
        assert_eq!(
            sent + shed,
            100,
            "every notification is either queued or counted as shed"
        );
    }

    /// JSON-RPC lines whose `progress` notifications are events about the
    /// request named in `params.id`, and whose cancel is a `cancel` notification.
    struct Evented;
    impl Protocol for Evented {
        fn framing(&self) -> Framing {
            Framing::Lines
        }
        fn encode_request(&self, id: i64, method: &str, params: Option<Value>) -> Vec<u8> {
            JsonRpc::LINES.encode_request(id, method, params)
        }
        fn encode_notification(&self, method: &str, params: Option<Value>) -> Vec<u8> {
            JsonRpc::LINES.encode_notification(method, params)
        }
        fn encode_response(
            &self,
            id: plugd_wire::Id,
            outcome: Result<Value, ErrorObject>,
        ) -> Vec<u8> {
            JsonRpc::LINES.encode_response(id, outcome)
        }
        fn encode_cancel(&self, id: i64, reason: &str) -> Option<Vec<u8>> {
            Some(self.encode_notification("cancel", Some(json!({"id": id, "reason": reason}))))
        }
        fn decode(&self, bytes: &[u8]) -> Result<Incoming, String> {
            match crate::protocol::decode_jsonrpc(bytes)? {
                Incoming::Notification {
                    method,
                    params: Some(p),
                } if method == "progress" => Ok(Incoming::Event {
                    request_id: p["id"].as_i64(),
                    event: p,
                }),
                other => Ok(other),
            }
        }
    }

    fn evented(expects_ack: bool, killed: Arc<std::sync::Mutex<Vec<String>>>) -> PeerConfig {
        let mut config = PeerConfig::with_protocol("ev", Arc::new(Evented));
        config.cancel = Some(CancelPolicy {
            grace: Duration::from_millis(100),
            expects_ack,
        });
        config.on_runaway = Some(Arc::new(move |why| killed.lock().unwrap().push(why)));
        config
    }

    async fn read_json(
        lines: &mut tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    ) -> Value {
        serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn events_reach_the_caller_of_their_request() {
        let killed = Arc::default();
        let (peer, child) = Peer::memory(evented(true, killed), Arc::new(NoHandler));
        let (r, mut w) = tokio::io::split(child);
        let mut lines = BufReader::new(r).lines();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let p2 = peer.clone();
        let call = tokio::spawn(async move {
            p2.call_with("work", None, Duration::from_secs(5), Some(tx))
                .await
        });
        let req = read_json(&mut lines).await;
        let id = req["id"].as_i64().unwrap();
        for step in 1..=3 {
            let note =
                json!({"jsonrpc":"2.0","method":"progress","params":{"id": id, "step": step}});
            w.write_all(format!("{note}\n").as_bytes()).await.unwrap();
        }
        w.write_all(format!("{}\n", json!({"jsonrpc":"2.0","id": id,"result":"done"})).as_bytes())
            .await
            .unwrap();
        assert_eq!(call.await.unwrap().unwrap(), json!("done"));
        let steps: Vec<i64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e["step"].as_i64().unwrap())
            .collect();
        assert_eq!(steps, [1, 2, 3]);
    }

    #[tokio::test]
    async fn a_routed_call_keeps_its_events_until_the_route_drops() {
        let killed = Arc::default();
        let (peer, child) = Peer::memory(evented(false, killed), Arc::new(NoHandler));
        let (r, mut w) = tokio::io::split(child);
        let mut lines = BufReader::new(r).lines();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let p2 = peer.clone();
        let call = tokio::spawn(async move {
            p2.call_routed("work", None, Duration::from_secs(5), tx)
                .await
        });
        let req = read_json(&mut lines).await;
        let id = req["id"].as_i64().unwrap();
        let send = |v: Value| format!("{v}\n");
        // The answer first, then events naming the answered request.
        w.write_all(send(json!({"jsonrpc":"2.0","id": id,"result":"started"})).as_bytes())
            .await
            .unwrap();
        let (result, route) = call.await.unwrap().unwrap();
        assert_eq!((result, route.id()), (json!("started"), id));
        for step in 1..=2 {
            let note =
                json!({"jsonrpc":"2.0","method":"progress","params":{"id": id, "step": step}});
            w.write_all(send(note).as_bytes()).await.unwrap();
        }
        assert_eq!(rx.recv().await.unwrap()["step"], 1);
        assert_eq!(rx.recv().await.unwrap()["step"], 2);
        drop(route);
        let note = json!({"jsonrpc":"2.0","method":"progress","params":{"id": id, "step": 3}});
        w.write_all(send(note).as_bytes()).await.unwrap();
        // A ping after the event: once answered, the event was read.
        let ping = tokio::spawn({
            let peer = peer.clone();
            async move { peer.call("ping", None, Duration::from_secs(5)).await }
        });
        let req = read_json(&mut lines).await;
        w.write_all(send(json!({"jsonrpc":"2.0","id": req["id"],"result":{}})).as_bytes())
            .await
            .unwrap();
        ping.await.unwrap().unwrap();
        assert!(rx.recv().await.is_none(), "the route dropped its sink");
    }

    #[tokio::test]
    async fn a_cancel_that_is_never_acknowledged_is_a_runaway() {
        let killed: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (peer, child) = Peer::memory(evented(true, killed.clone()), Arc::new(NoHandler));
        let (r, _w) = tokio::io::split(child);
        let mut lines = BufReader::new(r).lines();
        let err = peer
            .call("work", None, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Timeout { .. }));
        let _request = read_json(&mut lines).await;
        let cancel = read_json(&mut lines).await;
        assert_eq!(cancel["method"], "cancel");
        assert_eq!(cancel["params"]["reason"], "deadline_exceeded");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let why = killed.lock().unwrap().clone();
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].contains("not answered"), "{why:?}");
    }

    #[tokio::test]
    async fn an_acknowledged_cancel_is_not_a_runaway() {
        let killed: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (peer, child) = Peer::memory(evented(true, killed.clone()), Arc::new(NoHandler));
        let (r, mut w) = tokio::io::split(child);
        let mut lines = BufReader::new(r).lines();
        let _ = peer
            .call("work", None, Duration::from_millis(50))
            .await
            .unwrap_err();
        let request = read_json(&mut lines).await;
        let _cancel = read_json(&mut lines).await;
        let ack = json!({"jsonrpc":"2.0","id": request["id"],"result":{"status":"cancelled"}});
        w.write_all(format!("{ack}\n").as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(killed.lock().unwrap().is_empty());
        assert_eq!(peer.runaway_request(), None);
        assert_eq!(
            peer.stats().unknown_ids,
            0,
            "a late answer to a cancelled call is expected, not unknown"
        );
    }

    #[tokio::test]
    async fn progress_after_a_cancel_and_its_grace_is_a_runaway_when_silence_is_expected() {
        let killed: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (peer, child) = Peer::memory(evented(false, killed.clone()), Arc::new(NoHandler));
        let (r, mut w) = tokio::io::split(child);
        let mut lines = BufReader::new(r).lines();
        let _ = peer
            .call("work", None, Duration::from_millis(50))
            .await
            .unwrap_err();
        let request = read_json(&mut lines).await;
        let id = request["id"].as_i64().unwrap();
        let note = json!({"jsonrpc":"2.0","method":"progress","params":{"id": id}});
        // Within the grace: tolerated.
        w.write_all(format!("{note}\n").as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(killed.lock().unwrap().is_empty());
        // After it: the plugin is still working on a cancelled request.
        tokio::time::sleep(Duration::from_millis(200)).await;
        w.write_all(format!("{note}\n").as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let why = killed.lock().unwrap().clone();
        assert!(why.iter().any(|w| w.contains("still active")), "{why:?}");
        assert_eq!(
            peer.runaway_request(),
            Some(id),
            "the peer names the call that ignored its cancel"
        );
    }

    struct SlowFast;
    impl Handler for SlowFast {
        fn request(&self, method: String, _params: Option<Value>) -> HandlerFuture {
            Box::pin(async move {
                if method == "slow" {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Ok(json!(method))
            })
        }
    }

    #[tokio::test]
    async fn child_requests_are_served_concurrently() {
        let (_peer, child) = Peer::memory(PeerConfig::new("t", Framing::Lines), Arc::new(SlowFast));
        let (r, mut w) = tokio::io::split(child);
        w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"slow\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"fast\"}\n")
            .await
            .unwrap();
        let mut lines = BufReader::new(r).lines();
        let first: Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(
            first["id"], 2,
            "the fast reply must not wait behind the slow one"
        );
        let second: Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(second["id"], 1);
    }
}
