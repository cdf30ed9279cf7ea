//! `plugd mcp`: plugd's MCP gateway on stdio, the way MCP clients that spawn
//! their servers (Claude Desktop and Code, Cursor, Codex) run it.
//!
//! When `plugd serve` runs on the workspace, `plugd mcp` is only a bridge:
//! each message from stdin is posted to serve's gateway (`/mcp`, or
//! `/mcp/PROFILE`, Streamable HTTP over the workspace socket, as this
//! user), and what serve answers (JSON or the request's event stream) goes
//! to stdout, so the calls run in serve's plugin processes, under serve's
//! hooks, approvals and records; a serve that does not answer is an error
//! naming its pid. Without serve, the gateway runs in this process over the
//! workspace's approved plugins, with plugd.yaml's hooks and risk policy. A `high` or `critical` call is
//! put to the client's user through elicitation when the client supports
//! it (this process runs as the workspace owner, who may approve anything);
//! otherwise it waits as a pending approval that `plugd approvals approve
//! ID` decides from another terminal. Stdout carries only the protocol;
//! logs go to stderr.
//!
//! `plugd mcp login SERVER` authorizes plugd at a remote MCP server (OAuth
//! 2.1, authorization code with PKCE; see `plugd_mcp_http::oauth`): it
//! prints the authorization URL, waits for the browser's redirect to a
//! loopback port, and stores the tokens sealed; `plugd mcp logout SERVER`
//! forgets them. It may run before the server is approved (it fetches
//! metadata and tokens, runs nothing), and says first where it goes and
//! whether the entry is approved.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use plugd_gateway::{Caller, Gateway, stdio};
use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;
use serde_json::Value;

/// `plugd mcp` arguments.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct McpArgs {
    #[command(subcommand)]
    cmd: Option<McpCmd>,
    /// Serve only the tools of this profile (plugd.yaml `mcp.profiles.NAME`).
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
}

/// `plugd mcp login|logout`.
#[derive(Subcommand, Debug)]
pub enum McpCmd {
    /// Authorize plugd at a remote MCP server (OAuth 2.1 with PKCE); the tokens are stored sealed and refreshed.
    Login {
        /// The server's name in .mcp.json.
        server: String,
        /// Scopes to ask (space-separated) instead of the ones the server names.
        #[arg(long)]
        scope: Option<String>,
        /// How long to wait for the browser's redirect, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Store the grant as this user's own (the identity's name,
        /// `oidc:ISSUER-HOST/SUB`), used for that user's calls when
        /// plugd.yaml sets `mcp.servers.SERVER.upstream_auth.user_grants`.
        #[arg(long, value_name = "SUBJECT")]
        user: Option<String>,
    },
    /// Forget the tokens of a remote MCP server.
    Logout {
        /// The server's name in .mcp.json.
        server: String,
        /// Forget this user's own grant instead (`plugd mcp login --user`).
        #[arg(long, value_name = "SUBJECT")]
        user: Option<String>,
    },
}

/// Serves MCP on stdin/stdout until the client closes stdin; or logs in/out.
pub async fn run(rt: &Runtime, args: &McpArgs) -> Result<()> {
    match &args.cmd {
        Some(McpCmd::Login {
            server,
            scope,
            timeout,
            user,
        }) => return login(rt, server, scope.as_deref(), *timeout, user.as_deref()).await,
        Some(McpCmd::Logout { server, user }) => return logout(rt, server, user.as_deref()).await,
        None => {}
    }
    if let Some(serve) = crate::remote::Remote::running(rt.dir()).await? {
        return bridge(&serve, args.profile.as_deref()).await;
    }
    let config = PlugdConfig::load(rt.dir())?;
    rt.set_risk_config(config.risk.clone());
    // Installed in the runtime: every call of the gateway passes its tool hooks.
    let pipeline = plugd_agent::hooks::build::build_pipeline(&config, rt).await?;
    let gateway = Gateway::new(rt.clone(), Arc::new(config), env!("CARGO_PKG_VERSION"));
    let caller = Caller {
        name: plugd_store::users::user_name(rustix::process::geteuid().as_raw()),
        may_approve_critical: true,
        role: None,
        // The local user: a workspace identity (plugd mcp beside a serve
        // bridges to serve's /mcp, where a token decides).
        org: None,
        groups: Vec::new(),
    };
    let session = gateway.session(caller, args.profile.as_deref())?;
    // A changed plugin is stopped and its tools withheld (and clients told).
    let _watcher = rt.watch(plugd_runtime::watch::WatchOptions::from_env());
    tracing::info!(workspace = %rt.dir().display(), profile = ?args.profile, "plugd MCP gateway on stdio");
    let (input, output) = stdio::process_stdio();
    let served = stdio::serve(session, input, output).await;
    pipeline.cleanup().await;
    served?;
    Ok(())
}

