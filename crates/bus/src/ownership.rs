//! Job ownership leases: with several leaders on one NATS, each job is run
//! by one leader at a time, its *owner*, which holds a TTL'd key
//! `<job_id>` in the bucket `mtswarm_job_owners` and renews it by CAS. A
//! leader that dies stops renewing, the key lapses, the server leaves an
//! expiry marker that every leader's watch sees, and a live one takes the
//! job (a conditional create) and resumes it.
//!
//! Each acquisition carries a fencing `epoch` larger than any earlier one
//! of the job (it is above every revision the bucket ever wrote). The
//! owner's writes are gated by a [`Fence`]: a cheap local check that the
//! ownership is still held and that its last successful renewal is recent
//! enough for the key to be alive on the server. The server counts the TTL
//! from when it stored the renewal, which is after the owner started it, so
//! a fence that passes means no other leader can have taken the job yet
//! (minus a margin for the write in flight); a leader that was paused past
//! its TTL (SIGSTOP) finds its fence closed on its first write after it
//! resumes, before its keeper's next renewal is refused.
//!
//! The key's lifecycle (conditional create, CAS renewals, lapse markers,
//! the renewal loop) is `crate::ttl_lease`'s, shared with slice leases.
//! This module holds what is particular to jobs: the owner's fence, errors
//! naming the job and the leaders involved (a refused renewal reads who
//! owns the job now), and the keeper that closes the fence.
//!
//! Why a bucket of its own rather than keys in `mtswarm_leases` or
//! `mtswarm_jobs`: the jobs bucket has no per-key TTLs (records must not
//! lapse), and the slice leases bucket is read and written by workers
//! (whose permissions and watchers expect slice leases only).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt as _};
pub use mtswarm_proto::v1::JobOwner;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::connection::Bus;
use crate::error::BusError;
use crate::kv::Versioned;
use crate::subjects;
use crate::ttl_lease::{Change, Leased, TtlLease, Write, leased_fields};

/// Why an ownership operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// Another leader owns the job.
    #[error(
        "job {job_id} is owned by leader {owner} (epoch {epoch}); leader {asked_by} may not take it"
    )]
    Held {
        /// The job.
        job_id: String,
        /// Leader owning it now (empty when it changed hands during the read).
        owner: String,
        /// Its epoch.
        epoch: u64,
        /// The leader that asked.
        asked_by: String,
    },
    /// This leader's ownership lapsed or was taken over: it may no longer
    /// act on the job.
    #[error("leader {leader_id} lost job {job_id} (epoch {epoch}){}: {reason}", now_owner.as_ref().map(|o| format!(", now owned by leader {o}")).unwrap_or_default())]
    Lost {
        /// The job.
        job_id: String,
        /// The leader that lost it.
        leader_id: String,
        /// The epoch it held.
        epoch: u64,
        /// The leader that owns it now, when known.
        now_owner: Option<String>,
        /// What showed the loss (a refused renewal, an expired deadline).
        reason: String,
    },
    /// The bus failed (not an ownership decision).
    #[error(transparent)]
    Bus(#[from] BusError),
}

/// A change of a job's ownership.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnerEvent {
    /// Acquired or renewed.
    Held(Versioned<JobOwner>),
    /// Given up by its owner (the job ended, or the owner shut down).
    Released {
        /// The job.
        job_id: String,
    },
    /// Not renewed within its TTL: the owner is presumed dead.
    Lapsed {
        /// The job.
        job_id: String,
    },
}

/// Stream of ownership changes.
pub type OwnerWatch = Pin<Box<dyn Stream<Item = Result<OwnerEvent, BusError>> + Send>>;

/// The job ownership bucket.
#[derive(Debug, Clone)]
pub struct JobOwners {
    lease: TtlLease<JobOwner>,
}

fn ttl_seconds(ttl: Duration) -> u32 {
    u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX).max(1)
}

/// A leader owns a job: the key is the job id, the holder the leader.
impl Leased for JobOwner {
    const KIND: &'static str = "job ownership";

    type Error = OwnershipError;

    leased_fields!(key: job_id, holder: leader_id);

    fn renewed(&mut self, now: SystemTime) {
        self.renewed_at = Some(prost_types::Timestamp::from(now));
    }

