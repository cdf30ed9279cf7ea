//! `plugd cluster init --state URL`: makes a PostgreSQL database the shared
//! state of a plugd cluster (schema, cluster id, the master key's id), and
//! `plugd state export --to URL`'s part that talks to the cluster.

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
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// The cluster's PostgreSQL database: postgres://USER@HOST:PORT/DB, or
    /// postgres://USER@/DB?host=/socket/dir (default: $PLUGD_STATE).
    #[arg(long, value_name = "URL", env = STATE_ENV, hide_env_values = true)]
    pub state: String,
}

pub async fn run(cmd: &ClusterCmd) -> Result<()> {
    let ClusterCmd::Init(args) = cmd;
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
