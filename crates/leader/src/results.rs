//! Task results as the leader accepts them: one table per running job,
//! filled by the leader's single durable result consumer and read by
//! `collect_result`.
//!
//! Rules (DESIGN.md, "Reliability rules"): a result is accepted once per task
//! id (later copies are duplicates), and only from the task's current attempt
//! (results of other attempts are fenced off: dropped and logged). Lookups
//! are by job id and task id, so the work per result does not grow with the
//! number of jobs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use futures::StreamExt as _;
use mtswarm_bus::{Bus, Jobs, ResultConsumerConfig, v1};
use tokio::sync::Notify;

use crate::journal::Journal;

/// What happened to an offered result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acceptance {
    Accepted,
    /// The task already has an accepted result.
    Duplicate,
    /// The result's attempt is not the task's current one.
    Fenced {
        current_attempt: u32,
    },
    /// No task with this id was assigned in this job.
    UnknownTask,
}

#[derive(Debug, Clone)]
struct TaskEntry {
    agent_id: String,
    attempt: u32,
    result: Option<v1::TaskResult>,
    /// Already handed to the model by a `collect_result`.
    delivered: bool,
}

/// The results of one job.
#[derive(Debug, Default)]
pub struct JobResults {
    tasks: Mutex<HashMap<String, TaskEntry>>,
    /// Assignment order, for stable listings.
    order: Mutex<Vec<String>>,
    changed: Notify,
}

/// A task as `collect_result` reports it.
#[derive(Debug, Clone)]
pub struct TaskView {
    pub task_id: String,
    pub agent_id: String,
    pub attempt: u32,
    pub result: Option<v1::TaskResult>,
    pub delivered: bool,
}

impl JobResults {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TaskEntry>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `task_id` was (re)assigned to `agent_id` as `attempt`;
    /// from now on only that attempt's result is accepted.
    pub fn register(&self, task_id: &str, agent_id: &str, attempt: u32) {
        let mut tasks = self.lock();
        let fresh = !tasks.contains_key(task_id);
        tasks.insert(
            task_id.to_string(),
            TaskEntry {
                agent_id: agent_id.to_string(),
                attempt,
                result: None,
                delivered: false,
            },
        );
        drop(tasks);
        if fresh {
            self.order
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(task_id.to_string());
        }
    }

    /// Offers a result; see [`Acceptance`].
    pub fn offer(&self, result: &v1::TaskResult) -> Acceptance {
        let mut tasks = self.lock();
        let Some(entry) = tasks.get_mut(&result.task_id) else {
            return Acceptance::UnknownTask;
        };
        if result.attempt != entry.attempt {
            return Acceptance::Fenced {
                current_attempt: entry.attempt,
            };
        }
        if entry.result.is_some() {
            return Acceptance::Duplicate;
        }
        entry.result = Some(result.clone());
        drop(tasks);
        self.changed.notify_waiters();
        Acceptance::Accepted
    }

    /// Settles a task locally (e.g. its agent was cancelled) unless it has
    /// a result already.
    pub fn settle(&self, task_id: &str, status: v1::TaskStatus, error: &str) {
        let mut tasks = self.lock();
        if let Some(entry) = tasks.get_mut(task_id)
            && entry.result.is_none()
        {
            entry.result = Some(v1::TaskResult {
                task_id: task_id.to_string(),
                attempt: entry.attempt,
                agent_id: entry.agent_id.clone(),
                status: status as i32,
                error: error.to_string(),
                ..Default::default()
            });
        }
        drop(tasks);
        self.changed.notify_waiters();
    }

    /// Task ids in assignment order, optionally only those of `agents`.
    pub fn task_ids(&self, agents: Option<&[String]>) -> Vec<String> {
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let tasks = self.lock();
        order
            .into_iter()
            .filter(|id| match (agents, tasks.get(id)) {
                (None, Some(_)) => true,
                (Some(agents), Some(entry)) => agents.contains(&entry.agent_id),
                _ => false,
            })
            .collect()
    }

    /// True when `task_id` was assigned in this job.
    pub fn knows(&self, task_id: &str) -> bool {
        self.lock().contains_key(task_id)
    }

