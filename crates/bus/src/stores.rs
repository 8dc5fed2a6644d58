//! Typed stores over the KV buckets that hold the system's state: session
//! checkpoints (workers), approval records (both), quarantined slices and
//! worker membership (job records, kept in parts, have a module of their
//! own, [`crate::jobs`]). Each wraps [`TypedKv`] with the operations and
//! invariants of its record type; `kv()` gives the raw typed bucket for
//! anything else.

use std::time::{Duration, SystemTime};

use mtswarm_proto::v1::{
    ApprovalDecision, ApprovalRecord, ApprovalRequest, ApprovalState, ApprovalVerdict,
    SessionCheckpoint, SliceQuarantine, WorkerRecord,
};

use crate::connection::Bus;
use crate::error::BusError;
use crate::kv::{KvWatch, TypedKv, Versioned};
use crate::subjects;

/// Read-modify-write attempts before a contended update gives up.
pub(crate) const MAX_CAS_RETRIES: usize = 16;

/// Signs what a process writes to the checkpoints bucket and tells a
/// genuine stored checkpoint from a forgery. Every worker identity may
/// write the bucket (checkpoints move with their sessions), so a stored
/// checkpoint counts (for fencing and for a resume) only when its seal
/// says so; the worker's seal checks the leader's placement grant and the
/// granted worker's signature (`mtswarm_auth::provenance`).
pub trait CheckpointSeal: Send + Sync + std::fmt::Debug {
    /// Signs `checkpoint` in place before it is written.
    fn sign(&self, checkpoint: &mut SessionCheckpoint);
    /// Why a stored checkpoint is not genuine; `None` when it is.
    fn refusal(&self, checkpoint: &SessionCheckpoint) -> Option<String>;
}

/// Latest checkpoint per session (bucket `mtswarm_checkpoints`, key = session id).
#[derive(Debug, Clone)]
pub struct Checkpoints {
    kv: TypedKv<SessionCheckpoint>,
    seal: Option<std::sync::Arc<dyn CheckpointSeal>>,
}

