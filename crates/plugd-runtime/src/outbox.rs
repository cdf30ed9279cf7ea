//! Async durable hooks (VAI `hook.handle`): [`OutboxExt::emit`] records semantic events in the outbox, the [`OutboxWorker`] delivers them.
//!
//! `emit` writes the event and one delivery per subscribed VAI hook export
//! (`[exports.hook] subscribes_to`) to the state store in one transaction,
//! before anything is delivered. A worker (started by `plugd serve`) leases
//! due deliveries, calls `hook.handle` with the delivery's stable
//! `delivery_id` and its `attempt` number, and on `ack`/`succeeded` marks it
//! delivered. Errors, timeouts, `retryable_failure` outcomes and plugins that
//! are not approved or not running are retried with exponential backoff
//! ([`OutboxConfig::retry`]) and parked as dead letters once the attempt
//! budget is spent; a `failed` outcome the plugin marks not retryable is
//! parked at once.
//!
//! While an attempt runs, the worker renews its lease every third of
//! [`OutboxConfig::lease`]. If the host dies (`kill -9`), the lease runs out
//! and the next worker — the restarted host, or another host on the same
//! store — delivers the event again with the same `delivery_id` and a higher
//! `attempt`: delivery is at least once, so hooks must be idempotent by
//! `delivery_id`.
//!
//! **Latency:** an event emitted through a [`Runtime`] in the worker's own
//! process wakes the worker at once; one recorded by another process (e.g.
//! `plugd events emit` next to `plugd serve`) is picked up at the next poll,
//! within [`OutboxConfig::poll`] (500 ms by default). Retries are due at
//! their backoff time, checked at the same rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use plugd_dialects::vai::{self, InvokeError};
use plugd_host::dialect::CallContext;
use plugd_manifest::vai::ExportKind;
use plugd_store::outbox::{
    DeliveryId, Enqueued, FailOutcome, Leased, NewEvent, RetryPolicy, Subscriber,
};
use plugd_store::{StateStore, StoreError};
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::Runtime;

/// The semantic event types plugd itself emits. Others may be emitted too
/// (any type accepted by [`plugd_store::outbox::valid_event_type`]).
pub const SEMANTIC_EVENTS: [&str; 4] = [
    "run.completed",
    "chain.compacted",
    "session.created",
    "tool.completed",
];

/// Wakes the workers of this process when an event is emitted here.
static WAKE: LazyLock<Notify> = LazyLock::new(Notify::new);

/// How the outbox worker delivers. [`OutboxConfig::default`] gives the
/// documented defaults; [`OutboxConfig::from_env`] applies overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxConfig {
    /// Backoff and attempt budget: base 1 s (`PLUGD_OUTBOX_BACKOFF_MS`),
    /// doubling per failed attempt up to 5 min (`PLUGD_OUTBOX_BACKOFF_CAP_MS`),
    /// 8 attempts before a dead letter (`PLUGD_OUTBOX_MAX_ATTEMPTS`).
    pub retry: RetryPolicy,
    /// How long a lease lasts without renewal: 30 s (`PLUGD_OUTBOX_LEASE_MS`).
    /// After a crash, deliveries in flight are redelivered once it runs out.
    pub lease: Duration,
    /// How often the store is polled for due deliveries: 500 ms
    /// (`PLUGD_OUTBOX_POLL_MS`).
    pub poll: Duration,
    /// Deadline of one `hook.handle` call, including starting the plugin:
    /// 30 s (`PLUGD_OUTBOX_HOOK_TIMEOUT_MS`); an export's shorter
    /// `default_timeout_ms` wins.
    pub hook_timeout: Duration,
    /// Deliveries in flight at once per worker: 16 (`PLUGD_OUTBOX_MAX_IN_FLIGHT`).
    pub max_in_flight: usize,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            retry: RetryPolicy {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(300),
                max_attempts: 8,
            },
            lease: Duration::from_secs(30),
            poll: Duration::from_millis(500),
            hook_timeout: Duration::from_secs(30),
            max_in_flight: 16,
        }
    }
}

