//! Many slice leases kept by one daemon lease. A worker daemon may own
//! thousands of slices; renewing a key per slice would cost a KV write per
//! slice per period, growing with the farm. A [`LeaseSet`] keeps the
//! daemon's one liveness key (`crate::daemon_lease`) renewed by one task and
//! writes a slice's claim only when it changes: when it is taken, pointed
//! at a session or job, and released. Renewal writes grow with daemons, not
//! slices.
//!
//! The fencing semantics stay those of a lease per slice: each claim is its
//! own KV key taken by a conditional write and changed by writes
//! conditional on the revision last seen, so a slice has one holder; a
//! claim someone else wrote or deleted is [`KeptLease::Lost`] as soon as
//! the set's watch of the claims sees it (claims change only when slices
//! change hands, so the watch is quiet), and at the latest on its next
//! change; and
//! when the daemon lease is lost (a refused renewal, or its TTL ran out
//! since the last stored one) every claim is lost at once, as it is for
//! every reader of the bucket. The next [`LeaseSet::claim`] takes the
//! daemon lease again at a new epoch, under which the claims are written
//! anew. Each renewal is the keepers' own attempt (`TtlLease::attempt` in
//! `crate::ttl_lease`: one period per attempt, retries soon after a
//! failure, adoption of a write whose ack was lost, timed by
//! [`crate::renewal`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_proto::v1::{DaemonLease, SliceLease};
use tokio::time::Instant;

use crate::daemon_lease::with_daemon_times;
use crate::error::BusError;
use crate::kv::{KvChange, Versioned};
use crate::leases::{KeptLease, LeaseRequest, Leases};
use crate::renewal::Renewal;
use crate::ttl_lease::Attempt;

/// Claim writes (releases, and re-writes on servers without per-key TTLs)
/// one set has in flight at once: enough to keep the connection busy, few
/// enough not to queue a burst of thousands behind the server's
/// acknowledgements.
const IN_FLIGHT: usize = 256;

