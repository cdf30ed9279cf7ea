//! `plugd bus publish|tail`: the bus of a running `plugd serve`, for
//! operators and tests. The bus lives in serve's process (plugins publish and
//! receive there), so both commands need one running for the workspace.

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use serde_json::{Value, json};

use crate::remote::Remote;

/// `plugd bus …`.
#[derive(Subcommand, Debug)]
pub enum BusCmd {
    /// Publish one event and print it as published (id and timestamp filled)
    /// with how many subscribers took it.
    Publish {
        /// The subject, e.g. plugin.outbound.slack.team_a (no wildcards).
        subject: String,
        /// What the event carries (JSON).
        #[arg(long, default_value = "{}", value_name = "JSON")]
        payload: String,
        /// Who publishes (default: operator).
        #[arg(long)]
        source: Option<String>,
        /// The session it belongs to.
        #[arg(long, value_name = "ID")]
        session: Option<String>,
    },
    /// Print every event matching PATTERN as one JSON line, until Ctrl-C.
    Tail {
        /// A subject pattern: `*` one segment, `>` one or more trailing ones.
        pattern: String,
        /// Stop after N events.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
}

async fn serve_of(workspace: &Path) -> Result<Remote> {
    match Remote::find(workspace).await {
        Some(r) => Ok(r),
        None => bail!(
            "no plugd serve is running for {}; the bus lives in serve's process: start `plugd serve` first",
            workspace.display()
        ),
    }
}

/// Runs `plugd bus …` against the workspace's running serve.
pub async fn run(workspace: &Path, cmd: &BusCmd) -> Result<()> {
    let serve = serve_of(workspace).await?;
    match cmd {
        BusCmd::Publish {
            subject,
            payload,
            source,
            session,
        } => {
            let payload: Value = serde_json::from_str(payload)
                .with_context(|| format!("--payload is not valid JSON: {payload:?}"))?;
            let body = json!({
                "subject": subject,
                "payload": payload,
                "source": source,
                "session_id": session,
            });
            let answer = serve
                .post("/v1/bus/publish", &body, format!("bus publish {subject}"))
                .await?;
            println!("{}", serde_json::to_string_pretty(&answer)?);
        }
        BusCmd::Tail { pattern, count } => {
            plugd_host::bus::check_pattern(pattern)?;
            let mut seen = 0u64;
            let limit = count.unwrap_or(u64::MAX);
            if limit == 0 {
                return Ok(());
            }
            let path = format!("/v1/bus/tail/{}", encode_segment(pattern));
            serve
                .sse(&path, format!("bus tail {pattern}"), |data| {
                    println!("{data}");
                    seen += 1;
                    seen < limit
                })
                .await?;
        }
    }
    Ok(())
}

/// `pattern` as one URL path segment (`>` and `*` percent-encoded).
fn encode_segment(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    for b in pattern.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