    /// Only the keeper of an epoch writes it.
    fn is_own_write(&self, stored: &Self) -> bool {
        stored.leader_id == self.leader_id && stored.epoch == self.epoch
    }

    fn held(key: &str, asked_by: &str, current: Option<Self>) -> OwnershipError {
        let current = current.unwrap_or_default();
        OwnershipError::Held {
            job_id: key.to_string(),
            owner: current.leader_id,
            epoch: current.epoch,
            asked_by: asked_by.to_string(),
        }
    }

    /// Reads who owns the job now: a leader that lost a job is told who
    /// took it, and one that lost the race to take its own job back is
    /// refused like any other taker.
    async fn lost(lease: &TtlLease<Self>, held: &Versioned<Self>, write: Write) -> OwnershipError {
        let job_id = &held.value.job_id;
        let reason = match write {
            Write::Retake => {
                return match lease.get(job_id).await {
                    Ok(current) => {
                        Self::held(job_id, &held.value.leader_id, current.map(|c| c.value))
                    }
                    Err(error) => error.into(),
                };
            }
            Write::Renewal => "its renewal was refused",
            Write::Release => "its release was refused",
        };
        let now_owner = match lease.get(job_id).await {
            Ok(Some(current)) => Some(current.value.leader_id),
            _ => None,
        };
        OwnershipError::Lost {
            job_id: job_id.clone(),
            leader_id: held.value.leader_id.clone(),
            epoch: held.value.epoch,
            now_owner,
            reason: reason.to_string(),
        }
    }

    fn is_lost(error: &OwnershipError) -> bool {
        matches!(error, OwnershipError::Lost { .. })
    }
}

impl JobOwners {
    /// Opens the bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus) -> Result<Self, BusError> {
        Ok(Self {
            lease: TtlLease::open(bus, subjects::JOB_OWNERS_BUCKET).await?,
        })
    }

    /// Takes `job_id` for `leader_id` when nobody owns it (no key, or a
    /// lapsed or released one), or when `leader_id` itself owns it (a
    /// restarted leader with the same id: taken over with a new epoch).
    /// [`OwnershipError::Held`] names the owner otherwise.
    pub async fn acquire(
        &self,
        job_id: &str,
        leader_id: &str,
        grpc_url: &str,
        ttl: Duration,
    ) -> Result<Versioned<JobOwner>, OwnershipError> {
        subjects::validate_id("job id", job_id)?;
        subjects::validate_id("leader id", leader_id)?;
        let now = prost_types::Timestamp::from(SystemTime::now());
        let owner = JobOwner {
            job_id: job_id.to_string(),
            leader_id: leader_id.to_string(),
            grpc_url: grpc_url.to_string(),
            epoch: 0,
            ttl_seconds: ttl_seconds(ttl),
            acquired_at: Some(now),
            renewed_at: Some(now),
        };
        let ttl = owner.ttl();
        self.lease.take(owner, ttl).await
    }

    /// Extends the ownership by its TTL; [`OwnershipError::Lost`] when the
    /// key lapsed or changed hands since `held` was written.
    pub async fn renew(
        &self,
        held: &Versioned<JobOwner>,
    ) -> Result<Versioned<JobOwner>, OwnershipError> {
        self.lease.renew(held).await
    }

    /// Gives the job up (it ended, or the owner stops). Lost when it had
    /// already changed hands.
    pub async fn release(&self, held: &Versioned<JobOwner>) -> Result<(), OwnershipError> {
        self.lease.release(held).await
    }

    /// The live owner of `job_id`, if any.
    pub async fn get(&self, job_id: &str) -> Result<Option<Versioned<JobOwner>>, BusError> {
        self.lease.get(job_id).await
    }

    /// Ownership changes from now on; a [`OwnerEvent::Lapsed`] frees a job
    /// whose owner died.
    pub async fn watch(&self) -> Result<OwnerWatch, BusError> {
        Ok(Box::pin(self.lease.watch().await?.map(|change| {
            Ok(match change? {
                Change::Held(owner) => OwnerEvent::Held(owner),
                Change::Released { key } => OwnerEvent::Released { job_id: key },
                Change::Lapsed { key } => OwnerEvent::Lapsed { job_id: key },
            })
        })))
    }
}

