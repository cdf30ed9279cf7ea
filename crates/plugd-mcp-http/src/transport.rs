//! Streamable HTTP (MCP 2025-03-26 and later) as a line pipe: what the host
//! writes is POSTed, what the server answers (JSON or SSE), and what it sends
//! on the GET stream, comes back one message per line.
//!
//! Per the transport spec: every message is a POST with `Accept:
//! application/json, text/event-stream`; the `Mcp-Session-Id` the server
//! gives with the `initialize` answer goes on every later request, with
//! `MCP-Protocol-Version` (a stateless 2026-07-28 request, which has no
//! session, sends the revision of its `_meta` there, with `Mcp-Method` and
//! `Mcp-Name`); a `404` on a request carrying the session means
//! the session is gone (the pipe ends, so the supervisor starts a new one);
//! another `4xx` whose body is a JSON-RPC error (2026-07-28's refusals:
//! `-32022`, `-32601`, `-32020`) is that request's error reply;
//! an SSE response that ends before the request's answer is resumed with
//! `GET` + `Last-Event-ID` after the server's `retry` delay; the GET stream
//! (server-initiated messages) is opened after `notifications/initialized`,
//! resumed the same way, and not retried after `405`; a graceful end sends
//! `DELETE` with the session.
//!
//! Bounded everywhere: a JSON reply or one SSE event over the frame limit
//! fails that request (the server is named with the cause), at most
//! [`MAX_IN_FLIGHT`] requests are outstanding, resumption gives up after
//! [`MAX_RESUMES`] attempts without progress, and a request whose call was
//! cancelled is dropped after [`CANCEL_GRACE`] if the server keeps its
//! stream open.
//!
//! **Why one file** (~940 product lines): the Streamable HTTP pipe is one
//! state machine over one `Shared` (session id, protocol version, in-flight
//! bound, resumption): POST, SSE reading, resumption with `Last-Event-ID`,
//! the GET stream and `DELETE` each read and change that state, and the
//! spec's rules tie them together (a `404` ends the pipe, the GET stream
//! opens after `notifications/initialized`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Response, StatusCode, Url};
use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::sync::CancellationToken;

/// Most requests outstanding at once on one server.
pub const MAX_IN_FLIGHT: usize = 256;
/// Resumption attempts of one stream in a row that bring nothing new.
pub const MAX_RESUMES: u32 = 5;
/// How long a cancelled request's stream may stay open before it is dropped.
pub const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// Reconnection delay when the server gives none (`retry`).
pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// Longest reconnection delay plugd honours (a larger `retry` is cut).
pub const MAX_RETRY: Duration = Duration::from_secs(30);
/// How long the first requests wait for the GET stream to be answered.
pub const GET_READY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the `DELETE` of a session may take at the end.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
/// JSON-RPC error code of a request the transport could not deliver.
pub const TRANSPORT_ERROR: i64 = -32000;

/// Bearer tokens for a server that wants them (OAuth, see
/// [`crate::oauth::OAuthCredentials`]).
pub trait Credentials: Send + Sync + 'static {
    /// The token to send now, refreshed first when it has expired; `None`
    /// when there is none (the request goes without `Authorization`).
    fn token(&self) -> BoxFuture<'_, Result<Option<String>, String>>;
    /// The server refused `rejected` (`401`): a new token, or why there is
    /// none (the sentence says what the operator should run).
    fn refresh(&self, rejected: Option<String>) -> BoxFuture<'_, Result<String, String>>;
}

