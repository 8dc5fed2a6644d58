//! Reopening what a NATS outage closed: subscriptions, consumers, watches.
//!
//! The client reconnects by itself, but a JetStream consumer, a KV watch or
//! a subscription made while the server was away has to be opened again,
//! and a write during the outage has to be retried. Every such loop waits
//! between attempts the same way: exponentially longer up to a cap, back to
//! the start after a success, and never past the daemon's shutdown. This
//! module is that one wait, so every loop backs off and stops alike.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Exponential backoff between attempts: `initial`, doubled after every
/// failure up to `max`, back to `initial` after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits start at `initial` and double up to `max` (`max` below
    /// `initial` is raised to it).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The wait before the next attempt; the one after it is doubled.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// Sleeps the next delay.
    pub async fn sleep(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// Sleeps the next delay unless `shutdown` changes first: false when
    /// the daemon is shutting down (or the sender is gone), true otherwise.
    pub async fn sleep_or_shutdown(&mut self, shutdown: &mut watch::Receiver<bool>) -> bool {
        if *shutdown.borrow() {
            return false;
        }
        let delay = self.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = shutdown.changed() => false,
        }
    }
}

/// Calls `open` until it succeeds, logging each failure (`what` names the
/// thing being opened) and backing off between attempts. `None` when
/// `shutdown` changes first. The backoff is reset on success.
pub async fn reopen<T, E, F, Fut>(
    what: &str,
    backoff: &mut Backoff,
    shutdown: &mut watch::Receiver<bool>,
    mut open: F,
) -> Option<T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    loop {
        if *shutdown.borrow() {
            return None;
        }
        match open().await {
            Ok(opened) => {
                backoff.reset();
                return Some(opened);
            }
            Err(error) => {
                tracing::warn!(%error, "{what} unavailable; retrying");
                if !backoff.sleep_or_shutdown(shutdown).await {
                    return None;
                }
            }
        }
    }
}

/// Calls `open` until it succeeds or `patience` has passed, backing off
/// between attempts; the last error when the patience ran out. For a
/// request a caller waits on (a watch being opened), where a NATS cluster
/// electing a new stream leader refuses for a few seconds what it serves
/// again after: the caller should see the election as a delay, not a
/// failure, and a lasting outage as an error, not a hang.
pub async fn retry_within<T, E, F, Fut>(
    what: &str,
    mut backoff: Backoff,
    patience: Duration,
    mut open: F,
) -> Result<T, E>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let give_up = tokio::time::Instant::now() + patience;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match open().await {
            Ok(opened) => {
                if attempts > 1 {
                    tracing::info!(attempts, "{what} opened after a retry");
                }
                return Ok(opened);
            }
            Err(error) => {
                let delay = backoff.next_delay();
                if tokio::time::Instant::now() + delay >= give_up {
                    return Err(error);
                }
                tracing::debug!(%error, attempts, "{what} unavailable; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_retry_within_its_patience_returns_the_first_success() {
        let mut calls = 0;
        let opened = retry_within(
            "thing",
            Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
            Duration::from_secs(5),
            || {
                calls += 1;
                let call = calls;
                async move { if call < 3 { Err("refused") } else { Ok(call) } }
            },
        )
        .await;
        assert_eq!(opened, Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_gives_up_with_the_last_error_once_its_patience_ran_out() {
        let started = tokio::time::Instant::now();
        let mut calls = 0u32;
        let opened: Result<(), String> = retry_within(
            "thing",
            Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
            Duration::from_secs(3),
            || {
                calls += 1;
                let call = calls;
                async move { Err(format!("refused {call}")) }
            },
        )
        .await;
        // Waits of 0.1, 0.2, 0.4, 0.8 and 1 s fit in 3 s; the next does not.
        assert_eq!(opened, Err("refused 6".to_string()));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(2500) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
    }

    #[test]
    fn delays_double_up_to_the_cap_and_restart_after_a_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let delays: Vec<_> = (0..5).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn a_cap_below_the_start_is_raised_to_it() {
        let mut backoff = Backoff::new(Duration::from_millis(300), Duration::from_millis(10));
        assert_eq!(backoff.next_delay(), Duration::from_millis(300));
        assert_eq!(backoff.next_delay(), Duration::from_millis(300));
    }

    #[tokio::test]
    async fn reopen_retries_until_open_succeeds() {
        let (_keep, mut shutdown) = watch::channel(false);
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(4));
        let mut attempts = 0;
        let opened = reopen("test", &mut backoff, &mut shutdown, || {
            attempts += 1;
            let attempt = attempts;
            async move {
                if attempt < 4 {
                    Err(format!("attempt {attempt} refused"))
                } else {
                    Ok(attempt)
                }
            }
        })
        .await;
        assert_eq!(opened, Some(4));
        // Reset on success.
        assert_eq!(backoff.next_delay(), Duration::from_millis(1));
    }

    #[tokio::test]
    async fn shutdown_ends_a_wait_at_once() {
        let (stop, mut shutdown) = watch::channel(false);
        let mut backoff = Backoff::new(Duration::from_secs(3600), Duration::from_secs(3600));
        let waiting = tokio::spawn(async move {
            reopen("never", &mut backoff, &mut shutdown, || async {
                Err::<(), _>("refused")
            })
            .await
        });
        stop.send_replace(true);
        let result = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the wait ends when shutdown changes")
            .expect("the task does not panic");
        assert_eq!(result, None);
    }

    #[tokio::test]
    async fn an_already_set_shutdown_does_not_attempt() {
        let (_keep, mut shutdown) = watch::channel(true);
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(1));
        let mut attempts = 0;
        let opened: Option<()> = reopen("nothing", &mut backoff, &mut shutdown, || {
            attempts += 1;
            async { Ok::<_, String>(()) }
        })
        .await;
        assert_eq!((opened, attempts), (None, 0));
    }
}