/// What an [`OwnershipKeeper`] knows about its ownership.
#[derive(Debug, Clone, PartialEq)]
pub enum KeptOwnership {
    /// Renewed; `valid_until` is the local instant after which the key may
    /// have lapsed on the server (last renewal's start + TTL - margin).
    Held {
        /// The latest write.
        owner: Versioned<JobOwner>,
        /// Writes are refused from this instant on.
        valid_until: Instant,
    },
    /// Lapsed or taken over: stop acting on the job.
    Lost {
        /// Why, for logs.
        reason: String,
    },
    /// Given up by [`OwnershipKeeper::release`].
    Released,
}

/// The part of a TTL a fence keeps back for a write in flight: a quarter,
/// at most 1 s.
fn fence_margin(ttl: Duration) -> Duration {
    (ttl / 4).min(Duration::from_secs(1))
}

/// Gates every write the owner makes for its job: [`Fence::check`] passes
/// only while the ownership is held and its last renewal is recent enough
/// (see the module docs). Cheap to clone and to check (no I/O).
#[derive(Debug, Clone)]
pub struct Fence {
    job_id: String,
    leader_id: String,
    epoch: u64,
    state: Arc<watch::Sender<KeptOwnership>>,
}

impl Fence {
    /// A fence that always passes, for a job no ownership protects
    /// (library tests running a lone job context).
    pub fn unguarded(job_id: &str) -> Self {
        let (state, _) = watch::channel(KeptOwnership::Held {
            owner: Versioned {
                value: JobOwner {
                    job_id: job_id.to_string(),
                    ..Default::default()
                },
                revision: 0,
            },
            valid_until: Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600),
        });
        Self {
            job_id: job_id.to_string(),
            leader_id: String::new(),
            epoch: 0,
            state: Arc::new(state),
        }
    }

    /// The epoch of the ownership this fence guards.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Ok while the owner may write; [`OwnershipError::Lost`] (naming the
    /// job, this leader and its epoch) once it may not. The first failed
    /// check past the deadline marks the ownership lost for every watcher.
    pub fn check(&self, what: &str) -> Result<(), OwnershipError> {
        let lost = |reason: String| OwnershipError::Lost {
            job_id: self.job_id.clone(),
            leader_id: self.leader_id.clone(),
            epoch: self.epoch,
            now_owner: None,
            reason: format!("{what} refused: {reason}"),
        };
        let state = self.state.borrow().clone();
        match state {
            KeptOwnership::Held { valid_until, .. } if Instant::now() < valid_until => Ok(()),
            KeptOwnership::Held { valid_until, .. } => {
                let reason = format!(
                    "the ownership was not renewed in time (deadline passed {:.1} s ago)",
                    valid_until.elapsed().as_secs_f64()
                );
                self.state.send_replace(KeptOwnership::Lost {
                    reason: reason.clone(),
                });
                Err(lost(reason))
            }
            KeptOwnership::Lost { reason } => Err(lost(reason)),
            KeptOwnership::Released => Err(lost("the ownership was released".into())),
        }
    }

    /// Maps a write's error for the owner: [`BusError::Fenced`] (the store
    /// found the record written by a later owner of the job) marks the
    /// ownership lost for every watcher and becomes
    /// [`OwnershipError::Lost`]; any other error is handed back.
    pub fn refused(&self, error: BusError) -> Result<OwnershipError, BusError> {
        match error {
            BusError::Fenced {
                key, stored_epoch, ..
            } => {
                let reason = format!(
                    "{key} was written by the job's owner at epoch {stored_epoch}, after this one"
                );
                self.state.send_replace(KeptOwnership::Lost {
                    reason: reason.clone(),
                });
                Ok(OwnershipError::Lost {
                    job_id: self.job_id.clone(),
                    leader_id: self.leader_id.clone(),
                    epoch: self.epoch,
                    now_owner: None,
                    reason,
                })
            }
            other => Err(other),
        }
    }

    /// Resolves with the reason once the ownership is lost (never while it
    /// is held; at once with `None` when it was released).
    pub async fn lost(&self) -> Option<String> {
        let mut state = self.state.subscribe();
        match state
            .wait_for(|s| !matches!(s, KeptOwnership::Held { .. }))
            .await
        {
            Ok(state) => match &*state {
                KeptOwnership::Lost { reason } => Some(reason.clone()),
                _ => None,
            },
            Err(_) => None,
        }
    }
}