/// One remote MCP server.
#[derive(Clone)]
pub struct Remote {
    /// The plugin id (`.mcp.json` key), for messages.
    pub server: String,
    /// The MCP endpoint.
    pub url: Url,
    /// Headers sent with every request (`.mcp.json` `headers`, secrets
    /// already filled in).
    pub headers: HeaderMap,
    /// Bearer tokens, when the server is authorized with OAuth.
    pub credentials: Option<Arc<dyn Credentials>>,
    /// Largest message accepted, in bytes (the host's frame limit).
    pub max_frame: usize,
    /// The HTTP client (shared by every remote server of a host).
    pub http: reqwest::Client,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("server", &self.server)
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

/// A client for remote servers: HTTP/1.1, rustls, no redirects (a redirect
/// would carry the bearer token to another origin), a connect timeout.
pub fn http_client() -> Result<reqwest::Client, String> {
    // reqwest is built without a default crypto provider: plugd uses ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .tls_backend_rustls()
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// Stops a pipe: [`Control::terminate`] ends the session politely
/// (`DELETE`), [`Control::kill`] at once.
#[derive(Debug, Clone)]
pub struct Control {
    stop: CancellationToken,
    kill: CancellationToken,
}

impl Control {
    /// Ends the pipe after a `DELETE` of the session.
    pub fn terminate(&self) {
        self.stop.cancel();
    }

    /// Ends the pipe now, dropping every request in flight.
    pub fn kill(&self) {
        self.kill.cancel();
    }
}

/// A remote server as a pipe (see the module docs).
#[derive(Debug)]
pub struct Pipe {
    /// What the server sent: one JSON-RPC message per line.
    pub reader: DuplexStream,
    /// What to send: one JSON-RPC message per line.
    pub writer: DuplexStream,
    /// What happened on the wire, as text lines (the stderr of a local
    /// server: HTTP errors, reconnections).
    pub diagnostics: DuplexStream,
    /// Stops the pipe.
    pub control: Control,
    /// Resolves once the pipe has ended, with the cause.
    pub ended: oneshot::Receiver<String>,
}

/// Starts the pipe to `remote` (nothing is sent until the host writes).
pub fn connect(remote: Remote) -> Pipe {
    let (host_reader, server_out) = tokio::io::duplex(64 * 1024);
    let (host_writer, server_in) = tokio::io::duplex(64 * 1024);
    let (diag_reader, diag_out) = tokio::io::duplex(16 * 1024);
    let control = Control {
        stop: CancellationToken::new(),
        kill: CancellationToken::new(),
    };
    let (ended_tx, ended) = oneshot::channel();
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(64);
    let (diag_tx, diag_rx) = mpsc::channel::<String>(64);
    let (fatal_tx, fatal_rx) = mpsc::channel::<String>(1);
    let shared = Arc::new(Shared {
        remote,
        session: Mutex::new(None),
        version: Mutex::new(None),
        out: out_tx,
        diag: diag_tx,
        fatal: fatal_tx,
        in_flight: Mutex::new(HashMap::new()),
        permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        get_started: std::sync::atomic::AtomicBool::new(false),
        tasks: CancellationToken::new(),
    });
    tokio::spawn(forward(out_rx, server_out));
    tokio::spawn(forward_lines(diag_rx, diag_out));
    let ctl = control.clone();
    tokio::spawn(async move {
        let cause = run(shared.clone(), server_in, ctl, fatal_rx).await;
        shared.tasks.cancel();
        let _ = ended_tx.send(cause);
    });
    Pipe {
        reader: host_reader,
        writer: host_writer,
        diagnostics: diag_reader,
        control,
        ended,
    }
}

struct Shared {
    remote: Remote,
    session: Mutex<Option<HeaderValue>>,
    version: Mutex<Option<HeaderValue>>,
    /// Lines to the host.
    out: mpsc::Sender<Vec<u8>>,
    diag: mpsc::Sender<String>,
    /// The first fatal cause ends the pipe.
    fatal: mpsc::Sender<String>,
    /// Request id (as JSON text) → its task, for cancellation.
    in_flight: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    permits: Arc<Semaphore>,
    get_started: std::sync::atomic::AtomicBool,
    /// Cancelled when the pipe ends: every task stops.
    tasks: CancellationToken,
}

async fn forward(mut rx: mpsc::Receiver<Vec<u8>>, mut to: DuplexStream) {
    while let Some(line) = rx.recv().await {
        if to.write_all(&line).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

async fn forward_lines(mut rx: mpsc::Receiver<String>, mut to: DuplexStream) {
    while let Some(mut line) = rx.recv().await {
        line.push('\n');
        if to.write_all(line.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn run(
    shared: Arc<Shared>,
    input: DuplexStream,
    control: Control,
    mut fatal: mpsc::Receiver<String>,
) -> String {
    let mut lines = FramedRead::new(
        input,
        LinesCodec::new_with_max_length(shared.remote.max_frame.max(1024)),
    );
    // The initialize request is answered before anything else is sent: its
    // answer carries the session id every later request needs. Then
    // `notifications/initialized` is delivered before the requests that
    // follow it (servers may refuse requests of a session not yet
    // initialized), and the GET stream is opened before them too (up to
    // GET_READY_TIMEOUT).
    let mut init: Option<tokio::task::JoinHandle<()>> = None;
    let graceful = loop {
        if let Some(task) = init.as_mut() {
            tokio::select! {
                biased;
                () = control.kill.cancelled() => break false,
                () = control.stop.cancelled() => break true,
                Some(cause) = fatal.recv() => return cause,
                _ = task => { init = None; }
            }
            continue;
        }
        tokio::select! {
            biased;
            () = control.kill.cancelled() => break false,
            () = control.stop.cancelled() => break true,
            Some(cause) = fatal.recv() => return cause,
            line = lines.next() => match line {
                None => break true,
                Some(Err(e)) => return format!("the host wrote a message plugd cannot send: {e}"),
                Some(Ok(line)) => {
                    if let Some(task) = dispatch(&shared, line, &control).await {
                        init = Some(task);
                    }
                }
            }
        }
    };
    if !graceful {
        return "killed by the host".into();
    }
    shared.tasks.cancel();
    delete_session(&shared).await;
    "the host closed the connection".into()
}

/// Sends one line; returns the task of an `initialize` or a
/// `notifications/initialized`, which the loop waits for.
async fn dispatch(
    shared: &Arc<Shared>,
    line: String,
    control: &Control,
) -> Option<tokio::task::JoinHandle<()>> {
    let msg: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            diag(shared, format!("dropped a message that is not JSON: {e}"));
            return None;
        }
    };
    let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
    let id = msg.get("id").cloned().filter(|_| method.is_some());
    if method.as_deref() == Some("notifications/cancelled")
        && let Some(req) = msg.pointer("/params/requestId")
    {
        let key = req.to_string();
        let handle = lock(&shared.in_flight).get(&key).cloned();
        if let Some(handle) = handle {
            let tasks = shared.tasks.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(CANCEL_GRACE) => handle.abort(),
                    () = tasks.cancelled() => {}
                }
            });
        }
    }
    let initialized = method.as_deref() == Some("notifications/initialized");
    let is_init = method.as_deref() == Some("initialize");
    // Waiting for a free slot must not keep a stop or kill from the loop.
    let permit = tokio::select! {
        p = shared.permits.clone().acquire_owned() => p.ok()?,
        () = control.kill.cancelled() => return None,
        () = control.stop.cancelled() => return None,
    };
    let stateless = stateless_headers(&msg);
    let body = Bytes::from(line);
    let this = shared.clone();
    let key = id.as_ref().map(Value::to_string);
    let task_key = key.clone();
    let tasks = shared.tasks.clone();
    let task = tokio::spawn(async move {
        let key = task_key;
        let _permit = permit;
        tokio::select! {
            () = post(&this, body, id.clone(), is_init, &stateless) => {}
            () = tasks.cancelled() => {}
        }
        if let Some(key) = &key {
            lock(&this.in_flight).remove(key);
        }
        // The GET stream is open before the requests that follow: a server
        // may send its requests there (an elicitation during a call, say),
        // and one sent before the stream exists is lost.
        if initialized && let Some(ready) = start_get_stream(&this) {
            let _ = tokio::time::timeout(GET_READY_TIMEOUT, ready).await;
        }
    });
    if let Some(key) = key {
        lock(&shared.in_flight).insert(key, task.abort_handle());
    }
    (is_init || initialized).then_some(task)
}

/// The routing headers of a 2026-07-28 (stateless) request, which has no
/// session: `MCP-Protocol-Version` from the revision in its `_meta`,
/// `Mcp-Method`, and `Mcp-Name` for the methods that name something (a
/// value that is not plain visible ASCII goes as `=?base64?…?=`). Empty for
/// any other message.
fn stateless_headers(msg: &Value) -> HeaderMap {
    let mut h = HeaderMap::new();
    let Some(version) = msg
        .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
        .and_then(Value::as_str)
        .and_then(|v| HeaderValue::from_str(v).ok())
    else {
        return h;
    };
    let Some(method) = msg.get("method").and_then(Value::as_str) else {
        return h;
    };
    h.insert(HeaderName::from_static("mcp-protocol-version"), version);
    if let Ok(m) = HeaderValue::from_str(method) {
        h.insert(HeaderName::from_static("mcp-method"), m);
    }
    let name_key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return h,
    };
    if let Some(name) = msg
        .get("params")
        .and_then(|p| p.get(name_key))
        .and_then(Value::as_str)
    {
        let plain = !name.is_empty()
            && name.bytes().all(|b| (0x20..0x7f).contains(&b))
            && name.trim() == name
            && !(name.starts_with("=?base64?") && name.ends_with("?="));
        let value = if plain {
            name.to_owned()
        } else {
            format!("=?base64?{}?=", base64(name.as_bytes()))
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(HeaderName::from_static("mcp-name"), v);
        }
    }
    h
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn diag(shared: &Shared, line: String) {
    tracing::debug!(plugin = %shared.remote.server, "{line}");
    let _ = shared.diag.try_send(line);
}

/// The headers of every request after the static ones.
async fn request_headers(shared: &Shared, accept: &'static str) -> Result<HeaderMap, String> {
    let mut h = shared.remote.headers.clone();
    h.insert(header::ACCEPT, HeaderValue::from_static(accept));
    if let Some(s) = lock(&shared.session).clone() {
        h.insert(HeaderName::from_static("mcp-session-id"), s);
    }
    if let Some(v) = lock(&shared.version).clone() {
        h.insert(HeaderName::from_static("mcp-protocol-version"), v);
    }
    if let Some(c) = &shared.remote.credentials
        && let Some(token) = c.token().await?
    {
        h.insert(header::AUTHORIZATION, bearer(&token)?);
    }
    Ok(h)
}

fn bearer(token: &str) -> Result<HeaderValue, String> {
    let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| "the access token is not a valid header value".to_owned())?;
    v.set_sensitive(true);
    Ok(v)
}

/// What a `401`/`403` said in `WWW-Authenticate`, for the message.
fn challenge(resp: &Response) -> String {
    resp.headers()
        .get_all(header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(", ")
        .chars()
        .take(300)
        .collect()
}

/// Answers the host's request `id` with a transport error (a notification
/// or response that could not be sent is only reported).
async fn fail(shared: &Shared, id: Option<&Value>, message: String) {
    let message = format!(
        "MCP server {:?} ({}): {message}",
        shared.remote.server, shared.remote.url
    );
    diag(shared, message.clone());
    if let Some(id) = id {
        let reply = json!({"jsonrpc": "2.0", "id": id, "error": {"code": TRANSPORT_ERROR, "message": message}});
        let mut line = serde_json::to_vec(&reply).unwrap_or_default();
        line.push(b'\n');
        let _ = shared.out.send(line).await;
    }
}

async fn post(
    shared: &Arc<Shared>,
    body: Bytes,
    id: Option<Value>,
    is_init: bool,
    stateless: &HeaderMap,
) {
    let remote = &shared.remote;
    let mut refreshed = false;
    loop {
        let mut headers = match request_headers(shared, "application/json, text/event-stream").await
        {
            Ok(h) => h,
            Err(e) => return fail(shared, id.as_ref(), e).await,
        };
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.extend(stateless.clone());
        let sent_session = headers.contains_key("mcp-session-id");
        let resp = match remote
            .http
            .post(remote.url.clone())
            .headers(headers)
            .body(body.clone())
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                return fail(
                    shared,
                    id.as_ref(),
                    format!("cannot reach the server: {}", error_chain(&e)),
                )
                .await;
            }
        };
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED {
            match (&remote.credentials, refreshed) {
                (Some(c), false) => {
                    refreshed = true;
                    match c.refresh(None).await {
                        Ok(_) => continue,
                        Err(why) => return fail(shared, id.as_ref(), why).await,
                    }
                }
                _ => {
                    let why = format!(
                        "401 Unauthorized ({}); authorize plugd with `plugd mcp login {}`",
                        challenge(&resp),
                        remote.server
                    );
                    return fail(shared, id.as_ref(), why).await;
                }
            }
        }
        if status == StatusCode::FORBIDDEN {
            let why = format!(
                "403 Forbidden ({}); if the server needs more scopes, authorize again with `plugd mcp login {} --scope SCOPES`",
                challenge(&resp),
                remote.server
            );
            return fail(shared, id.as_ref(), why).await;
        }
        if status == StatusCode::NOT_FOUND && sent_session {
            let _ = shared.fatal.try_send(
                "the server ended the session (404); a new one is started on the next call".into(),
            );
            return fail(
                shared,
                id.as_ref(),
                "the server ended the session (404)".into(),
            )
            .await;
        }
        if !status.is_success() {
            // 2026-07-28 answers a refused request with a 4xx whose body is
            // its JSON-RPC error (-32022 with the supported versions,
            // -32601, -32020): that error is the reply, kept whole.
            if status.is_client_error() && id.is_some() && content_type(&resp) == "application/json"
            {
                let bytes = read_bounded(resp, 4096).await.unwrap_or_default();
                let is_error = serde_json::from_slice::<Value>(&bytes)
                    .is_ok_and(|v| v.get("error").is_some_and(Value::is_object));
                if is_error && deliver(shared, &bytes, id.as_ref(), false).await {
                    return;
                }
                let text: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
                return fail(shared, id.as_ref(), format!("HTTP {status}: {text}")).await;
            }
            let excerpt = excerpt(resp).await;
            return fail(shared, id.as_ref(), format!("HTTP {status}: {excerpt}")).await;
        }
        if is_init && let Some(s) = resp.headers().get("mcp-session-id") {
            if s.to_str()
                .is_ok_and(|s| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            {
                *lock(&shared.session) = Some(s.clone());
            } else {
                return fail(
                    shared,
                    id.as_ref(),
                    "the server gave a session id with characters outside visible ASCII".into(),
                )
                .await;
            }
        }
        if status == StatusCode::ACCEPTED || id.is_none() {
            return;
        }
        let kind = content_type(&resp);
        match kind.as_str() {
            "text/event-stream" => return read_stream(shared, resp, id.as_ref(), is_init).await,
            "application/json" => {
                let bytes = match read_bounded(resp, remote.max_frame).await {
                    Ok(b) => b,
                    Err(e) => return fail(shared, id.as_ref(), e).await,
                };
                let answered = deliver(shared, &bytes, id.as_ref(), is_init).await;
                if !answered {
                    fail(
                        shared,
                        id.as_ref(),
                        "the JSON reply did not answer the request".into(),
                    )
                    .await;
                }
                return;
            }
            other => {
                return fail(
                    shared,
                    id.as_ref(),
                    format!("the reply has content type {other:?}, expected application/json or text/event-stream"),
                )
                .await;
            }
        }
    }
}

fn content_type(resp: &Response) -> String {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

async fn excerpt(resp: Response) -> String {
    match read_bounded(resp, 4096).await {
        Ok(b) => String::from_utf8_lossy(&b)
            .chars()
            .take(300)
            .collect::<String>(),
        Err(_) => "(a body over 4 KiB)".into(),
    }
}

async fn read_bounded(resp: Response, max: usize) -> Result<Bytes, String> {
    let mut buf = BytesMut::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("the reply broke off: {}", error_chain(&e)))?;
        if buf.len() + chunk.len() > max {
            return Err(format!("the reply is over {max} bytes (the frame limit)"));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Hands each JSON-RPC message in `data` (one message or a batch) to the
/// host; `true` when one of them answers `id`.
async fn deliver(shared: &Shared, data: &[u8], id: Option<&Value>, is_init: bool) -> bool {
    let value: Value = match serde_json::from_slice(data) {
        Ok(v) => v,
        Err(e) => {
            diag(shared, format!("dropped a message that is not JSON: {e}"));
            return false;
        }
    };
    let items = match value {
        Value::Array(items) => items,
        one => vec![one],
    };
    let mut answered = false;
    for msg in items {
        if !msg.is_object() {
            diag(shared, "dropped a message that is not a JSON object".into());
            continue;
        }
        let is_answer = msg.get("method").is_none()
            && id.is_some_and(|id| msg.get("id") == Some(id))
            && (msg.get("result").is_some() || msg.get("error").is_some());
        if is_answer
            && is_init
            && let Some(v) = msg
                .pointer("/result/protocolVersion")
                .and_then(Value::as_str)
            && let Ok(v) = HeaderValue::from_str(v)
        {
            *lock(&shared.version) = Some(v);
        }
        answered |= is_answer;
        let mut line = match serde_json::to_vec(&msg) {
            Ok(l) => l,
            Err(_) => continue,
        };
        line.push(b'\n');
        if shared.out.send(line).await.is_err() {
            return answered;
        }
    }
    answered
}

/// What one SSE stream ended with.
struct StreamEnd {
    answered: bool,
    progressed: bool,
    error: Option<String>,
}

/// Reads SSE events from `resp` into the host, remembering the last event
/// id and the server's retry delay.
async fn consume(
    shared: &Shared,
    resp: Response,
    id: Option<&Value>,
    is_init: bool,
    last_id: &mut Option<String>,
    retry: &mut Duration,
) -> StreamEnd {
    let max = shared.remote.max_frame;
    let pending = Arc::new(AtomicUsize::new(0));
    let counter = pending.clone();
    let limit = max.saturating_add(1024 * 1024);
    let bytes = resp.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        if counter.fetch_add(chunk.len(), Ordering::Relaxed) + chunk.len() > limit {
            return Err(std::io::Error::other(format!(
                "an event is over {max} bytes (the frame limit)"
            )));
        }
        Ok(chunk)
    });
    let mut events = std::pin::pin!(sse_stream::SseByteStream::new(bytes));
    let mut end = StreamEnd {
        answered: false,
        progressed: false,
        error: None,
    };
    while let Some(event) = events.next().await {
        pending.store(0, Ordering::Relaxed);
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                end.error = Some(format!("the event stream broke off: {}", error_chain(&e)));
                break;
            }
        };
        if let Some(ms) = event.retry {
            *retry = Duration::from_millis(ms).min(MAX_RETRY);
        }
        if let Some(eid) = event.id.filter(|s| !s.is_empty()) {
            end.progressed |= last_id.as_deref() != Some(eid.as_str());
            *last_id = Some(eid);
        }
        let is_message = matches!(event.event.as_deref(), None | Some("message"));
        if let Some(data) = event.data.filter(|d| !d.trim().is_empty())
            && is_message
        {
            if data.len() > max {
                end.error = Some(format!("an event is over {max} bytes (the frame limit)"));
                break;
            }
            end.progressed = true;
            end.answered |= deliver(shared, data.as_bytes(), id, is_init).await;
            if end.answered && id.is_some() {
                break;
            }
        }
    }
    end
}