impl OutboxConfig {
    /// The defaults with the `PLUGD_OUTBOX_*` environment overrides applied.
    pub fn from_env() -> Result<Self, OutboxError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The defaults with overrides from `get` (a variable name to its value).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, OutboxError> {
        let mut c = OutboxConfig::default();
        let num = |var: &'static str, unit: &'static str| -> Result<Option<u64>, OutboxError> {
            match get(var) {
                None => Ok(None),
                Some(value) => value
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or(OutboxError::Config { var, value, unit }),
            }
        };
        let millis = Duration::from_millis;
        if let Some(n) = num("PLUGD_OUTBOX_BACKOFF_MS", "milliseconds")? {
            c.retry.base = millis(n);
        }
        if let Some(n) = num("PLUGD_OUTBOX_BACKOFF_CAP_MS", "milliseconds")? {
            c.retry.cap = millis(n);
        }
        if let Some(n) = num("PLUGD_OUTBOX_MAX_ATTEMPTS", "attempts")? {
            c.retry.max_attempts = u32::try_from(n).unwrap_or(u32::MAX);
        }
        if let Some(n) = num("PLUGD_OUTBOX_LEASE_MS", "milliseconds")? {
            c.lease = millis(n);
        }
        if let Some(n) = num("PLUGD_OUTBOX_POLL_MS", "milliseconds")? {
            c.poll = millis(n);
        }
        if let Some(n) = num("PLUGD_OUTBOX_HOOK_TIMEOUT_MS", "milliseconds")? {
            c.hook_timeout = millis(n);
        }
        if let Some(n) = num("PLUGD_OUTBOX_MAX_IN_FLIGHT", "deliveries")? {
            c.max_in_flight = usize::try_from(n).unwrap_or(usize::MAX);
        }
        Ok(c)
    }
}

/// Why an outbox operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// An environment override is not a positive integer.
    #[error("{var}={value:?} is not a positive integer; unset it or give a number of {unit}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it counts.
        unit: &'static str,
    },
    /// The state store failed (or refused the event type).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The outbox operations of a [`Runtime`].
#[async_trait::async_trait]
pub trait OutboxExt {
    /// Every hook export of the workspace's VAI plugins (approved or not)
    /// that subscribes to `event_type`, in plugin and manifest order.
    fn subscribers(&self, event_type: &str) -> Vec<Subscriber>;

    /// Records a semantic event with one delivery per subscriber, in one
    /// transaction, and wakes this process's workers. Returns the delivery
    /// ids (none when nothing subscribes). Delivery happens later, in a
    /// worker ([`OutboxWorker`], run by `plugd serve`).
    async fn emit(
        &self,
        event_type: &str,
        subject: Value,
        summary: Value,
    ) -> Result<Vec<DeliveryId>, OutboxError>;
}

#[async_trait::async_trait]
impl OutboxExt for Runtime {
    fn subscribers(&self, event_type: &str) -> Vec<Subscriber> {
        let mut out = Vec::new();
        for (id, sup) in self.inner.plugins.iter() {
            let Some(vai) = &sup.spec().vai else { continue };
            for export in &vai.exports {
                let subscribed = export.kind == ExportKind::Hook
                    && export
                        .hook
                        .as_ref()
                        .is_some_and(|h| h.subscribes_to.iter().any(|t| t == event_type));
                if subscribed {
                    out.push(Subscriber {
                        plugin_id: id.clone(),
                        export_id: export.id.clone(),
                    });
                }
            }
        }
        out
    }

    async fn emit(
        &self,
        event_type: &str,
        subject: Value,
        summary: Value,
    ) -> Result<Vec<DeliveryId>, OutboxError> {
        let subscribers = self.subscribers(event_type);
        let event = NewEvent {
            event_type: event_type.to_owned(),
            subject,
            summary,
        };
        let q = self.state().outbox_enqueue(&event, &subscribers).await?;
        tracing::debug!(event = %q.event_id, event_type, deliveries = q.deliveries.len(), "event recorded in the outbox");
        if !q.deliveries.is_empty() {
            WAKE.notify_waiters();
        }
        Ok(q.deliveries)
    }
}

/// Wakes this process's delivery workers for `queued` (recorded in the
/// transaction of the state change it reports) when it has deliveries.
pub fn woke(queued: &Enqueued) {
    tracing::debug!(event = %queued.event_id, deliveries = queued.deliveries.len(), "event recorded in the outbox");
    if !queued.deliveries.is_empty() {
        WAKE.notify_waiters();
    }
}

