//! Slice leases: a worker daemon owns a slice only while it keeps renewing a
//! KV key with a TTL. A daemon that dies stops renewing, the key lapses, the
//! server leaves an expiry marker that watchers see, and the leader
//! reassigns the slice's work. Every write is conditional on the revision the
//! holder last saw, so a holder that lost its lease finds out on its next
//! renewal instead of overwriting the new holder.
//!
//! That mechanism (and its renewal loop) is `crate::ttl_lease`'s, shared
//! with job ownership. This module holds what is particular to slices: the
//! request a worker makes, which fields a renewal may change (session and
//! job, never holder or epoch), errors naming the slice and its holder, and
//! the [`LeaseKeeper`] whose state a worker's session watches.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt as _};
use mtswarm_proto::v1::SliceLease;

use crate::connection::Bus;
use crate::error::BusError;
use crate::kv::{TypedKv, Versioned};
use crate::subjects;
use crate::ttl_lease::{Change, Leased, TtlLease, Write, leased_fields};

/// What a worker asks for when it takes a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// Slice to lease (the leases bucket key).
    pub slice_id: String,
    /// Worker daemon taking the slice; only it may renew or release.
    pub worker_id: String,
    /// Session to run on the slice; empty when the slice is owned but idle.
    pub session_id: String,
    /// Job the session works for; empty when the slice is idle.
    pub job_id: String,
    /// Lapse time without renewal; whole seconds, at least 1 s. Renew well
    /// within it (e.g. every third of it).
    pub ttl: Duration,
}

/// A change of a slice's lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseEvent {
    /// Acquired or renewed.
    Held(Versioned<SliceLease>),
    /// Given up by its holder.
    Released {
        /// The slice now free.
        slice_id: String,
    },
    /// Not renewed within its TTL: the slice is free and its session lost.
    Lapsed {
        /// The slice now free.
        slice_id: String,
    },
}

/// Stream of lease changes.
pub type LeaseWatch = Pin<Box<dyn Stream<Item = Result<LeaseEvent, BusError>> + Send>>;

/// The leases bucket.
#[derive(Debug, Clone)]
pub struct Leases {
    lease: TtlLease<SliceLease>,
}

fn timestamp(at: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(at)
}

fn ttl_seconds(ttl: Duration) -> u32 {
    u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX)
}

/// A worker holds a slice: the key is the slice id, the holder the worker.
impl Leased for SliceLease {
    const KIND: &'static str = "slice lease";

    type Error = BusError;

    leased_fields!(key: slice_id, holder: worker_id);

    fn renewed(&mut self, now: SystemTime) {
        self.renewed_at = Some(timestamp(now));
        self.expires_at = Some(timestamp(now + self.ttl()));
    }

    /// The same holder, epoch, session and job: a renewal only restamps.
    fn is_own_write(&self, stored: &Self) -> bool {
        stored.worker_id == self.worker_id
            && stored.epoch == self.epoch
            && stored.session_id == self.session_id
            && stored.job_id == self.job_id
    }

    fn held(key: &str, _asked_by: &str, current: Option<Self>) -> BusError {
        let current = current.unwrap_or_default();
        BusError::LeaseHeld {
            slice_id: key.to_string(),
            holder_worker_id: current.worker_id,
            holder_session_id: current.session_id,
        }
    }

    fn lost(
        _lease: &TtlLease<Self>,
        held: &Versioned<Self>,
        write: Write,
    ) -> impl Future<Output = BusError> + Send {
        std::future::ready(BusError::LeaseLost {
            slice_id: held.value.slice_id.clone(),
            action: match write {
                Write::Retake => "reclaimed",
                Write::Renewal => "renewed",
                Write::Release => "released",
            },
        })
    }

    fn is_lost(error: &BusError) -> bool {
        matches!(error, BusError::LeaseLost { .. })
    }
}

impl LeaseRequest {
    /// `worker_id` owning `slice_id`, idle (no session, no job), for `ttl`.
    pub fn idle(slice_id: impl Into<String>, worker_id: impl Into<String>, ttl: Duration) -> Self {
        Self {
            slice_id: slice_id.into(),
            worker_id: worker_id.into(),
            session_id: String::new(),
            job_id: String::new(),
            ttl,
        }
    }

    /// The lease this request asks for, taken at `now` (its epoch is set
    /// when it is written).
    fn lease(&self, now: SystemTime) -> SliceLease {
        SliceLease {
            slice_id: self.slice_id.clone(),
            worker_id: self.worker_id.clone(),
            session_id: self.session_id.clone(),
            job_id: self.job_id.clone(),
            ttl_seconds: ttl_seconds(self.ttl),
            expires_at: Some(timestamp(now + self.ttl)),
            acquired_at: Some(timestamp(now)),
            renewed_at: Some(timestamp(now)),
            epoch: 0,
        }
    }

    fn validate(&self) -> Result<(), BusError> {
        subjects::validate_id("slice id", &self.slice_id)?;
        subjects::validate_id("worker id", &self.worker_id)
    }
}