/// The claims of one daemon, kept by its daemon lease, which one background
/// task renews until the set is dropped. Dropping it stops renewing without
/// releasing anything (the daemon lease lapses after its TTL, and every
/// claim with it, as after a crash).
#[derive(Debug)]
pub struct LeaseSet {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
    watch: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Inner {
    leases: Leases,
    worker_id: String,
    ttl: Duration,
    renew_every: Duration,
    /// The daemon lease; locked across its writes (renewal, take, release).
    daemon: tokio::sync::Mutex<Daemon>,
    /// The daemon lease as last stored and until when it counts, readable
    /// while a write is in flight.
    current: Mutex<Option<(Versioned<DaemonLease>, Instant)>>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

#[derive(Debug)]
struct Daemon {
    /// `None`: not taken yet, lost, released or abandoned.
    held: Option<Versioned<DaemonLease>>,
    renewal: Renewal,
    /// When the next renewal is due.
    next_at: Instant,
    /// Released or abandoned: never taken again.
    ended: bool,
}

/// One kept claim.
#[derive(Debug)]
struct Slot {
    /// The latest known state, readable while a write is in flight.
    state: Mutex<KeptLease>,
    /// Held while the claim is written (a change, the release), so writes
    /// to one key never race each other at the same revision.
    writing: tokio::sync::Mutex<()>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Slot {
    fn new(state: KeptLease) -> Self {
        Self {
            state: Mutex::new(state),
            writing: tokio::sync::Mutex::new(()),
        }
    }

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
    /// An empty set of `worker_id`'s claims, kept by its daemon lease of
    /// `ttl` renewed every `renew_every` (pick at most a third of the TTL)
    /// by one task. The daemon lease is taken by the first
    /// [`LeaseSet::claim`]. Must be called inside a tokio runtime.
    pub fn keep_set(&self, worker_id: &str, ttl: Duration, renew_every: Duration) -> LeaseSet {
        let now = Instant::now();
        let inner = Arc::new(Inner {
            leases: self.clone(),
            worker_id: worker_id.to_owned(),
            ttl,
            renew_every,
            daemon: tokio::sync::Mutex::new(Daemon {
                held: None,
                renewal: Renewal::new(now, renew_every, ttl),
                next_at: now,
                ended: false,
            }),
            current: Mutex::new(None),
            slots: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(renewal_loop(inner.clone()));
        let watch = tokio::spawn(watch_claims(inner.clone()));
        LeaseSet { inner, task, watch }
    }
}

/// Follows every write of the claims and marks a kept claim lost when
/// someone else wrote or deleted it; re-opened with backoff when it fails.
async fn watch_claims(inner: Arc<Inner>) {
    let mut backoff =
        crate::reopen::Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
    loop {
        match inner.leases.kv().watch().await {
            Ok(mut changes) => {
                backoff.reset();
                while let Some(change) = changes.next().await {
                    match change {
                        Ok(change) => inner.claim_written(change),
                        Err(error) => {
                            tracing::debug!(%error, "slice claims watch failed; re-opening");
                            break;
                        }
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "slice claims watch not opened; retrying"),
        }
        backoff.sleep().await;
    }
}

/// Wakes a few times per period and renews the daemon lease when due.
async fn renewal_loop(inner: Arc<Inner>) {
    let tick = Renewal::new(Instant::now(), inner.renew_every, inner.renew_every).retry_delay();
    loop {
        tokio::time::sleep(tick).await;
        inner.renew_if_due(Instant::now()).await;
    }
}

impl Inner {
    fn slot(&self, slice_id: &str) -> Option<Arc<Slot>> {
        locked(&self.slots).get(slice_id).cloned()
    }

    fn slots(&self) -> Vec<Arc<Slot>> {
        locked(&self.slots).values().cloned().collect()
    }

    /// A claim was written or removed: a kept claim written since by
    /// anyone but this set is lost.
    fn claim_written(&self, change: KvChange<SliceLease>) {
        let (slice_id, revision, own) = match &change {
            KvChange::Put { key, value } => (key, value.revision, Some(&value.value)),
            KvChange::Deleted { key, revision } | KvChange::Expired { key, revision } => {
                (key, *revision, None)
            }
        };
        let Some(slot) = self.slot(slice_id) else {
            return;
        };
        let mut state = locked(&slot.state);
        let KeptLease::Held(held) = &*state else {
            return;
        };
        let ours = own.is_some_and(|written| {
            written.worker_id == held.value.worker_id
                && written.epoch == held.value.epoch
                && written.daemon_epoch == held.value.daemon_epoch
        });
        if revision <= held.revision || ours {
            return;
        }
        let reason = match own {
            Some(written) => format!("the claim was written by {}", written.worker_id),
            None => "the claim was removed".to_owned(),
        };
        tracing::warn!(slice.id = %slice_id, %reason, "slice claim lost");
        *state = KeptLease::Lost {
            slice_id: slice_id.clone(),
            reason,
        };
    }

    /// The daemon lease, while it counts at `now`.
    fn daemon_at(&self, now: Instant) -> Option<Versioned<DaemonLease>> {
        locked(&self.current)
            .as_ref()
            .filter(|(_, until)| now < *until)
            .map(|(held, _)| held.clone())
    }

    async fn renew_if_due(&self, now: Instant) {
        // A take or release in flight renews the lease itself.
        let Ok(mut daemon) = self.daemon.try_lock() else {
            return;
        };
        if now < daemon.next_at {
            return;
        }
        let Some(current) = daemon.held.clone() else {
            return;
        };
        let attempt = {
            let Daemon { renewal, .. } = &mut *daemon;
            self.leases.daemons().attempt(&current, renewal).await
        };
        match attempt {
            Attempt::Held { lease, from } => {
                daemon.next_at = from + self.renew_every;
                let until = daemon.renewal.valid_until();
                daemon.held = Some(lease.clone());
                self.renewed(lease, until).await;
            }
            Attempt::Retry => {
                daemon.next_at = Instant::now() + daemon.renewal.retry_delay();
            }
            Attempt::Lost { reason } => {
                daemon.held = None;
                self.lose_all(&format!("the daemon's lease was lost: {reason}"));
            }
        }
    }

    /// A stored renewal: the claims read with its times from now on (and,
    /// on a server without per-key TTLs, are written again so the bucket's
    /// age limit does not drop them).
    async fn renewed(&self, lease: Versioned<DaemonLease>, until: Instant) {
        *locked(&self.current) = Some((lease.clone(), until));
        let slots = self.slots();
        for slot in &slots {
            let mut state = locked(&slot.state);
            if let KeptLease::Held(held) = &mut *state
                && held.value.daemon_epoch == lease.value.epoch
            {
                held.value = with_daemon_times(held.value.clone(), &lease.value);
            }
        }
        if self.leases.per_key_ttl() {
            return;
        }
        futures::stream::iter(slots)
            .for_each_concurrent(IN_FLIGHT, |slot| async move {
                let Ok(_writing) = slot.writing.try_lock() else {
                    return;
                };
                if let Some(held) = slot.held() {
                    match self.leases.touch_claim(&held).await {
                        Ok(touched) => slot.set(KeptLease::Held(touched)),
                        Err(error @ BusError::LeaseLost { .. }) => slot.set(KeptLease::Lost {
                            slice_id: held.value.slice_id,
                            reason: error.to_string(),
                        }),
                        Err(error) => tracing::warn!(%error, "slice claim not written again"),
                    }
                }
            })
            .await;
    }

    /// Every claim is lost with the daemon lease.
    fn lose_all(&self, reason: &str) {
        *locked(&self.current) = None;
        for slot in self.slots() {
            let mut state = locked(&slot.state);
            if let KeptLease::Held(held) = &*state {
                *state = KeptLease::Lost {
                    slice_id: held.value.slice_id.clone(),
                    reason: reason.to_owned(),
                };
            }
        }
    }

    /// The daemon lease, taken (again, at a new epoch) when it is not held
    /// or no longer counts.
    async fn ensure_daemon(&self) -> Result<Versioned<DaemonLease>, BusError> {
        let mut daemon = self.daemon.lock().await;
        if daemon.ended {
            return Err(BusError::DaemonLeaseLost {
                worker_id: self.worker_id.clone(),
                action: "taken after its release",
            });
        }
        let now = Instant::now();
        if let Some(held) = &daemon.held {
            if !daemon.renewal.expired(now) {
                return Ok(held.clone());
            }
            // Past its validity without the loop noticing (the process was
            // paused): as good as lost.
            daemon.held = None;
            self.lose_all("the daemon's lease ran out without a renewal");
        }
        let taken = self.leases.take_daemon(&self.worker_id, self.ttl).await?;
        daemon.renewal = Renewal::new(now, self.renew_every, self.ttl);
        daemon.next_at = now + self.renew_every;
        daemon.held = Some(taken.clone());
        *locked(&self.current) = Some((taken.clone(), daemon.renewal.valid_until()));
        tracing::info!(
            worker.id = %self.worker_id,
            epoch = taken.value.epoch,
            "daemon lease taken"
        );
        Ok(taken)
    }

    async fn release_slot(&self, slot: &Slot) -> Result<(), BusError> {
        // A write in flight finishes first, so the revision is the last.
        let _writing = slot.writing.lock().await;
        let state = std::mem::replace(&mut *locked(&slot.state), KeptLease::Released);
        match state {
            KeptLease::Held(held) => self.leases.release(&held).await,
            KeptLease::Lost { slice_id, .. } => Err(BusError::LeaseLost {
                slice_id,
                action: "released",
            }),
            KeptLease::Released => Ok(()),
        }
    }
}

impl LeaseSet {
    /// Claims `slice_id`, idle (no session, no job), under the daemon lease
    /// (taken first when it is not held) and keeps the claim from now on,
    /// replacing whatever the set kept for the slice. A restarted daemon
    /// gets its own slices back; [`BusError::LeaseHeld`] names a live
    /// holder.
    pub async fn claim(&self, slice_id: &str) -> Result<Versioned<SliceLease>, BusError> {
        let daemon = self.inner.ensure_daemon().await?;
        let request = LeaseRequest::idle(slice_id, &self.inner.worker_id, self.inner.ttl);
        let claim = self.inner.leases.claim(&request, &daemon.value).await?;
        let slot = Arc::new(Slot::new(KeptLease::Held(claim.clone())));
        locked(&self.inner.slots).insert(slice_id.to_owned(), slot);
        Ok(claim)
    }

    /// What the set knows about the slice's lease; `None` when it keeps none.
    pub fn state(&self, slice_id: &str) -> Option<KeptLease> {
        self.inner.slot(slice_id).map(|slot| slot.state())
    }

    /// The daemon lease, while it counts.
    pub fn daemon(&self) -> Option<Versioned<DaemonLease>> {
        self.inner.daemon_at(Instant::now())
    }

    /// Slices the set keeps a lease for (held or lost).
    pub fn len(&self) -> usize {
        locked(&self.inner.slots).len()
    }

    /// True when the set keeps no lease.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Changes the slice's claim (e.g. to name the session now running on
    /// it) in one conditional write. `Ok(None)` when the set keeps no claim
    /// for the slice; [`BusError::LeaseLost`] when it was lost, or the
    /// daemon lease no longer counts (the state says so from then on); any
    /// other error leaves the claim as it was.
    pub async fn change(
        &self,
        slice_id: &str,
        change: impl FnOnce(&mut SliceLease),
    ) -> Result<Option<Versioned<SliceLease>>, BusError> {
        let Some(slot) = self.inner.slot(slice_id) else {
            return Ok(None);
        };
        let _writing = slot.writing.lock().await;
        let lost = || BusError::LeaseLost {
            slice_id: slice_id.to_owned(),
            action: "changed",
        };
        let Some(current) = slot.held() else {
            return Err(lost());
        };
        let Some(daemon) = self
            .inner
            .daemon_at(Instant::now())
            .filter(|d| d.value.epoch == current.value.daemon_epoch)
        else {
            slot.set(KeptLease::Lost {
                slice_id: slice_id.to_owned(),
                reason: "the daemon's lease no longer counts".to_owned(),
            });
            return Err(lost());
        };
        match self.inner.leases.change_claim(&current, change).await {
            Ok(changed) => {
                let changed = Versioned {
                    value: with_daemon_times(changed.value, &daemon.value),
                    revision: changed.revision,
                };
                slot.set(KeptLease::Held(changed.clone()));
                Ok(Some(changed))
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

    /// Stops keeping the slice's claim and releases it. Nothing to do when
    /// the set keeps none; [`BusError::LeaseLost`] when it was lost.
    pub async fn release(&self, slice_id: &str) -> Result<(), BusError> {
        let Some(slot) = locked(&self.inner.slots).remove(slice_id) else {
            return Ok(());
        };
        self.inner.release_slot(&slot).await
    }

    /// Releases every claim of the set, many at once, then the daemon
    /// lease; returns what could not be released, with why.
    pub async fn release_all(&self) -> Vec<(String, BusError)> {
        let slots: Vec<(String, Arc<Slot>)> = locked(&self.inner.slots).drain().collect();
        let inner = &self.inner;
        let mut failed: Vec<(String, BusError)> = futures::stream::iter(slots)
            .map(|(slice_id, slot)| async move {
                inner
                    .release_slot(&slot)
                    .await
                    .err()
                    .map(|error| (slice_id, error))
            })
            .buffer_unordered(IN_FLIGHT)
            .filter_map(|failed| async move { failed })
            .collect()
            .await;
        let mut daemon = self.inner.daemon.lock().await;
        daemon.ended = true;
        *locked(&self.inner.current) = None;
        if let Some(held) = daemon.held.take()
            && let Err(error) = self.inner.leases.daemons().release(&held).await
        {
            failed.push((format!("daemon.{}", self.inner.worker_id), error));
        }
        failed
    }

    /// Stops renewing the daemon lease without releasing anything: it lapses
    /// after its TTL, and every claim with it (what a crash looks like to
    /// the rest of the system).
    pub async fn abandon_all(&self) {
        let slots: Vec<Arc<Slot>> = locked(&self.inner.slots)
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        // A renewal in flight finishes first, so none is sent afterwards.
        let mut daemon = self.inner.daemon.lock().await;
        daemon.ended = true;
        daemon.held = None;
        *locked(&self.inner.current) = None;
        for slot in slots {
            slot.set(KeptLease::Released);
        }
    }
}

impl Drop for LeaseSet {
    fn drop(&mut self) {
        self.task.abort();
        self.watch.abort();
    }
}