/// Renews a job's ownership every `renew_every` until released or lost,
/// and hands out the [`Fence`] its writes check. Renewal errors that are
/// not a loss (NATS briefly away, a cluster electing the bucket's stream
/// leader) are retried after a short pause, each attempt waited on for one
/// period at most (`crate::renewal`), while the TTL since the last
/// successful renewal has not run out (the fence closes when it does).
#[derive(Debug)]
pub struct OwnershipKeeper {
    fence: Fence,
    owners: JobOwners,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl JobOwners {
    /// Starts renewing `held` every `renew_every` (at most a third of the
    /// TTL). Must be called inside a tokio runtime.
    pub fn keep(&self, held: Versioned<JobOwner>, renew_every: Duration) -> OwnershipKeeper {
        let ttl = held.value.ttl();
        let valid_for = ttl - fence_margin(ttl);
        // The acquisition started before this instant: counting from here
        // would only be later than the server's own clock start.
        let (state, _) = watch::channel(KeptOwnership::Held {
            owner: held.clone(),
            valid_until: Instant::now() + valid_for,
        });
        let state = Arc::new(state);
        let fence = Fence {
            job_id: held.value.job_id.clone(),
            leader_id: held.value.leader_id.clone(),
            epoch: held.value.epoch,
            state: state.clone(),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let lease = self.lease.clone();
        let task = tokio::spawn(async move {
            // A loss a fence check recorded ends the renewals, and no
            // renewal writes over it.
            let held_still = || matches!(*state.borrow(), KeptOwnership::Held { .. });
            let renewed = |owner, from: Instant| {
                state.send_if_modified(|s| match s {
                    KeptOwnership::Held { .. } => {
                        *s = KeptOwnership::Held {
                            owner,
                            valid_until: from + valid_for,
                        };
                        true
                    }
                    _ => false,
                });
            };
            let lost = lease
                .keep(held, renew_every, valid_for, stop_rx, held_still, renewed)
                .await;
            if let Some(reason) = lost {
                state.send_replace(KeptOwnership::Lost { reason });
            }
        });
        OwnershipKeeper {
            fence,
            owners: self.clone(),
            stop: Some(stop_tx),
            task: Some(task),
        }
    }
}

impl OwnershipKeeper {
    /// The fence of this ownership's writes.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The latest known state.
    pub fn state(&self) -> KeptOwnership {
        self.fence.state.borrow().clone()
    }

    /// Stops renewing and deletes the key (the job ended); watchers see a
    /// release, not a lapse. Lost when it had changed hands already.
    pub async fn release(&mut self) -> Result<(), OwnershipError> {
        self.stop_renewing().await;
        let state = self.fence.state.send_replace(KeptOwnership::Released);
        match state {
            KeptOwnership::Held { owner, .. } => self.owners.release(&owner).await,
            KeptOwnership::Lost { reason } => Err(OwnershipError::Lost {
                job_id: self.fence.job_id.clone(),
                leader_id: self.fence.leader_id.clone(),
                epoch: self.fence.epoch,
                now_owner: None,
                reason,
            }),
            KeptOwnership::Released => Ok(()),
        }
    }

    /// Stops renewing without releasing (the key lapses after its TTL) and
    /// closes the fence: what a leader that shuts down leaves for another.
    pub async fn abandon(&mut self) {
        self.stop_renewing().await;
        self.fence.state.send_replace(KeptOwnership::Lost {
            reason: "the leader stopped".into(),
        });
    }

    async fn stop_renewing(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for OwnershipKeeper {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BusConfig;
    use crate::testing::NatsServer;

    async fn owners(nats: &NatsServer) -> JobOwners {
        let bus =
            crate::testing::ready_bus(BusConfig::new(nats.url()).with_name("owners-test")).await;
        JobOwners::open(&bus).await.expect("owners bucket")
    }

    const TTL: Duration = Duration::from_secs(2);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_owner_at_a_time_and_a_lapse_hands_the_job_on_with_a_larger_epoch() {
        let nats = NatsServer::start().expect("nats-server");
        let owners = owners(&nats).await;
        let mut watch = owners.watch().await.expect("watch");
        let a = owners
            .acquire("job1", "leader-a", "http://a", TTL)
            .await
            .expect("a takes the free job");
        assert_eq!(a.value.leader_id, "leader-a");
        assert!(a.value.epoch > 0);
        match owners.acquire("job1", "leader-b", "http://b", TTL).await {
            Err(OwnershipError::Held {
                job_id,
                owner,
                epoch,
                asked_by,
            }) => {
                assert_eq!(
                    (job_id.as_str(), owner.as_str(), epoch, asked_by.as_str()),
                    ("job1", "leader-a", a.value.epoch, "leader-b")
                );
            }
            other => panic!("b must not take a held job: {other:?}"),
        }
        let renewed = owners.renew(&a).await.expect("a renews");
        assert_eq!(
            renewed.value.epoch, a.value.epoch,
            "a renewal keeps the epoch"
        );
        // a stops renewing (dies): the key lapses and watchers see it.
        let lapsed = tokio::time::timeout(TTL * 4, async {
            loop {
                match watch.next().await.expect("watch open").expect("event") {
                    OwnerEvent::Lapsed { job_id } => return job_id,
                    _ => continue,
                }
            }
        })
        .await
        .expect("the lapse is seen within a few TTLs");
        assert_eq!(lapsed, "job1");
        let b = owners
            .acquire("job1", "leader-b", "http://b", TTL)
            .await
            .expect("b takes the lapsed job");
        assert!(
            b.value.epoch > renewed.value.epoch,
            "{b:?} after {renewed:?}"
        );
        match owners.renew(&renewed).await {
            Err(OwnershipError::Lost {
                job_id,
                leader_id,
                now_owner,
                ..
            }) => {
                assert_eq!(job_id, "job1");
                assert_eq!(leader_id, "leader-a");
                assert_eq!(now_owner.as_deref(), Some("leader-b"));
            }
            other => panic!("the stale owner's renewal must be refused: {other:?}"),
        }
        // The same leader id takes its own live job over with a new epoch.
        let again = owners
            .acquire("job1", "leader-b", "http://b2", TTL)
            .await
            .expect("b reclaims its own job");
        assert!(again.value.epoch > b.value.epoch);
        assert!(owners.renew(&b).await.is_err(), "the older write is fenced");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_ownership_fences_writes_once_it_is_not_renewed_in_time() {
        let nats = NatsServer::start().expect("nats-server");
        let owners = owners(&nats).await;
        let held = owners
            .acquire("job2", "leader-a", "http://a", TTL)
            .await
            .expect("acquire");
        let mut keeper = owners.keep(held, Duration::from_millis(300));
        let fence = keeper.fence().clone();
        // Kept across several TTLs: the fence stays open.
        tokio::time::sleep(TTL * 2).await;
        fence.check("a write").expect("held while renewed");
        keeper.release().await.expect("release");
        let refused = fence
            .check("a write after the release")
            .expect_err("released");
        assert!(
            refused.to_string().contains("job2") && refused.to_string().contains("leader-a"),
            "{refused}"
        );
        assert!(owners.get("job2").await.expect("get").is_none());

        // An owner whose renewals stop (its server is gone) has its fence
        // closed once the TTL less the margin ran out, without any I/O.
        let held = owners
            .acquire("job3", "leader-a", "http://a", TTL)
            .await
            .expect("acquire");
        let keeper = owners.keep(held, Duration::from_secs(60));
        let fence = keeper.fence().clone();
        fence.check("a write").expect("fresh");
        let lost = tokio::time::timeout(TTL * 2, async {
            loop {
                if let Err(error) = fence.check("a late write") {
                    return error;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the fence closes within the TTL");
        assert!(matches!(lost, OwnershipError::Lost { .. }), "{lost}");
        assert!(fence.lost().await.is_some(), "watchers see the loss");
    }
}