    /// Tasks without a result, in assignment order.
    pub fn pending(&self) -> Vec<String> {
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let tasks = self.lock();
        order
            .into_iter()
            .filter(|id| tasks.get(id).is_some_and(|t| t.result.is_none()))
            .collect()
    }

    /// (total, with a result) counts.
    pub fn counts(&self) -> (usize, usize) {
        let tasks = self.lock();
        (
            tasks.len(),
            tasks.values().filter(|t| t.result.is_some()).count(),
        )
    }

    fn views(&self, ids: &[String]) -> Vec<TaskView> {
        let tasks = self.lock();
        ids.iter()
            .filter_map(|id| {
                tasks.get(id).map(|t| TaskView {
                    task_id: id.clone(),
                    agent_id: t.agent_id.clone(),
                    attempt: t.attempt,
                    result: t.result.clone(),
                    delivered: t.delivered,
                })
            })
            .collect()
    }

    fn mark_delivered(&self, ids: &[String]) {
        let mut tasks = self.lock();
        for id in ids {
            if let Some(entry) = tasks.get_mut(id)
                && entry.result.is_some()
            {
                entry.delivered = true;
            }
        }
    }

    /// Waits until every task of `ids` has a result (`all`), or until at
    /// least one has a result not handed out before (any), at most
    /// `timeout`. Returns the views of `ids` and whether the wait timed out;
    /// the finished ones are marked as handed out.
    pub async fn collect(
        &self,
        ids: &[String],
        all: bool,
        timeout: Duration,
    ) -> (Vec<TaskView>, bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let views = self.views(ids);
            let done = if all {
                views.iter().all(|v| v.result.is_some())
            } else {
                views.is_empty() || views.iter().any(|v| v.result.is_some() && !v.delivered)
            };
            if done {
                self.mark_delivered(ids);
                return (views, false);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let views = self.views(ids);
                self.mark_delivered(ids);
                return (views, true);
            }
        }
    }
}

/// Result tables of the jobs this leader runs.
#[derive(Debug, Default)]
pub struct ResultTable {
    jobs: DashMap<String, Arc<JobResults>>,
}

impl ResultTable {
    /// The table of `job_id`, created on first use.
    pub fn job(&self, job_id: &str) -> Arc<JobResults> {
        self.jobs.entry(job_id.to_string()).or_default().clone()
    }

    pub fn get(&self, job_id: &str) -> Option<Arc<JobResults>> {
        self.jobs.get(job_id).map(|e| e.clone())
    }

    /// Forgets a finished job's table.
    pub fn remove(&self, job_id: &str) {
        self.jobs.remove(job_id);
    }
}

