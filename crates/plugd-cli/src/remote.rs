//! The CLI's way to a running `plugd serve`: serve records its pid and where
//! it listens in `.plugd/serve.json`, and CLI commands that change what serve
//! runs (`plugd plugin approve|revoke|restart`, `config`, `bus`, `approvals`)
//! talk to its HTTP API over the workspace socket `.plugd/serve.sock`, where
//! serve knows them by their uid: no token, no extra step.
//!
//! **Never beside serve**: the commands that act on what serve runs
//! (`plugd tool call`, `plugd plugin approve|revoke|restart|start|stop`,
//! `plugd mcp`) use [`Remote::running`]: when serve holds the workspace's
//! lock and its recorded pid is alive, they go through it, and when it does
//! not answer within [`ANSWER_TIMEOUT`] they fail naming its pid; they never
//! act in a second process, which would start a second copy of a plugin or
//! change an approval under a serve that keeps the old one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plugd_runtime::serve_record::{SOCKET_FILE, ServeRecord, pid_alive, read_record};
use serde_json::{Value, json};

/// How long the CLI waits for a recorded serve to answer `GET /v1/plugins`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the commands that must not act beside serve wait for it to
/// answer `GET /healthz` before they fail naming its pid.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one plugin action may take in serve (an approval handshakes, up
/// to 30 s).
const ACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// Why recording or reaching a serve failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client to reach plugd serve: {0}")]
    Client(#[source] reqwest::Error),
    /// The request did not get an answer.
    #[error("plugd serve (pid {pid}, {}) did not answer {what}: {source}", socket.display())]
    Transport {
        /// Serve's pid.
        pid: u32,
        /// Its socket.
        socket: PathBuf,
        /// The request.
        what: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// Serve runs on the workspace but does not answer.
    #[error(
        "plugd serve (pid {pid}) runs on this workspace but did not answer on {} within {} s; nothing was done (acting beside it would run a second copy of its plugins or change approvals under it); check that serve is healthy (`kill -CONT {pid}` if it was stopped) or stop it, then run the command again",
        socket.display(), waited.as_secs()
    )]
    NotAnswering {
        /// Serve's pid.
        pid: u32,
        /// Its socket.
        socket: PathBuf,
        /// How long the CLI waited.
        waited: Duration,
    },
    /// Serve holds the workspace's lock but has not recorded where it
    /// listens yet (it is starting).
    #[error(
        "plugd serve ({holder}) holds this workspace's lock but is not serving yet; nothing was done; wait until it has started, then run the command again"
    )]
    Starting {
        /// `pid N`, as the lock file says.
        holder: String,
    },
    /// Serve answered with an API error.
    #[error("plugd serve (pid {pid}) refused {what}: {message} ({code}, HTTP {status})")]
    Api {
        /// Serve's pid.
        pid: u32,
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The error code.
        code: String,
        /// The error message.
        message: String,
    },
}

/// Who holds the workspace's serve lock (`.plugd/serve.lock`, see
/// `serve_lock`): `Some("pid N")` while a serve runs, `None` otherwise.
fn serve_lock_holder(workspace: &Path) -> Option<String> {
    use std::io::Read as _;
    let path = workspace
        .join(".plugd")
        .join(plugd_runtime::serve_lock::SERVE_LOCK_FILE);
    let mut file = std::fs::File::open(path).ok()?;
    match file.try_lock_shared() {
        Ok(()) => None,
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            Some(match text.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}"),
                Err(_) => "pid not recorded yet".to_owned(),
            })
        }
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

/// A live `plugd serve` of this workspace.
#[derive(Debug)]
pub struct Remote {
    record: ServeRecord,
    client: reqwest::Client,
}

/// A client that reaches serve through `socket`; `timeout` bounds each
/// request (`None`: no bound, for streams).
fn client(socket: &Path, timeout: Option<Duration>) -> Result<reqwest::Client, RemoteError> {
    // reqwest is built with rustls and no provider; plain HTTP never uses it,
    // but building a client needs one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .unix_socket(socket.to_owned());
    if let Some(t) = timeout {
        b = b.timeout(t);
    }
    b.build().map_err(RemoteError::Client)
}

/// Where the workspace's serve socket is.
pub fn socket_path(workspace: &Path) -> PathBuf {
    workspace.join(".plugd").join(SOCKET_FILE)
}

