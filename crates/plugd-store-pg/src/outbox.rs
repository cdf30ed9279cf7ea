//! The durable outbox on PostgreSQL: events and their per-hook deliveries,
//! leased with `FOR UPDATE SKIP LOCKED` by the database's clock.
//!
//! Same operations and meaning as `plugd-store`'s `outbox.rs` (read its
//! header for the model: stable `delivery_id`, `attempt` that only grows, a
//! budget counted since the last retry). What changes with several nodes:
//! - every time (due, lease end, backoff) is the server's [`NOW_MS`];
//! - [`PgStore::outbox_lease`] picks due rows with `FOR UPDATE SKIP LOCKED`,
//!   so workers on any node never lease one delivery twice and never wait
//!   for each other; a lease whose end passed is taken over the same way
//!   (its expiry noted in `last_error`), so a dead worker's deliveries are
//!   delivered by another after the lease's TTL;
//! - a failure is recorded under the row's lock (`SELECT … FOR UPDATE`), so
//!   it cannot race a takeover of the same delivery.

use std::time::Duration;

use plugd_control::store::outbox::{
    Delivery, DeliveryId, DeliveryStatus, Enqueued, FailOutcome, Leased, NewEvent, RetryOutcome,
    RetryPolicy, Subscriber, check_event,
};
use serde_json::{Value, json};

use crate::clock::{NOW_MS, NOW_RFC3339, ms_rfc3339, random_hex};
use crate::{PgError, PgStore};

const DELIVERY_COLUMNS: &str =
    "d.id, d.delivery_id, e.event_id, e.event_type, d.plugin_id, d.export_id,
     d.status, d.attempt, d.budget_from, d.next_attempt_ms, d.lease_owner, d.lease_until_ms,
     d.last_error, d.created_at, d.delivered_at, e.body";

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

impl PgStore {
    fn decode_delivery(&self, r: &tokio_postgres::Row) -> Result<Leased, PgError> {
        let delivery_id: String = r.get(1);
        let event_id: String = r.get(2);
        let damaged = |what: String, detail: String| PgError::Damaged {
            db: self.label().to_owned(),
            what,
            detail,
        };
        let status: String = r.get(6);
        let status = DeliveryStatus::parse(&status).ok_or_else(|| {
            damaged(
                format!("outbox delivery {delivery_id}"),
                format!("unknown status {status:?}"),
            )
        })?;
        let body: String = r.get(15);
        let event: Value = serde_json::from_str(&body).map_err(|e| {
            damaged(
                format!("outbox event {event_id}"),
                format!("it is not JSON ({e}); `plugd outbox list` shows its deliveries"),
            )
        })?;
        let (attempt, budget_from, next_attempt_ms): (i64, i64, i64) =
            (r.get(7), r.get(8), r.get(9));
        let (lease_owner, lease_until_ms): (Option<String>, Option<i64>) = (r.get(10), r.get(11));
        let leased = lease_until_ms.is_some() && status == DeliveryStatus::Pending;
        Ok(Leased {
            delivery: Delivery {
                id: r.get(0),
                delivery_id: DeliveryId(delivery_id),
                event_id,
                event_type: r.get(3),
                plugin_id: r.get(4),
                export_id: r.get(5),
                status,
                attempt: count(attempt),
                budget_used: count(attempt - budget_from),
                next_attempt_at: (status == DeliveryStatus::Pending)
                    .then(|| ms_rfc3339(next_attempt_ms)),
                leased_by: if leased { lease_owner } else { None },
                lease_until: if leased {
                    lease_until_ms.map(ms_rfc3339)
                } else {
                    None
                },
                last_error: r.get(12),
                created_at: r.get(13),
                delivered_at: r.get(14),
            },
            event,
        })
    }

    /// Records `event` and one pending delivery per subscriber, due now by
    /// the database's clock, in one transaction: all of it or nothing.
    pub async fn outbox_enqueue(
        &self,
        event: &NewEvent,
        subscribers: &[Subscriber],
    ) -> Result<Enqueued, PgError> {
        check_event(event)?;
        let action = || format!("record event {:?}", event.event_type);
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let out = self.enqueue_in(&tx, event, subscribers).await?;
        tx.commit()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        Ok(out)
    }

