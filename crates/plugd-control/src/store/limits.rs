//! Rate-limit buckets shared by every node: the [`LimitStore`] trait and the
//! bucket arithmetic both backends run.
//!
//! A bucket of capacity `N` refilling `N` tokens per period `P` is kept as
//! one number, its *theoretical arrival time* (GCRA, the token bucket
//! written as a time): each token taken moves it `P / N` later, and a take
//! is refused while that would put it more than `P` past now. A bucket
//! whose time is already past is full, so a row idle for longer than its
//! full refill time means nothing and may be deleted
//! ([`LimitStore::limit_expire`]). Times are nanoseconds since the epoch,
//! so that `P / N` rounds by less than a nanosecond per token.

use async_trait::async_trait;

use super::{Invalid, StoreError};

/// Longest rule name or bucket key, in bytes.
pub const MAX_KEY: usize = 512;

/// Most tokens one bucket holds.
pub const MAX_CAPACITY: u32 = 1_000_000;

/// A bucket's shape: `capacity` tokens, all refilled over `period_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens when full (1 to [`MAX_CAPACITY`]).
    pub capacity: u32,
    /// Time to refill from empty to full, in milliseconds.
    pub period_ms: u64,
}

impl Bucket {
    /// The whole period, in nanoseconds.
    pub fn period_ns(&self) -> i64 {
        i64::try_from(self.period_ms)
            .unwrap_or(i64::MAX / 1_000_000)
            .saturating_mul(1_000_000)
    }

    /// The time one token takes to come back, in nanoseconds (at least 1).
    pub fn interval_ns(&self) -> i64 {
        (self.period_ns() / i64::from(self.capacity.max(1))).max(1)
    }
}

/// What taking a token gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// A token was taken.
    Allowed,
    /// The bucket is empty: the next token comes back in this many
    /// milliseconds (at least 1).
    Wait {
        /// Milliseconds until a take would succeed.
        ms: u64,
    },
}

/// Nanoseconds of `ms` milliseconds since the epoch.
pub fn ns_of_ms(ms: i64) -> i64 {
    ms.saturating_mul(1_000_000)
}

/// Takes one token from a bucket whose stored time is `tat_ns` (`None`: no
/// row, a full bucket) at `now_ms`: the time to store when allowed, else
/// how long to wait.
pub fn take(tat_ns: Option<i64>, bucket: Bucket, now_ms: i64) -> Result<i64, Take> {
    let now = ns_of_ms(now_ms);
    let next = tat_ns
        .unwrap_or(now)
        .max(now)
        .saturating_add(bucket.interval_ns());
    let over = next - now - bucket.period_ns();
    if over <= 0 {
        Ok(next)
    } else {
        Err(Take::Wait {
            ms: u64::try_from(over)
                .unwrap_or(u64::MAX)
                .div_ceil(1_000_000)
                .max(1),
        })
    }
}

/// Checks a rule name and bucket key (shared by every backend).
pub fn check_limit(rule: &str, key: &str, bucket: Bucket) -> Result<(), Invalid> {
    for (what, v) in [("rule", rule), ("bucket key", key)] {
        if v.is_empty() || v.len() > MAX_KEY || v.contains('\0') {
            return Err(Invalid::new(
                format!("limit {what} {:?}", v.chars().take(64).collect::<String>()),
                "a limit's rule and key are 1 to 512 bytes without NUL",
            ));
        }
    }
    if bucket.capacity == 0 || bucket.capacity > MAX_CAPACITY || bucket.period_ms == 0 {
        return Err(Invalid::new(
            format!("limit bucket {}/{} ms", bucket.capacity, bucket.period_ms),
            "a bucket holds 1 to 1000000 tokens refilled over a period longer than 0",
        ));
    }
    Ok(())
}

