//! [`PluginRow`]: one plugin as `GET /v1/plugins` and `plugd plugin list
//! --json` show it, defined once for both surfaces.

use serde::Serialize;

use crate::PluginInfo;

/// One row of `GET /v1/plugins` and `plugd plugin list --json`: the
/// plugin's identity and state, and (serve only, [`PluginRow::live`]) its
/// supervisor's counters.
#[derive(Debug, Serialize)]
pub struct PluginRow<'a> {
    /// Plugin id.
    pub id: &'a str,
    /// Manifest dialect.
    pub dialect: &'a str,
    /// State.
    pub state: &'a str,
    /// Approved and unchanged.
    pub approved: bool,
    /// Version.
    pub version: Option<&'a str>,
    /// Tools.
    pub tools: &'a [String],
    /// Directory.
    pub dir: &'a std::path::Path,
    /// Why it is invalid, changed or failed.
    pub error: Option<&'a str>,
    /// The counters of a long-running supervisor (serve's rows), flattened
    /// into the row; absent from the CLI's local listing.
    #[serde(flatten)]
    pub live: Option<LiveRow<'a>>,
}

/// The counters serve's rows add.
#[derive(Debug, Serialize)]
pub struct LiveRow<'a> {
    /// Restarts after a crash or a failed start since serve loaded it.
    pub restarts: u64,
    /// The live connection's counters (shed notifications, junk and
    /// oversized frames), when it runs.
    pub stats: Option<&'a plugd_host::PeerStats>,
}

impl<'a> PluginRow<'a> {
    /// The row of `p` without the supervisor's counters (`plugd plugin
    /// list --json`).
    pub fn local(p: &'a PluginInfo) -> PluginRow<'a> {
        PluginRow {
            id: &p.id,
            dialect: &p.dialect,
            state: &p.state,
            approved: p.approved,
            version: p.version.as_deref(),
            tools: &p.tools,
            dir: &p.dir,
            error: p.error.as_deref(),
            live: None,
        }
    }

    /// The row of `p` with its restarts and connection counters (serve's
    /// `GET /v1/plugins`).
    pub fn live(p: &'a PluginInfo) -> PluginRow<'a> {
        PluginRow {
            live: Some(LiveRow {
                restarts: p.restarts,
                stats: p.stats.as_ref(),
            }),
            ..PluginRow::local(p)
        }
    }
}
