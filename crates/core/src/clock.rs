//! The engine's notion of "now", injectable so that wall-time budgets and the
//! time shown to the model are deterministic in tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to (tests, replays).
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start_ms)),
        }
    }
    /// Move the clock forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
    /// Set the clock to `ms`.
    pub fn set_ms(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time in milliseconds (UTC); the
/// milliseconds are dropped.
pub fn format_rfc3339(ms: u64) -> String {
    let seconds = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    format_utc(seconds, None)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for `seconds` since the Unix epoch (negative
/// before it) and `millis` into that second (UTC): records that carry
/// sub-second times (protobuf timestamps) show them.
pub fn format_rfc3339_millis(seconds: i64, millis: u32) -> String {
    format_utc(seconds, Some(millis.min(999)))
}

/// The one RFC 3339 UTC formatter behind both precisions.
fn format_utc(seconds: i64, millis: Option<u32>) -> String {
    let days = seconds.div_euclid(86_400);
    let rem = seconds.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let fraction = millis.map(|ms| format!(".{ms:03}")).unwrap_or_default();
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{fraction}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's
/// algorithm), so the crate needs no calendar dependency.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(format_rfc3339(1_700_000_000_123), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn formats_milliseconds_and_instants_before_the_epoch() {
        assert_eq!(
            format_rfc3339_millis(1_767_323_045, 678),
            "2026-01-02T03:04:05.678Z"
        );
        assert_eq!(format_rfc3339_millis(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339_millis(-1, 5), "1969-12-31T23:59:59.005Z");
    }
}
