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

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The file `plugd serve` writes under the workspace's `.plugd/`.
pub const SERVE_FILE: &str = "serve.json";

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
    /// `.plugd/serve.json` could not be written.
    #[error("cannot record the serving address in {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
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

/// What `.plugd/serve.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServeRecord {
    /// The serving process.
    pub pid: u32,
    /// Its Unix socket (what the CLI uses).
    pub socket: PathBuf,
    /// Its TCP address, with `--listen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<SocketAddr>,
    /// When it started (RFC 3339).
    pub started_at: String,
}

fn serve_file(workspace: &Path) -> PathBuf {
    workspace.join(".plugd").join(SERVE_FILE)
}

fn pid_alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

fn read_record(workspace: &Path) -> Option<ServeRecord> {
    let text = std::fs::read_to_string(serve_file(workspace)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Who holds the workspace's serve lock (`.plugd/serve.lock`, see
/// `serve_lock`): `Some("pid N")` while a serve runs, `None` otherwise.
fn serve_lock_holder(workspace: &Path) -> Option<String> {
    use std::io::Read as _;
    let path = workspace
        .join(".plugd")
        .join(crate::serve_lock::SERVE_LOCK_FILE);
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

/// `.plugd/serve.json` for as long as it lives: written atomically (mode
/// 0600) by [`ServeFile::write`], removed on drop if it is still this
/// process's record.
#[derive(Debug)]
pub struct ServeFile {
    path: PathBuf,
    pid: u32,
}

impl ServeFile {
    /// Records `socket` and `addr` for this process, replacing any earlier
    /// record (a stale one of a dead serve, or a live serve's, which is
    /// warned about).
    pub fn write(
        workspace: &Path,
        socket: &Path,
        addr: Option<SocketAddr>,
    ) -> Result<ServeFile, RemoteError> {
        let path = serve_file(workspace);
        let pid = std::process::id();
        if let Some(old) = read_record(workspace)
            && old.pid != pid
            && pid_alive(old.pid)
        {
            tracing::warn!(
                pid = old.pid,
                "another plugd serve seems to run on this workspace; CLI plugin commands now reach this one"
            );
        }
        let record = ServeRecord {
            pid,
            socket: socket.to_owned(),
            addr,
            started_at: plugd_store::now_rfc3339(),
        };
        let err = |source| RemoteError::Write {
            path: path.clone(),
            source,
        };
        let dir = path.parent().unwrap_or(workspace);
        std::fs::create_dir_all(dir).map_err(err)?;
        // A temporary file is created 0600; the rename makes it appear whole.
        let mut tmp = tempfile::Builder::new()
            .prefix(".serve.json.")
            .tempfile_in(dir)
            .map_err(err)?;
        let text = serde_json::to_string(&record).map_err(|e| err(e.into()))?;
        tmp.write_all(text.as_bytes()).map_err(err)?;
        tmp.as_file().sync_all().map_err(err)?;
        tmp.persist(&path).map_err(|e| err(e.error))?;
        Ok(ServeFile { path, pid })
    }
}

impl Drop for ServeFile {
    fn drop(&mut self) {
        let ours = std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| serde_json::from_str::<ServeRecord>(&t).ok())
            .is_some_and(|r| r.pid == self.pid);
        if ours && let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), "cannot remove the serve record: {e}");
        }
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
    workspace
        .join(".plugd")
        .join(plugd_server::listen::SOCKET_FILE)
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