/// A running delivery worker. Dropping it (or [`OutboxWorker::stop`]) stops
/// it; attempts in flight are abandoned and their leases given back, so the
/// next worker delivers them at once without counting the abandoned attempt.
#[derive(Debug)]
pub struct OutboxWorker {
    id: String,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl OutboxWorker {
    /// Starts a worker for `rt`'s outbox on the current tokio runtime.
    pub fn spawn(rt: &Runtime, config: OutboxConfig) -> OutboxWorker {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        // `NODE/outbox-PID-…`: a lease names the node holding it.
        let id = format!(
            "{}/outbox-{}-{}-{}",
            rt.node_id(),
            std::process::id(),
            plugd_store::outbox::now_ms(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(rt.clone(), config, id.clone(), stopped));
        OutboxWorker {
            id,
            stop,
            task: Some(task),
        }
    }

    /// This worker's name, as leases record it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stops the worker and waits until its leases are given back.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for OutboxWorker {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The leases a worker holds: delivery row id → attempt.
type Held = Arc<Mutex<HashMap<i64, u32>>>;

fn held(h: &Held) -> std::sync::MutexGuard<'_, HashMap<i64, u32>> {
    h.lock().unwrap_or_else(|p| p.into_inner())
}

async fn run(
    rt: Runtime,
    config: OutboxConfig,
    worker: String,
    mut stopped: watch::Receiver<bool>,
) {
    let store = rt.state().clone();
    let holding: Held = Arc::default();
    let mut inflight = JoinSet::new();
    let config = Arc::new(config);
    tracing::debug!(worker, "outbox worker started");
    loop {
        if *stopped.borrow() {
            break;
        }
        let room = config.max_in_flight.saturating_sub(inflight.len());
        let mut wait = config.poll;
        if room > 0 {
            match store
                .outbox_lease(&worker, config.lease, room, config.retry.max_attempts)
                .await
            {
                Ok(leased) => {
                    for l in leased {
                        held(&holding).insert(l.delivery.id, l.delivery.attempt);
                        inflight.spawn(deliver(
                            rt.clone(),
                            config.clone(),
                            worker.clone(),
                            holding.clone(),
                            l,
                        ));
                    }
                    if inflight.len() < config.max_in_flight {
                        match store.outbox_next_due_in().await {
                            Ok(Some(due)) => wait = wait.min(due),
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(worker, error = %e, "outbox: cannot read the next due time")
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(worker, error = %e, "outbox: cannot lease deliveries; retrying at the next poll")
                }
            }
        }
        // Never spin: something due "now" that was not leased is held by a
        // live lease or beyond this worker's room.
        let wait = wait.max(Duration::from_millis(10));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = WAKE.notified() => {}
            Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
            _ = stopped.changed() => break,
        }
    }
    inflight.abort_all();
    while inflight.join_next().await.is_some() {}
    let left: Vec<(i64, u32)> = held(&holding).drain().collect();
    for (id, attempt) in left {
        if let Err(e) = store.outbox_release(id, &worker, attempt).await {
            tracing::warn!(worker, delivery = id, error = %e, "outbox: cannot give a lease back; it runs out by itself");
        }
    }
    tracing::debug!(worker, "outbox worker stopped");
}

/// Why an attempt failed, and whether another may succeed.
struct Failed {
    message: String,
    retryable: bool,
}

fn retry(message: impl std::fmt::Display) -> Failed {
    Failed {
        message: message.to_string(),
        retryable: true,
    }
}

async fn deliver(rt: Runtime, config: Arc<OutboxConfig>, worker: String, holding: Held, l: Leased) {
    let store: Arc<dyn StateStore> = rt.state().clone();
    let d = &l.delivery;
    let renew = {
        let (store, worker, every) = (store.clone(), worker.clone(), config.lease / 3);
        let (id, attempt, lease) = (d.id, d.attempt, config.lease);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every.max(Duration::from_millis(5))).await;
                match store.outbox_renew(id, &worker, attempt, lease).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(
                            delivery = id,
                            worker,
                            "outbox: lost the lease during an attempt; another worker may deliver it again"
                        );
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(delivery = id, error = %e, "outbox: cannot renew a lease")
                    }
                }
            }
        })
    };
    let started = Instant::now();
    let outcome = attempt(&rt, &config, &l).await;
    renew.abort();
    held(&holding).remove(&d.id);
    let span = (
        &d.delivery_id.0,
        d.attempt,
        &d.plugin_id,
        &d.export_id,
        &d.event_type,
    );
    let (delivery, attempt_no, plugin, export, event_type) = span;
    match outcome {
        Ok(()) => match store.outbox_ack(d.id).await {
            Ok(_) => tracing::info!(
                delivery,
                attempt = attempt_no,
                plugin,
                export,
                event_type,
                ms = started.elapsed().as_millis() as u64,
                "hook delivery acknowledged"
            ),
            Err(e) => {
                tracing::warn!(delivery, error = %e, "outbox: the hook acknowledged, but recording it failed; it will be delivered again")
            }
        },
        Err(f) => {
            match store
                .outbox_fail(
                    d.id,
                    &worker,
                    d.attempt,
                    &f.message,
                    f.retryable,
                    &config.retry,
                )
                .await
            {
                Ok(FailOutcome::Retry { at, delay }) => {
                    tracing::warn!(delivery, attempt = attempt_no, plugin, export, event_type, error = %f.message, retry_at = %at, delay_ms = delay.as_millis() as u64, "hook delivery failed; will retry")
                }
                Ok(FailOutcome::Dead) => {
                    tracing::warn!(delivery, attempt = attempt_no, plugin, export, event_type, error = %f.message, "hook delivery failed for good; parked as a dead letter (`plugd outbox list --dead`, `plugd outbox retry`)")
                }
                Ok(FailOutcome::LostLease) => {
                    tracing::warn!(delivery, attempt = attempt_no, error = %f.message, "hook delivery failed after this worker lost its lease; another worker owns it now")
                }
                Err(e) => {
                    tracing::warn!(delivery, error = %e, "outbox: cannot record a failed delivery; its lease runs out and it is delivered again")
                }
            }
        }
    }
}