impl Checkpoints {
    /// Opens the bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus) -> Result<Self, BusError> {
        Ok(Self {
            kv: TypedKv::open(bus, subjects::CHECKPOINTS_BUCKET).await?,
            seal: None,
        })
    }

    /// Signs every checkpoint written through these methods with `seal`
    /// and trusts a stored one only when `seal` finds it genuine.
    pub fn with_seal(mut self, seal: std::sync::Arc<dyn CheckpointSeal>) -> Self {
        self.seal = Some(seal);
        self
    }

    /// The raw typed bucket, for reads and writes these methods do not cover.
    pub fn kv(&self) -> &TypedKv<SessionCheckpoint> {
        &self.kv
    }

    /// Signs `checkpoint` with the seal (nothing without one), for a write
    /// through [`Checkpoints::kv`].
    pub fn sign(&self, checkpoint: &mut SessionCheckpoint) {
        if let Some(seal) = &self.seal {
            seal.sign(checkpoint);
        }
    }

    /// Why the stored `checkpoint` is not genuine (`None`: it is, or
    /// there is no seal to tell).
    pub fn refusal(&self, checkpoint: &SessionCheckpoint) -> Option<String> {
        self.seal.as_ref()?.refusal(checkpoint)
    }

    /// Stores `checkpoint` as the session's latest, unless the stored one
    /// belongs to a later attempt of the same task ([`BusError::StaleAttempt`]):
    /// a worker still running a task that was reassigned cannot overwrite the
    /// new attempt's progress. Attempts of different tasks are not comparable
    /// (every task starts at attempt 1), so a session's next task always
    /// replaces the previous one's checkpoint. A stored checkpoint the seal
    /// refuses (a forgery by another worker) fences nothing: it is
    /// replaced and logged.
    /// `updated_at` is set to now when the caller left it empty.
    pub async fn put(&self, checkpoint: &SessionCheckpoint) -> Result<u64, BusError> {
        let mut checkpoint = checkpoint.clone();
        if checkpoint.updated_at.is_none() {
            checkpoint.updated_at = Some(prost_types::Timestamp::from(SystemTime::now()));
        }
        self.sign(&mut checkpoint);
        let checkpoint = &checkpoint;
        let session_id = &checkpoint.session_id;
        for _ in 0..MAX_CAS_RETRIES {
            let result = match self.kv.get(session_id).await? {
                None => self.kv.create(session_id, checkpoint).await,
                Some(current) if self.refused(&current) => {
                    self.kv
                        .update(session_id, checkpoint, current.revision)
                        .await
                }
                Some(current) if supersedes(&current.value, checkpoint) => {
                    return Err(BusError::StaleAttempt {
                        session_id: session_id.clone(),
                        stored_attempt: current.value.attempt,
                        attempt: checkpoint.attempt,
                    });
                }
                Some(current) => {
                    self.kv
                        .update(session_id, checkpoint, current.revision)
                        .await
                }
            };
            match result {
                Err(BusError::CasConflict { .. }) | Err(BusError::AlreadyExists { .. }) => continue,
                other => return other,
            }
        }
        Err(BusError::CasConflict {
            bucket: self.kv.bucket().to_string(),
            key: session_id.clone(),
            expected_revision: 0,
        })
    }

    /// True (and logged) when the seal refuses a stored checkpoint.
    fn refused(&self, stored: &Versioned<SessionCheckpoint>) -> bool {
        match self.refusal(&stored.value) {
            Some(reason) => {
                tracing::warn!(
                    session_id = %stored.value.session_id,
                    revision = stored.revision,
                    %reason,
                    "stored checkpoint refused: not written by a worker placed on the session"
                );
                true
            }
            None => false,
        }
    }

    /// Marks the stored checkpoint of `attempt` of `task_id` as fenced: that
    /// attempt lost its slice, so from now on [`Checkpoints::put`] refuses
    /// its states (a redelivery of the fenced attempt is stopped at its
    /// first write) while a later attempt still resumes from it. `Ok(false)`
    /// when the stored checkpoint is not that attempt's (nothing to mark),
    /// or not genuine.
    pub async fn mark_fenced(
        &self,
        session_id: &str,
        task_id: &str,
        attempt: u32,
    ) -> Result<bool, BusError> {
        for _ in 0..MAX_CAS_RETRIES {
            let Some(current) = self.kv.get(session_id).await? else {
                return Ok(false);
            };
            if current.value.task_id != task_id || current.value.attempt != attempt {
                return Ok(false);
            }
            if self.refused(&current) {
                return Ok(false);
            }
            if current.value.fenced {
                return Ok(true);
            }
            let mut marked = current.value.clone();
            marked.fenced = true;
            self.sign(&mut marked);
            match self.kv.update(session_id, &marked, current.revision).await {
                Ok(_) => return Ok(true),
                Err(BusError::CasConflict { .. }) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(BusError::CasConflict {
            bucket: self.kv.bucket().to_string(),
            key: session_id.to_string(),
            expected_revision: 0,
        })
    }

    /// The session's latest checkpoint as stored (genuine or not).
    pub async fn get(
        &self,
        session_id: &str,
    ) -> Result<Option<Versioned<SessionCheckpoint>>, BusError> {
        self.kv.get(session_id).await
    }

    /// The session's latest checkpoint when the seal finds it genuine;
    /// `None` (logged) for a forgery, which a resume must never start from.
    pub async fn get_genuine(
        &self,
        session_id: &str,
    ) -> Result<Option<Versioned<SessionCheckpoint>>, BusError> {
        Ok(self
            .kv
            .get(session_id)
            .await?
            .filter(|stored| !self.refused(stored)))
    }

    /// Removes a finished session's checkpoint and every record kept
    /// under its key (`<session_id>.<...>`: the parts of a checkpoint
    /// stored apart, such as its history's messages).
    pub async fn delete(&self, session_id: &str) -> Result<(), BusError> {
        self.kv.delete(session_id, None).await?;
        self.delete_parts(session_id, ">").await.map(drop)
    }

    /// Deletes the records under `<session_id>.<filter>` (`filter` a key
    /// pattern: `*` one token, `>` the rest), found from the bucket's
    /// per-key counts without reading them; how many.
    pub async fn delete_parts(&self, session_id: &str, filter: &str) -> Result<usize, BusError> {
        crate::subjects::validate_id("session id", session_id)?;
        self.kv
            .nested_view::<SessionCheckpoint>()
            .delete_matching(&format!("{session_id}.{filter}"))
            .await
    }
}

/// Whether the stored checkpoint `current` may not be replaced by
/// `checkpoint`: it belongs to a later attempt of the same task, or to the
/// same attempt after that attempt was fenced off (a fenced state is only
/// ever replaced by a later attempt, or re-marked).
fn supersedes(current: &SessionCheckpoint, checkpoint: &SessionCheckpoint) -> bool {
    current.task_id == checkpoint.task_id
        && (current.attempt > checkpoint.attempt
            || (current.attempt == checkpoint.attempt && current.fenced && !checkpoint.fenced))
}

/// Key prefix of standing approvals in the approvals bucket: a decided
/// record whose decision reaches beyond its call (a tool for a job, or for
/// an agent), kept under a key derived from what it covers. Approval ids
/// never start with it, and [`Approvals::list`] leaves these records out.
pub const STANDING_APPROVAL_PREFIX: &str = "standing-";

/// Approval records (bucket `mtswarm_approvals`, key = approval id), and
/// standing approvals (keys [`STANDING_APPROVAL_PREFIX`]...).
#[derive(Debug, Clone)]
pub struct Approvals {
    kv: TypedKv<ApprovalRecord>,
}

fn state_name(state: ApprovalState) -> String {
    state.as_str_name().to_string()
}

impl Approvals {
    /// Opens the bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus) -> Result<Self, BusError> {
        Ok(Self {
            kv: TypedKv::open(bus, subjects::APPROVALS_BUCKET).await?,
        })
    }

    /// The raw typed bucket, for reads and writes these methods do not cover.
    pub fn kv(&self) -> &TypedKv<ApprovalRecord> {
        &self.kv
    }

    /// Records a new pending request; [`BusError::AlreadyExists`] for a
    /// duplicate approval id (e.g. a resumed session re-asking).
    pub async fn create(
        &self,
        request: &ApprovalRequest,
    ) -> Result<Versioned<ApprovalRecord>, BusError> {
        let record = ApprovalRecord {
            request: Some(request.clone()),
            state: ApprovalState::Pending as i32,
            decision: None,
            verification_error: String::new(),
        };
        let revision = self.kv.create(&request.approval_id, &record).await?;
        Ok(Versioned {
            value: record,
            revision,
        })
    }

    /// The approval's record (request, state, decision); `None` when unknown.
    pub async fn get(
        &self,
        approval_id: &str,
    ) -> Result<Option<Versioned<ApprovalRecord>>, BusError> {
        self.kv.get(approval_id).await
    }

    /// Records, optionally of one job and/or in the given states (empty = all).
    pub async fn list(
        &self,
        job_id: Option<&str>,
        states: &[ApprovalState],
    ) -> Result<Vec<Versioned<ApprovalRecord>>, BusError> {
        Ok(self
            .kv
            .list()
            .await?
            .into_iter()
            .filter(|(key, _)| !key.starts_with(STANDING_APPROVAL_PREFIX))
            .map(|(_, record)| record)
            .filter(|record| {
                let job_matches = job_id.is_none_or(|job_id| {
                    record.value.request.as_ref().map(|r| r.job_id.as_str()) == Some(job_id)
                });
                let state_matches = states.is_empty() || states.contains(&record.value.state());
                job_matches && state_matches
            })
            .collect())
    }

    /// Stores a standing approval under `key` (which must start with
    /// [`STANDING_APPROVAL_PREFIX`]); a later one for the same key replaces it.
    pub async fn put_standing(&self, key: &str, record: &ApprovalRecord) -> Result<u64, BusError> {
        if !key.starts_with(STANDING_APPROVAL_PREFIX) {
            return Err(BusError::InvalidId {
                kind: "standing approval key",
                value: key.to_string(),
                reason: "must start with `standing-`",
            });
        }
        self.kv.put(key, record).await
    }

    /// The standing approval under `key`, if any.
    pub async fn standing(&self, key: &str) -> Result<Option<Versioned<ApprovalRecord>>, BusError> {
        if !key.starts_with(STANDING_APPROVAL_PREFIX) {
            return Ok(None);
        }
        self.kv.get(key).await
    }

    /// Decides a pending approval: reads it, then writes the decision
    /// conditionally on that read. [`BusError::AlreadyDecided`] when it was
    /// decided before; [`BusError::CasConflict`] when another decision landed
    /// between the read and the write (the caller re-reads to see which won).
    pub async fn decide(
        &self,
        decision: &ApprovalDecision,
    ) -> Result<Versioned<ApprovalRecord>, BusError> {
        let Some(current) = self.kv.get(&decision.approval_id).await? else {
            return Err(BusError::NotFound {
                bucket: self.kv.bucket().to_string(),
                key: decision.approval_id.clone(),
            });
        };
        self.decide_at(decision, &current).await
    }

    /// Writes `decision` onto `current` if the record is still at
    /// `current.revision` and pending.
    pub async fn decide_at(
        &self,
        decision: &ApprovalDecision,
        current: &Versioned<ApprovalRecord>,
    ) -> Result<Versioned<ApprovalRecord>, BusError> {
        let state = match decision.verdict() {
            ApprovalVerdict::Approve => ApprovalState::Approved,
            ApprovalVerdict::Deny => ApprovalState::Denied,
            ApprovalVerdict::Unspecified => {
                return Err(BusError::InvalidDecision {
                    approval_id: decision.approval_id.clone(),
                    reason: "verdict must be APPROVE or DENY",
                });
            }
        };
        if current.value.state() != ApprovalState::Pending {
            return Err(BusError::AlreadyDecided {
                approval_id: decision.approval_id.clone(),
                state: state_name(current.value.state()),
            });
        }
        let mut decision = decision.clone();
        if decision.decided_at.is_none() {
            decision.decided_at = Some(prost_types::Timestamp::from(SystemTime::now()));
        }
        let record = ApprovalRecord {
            request: current.value.request.clone(),
            state: state as i32,
            decision: Some(decision.clone()),
            verification_error: String::new(),
        };
        let revision = self
            .kv
            .update(&decision.approval_id, &record, current.revision)
            .await?;
        Ok(Versioned {
            value: record,
            revision,
        })
    }

    /// Approval changes from now on.
    pub async fn watch(&self) -> Result<KvWatch<ApprovalRecord>, BusError> {
        self.kv.watch().await
    }
}

