//! The durable outbox: semantic events and their per-hook deliveries, leased, retried and dead-lettered.
//!
//! An event (`run.completed`, `chain.compacted`, …) is written together with
//! one delivery row per subscribed hook export, in one transaction, *before*
//! anything is delivered ([`Store::outbox_enqueue`]). Workers then
//! [lease](Store::outbox_lease) due deliveries: a lease names the worker and
//! expires, so the deliveries of a worker that crashed (or a host killed with
//! `kill -9`) become due again when its lease runs out and another worker
//! delivers them, with the same `delivery_id` and a higher `attempt`.
//!
//! A delivery is `pending` until a worker [acknowledges](Store::outbox_ack)
//! it (`delivered`) or its attempt budget is spent (`dead`, a dead letter,
//! until [`Store::outbox_retry`] puts it back with a fresh budget). Failures
//! are rescheduled by [`Store::outbox_fail`] with exponential backoff
//! ([`RetryPolicy`]).
//!
//! `attempt` only ever grows for a delivery: it counts every attempt started,
//! including ones whose worker died. The attempt budget counts the attempts
//! since the last retry (`attempt - budget_from`), so a retried dead letter
//! is delivered with attempt numbers that continue where they stopped.
//!
//! **API boundary:** plain data in, plain data out ([`NewEvent`],
//! [`Subscriber`], [`Delivery`], [`Leased`]); times are RFC 3339 strings.
//! Nothing here is SQLite-specific except the statements themselves.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde_json::{Value, json};

pub(crate) use plugd_control::store::outbox::check_event;

use crate::error::StoreError;
use crate::store::Store;
use crate::time::format_unix_secs;

pub use plugd_control::store::outbox::{
    Delivery, DeliveryId, DeliveryStatus, Enqueued, FailOutcome, Leased, MAX_EVENT_TYPE_LEN,
    NewEvent, Reporter, RetryOutcome, RetryPolicy, Subscriber, valid_event_type,
};

/// Schema step 3: the outbox tables.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE outbox_events (
        id          INTEGER PRIMARY KEY,
        event_id    TEXT NOT NULL UNIQUE,
        event_type  TEXT NOT NULL,
        occurred_at TEXT NOT NULL,
        body        TEXT NOT NULL
    ) STRICT;
    CREATE TABLE outbox_deliveries (
        id              INTEGER PRIMARY KEY,
        delivery_id     TEXT NOT NULL UNIQUE,
        event           INTEGER NOT NULL REFERENCES outbox_events (id),
        plugin_id       TEXT NOT NULL,
        export_id       TEXT NOT NULL,
        status          TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'dead')),
        attempt         INTEGER NOT NULL DEFAULT 0,
        budget_from     INTEGER NOT NULL DEFAULT 0,
        next_attempt_ms INTEGER NOT NULL,
        lease_owner     TEXT,
        lease_until_ms  INTEGER,
        last_error      TEXT,
        created_at      TEXT NOT NULL,
        delivered_at    TEXT
    ) STRICT;
    CREATE INDEX outbox_due ON outbox_deliveries (status, next_attempt_ms);
";

/// Milliseconds since the Unix epoch (0 for a clock before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn rfc3339_ms(ms: i64) -> String {
    format_unix_secs(u64::try_from(ms.max(0) / 1000).unwrap_or(0))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

const DELIVERY_COLUMNS: &str =
    "d.id, d.delivery_id, e.event_id, e.event_type, d.plugin_id, d.export_id,
     d.status, d.attempt, d.budget_from, d.next_attempt_ms, d.lease_owner, d.lease_until_ms,
     d.last_error, d.created_at, d.delivered_at, e.body";

/// A delivery row before its status and event body are checked.
struct RawDelivery {
    id: i64,
    delivery_id: String,
    event_id: String,
    event_type: String,
    plugin_id: String,
    export_id: String,
    status: String,
    attempt: i64,
    budget_from: i64,
    next_attempt_ms: i64,
    lease_owner: Option<String>,
    lease_until_ms: Option<i64>,
    last_error: Option<String>,
    created_at: String,
    delivered_at: Option<String>,
    body: String,
}

