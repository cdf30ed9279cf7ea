//! `plugd plugin start|stop ID`: operator start and stop, locally or
//! through a running `plugd serve` (`POST /v1/plugins/{id}:start|stop`).
//!
//! A stop holds until a start: it is recorded in the workspace's state
//! database, so the next tool call (here, in serve, or after plugd restarts)
//! fails with `plugin_stopped` naming `plugd plugin start ID` instead of
//! starting the plugin lazily.

use anyhow::Result;
use plugd_runtime::Runtime;

use crate::remote::Remote;

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
