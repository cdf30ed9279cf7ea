//! `plugd plugin approve ID [ID ...] | --all`: approvals of many plugins with
//! bounded concurrency, one line per plugin and a summary, locally or
//! through a running `plugd serve` (one [`Client`]).

use anyhow::{Result, bail};
use clap::Args;
use futures_util::stream::{self, StreamExt};

use crate::client::Client;

/// What `plugd plugin approve` takes.
#[derive(Args, Debug)]
pub struct ApproveArgs {
    /// Plugin ids.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub ids: Vec<String>,
    /// Approve every plugin not approved as it is now (unapproved, changed or invalid).
    #[arg(long)]
    pub all: bool,
    /// How many approvals run at once (each starts its plugin once).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
    /// Who approves (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// One approval's outcome: the line to print, or why it failed.
type Outcome = (String, Result<String, String>);

/// Runs `approve` over `ids`, `jobs` at a time, printing a line per plugin
/// in the order given; a summary and an error naming each failure when
/// there are several.
async fn approve_all<F, Fut>(ids: Vec<String>, jobs: u16, approve: F) -> Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    if ids.len() == 1 {
        let (_, r) = approve(ids[0].clone()).await;
        return match r {
            Ok(line) => {
                println!("{line}");
                Ok(())
            }
            Err(e) => bail!("{e}"),
        };
    }
    if ids.is_empty() {
        println!("nothing to approve: every plugin is approved as it is now");
        return Ok(());
    }
    let total = ids.len();
    let mut failed = Vec::new();
    let mut results = stream::iter(ids).map(&approve).buffered(usize::from(jobs));
    while let Some((id, r)) = results.next().await {
        match r {
            Ok(line) => println!("{line}"),
            Err(e) => {
                println!("failed {id}: {e}");
                failed.push(id);
            }
        }
    }
    println!(
        "approved {} of {total} plugins{}",
        total - failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; failed: {}", failed.join(", "))
        }
    );
    if !failed.is_empty() {
        bail!(
            "{} of {total} approvals failed: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// For a plugin approved before its required settings are set (seed 004's
/// order): what to set before its first call.
fn needs_config(state: &str, error: Option<&str>) -> String {
    match (state, error) {
        ("unconfigured", Some(why)) => format!("; not started, it needs configuration: {why}"),
        _ => String::new(),
    }
}

/// Here or through the running serve (its `POST /v1/plugins/{id}:approve`).
/// Serve records who approved from the connection (socket user or token),
/// so `--by` is not sent there.
pub async fn run(client: &Client<'_>, args: &ApproveArgs) -> Result<()> {
    if matches!(client, Client::Serve(_)) && args.by.is_some() {
        eprintln!(
            "note: --by is not sent to plugd serve; it records the user of this socket connection"
        );
    }
    let by = crate::approver(args.by.as_deref());
    let ids = if args.all {
        client.unapproved().await?
    } else {
        args.ids.clone()
    };
    let (by, via) = (&by, &client.via());
    approve_all(ids, args.jobs, |id| async move {
        let r = match client.approve(&id, by).await {
            Ok(a) => {
                crate::print_approval_warnings(a.warnings.iter().map(String::as_str));
                Ok(format!(
                    "approved {id} ({}); tools: {}{}{via}",
                    a.digest,
                    a.tools.join(", "),
                    needs_config(&a.state, a.error.as_deref())
                ))
            }
            Err(e) => Err(e.to_string()),
        };
        (id, r)
    })
    .await
}