/// Quarantined slices (bucket `mtswarm_quarantine`, key = slice id).
#[derive(Debug, Clone)]
pub struct Quarantine {
    kv: TypedKv<SliceQuarantine>,
}

impl Quarantine {
    /// Opens the bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus) -> Result<Self, BusError> {
        Ok(Self {
            kv: TypedKv::open(bus, subjects::QUARANTINE_BUCKET).await?,
        })
    }

    /// The raw typed bucket, for reads and writes these methods do not cover.
    pub fn kv(&self) -> &TypedKv<SliceQuarantine> {
        &self.kv
    }

    /// Takes a slice out of service (overwrites an earlier quarantine record).
    pub async fn put(&self, quarantine: &SliceQuarantine) -> Result<u64, BusError> {
        self.kv.put(&quarantine.slice_id, quarantine).await
    }

    /// The slice's quarantine record; `None` when the slice is not quarantined.
    pub async fn get(
        &self,
        slice_id: &str,
    ) -> Result<Option<Versioned<SliceQuarantine>>, BusError> {
        self.kv.get(slice_id).await
    }

    /// Returns a slice to service.
    pub async fn lift(&self, slice_id: &str) -> Result<(), BusError> {
        self.kv.delete(slice_id, None).await
    }

    /// Every quarantined slice.
    pub async fn list(&self) -> Result<Vec<Versioned<SliceQuarantine>>, BusError> {
        Ok(self.kv.list().await?.into_iter().map(|(_, q)| q).collect())
    }
}

