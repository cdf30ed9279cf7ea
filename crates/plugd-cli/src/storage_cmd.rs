//! `plugd storage get|set|delete|list`: the agent's key-value storage that
//! Dexto modules see as `context.agent.storage.database` (and `.cache` with
//! `--cache`), for setting up and inspecting what plugins read and write.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use plugd_runtime::Runtime;
use serde_json::Value;

/// `plugd storage …`.
#[derive(Subcommand, Debug)]
pub enum StorageCmd {
    /// Print the JSON value of KEY (`null` when unset).
    Get {
        /// The key.
        key: String,
        #[command(flatten)]
        space: Space,
    },
    /// Set KEY to the JSON VALUE (a string that is not JSON is stored as a string).
    Set {
        /// The key.
        key: String,
        /// The value, as JSON.
        value: String,
        #[command(flatten)]
        space: Space,
    },
    /// Remove KEY.
    Delete {
        /// The key.
        key: String,
        #[command(flatten)]
        space: Space,
    },
    /// The keys starting with PREFIX, one per line (`--json`: an array).
    List {
        /// The prefix (all keys when omitted).
        #[arg(default_value = "")]
        prefix: String,
        #[command(flatten)]
        space: Space,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// Which namespace: `database` (default) or `cache`.
#[derive(Args, Debug)]
pub struct Space {
    /// Use `storage.cache` instead of `storage.database`.
    #[arg(long)]
    cache: bool,
}

impl Space {
    fn name(&self) -> &'static str {
        if self.cache { "cache" } else { "database" }
    }
}

/// Runs `plugd storage`.
pub async fn run(rt: &Runtime, cmd: &StorageCmd) -> Result<()> {
    let store = rt.state();
    match cmd {
        StorageCmd::Get { key, space } => {
            let v = store.kv_get(space.name(), key).await?;
            println!("{}", v.unwrap_or(Value::Null));
        }
        StorageCmd::Set { key, value, space } => {
            let v: Value =
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.clone()));
            store
                .kv_set(space.name(), key, &v)
                .await
                .with_context(|| format!("cannot set {key}"))?;
            println!("set {} {key}", space.name());
        }
        StorageCmd::Delete { key, space } => {
            if store.kv_delete(space.name(), key).await? {
                println!("deleted {} {key}", space.name());
            } else {
                println!("{} {key} was not set", space.name());
            }
        }
        StorageCmd::List {
            prefix,
            space,
            json,
        } => {
            let keys = store.kv_list(space.name(), prefix).await?;
            if *json {
                println!("{}", serde_json::json!(keys));
            } else {
                for k in keys {
                    println!("{k}");
                }
            }
        }
    }
    Ok(())
}