/// The origin requests over the socket are addressed to (the socket decides
/// where they go; serve does not check `Host` there).
const SOCKET_ORIGIN: &str = "http://localhost";

impl Remote {
    /// The serve recorded in `workspace`'s `.plugd/serve.json` if its pid is
    /// alive and `GET /healthz` answers on the workspace socket within 1 s;
    /// `None` otherwise (no record, a stale one, or nothing answering).
    pub async fn find(workspace: &Path) -> Option<Remote> {
        let record = read_record(workspace)?;
        if !pid_alive(record.pid) {
            return None;
        }
        let socket = socket_path(workspace);
        let probe = client(&socket, Some(PROBE_TIMEOUT)).ok()?;
        let answered = probe
            .get(format!("{SOCKET_ORIGIN}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if !answered {
            tracing::debug!(pid = record.pid, socket = %socket.display(), "recorded plugd serve does not answer; acting locally");
            return None;
        }
        let client = client(&socket, Some(ACTION_TIMEOUT)).ok()?;
        Some(Remote {
            record: ServeRecord { socket, ..record },
            client,
        })
    }

    /// The serve of `workspace` when one runs (it holds the serve lock and
    /// its recorded pid is alive) and answers `GET /healthz` within
    /// [`ANSWER_TIMEOUT`]; `Ok(None)` when none runs; an error naming its
    /// pid when one runs and does not answer (see the module docs).
    pub async fn running(workspace: &Path) -> Result<Option<Remote>, RemoteError> {
        let holder = serve_lock_holder(workspace);
        let record = read_record(workspace).filter(|r| pid_alive(r.pid));
        let record = match (record, holder) {
            (Some(r), Some(_)) => r,
            (None, Some(holder)) => return Err(RemoteError::Starting { holder }),
            // No lock held: no serve, whatever a stale record says.
            (_, None) => return Ok(None),
        };
        let socket = socket_path(workspace);
        let not_answering = || RemoteError::NotAnswering {
            pid: record.pid,
            socket: socket.clone(),
            waited: ANSWER_TIMEOUT,
        };
        let probe = client(&socket, Some(ANSWER_TIMEOUT))?;
        let answered = probe
            .get(format!("{SOCKET_ORIGIN}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if !answered {
            return Err(not_answering());
        }
        let client = client(&socket, Some(ACTION_TIMEOUT))?;
        Ok(Some(Remote {
            record: ServeRecord {
                socket: socket.clone(),
                ..record
            },
            client,
        }))
    }

    /// A client of serve's socket without a deadline (calls that wait on
    /// approvals, MCP streams).
    pub fn unbounded_client(&self) -> Result<reqwest::Client, RemoteError> {
        client(&self.record.socket, None)
    }

    /// The URL of `path` over serve's socket.
    pub fn url(&self, path: &str) -> String {
        format!("{SOCKET_ORIGIN}{path}")
    }

    /// `POST path` with a JSON `body`, answered as server-sent events:
    /// calls `on_event` with each event's name and data until the stream
    /// ends. No deadline (a call may wait on an approval). An answer that
    /// is not a stream is serve's API error.
    pub async fn post_sse(
        &self,
        path: &str,
        body: &Value,
        what: String,
        mut on_event: impl FnMut(&str, &str),
    ) -> Result<(), RemoteError> {
        let client = self.unbounded_client()?;
        let transport = self.transport(&what);
        let mut resp = client
            .post(self.url(path))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .body(body.to_string())
            .send()
            .await
            .map_err(&transport)?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.bytes().await.map_err(&transport)?;
            return Err(self.api_error(what, status.as_u16(), &bytes));
        }
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(&transport)? {
            buf.extend_from_slice(&chunk);
            while let Some((event, data)) = next_event(&mut buf) {
                on_event(&event, &data);
            }
        }
        Ok(())
    }

    /// The serving process's pid.
    pub fn pid(&self) -> u32 {
        self.record.pid
    }

    /// The TCP address serve listens on (`--listen`), if any.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.record.addr
    }

    /// `POST /v1/plugins/{id}:{action}`; the plugin row serve answers
    /// (serve records this user as who did it).
    pub async fn plugin_action(&self, id: &str, action: &str) -> Result<Value, RemoteError> {
        self.post(
            &format!("/v1/plugins/{id}:{action}"),
            &json!({}),
            format!("plugin {action} {id}"),
        )
        .await
    }

