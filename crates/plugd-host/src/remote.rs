//! Remote MCP servers under supervision: the Streamable HTTP pipe of
//! `plugd-mcp-http` stands where a child's stdin, stdout and stderr stand, so
//! the peer, the MCP dialect, deadlines, cancellation, restarts and the
//! crash report work for it unchanged.
//!
//! **Architecture invariant**: the supervisor starts either a child
//! ([`crate::spawn::spawn`]) or this pipe, and from then on does not know
//! which: [`Started`] is what both give it.

use std::sync::OnceLock;

use plugd_manifest::PluginSpec;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::launch::Launch;
use crate::spawn::{self, ProcessHandle, Reaper, SpawnError, SpawnSpec};

/// A started plugin, child or remote, as the supervisor uses it.
pub(crate) struct Started {
    pub reader: Box<dyn AsyncRead + Unpin + Send>,
    pub writer: Box<dyn AsyncWrite + Unpin + Send>,
    pub stderr: Box<dyn AsyncRead + Unpin + Send>,
    pub handle: ProcessHandle,
    pub exit: Exit,
}

/// How a started plugin's end is noticed.
pub(crate) enum Exit {
    /// The child's exit (reaped, with its group).
    Child(Reaper),
    /// The remote pipe's end, with its cause.
    Remote(tokio::sync::oneshot::Receiver<String>),
}

impl Exit {
    /// Waits for the end; the sentence the crash report gives as its cause.
    pub async fn wait(self, launch: &Launch) -> String {
        match self {
            Exit::Child(mut reaper) => {
                let status = reaper.wait().await;
                crate::sandbox::describe_exit(&status, &launch.containment)
            }
            Exit::Remote(rx) => rx
                .await
                .unwrap_or_else(|_| "the connection ended".to_owned()),
        }
    }
}

/// The HTTP client every remote server of this process shares.
fn client() -> Result<reqwest::Client, String> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(plugd_mcp_http::transport::http_client)
        .clone()
}

/// Starts `run` (a remote MCP server when its spec says so, else a child).
pub(crate) fn start(
    run: &PluginSpec,
    launch: &Launch,
    max_frame: usize,
) -> Result<Started, SpawnError> {
    if let Some(mcp) = run.mcp.as_ref().filter(|m| m.is_remote()) {
        return start_remote(run, mcp, launch, max_frame);
    }
    let spawned = spawn::spawn(&SpawnSpec {
        plugin_id: run.id.clone(),
        program: run.command.program.clone(),
        args: run.command.args.clone(),
        cwd: run.dir.clone(),
        env: run.command.env.clone(),
        containment: launch.containment.clone(),
    })?;
    Ok(Started {
        reader: Box::new(spawned.stdout),
        writer: Box::new(spawned.stdin),
        stderr: Box::new(spawned.stderr),
        handle: spawned.handle,
        exit: Exit::Child(spawned.reaper),
    })
}

fn start_remote(
    run: &PluginSpec,
    mcp: &plugd_manifest::mcp::McpSpec,
    launch: &Launch,
    max_frame: usize,
) -> Result<Started, SpawnError> {
    let fail = |message: String| SpawnError::Remote {
        plugin: run.id.clone(),
        message,
    };
    let url = mcp.url.as_deref().unwrap_or_default();
    let url =
        reqwest::Url::parse(url).map_err(|e| fail(format!("url {url:?} is not usable: {e}")))?;
    let mut headers = reqwest::header::HeaderMap::new();
    let remote = launch.remote.clone().unwrap_or_default();
    for (k, v) in &remote.headers {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| fail(format!("header {k:?} is not a valid name")))?;
        let mut value = reqwest::header::HeaderValue::from_str(v).map_err(|_| {
            fail(format!(
                "the value of header {k:?} (after filling in its secrets) is not a valid header value"
            ))
        })?;
        value.set_sensitive(true);
        headers.append(name, value);
    }
    let http = client().map_err(fail)?;
    let pipe = plugd_mcp_http::connect(plugd_mcp_http::Remote {
        server: run.id.clone(),
        url,
        headers,
        credentials: remote.credentials.clone(),
        max_frame,
        http,
    });
    Ok(Started {
        reader: Box::new(pipe.reader),
        writer: Box::new(pipe.writer),
        stderr: Box::new(pipe.diagnostics),
        handle: ProcessHandle::in_process(pipe.control),
        exit: Exit::Remote(pipe.ended),
    })
}
