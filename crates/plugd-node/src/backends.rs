//! The node's backends: where its state is kept and what its bus is. The node
//! opens its runtime on the ones it is given, so a PostgreSQL store or a NATS
//! bus plugs in here and nowhere else.
//!
//! **Architecture invariant**: only [`crate::run`] chooses backends; the
//! runtime and the surfaces use the [`StateStore`] and the
//! [`plugd_host::bus::Bus`] they were opened with.

use std::path::Path;
use std::sync::Arc;

use plugd_host::bus::{Bus, LocalBus};
use plugd_store::{StateStore, Store};

/// Where a node keeps its state (approvals, tokens, audit, outbox, sessions,
/// secrets, invocation records).
#[async_trait::async_trait]
pub trait StateBackend: Send + Sync {
    /// The backend's name, for the serving log line (`sqlite`, `postgres`).
    fn name(&self) -> &str;
    /// Opens the store of the workspace whose state directory is `state_dir`
    /// (`DIR/.plugd`), migrated to this build's schema.
    async fn open(&self, state_dir: &Path) -> anyhow::Result<Arc<dyn StateStore>>;
}

/// The state database of the workspace: `.plugd/state.db` (SQLite).
#[derive(Debug, Clone, Copy, Default)]
pub struct SqliteState;

#[async_trait::async_trait]
impl StateBackend for SqliteState {
    fn name(&self) -> &str {
        "sqlite"
    }

    async fn open(&self, state_dir: &Path) -> anyhow::Result<Arc<dyn StateStore>> {
        Ok(Arc::new(Store::open(state_dir)?))
    }
}

/// A cluster's PostgreSQL database (`plugd serve --state postgres://…`),
/// shared by every node: initialised by `plugd cluster init`, and opened
/// only with the master key whose id the cluster recorded.
#[derive(Debug, Clone)]
pub struct PostgresState {
    url: String,
}

impl PostgresState {
    /// The database at `url`.
    pub fn new(url: impl Into<String>) -> PostgresState {
        PostgresState { url: url.into() }
    }
}

#[async_trait::async_trait]
impl StateBackend for PostgresState {
    fn name(&self) -> &str {
        "postgres"
    }

    async fn open(&self, _state_dir: &Path) -> anyhow::Result<Arc<dyn StateStore>> {
        Ok(Arc::new(open_postgres(&self.url).await?))
    }
}

/// Opens the cluster database at `url` for this node (see
/// `PgStore::open_node_with_env_key`).
pub async fn open_postgres(url: &str) -> anyhow::Result<plugd_store_pg::PgStore> {
    Ok(plugd_store_pg::PgStore::open_node_with_env_key(url).await?)
}

/// A connection of node `node` to the cluster's NATS at `url` (`nats://`
/// or `tls://` URLs, comma separated). Credentials in the URL
/// (`nats://user:password@host`, or `nats://token@host`) are sent as such:
/// the client library would otherwise drop them.
pub async fn nats_connect(url: &str, node: &str) -> anyhow::Result<async_nats::Client> {
    let redacted = plugd_nats::redact_url(url);
    let mut servers = Vec::new();
    let mut creds: Option<(String, Option<String>)> = None;
    for u in url.split(',') {
        let addr: async_nats::ServerAddr = u
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("--nats {redacted}: not a NATS URL: {e}"))?;
        if let Some(user) = addr.username() {
            creds = Some((user.to_owned(), addr.password().map(str::to_owned)));
        }
        servers.push(addr);
    }
    let mut options = async_nats::ConnectOptions::new();
    match creds {
        Some((user, Some(password))) => options = options.user_and_password(user, password),
        Some((token, None)) => options = options.token(token),
        None => {}
    }
    options
        .name(format!("plugd {node}"))
        // Back within half a second of NATS returning, however long it
        // was away (the client's default backs off to seconds).
        .reconnect_delay_callback(|attempts| {
            std::time::Duration::from_millis((attempts as u64 * 100).min(500))
        })
        .connect(servers)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to NATS at {redacted}: {e}"))
}

/// The bus of node `node` on the cluster's NATS: events reach every
/// node's subscribers (`plugd_nats::NatsBus`).
pub async fn nats_bus(client: async_nats::Client, node: &str) -> anyhow::Result<Arc<dyn Bus>> {
    let bus = plugd_nats::NatsBus::start(client, node).await?;
    Ok(Arc::new(bus))
}

/// The cluster's approval pins on its NATS (JetStream's Object Store):
/// what a node approves, the others start from, verified by digest.
pub async fn nats_pins(
    client: async_nats::Client,
) -> anyhow::Result<Arc<dyn plugd_store::pin_share::PinBlobs>> {
    let pins = plugd_nats::NatsPinBlobs::open(client)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(Arc::new(pins))
}

/// Node `node`'s hand-offs to the other nodes on the cluster's NATS, in
/// envelopes sealed with a key derived from the cluster's master key.
pub async fn nats_forwarder(
    client: async_nats::Client,
    node: &str,
) -> anyhow::Result<Arc<plugd_nats::NatsForwarder>> {
    let master = plugd_store::secrets::KeySource::from_env()?.require()?;
    let key = master.derive("plugd node envelopes");
    Ok(Arc::new(
        plugd_nats::NatsForwarder::start(client, &key[..], node).await?,
    ))
}

/// The backends a node runs on.
pub struct Backends {
    /// Where state is kept.
    pub state: Box<dyn StateBackend>,
    /// What plugins publish on and receive from (`broker.publish`,
    /// `broker.event`), channels included.
    pub bus: Arc<dyn Bus>,
}

impl Backends {
    /// One machine: the workspace's SQLite database and the in-process bus.
    pub fn local() -> Backends {
        Backends {
            state: Box::new(SqliteState),
            bus: Arc::new(LocalBus::new()),
        }
    }
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("state", &self.state.name())
            .finish_non_exhaustive()
    }
}