/// A request's SSE answer, resumed with `GET` + `Last-Event-ID` while the
/// server closes it before answering (SEP-1699 polling).
async fn read_stream(shared: &Arc<Shared>, resp: Response, id: Option<&Value>, is_init: bool) {
    let mut last_id: Option<String> = None;
    let mut retry = DEFAULT_RETRY;
    let mut resp = resp;
    let mut idle = 0;
    loop {
        let end = consume(shared, resp, id, is_init, &mut last_id, &mut retry).await;
        if end.answered {
            return;
        }
        if let Some(e) = &end.error
            && e.contains("frame limit")
        {
            return fail(shared, id, e.clone()).await;
        }
        idle = if end.progressed { 0 } else { idle + 1 };
        let Some(from) = last_id.clone() else {
            let why = end
                .error
                .unwrap_or_else(|| "the server closed the stream before answering".into());
            return fail(shared, id, why).await;
        };
        if idle >= MAX_RESUMES {
            return fail(
                shared,
                id,
                format!(
                    "the stream was resumed {MAX_RESUMES} times without anything new; giving up"
                ),
            )
            .await;
        }
        tokio::time::sleep(retry).await;
        resp = match resume(shared, &from).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return fail(
                    shared,
                    id,
                    "the server does not resume streams (GET answered 405)".into(),
                )
                .await;
            }
            Err(e) => return fail(shared, id, e).await,
        };
    }
}

