//! The runtime's change feed for live surfaces (`GET /v1/events`): one
//! bounded [`tokio::sync::broadcast`] channel of [`RtEvent`]s.
//!
//! Sources: each plugin's supervisor status (a watch, forwarded at most
//! [`PER_SECOND`] times a second per plugin), the tool registry's change
//! counter (`touch`, same bound), approvals and revocations, settings
//! changes, call approvals appearing or being decided (woken by the risk
//! gate's notify, re-counted from the store at least every
//! [`APPROVALS_POLL`] so decisions made by another process show too), and
//! every invocation record the recorder takes.
//!
//! The forwarders start with the first subscriber ([`Runtime::subscribe_events`]),
//! inside serve's tokio runtime; a CLI command that never subscribes starts
//! nothing. Events carry ids, not snapshots: a surface reads the current
//! state when it sends, so a coalesced or skipped event loses nothing but
//! its moment.
//!
//! **Architecture invariant**: nothing here buffers per subscriber beyond
//! the channel's [`EVENT_QUEUE`] slots; a subscriber that falls behind gets
//! `Lagged` and skips, it never holds up a plugin or a call.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use plugd_control::invocations::InvocationRecord;
use tokio::sync::broadcast;

use crate::Runtime;

/// Slots of the broadcast channel.
pub const EVENT_QUEUE: usize = 256;

/// Most `plugin` events per plugin (and `tools` events) per second.
pub const PER_SECOND: u64 = 4;

/// How often pending call approvals are re-counted without a wake-up.
pub const APPROVALS_POLL: Duration = Duration::from_secs(1);

/// One change.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RtEvent {
    /// The state, approval, restarts or settings of a plugin changed.
    Plugin(Arc<str>),
    /// The tool catalog or the enabled set changed.
    Tools,
    /// The number of pending call approvals changed to this.
    Approvals(usize),
    /// An invocation record was taken.
    Invocation(Arc<InvocationRecord>),
}

/// The channel and the once-only start of its forwarders.
#[derive(Debug)]
pub(crate) struct Events {
    tx: broadcast::Sender<RtEvent>,
    started: OnceLock<()>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(EVENT_QUEUE).0,
            started: OnceLock::new(),
        }
    }
}

impl Events {
    /// The sender, for sources outside the runtime's own state.
    pub(crate) fn sender(&self) -> broadcast::Sender<RtEvent> {
        self.tx.clone()
    }

    /// Sends `event` if anyone listens.
    pub(crate) fn send(&self, event: RtEvent) {
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(event);
        }
    }
}

fn pause() -> Duration {
    Duration::from_millis(1000 / PER_SECOND)
}

impl Runtime {
    /// A receiver of every later change; starts the forwarders on first use
    /// (call from within a tokio runtime).
    pub fn subscribe_events(&self) -> broadcast::Receiver<RtEvent> {
        let rx = self.inner.events.tx.subscribe();
        self.inner
            .events
            .started
            .get_or_init(|| self.start_forwarders());
        rx
    }

    /// Tells subscribers that plugin `id` changed (approval, settings).
    pub fn plugin_changed(&self, id: &str) {
        self.inner.events.send(RtEvent::Plugin(Arc::from(id)));
    }

    fn start_forwarders(&self) {
        let tx = self.inner.events.sender();
        for (id, sup) in self.inner.plugins.iter() {
            let mut status = sup.watch();
            let (tx, id): (_, Arc<str>) = (tx.clone(), Arc::from(id.as_str()));
            tokio::spawn(async move {
                while status.changed().await.is_ok() {
                    if tx.receiver_count() > 0 {
                        let _ = tx.send(RtEvent::Plugin(id.clone()));
                    }
                    // Changes during the pause are coalesced into one.
                    tokio::time::sleep(pause()).await;
                }
            });
        }
        let mut tools = crate::read(&self.inner.registry).subscribe();
        let t = tx.clone();
        tokio::spawn(async move {
            while tools.changed().await.is_ok() {
                if t.receiver_count() > 0 {
                    let _ = t.send(RtEvent::Tools);
                }
                tokio::time::sleep(pause()).await;
            }
        });
        // Pending approvals: woken by every decision and request, re-counted
        // on a timer for timeouts and other processes' decisions. Holds the
        // runtime weakly so it ends with it.
        let weak = Arc::downgrade(&self.inner);
        let decided = self.inner.risk.decided.clone();
        tokio::spawn(async move {
            let mut last: Option<usize> = None;
            loop {
                let notified = decided.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let Some(inner) = weak.upgrade() else { return };
                if tx.receiver_count() > 0 {
                    let store = inner.state.clone();
                    drop(inner);
                    let count = store.call_approvals_pending().await.ok().map(|p| p.len());
                    if let Some(n) = count
                        && last != Some(n)
                    {
                        last = Some(n);
                        let _ = tx.send(RtEvent::Approvals(n));
                    }
                } else {
                    drop(inner);
                    last = None;
                }
                tokio::select! {
                    () = &mut notified => {}
                    () = tokio::time::sleep(APPROVALS_POLL) => {}
                }
            }
        });
    }
}