/// Consumes `mtswarm.result.>` with the leader's durable consumer until
/// `shutdown` fires: offers each result to its job's table, journals and
/// counts accepted ones, logs fenced and duplicate ones, and acks every
/// message once handled (a result for a job not running here is acked too:
/// the results stream keeps it for a leader that resumes the job).
pub(crate) async fn consume_results(
    bus: Bus,
    consumer_name: String,
    table: Arc<ResultTable>,
    jobs: Jobs,
    journal: Journal,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let consumer = match bus
            .result_consumer(ResultConsumerConfig::new(consumer_name.clone()))
            .await
        {
            Ok(consumer) => consumer,
            Err(error) => {
                tracing::error!(%error, "result consumer unavailable; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let mut messages = match consumer.messages().await {
            Ok(messages) => messages,
            Err(error) => {
                tracing::error!(%error, "result consumer stream failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return,
                }
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        loop {
            let item = tokio::select! {
                item = messages.next() => item,
                _ = shutdown.changed() => return,
            };
            let Some(item) = item else { break };
            let delivery = match item {
                Ok(delivery) => delivery,
                Err(error) => {
                    tracing::warn!(%error, "result delivery failed");
                    continue;
                }
            };
            let result = delivery.message().clone();
            match table.get(&result.job_id) {
                None => tracing::info!(
                    job_id = %result.job_id,
                    task_id = %result.task_id,
                    "result for a job not running on this leader; left in the results stream"
                ),
                Some(job) => match job.offer(&result) {
                    Acceptance::Accepted => {
                        accepted(&jobs, &journal, &result).await;
                    }
                    Acceptance::Duplicate => tracing::info!(
                        job_id = %result.job_id,
                        task_id = %result.task_id,
                        attempt = result.attempt,
                        "duplicate result dropped (task already has a result)"
                    ),
                    Acceptance::Fenced { current_attempt } => tracing::warn!(
                        job_id = %result.job_id,
                        task_id = %result.task_id,
                        attempt = result.attempt,
                        current_attempt,
                        "result of a stale attempt dropped"
                    ),
                    Acceptance::UnknownTask => tracing::warn!(
                        job_id = %result.job_id,
                        task_id = %result.task_id,
                        "result for a task this job never assigned dropped"
                    ),
                },
            }
            if let Err(error) = delivery.ack().await {
                tracing::warn!(%error, task_id = %result.task_id, "result ack failed; it will be redelivered and deduplicated");
            }
        }
    }
}

async fn accepted(jobs: &Jobs, journal: &Journal, result: &v1::TaskResult) {
    let usage = result.usage.unwrap_or_default();
    if let Err(error) = jobs
        .modify(&result.job_id, |job| {
            job.tasks_done = job.tasks_done.saturating_add(1);
            let total = job.usage.get_or_insert_with(Default::default);
            total.steps = total.steps.saturating_add(usage.steps);
            total.prompt_tokens = total.prompt_tokens.saturating_add(usage.prompt_tokens);
            total.completion_tokens = total
                .completion_tokens
                .saturating_add(usage.completion_tokens);
            total.device_seconds += usage.device_seconds;
        })
        .await
    {
        tracing::warn!(%error, job_id = %result.job_id, "job record not updated with a result");
    }
    if let Err(error) = journal
        .append(
            &result.job_id,
            v1::job_event::Event::TaskResult(result.clone()),
        )
        .await
    {
        tracing::warn!(%error, job_id = %result.job_id, "task result not journaled");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(task: &str, attempt: u32) -> v1::TaskResult {
        v1::TaskResult {
            task_id: task.into(),
            attempt,
            job_id: "j".into(),
            status: v1::TaskStatus::Ok as i32,
            ..Default::default()
        }
    }

    #[test]
    fn results_are_accepted_once_and_only_from_the_current_attempt() {
        let job = JobResults::default();
        assert_eq!(job.offer(&result("t1", 1)), Acceptance::UnknownTask);
        job.register("t1", "a1", 1);
        job.register("t1", "a2", 2);
        assert_eq!(
            job.offer(&result("t1", 1)),
            Acceptance::Fenced { current_attempt: 2 }
        );
        assert_eq!(job.offer(&result("t1", 2)), Acceptance::Accepted);
        assert_eq!(job.offer(&result("t1", 2)), Acceptance::Duplicate);
        assert_eq!(job.counts(), (1, 1));
        assert_eq!(
            job.task_ids(Some(&["a2".to_string()])),
            vec!["t1".to_string()]
        );
        assert!(job.task_ids(Some(&["a1".to_string()])).is_empty());
    }

    #[tokio::test]
    async fn collect_any_wakes_on_the_first_new_result_and_all_times_out() {
        let job = Arc::new(JobResults::default());
        job.register("t1", "a1", 1);
        job.register("t2", "a2", 1);
        let ids = vec!["t1".to_string(), "t2".to_string()];
        let waiter = {
            let job = job.clone();
            let ids = ids.clone();
            tokio::spawn(async move { job.collect(&ids, false, Duration::from_secs(20)).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(job.offer(&result("t2", 1)), Acceptance::Accepted);
        let (views, timed_out) = waiter.await.expect("join");
        assert!(!timed_out);
        assert!(
            views
                .iter()
                .any(|v| v.task_id == "t2" && v.result.is_some())
        );
        let (views, timed_out) = job.collect(&ids, true, Duration::from_millis(50)).await;
        assert!(timed_out);
        assert!(
            views
                .iter()
                .any(|v| v.task_id == "t1" && v.result.is_none())
        );
    }
}