/// Token buckets of plugd.yaml's `limits:` rules, one small row per
/// (rule, key), shared by every node using the store.
#[async_trait]
pub trait LimitStore: Send + Sync {
    /// Takes one token, atomically, from bucket (`rule`, `key`) of shape
    /// `bucket` at `now_ms` (ms since the epoch): allowed, or how long until
    /// a token comes back. A bucket never seen is full.
    async fn limit_take(
        &self,
        rule: &str,
        key: &str,
        bucket: Bucket,
        now_ms: i64,
    ) -> Result<Take, StoreError>;
    /// Gives back the token a take of bucket (`rule`, `key`) took, when the
    /// call it was for was refused by another rule (so a refused call
    /// spends nothing); a bucket already full stays so.
    async fn limit_refund(&self, rule: &str, key: &str, bucket: Bucket) -> Result<(), StoreError>;
    /// Deletes the buckets full again at `now_ms` (idle longer than their
    /// refill time: the same as no row); how many.
    async fn limit_expire(&self, now_ms: i64) -> Result<u64, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Bucket = Bucket {
        capacity: 10,
        period_ms: 60_000,
    };

    /// Runs `n` takes at `now`, threading the stored time; every answer.
    fn takes(tat: &mut Option<i64>, bucket: Bucket, now: i64, n: usize) -> Vec<Take> {
        (0..n)
            .map(|_| match take(*tat, bucket, now) {
                Ok(t) => {
                    *tat = Some(t);
                    Take::Allowed
                }
                Err(w) => w,
            })
            .collect()
    }

    #[test]
    fn ten_per_minute_allows_ten_then_waits_one_refill() {
        let mut tat = None;
        let got = takes(&mut tat, MIN, 1_000_000, 11);
        assert!(got[..10].iter().all(|t| *t == Take::Allowed), "{got:?}");
        assert_eq!(got[10], Take::Wait { ms: 6_000 });
        // 5.999 s later: still empty; 6 s later: one token, one only.
        assert_eq!(takes(&mut tat, MIN, 1_005_999, 1), [Take::Wait { ms: 1 }]);
        assert_eq!(
            takes(&mut tat, MIN, 1_006_000, 2),
            [Take::Allowed, Take::Wait { ms: 6_000 }]
        );
    }

    #[test]
    fn three_per_hour_waits_twenty_minutes() {
        let hour = Bucket {
            capacity: 3,
            period_ms: 3_600_000,
        };
        let mut tat = None;
        let got = takes(&mut tat, hour, 0, 4);
        assert_eq!(got[3], Take::Wait { ms: 1_200_000 });
        // Half a refill later the wait is half.
        assert_eq!(
            takes(&mut tat, hour, 600_000, 1),
            [Take::Wait { ms: 600_000 }]
        );
    }

    #[test]
    fn an_idle_bucket_is_full_again_and_never_more() {
        let mut tat = None;
        takes(&mut tat, MIN, 0, 10);
        // A day later: full, ten more and no eleventh.
        let got = takes(&mut tat, MIN, 86_400_000, 11);
        assert_eq!(got.iter().filter(|t| **t == Take::Allowed).count(), 10);
    }

    #[test]
    fn uneven_rates_never_allow_more_than_capacity() {
        for capacity in [1, 3, 7, 9_999, 31_000] {
            for period_ms in [1_000, 60_000, 86_400_000] {
                let b = Bucket {
                    capacity,
                    period_ms,
                };
                let mut tat = None;
                let n = capacity as usize + 1;
                let allowed = takes(&mut tat, b, 5, n)
                    .iter()
                    .filter(|t| **t == Take::Allowed)
                    .count();
                assert_eq!(allowed, capacity as usize, "{b:?}");
            }
        }
    }

    #[test]
    fn bad_shapes_and_keys_are_refused() {
        assert!(check_limit("r", "k", MIN).is_ok());
        assert!(check_limit("", "k", MIN).is_err());
        assert!(check_limit("r", "a\0b", MIN).is_err());
        let empty = Bucket {
            capacity: 0,
            period_ms: 1,
        };
        assert!(check_limit("r", "k", empty).is_err());
    }
}
