//! The lease TTL the reassigner assumes: the smallest `ttl_seconds` of the
//! lease records it has seen (workers may run with different TTLs), else
//! the configured default. It sets how often the reassigner sweeps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The smallest lease TTL seen so far.
pub(crate) struct LeaseClock {
    /// In milliseconds; 0: none seen yet.
    smallest_ms: AtomicU64,
    default: Duration,
}

impl LeaseClock {
    pub(crate) fn new(default: Duration) -> Self {
        Self {
            smallest_ms: AtomicU64::new(0),
            default,
        }
    }

    /// The smallest TTL seen, else the default.
    pub(crate) fn ttl(&self) -> Duration {
        match self.smallest_ms.load(Ordering::Relaxed) {
            0 => self.default,
            ms => Duration::from_millis(ms),
        }
    }

    /// Learns the TTL of a lease record (0: the record names none).
    pub(crate) fn observe(&self, ttl_seconds: u32) {
        if ttl_seconds == 0 {
            return;
        }
        let ms = u64::from(ttl_seconds) * 1000;
        let _ = self
            .smallest_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
                (current == 0 || ms < current).then_some(ms)
            });
    }
}