impl Leases {
    /// Opens the bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus) -> Result<Self, BusError> {
        Ok(Self {
            lease: TtlLease::open(bus, subjects::LEASES_BUCKET).await?,
        })
    }

    /// The underlying typed bucket.
    pub fn kv(&self) -> &TypedKv<SliceLease> {
        self.lease.kv()
    }

    /// The TTL'd holdings the leases are (for [`crate::LeaseSet`]'s loop).
    pub(crate) fn ttl_lease(&self) -> &TtlLease<SliceLease> {
        &self.lease
    }

    /// Takes the slice if nobody holds it. Fails with [`BusError::LeaseHeld`]
    /// (naming the holder) when another live lease exists. The new lease's
    /// `epoch` is larger than that of any earlier lease in the bucket, so it
    /// can fence work done under an older lease.
    pub async fn acquire(&self, request: &LeaseRequest) -> Result<Versioned<SliceLease>, BusError> {
        request.validate()?;
        let lease = request.lease(SystemTime::now());
        self.lease.acquire(lease, request.ttl).await
    }

    /// Takes over a live lease that names `request.worker_id` as holder (a
    /// restarted daemon reclaiming its own slice without waiting for the
    /// lapse). Fails with [`BusError::LeaseHeld`] when another worker holds it;
    /// acquires normally when the slice is free.
    pub async fn reclaim(&self, request: &LeaseRequest) -> Result<Versioned<SliceLease>, BusError> {
        request.validate()?;
        let lease = request.lease(SystemTime::now());
        self.lease.take(lease, request.ttl).await
    }

    /// Extends the lease by its TTL. [`BusError::LeaseLost`] when it lapsed or
    /// was taken over since `held` was written: stop using the slice.
    pub async fn renew(
        &self,
        held: &Versioned<SliceLease>,
    ) -> Result<Versioned<SliceLease>, BusError> {
        self.lease.renew(held).await
    }

    /// Renews and changes the lease's session/job fields in one write.
    pub async fn renew_with(
        &self,
        held: &Versioned<SliceLease>,
        change: impl FnOnce(&mut SliceLease),
    ) -> Result<Versioned<SliceLease>, BusError> {
        let mut lease = held.value.clone();
        change(&mut lease);
        // The identity of a lease is not changeable through a renewal.
        lease.slice_id = held.value.slice_id.clone();
        lease.worker_id = held.value.worker_id.clone();
        lease.epoch = held.value.epoch;
        self.lease.renew_as(held, lease).await
    }

    /// Gives the slice up. [`BusError::LeaseLost`] when the lease had already
    /// lapsed or changed hands (then there is nothing to release).
    pub async fn release(&self, held: &Versioned<SliceLease>) -> Result<(), BusError> {
        self.lease.release(held).await
    }

    /// The live lease on a slice, if any.
    pub async fn get(&self, slice_id: &str) -> Result<Option<Versioned<SliceLease>>, BusError> {
        self.lease.get(slice_id).await
    }

    /// All live leases.
    pub async fn list(&self) -> Result<Vec<Versioned<SliceLease>>, BusError> {
        self.lease.list().await
    }

    /// Lease changes from now on; a [`LeaseEvent::Lapsed`] frees the slice.
    pub async fn watch(&self) -> Result<LeaseWatch, BusError> {
        Ok(Box::pin(self.lease.watch().await?.map(lease_event)))
    }

    /// Current leases (as `Held`) and then changes.
    pub async fn watch_with_current(&self) -> Result<LeaseWatch, BusError> {
        Ok(Box::pin(
            self.lease.watch_with_current().await?.map(lease_event),
        ))
    }
}

fn lease_event(change: Result<Change<SliceLease>, BusError>) -> Result<LeaseEvent, BusError> {
    Ok(match change? {
        Change::Held(lease) => LeaseEvent::Held(lease),
        Change::Released { key } => LeaseEvent::Released { slice_id: key },
        Change::Lapsed { key } => LeaseEvent::Lapsed { slice_id: key },
    })
}

/// What a [`LeaseKeeper`] currently knows about its lease.
#[derive(Debug, Clone, PartialEq)]
pub enum KeptLease {
    /// Renewed; the value is the latest write.
    Held(Versioned<SliceLease>),
    /// Renewal found the lease lapsed or taken over: stop using the slice.
    Lost {
        /// The slice whose lease was lost.
        slice_id: String,
        /// Why, for logs: the refused renewal, or how long it went unrenewed.
        reason: String,
    },
    /// Released by [`LeaseKeeper::release`].
    Released,
}

/// Renews a lease in the background every `renew_every` until released or
/// lost. Renewal errors that are not a loss (e.g. NATS briefly unreachable,
/// the server restarting, a cluster electing the bucket's stream leader)
/// are retried after a short pause, each attempt waited on for one period
/// at most (`crate::renewal`), for as long as the lease's TTL has not run
/// out since the last successful renewal; only a
/// refused renewal (someone else wrote the key: it lapsed or was taken over)
/// or a TTL that ran out without a successful renewal (the server may have
/// let the key lapse meanwhile, and a process that was paused, e.g. by
/// SIGSTOP, finds it out on its first tick) makes it [`KeptLease::Lost`].
#[derive(Debug)]
pub struct LeaseKeeper {
    state: tokio::sync::watch::Receiver<KeptLease>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    leases: Leases,
}