/// `GET` with `Last-Event-ID`; `Ok(None)` when the server offers no GET.
async fn resume(shared: &Arc<Shared>, last_id: &str) -> Result<Option<Response>, String> {
    let mut refreshed = false;
    loop {
        let mut headers = request_headers(shared, "text/event-stream").await?;
        if !last_id.is_empty()
            && let Ok(v) = HeaderValue::from_str(last_id)
        {
            headers.insert(HeaderName::from_static("last-event-id"), v);
        }
        let sent_session = headers.contains_key("mcp-session-id");
        let resp = shared
            .remote
            .http
            .get(shared.remote.url.clone())
            .headers(headers)
            .send()
            .await
            .map_err(|e| format!("cannot reach the server: {}", error_chain(&e)))?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED
            && let (Some(c), false) = (&shared.remote.credentials, refreshed)
        {
            refreshed = true;
            c.refresh(None).await?;
            continue;
        }
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(None);
        }
        if status == StatusCode::NOT_FOUND && sent_session {
            let _ = shared
                .fatal
                .try_send("the server ended the session (404)".into());
            return Err("the server ended the session (404)".into());
        }
        if !status.is_success() {
            return Err(format!(
                "GET answered HTTP {status}: {}",
                excerpt(resp).await
            ));
        }
        if content_type(&resp) != "text/event-stream" {
            return Err("GET did not answer an event stream".into());
        }
        return Ok(Some(resp));
    }
}

