//! plugd-node: a running node (`plugd serve`) assembled from its parts in one
//! sequence: serve lock, store and bus ([`Backends`]), runtime, config gate,
//! hook pipeline, outbox worker, HTTP surfaces on their listeners, eager
//! starts, watchers and channels, then one shutdown sequence.
//!
//! **API boundary**: the binary parses `plugd serve`'s arguments into a
//! [`NodeConfig`] and calls [`run`]; nothing else starts a node. Errors are
//! `anyhow` as in the binary: this crate is the binary's serving half, and its
//! messages are the ones `plugd serve` prints. [`bench_surface`] starts the
//! HTTP surface alone for plugd-bench, which depends on no surface crate.

pub mod backends;
pub mod bench_surface;
pub mod eager;
pub mod log_writer;
mod presence;
mod serve;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Result;
use plugd_host::HostConfig;
use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::serve_lock::ServeLock;

pub use backends::{Backends, PostgresState, SqliteState, StateBackend, open_postgres};

/// What `plugd serve` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// The workspace flag (`--workspace`); `None`: `$PLUGD_WORKSPACE`, else
    /// the current directory.
    pub workspace: Option<PathBuf>,
    /// Also serve the HTTP API on this TCP address (loopback only).
    pub listen: Option<SocketAddr>,
    /// `--state` (or `PLUGD_STATE`): a `postgres://` URL; `None`: plugd.yaml's
    /// `state:`, else the workspace's SQLite file.
    pub state: Option<String>,
    /// `--nats` (or `PLUGD_NATS`): the cluster's NATS; the bus then reaches
    /// every node. Needs a shared state (`state`).
    pub nats: Option<String>,
    /// `--node-id` (or `PLUGD_NODE_ID`); `None`: a fresh id per start.
    pub node_id: Option<String>,
}

/// Runs a node on `config`'s workspace until Ctrl-C or SIGTERM (then `Ok`),
/// or until its HTTP server fails (then that error); every plugin is stopped
/// either way.
pub async fn run(config: NodeConfig, backends: Backends) -> Result<()> {
    // One serve per workspace: the lock comes before the database or any plugin.
    let dir = plugd_runtime::workspace::resolve_dir(config.workspace.as_deref())?;
    let _serve_lock = ServeLock::acquire(&dir)?;
    let host = HostConfig::from_env().map_err(anyhow::Error::msg)?;
    let Backends { state, bus } = backends;
    // `--state`, `PLUGD_STATE`, plugd.yaml's `state:`: a shared database
    // replaces the workspace's file; read once, at start.
    let yaml = PlugdConfig::load(&dir).ok();
    let state: Box<dyn StateBackend> =
        match plugd_runtime::config::state_url(config.state.as_deref(), yaml.as_ref()) {
            Some(url) => Box::new(PostgresState::new(url)),
            None => state,
        };
    let store = state.open(&dir.canonicalize()?.join(".plugd")).await?;
    tracing::info!(state = state.name(), db = %store.describe(), "state backend open");
    // `--nats`/`PLUGD_NATS` and `--node-id`/`PLUGD_NODE_ID`, else
    // plugd.yaml's `cluster:` (read at start).
    let (nats, node_id) = plugd_runtime::config::cluster_settings(
        config.nats.as_deref(),
        config.node_id.as_deref(),
        yaml.as_ref(),
    );
    let node = match &node_id {
        Some(id) => check_node_id(id)?,
        None => plugd_control::id::fresh("node"),
    };
    let (bus, pins) = match &nats {
        None => (bus, None),
        Some(url) => {
            anyhow::ensure!(
                state.name() == "postgres",
                "--nats needs the cluster's shared state: start with --state postgres://… (or PLUGD_STATE) as well"
            );
            let client = backends::nats_connect(url, &node).await?;
            let bus = backends::nats_bus(client.clone(), &node).await?;
            let pins = backends::nats_pins(client.clone()).await?;
            let forwarder = backends::nats_forwarder(client, &node).await?;
            tracing::info!(url = %plugd_nats::redact_url(url), %node, "on the cluster's NATS: events reach every node, approval pins are shared");
            (bus, Some((pins, forwarder)))
        }
    };
    let rt = Runtime::open_with(&dir, store, host, bus, plugd_agent::parts()).await?;
    // Nobody answers a terminal here: high-risk calls and elicitations wait
    // in queues that operators answer (`plugd approvals`, the console).
    rt.set_node_id(&node);
    let forwarder = match pins {
        Some((pins, forwarder)) => {
            rt.share_pins(pins);
            Some(forwarder)
        }
        None => None,
    };
    rt.use_approval_queue();
    rt.use_elicitation_queue();
    let result = serve::serve(&rt, &config, forwarder).await;
    rt.shutdown().await;
    result
}

/// A `--node-id`: 1 to 64 letters, digits, `.`, `_` or `-`, starting with
/// a letter or digit (it names lease holders `NODE/TASK` and log lines).
fn check_node_id(id: &str) -> Result<String> {
    anyhow::ensure!(
        plugd_control::cluster::is_node_id(id),
        "--node-id {id:?}: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    );
    Ok(id.to_owned())
}

/// The delegated API of a CLI command that runs VAI invocations itself
/// (`plugd run`, `plugd run --harness`): `plugd-server`'s, mounted here for
/// `plugd-cli`, which depends on no surface (its `DelegatedApi`).
pub fn delegated_api<'a>(
    rt: &'a Runtime,
    config: Arc<PlugdConfig>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Pin<Box<dyn Future<Output = Result<SocketAddr>> + 'a>> {
    Box::pin(async move { Ok(plugd_server::delegated_api(rt, config, stop).await?) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_ids_are_plain_names() {
        for good in ["a", "node-1", "eu.west_2", &"n".repeat(64)] {
            assert!(super::check_node_id(good).is_ok(), "{good}");
        }
        for bad in ["", "a/b", "-a", "a b", "a\n", &"n".repeat(65)] {
            let e = super::check_node_id(bad).unwrap_err().to_string();
            assert!(e.contains("--node-id"), "{bad}: {e}");
        }
    }
}
