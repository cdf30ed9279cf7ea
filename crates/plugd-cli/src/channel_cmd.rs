//! `plugd channel list|send`: the channel adapters of the workspace
//! (`[plugin.extends].channels`) and one outbound message through one of them,
//! in this process (the plugin starts for the call; it must be approved).

use anyhow::{Result, bail};
use clap::Subcommand;
use plugd_host::extensions::OutboundMessage;
use plugd_runtime::Runtime;
use serde_json::json;

/// `plugd channel …`.
#[derive(Subcommand, Debug)]
pub enum ChannelCmd {
    /// List channel kinds and the plugin serving each.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send one text message through channel KIND and print the receipt.
    Send {
        /// The channel kind, e.g. webhook.
        kind: String,
        /// The recipient.
        #[arg(long)]
        to: String,
        /// The text.
        #[arg(long)]
        body: String,
    },
}

/// Runs `plugd channel …`.
pub async fn run(rt: &Runtime, cmd: &ChannelCmd) -> Result<()> {
    match cmd {
        ChannelCmd::List { json } => {
            let kinds = rt.channel_kinds();
            if *json {
                let rows: Vec<_> = kinds
                    .iter()
                    .map(|(k, p)| json!({"kind": k, "plugin": p}))
                    .collect();
                println!("{}", serde_json::to_string(&rows)?);
            } else if kinds.is_empty() {
                println!("no channels: no plugin declares [plugin.extends].channels");
            } else {
                for (k, p) in kinds {
                    println!("{k}\t{p}");
                }
            }
        }
        ChannelCmd::Send { kind, to, body } => {
            let adapter = rt.channel(kind)?;
            let sent = adapter
                .send_outbound(OutboundMessage::text(to.clone(), body.clone()))
                .await;
            rt.shutdown().await;
            match sent {
                Ok(r) => println!("{}", serde_json::to_string(&r)?),
                Err(e) => bail!("plugin {:?}: {e}", adapter.owner()),
            }
        }
    }
    Ok(())
}
