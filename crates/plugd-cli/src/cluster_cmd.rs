//! `plugd cluster init --state URL`: makes a PostgreSQL database the shared
//! state of a plugd cluster (schema, cluster id, the master key's id);
//! `plugd cluster status`: the live nodes, their versions, keys,
//! configuration and leases; and `plugd state export --to URL`'s part that
//! talks to the cluster.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use plugd_store::secrets::{KeySource, MasterKey};
use plugd_store_pg::{PgOptions, PgStore};

/// The environment variable naming the state database when `--state` is absent.
pub const STATE_ENV: &str = "PLUGD_STATE";

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Create the schema and the cluster record (cluster id, master key id)
    /// in an empty PostgreSQL database; refused when it already holds a cluster.
    Init(InitArgs),
    /// The live nodes: id, version, schema version, master key id,
    /// plugd.yaml digest (and whether it is the cluster's), address and
    /// leases held.
    Status(StatusArgs),
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The cluster's PostgreSQL database (default: $PLUGD_STATE, else
    /// plugd.yaml's `state:`, else the workspace's own state).
    #[arg(long, value_name = "URL", env = STATE_ENV, hide_env_values = true)]
    pub state: Option<String>,
    /// Print the view as JSON (the `GET /v1/cluster` body without `this_node`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// The cluster's PostgreSQL database: postgres://USER@HOST:PORT/DB, or
    /// postgres://USER@/DB?host=/socket/dir (default: $PLUGD_STATE).
    #[arg(long, value_name = "URL", env = STATE_ENV, hide_env_values = true)]
    pub state: String,
}

pub async fn run(cmd: &ClusterCmd, workspace: Option<&std::path::Path>) -> Result<()> {
    let args = match cmd {
        ClusterCmd::Init(args) => args,
        ClusterCmd::Status(args) => return status(args, workspace).await,
    };
    // The usual sources, a key file created on first use as everywhere else:
    // every node of the cluster must then be given this same key.
    let source = KeySource::from_env()?;
    let created = matches!(&source, KeySource::File(p) if !p.exists());
    let key = source.load_or_create()?;
    let store = connect(&args.state)?;
    let info = store.cluster_init(key.id()).await?;
    println!(
        "cluster {} initialised in {}",
        info.cluster_id,
        store.label()
    );
    println!("schema version {}", info.schema_version);
    println!(
        "master key {} from {}{}",
        info.key_id,
        source.describe(),
        if created { " (created now)" } else { "" }
    );
    println!(
        "every node needs this same master key: {}, before `plugd serve --state URL`",
        key_hint(&key, &source)
    );
    Ok(())
}

#[allow(clippy::print_stdout)] // the command's output
async fn status(args: &StatusArgs, workspace: Option<&std::path::Path>) -> Result<()> {
    let store: std::sync::Arc<dyn plugd_store::StateStore> = match &args.state {
        Some(url) => std::sync::Arc::new(PgStore::open_node_with_env_key(url).await?),
        None => {
            let dir = plugd_runtime::workspace::resolve_dir(workspace)?;
            crate::state::open(&dir).await?
        }
    };
    let view = plugd_control::cluster::status(&*store).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "config_digest": view.config_digest,
                "nodes": view.nodes,
            }))?
        );
        return Ok(());
    }
    println!("state: {}", store.describe());
    println!(
        "cluster plugd.yaml: {}",
        view.config_digest.as_deref().unwrap_or("(no live node)")
    );
    if view.nodes.is_empty() {
        println!("no live node (a node writes its row every second while `plugd serve` runs)");
        return Ok(());
    }
    println!(
        "{:<20} {:<10} {:<7} {:<20} {:<10} {:<22} LEASES",
        "NODE", "VERSION", "SCHEMA", "KEY", "CONFIG", "ADDRESS"
    );
    for n in &view.nodes {
        let digest = n.node.config_digest.trim_start_matches("sha256:");
        let config = format!(
            "{}{}",
            &digest[..digest.len().min(8)],
            if n.config_current { "" } else { " (differs)" }
        );
        println!(
            "{:<20} {:<10} {:<7} {:<20} {:<10} {:<22} {}",
            n.node.node_id,
            n.node.version,
            n.node.schema_version,
            n.node.key_id,
            config,
            n.node.addr.as_deref().unwrap_or("-"),
            if n.leases.is_empty() {
                "-".to_owned()
            } else {
                n.leases.join(",")
            }
        );
    }
    Ok(())
}

/// A pool for the one command: two connections, the default timeouts.
pub fn connect(url: &str) -> Result<PgStore> {
    let opts = PgOptions {
        pool_size: 2,
        ..PgOptions::default()
    };
    PgStore::connect_unmigrated(url, &opts).context("cannot use the state URL")
}

/// How to hand the key to other nodes, without printing it.
fn key_hint(key: &MasterKey, source: &KeySource) -> String {
    match source {
        KeySource::Env(_) => format!(
            "set PLUGD_MASTER_KEY to this same value on each (key id {})",
            key.id()
        ),
        KeySource::File(p) => format!(
            "copy {} to each (mode 0600; PLUGD_KEY_FILE names it if it lives elsewhere)",
            p.display()
        ),
    }
}
