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

use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use plugd_gateway::{Caller, Gateway, stdio};
use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;

/// `plugd mcp` arguments.
#[derive(Args, Debug)]
pub struct McpArgs {
    /// Serve only the tools of this profile (plugd.yaml `mcp.profiles.NAME`).
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
}

/// Serves MCP on stdin/stdout until the client closes stdin.
pub async fn run(rt: &Runtime, args: &McpArgs) -> Result<()> {
    let config = PlugdConfig::load(rt.dir())?;
    rt.set_risk_config(config.risk.clone());
    let pipeline = Arc::new(plugd_runtime::hooks::build::build_pipeline(&config, rt).await?);
    let gateway = Gateway::new(
        rt.clone(),
        pipeline,
        Arc::new(config),
        env!("CARGO_PKG_VERSION"),
    );
    let caller = Caller {
        name: plugd_server::auth::user_name(rustix::process::geteuid().as_raw()),
        may_approve_critical: true,
    };
    let session = gateway.session(caller, args.profile.as_deref())?;
    // A changed plugin is stopped and its tools withheld (and clients told).
    let _watcher = rt.watch(plugd_runtime::watch::WatchOptions::from_env());
    tracing::info!(workspace = %rt.dir().display(), profile = ?args.profile, "plugd MCP gateway on stdio");
    stdio::serve(session, tokio::io::stdin(), tokio::io::stdout()).await?;
    Ok(())
}