fn raw_delivery(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawDelivery> {
    Ok(RawDelivery {
        id: r.get(0)?,
        delivery_id: r.get(1)?,
        event_id: r.get(2)?,
        event_type: r.get(3)?,
        plugin_id: r.get(4)?,
        export_id: r.get(5)?,
        status: r.get(6)?,
        attempt: r.get(7)?,
        budget_from: r.get(8)?,
        next_attempt_ms: r.get(9)?,
        lease_owner: r.get(10)?,
        lease_until_ms: r.get(11)?,
        last_error: r.get(12)?,
        created_at: r.get(13)?,
        delivered_at: r.get(14)?,
        body: r.get(15)?,
    })
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// Records `event` and one pending delivery per subscriber inside `tx`, the
/// transaction of the state change it reports (checked by [`check_event`]).
pub(crate) fn enqueue_in(
    tx: &rusqlite::Transaction<'_>,
    event: &NewEvent,
    subscribers: &[Subscriber],
) -> rusqlite::Result<Enqueued> {
    let occurred_at = crate::now_rfc3339();
    let event_id: String = tx.query_row("SELECT 'evt_' || lower(hex(randomblob(8)))", [], |r| {
        r.get(0)
    })?;
    let body = json!({
        "id": event_id,
        "type": event.event_type,
        "occurred_at": occurred_at,
        "subject": event.subject,
        "summary": event.summary,
    });
    tx.execute(
        "INSERT INTO outbox_events (event_id, event_type, occurred_at, body)
         VALUES (?1, ?2, ?3, ?4)",
        params![event_id, event.event_type, occurred_at, body.to_string()],
    )?;
    let row = tx.last_insert_rowid();
    let now = now_ms();
    let mut deliveries = Vec::with_capacity(subscribers.len());
    let mut insert = tx.prepare(
        "INSERT INTO outbox_deliveries
            (delivery_id, event, plugin_id, export_id, status, next_attempt_ms, created_at)
         VALUES ('del_' || lower(hex(randomblob(8))), ?1, ?2, ?3, 'pending', ?4, ?5)
         RETURNING delivery_id",
    )?;
    for s in subscribers {
        let id: String = insert.query_row(
            params![row, s.plugin_id, s.export_id, now, occurred_at],
            |r| r.get(0),
        )?;
        deliveries.push(DeliveryId(id));
    }
    Ok(Enqueued {
        event_id,
        event: body,
        deliveries,
    })
}

impl Store {
    fn decode_delivery(&self, r: RawDelivery) -> Result<Leased, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            db: self.label().to_owned(),
            plugin_id: r.plugin_id.clone(),
            detail,
        };
        let status = DeliveryStatus::parse(&r.status).ok_or_else(|| {
            corrupt(format!(
                "outbox delivery {} has unknown status {:?}",
                r.delivery_id, r.status
            ))
        })?;
        let event: Value = serde_json::from_str(&r.body).map_err(|e| {
            corrupt(format!(
                "outbox event {} is not JSON ({e}); `plugd outbox list` shows its deliveries",
                r.event_id
            ))
        })?;
        let leased = r.lease_until_ms.is_some() && status == DeliveryStatus::Pending;
        Ok(Leased {
            delivery: Delivery {
                id: r.id,
                delivery_id: DeliveryId(r.delivery_id),
                event_id: r.event_id,
                event_type: r.event_type,
                plugin_id: r.plugin_id,
                export_id: r.export_id,
                status,
                attempt: count(r.attempt),
                budget_used: count(r.attempt - r.budget_from),
                next_attempt_at: (status == DeliveryStatus::Pending)
                    .then(|| rfc3339_ms(r.next_attempt_ms)),
                leased_by: if leased { r.lease_owner } else { None },
                lease_until: if leased {
                    r.lease_until_ms.map(rfc3339_ms)
                } else {
                    None
                },
                last_error: r.last_error,
                created_at: r.created_at,
                delivered_at: r.delivered_at,
            },
            event,
        })
    }

    /// Records `event` and one pending delivery per subscriber, due now, in
    /// one transaction: either all of it is stored or nothing is.
    ///
    /// The event type must pass [`valid_event_type`]. With no subscribers the
    /// event is still recorded, with no deliveries.
    pub fn outbox_enqueue(
        &self,
        event: &NewEvent,
        subscribers: &[Subscriber],
    ) -> Result<Enqueued, StoreError> {
        check_event(event)?;
        let action = || format!("record event {:?}", event.event_type);
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let out = enqueue_in(&tx, event, subscribers).map_err(|e| self.query_error(action(), e))?;
        tx.commit().map_err(|e| self.query_error(action(), e))?;
        Ok(out)
    }

    /// Leases up to `limit` due deliveries to `worker` until `lease` from now,
    /// counting one more attempt on each, oldest due first.
    ///
    /// Due means pending, its next attempt time reached, and not leased (or
    /// leased by a worker whose lease ran out: that worker is presumed dead,
    /// and the expiry is noted in `last_error`). Pending deliveries that are
    /// not leased and have spent `max_attempts` are parked as dead letters
    /// first, so an attempt whose worker died still counts against the budget.
    pub fn outbox_lease(
        &self,
        worker: &str,
        lease: Duration,
        limit: usize,
        max_attempts: u32,
    ) -> Result<Vec<Leased>, StoreError> {
        let action = || format!("lease outbox deliveries for worker {worker:?}");
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let now = now_ms();
        let work = || -> rusqlite::Result<Vec<RawDelivery>> {
            tx.execute(
                "UPDATE outbox_deliveries SET
                    last_error = 'the lease of worker ' || lease_owner || ' ran out during attempt '
                        || attempt || ' (the worker crashed, was killed or hung)',
                    lease_owner = NULL, lease_until_ms = NULL
                 WHERE status = 'pending' AND lease_until_ms IS NOT NULL AND lease_until_ms <= ?1",
                params![now],
            )?;
            tx.execute(
                "UPDATE outbox_deliveries SET status = 'dead'
                 WHERE status = 'pending' AND lease_until_ms IS NULL AND attempt - budget_from >= ?1",
                params![i64::from(max_attempts)],
            )?;
            let ids: Vec<i64> = {
                let mut stmt = tx.prepare(
                    "SELECT id FROM outbox_deliveries
                     WHERE status = 'pending' AND lease_until_ms IS NULL AND next_attempt_ms <= ?1
                     ORDER BY next_attempt_ms, id LIMIT ?2",
                )?;
                stmt.query_map(
                    params![now, i64::try_from(limit).unwrap_or(i64::MAX)],
                    |r| r.get(0),
                )?
                .collect::<rusqlite::Result<_>>()?
            };
            let until = now.saturating_add(ms(lease));
            let mut rows = Vec::with_capacity(ids.len());
            for id in ids {
                tx.execute(
                    "UPDATE outbox_deliveries
                     SET attempt = attempt + 1, lease_owner = ?2, lease_until_ms = ?3
                     WHERE id = ?1",
                    params![id, worker, until],
                )?;
                rows.push(tx.query_row(
                    &format!(
                        "SELECT {DELIVERY_COLUMNS} FROM outbox_deliveries d
                         JOIN outbox_events e ON e.id = d.event WHERE d.id = ?1"
                    ),
                    params![id],
                    raw_delivery,
                )?);
            }
            Ok(rows)
        };
        let rows = work().map_err(|e| self.query_error(action(), e))?;
        tx.commit().map_err(|e| self.query_error(action(), e))?;
        drop(conn);
        rows.into_iter().map(|r| self.decode_delivery(r)).collect()
    }

    /// Extends `worker`'s lease on delivery row `id` (attempt `attempt`) to
    /// `lease` from now; `false` if the worker no longer holds it.
    pub fn outbox_renew(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let until = now_ms().saturating_add(ms(lease));
        let n = self
            .lock()
            .execute(
                "UPDATE outbox_deliveries SET lease_until_ms = ?4
                 WHERE id = ?1 AND lease_owner = ?2 AND attempt = ?3 AND status = 'pending'",
                params![id, worker, i64::from(attempt), until],
            )
            .map_err(|e| self.query_error(format!("renew the lease of outbox delivery {id}"), e))?;
        Ok(n > 0)
    }

    /// Marks delivery row `id` delivered; `false` if it already was.
    ///
    /// Accepted from any worker, even one whose lease ran out: the hook did
    /// acknowledge the event, which is what counts. A dead letter that is
    /// acknowledged late becomes delivered too.
    pub fn outbox_ack(&self, id: i64) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "UPDATE outbox_deliveries SET status = 'delivered', delivered_at = ?2,
                    lease_owner = NULL, lease_until_ms = NULL
                 WHERE id = ?1 AND status != 'delivered'",
                params![id, crate::now_rfc3339()],
            )
            .map_err(|e| self.query_error(format!("acknowledge outbox delivery {id}"), e))?;
        Ok(n > 0)
    }

    /// Records that `worker`'s attempt `attempt` of delivery row `id` failed
    /// with `error`: the delivery is rescheduled after the policy's backoff,
    /// or parked as dead when `retryable` is false or the budget is spent.
    /// Nothing is written if the worker no longer holds the lease.
    pub fn outbox_fail(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        error: &str,
        retryable: bool,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, StoreError> {
        let action = || format!("record the failure of outbox delivery {id}");
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let error: String = error.chars().take(2000).collect();
        let work = || -> rusqlite::Result<FailOutcome> {
            let used: Option<i64> = tx
                .query_row(
                    "SELECT attempt - budget_from FROM outbox_deliveries
                     WHERE id = ?1 AND lease_owner = ?2 AND attempt = ?3 AND status = 'pending'",
                    params![id, worker, i64::from(attempt)],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(used) = used else {
                return Ok(FailOutcome::LostLease);
            };
            let used = count(used);
            if !retryable || used >= policy.max_attempts {
                tx.execute(
                    "UPDATE outbox_deliveries SET status = 'dead', last_error = ?2,
                        lease_owner = NULL, lease_until_ms = NULL
                     WHERE id = ?1",
                    params![id, error],
                )?;
                return Ok(FailOutcome::Dead);
            }
            let delay = policy.delay(used);
            let at = now_ms().saturating_add(ms(delay));
            tx.execute(
                "UPDATE outbox_deliveries SET next_attempt_ms = ?2, last_error = ?3,
                    lease_owner = NULL, lease_until_ms = NULL
                 WHERE id = ?1",
                params![id, at, error],
            )?;
            Ok(FailOutcome::Retry {
                at: rfc3339_ms(at),
                delay,
            })
        };
        let out = work().map_err(|e| self.query_error(action(), e))?;
        tx.commit().map_err(|e| self.query_error(action(), e))?;
        Ok(out)
    }

    /// Gives `worker`'s lease on delivery row `id` back without counting a
    /// failure (a worker shutting down): the delivery is due again at once.
    /// `false` if the worker no longer held it.
    pub fn outbox_release(&self, id: i64, worker: &str, attempt: u32) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "UPDATE outbox_deliveries SET lease_owner = NULL, lease_until_ms = NULL,
                    budget_from = budget_from + 1, next_attempt_ms = ?4
                 WHERE id = ?1 AND lease_owner = ?2 AND attempt = ?3 AND status = 'pending'",
                params![id, worker, i64::from(attempt), now_ms()],
            )
            .map_err(|e| self.query_error(format!("release outbox delivery {id}"), e))?;
        Ok(n > 0)
    }

    /// Deliveries, oldest first; only those with `status` when given.
    pub fn outbox_list(&self, status: Option<DeliveryStatus>) -> Result<Vec<Delivery>, StoreError> {
        let rows = {
            let conn = self.lock();
            let read = || -> rusqlite::Result<Vec<RawDelivery>> {
                let mut stmt = conn.prepare(&format!(
                    "SELECT {DELIVERY_COLUMNS} FROM outbox_deliveries d
                     JOIN outbox_events e ON e.id = d.event
                     WHERE ?1 IS NULL OR d.status = ?1 ORDER BY d.id"
                ))?;
                stmt.query_map(params![status.map(DeliveryStatus::as_str)], raw_delivery)?
                    .collect()
            };
            read().map_err(|e| self.query_error("list outbox deliveries".to_owned(), e))?
        };
        rows.into_iter()
            .map(|r| self.decode_delivery(r).map(|l| l.delivery))
            .collect()
    }

    /// The recorded events of `event_type` (their JSON bodies), oldest first,
    /// whether or not anything subscribes to them.
    pub fn outbox_events(&self, event_type: &str) -> Result<Vec<Value>, StoreError> {
        let rows: Vec<String> = {
            let conn = self.lock();
            let read = || -> rusqlite::Result<Vec<String>> {
                let mut stmt = conn
                    .prepare("SELECT body FROM outbox_events WHERE event_type = ?1 ORDER BY id")?;
                stmt.query_map(params![event_type], |r| r.get(0))?.collect()
            };
            read().map_err(|e| self.query_error(format!("list {event_type:?} events"), e))?
        };
        rows.into_iter()
            .map(|body| {
                serde_json::from_str(&body).map_err(|e| StoreError::Corrupt {
                    db: self.label().to_owned(),
                    plugin_id: format!("event {event_type}"),
                    detail: format!("an outbox event is not JSON ({e})"),
                })
            })
            .collect()
    }

    /// The delivery whose row id (all digits) or delivery id is `key`, with its event.
    pub fn outbox_delivery(&self, key: &str) -> Result<Option<Leased>, StoreError> {
        let row = self
            .lock()
            .query_row(
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM outbox_deliveries d
                     JOIN outbox_events e ON e.id = d.event
                     WHERE d.delivery_id = ?1 OR (?2 IS NOT NULL AND d.id = ?2)"
                ),
                params![key, key.parse::<i64>().ok()],
                raw_delivery,
            )
            .optional()
            .map_err(|e| self.query_error(format!("read outbox delivery {key:?}"), e))?;
        row.map(|r| self.decode_delivery(r)).transpose()
    }

    /// Puts the dead letter `key` (row id or delivery id) back to pending,
    /// due now, with a fresh attempt budget. Its attempt number carries on.
    pub fn outbox_retry(&self, key: &str) -> Result<RetryOutcome, StoreError> {
        let Some(found) = self.outbox_delivery(key)? else {
            return Ok(RetryOutcome::NotFound);
        };
        let d = found.delivery;
        let n = self
            .lock()
            .execute(
                "UPDATE outbox_deliveries SET status = 'pending', budget_from = attempt,
                    next_attempt_ms = ?2, lease_owner = NULL, lease_until_ms = NULL
                 WHERE id = ?1 AND status = 'dead'",
                params![d.id, now_ms()],
            )
            .map_err(|e| self.query_error(format!("retry outbox delivery {key:?}"), e))?;
        if n == 0 {
            return Ok(RetryOutcome::NotDead(d));
        }
        match self.outbox_delivery(&d.id.to_string())? {
            Some(l) => Ok(RetryOutcome::Retried(l.delivery)),
            None => Ok(RetryOutcome::NotFound),
        }
    }

    /// Milliseconds until the next pending, unleased delivery is due (0 if
    /// one is due now), or `None` when nothing waits. Leased deliveries
    /// count from their lease's end.
    pub fn outbox_next_due_in(&self) -> Result<Option<Duration>, StoreError> {
        let at: Option<i64> = self
            .lock()
            .query_row(
                "SELECT min(CASE WHEN lease_until_ms IS NULL THEN next_attempt_ms
                                 ELSE max(next_attempt_ms, lease_until_ms) END)
                 FROM outbox_deliveries WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.query_error("find the next due outbox delivery".to_owned(), e))?;
        Ok(at.map(|at| Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs(n: usize) -> Vec<Subscriber> {
        (0..n)
            .map(|i| Subscriber {
                plugin_id: "acme/kit".into(),
                export_id: format!("h{i}"),
            })
            .collect()
    }

    fn event(t: &str) -> NewEvent {
        NewEvent {
            event_type: t.into(),
            subject: json!({"kind": "run", "id": "run_1"}),
            summary: json!({"task": "x"}),
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            max_attempts: 100,
        };
        let delays: Vec<u64> = (1..=8).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(p.delay(99), Duration::from_secs(60));
    }

    #[test]
    fn event_types_are_checked() {
        assert!(valid_event_type("run.completed"));
        assert!(valid_event_type("tool.completed"));
        for bad in ["", "Run.completed", ".x", "a b", "é", &"a".repeat(129)] {
            assert!(!valid_event_type(bad), "{bad:?}");
        }
        let s = Store::open_in_memory().unwrap();
        let e = s.outbox_enqueue(&event("Bad Type"), &subs(1)).unwrap_err();
        assert!(e.to_string().contains("event type \"Bad Type\""), "{e}");
        assert!(s.outbox_list(None).unwrap().is_empty());
    }
}
