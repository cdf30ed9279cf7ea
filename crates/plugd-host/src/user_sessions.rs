//! Per-user sessions with a remote MCP server (plugd.yaml
//! `mcp.servers.NAME.upstream_auth`): one upstream MCP session per user,
//! opened lazily with that user's credentials, closed when idle for
//! [`USER_SESSION_IDLE`] (noticed at the next call of any user) and
//! bounded to [`MAX_USER_SESSIONS`] per server (the least recently used is
//! closed first).
//!
//! Why a session per user rather than one pipe with a token per request:
//! an MCP server may bind its session (`Mcp-Session-Id`) and what it
//! keeps in it to the user who opened it, so a session opened with one
//! user's token must never carry another user's call. Each per-user
//! session is a [`Supervised`] of the same spec (same approval, start
//! checks, deadlines, restarts, log), whose start replaces the launch's
//! credentials with the user's ([`UserObserver`]): the pipe, peer and
//! dialect are the ones every server uses.
//!
//! **Invariant**: a per-user session's requests carry only its user's
//! credentials; the server's own headers go with them minus any
//! `Authorization`, and its own OAuth grant never.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plugd_manifest::PluginSpec;

use crate::launch::{Launch, RemoteLaunch};
use crate::supervisor::{Observer, Status, Supervised};

/// Most per-user sessions one server keeps open.
pub const MAX_USER_SESSIONS: usize = 64;
/// A per-user session unused this long is closed.
pub const USER_SESSION_IDLE: Duration = Duration::from_secs(600);

/// The per-user sessions of one supervised server.
#[derive(Default)]
pub(crate) struct UserSessions {
    sessions: Mutex<HashMap<String, (Supervised, Instant)>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl UserSessions {
    /// `subject`'s session, made by `make` when there is none (or the one
    /// there failed); sessions idle too long, and the least recently used
    /// beyond the bound, are returned to be stopped.
    pub(crate) fn get_or_make(
        &self,
        subject: &str,
        make: impl FnOnce() -> Supervised,
    ) -> (Supervised, Vec<Supervised>) {
        let now = Instant::now();
        let mut map = locked(&self.sessions);
        let mut closing = Vec::new();
        map.retain(|key, (sup, used)| {
            let failed = matches!(sup.status(), Status::Failed { .. });
            let idle = now.duration_since(*used) >= USER_SESSION_IDLE && key != subject;
            if idle || failed {
                closing.push(sup.clone());
                return false;
            }
            true
        });
        if let Some((sup, used)) = map.get_mut(subject) {
            *used = now;
            return (sup.clone(), closing);
        }
        while map.len() >= MAX_USER_SESSIONS {
            let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((sup, _)) = map.remove(&oldest) {
                closing.push(sup);
            }
        }
        let sup = make();
        map.insert(subject.to_owned(), (sup.clone(), now));
        (sup, closing)
    }

    /// Every session, removed (the server stops or resets).
    pub(crate) fn take_all(&self) -> Vec<Supervised> {
        locked(&self.sessions)
            .drain()
            .map(|(_, (sup, _))| sup)
            .collect()
    }

    /// `subject`'s session, removed.
    pub(crate) fn take(&self, subject: &str) -> Option<Supervised> {
        locked(&self.sessions).remove(subject).map(|(s, _)| s)
    }

    /// How many are open.
    pub(crate) fn len(&self) -> usize {
        locked(&self.sessions).len()
    }
}

/// The observer of a per-user session: starts are decided by the server's
/// observer, then the launch's credentials become the user's; a handshake
/// does not replace the server's catalog, and a session that gives up is
/// logged, not recorded as the server's failure.
pub(crate) struct UserObserver {
    pub(crate) parent: Arc<dyn Observer>,
    pub(crate) subject: String,
    pub(crate) credentials: Arc<dyn plugd_mcp_http::Credentials>,
}

#[async_trait::async_trait]
impl Observer for UserObserver {
    async fn may_start(&self, spec: &PluginSpec) -> Result<Launch, String> {
        let mut launch = self.parent.may_start(spec).await?;
        let own = launch.remote.as_deref().cloned().unwrap_or_default();
        launch.remote = Some(Arc::new(RemoteLaunch {
            headers: own
                .headers
                .into_iter()
                .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
                .collect(),
            credentials: Some(self.credentials.clone()),
        }));
        Ok(launch)
    }

    fn failed(&self, spec: &PluginSpec, reason: &str) {
        tracing::warn!(plugin = %spec.id, user = %self.subject, "the user's session with the server failed: {reason}");
    }

    fn process_groups(&self, spec: &PluginSpec) -> crate::groups::GroupPlan {
        self.parent.process_groups(spec)
    }
}