/// The MCP session of a bridge: its id once `initialize` answered, and the
/// protocol revision it negotiated.
#[derive(Default)]
struct BridgeSession {
    id: Option<String>,
    version: Option<String>,
}

/// `plugd mcp` under serve: stdin's messages to serve's `/mcp`, its answers
/// to stdout, until stdin closes (see the module docs).
async fn bridge(serve: &crate::remote::Remote, profile: Option<&str>) -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let url = match profile {
        Some(p) => serve.url(&format!("/mcp/{p}")),
        None => serve.url("/mcp"),
    };
    let client = serve.unbounded_client()?;
    let pid = serve.pid();
    tracing::info!(pid, url, "plugd mcp bridges stdio to plugd serve's gateway");
    let (out, mut lines_out) = tokio::sync::mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines_out.recv().await {
            let ok = stdout.write_all(line.as_bytes()).await.is_ok()
                && stdout.write_all(b"\n").await.is_ok()
                && stdout.flush().await.is_ok();
            if !ok {
                break;
            }
        }
    });
    let session = Arc::new(tokio::sync::Mutex::new(BridgeSession::default()));
    let mut calls = tokio::task::JoinSet::new();
    let mut listen: Option<tokio::task::JoinHandle<()>> = None;
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = stdin.next_line().await? {
        let line = line.trim().to_owned();
        if line.is_empty() {
            continue;
        }
        let message: Option<Value> = serde_json::from_str(&line).ok();
        let is_initialize = message
            .as_ref()
            .is_some_and(|m| m["method"] == "initialize");
        let post = post_message(
            client.clone(),
            url.clone(),
            session.clone(),
            line,
            message,
            out.clone(),
            pid,
        );
        if is_initialize {
            // Later messages need its session id.
            post.await;
            if listen.is_none() {
                let sid = session.lock().await.id.clone();
                if let Some(sid) = sid {
                    listen = Some(tokio::spawn(listen_stream(
                        client.clone(),
                        url.clone(),
                        sid,
                        out.clone(),
                    )));
                }
            }
        } else {
            calls.spawn(post);
        }
    }
    while calls.join_next().await.is_some() {}
    if let Some(l) = listen {
        l.abort();
    }
    if let Some(sid) = session.lock().await.id.clone() {
        let _ = client
            .delete(&url)
            .header("mcp-session-id", sid)
            .send()
            .await;
    }
    drop(out);
    let _ = writer.await;
    Ok(())
}

/// Posts one client message and forwards serve's answer (a JSON message,
/// or each message of the request's event stream); a transport failure of
/// a request becomes its JSON-RPC error.
async fn post_message(
    client: reqwest::Client,
    url: String,
    session: Arc<tokio::sync::Mutex<BridgeSession>>,
    line: String,
    message: Option<Value>,
    out: tokio::sync::mpsc::UnboundedSender<String>,
    pid: u32,
) {
    let id = message
        .as_ref()
        .and_then(|m| m.get("id"))
        .filter(|_| message.as_ref().is_some_and(|m| m.get("method").is_some()))
        .cloned();
    let fail = |why: String| {
        tracing::warn!("{why}");
        if let Some(id) = &id {
            let e = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": why}});
            let _ = out.send(e.to_string());
        }
    };
    let mut request = client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(
            reqwest::header::ACCEPT,
            "application/json, text/event-stream",
        )
        .body(line);
    {
        let s = session.lock().await;
        if let Some(sid) = &s.id {
            request = request.header("mcp-session-id", sid);
        }
        if let Some(v) = &s.version {
            request = request.header("mcp-protocol-version", v);
        }
    }
    let mut resp = match request.send().await {
        Ok(r) => r,
        Err(e) => return fail(format!("plugd serve (pid {pid}) did not answer: {e}")),
    };
    if let Some(sid) = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        session.lock().await.id = Some(sid.to_owned());
    }
    let status = resp.status();
    if status == reqwest::StatusCode::ACCEPTED {
        return;
    }
    let stream = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if stream {
        let mut buf = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    buf.extend_from_slice(&chunk);
                    while let Some((_, data)) = crate::remote::next_event(&mut buf) {
                        let _ = out.send(data);
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    return fail(format!("plugd serve (pid {pid}) broke off its answer: {e}"));
                }
            }
        }
    }
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return fail(format!("plugd serve (pid {pid}) broke off its answer: {e}")),
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) if v.get("jsonrpc").is_some() || v.is_array() => {
            if let Some(version) = v["result"]["protocolVersion"].as_str() {
                session.lock().await.version = Some(version.to_owned());
            }
            let _ = out.send(v.to_string());
        }
        _ => fail(format!(
            "plugd serve (pid {pid}) answered HTTP {status}: {}",
            String::from_utf8_lossy(&bytes)
                .chars()
                .take(500)
                .collect::<String>()
        )),
    }
}

