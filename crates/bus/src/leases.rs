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
//!
//! A worker daemon does not renew a key per slice: it keeps one liveness
//! key for all of them (`crate::daemon_lease`) and writes each slice's
//! claim ([`Leases::claim`]) only when it changes. Readers here ([`Leases::get`],
//! [`Leases::list`], the watches) apply the rule that joins the two, so a
//! claim of a dead daemon reads as lapsed, exactly like a key whose TTL ran
//! out.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt as _};
use mtswarm_proto::v1::{DaemonLease, SliceLease};

use crate::connection::Bus;
use crate::daemon_lease::{DAEMON_KEY_PREFIX, LeaseView, ViewInput, daemon_lease, live_claim};
use crate::error::BusError;
use crate::kv::{TypedKv, Versioned};
pub use crate::lease_event::LeaseEvent;
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

/// Stream of lease changes.
pub type LeaseWatch = Pin<Box<dyn Stream<Item = Result<LeaseEvent, BusError>> + Send>>;

/// The leases bucket: slice claims, and the daemon liveness keys they live by.
/// Cheap to clone, and small (one pointer) inside the futures that hold it.
#[derive(Debug, Clone)]
pub struct Leases {
    buckets: std::sync::Arc<Buckets>,
}

#[derive(Debug)]
struct Buckets {
    lease: TtlLease<SliceLease>,
    daemons: TtlLease<DaemonLease>,
}

