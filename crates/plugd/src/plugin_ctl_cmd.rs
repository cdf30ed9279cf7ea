//! `plugd plugin start|stop ID`: operator start and stop, locally or
//! through a running `plugd serve` (`POST /v1/plugins/{id}:start|stop`),
//! and [`through_serve`], which sends `approve|revoke|restart|start|stop`
//! to serve whenever serve runs: a serve that does not answer is an error
//! naming its pid, never a reason to act here beside it.
//!
//! A stop holds until a start: it is recorded in the workspace's state
//! database, so the next tool call (here, in serve, or after plugd restarts)
//! fails with `plugin_stopped` naming `plugd plugin start ID` instead of
//! starting the plugin lazily.

use std::path::Path;

use anyhow::{Result, bail};
use plugd_runtime::Runtime;

use crate::PluginCmd;
use crate::remote::Remote;

/// Runs `cmd` (approve, revoke, restart, start, stop) through the serve of
/// `workspace` when one runs: `Ok(true)` when it did, `Ok(false)` when no
/// serve runs (the caller acts locally), an error naming serve's pid when
/// serve runs and does not answer.
pub async fn through_serve(workspace: &Path, cmd: &PluginCmd) -> Result<bool> {
    let Some(serve) = Remote::running(workspace).await? else {
        return Ok(false);
    };
    plugin_via_serve(&serve, cmd).await?;
    Ok(true)
}

/// `plugd plugin approve|revoke|restart|start|stop` through a running
/// serve: the same lines as the local commands, plus which serve did it.
async fn plugin_via_serve(serve: &Remote, cmd: &PluginCmd) -> Result<()> {
    let via = format!("(via plugd serve pid {})", serve.pid());
    match cmd {
        PluginCmd::Approve(args) => crate::approve_cmd::via_serve(serve, args).await?,
        PluginCmd::Revoke { id } => {
            let row = serve.plugin_action(id, "revoke").await?;
            if row["was_approved"].as_bool().unwrap_or(true) {
                println!("revoked {id} {via}");
            } else {
                println!("{id} was not approved {via}");
            }
        }
        PluginCmd::Restart { id } => {
            serve.plugin_action(id, "restart").await?;
            println!("restarted {id}: failure cleared, restart budget reset {via}");
        }
        PluginCmd::Stop { id } => via_serve(serve, id, "stop").await?,
        PluginCmd::Start { id } => via_serve(serve, id, "start").await?,
        PluginCmd::List(_)
        | PluginCmd::Show { .. }
        | PluginCmd::Signing(_)
        | PluginCmd::Config(_) => {
            bail!("only approve, revoke, restart, start and stop go through plugd serve")
        }
    }
    Ok(())
}

/// Stops `id` in this process's runtime (the record holds for every plugd).
pub async fn stop_local(rt: &Runtime, id: &str, by: &str) -> Result<()> {
    rt.stop(id, by).await?;
    println!("stopped {id}; it stays stopped until `plugd plugin start {id}`");
    Ok(())
}

/// Starts `id` now in this process's runtime (it ends with this command
/// when no serve runs; the stop record is cleared either way).
pub async fn start_local(rt: &Runtime, id: &str) -> Result<()> {
    rt.start(id).await?;
    println!("started {id}: stop cleared, handshake done");
    Ok(())
}

/// `stop` or `start` through serve.
pub async fn via_serve(serve: &Remote, id: &str, action: &str) -> Result<()> {
    let row = serve.plugin_action(id, action).await?;
    let state = row["state"].as_str().unwrap_or("?");
    let via = format!("(via plugd serve pid {})", serve.pid());
    match action {
        "stop" => println!("stopped {id}; it stays stopped until `plugd plugin start {id}` {via}"),
        _ => println!("started {id}: state {state} {via}"),
    }
    Ok(())
}
