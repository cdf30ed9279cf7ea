//! `plugd plugin config ID set|get|unset|show` and `plugd secrets rotate`.
//!
//! Values are written to the workspace's state database by this process
//! (secrets sealed with the master key first); when a `plugd serve` runs on
//! the workspace it is then asked to apply them
//! (`POST /v1/plugins/{id}:reconfigure`), so no value crosses HTTP.
//! Secrets are printed as `••••`, never in clear. `set KEY -` reads the value
//! from standard input (one trailing newline removed), so it stays out of
//! shell history and the process list.

use std::io::Read as _;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use plugd_runtime::Runtime;
use plugd_runtime::plugin_config::{Applied, ConfigEntry};

use crate::remote;

/// `plugd plugin config ID …`.
#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// Plugin id.
    pub id: String,
    #[command(subcommand)]
    pub cmd: ConfigCmd,
}

/// What to do with a plugin's settings.
#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// Set KEY to VALUE (checked against the plugin's schema; `-` reads it from stdin).
    Set {
        /// Setting name.
        key: String,
        /// The value: text, `true`/`false`, a number, a select option, or `-` for stdin.
        value: String,
    },
    /// Print one setting (secrets as ••••).
    Get {
        /// Setting name.
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a setting (its default applies again).
    Unset {
        /// Setting name.
        key: String,
    },
    /// Print every setting (secrets as ••••).
    Show {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `plugd secrets …` (plugd's own secrets; `plugd secret` is per org).
#[derive(Subcommand, Debug)]
pub enum SecretsCmd {
    /// Store secret NAME, read from standard input (never the command line),
    /// sealed with the master key; plugd.yaml names it (`api_key_secret:`).
    Set {
        /// The secret's name: letters, digits, `_ . -`, an optional `ORG/`.
        name: String,
    },
    /// Remove secret NAME.
    Unset {
        /// The secret's name.
        name: String,
    },
    /// The names of the stored secrets (never their values).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Re-encrypt every stored secret under a new master key.
    Rotate,
}

/// Runs `plugd plugin config`.
pub async fn run(rt: &Runtime, args: &ConfigArgs) -> Result<()> {
    let id = &args.id;
    match &args.cmd {
        ConfigCmd::Set { key, value } => {
            let value = if value == "-" {
                read_stdin_value()?
            } else {
                value.clone()
            };
            let applied = rt.config_set(id, key, &value).await?;
            report(rt, id, &format!("set {id} {key}"), applied).await?;
        }
        ConfigCmd::Unset { key } => {
            let applied = rt.config_unset(id, key).await?;
            report(rt, id, &format!("unset {id} {key}"), applied).await?;
        }
        ConfigCmd::Get { key, json } => {
            let e = rt.config_get(id, key).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&e)?);
            } else {
                println!("{}", value_text(&e));
            }
        }
        ConfigCmd::Show { json } => {
            let entries = rt.config_show(id).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else if entries.is_empty() {
                println!("{id} declares no settings");
            } else {
                let w = entries
                    .iter()
                    .map(|e| e.key.len())
                    .max()
                    .unwrap_or(3)
                    .max(3);
                println!("{:w$}  {:8}  {:7}  VALUE", "KEY", "TYPE", "SOURCE");
                for e in &entries {
                    let req = if e.required { " (required)" } else { "" };
                    println!(
                        "{:w$}  {:8}  {:7}  {}{req}",
                        e.key,
                        e.kind,
                        e.source,
                        value_text(e)
                    );
                }
            }
        }
    }
    Ok(())
}

/// Runs `plugd secrets`.
pub async fn secrets(rt: &Runtime, cmd: &SecretsCmd) -> Result<()> {
    match cmd {
        SecretsCmd::Set { name } => {
            let value = read_stdin_value()?;
            rt.secret_set(name, &value).await?;
            println!("stored secret {name} (sealed with the master key)");
        }
        SecretsCmd::Unset { name } => {
            if rt.secret_unset(name).await? {
                println!("removed secret {name}");
            } else {
                println!("secret {name} was not set");
            }
        }
        SecretsCmd::List { json } => {
            let names = rt.secret_names().await?;
            if *json {
                println!("{}", serde_json::json!(names));
            } else if names.is_empty() {
                println!("no secrets; `plugd secrets set NAME` stores one from standard input");
            } else {
                for n in names {
                    println!("{n}");
                }
            }
        }
        SecretsCmd::Rotate => {
            let r = rt.rotate_secrets().await?;
            println!(
                "rotated the master key {} -> {}: {} secret(s) re-encrypted",
                r.old_key_id, r.new_key_id, r.resealed
            );
            if std::env::var_os(plugd_store::secrets::MASTER_KEY_ENV).is_some() {
                println!(
                    "now set PLUGD_MASTER_KEY to the value of PLUGD_NEW_MASTER_KEY everywhere plugd runs"
                );
            }
        }
    }
    Ok(())
}

fn value_text(e: &ConfigEntry) -> String {
    match &e.value {
        serde_json::Value::Null => "(unset)".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// After a change: the local outcome, or serve's when one runs.
pub(crate) async fn report(rt: &Runtime, id: &str, what: &str, applied: Applied) -> Result<()> {
    if let Some(serve) = remote::Remote::find(rt.dir()).await {
        let row = serve.plugin_action(id, "reconfigure").await?;
        let how = match row["applied"].as_str() {
            Some("notified") => Applied::Notified.describe(),
            Some("restarted") => Applied::Restarted.describe(),
            _ => Applied::NotRunning.describe(),
        };
        println!("{what}: {how} (via plugd serve pid {})", serve.pid());
    } else {
        println!("{what}: {}", applied.describe());
    }
    Ok(())
}

/// A secret value from standard input (at most 64 KiB, one trailing line
/// break dropped), for `plugd plugin config` and `plugd secret set`.
pub fn read_stdin_value() -> Result<String> {
    let mut buf = String::new();
    std::io::stdin()
        .take(64 * 1024 + 1)
        .read_to_string(&mut buf)
        .context("cannot read the value from standard input")?;
    if buf.len() > 64 * 1024 {
        bail!("the value on standard input is over 64 KiB");
    }
    if buf.ends_with('\n') {
        buf.pop();
        if buf.ends_with('\r') {
            buf.pop();
        }
    }
    Ok(buf)
}