    fn transport(&self, what: &str) -> impl Fn(reqwest::Error) -> RemoteError + '_ {
        let what = what.to_owned();
        move |source| RemoteError::Transport {
            pid: self.record.pid,
            socket: self.record.socket.clone(),
            what: what.clone(),
            source,
        }
    }

    fn api_error(&self, what: String, status: u16, bytes: &[u8]) -> RemoteError {
        let v: Value = serde_json::from_slice(bytes).unwrap_or_else(
            |_| json!({"error": {"code": "internal", "message": String::from_utf8_lossy(bytes)}}),
        );
        let text = |k: &str| v["error"][k].as_str().unwrap_or("(no message)").to_owned();
        RemoteError::Api {
            pid: self.record.pid,
            what,
            status,
            code: text("code"),
            message: text("message"),
        }
    }

    /// `POST path` with a JSON `body`; serve's JSON answer. `what` names the
    /// request in errors.
    pub async fn post(&self, path: &str, body: &Value, what: String) -> Result<Value, RemoteError> {
        let request = self
            .client
            .post(format!("{SOCKET_ORIGIN}{path}"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        self.json(request, what).await
    }

    /// `GET path`; serve's JSON answer. `what` names the request in errors.
    pub async fn get(&self, path: &str, what: String) -> Result<Value, RemoteError> {
        let request = self.client.get(format!("{SOCKET_ORIGIN}{path}"));
        self.json(request, what).await
    }

    /// Sends `request`; a success's JSON body, or serve's API error.
    async fn json(
        &self,
        request: reqwest::RequestBuilder,
        what: String,
    ) -> Result<Value, RemoteError> {
        let transport = self.transport(&what);
        let resp = request.send().await.map_err(&transport)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(&transport)?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|_| self.api_error(what, status.as_u16(), &bytes));
        }
        Err(self.api_error(what, status.as_u16(), &bytes))
    }

    /// `GET path` as server-sent events: calls `on_data` with the `data` of
    /// each event until it returns `false` or the stream ends. Waits without
    /// a deadline (a tail is meant to run until stopped).
    pub async fn sse(
        &self,
        path: &str,
        what: String,
        mut on_data: impl FnMut(&str) -> bool,
    ) -> Result<(), RemoteError> {
        let client = client(&self.record.socket, None)?;
        let transport = self.transport(&what);
        let mut resp = client
            .get(format!("{SOCKET_ORIGIN}{path}"))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(&transport)?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.bytes().await.map_err(&transport)?;
            return Err(self.api_error(what, status.as_u16(), &bytes));
        }
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(&transport)? {
            buf.extend_from_slice(&chunk);
            while let Some((_, data)) = next_event(&mut buf) {
                if !on_data(&data) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The next whole server-sent event with data in `buf` (taken out of it):
/// its name (`message` when it has none) and its data lines joined; events
/// without data (keep-alives, priming events) are skipped.
pub fn next_event(buf: &mut Vec<u8>) -> Option<(String, String)> {
    loop {
        // A blank line ends an event (LF or CRLF line ends).
        let (end, sep) = match (
            buf.windows(2).position(|w| w == b"\n\n"),
            buf.windows(4).position(|w| w == b"\r\n\r\n"),
        ) {
            (Some(a), Some(b)) if b < a => (b, 4),
            (Some(a), _) => (a, 2),
            (None, Some(b)) => (b, 4),
            (None, None) => return None,
        };
        let block: Vec<u8> = buf.drain(..end + sep).collect();
        let text = String::from_utf8_lossy(&block);
        let mut event = "message".to_owned();
        let mut data = Vec::new();
        for line in text.lines() {
            if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d).to_owned());
            } else if let Some(e) = line.strip_prefix("event:") {
                event = e.trim().to_owned();
            }
        }
        if !data.is_empty() {
            return Some((event, data.join("\n")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_named_and_keep_alives_skipped() {
        let mut buf = b": keep-alive\n\nevent: progress\ndata: {\"a\":1}\n\nid: 7\ndata: x\r\ndata: y\r\n\r\ndata: part".to_vec();
        assert_eq!(
            next_event(&mut buf),
            Some(("progress".into(), "{\"a\":1}".into()))
        );
        assert_eq!(
            next_event(&mut buf),
            Some(("message".into(), "x\ny".into()))
        );
        assert_eq!(next_event(&mut buf), None);
        assert_eq!(buf, b"data: part");
    }
}
