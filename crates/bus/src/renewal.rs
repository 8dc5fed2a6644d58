//! The timing of a TTL renewal loop (slice leases, job ownership), shared
//! by every keeper (`crate::ttl_lease`) so they tolerate the same outages.
//!
//! A renewal is a conditional KV write, acknowledged by the bucket's stream
//! leader. When a node of a cluster dies, the streams it led have no leader
//! for seconds, and a write sent then is never acknowledged: waiting for it
//! until the client's request timeout (10 s) or the rest of the TTL would
//! spend the whole lease on one lost write, although a new leader is there
//! after a few seconds. So each attempt waits at most one renewal period,
//! a failed attempt is retried after a short pause instead of a whole
//! period, and the loss is only declared when the TTL ran out since the last
//! renewal known to be stored.
//!
//! An abandoned attempt may still have been stored (its acknowledgement was
//! lost); the next attempt, conditional on the same revision, is then
//! refused. A keeper that finds its own write in the key adopts it, counting
//! its TTL from the start of the earliest attempt that went unconfirmed (the
//! server counts it from a later instant, so the keeper never believes in
//! more lease than the server gives).

use std::time::Duration;

use tokio::time::Instant;

/// Renewal timing of one kept lease.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    renew_every: Duration,
    /// How long a renewal lasts (the TTL, less a keeper's safety margin).
    valid_for: Duration,
    /// Start of the latest attempt known to be stored.
    renewed_at: Instant,
    /// Start of the earliest attempt since then whose outcome is unknown.
    unconfirmed_since: Option<Instant>,
}

impl Renewal {
    /// A lease renewed (or taken) at `renewed_at`, valid for `valid_for`
    /// after each renewal, renewed every `renew_every`.
    pub(crate) fn new(renewed_at: Instant, renew_every: Duration, valid_for: Duration) -> Self {
        Self {
            renew_every,
            valid_for,
            renewed_at,
            unconfirmed_since: None,
        }
    }

    /// The pause after an attempt that did not renew.
    pub(crate) fn retry_delay(&self) -> Duration {
        (self.renew_every / 4).clamp(Duration::from_millis(50), Duration::from_millis(500))
    }

    /// The pause before the next attempt.
    pub(crate) fn next_delay(&self) -> Duration {
        if self.unconfirmed_since.is_some() {
            self.retry_delay()
        } else {
            self.renew_every
        }
    }

    /// True when, at `now`, the last stored renewal is older than the validity.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.renewed_at) >= self.valid_for
    }

    /// When the last stored renewal stops counting.
    pub(crate) fn valid_until(&self) -> Instant {
        self.renewed_at + self.valid_for
    }

    /// Time since the last stored renewal at `now`, for logs.
    pub(crate) fn since_renewal(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.renewed_at)
    }

    /// Starts an attempt at `now`: how long to wait for it (one period at
    /// most, never past the validity).
    pub(crate) fn begin(&mut self, now: Instant) -> Duration {
        self.unconfirmed_since.get_or_insert(now);
        let left = self.valid_for.saturating_sub(self.since_renewal(now));
        left.min(self.renew_every.max(Duration::from_millis(200)))
    }

    /// The attempt started at `attempt_at` was stored.
    pub(crate) fn stored(&mut self, attempt_at: Instant) {
        self.renewed_at = attempt_at;
        self.unconfirmed_since = None;
    }

    /// A write of this keeper's was found stored, from one of the attempts
    /// since the last confirmed one: counts from the earliest of them.
    /// Returns the instant the renewal now counts from.
    pub(crate) fn adopted(&mut self, attempt_at: Instant) -> Instant {
        let from = self.unconfirmed_since.unwrap_or(attempt_at);
        self.stored(from);
        from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_attempt_is_retried_soon_and_never_waited_on_past_the_validity() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut renewal = Renewal::new(start, Duration::from_secs(3), Duration::from_secs(10));
        assert_eq!(renewal.next_delay(), Duration::from_secs(3));
        let first = at(3000);
        // One period, not the client's request timeout or the rest of the TTL.
        assert_eq!(renewal.begin(first), Duration::from_secs(3));
        assert_eq!(renewal.next_delay(), Duration::from_millis(500));
        // 9.5 s after the renewal: only what is left of the validity.
        assert_eq!(renewal.begin(at(9500)), Duration::from_millis(500));
        assert!(!renewal.expired(at(9900)));
        assert!(renewal.expired(at(10_000)));
        // The first attempt had landed: the lease counts from its start.
        assert_eq!(renewal.adopted(at(9500)), first);
        assert!(!renewal.expired(at(12_900)));
        assert!(renewal.expired(at(13_000)));
        assert_eq!(renewal.next_delay(), Duration::from_secs(3));
    }

    #[test]
    fn a_stored_attempt_counts_from_its_own_start() {
        let start = Instant::now();
        let mut renewal = Renewal::new(start, Duration::from_secs(1), Duration::from_secs(3));
        let attempt = start + Duration::from_secs(1);
        renewal.begin(attempt);
        renewal.stored(attempt);
        assert!(!renewal.expired(attempt + Duration::from_millis(2999)));
        assert!(renewal.expired(attempt + Duration::from_secs(3)));
    }
}