/// One `hook.handle` attempt: starts the plugin if needed (only if it is
/// approved and unchanged), calls the export, classifies the outcome.
async fn attempt(rt: &Runtime, config: &OutboxConfig, l: &Leased) -> Result<(), Failed> {
    let d = &l.delivery;
    // A compaction job: a delivery to a compactor export (only plugd
    // records those; hooks subscribed to the same type are hooks).
    if d.event_type == crate::compaction::COMPACTION_JOB
        && rt
            .resolve_export(
                &format!("{}/{}", d.plugin_id, d.export_id),
                ExportKind::Compactor,
            )
            .await
            .is_ok()
    {
        return rt
            .agent_parts()
            .compaction_job(rt.clone(), l.clone())
            .await
            .map_err(|f| Failed {
                message: f.message,
                retryable: f.retryable,
            });
    }
    let sup = rt
        .supervised(&d.plugin_id)
        .map_err(|e| retry(format!("cannot deliver to plugin {:?}: {e}", d.plugin_id)))?;
    if let Some(reason) = rt.operator_stopped(&d.plugin_id) {
        return Err(retry(reason));
    }
    let deadline = Instant::now() + config.hook_timeout;
    // The event's session, when it names one, scopes the hook's delegated
    // token (a hook export with `gateway_api_scopes`, e.g. `runs:read`).
    let summary = l.event.get("summary");
    let text = |k: &str| {
        summary
            .and_then(|s| s.get(k))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let ctx = CallContext {
        trace_id: Some(format!("tr_{}", d.delivery_id)),
        session_id: text("session_id"),
        invocation_id: Some(format!("inv_{}_{}", d.delivery_id, d.attempt)),
        ..CallContext::default()
    };
    let minted = rt.delegate(sup.spec(), &d.export_id, &ctx, config.hook_timeout);
    let ctx = CallContext {
        gateway: minted.as_ref().map(|m| m.grant.clone()),
        ..ctx
    };
    // The process of the hook's own process group (its execution class).
    let conn = sup
        .export_connection(&d.export_id, &ctx, deadline)
        .await
        .map_err(|e| retry(e.to_string()))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    match vai::handle_hook(
        &conn,
        &d.export_id,
        &d.delivery_id.0,
        d.attempt,
        l.event.clone(),
        conn.context(),
        left,
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) => {
            // Only the plugin's own "failed, do not retry" is final; a
            // `cancelled` or `retryable_failure` status, a timeout, a crash or
            // a protocol error may go better next time.
            let final_ = matches!(&e, InvokeError::Failed { retryable: false, status, .. } if status == "failed");
            Err(Failed {
                message: e.to_string(),
                retryable: !final_,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_lookup() {
        let c = OutboxConfig::from_lookup(|k| match k {
            "PLUGD_OUTBOX_MAX_ATTEMPTS" => Some("3".into()),
            "PLUGD_OUTBOX_LEASE_MS" => Some(" 1500 ".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.retry.max_attempts, 3);
        assert_eq!(c.lease, Duration::from_millis(1500));
        assert_eq!(c.poll, OutboxConfig::default().poll);
        let e =
            OutboxConfig::from_lookup(|k| (k == "PLUGD_OUTBOX_POLL_MS").then(|| "0".to_owned()))
                .unwrap_err();
        assert_eq!(
            e.to_string(),
            "PLUGD_OUTBOX_POLL_MS=\"0\" is not a positive integer; unset it or give a number of milliseconds"
        );
    }
}
