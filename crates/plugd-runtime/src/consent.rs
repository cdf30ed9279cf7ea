//! The runtime's consent caches (disabled tools, approvals) kept exact across processes and nodes by the store's control epoch.
//!
//! Every change to tokens, approvals, disabled tools, call-approval
//! decisions, plugin settings, packages and bindings bumps the control epoch
//! in the same transaction (a trigger on each table, both backends). A call
//! reads the epoch before it is governed, at most once per
//! [`CONSENT_RECHECK`] for all calls of the runtime (one read in flight;
//! the calls of that millisecond share it); when it moved, the disabled
//! tools are read again and every plugin whose approval is gone from the
//! store stops and loses its tools, as if revoked here. A task does the same
//! every [`CONSENT_POLL`] so that listings follow without calls.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Runtime, RuntimeError, read, write};

/// How long one read of the control epoch answers for every call.
pub const CONSENT_RECHECK: Duration = Duration::from_millis(1);

/// How often the runtime's task reads the epoch when no call does.
pub const CONSENT_POLL: Duration = Duration::from_millis(200);

/// The last epoch this runtime brought its caches up to, and when it was read.
#[derive(Default)]
pub(crate) struct ConsentWatch {
    seen: std::sync::Mutex<Option<(Instant, i64)>>,
    /// One epoch read at a time; the calls waiting on it use its answer.
    flight: tokio::sync::Mutex<()>,
}

impl ConsentWatch {
    fn seen(&self) -> Option<(Instant, i64)> {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fresh(&self) -> bool {
        self.seen()
            .is_some_and(|(at, _)| at.elapsed() < CONSENT_RECHECK)
    }
}

impl Runtime {
    /// Brings the consent caches up to the store's control epoch (see the
    /// module); an error when the store cannot be read (the call is refused
    /// with it: nothing is governed on a stale view).
    pub(crate) async fn consent_current(&self) -> Result<(), RuntimeError> {
        let watch = &self.inner.consent;
        if watch.fresh() {
            return Ok(());
        }
        let _one = watch.flight.lock().await;
        if watch.fresh() {
            return Ok(());
        }
        let read_at = Instant::now();
        // A read the store made for anything else this millisecond (its
        // token checks) serves too.
        let epoch = self
            .inner
            .state
            .control_epoch_within(CONSENT_RECHECK)
            .await?;
        if watch.seen().map(|(_, e)| e) != Some(epoch) {
            self.refresh_disabled().await?;
            self.withdraw_revoked().await?;
            self.follow_approvals().await?;
        } else if self.inner.shared_pins.retry_due() {
            // An approval's pin could not be taken yet: try it again.
            self.follow_approvals().await?;
        }
        *watch.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((read_at, epoch));
        Ok(())
    }

    /// Stops every supervised plugin that holds tools here but whose
    /// approval is no longer in the store (revoked through another process
    /// or node), each under its approval lock and checked again there, so
    /// an approval made meanwhile stands.
    async fn withdraw_revoked(&self) -> Result<(), RuntimeError> {
        let approved: BTreeSet<String> = self
            .inner
            .state
            .approvals()
            .await?
            .into_iter()
            .map(|a| a.plugin_id)
            .collect();
        let supervised = self.inner.plugins.snapshot();
        let holding: BTreeSet<String> = read(&self.inner.registry)
            .list()
            .into_iter()
            .map(|t| t.plugin.clone())
            .filter(|p| supervised.map.contains_key(p) && !approved.contains(p))
            .collect();
        for id in holding {
            let lock = self.approval_lock(&id);
            let _serial = lock.lock().await;
            if self.inner.state.approval(&id).await?.is_some() {
                continue;
            }
            let Ok(sup) = self.supervised(&id) else {
                continue;
            };
            tracing::warn!(plugin = %id, "approval withdrawn in the store (another process or node): stopping it");
            write(&self.inner.registry).remove_plugin(&id);
            self.inner.withheld.remove(&id);
            sup.stop().await;
            self.release_pin(&id);
            // Taken from the cluster: it leaves this node with its approval.
            self.forget_adopted(&id).await;
        }
        Ok(())
    }
}

/// Reads the control epoch every [`CONSENT_POLL`] while the runtime lives,
/// so that listings follow changes made elsewhere without a call.
pub(crate) fn watch(rt: &Runtime) {
    let weak = Arc::downgrade(&rt.inner);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(CONSENT_POLL).await;
            let Some(inner) = weak.upgrade() else { return };
            let rt = Runtime { inner };
            if let Err(e) = rt.consent_current().await {
                tracing::warn!(error = %e, "cannot read the control epoch; calls are refused until it can be read");
            }
        }
    });
}
