//! `plugd plugin approve ID [ID ...] | --all`: approvals of many plugins with
//! bounded concurrency, one line per plugin and a summary, locally or
//! through a running `plugd serve`.

use anyhow::{Result, bail};
use clap::Args;
use futures_util::stream::{self, StreamExt};
use plugd_runtime::Runtime;
use serde_json::Value;

use crate::remote::Remote;

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

fn tools_of(row: &Value) -> String {
    row["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(Value::as_str).collect::<Vec<_>>())
        .unwrap_or_default()
        .join(", ")
}

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

/// In this process.
pub async fn local(rt: &Runtime, args: &ApproveArgs, by: &str) -> Result<()> {
    let ids = if args.all {
        rt.plugin_list()?
            .into_iter()
            .filter(|p| !p.approved)
            .map(|p| p.id)
            .collect()
    } else {
        args.ids.clone()
    };
    approve_all(ids, args.jobs, |id| async move {
        let r = match rt.approve(&id, by).await {
            Ok(info) => {
                crate::print_approval_warnings(info.warnings.iter().map(String::as_str));
                let digest = info
                    .approval
                    .as_ref()
                    .map(|a| a.digest.as_str())
                    .unwrap_or("?");
                Ok(format!(
                    "approved {id} ({digest}); tools: {}{}",
                    info.tools.join(", "),
                    needs_config(&info.state, info.error.as_deref())
                ))
            }
            Err(e) => Err(e.to_string()),
        };
        (id, r)
    })
    .await
}

/// Through the running `serve` (its `POST /v1/plugins/{id}:approve`).
/// Serve records who approved from the connection (socket user or token),
/// so `--by` is not sent.
pub async fn via_serve(serve: &Remote, args: &ApproveArgs) -> Result<()> {
    if args.by.is_some() {
        eprintln!(
            "note: --by is not sent to plugd serve; it records the user of this socket connection"
        );
    }
    let via = format!("(via plugd serve pid {})", serve.pid());
    let ids = if args.all {
        let rows = serve.get("/v1/plugins", "plugin list".into()).await?;
        rows.as_array()
            .into_iter()
            .flatten()
            .filter(|r| !r["approved"].as_bool().unwrap_or(false))
            .filter_map(|r| r["id"].as_str().map(str::to_owned))
            .collect()
    } else {
        args.ids.clone()
    };
    let via = &via;
    approve_all(ids, args.jobs, |id| async move {
        let r = match serve.plugin_action(&id, "approve").await {
            Ok(row) => Ok({
                let warnings = row["warnings"].as_array().cloned().unwrap_or_default();
                crate::print_approval_warnings(warnings.iter().filter_map(Value::as_str));
                format!(
                    "approved {id} ({}); tools: {}{} {via}",
                    row["digest"].as_str().unwrap_or("?"),
                    tools_of(&row),
                    needs_config(
                        row["state"].as_str().unwrap_or_default(),
                        row["error"].as_str()
                    )
                )
            }),
            Err(e) => Err(e.to_string()),
        };
        (id, r)
    })
    .await
}
