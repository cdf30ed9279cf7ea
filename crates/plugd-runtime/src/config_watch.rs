//! Serve's watch on `plugd.yaml` and the workspace: each second the config
//! gate ([`crate::config_gate`]) puts a narrowing change in force or holds
//! a widening one, plugin directories added since the last look are
//! supervised ([`Runtime::rescan`]), and what changed reaches running
//! plugins without a restart (the microapps' `agents/updated`, the roots
//! offered to MCP servers with `notifications/roots/list_changed`); and its
//! watch on the Dexto module files the hook pipeline loaded
//! ([`watch_modules`]).

use std::sync::Arc;
use std::time::Duration;

use crate::Runtime;
use crate::config::PlugdConfig;
use crate::config_gate::ConfigGate;
use crate::hooks::Pipeline;

/// How often serve re-reads `plugd.yaml`.
pub const CONFIG_POLL: Duration = Duration::from_secs(1);

/// How often serve looks at the Dexto module files.
pub const MODULE_POLL: Duration = Duration::from_secs(1);

/// Run by serve: every [`MODULE_POLL`], each handler of `pipeline` whose
/// source changed reloads ([`Pipeline::reload_changed`]); a Dexto module
/// whose new version fails to load keeps its previous instance and says so
/// in the log (see `hooks::dexto`, "Reloading").
pub async fn watch_modules(pipeline: Arc<Pipeline>) {
    loop {
        tokio::time::sleep(MODULE_POLL).await;
        pipeline.reload_changed().await;
    }
}

impl Runtime {
    /// Run by serve: every [`CONFIG_POLL`] lets `gate` look at `plugd.yaml`,
    /// rescans the workspace when its plugin directories or entry files
    /// changed, then reads the configuration in force: when the agent view
    /// ([`Runtime::agents`]) changed it sends `agents/updated` and refreshes
    /// the microapps' catalogs, and it applies the `mcp:` roots
    /// ([`Runtime::apply_mcp_config`]). A `plugd.yaml` that does not parse is
    /// logged once and ignored until it does.
    pub async fn watch_config(self, gate: Arc<ConfigGate>) {
        let mut last = PlugdConfig::load(self.dir()).ok().map(|c| self.agents(&c));
        let mut warned = false;
        // No fingerprint yet: the first tick rescans, so a plugin directory
        // added between the runtime's discovery and this task's start (a
        // loaded machine can put seconds between them) is found too.
        let mut seen = Vec::new();
        loop {
            tokio::time::sleep(CONFIG_POLL).await;
            gate.tick().await;
            let now = crate::workspace::fingerprint(self.dir());
            if now != seen {
                seen = now;
                self.rescan().await;
            }
            let config = match PlugdConfig::load(self.dir()) {
                Ok(config) => config,
                Err(e) => {
                    if !warned {
                        warned = true;
                        tracing::warn!(
                            "plugd.yaml changed but does not load ({e}); running plugins are not told until it does"
                        );
                    }
                    continue;
                }
            };
            warned = false;
            let told = self.apply_mcp_config(&config.mcp);
            if !told.is_empty() {
                tracing::info!(servers = ?told, "MCP roots changed: roots/list_changed sent");
            }
            let now = self.agents(&config);
            if last.as_ref() != Some(&now) {
                let ids: Vec<String> = now
                    .iter()
                    .filter_map(|a| a["id"].as_str().map(str::to_owned))
                    .collect();
                tracing::info!(agents = ?ids, "agent configuration changed: agents/updated sent to microapps");
                last = Some(now);
                self.agents_updated(&ids).await;
            }
        }
    }
}
