//! `plugd invocations list|show`: the invocation records of tool calls,
//! read from the workspace's state database directly (like `plugd token
//! list`), so they show what a running serve and earlier CLI calls wrote.

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use plugd_control::invocations::{InvocationFilter, InvocationRecord, MAX_PAGE};

/// `plugd invocations …`.
#[derive(Subcommand, Debug)]
pub enum InvocationsCmd {
    /// List invocation records, newest first.
    List {
        /// Only this plugin's.
        #[arg(long)]
        plugin: Option<String>,
        /// Only this tool's (plugd name or export id).
        #[arg(long)]
        tool: Option<String>,
        /// Only those that ended so: succeeded, failed, cancelled or retryable_failure.
        #[arg(long)]
        status: Option<plugd_control::TerminalStatus>,
        /// Only calls made in this org (through its bindings).
        #[arg(long)]
        org: Option<String>,
        /// Only calls made for this project.
        #[arg(long)]
        project: Option<String>,
        /// The page after this one (`next_cursor` of `--json`).
        #[arg(long)]
        cursor: Option<String>,
        /// At most this many (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print JSON (`{"invocations": [...], "next_cursor": ...}`).
        #[arg(long)]
        json: bool,
    },
    /// Show one record.
    Show {
        /// The invocation id (`inv_…`).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `plugd invocations …` for the workspace `dir`.
pub async fn run(dir: &Path, cmd: &InvocationsCmd) -> Result<()> {
    let store = crate::state::open(dir).await?;
    match cmd {
        InvocationsCmd::List {
            plugin,
            tool,
            status,
            org,
            project,
            cursor,
            limit,
            json,
        } => {
            if !(1..=MAX_PAGE).contains(limit) {
                bail!("--limit {limit} is out of range; use 1 to {MAX_PAGE}");
            }
            let page = store
                .list_invocations(&InvocationFilter {
                    plugin_id: plugin.clone(),
                    tool: tool.clone(),
                    status: *status,
                    org_id: org.clone(),
                    project_id: project.clone(),
                    cursor: cursor
                        .as_deref()
                        .map(plugd_control::invocations::Cursor::decode)
                        .transpose()
                        .map_err(|e| {
                            anyhow::anyhow!("--cursor {:?} is not a cursor plugd gave", e.0)
                        })?,
                    limit: *limit,
                    ..InvocationFilter::default()
                })
                .await?;
            if *json {
                return crate::print_json(&page, false);
            }
            if page.invocations.is_empty() {
                println!("no invocation records");
                return Ok(());
            }
            println!(
                "{:<36} {:<24} {:<28} {:<18} {:>8}  CALLER",
                "ID", "STARTED", "TOOL", "STATUS", "MS"
            );
            for r in &page.invocations {
                println!(
                    "{:<36} {:<24} {:<28} {:<18} {:>8}  {}",
                    r.invocation_id,
                    r.started_at,
                    r.tool,
                    status_text(r),
                    r.duration_ms,
                    r.caller.as_deref().unwrap_or("-")
                );
            }
            Ok(())
        }
        InvocationsCmd::Show { id, json } => {
            let r = store.invocation(id).await?.with_context(|| {
                format!("no invocation {id:?}; `plugd invocations list` shows them")
            })?;
            if *json {
                return crate::print_json(&r, false);
            }
            let v = serde_json::to_value(&r)?;
            if let Some(fields) = v.as_object() {
                for (k, v) in fields {
                    let text = match v {
                        serde_json::Value::Null => continue,
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    println!("{k:<16} {text}");
                }
            }
            Ok(())
        }
    }
}

fn status_text(r: &InvocationRecord) -> String {
    match &r.error_code {
        Some(code) => format!("{} ({code})", r.status),
        None => r.status.to_string(),
    }
}
