//! The per-slice hardware lock. One run on a slice at a time, because two
//! kernels sharing a cluster would corrupt each other's timing (and on the
//! emulator, each other's modeled contention). Waiters are served first come,
//! first served, and the lock keeps the numbers an operator needs to see
//! whether a slice is the bottleneck: how long callers waited, how long each
//! holder held it, and the slice's cumulative busy time (utilization =
//! busy / elapsed).
//!
//! The engine's `ResourceLock` trait lives in `mtswarm-core`, which this crate
//! may not depend on; `mtswarm-tools` adapts [`HwLock`] to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Why a slice could not be acquired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// [`HwLock::try_acquire`] found the slice held or queued for.
    #[error("slice {slice} is busy")]
    Busy {
        /// Id of the slice.
        slice: String,
    },
    /// [`HwLock::acquire_timeout`] gave up waiting.
    #[error("slice {slice} still busy after waiting {waited:?}")]
    Timeout {
        /// Id of the slice.
        slice: String,
        /// The time-out that passed.
        waited: Duration,
    },
}

#[derive(Debug, Default)]
struct Accounting {
    acquisitions: u64,
    total_wait: Duration,
    max_wait: Duration,
    /// Sum of completed holds.
    busy: Duration,
    max_hold: Duration,
    /// Start of the current hold, if held.
    held_since: Option<Instant>,
    waiting: u64,
    last_wait: Duration,
    last_hold: Duration,
}

struct SliceLock {
    /// One permit; tokio's semaphore queues waiters in FIFO order and never
    /// lets `try_acquire` overtake a queued waiter.
    permit: Arc<Semaphore>,
    created: Instant,
    accounting: Mutex<Accounting>,
}

impl SliceLock {
    fn new() -> Self {
        Self {
            permit: Arc::new(Semaphore::new(1)),
            created: Instant::now(),
            accounting: Mutex::new(Accounting::default()),
        }
    }

    fn accounting(&self) -> MutexGuard<'_, Accounting> {
        self.accounting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Statistics of one slice's lock.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LockStats {
    /// Id of the slice the lock is keyed by.
    pub slice: String,
    /// Holds granted so far.
    pub acquisitions: u64,
    /// Callers queued right now.
    pub waiting: u64,
    /// Someone holds the slice right now.
    pub held: bool,
    /// Queueing time summed over every acquisition.
    pub total_wait: Duration,
    /// Longest queueing time of one acquisition.
    pub max_wait: Duration,
    /// Queueing time of the latest acquisition.
    pub last_wait: Duration,
    /// Cumulative hold time, including the current hold so far.
    pub busy: Duration,
    /// Longest single hold, including the current hold so far.
    pub max_hold: Duration,
    /// Length of the latest completed hold.
    pub last_hold: Duration,
    /// Time since the lock for this slice was first used.
    pub elapsed: Duration,
}

impl LockStats {
    /// Fraction of the elapsed time the slice was held (0..1).
    pub fn utilization(&self) -> f64 {
        let elapsed = self.elapsed.as_secs_f64();
        if elapsed <= 0.0 {
            0.0
        } else {
            (self.busy.as_secs_f64() / elapsed).min(1.0)
        }
    }

    /// Average queueing time per acquisition (zero before the first).
    pub fn mean_wait(&self) -> Duration {
        if self.acquisitions == 0 {
            Duration::ZERO
        } else {
            self.total_wait / u32::try_from(self.acquisitions).unwrap_or(u32::MAX)
        }
    }
}

/// Locks for any number of slices, keyed by slice id. Cloning shares the
/// locks (one `HwLock` per worker daemon, handed to every session).
#[derive(Clone, Default)]
pub struct HwLock {
    slices: Arc<Mutex<HashMap<String, Arc<SliceLock>>>>,
}

impl std::fmt::Debug for HwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwLock").finish_non_exhaustive()
    }
}

/// Holding a slice. Dropping it releases the slice and books the hold time.
pub struct HwGuard {
    slice: String,
    waited: Duration,
    acquired_at: Instant,
    lock: Arc<SliceLock>,
    _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for HwGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwGuard")
            .field("slice", &self.slice)
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}

impl HwGuard {
    /// Id of the held slice.
    pub fn slice(&self) -> &str {
        &self.slice
    }
    /// How long the caller queued for this hold.
    pub fn waited(&self) -> Duration {
        self.waited
    }
    /// How long the slice has been held so far.
    pub fn held(&self) -> Duration {
        self.acquired_at.elapsed()
    }
}

impl Drop for HwGuard {
    fn drop(&mut self) {
        let hold = self.acquired_at.elapsed();
        let mut acc = self.lock.accounting();
        acc.busy += hold;
        acc.max_hold = acc.max_hold.max(hold);
        acc.last_hold = hold;
        acc.held_since = None;
        // The permit is released after this, when `_permit` drops.
    }
}