/// The session's own stream (`GET /mcp`): server notifications such as
/// `notifications/tools/list_changed`, forwarded until the bridge ends.
async fn listen_stream(
    client: reqwest::Client,
    url: String,
    sid: String,
    out: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let Ok(mut resp) = client
        .get(&url)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .header("mcp-session-id", sid)
        .send()
        .await
    else {
        return;
    };
    if !resp.status().is_success() {
        return;
    }
    let mut buf = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        buf.extend_from_slice(&chunk);
        while let Some((_, data)) = crate::remote::next_event(&mut buf) {
            let _ = out.send(data);
        }
    }
}

async fn login(
    rt: &Runtime,
    server: &str,
    scope: Option<&str>,
    timeout: u64,
    user: Option<&str>,
) -> Result<()> {
    let mut target = rt.mcp_login_target(server).await?;
    if let Some(s) = scope {
        target.settings.scope = Some(s.to_owned());
    }
    // A login may contact the server of an entry not approved (yet): say so first.
    let info = rt.plugin(server).await?;
    let caveat = if info.approved {
        String::new()
    } else {
        let why = match info.state.as_str() {
            "changed" => "changed since it was approved",
            _ => "not approved yet",
        };
        format!(
            " ({why}: login only fetches OAuth metadata and tokens; run `plugd plugin approve {server}` before it runs)"
        )
    };
    eprintln!("plugd: logging in to {server} at {}{caveat}", target.url);
    let pending = plugd_mcp_http::oauth::begin(&target.url, &target.settings)
        .await
        .with_context(|| {
            format!(
                "cannot authorize plugd at MCP server {server:?} ({})",
                target.url
            )
        })?;
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "To authorize plugd at MCP server {server:?} ({}), open this URL in a browser:",
            target.url
        );
        eprintln!("authorize: {}", pending.url);
        eprintln!("Waiting up to {timeout} s for the redirect back to plugd…");
    }
    let stored = pending
        .finish(std::time::Duration::from_secs(timeout))
        .await
        .with_context(|| format!("cannot authorize plugd at MCP server {server:?}"))?;
    if let Some(user) = user {
        rt.mcp_login_store_user(server, user, &stored).await?;
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "plugd: stored {user}'s own grant at {server}; that user's calls use it when plugd.yaml sets mcp.servers.{server}.upstream_auth.user_grants: true"
            );
        }
        return Ok(());
    }
    let applied = rt.mcp_login_store(server, &stored).await?;
    let expiry = match stored.expires_at {
        Some(at) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            format!("the access token expires in {} s", at.saturating_sub(now))
        }
        None => "the server gave no expiry".to_owned(),
    };
    let refresh = if stored.refresh_token.is_some() {
        "refreshed automatically"
    } else {
        "no refresh token: log in again when it expires"
    };
    let scope = stored.scope.as_deref().unwrap_or("(none asked)");
    crate::config_cmd::report(
        rt,
        server,
        &format!("authorized plugd at {server} (scope {scope}; {expiry}; {refresh})"),
        applied,
    )
    .await
}

async fn logout(rt: &Runtime, server: &str, user: Option<&str>) -> Result<()> {
    rt.mcp_login_target(server).await?;
    if let Some(user) = user {
        let gone = rt.mcp_logout_user(server, user).await?;
        #[allow(clippy::print_stderr)]
        {
            if gone {
                eprintln!("plugd: forgot {user}'s own grant at {server}");
            } else {
                eprintln!("plugd: {user} had no grant of its own at {server}");
            }
        }
        return Ok(());
    }
    let applied = rt
        .config_unset(server, plugd_runtime::mcp_remote::OAUTH_KEY)
        .await?;
    crate::config_cmd::report(
        rt,
        server,
        &format!("forgot the tokens of {server}"),
        applied,
    )
    .await
}