impl Leases {
    /// Starts renewing `held` every `renew_every` (pick at most a third of
    /// the TTL). Must be called inside a tokio runtime.
    pub fn keep(&self, held: Versioned<SliceLease>, renew_every: Duration) -> LeaseKeeper {
        let (state_tx, state_rx) = tokio::sync::watch::channel(KeptLease::Held(held.clone()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let lease = self.lease.clone();
        let task = tokio::spawn(async move {
            let slice_id = held.value.slice_id.clone();
            let ttl = held.value.ttl();
            let renewed = |held, _| {
                state_tx.send_replace(KeptLease::Held(held));
            };
            let lost = lease
                .keep(held, renew_every, ttl, stop_rx, || true, renewed)
                .await;
            if let Some(reason) = lost {
                state_tx.send_replace(KeptLease::Lost { slice_id, reason });
            }
        });
        LeaseKeeper {
            state: state_rx,
            stop: Some(stop_tx),
            task,
            leases: self.clone(),
        }
    }
}

impl LeaseKeeper {
    /// The latest known state.
    pub fn state(&self) -> KeptLease {
        self.state.borrow().clone()
    }

    /// A receiver of state changes (e.g. to cancel the session on loss).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<KeptLease> {
        self.state.clone()
    }

    /// Resolves when the lease is lost (never, while it is kept).
    pub async fn lost(&self) -> KeptLease {
        let mut state = self.state.clone();
        match state
            .wait_for(|s| matches!(s, KeptLease::Lost { .. }))
            .await
        {
            Ok(lost) => lost.clone(),
            // The renewal task ended without a loss (released).
            Err(_) => self.state(),
        }
    }

    /// Stops renewing and releases the lease. [`BusError::LeaseLost`] when
    /// it was already lost.
    pub async fn release(mut self) -> Result<(), BusError> {
        self.stop_renewing().await;
        match self.state() {
            KeptLease::Held(held) => self.leases.release(&held).await,
            KeptLease::Lost { slice_id, .. } => Err(BusError::LeaseLost {
                slice_id,
                action: "released",
            }),
            KeptLease::Released => Ok(()),
        }
    }

    /// Stops renewing without releasing: the lease lapses after its TTL
    /// (what a crash looks like to the rest of the system).
    pub async fn abandon(mut self) {
        self.stop_renewing().await;
    }

    async fn stop_renewing(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // A renewal in flight finishes first so the state is final.
        let _ = (&mut self.task).await;
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BusConfig;
    use crate::testing::NatsServer;

    async fn kept_lease(nats: &NatsServer, ttl: Duration) -> LeaseKeeper {
        let bus =
            crate::testing::ready_bus(BusConfig::new(nats.url()).with_name("lease-test")).await;
        let leases = Leases::open(&bus).await.expect("leases");
        let held = leases
            .acquire(&LeaseRequest::idle("b0-c0", "w0", ttl))
            .await
            .expect("acquire");
        leases.keep(held, Duration::from_millis(200))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_server_loses_the_lease_only_when_its_ttl_ran_out() {
        let mut nats = NatsServer::start().expect("nats-server");
        let ttl = Duration::from_secs(3);
        let keeper = kept_lease(&nats, ttl).await;
        let mut state = keeper.subscribe();
        nats.stop().expect("stop the server");
        let stopped = tokio::time::Instant::now();
        let lost = tokio::time::timeout(
            ttl * 4,
            state.wait_for(|s| matches!(s, KeptLease::Lost { .. })),
        )
        .await
        .expect("lost within a few TTLs")
        .expect("keeper alive")
        .clone();
        // Failed renewals were retried (no early loss) until the TTL ran out.
        assert!(
            stopped.elapsed() >= ttl - Duration::from_millis(700),
            "lost after {:?}",
            stopped.elapsed()
        );
        let KeptLease::Lost { reason, .. } = lost else {
            unreachable!("waited for Lost");
        };
        assert!(reason.contains("TTL"), "{reason}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_restart_within_the_ttl_keeps_the_lease() {
        let mut nats = NatsServer::start().expect("nats-server");
        let ttl = Duration::from_secs(8);
        let keeper = kept_lease(&nats, ttl).await;
        let mut state = keeper.subscribe();
        nats.restart().expect("restart the server");
        let at_restart = match keeper.state() {
            KeptLease::Held(held) => held.revision,
            other => panic!("lost over a restart: {other:?}"),
        };
        // A renewal after the restart lands at a later revision; a loss ends
        // the wait too and fails the test.
        let renewed = crate::testing::renewed_after(&mut state, at_restart, ttl).await;
        assert!(matches!(renewed, KeptLease::Held(_)), "{renewed:?}");
    }
}
