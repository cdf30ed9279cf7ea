//! serve's eager starts: the manifests' eager plugins, plugd.yaml's `eager:`
//! list, and every native plugin with channel registrations
//! (`[[plugin.channels.register]]` or `[plugin.extends].channels`): the nexo
//! host spawns those at boot, so their broker bridge is live without a first
//! call. All are queued once the HTTP API is up. How many start at once is
//! bounded by the host's start gate (`PLUGD_START_CONCURRENCY`), so each
//! plugin's initialize deadline only runs once its turn has come.

use anyhow::Result;
use plugd_runtime::Runtime;

/// Queues every eager start; returns the ids queued.
pub async fn start(rt: &Runtime, extra: &[String]) -> Result<Vec<String>> {
    let mut started = rt.start_eager().await;
    // Channel plugins (nexo §2, §6): started like eager ones, when approved.
    let mut wanted: Vec<String> = extra.to_vec();
    for info in rt.plugin_list().await? {
        let Ok(sup) = rt.supervised(&info.id) else {
            continue;
        };
        let channels = sup
            .spec()
            .native
            .as_ref()
            .is_some_and(|n| !n.channels.is_empty() || !n.extends.channels.is_empty());
        if channels && info.approved && !wanted.contains(&info.id) {
            wanted.push(info.id);
        }
    }
    // `eager:` in plugd.yaml adds to the manifests' own eager starts.
    for id in &wanted {
        if started.contains(id) {
            continue;
        }
        match rt.plugin(id).await {
            Ok(info) if info.approved => {
                rt.supervised(id)?.start();
                started.push(id.clone());
            }
            Ok(info) => {
                tracing::warn!(plugin = %id, state = %info.state, "listed in plugd.yaml eager: but not approved; not started")
            }
            Err(e) => tracing::warn!(plugin = %id, "listed in plugd.yaml eager: {e}"),
        }
    }
    Ok(started)
}
