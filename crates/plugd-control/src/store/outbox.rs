//! The durable outbox of semantic events and their per-hook deliveries: the records and the [`OutboxStore`] trait.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Invalid, StoreError};

/// Longest event type accepted.
pub const MAX_EVENT_TYPE_LEN: usize = 128;

/// The stable id of one delivery (`del_` and 16 hex digits): the same on
/// every attempt, so a hook can deduplicate.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeliveryId(pub String);

impl std::fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One hook export that receives an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscriber {
    /// The plugin (VAI package) id, e.g. `acme/devkit`.
    pub plugin_id: String,
    /// The hook export's id in that package.
    pub export_id: String,
}

/// An event to record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    /// The semantic event type, e.g. `run.completed`.
    pub event_type: String,
    /// What it is about, e.g. `{"kind": "run", "id": "run_123"}`.
    pub subject: Value,
    /// Type-specific details, e.g. `{"task": …, "output": …}`.
    pub summary: Value,
}

/// What [`OutboxStore::outbox_enqueue`] recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Enqueued {
    /// The event's id (`evt_` and 16 hex digits).
    pub event_id: String,
    /// The event as it is delivered: `id`, `type`, `occurred_at`, `subject`, `summary`.
    pub event: Value,
    /// One delivery per subscriber, in the subscribers' order.
    pub deliveries: Vec<DeliveryId>,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Not acknowledged yet: due, leased, or waiting for its next attempt.
    Pending,
    /// Acknowledged by the hook.
    Delivered,
    /// Attempt budget spent (or a non-retryable failure): a dead letter.
    Dead,
}

impl DeliveryStatus {
    /// The status as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Dead => "dead",
        }
    }

    /// The value `as_str` names, as a backend stores it.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(DeliveryStatus::Pending),
            "delivered" => Some(DeliveryStatus::Delivered),
            "dead" => Some(DeliveryStatus::Dead),
            _ => None,
        }
    }
}

/// One delivery row, as `plugd outbox list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    /// Row id (what `plugd outbox retry` takes, besides the delivery id).
    pub id: i64,
    /// The stable delivery id.
    pub delivery_id: DeliveryId,
    /// The event's id.
    pub event_id: String,
    /// The event's type.
    pub event_type: String,
    /// The receiving plugin.
    pub plugin_id: String,
    /// The receiving hook export.
    pub export_id: String,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts started so far (the number the last attempt carried); 0 before the first.
    pub attempt: u32,
    /// Attempts counted against the budget (since creation or the last retry).
    pub budget_used: u32,
    /// When the next attempt is due (RFC 3339), for pending deliveries.
    pub next_attempt_at: Option<String>,
    /// The worker holding the lease, while an attempt runs.
    pub leased_by: Option<String>,
    /// When that lease runs out (RFC 3339).
    pub lease_until: Option<String>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When the event was recorded (RFC 3339).
    pub created_at: String,
    /// When the hook acknowledged it (RFC 3339).
    pub delivered_at: Option<String>,
}

/// A delivery leased to a worker: deliver `event` to the export with
/// `delivery.delivery_id` and attempt `delivery.attempt`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leased {
    /// The delivery, with `attempt` already counting this attempt.
    pub delivery: Delivery,
    /// The event to deliver.
    pub event: Value,
}

/// How failed deliveries are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay before the second attempt; doubles for each further one.
    pub base: Duration,
    /// Largest delay between attempts.
    pub cap: Duration,
    /// Attempts (since creation or the last retry) before a delivery is dead.
    pub max_attempts: u32,
}

impl RetryPolicy {
    /// The delay after the `failed`-th failed attempt (1-based):
    /// `min(cap, base * 2^(failed-1))`.
    pub fn delay(&self, failed: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failed.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// What [`OutboxStore::outbox_fail`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailOutcome {
    /// Rescheduled; the next attempt is due at this time (RFC 3339).
    Retry {
        /// When.
        at: String,
        /// After this delay.
        delay: Duration,
    },
    /// Parked as a dead letter.
    Dead,
    /// The worker no longer held the lease (it expired and another worker
    /// took the delivery, or it was acknowledged meanwhile): nothing written.
    LostLease,
}

/// What [`OutboxStore::outbox_retry`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryOutcome {
    /// The dead letter is pending again, due now, with a fresh budget.
    Retried(Delivery),
    /// No delivery has that row id or delivery id.
    NotFound,
    /// The delivery is not a dead letter; nothing changed.
    NotDead(Delivery),
}

/// Whether `t` is an acceptable event type: 1..=128 characters of lower-case
/// ASCII letters, digits, `.`, `_` and `-`, starting with a letter.
pub fn valid_event_type(t: &str) -> bool {
    t.len() <= MAX_EVENT_TYPE_LEN
        && t.starts_with(|c: char| c.is_ascii_lowercase())
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Events written with their deliveries in one transaction, then leased,
/// acknowledged, retried with backoff and dead-lettered.
/// Makes the event that reports a state change from the state after it
/// (the run as it ended, the chain as derived): the store calls it inside
/// the change's transaction and records the event there, so both are
/// written or neither.
pub type Reporter<'a, T> = dyn Fn(&T) -> NewEvent + Send + Sync + 'a;

/// Refuses an event whose type is not a valid name ([`valid_event_type`]).
pub fn check_event(event: &NewEvent) -> Result<(), Invalid> {
    if !valid_event_type(&event.event_type) {
        return Err(Invalid::new(
            format!("event type {:?}", event.event_type),
            "an event type is 1-128 characters of a-z, 0-9, '.', '_' and '-', starting with a letter (e.g. \"run.completed\")",
        ));
    }
    Ok(())
}

#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Writes `event` and one delivery per subscriber, in one transaction.
    async fn outbox_enqueue(
        &self,
        event: &NewEvent,
        subscribers: &[Subscriber],
    ) -> Result<Enqueued, StoreError>;
    /// Leases up to `limit` due deliveries to `worker` for `lease`.
    async fn outbox_lease(
        &self,
        worker: &str,
        lease: Duration,
        limit: usize,
        max_attempts: u32,
    ) -> Result<Vec<Leased>, StoreError>;
    /// Extends a lease `worker` still holds; whether it did.
    async fn outbox_renew(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        lease: Duration,
    ) -> Result<bool, StoreError>;
    /// Marks a delivery delivered; whether it was pending.
    async fn outbox_ack(&self, id: i64) -> Result<bool, StoreError>;
    /// Records a failed attempt: backs off, or dead-letters.
    #[allow(clippy::too_many_arguments)]
    async fn outbox_fail(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        error: &str,
        retryable: bool,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, StoreError>;
    /// Gives a lease back without counting an attempt; whether it did.
    async fn outbox_release(&self, id: i64, worker: &str, attempt: u32)
    -> Result<bool, StoreError>;
    /// Deliveries, all or of one status.
    async fn outbox_list(
        &self,
        status: Option<DeliveryStatus>,
    ) -> Result<Vec<Delivery>, StoreError>;
    /// The events of one type, oldest first.
    async fn outbox_events(&self, event_type: &str) -> Result<Vec<Value>, StoreError>;
    /// One delivery by its `delivery_id`.
    async fn outbox_delivery(&self, key: &str) -> Result<Option<Leased>, StoreError>;
    /// Makes a dead delivery due again with a fresh budget.
    async fn outbox_retry(&self, key: &str) -> Result<RetryOutcome, StoreError>;
    /// How long until the next delivery is due, if any is pending.
    async fn outbox_next_due_in(&self) -> Result<Option<Duration>, StoreError>;
}
