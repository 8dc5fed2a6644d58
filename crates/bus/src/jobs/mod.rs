//! The leader's job records (bucket `mtswarm_jobs`), kept in parts so that
//! no value grows with the job: a job's record under its id holds what is
//! one per job (spec, state, times, counts, usage, outcome); each agent,
//! each task and the leader loop's checkpoint have keys of their own next
//! to it (see [`agent_key`], [`task_key`], [`loop_key`]). One value per key
//! keeps every write small and every key's writers few, so a job of a
//! thousand agents is stored like a job of one, within the server's
//! message size limit, and concurrent task updates do not contend on one
//! record. Listings of records read only the one-token keys.
//!
//! Records written before the split carry the parts inside them
//! (`JobRecord.agents`, `tasks`, `leader_state_json`); [`Jobs::assembled`]
//! reads both kinds and [`Jobs::split_embedded`] moves the parts of an old
//! record to their keys.
//!
//! The job's owner writes through [`OwnerWrites`] ([`Jobs::as_owner`]):
//! the same writes, refused when a later owner of the job wrote the record
//! (see `owner`).

mod owner;

use std::time::SystemTime;

use mtswarm_proto::v1::{AgentPlacement, JobRecord, LeaderCheckpoint, TaskRecord};

use crate::codec::BusMessage;
use crate::connection::Bus;
use crate::error::BusError;
use crate::kv::{KvWatch, TypedKv, Versioned};
use crate::stores::MAX_CAS_RETRIES;
use crate::subjects;

pub use owner::OwnerWrites;
use owner::{OwnerStamped, Writer};

/// Read-modify-write attempts of a job record before an update gives up.
/// Higher than other buckets': every accepted result of a job counts in
/// its record, and a conflict means another writer got through, so many
/// results arriving at once all get through in as many rounds.
const MAX_RECORD_CAS_RETRIES: usize = 256;

/// Key of the agent `agent_id` of `job_id`: `<job_id>.agent.<agent_id>`.
pub fn agent_key(job_id: &str, agent_id: &str) -> String {
    format!("{job_id}.agent.{agent_id}")
}

/// Key of the task `task_id` of `job_id`: `<job_id>.task.<task_id>`.
pub fn task_key(job_id: &str, task_id: &str) -> String {
    format!("{job_id}.task.{task_id}")
}

/// Key of the leader loop's checkpoint of `job_id`: `<job_id>.loop`.
pub fn loop_key(job_id: &str) -> String {
    format!("{job_id}.loop")
}

/// Clears from `job` the parts a record written before the split embeds
/// (agents, agent ids, tasks, loop state), keeping their number in
/// `agents_total`: the record as it is stored now.
pub fn strip_parts(job: &mut JobRecord) {
    let agents = job.agents.len().max(job.agent_ids.len()) as u32;
    job.agents_total = job.agents_total.max(agents);
    job.agents.clear();
    job.agent_ids.clear();
    job.tasks.clear();
    job.leader_state_json.clear();
}

/// The values under `<job_id>.<kind>.*`, by key (the server picks the keys).
async fn parts_of<U: BusMessage>(
    kv: &TypedKv<U>,
    job_id: &str,
    kind: &str,
) -> Result<Vec<U>, BusError> {
    subjects::validate_id("job id", job_id)?;
    Ok(kv
        .list_matching(&format!("{job_id}.{kind}.*"))
        .await?
        .into_iter()
        .map(|(_, part)| part.value)
        .collect())
}

