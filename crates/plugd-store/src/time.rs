//! Timestamps: RFC 3339 UTC at second precision, formatted by hand from `SystemTime`.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current time as RFC 3339 in UTC at second precision, e.g. `2025-01-31T09:05:00Z`.
///
/// A clock set before 1970 yields `1970-01-01T00:00:00Z` rather than failing.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_unix_secs(secs)
}

/// Formats seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn format_unix_secs(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = plugd_control::invocations::civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_unix_secs(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_unix_secs(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_unix_secs(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(format_unix_secs(1_735_689_600), "2025-01-01T00:00:00Z");
        assert_eq!(format_unix_secs(4_102_444_800), "2100-01-01T00:00:00Z");
    }

    #[test]
    fn now_has_rfc3339_shape() {
        let now = now_rfc3339();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
        assert!(now.as_str() > "2024-01-01T00:00:00Z", "{now}");
    }
}