/// Attempts of [`Leases::claim`] when another writer races it.
const CLAIM_ATTEMPTS: usize = 3;

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

    leased_fields!(key: slice_id, holder: worker_id, stamps);

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
            action: write.done(),
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
            daemon_epoch: 0,
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
        let lease = TtlLease::open(bus, subjects::LEASES_BUCKET).await?;
        Ok(Self {
            buckets: std::sync::Arc::new(Buckets {
                daemons: TtlLease::prefixed(lease.kv(), DAEMON_KEY_PREFIX),
                lease,
            }),
        })
    }

    /// The underlying typed bucket.
    pub fn kv(&self) -> &TypedKv<SliceLease> {
        self.buckets.lease.kv()
    }

    /// The daemons' liveness keys (for [`crate::LeaseSet`]'s loop).
    pub(crate) fn daemons(&self) -> &TtlLease<DaemonLease> {
        &self.buckets.daemons
    }

    /// Takes `worker_id`'s liveness key for `ttl`: when nobody holds it, or
    /// from an earlier life of the same daemon (at a new epoch, which ends
    /// every claim of that life).
    pub async fn take_daemon(
        &self,
        worker_id: &str,
        ttl: Duration,
    ) -> Result<Versioned<DaemonLease>, BusError> {
        subjects::validate_id("worker id", worker_id)?;
        let mut attempts = 0;
        loop {
            let lease = daemon_lease(worker_id, ttl_seconds(ttl), SystemTime::now());
            match self.buckets.daemons.take(lease, ttl).await {
                // Its earlier life renewed between the read and the write.
                Err(BusError::DaemonLeaseLost { .. }) if attempts + 1 < CLAIM_ATTEMPTS => {
                    attempts += 1;
                }
                taken => return taken,
            }
        }
    }

    /// The live liveness key of `worker_id`, if any.
    pub async fn daemon(
        &self,
        worker_id: &str,
    ) -> Result<Option<Versioned<DaemonLease>>, BusError> {
        self.buckets.daemons.get(worker_id).await
    }

    /// Claims `request.slice_id` for `request.worker_id` under its daemon
    /// lease `daemon`: the claim has no TTL of its own and holds while that
    /// lease does. Takes a free slice, the daemon's own claim (from an
    /// earlier life, at a new epoch) and a claim of a daemon that is gone;
    /// [`BusError::LeaseHeld`] names the live holder otherwise.
    pub async fn claim(
        &self,
        request: &LeaseRequest,
        daemon: &DaemonLease,
    ) -> Result<Versioned<SliceLease>, BusError> {
        request.validate()?;
        let kv = self.buckets.lease.kv();
        let mut last_conflict = None;
        for _ in 0..CLAIM_ATTEMPTS {
            let mut claim = request.lease(SystemTime::now());
            claim.ttl_seconds = daemon.ttl_seconds;
            claim.daemon_epoch = daemon.epoch;
            claim.epoch = kv.last_sequence().await? + 1;
            let written = match kv.get(&request.slice_id).await? {
                None => kv.create(&request.slice_id, &claim).await,
                Some(current) => {
                    if current.value.worker_id != request.worker_id
                        && self.live(current.value.clone()).await?.is_some()
                    {
                        return Err(SliceLease::held(
                            &request.slice_id,
                            &request.worker_id,
                            Some(current.value),
                        ));
                    }
                    kv.update(&request.slice_id, &claim, current.revision).await
                }
            };
            match written {
                Ok(revision) => {
                    let value = crate::daemon_lease::with_daemon_times(claim, daemon);
                    return Ok(Versioned { value, revision });
                }
                Err(error @ (BusError::AlreadyExists { .. } | BusError::CasConflict { .. })) => {
                    last_conflict = Some(error);
                }
                Err(other) => return Err(other),
            }
        }
        Err(last_conflict.unwrap_or_else(|| BusError::LeaseLost {
            slice_id: request.slice_id.clone(),
            action: "claimed",
        }))
    }

    /// Changes the session/job of a daemon's claim `held` (no renewal: the
    /// claim lives by its daemon's lease). [`BusError::LeaseLost`] when the
    /// claim was written by someone else since.
    pub async fn change_claim(
        &self,
        held: &Versioned<SliceLease>,
        change: impl FnOnce(&mut SliceLease),
    ) -> Result<Versioned<SliceLease>, BusError> {
        let mut claim = held.value.clone();
        change(&mut claim);
        claim.slice_id = held.value.slice_id.clone();
        claim.worker_id = held.value.worker_id.clone();
        claim.epoch = held.value.epoch;
        claim.daemon_epoch = held.value.daemon_epoch;
        match self
            .buckets
            .lease
            .kv()
            .update(&claim.slice_id, &claim, held.revision)
            .await
        {
            Ok(revision) => Ok(Versioned {
                value: claim,
                revision,
            }),
            Err(BusError::CasConflict { .. }) => Err(BusError::LeaseLost {
                slice_id: claim.slice_id,
                action: "changed",
            }),
            Err(other) => Err(other),
        }
    }

    /// Writes a daemon's claim again as it is (on servers without per-key
    /// TTLs the bucket's age limit would otherwise drop it).
    pub(crate) async fn touch_claim(
        &self,
        held: &Versioned<SliceLease>,
    ) -> Result<Versioned<SliceLease>, BusError> {
        self.change_claim(held, |_| {}).await
    }

    /// True when keys carry their own TTL; without it (servers before
    /// 2.11) the bucket's age limit applies to every key.
    pub(crate) fn per_key_ttl(&self) -> bool {
        self.buckets.lease.kv().per_key_ttl()
    }

    /// `claim` as it holds now (see `crate::daemon_lease`).
    async fn live(&self, claim: SliceLease) -> Result<Option<SliceLease>, BusError> {
        if claim.daemon_epoch == 0 {
            return Ok(Some(claim));
        }
        let daemon = self.buckets.daemons.get(&claim.worker_id).await?;
        Ok(live_claim(claim, |_| daemon.as_ref().map(|d| &d.value)))
    }

    /// Takes the slice if nobody holds it. Fails with [`BusError::LeaseHeld`]
    /// (naming the holder) when another live lease exists. The new lease's
    /// `epoch` is larger than that of any earlier lease in the bucket, so it
    /// can fence work done under an older lease.
    pub async fn acquire(&self, request: &LeaseRequest) -> Result<Versioned<SliceLease>, BusError> {
        request.validate()?;
        let lease = request.lease(SystemTime::now());
        self.buckets.lease.acquire(lease, request.ttl).await
    }

    /// Takes over a live lease that names `request.worker_id` as holder (a
    /// restarted daemon reclaiming its own slice without waiting for the
    /// lapse). Fails with [`BusError::LeaseHeld`] when another worker holds it;
    /// acquires normally when the slice is free.
    pub async fn reclaim(&self, request: &LeaseRequest) -> Result<Versioned<SliceLease>, BusError> {
        request.validate()?;
        let lease = request.lease(SystemTime::now());
        self.buckets.lease.take(lease, request.ttl).await
    }

    /// Extends the lease by its TTL. [`BusError::LeaseLost`] when it lapsed or
    /// was taken over since `held` was written: stop using the slice.
    pub async fn renew(
        &self,
        held: &Versioned<SliceLease>,
    ) -> Result<Versioned<SliceLease>, BusError> {
        self.buckets.lease.renew(held).await
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
        self.buckets.lease.renew_as(held, lease).await
    }

    /// Gives the slice up. [`BusError::LeaseLost`] when the lease had already
    /// lapsed or changed hands (then there is nothing to release).
    pub async fn release(&self, held: &Versioned<SliceLease>) -> Result<(), BusError> {
        self.buckets.lease.release(held).await
    }

    /// The live lease on a slice, if any (a daemon's claim with its
    /// daemon's times).
    pub async fn get(&self, slice_id: &str) -> Result<Option<Versioned<SliceLease>>, BusError> {
        let Some(Versioned { value, revision }) = self.buckets.lease.get(slice_id).await? else {
            return Ok(None);
        };
        Ok(self
            .live(value)
            .await?
            .map(|value| Versioned { value, revision }))
    }

    /// All live leases.
    pub async fn list(&self) -> Result<Vec<Versioned<SliceLease>>, BusError> {
        let claims = self.buckets.lease.list().await?;
        let daemons: std::collections::HashMap<String, DaemonLease> =
            if claims.iter().any(|c| c.value.daemon_epoch != 0) {
                self.buckets
                    .daemons
                    .list()
                    .await?
                    .into_iter()
                    .map(|d| (d.value.worker_id.clone(), d.value))
                    .collect()
            } else {
                Default::default()
            };
        Ok(claims
            .into_iter()
            .filter_map(|Versioned { value, revision }| {
                live_claim(value, |w| daemons.get(w)).map(|value| Versioned { value, revision })
            })
            .collect())
    }

    /// Lease changes from now on; a [`LeaseEvent::Lapsed`] frees the slice.
    /// The daemons' current leases and the stored claims are read first
    /// (without events), so a claim written from now on is seen held at
    /// once and a daemon's lapse lapses the claims it kept.
    ///
    /// (Each step is boxed: opening a watch is a large future, and callers
    /// hold this one inside theirs.)
    pub async fn watch(&self) -> Result<LeaseWatch, BusError> {
        let daemons = Box::pin(self.buckets.daemons.watch_with_current()).await?;
        // The watch first: a claim written while the listing runs is then
        // in both, never in neither.
        let claims = Box::pin(self.buckets.lease.watch()).await?;
        let stored = Box::pin(self.buckets.lease.list()).await?;
        Ok(view(LeaseView::with_claims(stored), claims, daemons))
    }

    /// Current leases (as `Held`) and then changes.
    pub async fn watch_with_current(&self) -> Result<LeaseWatch, BusError> {
        let daemons = Box::pin(self.buckets.daemons.watch_with_current()).await?;
        let claims = Box::pin(self.buckets.lease.watch_with_current()).await?;
        Ok(view(LeaseView::default(), claims, daemons))
    }
}

/// The per-slice events of a claims watch and a daemon keys watch, from
/// `view`'s state.
fn view(
    view: LeaseView,
    claims: impl Stream<Item = Result<Change<SliceLease>, BusError>> + Send + 'static,
    daemons: impl Stream<Item = Result<Change<DaemonLease>, BusError>> + Send + 'static,
) -> LeaseWatch {
    let inputs = futures::stream::select(
        claims.map(|c| c.map(ViewInput::Claim)),
        daemons.map(|d| d.map(ViewInput::Daemon)),
    );
    Box::pin(
        inputs
            .scan(view, |view, input| {
                let events: Vec<Result<LeaseEvent, BusError>> = match input {
                    Ok(input) => view.apply(input).into_iter().map(Ok).collect(),
                    Err(error) => vec![Err(error)],
                };
                std::future::ready(Some(futures::stream::iter(events)))
            })
            .flatten(),
    )
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
        let lease = self.buckets.lease.clone();
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
