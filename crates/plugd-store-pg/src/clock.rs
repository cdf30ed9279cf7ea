//! The database's clock: SQL for "now" as epoch milliseconds and as RFC 3339
//! text, and ids drawn from the OS.
//!
//! **Architecture invariant:** every decision about time on PostgreSQL
//! (expiry, leases, backoff, "last used") compares with [`NOW_MS`], the
//! server's clock, never the node's; stored times (`…_at` text, `…_ms`
//! integers) are written from the same clock. `now()` is the transaction's
//! start, so one transaction sees one instant.

use crate::{PgError, PgStore};

/// The server's time as milliseconds since the Unix epoch (SQL expression).
pub(crate) const NOW_MS: &str = "floor(extract(epoch FROM now()) * 1000)::bigint";

/// The server's time as RFC 3339 UTC at second precision, the same form
/// SQLite's store writes (`2025-01-31T09:05:00Z`) (SQL expression).
pub(crate) const NOW_RFC3339: &str =
    r#"to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"#;

/// Milliseconds since the epoch as RFC 3339 UTC at second precision.
pub(crate) fn ms_rfc3339(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = plugd_control::invocations::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// `bytes` random bytes from the OS, as lower-case hex.
pub(crate) fn random_hex(bytes: usize) -> Result<String, PgError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| PgError::Random(e.to_string()))?;
    Ok(hex::encode(b))
}

impl PgStore {
    /// The server's clock: milliseconds since the epoch, and the same
    /// instant as RFC 3339.
    pub async fn db_now(&self) -> Result<(i64, String), PgError> {
        let client = self.client().await?;
        let row = client
            .query_one(&format!("SELECT {NOW_MS}, {NOW_RFC3339}"), &[])
            .await
            .map_err(|e| self.query_error("read the database clock", e))?;
        Ok((row.get(0), row.get(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_the_sqlite_store() {
        assert_eq!(ms_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(ms_rfc3339(951_782_400_999), "2000-02-29T00:00:00Z");
        assert_eq!(ms_rfc3339(-5), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn ids_are_hex_of_the_asked_length() {
        let a = random_hex(8).unwrap();
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, random_hex(8).unwrap());
    }
}
