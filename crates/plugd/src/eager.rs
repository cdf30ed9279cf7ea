//! serve's eager starts: the manifests' eager plugins plus plugd.yaml's
//! `eager:` list, queued once the HTTP API is up. How many start at once is
//! bounded by the host's start gate (`PLUGD_START_CONCURRENCY`), so each
//! plugin's initialize deadline only runs once its turn has come.

use anyhow::Result;
use plugd_runtime::Runtime;

/// Queues every eager start; returns the ids queued.
pub fn start(rt: &Runtime, extra: &[String]) -> Result<Vec<String>> {
    let mut started = rt.start_eager();
    // `eager:` in plugd.yaml adds to the manifests' own eager starts.
    for id in extra {
        if started.contains(id) {
            continue;
        }
        match rt.plugin(id) {
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