/// Read-modify-write of `key` at its revision: `next` gets the stored
/// value (`None` when absent) and returns the one to write, or `None` to
/// leave it; it runs again after a concurrent write. `writer` is checked
/// against the stored value and stamped into the written one (see
/// [`owner`]). The value written and whether the key was created by it.
async fn write_at_revision<U: BusMessage + OwnerStamped>(
    kv: &TypedKv<U>,
    key: &str,
    writer: Writer,
    mut next: impl FnMut(Option<&U>) -> Option<U>,
) -> Result<Option<(U, bool)>, BusError> {
    for _ in 0..MAX_CAS_RETRIES {
        let stored = kv.get(key).await?;
        writer.admit(stored.as_ref().map(|s| &s.value), kv.bucket(), key)?;
        let Some(mut value) = next(stored.as_ref().map(|s| &s.value)) else {
            return Ok(None);
        };
        writer.stamp(&mut value);
        let written = match &stored {
            Some(stored) => kv.update(key, &value, stored.revision).await,
            None => kv.create(key, &value).await,
        };
        match written {
            Ok(_) => return Ok(Some((value, stored.is_none()))),
            Err(BusError::CasConflict { .. } | BusError::AlreadyExists { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
    Err(BusError::CasConflict {
        bucket: kv.bucket().to_string(),
        key: key.to_string(),
        expected_revision: 0,
    })
}

/// `checkpoint` with `updated_at` set to now when empty (copied only then:
/// a checkpoint carries the loop's whole state).
fn dated(checkpoint: &LeaderCheckpoint) -> std::borrow::Cow<'_, LeaderCheckpoint> {
    if checkpoint.updated_at.is_some() {
        return std::borrow::Cow::Borrowed(checkpoint);
    }
    let mut checkpoint = checkpoint.clone();
    checkpoint.updated_at = Some(prost_types::Timestamp::from(SystemTime::now()));
    std::borrow::Cow::Owned(checkpoint)
}

/// The task id of a task record (empty without an assignment).
fn task_id_of(task: &TaskRecord) -> &str {
    task.assignment
        .as_ref()
        .map(|a| a.task_id.as_str())
        .unwrap_or_default()
}

/// Job records and their parts (bucket `mtswarm_jobs`).
#[derive(Debug, Clone)]
pub struct Jobs {
    kv: TypedKv<JobRecord>,
    agents: TypedKv<AgentPlacement>,
    tasks: TypedKv<TaskRecord>,
    loops: TypedKv<LeaderCheckpoint>,
}

impl Jobs {
    /// Opens the bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus) -> Result<Self, BusError> {
        let kv = TypedKv::open(bus, subjects::JOBS_BUCKET).await?;
        Ok(Self {
            agents: kv.nested_view(),
            tasks: kv.nested_view(),
            loops: kv.nested_view(),
            kv,
        })
    }

    /// The raw typed bucket of the records (one-token keys), for reads and
    /// writes these methods do not cover.
    pub fn kv(&self) -> &TypedKv<JobRecord> {
        &self.kv
    }

    /// Stores a new job; [`BusError::AlreadyExists`] when the id is taken.
    pub async fn create(&self, job: &JobRecord) -> Result<Versioned<JobRecord>, BusError> {
        let revision = self.kv.create(&job.job_id, job).await?;
        Ok(Versioned {
            value: job.clone(),
            revision,
        })
    }

    /// The job's stored record and its revision (without the parts kept
    /// under their own keys); `None` when no such job exists.
    pub async fn get(&self, job_id: &str) -> Result<Option<Versioned<JobRecord>>, BusError> {
        self.kv.get(job_id).await
    }

    /// Writes `job` if its stored revision is still `expected_revision`.
    pub async fn update(&self, job: &JobRecord, expected_revision: u64) -> Result<u64, BusError> {
        self.kv.update(&job.job_id, job, expected_revision).await
    }

    /// Applies `change` to the latest record and writes it (with `updated_at`
    /// set to now), re-reading and re-applying on concurrent updates.
    /// [`BusError::NotFound`] when absent. For a writer that is not the
    /// job's owner; the owner writes with [`OwnerWrites::modify`].
    pub async fn modify(
        &self,
        job_id: &str,
        change: impl FnMut(&mut JobRecord),
    ) -> Result<Versioned<JobRecord>, BusError> {
        self.modify_record(job_id, Writer::NotOwner, change).await
    }

    async fn modify_record(
        &self,
        job_id: &str,
        writer: Writer,
        mut change: impl FnMut(&mut JobRecord),
    ) -> Result<Versioned<JobRecord>, BusError> {
        for _ in 0..MAX_RECORD_CAS_RETRIES {
            let Some(current) = self.kv.get(job_id).await? else {
                return Err(BusError::NotFound {
                    bucket: self.kv.bucket().to_string(),
                    key: job_id.to_string(),
                });
            };
            writer.admit(Some(&current.value), self.kv.bucket(), job_id)?;
            let mut job = current.value;
            change(&mut job);
            writer.stamp(&mut job);
            job.job_id = job_id.to_string();
            job.updated_at = Some(prost_types::Timestamp::from(SystemTime::now()));
            match self.kv.update(job_id, &job, current.revision).await {
                Ok(revision) => {
                    return Ok(Versioned {
                        value: job,
                        revision,
                    });
                }
                Err(BusError::CasConflict { .. }) => continue,
                Err(other) => return Err(other),
            }
        }
        Err(BusError::CasConflict {
            bucket: self.kv.bucket().to_string(),
            key: job_id.to_string(),
            expected_revision: 0,
        })
    }

    /// All stored job records (one read per job; the agent, task and loop
    /// keys are not read).
    pub async fn list(&self) -> Result<Vec<Versioned<JobRecord>>, BusError> {
        Ok(self
            .kv
            .list()
            .await?
            .into_iter()
            .map(|(_, job)| job)
            .collect())
    }

    /// Job record changes from now on (not their parts).
    pub async fn watch(&self) -> Result<KvWatch<JobRecord>, BusError> {
        self.kv.watch().await
    }

    /// The job's record with its parts filled in (`agents`, `agent_ids`,
    /// `tasks`, `leader_state_json`), as it was stored whole before the
    /// split: what `GetJob` answers. Parts under their own keys win over
    /// ones a record of an earlier leader still embeds. `None` when no such
    /// job exists.
    pub async fn assembled(&self, job_id: &str) -> Result<Option<JobRecord>, BusError> {
        let Some(record) = self.kv.get(job_id).await? else {
            return Ok(None);
        };
        let mut record = record.value;
        let mut agents = std::mem::take(&mut record.agents);
        for agent in self.agents(job_id).await? {
            match agents.iter_mut().find(|a| a.agent_id == agent.agent_id) {
                Some(embedded) => *embedded = agent,
                None => agents.push(agent),
            }
        }
        let mut tasks = std::mem::take(&mut record.tasks);
        for task in self.tasks(job_id).await? {
            match tasks
                .iter_mut()
                .find(|t| task_id_of(t) == task_id_of(&task))
            {
                Some(embedded) => *embedded = task,
                None => tasks.push(task),
            }
        }
        if let Some(checkpoint) = self.loop_state(job_id).await? {
            record.leader_state_json = checkpoint.value.state_json;
        }
        record.agent_ids = agents.iter().map(|a| a.agent_id.clone()).collect();
        record.agents_total = record.agents_total.max(agents.len() as u32);
        record.agents = agents;
        record.tasks = tasks;
        Ok(Some(record))
    }

    /// The job's agents under their keys, by agent id.
    pub async fn agents(&self, job_id: &str) -> Result<Vec<AgentPlacement>, BusError> {
        parts_of(&self.agents, job_id, "agent").await
    }

    async fn write_agent(
        &self,
        job_id: &str,
        agent_id: &str,
        writer: Writer,
        mut current: impl FnMut() -> AgentPlacement,
    ) -> Result<bool, BusError> {
        let key = agent_key(job_id, agent_id);
        let written = write_at_revision(&self.agents, &key, writer, |stored| {
            let mut placement = current();
            writer.stamp(&mut placement);
            (stored != Some(&placement)).then_some(placement)
        })
        .await?;
        Ok(written.is_some_and(|(_, created)| created))
    }

    /// Removes the agent's key; true when it had a value.
    pub async fn remove_agent(&self, job_id: &str, agent_id: &str) -> Result<bool, BusError> {
        let key = agent_key(job_id, agent_id);
        let Some(stored) = self.agents.get(&key).await? else {
            return Ok(false);
        };
        self.agents.delete(&key, Some(stored.revision)).await?;
        Ok(true)
    }

    /// The job's tasks under their keys, by task id.
    pub async fn tasks(&self, job_id: &str) -> Result<Vec<TaskRecord>, BusError> {
        parts_of(&self.tasks, job_id, "task").await
    }

    /// [`OwnerWrites::modify_task`] as `writer`.
    async fn modify_task_as(
        &self,
        job_id: &str,
        task_id: &str,
        writer: Writer,
        change: impl FnMut(Option<&TaskRecord>) -> Option<TaskRecord>,
    ) -> Result<Option<TaskRecord>, BusError> {
        let key = task_key(job_id, task_id);
        let written = write_at_revision(&self.tasks, &key, writer, change).await?;
        Ok(written.map(|(task, _)| task))
    }

    /// The leader loop's latest checkpoint of the job, if one was stored
    /// under its key.
    pub async fn loop_state(
        &self,
        job_id: &str,
    ) -> Result<Option<Versioned<LeaderCheckpoint>>, BusError> {
        self.loops.get(&loop_key(job_id)).await
    }

    /// Replaces the loop's checkpoint of `checkpoint.job_id` (one writer:
    /// the job's runner, which writes through [`OwnerWrites::put_loop_state`]
    /// when it owns the job); `updated_at` is set to now when empty.
    pub async fn put_loop_state(&self, checkpoint: &LeaderCheckpoint) -> Result<u64, BusError> {
        let checkpoint = dated(checkpoint);
        self.loops
            .put(&loop_key(&checkpoint.job_id), &checkpoint)
            .await
    }

    /// Loop checkpoint changes of every job from now on.
    pub async fn watch_loop_states(&self) -> Result<KvWatch<LeaderCheckpoint>, BusError> {
        self.loops.watch_matching("*.loop").await
    }

    /// Moves the parts a record written before the split embeds (agents,
    /// tasks, loop state) to their own keys, then clears them from the
    /// record (keeping their count in `agents_total`). A key that exists
    /// already is kept: it was written later. The record as stored after
    /// the move; `None` when no such job exists.
    pub async fn split_embedded(&self, job_id: &str) -> Result<Option<JobRecord>, BusError> {
        let Some(record) = self.kv.get(job_id).await? else {
            return Ok(None);
        };
        let record = record.value;
        let embeds = !record.agents.is_empty()
            || !record.tasks.is_empty()
            || !record.leader_state_json.is_empty()
            || !record.agent_ids.is_empty();
        if !embeds {
            return Ok(Some(record));
        }
        let keep_later = |result: Result<u64, BusError>| match result {
            Ok(_) | Err(BusError::AlreadyExists { .. }) => Ok(()),
            Err(other) => Err(other),
        };
        for agent in &record.agents {
            keep_later(
                self.agents
                    .create(&agent_key(job_id, &agent.agent_id), agent)
                    .await,
            )?;
        }
        for task in record.tasks.iter().filter(|t| t.assignment.is_some()) {
            keep_later(
                self.tasks
                    .create(&task_key(job_id, task_id_of(task)), task)
                    .await,
            )?;
        }
        if !record.leader_state_json.is_empty() {
            let checkpoint = LeaderCheckpoint {
                job_id: job_id.to_string(),
                state_json: record.leader_state_json.clone(),
                updated_at: record.updated_at,
                owner_epoch: record.owner_epoch,
            };
            keep_later(self.loops.create(&loop_key(job_id), &checkpoint).await)?;
        }
        let split = self.modify(job_id, strip_parts).await?;
        Ok(Some(split.value))
    }
}
