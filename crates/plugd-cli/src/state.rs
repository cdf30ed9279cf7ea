//! The state store a CLI command opens when it works on the workspace itself (no serve running): one place that picks the backend.
//!
//! `PLUGD_STATE`, else plugd.yaml's `state:` (a `postgres://` URL: the
//! cluster's database, opened with this machine's master key), else the
//! workspace's SQLite file, as `plugd serve` picks (without its `--state`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use plugd_store::{StateStore, Store};

/// The state store of the workspace at `dir`, as the backend-neutral trait
/// object.
pub async fn open(dir: &Path) -> anyhow::Result<Arc<dyn StateStore>> {
    let yaml = plugd_runtime::config::PlugdConfig::load(dir).ok();
    match plugd_runtime::config::state_url(None, yaml.as_ref()) {
        Some(url) => Ok(Arc::new(
            plugd_store_pg::PgStore::open_node_with_env_key(&url).await?,
        )),
        None => Ok(Arc::new(
            Store::open(&dir.join(".plugd")).context("open the workspace's state")?,
        )),
    }
}