/// Opens the GET stream once (after `notifications/initialized`); the
/// receiver resolves once the server has answered the first `GET` (or it
/// failed).
fn start_get_stream(shared: &Arc<Shared>) -> Option<oneshot::Receiver<()>> {
    if shared
        .get_started
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        return None;
    }
    let (ready_tx, ready) = oneshot::channel();
    let this = shared.clone();
    let tasks = shared.tasks.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = get_stream(&this, ready_tx) => {}
            () = tasks.cancelled() => {}
        }
    });
    Some(ready)
}

/// The server's own stream: kept open, resumed from the last event id, with
/// a growing delay while it fails; not retried once the server says `405`.
async fn get_stream(shared: &Arc<Shared>, ready: oneshot::Sender<()>) {
    let mut last_id: Option<String> = None;
    let mut retry = DEFAULT_RETRY;
    let mut failures: u32 = 0;
    let mut ready = Some(ready);
    loop {
        let opened = resume(shared, last_id.as_deref().unwrap_or("")).await;
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        match opened {
            Ok(None) => return,
            Ok(Some(resp)) => {
                let end = consume(shared, resp, None, false, &mut last_id, &mut retry).await;
                if end.progressed {
                    failures = 0;
                } else {
                    failures += 1;
                }
                if let Some(e) = end.error {
                    diag(shared, format!("GET stream: {e}"));
                }
            }
            Err(e) => {
                failures += 1;
                diag(shared, format!("GET stream: {e}"));
                if e.contains("(404)") {
                    return;
                }
            }
        }
        let backoff = retry.saturating_mul(1 << failures.min(5)).min(MAX_RETRY);
        tokio::time::sleep(backoff).await;
    }
}

