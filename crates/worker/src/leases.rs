//! The slices' leases: taken at start (a restarted daemon reclaims its
//! own), pointed at the session and job running on the slice, re-taken
//! when lost (fencing the session that used it) and released at shutdown.
//! Every slice has its own claim in the leases bucket, but none is renewed:
//! they all live by the daemon's one lease, which the daemon's
//! [`mtswarm_bus::LeaseSet`] renews, so renewal writes grow with daemons,
//! not slices, and a slice (and the idle session on it) owns no task or
//! timer of its own.

use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::{BusError, KeptLease, LeaseSet, Leases};

use crate::error::WorkerError;
use crate::slices::{SliceEntry, Slices};
use crate::stop::StopMode;

/// How often the daemon lease is renewed: a third of its TTL.
pub(crate) fn renew_every(lease_ttl: Duration) -> Duration {
    (lease_ttl / 3).max(Duration::from_millis(200))
}

/// The leases of the daemon's slices, kept by its daemon lease.
pub(crate) struct SliceLeases {
    set: LeaseSet,
    slices: Arc<Slices>,
}

/// Why a slice's lease could not be pointed at a session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaseError {
    /// The daemon holds no lease on the slice right now.
    #[error("the lease on slice {slice_id} is not held")]
    NotHeld { slice_id: String },
    /// The lease was lost (a lapse or a takeover).
    #[error("the lease on slice {slice_id} was lost")]
    Lost { slice_id: String },
    /// The renewal naming the session was refused.
    #[error("lease on slice {slice_id}: {source}")]
    Renew {
        slice_id: String,
        #[source]
        source: BusError,
    },
}

impl SliceLeases {
    /// The leases of `slices`, taken as `worker_id` with `ttl`.
    pub(crate) fn new(
        leases: Leases,
        slices: Arc<Slices>,
        worker_id: String,
        ttl: Duration,
    ) -> Self {
        Self {
            set: leases.keep_set(&worker_id, ttl, renew_every(ttl)),
            slices,
        }
    }

    /// What the daemon knows of slice `index`'s lease (`None`: it keeps
    /// none right now).
    pub(crate) fn state(&self, index: usize) -> Option<KeptLease> {
        self.set.state(&self.slices[index].bus_id)
    }

    /// What the daemon knows of the lease of the slice with bus id `slice_id`.
    pub(crate) fn state_of(&self, slice_id: &str) -> Option<KeptLease> {
        self.set.state(slice_id)
    }

    /// Put the session/job on the slice's lease (empty = idle). Returns the
    /// lease epoch.
    pub(crate) async fn set_lease_session(
        &self,
        index: usize,
        session_id: &str,
        job_id: &str,
    ) -> Result<u64, LeaseError> {
        let entry = &self.slices[index];
        let slice_id = || entry.bus_id.clone();
        let (session, job) = (session_id.to_owned(), job_id.to_owned());
        match self
            .set
            .change(&entry.bus_id, move |lease| {
                lease.session_id = session;
                lease.job_id = job;
            })
            .await
        {
            Ok(Some(renewed)) => Ok(renewed.value.epoch),
            Ok(None) => Err(LeaseError::NotHeld {
                slice_id: slice_id(),
            }),
            Err(BusError::LeaseLost { .. }) => Err(LeaseError::Lost {
                slice_id: slice_id(),
            }),
            Err(source) => Err(LeaseError::Renew {
                slice_id: slice_id(),
                source,
            }),
        }
    }

    /// Re-take leases that were lost (and stop the sessions using them).
    pub(crate) async fn check_leases(&self) {
        for (index, entry) in self.slices.iter().enumerate() {
            let state = self.state(index);
            let lost = match &state {
                // Past its expiry without a renewal (the process was
                // paused, NATS was away): as good as lost.
                Some(KeptLease::Held(held)) => held
                    .value
                    .expires_at
                    .and_then(|ts| std::time::SystemTime::try_from(ts).ok())
                    .is_some_and(|expires| std::time::SystemTime::now() > expires),
                Some(KeptLease::Lost { .. }) | Some(KeptLease::Released) | None => true,
            };
            if !lost {
                continue;
            }
            let owner = self.slices.table().slice_owner[index].clone();
            if let Some(session_id) = &owner {
                let session = self.slices.table().sessions.get(session_id).cloned();
                if let Some(session) = session {
                    let why = match state {
                        Some(KeptLease::Lost { reason, .. }) => reason,
                        Some(KeptLease::Held(_)) => "it expired without a renewal".to_owned(),
                        _ => "it is no longer held".to_owned(),
                    };
                    tracing::warn!(slice.id = %entry.bus_id, session.id = %session_id, reason = %why, "slice lease lost; fencing its session");
                    session.stop(StopMode::Fence(format!(
                        "the lease on slice {} was lost: {why}",
                        entry.bus_id
                    )));
                }
                continue;
            }
            match self.reclaim_idle(entry).await {
                Ok(()) => {
                    tracing::info!(slice.id = %entry.bus_id, "slice lease re-acquired");
                }
                Err(error) => {
                    tracing::debug!(slice.id = %entry.bus_id, %error, "slice lease not re-acquired yet");
                }
            }
        }
    }

    /// Take every slice's lease at start: a restarted daemon reclaims its
    /// own; another holder means two daemons were started for one board.
    /// On failure the leases taken so far are released.
    pub(crate) async fn take_leases(&self) -> Result<(), WorkerError> {
        for entry in self.slices.iter() {
            match self.reclaim_idle(entry).await {
                Ok(()) => {}
                Err(BusError::LeaseHeld {
                    holder_worker_id, ..
                }) => {
                    self.release_leases().await;
                    return Err(WorkerError::SliceTaken {
                        slice_id: entry.bus_id.clone(),
                        holder: holder_worker_id,
                    });
                }
                Err(other) => {
                    self.release_leases().await;
                    return Err(other.into());
                }
            }
        }
        Ok(())
    }

    /// Claim `entry`'s slice naming no session (a restarted daemon gets its
    /// own back) under the daemon lease, and keep it from now on.
    async fn reclaim_idle(&self, entry: &SliceEntry) -> Result<(), BusError> {
        self.set.claim(&entry.bus_id).await.map(|_| ())
    }

    /// Release every lease the daemon holds.
    pub(crate) async fn release_leases(&self) {
        for (slice_id, error) in self.set.release_all().await {
            tracing::warn!(slice.id = %slice_id, %error, "slice lease not released");
        }
    }

    /// Drop every lease without releasing it (it lapses, as after a crash).
    pub(crate) async fn abandon_leases(&self) {
        self.set.abandon_all().await;
    }
}
