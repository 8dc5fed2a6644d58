//! The job record writes of a [`JobContext`]: placements, task records,
//! settled tasks and confirmed publishes. Each agent and each task has a
//! key of its own next to the job's record ([`mtswarm_bus::jobs`]), written
//! at its revision; the record keeps only the counts. Each write keeps
//! memory and the store in step; a failed write that a resume or the sweep
//! repairs is logged, not returned.
//!
//! Every write and publish checks the job's ownership fence first
//! ([`mtswarm_bus::Fence`]): a leader that lost the job (its lease lapsed
//! while it was paused, or another leader took it) is refused with
//! [`JobWriteError::Fenced`] and writes nothing. The writes go through
//! [`mtswarm_bus::OwnerWrites`] at the fence's epoch, so the store refuses
//! them too once a later owner wrote the record, whatever this leader's
//! fence says; such a refusal marks the ownership lost.

use std::time::SystemTime;

use mtswarm_bus::{BusError, OwnerWrites, v1};

use super::{AgentEntry, JobContext};
use crate::error::JobWriteError;

/// Changes of a job record's count not written yet, and the one writer
/// that writes them (see [`JobContext::count_agents`]).
#[derive(Debug, Default)]
pub(crate) struct PendingCount {
    uncounted: std::sync::Mutex<i64>,
    writer: tokio::sync::Mutex<()>,
}

fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl JobContext {
    /// The job's record writes as its owner at the fence's epoch.
    pub(crate) fn owner_writes(&self) -> OwnerWrites {
        self.jobs.as_owner(self.fence.epoch())
    }

    /// A write's bus error as the job's: a refusal by the store (a later
    /// owner wrote the record) marks the ownership lost and is
    /// [`JobWriteError::Fenced`].
    pub(crate) fn write_error(&self, error: BusError) -> JobWriteError {
        match self.fence.refused(error) {
            Ok(lost) => JobWriteError::Fenced(lost),
            Err(other) => JobWriteError::Bus(other),
        }
    }

    /// Writes (inserts or replaces) the agent's placement: the one in
    /// memory at the time of the write (every caller updated memory
    /// first), so of two racing writes the later state lands last.
    pub(crate) async fn store_placement(&self, entry: &AgentEntry) -> Result<(), JobWriteError> {
        self.fence.check("an agent placement")?;
        let agent_id = entry.agent_id.as_str();
        let created = self
            .owner_writes()
            .put_agent(&self.job_id, agent_id, || {
                self.agent(agent_id)
                    .unwrap_or_else(|| entry.clone())
                    .to_placement()
            })
            .await
            .map_err(|e| self.write_error(e))?;
        if created {
            self.count_agents(1).await;
        }
        Ok(())
    }

    /// Removes a placement whose spawn failed everywhere.
    pub(crate) async fn forget_placement(&self, agent_id: &str) {
        self.agents().remove(agent_id);
        if let Err(error) = self.fence.check("removing an agent") {
            tracing::warn!(%error, job_id = %self.job_id, agent_id, "failed placement not removed");
            return;
        }
        match self
            .owner_writes()
            .remove_agent(&self.job_id, agent_id)
            .await
        {
            Ok(true) => self.count_agents(-1).await,
            Ok(false) => {}
            Err(error) => {
                let error = self.write_error(error);
                tracing::warn!(%error, job_id = %self.job_id, agent_id, "failed placement not removed from the job's agents");
            }
        }
    }

    /// `JobRecord.agents_total` after an agent's key came (`+1`) or went
    /// (`-1`); returns once a write that includes the change has been made
    /// (by this call, or by the one that held the writer before it and took
    /// the change along: a thousand concurrent spawns write the record a
    /// few times, not a thousand compare-and-set rounds against each
    /// other). A failed write leaves the count off (the agent keys say who
    /// there is).
    async fn count_agents(&self, change: i64) {
        let pending = &self.agent_count;
        *locked(&pending.uncounted) += change;
        let _writer = pending.writer.lock().await;
        let change = std::mem::take(&mut *locked(&pending.uncounted));
        if change == 0 {
            return;
        }
        if let Err(error) = self.fence.check("the agent count") {
            tracing::warn!(%error, job_id = %self.job_id, "agent count of the job record not updated");
            return;
        }
        if let Err(error) = self
            .owner_writes()
            .modify(&self.job_id, |record| {
                let total = i64::from(record.agents_total).saturating_add(change);
                record.agents_total = u32::try_from(total.max(0)).unwrap_or(u32::MAX);
            })
            .await
        {
            let error = self.write_error(error);
            tracing::warn!(%error, job_id = %self.job_id, "agent count of the job record not updated");
        }
    }

    /// Writes (inserts or replaces) task records; `new_tasks` of them count
    /// towards `tasks_total`. A task the result consumer marked done
    /// meanwhile stays done. `Err` = a task is not recorded; once they all
    /// are, a count not written is only logged.
    pub(crate) async fn store_tasks(
        &self,
        records: &[v1::TaskRecord],
        new_tasks: u32,
    ) -> Result<(), JobWriteError> {
        self.fence.check("a task record")?;
        for task in records {
            let Some(assignment) = &task.assignment else {
                continue;
            };
            self.owner_writes()
                .modify_task(&self.job_id, &assignment.task_id, |stored| match stored {
                    Some(existing) if existing.done => None,
                    _ => Some(task.clone()),
                })
                .await
                .map_err(|e| self.write_error(e))?;
        }
        if new_tasks > 0
            && let Err(error) = self
                .owner_writes()
                .modify(&self.job_id, |record| {
                    record.tasks_total = record.tasks_total.saturating_add(new_tasks);
                })
                .await
        {
            let error = self.write_error(error);
            tracing::warn!(%error, job_id = %self.job_id, new_tasks, "task count of the job record not updated");
        }
        Ok(())
    }

    /// Marks tasks done with `status` (cancelled agents).
    pub(crate) async fn record_settled(&self, task_ids: &[String], status: v1::TaskStatus) {
        let now = prost_types::Timestamp::from(SystemTime::now());
        if let Err(error) = self.fence.check("settling tasks") {
            tracing::warn!(%error, job_id = %self.job_id, "settled tasks not recorded");
            return;
        }
        for task_id in task_ids {
            if let Some(task) = self.tasks().get_mut(task_id) {
                task.done = true;
                task.status = status as i32;
            }
            if let Err(error) = self
                .owner_writes()
                .modify_task(&self.job_id, task_id, |stored| {
                    let mut task = stored.filter(|t| !t.done)?.clone();
                    task.done = true;
                    task.status = status as i32;
                    task.finished_at = Some(now);
                    Some(task)
                })
                .await
            {
                let error = self.write_error(error);
                tracing::warn!(%error, job_id = %self.job_id, task_id, "settled task not recorded");
            }
        }
    }

    /// Publishes an assignment whose record is already stored, then records
    /// the publish (`assigned_at`). `Err` = not published.
    pub(crate) async fn publish_recorded(
        &self,
        assignment: &v1::TaskAssignment,
    ) -> Result<(), JobWriteError> {
        self.fence.check("a task publication")?;
        let mut task = assignment.clone();
        let now = prost_types::Timestamp::from(SystemTime::now());
        task.assigned_at = Some(now);
        // Runs inside the caller's span: the bus injects its context into
        // the task headers, so the worker's session continues the trace.
        self.bus.publish_task(&task).await?;
        let (task_id, attempt) = (task.task_id.clone(), task.attempt);
        if let Some(record) = self.tasks().get_mut(&task_id)
            && let Some(stored) = record.assignment.as_mut()
            && stored.attempt == attempt
        {
            stored.assigned_at = Some(now);
        }
        if let Err(error) = self
            .owner_writes()
            .modify_task(&self.job_id, &task_id, |stored| {
                let mut record = stored?.clone();
                let stored = record.assignment.as_mut()?;
                if stored.attempt != attempt {
                    return None;
                }
                stored.assigned_at = Some(now);
                Some(record)
            })
            .await
        {
            let error = self.write_error(error);
            // Harmless: a resume publishes it again and the stream drops
            // the copy as a duplicate.
            tracing::warn!(%error, job_id = %self.job_id, task_id, "task publish not recorded");
        }
        Ok(())
    }
}
