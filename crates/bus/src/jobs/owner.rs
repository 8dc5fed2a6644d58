//! Fenced writes of a job's owner. A leader's local [`crate::Fence`] says
//! whether *it* still believes it owns a job; this module makes the store
//! say so too. Every record of a job (the record, its agents, its tasks,
//! the loop checkpoint) carries the fencing epoch of the owner that last
//! wrote it, and [`OwnerWrites`] refuses, with [`BusError::Fenced`], a
//! write whose epoch is smaller than the stored one. The check runs on the
//! value read for the write and the write is conditional on that value's
//! revision, so it is exact: once a new owner has stamped a record (it
//! stamps the job record, [`OwnerWrites::claim`], before it acts on the
//! job), no write of an earlier owner lands on it, whatever that owner's
//! clock or fence says.
//!
//! Writers that are not the owner (a cancellation carried through KV by
//! another leader) write with [`super::Jobs`] itself: they keep the stored
//! epoch and are ordered by the revision alone.

use mtswarm_proto::v1::{AgentPlacement, JobRecord, LeaderCheckpoint, TaskRecord};

use super::{Jobs, agent_key, loop_key, write_at_revision};
use crate::error::BusError;
use crate::kv::Versioned;

/// A record that carries the fencing epoch of the owner that wrote it.
pub(crate) trait OwnerStamped {
    /// The epoch stored in the record (0: written by no owner).
    fn owner_epoch(&self) -> u64;
    /// Records `epoch` as the record's writer.
    fn stamp(&mut self, epoch: u64);
}

macro_rules! owner_stamped {
    ($($record:ty),*) => {$(
        impl OwnerStamped for $record {
            fn owner_epoch(&self) -> u64 {
                self.owner_epoch
            }
            fn stamp(&mut self, epoch: u64) {
                self.owner_epoch = epoch;
            }
        }
    )*};
}

owner_stamped!(JobRecord, AgentPlacement, TaskRecord, LeaderCheckpoint);

/// Who writes a record: the job's owner at its epoch (checked and stamped)
/// or a writer that is not the owner (neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    Owner(u64),
    NotOwner,
}

impl Writer {
    /// Refuses the write when `stored` was written by a later owner.
    pub(crate) fn admit<U: OwnerStamped>(
        self,
        stored: Option<&U>,
        bucket: &str,
        key: &str,
    ) -> Result<(), BusError> {
        match (self, stored) {
            (Writer::Owner(epoch), Some(stored)) if stored.owner_epoch() > epoch => {
                Err(BusError::Fenced {
                    bucket: bucket.to_string(),
                    key: key.to_string(),
                    epoch,
                    stored_epoch: stored.owner_epoch(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Stamps `value` with the owner's epoch (a non-owner keeps what the
    /// value carries: it was derived from the stored record).
    pub(crate) fn stamp<U: OwnerStamped>(self, value: &mut U) {
        if let Writer::Owner(epoch) = self {
            value.stamp(epoch);
        }
    }
}

/// The writes of a job's owner at one fencing epoch ([`Jobs::as_owner`]):
/// each is refused with [`BusError::Fenced`] when the record it would
/// replace was written by an owner with a larger epoch.
#[derive(Debug, Clone)]
pub struct OwnerWrites {
    jobs: Jobs,
    epoch: u64,
}

impl Jobs {
    /// The writes of the job owner holding `epoch` (see [`OwnerWrites`]).
    pub fn as_owner(&self, epoch: u64) -> OwnerWrites {
        OwnerWrites {
            jobs: self.clone(),
            epoch,
        }
    }
}

impl OwnerWrites {
    fn writer(&self) -> Writer {
        Writer::Owner(self.epoch)
    }

    /// The epoch these writes carry.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Stamps the job's record with this epoch, so that no earlier owner's
    /// write lands on it from now on; a new owner calls it before it acts
    /// on the job. [`BusError::Fenced`] when a later owner stamped it
    /// already, [`BusError::NotFound`] when the job has no record.
    pub async fn claim(&self, job_id: &str) -> Result<Versioned<JobRecord>, BusError> {
        self.modify(job_id, |_| {}).await
    }

    /// [`Jobs::modify`] as the owner.
    pub async fn modify(
        &self,
        job_id: &str,
        change: impl FnMut(&mut JobRecord),
    ) -> Result<Versioned<JobRecord>, BusError> {
        self.jobs.modify_record(job_id, self.writer(), change).await
    }

    /// Read-modify-write of one task's record: `change` gets the stored
    /// record (`None` when the task has none) and returns the one to
    /// write, or `None` to leave it; it runs again on a concurrent write.
    /// The record written, if any. Only an owner writes tasks.
    pub async fn modify_task(
        &self,
        job_id: &str,
        task_id: &str,
        change: impl FnMut(Option<&TaskRecord>) -> Option<TaskRecord>,
    ) -> Result<Option<TaskRecord>, BusError> {
        self.jobs
            .modify_task_as(job_id, task_id, self.writer(), change)
            .await
    }

    /// Writes the placement of `agent_id` that `current` gives when called
    /// (the latest one, read again after a concurrent write to the key) at
    /// the key's revision. True when the agent's key was created. Only an
    /// owner places agents.
    pub async fn put_agent(
        &self,
        job_id: &str,
        agent_id: &str,
        current: impl FnMut() -> AgentPlacement,
    ) -> Result<bool, BusError> {
        self.jobs
            .write_agent(job_id, agent_id, self.writer(), current)
            .await
    }

    /// [`Jobs::remove_agent`] as the owner.
    pub async fn remove_agent(&self, job_id: &str, agent_id: &str) -> Result<bool, BusError> {
        let key = agent_key(job_id, agent_id);
        let Some(stored) = self.jobs.agents.get(&key).await? else {
            return Ok(false);
        };
        self.writer()
            .admit(Some(&stored.value), self.jobs.agents.bucket(), &key)?;
        self.jobs.agents.delete(&key, Some(stored.revision)).await?;
        Ok(true)
    }

    /// [`Jobs::put_loop_state`] as the owner: at the stored checkpoint's
    /// revision, so that it is checked like the other writes.
    pub async fn put_loop_state(&self, checkpoint: &LeaderCheckpoint) -> Result<(), BusError> {
        let checkpoint = super::dated(checkpoint);
        let key = loop_key(&checkpoint.job_id);
        write_at_revision(&self.jobs.loops, &key, self.writer(), |_| {
            Some(checkpoint.clone().into_owned())
        })
        .await?;
        Ok(())
    }
}
