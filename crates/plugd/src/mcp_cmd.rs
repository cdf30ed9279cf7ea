//! `plugd mcp`: plugd's MCP gateway on stdio, the way MCP clients that spawn
//! their servers (Claude Desktop and Code, Cursor, Codex) run it.
//!
//! The gateway runs in this process over the workspace's approved plugins,
//! with plugd.yaml's hooks and risk policy. A `high` or `critical` call is
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
    },
    /// Forget the tokens of a remote MCP server.
    Logout {
        /// The server's name in .mcp.json.
        server: String,
    },
}

/// Serves MCP on stdin/stdout until the client closes stdin; or logs in/out.
pub async fn run(rt: &Runtime, args: &McpArgs) -> Result<()> {
    match &args.cmd {
        Some(McpCmd::Login {
            server,
            scope,
            timeout,
        }) => return login(rt, server, scope.as_deref(), *timeout).await,
        Some(McpCmd::Logout { server }) => return logout(rt, server).await,
        None => {}
    }
    let config = PlugdConfig::load(rt.dir())?;
    rt.set_risk_config(config.risk.clone());
    // Installed in the runtime: every call of the gateway passes its tool hooks.
    let pipeline = plugd_runtime::hooks::build::build_pipeline(&config, rt).await?;
    let gateway = Gateway::new(rt.clone(), Arc::new(config), env!("CARGO_PKG_VERSION"));
    let caller = Caller {
        name: plugd_server::auth::user_name(rustix::process::geteuid().as_raw()),
        may_approve_critical: true,
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

async fn login(rt: &Runtime, server: &str, scope: Option<&str>, timeout: u64) -> Result<()> {
    let mut target = rt.mcp_login_target(server)?;
    if let Some(s) = scope {
        target.settings.scope = Some(s.to_owned());
    }
    // A login may contact the server of an entry not approved (yet): say so first.
    let info = rt.plugin(server)?;
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

async fn logout(rt: &Runtime, server: &str) -> Result<()> {
    rt.mcp_login_target(server)?;
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
