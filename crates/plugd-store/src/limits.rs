//! Rate-limit token buckets on SQLite (see `plugd_control::store::limits`).

use plugd_control::store::limits::{Bucket, Take, check_limit, ns_of_ms, take};
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::error::StoreError;
use crate::store::Store;

/// Schema step 21: one row per (rule, key), the bucket's theoretical
/// arrival time; the index finds the rows full again (expired).
pub(crate) const MIGRATION: &str = "
    CREATE TABLE limit_buckets (
        rule   TEXT NOT NULL,
        key    TEXT NOT NULL,
        tat_ns INTEGER NOT NULL,
        PRIMARY KEY (rule, key)
    ) STRICT;
    CREATE INDEX limit_buckets_tat ON limit_buckets (tat_ns);
";

impl Store {
    /// Takes one token from bucket (`rule`, `key`) (see `LimitStore`).
    pub fn limit_take(
        &self,
        rule: &str,
        key: &str,
        bucket: Bucket,
        now_ms: i64,
    ) -> Result<Take, StoreError> {
        check_limit(rule, key, bucket)?;
        let mut conn = self.lock();
        let mut run = || -> rusqlite::Result<Take> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let tat: Option<i64> = tx
                .query_row(
                    "SELECT tat_ns FROM limit_buckets WHERE rule = ?1 AND key = ?2",
                    params![rule, key],
                    |r| r.get(0),
                )
                .optional()?;
            match take(tat, bucket, now_ms) {
                Ok(next) => {
                    tx.execute(
                        "INSERT INTO limit_buckets (rule, key, tat_ns) VALUES (?1, ?2, ?3)
                         ON CONFLICT (rule, key) DO UPDATE SET tat_ns = excluded.tat_ns",
                        params![rule, key, next],
                    )?;
                    tx.commit()?;
                    Ok(Take::Allowed)
                }
                Err(wait) => Ok(wait),
            }
        };
        run().map_err(|e| self.query_error(format!("take from rate limit {rule:?}"), e))
    }

    /// Gives a token back to bucket (`rule`, `key`).
    pub fn limit_refund(&self, rule: &str, key: &str, bucket: Bucket) -> Result<(), StoreError> {
        check_limit(rule, key, bucket)?;
        self.lock()
            .execute(
                "UPDATE limit_buckets SET tat_ns = tat_ns - ?3 WHERE rule = ?1 AND key = ?2",
                params![rule, key, bucket.interval_ns()],
            )
            .map_err(|e| self.query_error(format!("refund rate limit {rule:?}"), e))?;
        Ok(())
    }

    /// Deletes the buckets full again at `now_ms`.
    pub fn limit_expire(&self, now_ms: i64) -> Result<u64, StoreError> {
        let n = self
            .lock()
            .execute(
                "DELETE FROM limit_buckets WHERE tat_ns <= ?1",
                params![ns_of_ms(now_ms)],
            )
            .map_err(|e| self.query_error("expire rate limit buckets".to_owned(), e))?;
        Ok(n as u64)
    }
}
