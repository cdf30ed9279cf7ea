//! Rate-limited warnings: the first occurrence of a repeated warning is
//! logged in full, the rest of its interval only counted, and one summary line
//! per interval says how many there were (e.g. `dropped 999,812 publishes on
//! agent.x in the last 10 s`), so one plugin cannot flood serve's log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The interval a summary covers.
pub const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Most distinct keys tracked at once; further keys share one bucket, so a
/// plugin inventing a new topic per publish cannot grow the map or the log.
pub const MAX_KEYS: usize = 64;

/// The bucket for keys beyond [`MAX_KEYS`].
pub const OTHER_KEY: &str = "(other topics)";

/// Writes one summary: key, how many in the interval, the last detail.
pub type Summary = Arc<dyn Fn(&str, u64, &str) + Send + Sync>;

/// One kind of repeated warning, keyed (e.g. by topic).
pub struct Throttle {
    interval: Duration,
    windows: Arc<Mutex<HashMap<String, Window>>>,
    summary: Summary,
}

impl std::fmt::Debug for Throttle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Window {
    counted: u64,
    last: String,
}

impl Throttle {
    /// A throttle writing its summaries with `summary`.
    pub fn new(interval: Duration, summary: Summary) -> Throttle {
        Throttle {
            interval,
            windows: Arc::default(),
            summary,
        }
    }

    /// Records one occurrence for `key`; `true` when the caller should log it
    /// in full (the first of an interval), `false` when it was counted for
    /// the summary. Outside a Tokio runtime every occurrence is logged.
    pub fn hit(&self, key: &str, detail: &str) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return true;
        };
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let key = if windows.contains_key(key) || windows.len() < MAX_KEYS {
            key
        } else {
            OTHER_KEY
        };
        if let Some(w) = windows.get_mut(key) {
            w.counted += 1;
            detail.clone_into(&mut w.last);
            return false;
        }
        windows.insert(key.to_owned(), Window::default());
        let key = key.to_owned();
        let windows = Arc::downgrade(&self.windows);
        let summary = self.summary.clone();
        let interval = self.interval;
        rt.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(windows) = windows.upgrade() else {
                    return;
                };
                let mut map = windows.lock().unwrap_or_else(|p| p.into_inner());
                let Some(w) = map.get_mut(&key) else { return };
                if w.counted == 0 {
                    // A quiet interval: the next occurrence is logged in full.
                    map.remove(&key);
                    return;
                }
                let (n, last) = (w.counted, std::mem::take(&mut w.last));
                w.counted = 0;
                drop(map);
                summary(&key, n, &last);
            }
        });
        true
    }
}

impl Drop for Throttle {
    /// The counts of the current intervals are reported, not lost, when the
    /// plugin's connection ends.
    fn drop(&mut self) {
        let mut map = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for (key, w) in map.drain() {
            if w.counted > 0 {
                (self.summary)(&key, w.counted, &w.last);
            }
        }
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(999_812), "999,812");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }

    #[tokio::test(start_paused = true)]
    async fn one_full_line_then_one_summary_per_interval() {
        let seen: Arc<Mutex<Vec<(String, u64, String)>>> = Arc::default();
        let sink = seen.clone();
        let t = Throttle::new(
            Duration::from_secs(10),
            Arc::new(move |k, n, last| {
                sink.lock()
                    .unwrap()
                    .push((k.to_owned(), n, last.to_owned()))
            }),
        );
        assert!(t.hit("a", "first"));
        for i in 0..1000 {
            assert!(!t.hit("a", &format!("again {i}")));
        }
        // Hostile: a new key per hit shares one bucket beyond MAX_KEYS.
        let full = (0..1000).filter(|i| t.hit(&format!("k{i}"), "x")).count();
        assert_eq!(full, MAX_KEYS); // 63 own keys + the shared bucket
        tokio::time::sleep(Duration::from_secs(11)).await;
        tokio::task::yield_now().await;
        let got = seen.lock().unwrap().clone();
        let a = got.iter().find(|(k, ..)| k == "a").unwrap();
        assert_eq!((a.1, a.2.as_str()), (1000, "again 999"));
        let other = got.iter().find(|(k, ..)| k == OTHER_KEY).unwrap();
        assert_eq!(other.1, 1000 - MAX_KEYS as u64);
        // A quiet interval re-arms: the next hit is logged in full again.
        tokio::time::sleep(Duration::from_secs(11)).await;
        tokio::task::yield_now().await;
        assert!(t.hit("a", "after a pause"));
    }
}