/// Worker daemon membership (bucket `mtswarm_workers`, key = worker id, per-key TTL).
#[derive(Debug, Clone)]
pub struct Workers {
    kv: TypedKv<WorkerRecord>,
}

impl Workers {
    /// Opens the bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus) -> Result<Self, BusError> {
        Ok(Self {
            kv: TypedKv::open(bus, subjects::WORKERS_BUCKET).await?,
        })
    }

    /// The raw typed bucket, for reads and writes these methods do not cover.
    pub fn kv(&self) -> &TypedKv<WorkerRecord> {
        &self.kv
    }

    /// Registers a daemon with a TTL; a record left by an earlier run of the
    /// same worker id is replaced.
    pub async fn register(
        &self,
        record: &WorkerRecord,
        ttl: Duration,
    ) -> Result<Versioned<WorkerRecord>, BusError> {
        for _ in 0..MAX_CAS_RETRIES {
            let result = match self.kv.get(&record.worker_id).await? {
                None => {
                    self.kv
                        .create_with_ttl(&record.worker_id, record, ttl)
                        .await
                }
                Some(current) => {
                    self.kv
                        .update_with_ttl(&record.worker_id, record, current.revision, ttl)
                        .await
                }
            };
            match result {
                Ok(revision) => {
                    return Ok(Versioned {
                        value: record.clone(),
                        revision,
                    });
                }
                Err(BusError::CasConflict { .. }) | Err(BusError::AlreadyExists { .. }) => continue,
                Err(other) => return Err(other),
            }
        }
        Err(BusError::CasConflict {
            bucket: self.kv.bucket().to_string(),
            key: record.worker_id.clone(),
            expected_revision: 0,
        })
    }

    /// Refreshes the record's TTL (and content). [`BusError::CasConflict`]
    /// when it was replaced or lapsed since `held`.
    pub async fn heartbeat(
        &self,
        held: &Versioned<WorkerRecord>,
        record: &WorkerRecord,
        ttl: Duration,
    ) -> Result<Versioned<WorkerRecord>, BusError> {
        let revision = self
            .kv
            .update_with_ttl(&held.value.worker_id, record, held.revision, ttl)
            .await?;
        Ok(Versioned {
            value: record.clone(),
            revision,
        })
    }

    /// Removes the daemon from the fleet.
    pub async fn deregister(&self, worker_id: &str) -> Result<(), BusError> {
        self.kv.delete(worker_id, None).await
    }

    /// Every worker record still in the bucket (entries lapse with their TTL).
    pub async fn list(&self) -> Result<Vec<Versioned<WorkerRecord>>, BusError> {
        Ok(self.kv.list().await?.into_iter().map(|(_, w)| w).collect())
    }

    /// Membership changes from now on (`Expired` = the daemon stopped heartbeating).
    pub async fn watch(&self) -> Result<KvWatch<WorkerRecord>, BusError> {
        self.kv.watch().await
    }
}
