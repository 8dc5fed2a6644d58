//! The job record writes of a [`JobContext`]: placements, task records,
//! settled tasks and confirmed publishes. Each write keeps memory and
//! `JobRecord` in step; a failed write that a resume or the sweep repairs is
//! logged, not returned.

use std::time::SystemTime;

use mtswarm_bus::{BusError, v1};

use super::{AgentEntry, JobContext};

impl JobContext {
    /// Writes (inserts or replaces) the agent's placement into the job record.
    pub(crate) async fn store_placement(&self, entry: &AgentEntry) -> Result<(), BusError> {
        let placement = entry.to_placement();
        self.jobs
            .modify(&self.job_id, |record| {
                match record
                    .agents
                    .iter_mut()
                    .find(|a| a.agent_id == placement.agent_id)
                {
                    Some(existing) => *existing = placement.clone(),
                    None => record.agents.push(placement.clone()),
                }
                if !record.agent_ids.contains(&placement.agent_id) {
                    record.agent_ids.push(placement.agent_id.clone());
                }
            })
            .await
            .map(|_| ())
    }

    /// Removes a placement whose spawn failed everywhere.
    pub(crate) async fn forget_placement(&self, agent_id: &str) {
        self.agents().remove(agent_id);
        if let Err(error) = self
            .jobs
            .modify(&self.job_id, |record| {
                record.agents.retain(|a| a.agent_id != agent_id);
                record.agent_ids.retain(|a| a != agent_id);
            })
            .await
        {
            tracing::warn!(%error, job_id = %self.job_id, agent_id, "failed placement not removed from the job record");
        }
    }

    /// Writes (inserts or replaces) task records into the job record;
    /// `new_tasks` of them count towards `tasks_total`.
    pub(crate) async fn store_tasks(
        &self,
        records: &[v1::TaskRecord],
        new_tasks: u32,
    ) -> Result<(), BusError> {
        self.jobs
            .modify(&self.job_id, |record| {
                for task in records {
                    let id = task
                        .assignment
                        .as_ref()
                        .map(|a| a.task_id.as_str())
                        .unwrap_or_default();
                    match record
                        .tasks
                        .iter_mut()
                        .find(|t| t.assignment.as_ref().is_some_and(|a| a.task_id == id))
                    {
                        // The result consumer may have marked it done meanwhile.
                        Some(existing) if existing.done => {}
                        Some(existing) => *existing = task.clone(),
                        None => record.tasks.push(task.clone()),
                    }
                }
                record.tasks_total = record.tasks_total.saturating_add(new_tasks);
            })
            .await
            .map(|_| ())
    }

    /// Marks tasks done with `status` in the job record (cancelled agents).
    pub(crate) async fn record_settled(&self, task_ids: &[String], status: v1::TaskStatus) {
        if task_ids.is_empty() {
            return;
        }
        let now = prost_types::Timestamp::from(SystemTime::now());
        for task_id in task_ids {
            if let Some(task) = self.tasks().get_mut(task_id) {
                task.done = true;
                task.status = status as i32;
            }
        }
        if let Err(error) = self
            .jobs
            .modify(&self.job_id, |record| {
                for task in record.tasks.iter_mut().filter(|t| !t.done) {
                    if task
                        .assignment
                        .as_ref()
                        .is_some_and(|a| task_ids.contains(&a.task_id))
                    {
                        task.done = true;
                        task.status = status as i32;
                        task.finished_at = Some(now);
                    }
                }
            })
            .await
        {
            tracing::warn!(%error, job_id = %self.job_id, "settled tasks not recorded");
        }
    }

    /// Publishes an assignment whose record is already stored, then records
    /// the publish (`assigned_at`). `Err` = not published.
    pub(crate) async fn publish_recorded(
        &self,
        assignment: &v1::TaskAssignment,
    ) -> Result<(), BusError> {
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
            .jobs
            .modify(&self.job_id, |record| {
                if let Some(stored) = record
                    .tasks
                    .iter_mut()
                    .filter_map(|t| t.assignment.as_mut())
                    .find(|a| a.task_id == task_id && a.attempt == attempt)
                {
                    stored.assigned_at = Some(now);
                }
            })
            .await
        {
            // Harmless: a resume publishes it again and the stream drops
            // the copy as a duplicate.
            tracing::warn!(%error, job_id = %self.job_id, task_id, "task publish not recorded");
        }
        Ok(())
    }
}
