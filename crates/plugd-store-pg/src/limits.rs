//! Rate-limit token buckets on PostgreSQL: same rows and arithmetic as
//! `plugd-store`'s `limits.rs` (see `plugd_control::store::limits`), one
//! statement per take.

use plugd_control::store::limits::{Bucket, Take, check_limit, ns_of_ms};

use crate::{PgError, PgStore};

/// Schema step 6 (SQLite's 21).
pub(crate) const MIGRATION: &str = r#"
    CREATE TABLE limit_buckets (
        rule   text COLLATE "C" NOT NULL,
        key    text COLLATE "C" NOT NULL,
        tat_ns bigint NOT NULL,
        PRIMARY KEY (rule, key)
    );
    CREATE INDEX limit_buckets_tat ON limit_buckets (tat_ns);
"#;

/// One statement, atomic under concurrent takes from several nodes: the
/// upsert moves the bucket's time on only when that keeps it within one
/// period of now (the row lock orders concurrent takes of one bucket);
/// `old` is the time before, from which a refusal's wait is computed.
/// `$3` now, `$4` the interval of one token, `$5` the period (ns).
const TAKE: &str = "
    WITH old AS (
        SELECT tat_ns FROM limit_buckets WHERE rule = $1::text AND key = $2::text
    ),
    up AS (
        INSERT INTO limit_buckets AS b (rule, key, tat_ns)
        VALUES ($1::text, $2::text, $3::bigint + $4::bigint)
        ON CONFLICT (rule, key) DO UPDATE
            SET tat_ns = GREATEST(b.tat_ns, $3::bigint) + $4::bigint
            WHERE GREATEST(b.tat_ns, $3::bigint) + $4::bigint - $3::bigint <= $5::bigint
        RETURNING tat_ns
    )
    SELECT (SELECT tat_ns FROM up), (SELECT tat_ns FROM old)";

impl PgStore {
    /// Takes one token from bucket (`rule`, `key`) (see `LimitStore`).
    pub async fn limit_take(
        &self,
        rule: &str,
        key: &str,
        bucket: Bucket,
        now_ms: i64,
    ) -> Result<Take, PgError> {
        check_limit(rule, key, bucket)?;
        let now = ns_of_ms(now_ms);
        let (interval, period) = (bucket.interval_ns(), bucket.period_ns());
        let client = self.client().await?;
        let row = client
            .query_one(TAKE, &[&rule, &key, &now, &interval, &period])
            .await
            .map_err(|e| self.query_error(format!("take from rate limit {rule:?}"), e))?;
        let (taken, old): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        if taken.is_some() {
            return Ok(Take::Allowed);
        }
        // Refused: the wait as of the time this statement saw (a take
        // racing it may have moved it on; the caller is refused again).
        let next = old.unwrap_or(now).max(now) + interval;
        let over = (next - now - period).max(1);
        Ok(Take::Wait {
            ms: u64::try_from(over).unwrap_or(1).div_ceil(1_000_000).max(1),
        })
    }

    /// Gives a token back to bucket (`rule`, `key`).
    pub async fn limit_refund(&self, rule: &str, key: &str, bucket: Bucket) -> Result<(), PgError> {
        check_limit(rule, key, bucket)?;
        let client = self.client().await?;
        client
            .execute(
                "UPDATE limit_buckets SET tat_ns = tat_ns - $3::bigint
                 WHERE rule = $1::text AND key = $2::text",
                &[&rule, &key, &bucket.interval_ns()],
            )
            .await
            .map_err(|e| self.query_error(format!("refund rate limit {rule:?}"), e))?;
        Ok(())
    }

    /// Deletes the buckets full again at `now_ms`.
    pub async fn limit_expire(&self, now_ms: i64) -> Result<u64, PgError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM limit_buckets WHERE tat_ns <= $1",
                &[&ns_of_ms(now_ms)],
            )
            .await
            .map_err(|e| self.query_error("expire rate limit buckets", e))
    }
}