async fn delete_session(shared: &Arc<Shared>) {
    if lock(&shared.session).is_none() {
        return;
    }
    let Ok(headers) = request_headers(shared, "application/json, text/event-stream").await else {
        return;
    };
    let req = shared
        .remote
        .http
        .delete(shared.remote.url.clone())
        .headers(headers)
        .send();
    match tokio::time::timeout(DELETE_TIMEOUT, req).await {
        Ok(Ok(r)) if r.status().is_success() || r.status() == StatusCode::METHOD_NOT_ALLOWED => {}
        Ok(Ok(r)) => diag(
            shared,
            format!("DELETE of the session answered HTTP {}", r.status()),
        ),
        Ok(Err(e)) => diag(
            shared,
            format!("DELETE of the session failed: {}", error_chain(&e)),
        ),
        Err(_) => diag(shared, "DELETE of the session timed out".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, BufReader};

    /// A server that accepts connections and never answers.
    async fn silent_server() -> (Url, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/mcp", listener.local_addr().unwrap())).unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        (url, task)
    }

    fn remote(url: Url) -> Remote {
        Remote {
            server: "silent".into(),
            url,
            headers: HeaderMap::new(),
            credentials: None,
            max_frame: 64 * 1024,
            http: http_client().unwrap(),
        }
    }

    #[tokio::test]
    async fn a_kill_ends_the_pipe_even_with_every_slot_taken_by_a_silent_server() {
        let (url, server) = silent_server().await;
        let mut pipe = connect(remote(url));
        // More requests than slots: the loop waits for a slot when killed.
        for id in 0..(MAX_IN_FLIGHT + 20) {
            let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/list\"}}\n");
            pipe.writer.write_all(line.as_bytes()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        pipe.control.kill();
        let cause = tokio::time::timeout(Duration::from_secs(5), &mut pipe.ended)
            .await
            .expect("the pipe ended in time")
            .unwrap();
        assert_eq!(cause, "killed by the host");
        server.abort();
    }

    #[tokio::test]
    async fn an_unreachable_server_fails_the_request_naming_it() {
        // A port nobody listens on.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = Url::parse(&format!("http://{}/mcp", listener.local_addr().unwrap())).unwrap();
        drop(listener);
        let mut pipe = connect(remote(url));
        pipe.writer
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\",\"params\":{}}\n")
            .await
            .unwrap();
        let mut lines = BufReader::new(&mut pipe.reader).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["code"], TRANSPORT_ERROR);
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with("MCP server \"silent\"") && msg.contains("cannot reach the server"),
            "{msg}"
        );
        pipe.control.terminate();
    }

    #[tokio::test]
    async fn lines_that_are_not_json_are_dropped_and_reported() {
        let (url, server) = silent_server().await;
        let mut pipe = connect(remote(url));
        pipe.writer.write_all(b"not json\n").await.unwrap();
        let mut diag = BufReader::new(&mut pipe.diagnostics).lines();
        let line = tokio::time::timeout(Duration::from_secs(5), diag.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(line.contains("not JSON"), "{line}");
        pipe.control.kill();
        server.abort();
    }

    /// A server that answers `initialize` with a session, takes its time
    /// over `notifications/initialized` and the GET stream (which it does
    /// not offer), and records the order of the methods it was sent.
    async fn recording_server() -> (Url, Arc<Mutex<Vec<String>>>) {
        use http_body_util::{BodyExt, Full};
        let seen = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/mcp", listener.local_addr().unwrap())).unwrap();
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let log = log.clone();
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        async move {
                            if req.method() == hyper::Method::GET {
                                // Slow to answer: the requests after it must wait.
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                lock(&log).push("GET".to_owned());
                                let resp = hyper::Response::builder()
                                    .status(405)
                                    .body(Full::new(Bytes::new()));
                                return Ok::<_, std::convert::Infallible>(resp.unwrap());
                            }
                            if req.method() != hyper::Method::POST {
                                let resp = hyper::Response::builder()
                                    .status(405)
                                    .body(Full::new(Bytes::new()));
                                return Ok::<_, std::convert::Infallible>(resp.unwrap());
                            }
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let msg: Value = serde_json::from_slice(&body).unwrap();
                            let method = msg["method"].as_str().unwrap_or_default().to_owned();
                            if method == "notifications/initialized" {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                            }
                            lock(&log).push(method.clone());
                            let resp = match msg.get("id") {
                                None => hyper::Response::builder()
                                    .status(202)
                                    .body(Full::new(Bytes::new())),
                                Some(id) => {
                                    let result = if method == "initialize" {
                                        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "t", "version": "1"}})
                                    } else {
                                        json!({"tools": []})
                                    };
                                    let answer =
                                        json!({"jsonrpc": "2.0", "id": id, "result": result});
                                    hyper::Response::builder()
                                        .header("content-type", "application/json")
                                        .header("mcp-session-id", "s1")
                                        .body(Full::new(Bytes::from(answer.to_string())))
                                }
                            };
                            Ok(resp.unwrap())
                        }
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn initialized_and_the_get_stream_come_before_the_requests_after_them() {
        let (url, seen) = recording_server().await;
        let mut pipe = connect(Remote {
            server: "t".into(),
            url,
            headers: HeaderMap::new(),
            credentials: None,
            max_frame: 1 << 20,
            http: http_client().unwrap(),
        });
        let lines = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ];
        for l in lines {
            pipe.writer
                .write_all(format!("{l}\n").as_bytes())
                .await
                .unwrap();
        }
        let mut replies = tokio::io::BufReader::new(pipe.reader).lines();
        for want in [1, 2] {
            let line = tokio::time::timeout(Duration::from_secs(10), replies.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let msg: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(msg["id"], want, "{line}");
        }
        assert_eq!(
            *lock(&seen),
            [
                "initialize",
                "notifications/initialized",
                "GET",
                "tools/list"
            ]
        );
        pipe.control.kill();
    }
}

#[cfg(test)]
mod stateless_tests {
    use super::*;

    #[test]
    fn a_stateless_request_routes_by_its_meta() {
        let msg = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "echo", "arguments": {},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        let h = stateless_headers(&msg);
        assert_eq!(h["mcp-protocol-version"], "2026-07-28");
        assert_eq!(h["mcp-method"], "tools/call");
        assert_eq!(h["mcp-name"], "echo");
        let msg = json!({"jsonrpc": "2.0", "id": 4, "method": "prompts/get", "params": {
            "name": "grüße ",
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        assert_eq!(
            stateless_headers(&msg)["mcp-name"],
            format!("=?base64?{}?=", base64("grüße ".as_bytes()))
        );
        // A request of a session-based revision carries no revision in
        // `_meta`: nothing is added.
        let msg = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"});
        assert!(stateless_headers(&msg).is_empty());
    }

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64("grüße".as_bytes()), "Z3LDvMOfZQ==");
    }
}
