//! `.plugd/serve.json`: where a running node records its pid and where it
//! listens, so the CLI's commands find it (`plugd-node` writes it with
//! [`ServeFile`]; the CLI reads it and reaches serve on [`SOCKET_FILE`]).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file `plugd serve` writes under the workspace's `.plugd/`.
pub const SERVE_FILE: &str = "serve.json";

/// serve's Unix socket under the workspace's `.plugd/` (the CLI's way in).
pub const SOCKET_FILE: &str = "serve.sock";

/// `.plugd/serve.json` could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot record the serving address in {path}: {source}")]
pub struct WriteError {
    /// The file.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
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

/// Where `workspace`'s record is.
pub fn serve_file(workspace: &Path) -> PathBuf {
    workspace.join(".plugd").join(SERVE_FILE)
}

/// Whether process `pid` exists.
pub fn pid_alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// The record of `workspace`, if there is a readable one (it may be stale).
pub fn read_record(workspace: &Path) -> Option<ServeRecord> {
    let text = std::fs::read_to_string(serve_file(workspace)).ok()?;
    serde_json::from_str(&text).ok()
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
    ) -> Result<ServeFile, WriteError> {
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
        let err = |source| WriteError {
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