    /// Records `event` and one pending delivery per subscriber inside `tx`,
    /// the transaction of the state change it reports, stamped by the
    /// database's clock.
    pub(crate) async fn enqueue_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        event: &NewEvent,
        subscribers: &[Subscriber],
    ) -> Result<Enqueued, PgError> {
        check_event(event)?;
        let action = || format!("record event {:?}", event.event_type);
        let event_id = format!("evt_{}", random_hex(8)?);
        let delivery_ids = subscribers
            .iter()
            .map(|_| random_hex(8).map(|h| format!("del_{h}")))
            .collect::<Result<Vec<_>, _>>()?;
        let now = tx
            .query_one(&format!("SELECT {NOW_RFC3339}, {NOW_MS}"), &[])
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let (occurred_at, now_ms): (String, i64) = (now.get(0), now.get(1));
        let body = json!({
            "id": event_id,
            "type": event.event_type,
            "occurred_at": occurred_at,
            "subject": event.subject,
            "summary": event.summary,
        });
        let row: i64 = tx
            .query_one(
                "INSERT INTO outbox_events (event_id, event_type, occurred_at, body)
                 VALUES ($1, $2, $3, $4) RETURNING id",
                &[
                    &event_id,
                    &event.event_type,
                    &occurred_at,
                    &body.to_string(),
                ],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?
            .get(0);
        if !subscribers.is_empty() {
            let plugins: Vec<&str> = subscribers.iter().map(|s| s.plugin_id.as_str()).collect();
            let exports: Vec<&str> = subscribers.iter().map(|s| s.export_id.as_str()).collect();
            tx.execute(
                "INSERT INTO outbox_deliveries
                    (delivery_id, event, plugin_id, export_id, status, next_attempt_ms, created_at)
                 SELECT s.delivery_id, $1, s.plugin_id, s.export_id, 'pending', $5, $6
                 FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY
                      AS s(delivery_id, plugin_id, export_id, n)
                 ORDER BY s.n",
                &[
                    &row,
                    &delivery_ids,
                    &plugins,
                    &exports,
                    &now_ms,
                    &occurred_at,
                ],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        }
        Ok(Enqueued {
            event_id,
            event: body,
            deliveries: delivery_ids.into_iter().map(DeliveryId).collect(),
        })
    }

    /// Leases up to `limit` due deliveries to `worker` until `lease` from
    /// the database's now, counting one more attempt on each, oldest due
    /// first. Rows another worker holds locked are skipped, not waited for.
    ///
    /// Due means pending, its next attempt time reached, and not leased (or
    /// leased by a worker whose lease ran out: that worker is presumed dead,
    /// and the expiry is noted in `last_error`). Pending deliveries that are
    /// not leased and have spent `max_attempts` are parked as dead letters
    /// first, so an attempt whose worker died still counts against the budget.
    pub async fn outbox_lease(
        &self,
        worker: &str,
        lease: Duration,
        limit: usize,
        max_attempts: u32,
    ) -> Result<Vec<Leased>, PgError> {
        let action = || format!("lease outbox deliveries for worker {worker:?}");
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        tx.execute(
            &format!(
                "WITH stale AS (
                    SELECT id FROM outbox_deliveries
                    WHERE status = 'pending'
                      AND ((lease_until_ms IS NOT NULL AND lease_until_ms <= {NOW_MS})
                           OR (lease_until_ms IS NULL AND attempt - budget_from >= $1))
                    FOR UPDATE SKIP LOCKED)
                 UPDATE outbox_deliveries d SET
                    last_error = CASE WHEN d.lease_until_ms IS NULL THEN d.last_error
                        ELSE 'the lease of worker ' || d.lease_owner || ' ran out during attempt '
                             || d.attempt || ' (the worker crashed, was killed or hung)' END,
                    status = CASE WHEN d.attempt - d.budget_from >= $1 THEN 'dead' ELSE 'pending' END,
                    lease_owner = NULL, lease_until_ms = NULL
                 FROM stale WHERE d.id = stale.id"
            ),
            &[&i64::from(max_attempts)],
        )
        .await
        .map_err(|e| self.query_error(action(), e))?;
        let mut rows = tx
            .query(
                &format!(
                    "WITH due AS (
                        SELECT id FROM outbox_deliveries
                        WHERE status = 'pending' AND lease_until_ms IS NULL
                          AND next_attempt_ms <= {NOW_MS}
                        ORDER BY next_attempt_ms, id LIMIT $1
                        FOR UPDATE SKIP LOCKED)
                     UPDATE outbox_deliveries d
                     SET attempt = d.attempt + 1, lease_owner = $2,
                         lease_until_ms = {NOW_MS} + $3
                     FROM due, outbox_events e
                     WHERE d.id = due.id AND e.id = d.event
                     RETURNING {DELIVERY_COLUMNS}"
                ),
                &[
                    &i64::try_from(limit).unwrap_or(i64::MAX),
                    &worker,
                    &ms(lease),
                ],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        tx.commit()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        rows.sort_by_key(|r| (r.get::<_, i64>(9), r.get::<_, i64>(0)));
        rows.iter().map(|r| self.decode_delivery(r)).collect()
    }

    /// Extends `worker`'s lease on delivery row `id` (attempt `attempt`) to
    /// `lease` from the database's now; `false` if the worker no longer holds it.
    pub async fn outbox_renew(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        lease: Duration,
    ) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "UPDATE outbox_deliveries SET lease_until_ms = {NOW_MS} + $4
                     WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'pending'"
                ),
                &[&id, &worker, &i64::from(attempt), &ms(lease)],
            )
            .await
            .map_err(|e| self.query_error(format!("renew the lease of outbox delivery {id}"), e))?;
        Ok(n > 0)
    }

    /// Marks delivery row `id` delivered; `false` if it already was.
    /// Accepted from any worker, even one whose lease ran out.
    pub async fn outbox_ack(&self, id: i64) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "UPDATE outbox_deliveries SET status = 'delivered', delivered_at = {NOW_RFC3339},
                        lease_owner = NULL, lease_until_ms = NULL
                     WHERE id = $1 AND status <> 'delivered'"
                ),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(format!("acknowledge outbox delivery {id}"), e))?;
        Ok(n > 0)
    }

    /// Records that `worker`'s attempt `attempt` of delivery row `id` failed
    /// with `error`: rescheduled after the policy's backoff (from the
    /// database's now), or parked as dead when `retryable` is false or the
    /// budget is spent. Nothing is written if the worker no longer holds the
    /// lease; the check and the write hold the row's lock.
    pub async fn outbox_fail(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        error: &str,
        retryable: bool,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, PgError> {
        let action = || format!("record the failure of outbox delivery {id}");
        let error: String = error.chars().take(2000).collect();
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let used = tx
            .query_opt(
                "SELECT attempt - budget_from FROM outbox_deliveries
                 WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'pending'
                 FOR UPDATE",
                &[&id, &worker, &i64::from(attempt)],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let Some(used) = used else {
            return Ok(FailOutcome::LostLease);
        };
        let used = count(used.get(0));
        let outcome = if !retryable || used >= policy.max_attempts {
            tx.execute(
                "UPDATE outbox_deliveries SET status = 'dead', last_error = $2,
                    lease_owner = NULL, lease_until_ms = NULL
                 WHERE id = $1",
                &[&id, &error],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
            FailOutcome::Dead
        } else {
            let delay = policy.delay(used);
            let at: i64 = tx
                .query_one(
                    &format!(
                        "UPDATE outbox_deliveries SET next_attempt_ms = {NOW_MS} + $2,
                            last_error = $3, lease_owner = NULL, lease_until_ms = NULL
                         WHERE id = $1 RETURNING next_attempt_ms"
                    ),
                    &[&id, &ms(delay), &error],
                )
                .await
                .map_err(|e| self.query_error(action(), e))?
                .get(0);
            FailOutcome::Retry {
                at: ms_rfc3339(at),
                delay,
            }
        };
        tx.commit()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        Ok(outcome)
    }

    /// Gives `worker`'s lease on delivery row `id` back without counting a
    /// failure: due again at once. `false` if the worker no longer held it.
    pub async fn outbox_release(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
    ) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "UPDATE outbox_deliveries SET lease_owner = NULL, lease_until_ms = NULL,
                        budget_from = budget_from + 1, next_attempt_ms = {NOW_MS}
                     WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'pending'"
                ),
                &[&id, &worker, &i64::from(attempt)],
            )
            .await
            .map_err(|e| self.query_error(format!("release outbox delivery {id}"), e))?;
        Ok(n > 0)
    }

    /// Deliveries, oldest first; only those with `status` when given.
    pub async fn outbox_list(
        &self,
        status: Option<DeliveryStatus>,
    ) -> Result<Vec<Delivery>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM outbox_deliveries d
                     JOIN outbox_events e ON e.id = d.event
                     WHERE $1::text IS NULL OR d.status = $1 ORDER BY d.id"
                ),
                &[&status.map(DeliveryStatus::as_str)],
            )
            .await
            .map_err(|e| self.query_error("list outbox deliveries", e))?;
        rows.iter()
            .map(|r| self.decode_delivery(r).map(|l| l.delivery))
            .collect()
    }

    /// The recorded events of `event_type` (their JSON bodies), oldest first.
    pub async fn outbox_events(&self, event_type: &str) -> Result<Vec<Value>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT event_id, body FROM outbox_events WHERE event_type = $1 ORDER BY id",
                &[&event_type],
            )
            .await
            .map_err(|e| self.query_error(format!("list {event_type:?} events"), e))?;
        rows.iter()
            .map(|r| {
                let (id, body): (String, String) = (r.get(0), r.get(1));
                serde_json::from_str(&body).map_err(|e| PgError::Damaged {
                    db: self.label().to_owned(),
                    what: format!("outbox event {id}"),
                    detail: format!("it is not JSON ({e})"),
                })
            })
            .collect()
    }

    /// The delivery whose row id (all digits) or delivery id is `key`, with its event.
    pub async fn outbox_delivery(&self, key: &str) -> Result<Option<Leased>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM outbox_deliveries d
                     JOIN outbox_events e ON e.id = d.event
                     WHERE d.delivery_id = $1 OR ($2::bigint IS NOT NULL AND d.id = $2)
                     ORDER BY d.delivery_id = $1 DESC LIMIT 1"
                ),
                &[&key, &key.parse::<i64>().ok()],
            )
            .await
            .map_err(|e| self.query_error(format!("read outbox delivery {key:?}"), e))?;
        row.map(|r| self.decode_delivery(&r)).transpose()
    }

    /// Puts the dead letter `key` (row id or delivery id) back to pending,
    /// due now by the database's clock, with a fresh attempt budget.
    pub async fn outbox_retry(&self, key: &str) -> Result<RetryOutcome, PgError> {
        let Some(found) = self.outbox_delivery(key).await? else {
            return Ok(RetryOutcome::NotFound);
        };
        let d = found.delivery;
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "UPDATE outbox_deliveries SET status = 'pending', budget_from = attempt,
                        next_attempt_ms = {NOW_MS}, lease_owner = NULL, lease_until_ms = NULL
                     WHERE id = $1 AND status = 'dead'"
                ),
                &[&d.id],
            )
            .await
            .map_err(|e| self.query_error(format!("retry outbox delivery {key:?}"), e))?;
        drop(client);
        if n == 0 {
            return Ok(RetryOutcome::NotDead(d));
        }
        match self.outbox_delivery(&d.id.to_string()).await? {
            Some(l) => Ok(RetryOutcome::Retried(l.delivery)),
            None => Ok(RetryOutcome::NotFound),
        }
    }

    /// Time until the next pending delivery is due by the database's clock
    /// (zero if one is due now), or `None` when nothing waits. Leased
    /// deliveries count from their lease's end.
    pub async fn outbox_next_due_in(&self) -> Result<Option<Duration>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                &format!(
                    "SELECT min(CASE WHEN lease_until_ms IS NULL THEN next_attempt_ms
                                     ELSE greatest(next_attempt_ms, lease_until_ms) END) - {NOW_MS}
                     FROM outbox_deliveries WHERE status = 'pending'"
                ),
                &[],
            )
            .await
            .map_err(|e| self.query_error("find the next due outbox delivery", e))?;
        let wait: Option<i64> = row.get(0);
        Ok(wait.map(|w| Duration::from_millis(u64::try_from(w).unwrap_or(0))))
    }
}
