//! Many slice leases kept by one renewal loop. A worker daemon may own
//! thousands of slices; a [`crate::LeaseKeeper`] per slice would mean a task
//! and a timer each, all firing on their own, and a lease write per slice
//! sent one at a time whenever its timer fires. A [`LeaseSet`] keeps every
//! lease of a daemon with one task: each tick it sends the renewals that are
//! due, many in flight at once on the one connection, so the cost of a
//! lease is its KV write per period and a few hundred bytes of memory.
//!
//! The fencing semantics are those of the keeper: each slice is still its
//! own KV key with its own TTL, taken by a conditional create and renewed by
//! a write conditional on the revision last seen, so a slice has one holder,
//! a refused renewal (someone else wrote the key) or a TTL run out since the
//! last stored renewal makes the lease [`KeptLease::Lost`], and a daemon
//! that dies stops renewing every key at once, each lapsing after its TTL
//! for another daemon to take. Each renewal is the keepers' own attempt
//! (`TtlLease::attempt` in `crate::ttl_lease`: one period per attempt,
//! retries soon after a failure, adoption of a write whose ack was lost,
//! timed by [`crate::renewal`]); only the scheduling is this set's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_proto::v1::SliceLease;
use tokio::time::Instant;

use crate::error::BusError;
use crate::kv::Versioned;
use crate::leases::{KeptLease, Leases};
use crate::renewal::Renewal;
use crate::ttl_lease::{Attempt, Leased as _};

/// Renewals (and releases) one loop has in flight at once: enough to keep
/// the connection busy, few enough not to queue a burst of thousands behind
/// the server's acknowledgements.
const IN_FLIGHT: usize = 256;

