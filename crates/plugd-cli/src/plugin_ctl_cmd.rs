//! `plugd plugin approve|revoke|restart|start|stop`: written once over a
//! [`Client`], so they act through a running `plugd serve` whenever serve
//! runs (`POST /v1/plugins/{id}:ACTION`), and here otherwise. The caller
//! connects with [`crate::remote::Remote::running`]: a serve that does not
//! answer is an error naming its pid, never a reason to act here beside it.
//!
//! A stop holds until a start: it is recorded in the workspace's state
//! database, so the next tool call (here, in serve, or after plugd restarts)
//! fails with `plugin_stopped` naming `plugd plugin start ID` instead of
//! starting the plugin lazily.

use anyhow::Result;

use crate::approve_cmd::ApproveArgs;
use crate::client::{Client, Started};

/// One plugin action.
#[derive(Debug, Clone, Copy)]
pub enum PluginAction<'a> {
    /// Approve plugins as their files are now.
    Approve(&'a ApproveArgs),
    /// Withdraw a plugin's approval.
    Revoke(&'a str),
    /// Clear a failure and the restart budget.
    Restart(&'a str),
    /// Stop a plugin and keep it stopped.
    Stop(&'a str),
    /// Start a plugin now.
    Start(&'a str),
}

/// Runs `action` on `client`; the lines are the same here and in serve,
/// which adds `(via plugd serve pid N)`.
pub async fn run(client: &Client<'_>, action: PluginAction<'_>) -> Result<()> {
    let via = client.via();
    match action {
        PluginAction::Approve(args) => crate::approve_cmd::run(client, args).await?,
        PluginAction::Revoke(id) => {
            if client.revoke(id).await? {
                println!("revoked {id}{via}");
            } else {
                println!("{id} was not approved{via}");
            }
        }
        PluginAction::Restart(id) => {
            client.restart(id).await?;
            println!("restarted {id}: failure cleared, restart budget reset{via}");
        }
        PluginAction::Stop(id) => {
            client.stop(id, &crate::approver(None)).await?;
            println!("stopped {id}; it stays stopped until `plugd plugin start {id}`{via}");
        }
        PluginAction::Start(id) => match client.start(id).await? {
            Started::Here => println!("started {id}: stop cleared, handshake done"),
            Started::InServe { state } => println!("started {id}: state {state}{via}"),
        },
    }
    Ok(())
}