/// Decrements the waiting count even when an acquire future is cancelled.
struct WaitingTicket<'a>(&'a SliceLock);

impl Drop for WaitingTicket<'_> {
    fn drop(&mut self) {
        let mut acc = self.0.accounting();
        acc.waiting = acc.waiting.saturating_sub(1);
    }
}

impl HwLock {
    /// No locks yet: each slice's lock is created on first use.
    pub fn new() -> Self {
        Self::default()
    }

    fn slice_lock(&self, slice: &str) -> Arc<SliceLock> {
        let mut map = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(slice.to_owned())
            .or_insert_with(|| Arc::new(SliceLock::new()))
            .clone()
    }

    fn granted(
        slice: &str,
        lock: Arc<SliceLock>,
        permit: OwnedSemaphorePermit,
        waited: Duration,
    ) -> HwGuard {
        let now = Instant::now();
        {
            let mut acc = lock.accounting();
            acc.acquisitions += 1;
            acc.total_wait += waited;
            acc.max_wait = acc.max_wait.max(waited);
            acc.last_wait = waited;
            acc.held_since = Some(now);
        }
        HwGuard {
            slice: slice.to_owned(),
            waited,
            acquired_at: now,
            lock,
            _permit: permit,
        }
    }

    /// Wait for the slice, in arrival order.
    pub async fn acquire(&self, slice: &str) -> HwGuard {
        let lock = self.slice_lock(slice);
        let start = Instant::now();
        let permit = {
            lock.accounting().waiting += 1;
            let _ticket = WaitingTicket(&lock);
            lock.permit.clone().acquire_owned().await
        };
        match permit {
            Ok(permit) => Self::granted(slice, lock.clone(), permit, start.elapsed()),
            // The semaphore is never closed; this arm exists only because
            // the API returns a Result.
            Err(_) => unreachable_closed(),
        }
    }

    /// Wait at most `timeout`; the place in the queue is given up on timeout.
    pub async fn acquire_timeout(
        &self,
        slice: &str,
        timeout: Duration,
    ) -> Result<HwGuard, LockError> {
        match tokio::time::timeout(timeout, self.acquire(slice)).await {
            Ok(guard) => Ok(guard),
            Err(_) => Err(LockError::Timeout {
                slice: slice.to_owned(),
                waited: timeout,
            }),
        }
    }

    /// Take the slice only if it is free and nobody is queued for it.
    pub fn try_acquire(&self, slice: &str) -> Result<HwGuard, LockError> {
        let lock = self.slice_lock(slice);
        match lock.permit.clone().try_acquire_owned() {
            Ok(permit) => Ok(Self::granted(slice, lock.clone(), permit, Duration::ZERO)),
            Err(TryAcquireError::NoPermits) | Err(TryAcquireError::Closed) => {
                Err(LockError::Busy {
                    slice: slice.to_owned(),
                })
            }
        }
    }

    /// Statistics of one slice (`None` if the slice was never locked).
    pub fn stats(&self, slice: &str) -> Option<LockStats> {
        let lock = {
            let map = self.slices.lock().unwrap_or_else(|e| e.into_inner());
            map.get(slice).cloned()
        }?;
        Some(Self::stats_of(slice, &lock))
    }

    /// Statistics of every slice seen so far, sorted by slice id.
    pub fn all_stats(&self) -> Vec<LockStats> {
        let entries: Vec<(String, Arc<SliceLock>)> = {
            let map = self.slices.lock().unwrap_or_else(|e| e.into_inner());
            map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let mut stats: Vec<LockStats> = entries.iter().map(|(k, v)| Self::stats_of(k, v)).collect();
        stats.sort_by(|a, b| a.slice.cmp(&b.slice));
        stats
    }

    fn stats_of(slice: &str, lock: &SliceLock) -> LockStats {
        let acc = lock.accounting();
        let current = acc.held_since.map(|t| t.elapsed()).unwrap_or_default();
        LockStats {
            slice: slice.to_owned(),
            acquisitions: acc.acquisitions,
            waiting: acc.waiting,
            held: acc.held_since.is_some(),
            total_wait: acc.total_wait,
            max_wait: acc.max_wait,
            last_wait: acc.last_wait,
            busy: acc.busy + current,
            max_hold: acc.max_hold.max(current),
            last_hold: acc.last_hold,
            elapsed: lock.created.elapsed(),
        }
    }
}

#[cold]
fn unreachable_closed() -> ! {
    // `HwLock` owns every semaphore and never calls `close()`.
    panic!("slice semaphore closed")
}
