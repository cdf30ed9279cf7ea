//! `plugd config status|diff|approve`: the plugd.yaml policy a running
//! `plugd serve` holds in force, a change it holds until an operator
//! approves it, and that approval (through serve's `GET`/`POST /v1/config`;
//! see `plugd_runtime::config_gate`).

use std::path::Path;

use anyhow::{Result, bail};
use clap::Subcommand;
use serde_json::{Value, json};

use crate::remote::Remote;

/// `plugd config …`.
#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// What is in force and whether a change is held (JSON with --json).
    Status {
        /// Print the whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The held change as a diff against the text in force, with what it widens.
    Diff,
    /// Put the held change in force; DIGEST is the `sha256:` `plugd config diff` shows.
    Approve {
        /// The digest of the held change (so only what was reviewed is approved).
        digest: String,
    },
}

async fn serve(dir: &Path) -> Result<Remote> {
    match Remote::find(dir).await {
        Some(r) => Ok(r),
        None => bail!(
            "no plugd serve answers on {}: plugd.yaml is gated only while serve runs, and serve takes the file as it is when it starts",
            crate::remote::socket_path(dir).display()
        ),
    }
}

/// Runs the command; prints to stdout.
pub async fn run(dir: &Path, cmd: &PolicyCmd) -> Result<()> {
    let remote = serve(dir).await?;
    match cmd {
        PolicyCmd::Status { json } => {
            let v = remote.get("/v1/config", "config status".into()).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", status_text(&v));
            }
        }
        PolicyCmd::Diff => {
            let v = remote.get("/v1/config", "config diff".into()).await?;
            let Some(p) = v.get("pending").filter(|p| !p.is_null()) else {
                println!(
                    "nothing is held; the plugd.yaml in force is {}",
                    text(&v["in_force"])
                );
                return Ok(());
            };
            print!("{}", p["diff"].as_str().unwrap_or(""));
            println!(
                "held: {} (since {})",
                text(&p["digest"]),
                text(&p["seen_at"])
            );
            for (what, key) in [
                ("widens", "widening"),
                ("narrows", "narrowing"),
                ("neutral", "neutral"),
            ] {
                for line in p["verdict"][key].as_array().into_iter().flatten() {
                    println!("  {what}: {}", line.as_str().unwrap_or(""));
                }
            }
            println!(
                "approve it with: plugd config approve {}",
                text(&p["digest"])
            );
        }
        PolicyCmd::Approve { digest } => {
            let v = remote
                .post(
                    "/v1/config",
                    &json!({"approve": digest}),
                    "config approve".into(),
                )
                .await?;
            println!(
                "approved; the plugd.yaml in force is {}",
                text(&v["in_force"])
            );
        }
    }
    Ok(())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn status_text(v: &Value) -> String {
    let mut out = format!("in force: {}\n", text(&v["in_force"]));
    match v.get("pending").filter(|p| !p.is_null()) {
        Some(p) => out.push_str(&format!(
            "held:     {} (plugd config diff; plugd config approve {})\n",
            text(&p["digest"]),
            text(&p["digest"])
        )),
        None => out.push_str("held:     nothing\n"),
    }
    if let Some(e) = v["error"].as_str() {
        out.push_str(&format!("on disk:  not in force: {e}\n"));
    }
    out
}