/// The leases of one holder, renewed by one background task until dropped.
/// Dropping it stops renewing every lease without releasing them (they
/// lapse after their TTL, as after a crash).
#[derive(Debug)]
pub struct LeaseSet {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Inner {
    leases: Leases,
    renew_every: Duration,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

/// One kept lease.
#[derive(Debug)]
struct Slot {
    /// The latest known state, readable while a write is in flight.
    state: Mutex<KeptLease>,
    /// Held while the key is written (a renewal, a change, the release), so
    /// writes to one key never race each other at the same revision.
    writing: tokio::sync::Mutex<Timing>,
}

#[derive(Debug)]
struct Timing {
    renewal: Renewal,
    /// When the next renewal is due.
    next_at: Instant,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Slot {
    fn state(&self) -> KeptLease {
        locked(&self.state).clone()
    }

    fn set(&self, state: KeptLease) {
        *locked(&self.state) = state;
    }

    fn held(&self) -> Option<Versioned<SliceLease>> {
        match self.state() {
            KeptLease::Held(held) => Some(held),
            _ => None,
        }
    }
}

impl Leases {
    /// An empty set of leases renewed every `renew_every` (pick at most a
    /// third of the TTL) by one task. Must be called inside a tokio runtime.
    pub fn keep_set(&self, renew_every: Duration) -> LeaseSet {
        let inner = Arc::new(Inner {
            leases: self.clone(),
            renew_every,
            slots: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(renewal_loop(inner.clone()));
        LeaseSet { inner, task }
    }
}

/// Wakes a few times per period and renews what is due, [`IN_FLIGHT`] at
/// a time.
async fn renewal_loop(inner: Arc<Inner>) {
    let tick = Renewal::new(Instant::now(), inner.renew_every, inner.renew_every).retry_delay();
    loop {
        tokio::time::sleep(tick).await;
        let now = Instant::now();
        let slots: Vec<Arc<Slot>> = locked(&inner.slots).values().cloned().collect();
        futures::stream::iter(slots)
            .for_each_concurrent(IN_FLIGHT, |slot| {
                let inner = inner.clone();
                async move { inner.renew_if_due(&slot, now).await }
            })
            .await;
    }
}

impl Inner {
    fn slot(&self, slice_id: &str) -> Option<Arc<Slot>> {
        locked(&self.slots).get(slice_id).cloned()
    }

    async fn renew_if_due(&self, slot: &Slot, now: Instant) {
        // A slot being written (changed, released) is renewed by that write.
        let Ok(mut timing) = slot.writing.try_lock() else {
            return;
        };
        if now < timing.next_at {
            return;
        }
        let Some(current) = slot.held() else {
            return;
        };
        let attempt = self
            .leases
            .ttl_lease()
            .attempt(&current, &mut timing.renewal);
        match attempt.await {
            Attempt::Held { lease, from } => {
                timing.next_at = from + self.renew_every;
                slot.set(KeptLease::Held(lease));
            }
            Attempt::Retry => {
                timing.next_at = Instant::now() + timing.renewal.retry_delay();
            }
            Attempt::Lost { reason } => slot.set(KeptLease::Lost {
                slice_id: current.value.slice_id,
                reason,
            }),
        }
    }
}

impl LeaseSet {
    /// Keep `held` renewed from now on, replacing whatever the set kept for
    /// its slice.
    pub fn insert(&self, held: Versioned<SliceLease>) {
        let now = Instant::now();
        let ttl = held.value.ttl();
        let slot = Arc::new(Slot {
            state: Mutex::new(KeptLease::Held(held.clone())),
            writing: tokio::sync::Mutex::new(Timing {
                renewal: Renewal::new(now, self.inner.renew_every, ttl),
                next_at: now + self.inner.renew_every,
            }),
        });
        locked(&self.inner.slots).insert(held.value.slice_id, slot);
    }

    /// What the set knows about the slice's lease; `None` when it keeps none.
    pub fn state(&self, slice_id: &str) -> Option<KeptLease> {
        self.inner.slot(slice_id).map(|slot| slot.state())
    }

    /// Slices the set keeps a lease for (held or lost).
    pub fn len(&self) -> usize {
        locked(&self.inner.slots).len()
    }

    /// True when the set keeps no lease.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Renews the slice's lease and changes its session/job fields in one
    /// write (e.g. to name the session now running on it). `Ok(None)` when
    /// the set keeps no lease for the slice; [`BusError::LeaseLost`] when
    /// it was lost (the state says so from then on); any other error leaves
    /// the lease held and renewed.
    pub async fn change(
        &self,
        slice_id: &str,
        change: impl FnOnce(&mut SliceLease),
    ) -> Result<Option<Versioned<SliceLease>>, BusError> {
        let Some(slot) = self.inner.slot(slice_id) else {
            return Ok(None);
        };
        let mut timing = slot.writing.lock().await;
        let lost = || BusError::LeaseLost {
            slice_id: slice_id.to_owned(),
            action: "renewed",
        };
        let Some(current) = slot.held() else {
            return Err(lost());
        };
        let attempt_at = Instant::now();
        if timing.renewal.expired(attempt_at) {
            slot.set(KeptLease::Lost {
                slice_id: slice_id.to_owned(),
                reason: "not renewed within its TTL".to_owned(),
            });
            return Err(lost());
        }
        match self.inner.leases.renew_with(&current, change).await {
            Ok(renewed) => {
                timing.renewal.stored(attempt_at);
                timing.next_at = attempt_at + self.inner.renew_every;
                slot.set(KeptLease::Held(renewed.clone()));
                Ok(Some(renewed))
            }
            Err(error @ BusError::LeaseLost { .. }) => {
                slot.set(KeptLease::Lost {
                    slice_id: slice_id.to_owned(),
                    reason: error.to_string(),
                });
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    /// Stops renewing the slice's lease and releases it. Nothing to do when
    /// the set keeps none; [`BusError::LeaseLost`] when it was lost.
    pub async fn release(&self, slice_id: &str) -> Result<(), BusError> {
        let Some(slot) = locked(&self.inner.slots).remove(slice_id) else {
            return Ok(());
        };
        Self::release_slot(&self.inner.leases, &slot).await
    }

    async fn release_slot(leases: &Leases, slot: &Slot) -> Result<(), BusError> {
        // A renewal in flight finishes first, so the revision is the last.
        let _writing = slot.writing.lock().await;
        let state = std::mem::replace(&mut *locked(&slot.state), KeptLease::Released);
        match state {
            KeptLease::Held(held) => leases.release(&held).await,
            KeptLease::Lost { slice_id, .. } => Err(BusError::LeaseLost {
                slice_id,
                action: "released",
            }),
            KeptLease::Released => Ok(()),
        }
    }

    /// Releases every lease of the set, many at once; returns the slices
    /// whose release failed, with why.
    pub async fn release_all(&self) -> Vec<(String, BusError)> {
        let slots: Vec<(String, Arc<Slot>)> = locked(&self.inner.slots).drain().collect();
        let leases = &self.inner.leases;
        futures::stream::iter(slots)
            .map(|(slice_id, slot)| async move {
                Self::release_slot(leases, &slot)
                    .await
                    .err()
                    .map(|error| (slice_id, error))
            })
            .buffer_unordered(IN_FLIGHT)
            .filter_map(|failed| async move { failed })
            .collect()
            .await
    }

    /// Stops renewing every lease without releasing it: each lapses after
    /// its TTL (what a crash looks like to the rest of the system).
    pub async fn abandon_all(&self) {
        let slots: Vec<Arc<Slot>> = locked(&self.inner.slots)
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in slots {
            // A renewal in flight finishes first, so none is sent afterwards.
            let _writing = slot.writing.lock().await;
            slot.set(KeptLease::Released);
        }
    }
}

impl Drop for LeaseSet {
    fn drop(&mut self) {
        self.task.abort();
    }
}
