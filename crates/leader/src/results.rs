//! Task results as the leader accepts them: one table per running job,
//! filled by the leader's single durable result consumer (and, for a job
//! resumed after a leader restart, by a replay of the job's results subject)
//! and read by `collect_result`.
//!
//! Rules (the reliability contract): a task's outcome is the first result of
//! its current attempt with `fenced == false`; later copies are duplicates,
//! results of other attempts are stale (dropped, WARN `result of a stale
//! attempt dropped`), and a fenced result of the current attempt is never the
//! outcome but makes the reassigner move the task at once. Every kind is
//! counted ([`LeaderCounters`]). Lookups are by job id and task id, so the
//! work per result does not grow with the number of jobs.
//!
//! Results of jobs this leader does not run (yet) are acknowledged and left
//! in the results stream: a job that is resumed (leader restart, or a queued
//! job started later) registers its table first and then replays its results
//! subject from the start, so nothing published meanwhile is lost, and the
//! table's duplicate check makes the live consumer and the replay accept
//! each task's result once.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use mtswarm_bus::v1;
use tokio::sync::Notify;

/// What happened to an offered result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acceptance {
    /// The current attempt's first result: the task's outcome, visible to
    /// `collect_result` once the caller recorded and journaled it and
    /// called [`JobResults::publish_accepted`].
    Accepted,
    /// Accepted into the table of a resumed job whose record already
    /// counted the task as done (the replay after a restart).
    Restored,
    /// The task already has an accepted result.
    Duplicate,
    /// The result's attempt is not the task's current one.
    Stale {
        /// The attempt whose result the table waits for.
        current_attempt: u32,
    },
    /// A fenced result (`fenced == true`) of the current attempt: the worker
    /// lost the slice; the task must be reassigned.
    FencedCurrent,
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
    /// The job record says this attempt's result was accepted before (set
    /// for tasks of a resumed job).
    recorded_done: bool,
    /// Accepted, but not visible to `collect_result` until it is recorded
    /// and journaled ([`JobResults::publish_accepted`]), so a job never
    /// ends before its last result is in its record and journal.
    accepting: Option<v1::TaskResult>,
}

/// ` (first error: ...)` with the first error of `tasks`' results, cut to
/// 300 characters; empty when none has one.
pub(crate) fn first_error_note(tasks: &[TaskView]) -> String {
    tasks
        .iter()
        .filter_map(|t| t.result.as_ref())
        .map(|r| r.error.trim())
        .find(|e| !e.is_empty())
        .map(|e| {
            format!(
                " (first error: {})",
                e.chars().take(300).collect::<String>()
            )
        })
        .unwrap_or_default()
}

/// The results of one job.
#[derive(Debug, Default)]
pub struct JobResults {
    tasks: Mutex<HashMap<String, TaskEntry>>,
    /// Assignment order, for stable listings, and each agent's tasks in it.
    listing: Mutex<Listing>,
    changed: Notify,
}

/// Task ids in assignment order, indexed by agent: cancelling each of a
/// thousand agents asks for its own tasks, and a scan of every task per
/// agent made the job's end quadratic in its size.
#[derive(Debug, Default)]
struct Listing {
    order: Vec<String>,
    /// A task's index in `order`.
    position: HashMap<String, usize>,
    /// The positions of each agent's tasks.
    by_agent: HashMap<String, BTreeSet<usize>>,
}

impl Listing {
    /// Lists `task_id` under `agent_id`: appended when new, moved from
    /// `previous_agent` when it was another's.
    fn place(&mut self, task_id: &str, agent_id: &str, previous_agent: Option<&str>) {
        let position = match self.position.get(task_id) {
            Some(&position) => position,
            None => {
                let position = self.order.len();
                self.order.push(task_id.to_string());
                self.position.insert(task_id.to_string(), position);
                position
            }
        };
        if let Some(previous) = previous_agent
            && previous != agent_id
            && let Some(positions) = self.by_agent.get_mut(previous)
        {
            positions.remove(&position);
        }
        self.by_agent
            .entry(agent_id.to_string())
            .or_default()
            .insert(position);
    }

    /// The task ids of `agents`, in assignment order.
    fn of_agents(&self, agents: &[String]) -> Vec<String> {
        let positions: BTreeSet<usize> = agents
            .iter()
            .filter_map(|agent| self.by_agent.get(agent))
            .flatten()
            .copied()
            .collect();
        positions
            .into_iter()
            .filter_map(|position| self.order.get(position).cloned())
            .collect()
    }
}

/// A task as `collect_result` reports it.
#[derive(Debug, Clone)]
pub struct TaskView {
    /// Task id as `assign_task` returned it.
    pub task_id: String,
    /// The agent the task is assigned to.
    pub agent_id: String,
    /// The current attempt (1 = first; each reassignment adds one).
    pub attempt: u32,
    /// The accepted result, or the local settlement of a task whose agent
    /// was cancelled; `None` while the task is pending.
    pub result: Option<v1::TaskResult>,
    /// An earlier `collect_result` already handed this result to the model.
    pub delivered: bool,
}

impl JobResults {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TaskEntry>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn listing(&self) -> std::sync::MutexGuard<'_, Listing> {
        self.listing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn order(&self) -> Vec<String> {
        self.listing().order.clone()
    }

    /// Records that `task_id` was (re)assigned to `agent_id` as `attempt`;
    /// from now on only that attempt's result is accepted.
    pub fn register(&self, task_id: &str, agent_id: &str, attempt: u32) {
        self.register_recorded(task_id, agent_id, attempt, false);
    }

    /// [`JobResults::register`] for a task read back from the job record;
    /// `done` = its current attempt's result was accepted before.
    pub fn register_recorded(&self, task_id: &str, agent_id: &str, attempt: u32, done: bool) {
        let mut tasks = self.lock();
        let previous = tasks.insert(
            task_id.to_string(),
            TaskEntry {
                agent_id: agent_id.to_string(),
                attempt,
                result: None,
                delivered: false,
                recorded_done: done,
                accepting: None,
            },
        );
        // Under the table's lock, so two registrations of one task list it
        // as the table ends up holding it (the listing is only ever locked
        // alone or inside the table's lock).
        self.listing().place(
            task_id,
            agent_id,
            previous.as_ref().map(|entry| entry.agent_id.as_str()),
        );
    }

    /// Offers a result; see [`Acceptance`].
    pub fn offer(&self, result: &v1::TaskResult) -> Acceptance {
        let mut tasks = self.lock();
        let Some(entry) = tasks.get_mut(&result.task_id) else {
            return Acceptance::UnknownTask;
        };
        if result.attempt != entry.attempt {
            return Acceptance::Stale {
                current_attempt: entry.attempt,
            };
        }
        if entry.result.is_some() || entry.accepting.is_some() {
            return Acceptance::Duplicate;
        }
        if result.fenced {
            return Acceptance::FencedCurrent;
        }
        if !entry.recorded_done {
            // Visible once recorded: see `publish_accepted`.
            entry.accepting = Some(result.clone());
            return Acceptance::Accepted;
        }
        entry.result = Some(result.clone());
        drop(tasks);
        self.changed.notify_waiters();
        Acceptance::Restored
    }

    /// Makes an [`Acceptance::Accepted`] result visible to `collect_result`
    /// (after the caller recorded and journaled it).
    pub fn publish_accepted(&self, task_id: &str) {
        let mut tasks = self.lock();
        if let Some(entry) = tasks.get_mut(task_id)
            && let Some(result) = entry.accepting.take()
            && entry.result.is_none()
        {
            entry.result = Some(result);
        }
        drop(tasks);
        self.changed.notify_waiters();
    }

    /// Waits, at most `timeout`, until no accepted result is still being
    /// recorded ([`JobResults::publish_accepted`] not called yet), so that
    /// a job ending as its last result arrives counts that result instead
    /// of settling the task as cancelled. False when `timeout` passed.
    pub async fn wait_recorded(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check: a publish in between still wakes.
            notified.as_mut().enable();
            if !self.lock().values().any(|t| t.accepting.is_some()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Settles a task locally (e.g. its agent was cancelled) unless it has
    /// a result already.
    pub fn settle(&self, task_id: &str, status: v1::TaskStatus, error: &str) {
        let mut tasks = self.lock();
        if let Some(entry) = tasks.get_mut(task_id)
            && entry.result.is_none()
            && entry.accepting.is_none()
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
        match agents {
            None => self.order(),
            Some(agents) => self.listing().of_agents(agents),
        }
    }

    /// True when `task_id` was assigned in this job.
    pub fn knows(&self, task_id: &str) -> bool {
        self.lock().contains_key(task_id)
    }

    /// True when `task_id` is known and has no result yet (not even one
    /// being recorded).
    pub fn is_pending(&self, task_id: &str) -> bool {
        self.lock()
            .get(task_id)
            .is_some_and(|t| t.result.is_none() && t.accepting.is_none())
    }

    /// The current attempt of `task_id`.
    pub fn attempt(&self, task_id: &str) -> Option<u32> {
        self.lock().get(task_id).map(|t| t.attempt)
    }

    /// Tasks recorded as done whose result is not in the table (it was not
    /// found in the results stream after a restart).
    pub fn recorded_done_without_result(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, t)| t.recorded_done && t.result.is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Tasks without a result, in assignment order.
    pub fn pending(&self) -> Vec<String> {
        let order = self.order();
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

    /// Every task in assignment order with its current attempt and its
    /// accepted result (`None` while pending); nothing is marked as handed
    /// out.
    pub fn snapshot(&self) -> Vec<TaskView> {
        let order = self.order();
        self.views(&order)
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

    /// Whether a [`JobResults::collect`] of `ids` is done: every known
    /// task has a result (`all`), or one has a result not handed out
    /// before, or none is known (any). Checked under the lock without
    /// copying a result: a collect of a thousand tasks checks at each of
    /// their thousand results.
    fn ready(&self, ids: &[String], all: bool) -> bool {
        let tasks = self.lock();
        let mut known = ids.iter().filter_map(|id| tasks.get(id)).peekable();
        if all {
            return known.all(|t| t.result.is_some());
        }
        if known.peek().is_none() {
            return true;
        }
        known.any(|t| t.result.is_some() && !t.delivered)
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
            if self.ready(ids, all) {
                let views = self.views(ids);
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

/// How many results (and reassignments) this leader handled, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaderCounters {
    /// Results accepted as a task's outcome.
    pub accepted: u64,
    /// Results accepted again into a resumed job's table (already counted
    /// in its record before the restart).
    pub restored: u64,
    /// Further copies of an accepted result.
    pub duplicate: u64,
    /// Results of an attempt that is not the task's current one.
    pub stale: u64,
    /// Fenced results of the current attempt (each triggers a reassignment).
    pub fenced: u64,
    /// Results naming a task the job never assigned.
    pub unknown_task: u64,
    /// Task attempts re-published by the reassigner.
    pub reassigned: u64,
    /// Results dropped because their token is not the one the leader issued
    /// for that task attempt (not from the session placed for it).
    pub forged: u64,
}

#[derive(Debug, Default)]
pub(crate) struct AtomicCounters {
    pub(crate) accepted: AtomicU64,
    pub(crate) restored: AtomicU64,
    pub(crate) duplicate: AtomicU64,
    pub(crate) stale: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) unknown_task: AtomicU64,
    pub(crate) reassigned: AtomicU64,
    pub(crate) forged: AtomicU64,
}

impl AtomicCounters {
    pub(crate) fn snapshot(&self) -> LeaderCounters {
        LeaderCounters {
            accepted: self.accepted.load(Ordering::Relaxed),
            restored: self.restored.load(Ordering::Relaxed),
            duplicate: self.duplicate.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            unknown_task: self.unknown_task.load(Ordering::Relaxed),
            reassigned: self.reassigned.load(Ordering::Relaxed),
            forged: self.forged.load(Ordering::Relaxed),
        }
    }
}

/// Result tables of the jobs this leader runs.
#[derive(Debug, Default)]
pub struct ResultTable {
    jobs: DashMap<String, Arc<JobResults>>,
    pub(crate) counters: AtomicCounters,
}

impl ResultTable {
    /// The table of `job_id`, created on first use.
    pub fn job(&self, job_id: &str) -> Arc<JobResults> {
        self.jobs.entry(job_id.to_string()).or_default().clone()
    }

    /// The table of `job_id` if it has one (`None`: not run by this leader,
    /// or finished and removed).
    pub fn get(&self, job_id: &str) -> Option<Arc<JobResults>> {
        self.jobs.get(job_id).map(|e| e.clone())
    }

    /// Forgets a finished job's table.
    pub fn remove(&self, job_id: &str) {
        self.jobs.remove(job_id);
    }

    /// Jobs with a table (running or about to run on this leader).
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// No job has a table.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The counters so far.
    pub fn counters(&self) -> LeaderCounters {
        self.counters.snapshot()
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
            Acceptance::Stale { current_attempt: 2 }
        );
        let mut fenced = result("t1", 2);
        fenced.fenced = true;
        assert_eq!(job.offer(&fenced), Acceptance::FencedCurrent);
        assert_eq!(job.offer(&result("t1", 2)), Acceptance::Accepted);
        assert_eq!(job.offer(&fenced), Acceptance::Duplicate);
        assert_eq!(job.offer(&result("t1", 2)), Acceptance::Duplicate);
        assert!(!job.is_pending("t1"));
        assert_eq!(job.counts(), (1, 0), "visible once recorded");
        job.publish_accepted("t1");
        assert_eq!(job.counts(), (1, 1));
        assert_eq!(
            job.task_ids(Some(&["a2".to_string()])),
            vec!["t1".to_string()]
        );
        assert!(job.task_ids(Some(&["a1".to_string()])).is_empty());

        job.register_recorded("t2", "a1", 3, true);
        assert_eq!(job.recorded_done_without_result(), vec!["t2".to_string()]);
        assert_eq!(job.offer(&result("t2", 3)), Acceptance::Restored);
        assert!(job.recorded_done_without_result().is_empty());
    }

    #[test]
    fn an_agents_tasks_are_listed_in_assignment_order_and_follow_a_move() {
        let job = JobResults::default();
        for (task, agent) in [("t1", "a1"), ("t2", "a2"), ("t3", "a1"), ("t4", "a3")] {
            job.register(task, agent, 1);
        }
        let ids = |agents: &[&str]| {
            let agents: Vec<String> = agents.iter().map(|a| a.to_string()).collect();
            job.task_ids(Some(&agents))
        };
        assert_eq!(ids(&["a3", "a1", "a1"]), ["t1", "t3", "t4"]);
        assert_eq!(ids(&["nobody"]), Vec::<String>::new());
        // t1 moves to a3 (its next attempt): listed there, in its old place.
        job.register("t1", "a3", 2);
        assert_eq!(ids(&["a1"]), ["t3"]);
        assert_eq!(ids(&["a3"]), ["t1", "t4"]);
        assert_eq!(job.task_ids(None), ["t1", "t2", "t3", "t4"]);
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
        job.publish_accepted("t2");
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

    #[test]
    fn a_collect_is_ready_by_the_same_rules_as_its_views() {
        let job = JobResults::default();
        let unknown = vec!["nope".to_string()];
        assert!(job.ready(&unknown, false), "any of no known task: at once");
        assert!(job.ready(&unknown, true), "all of no known task: at once");
        job.register("t1", "a1", 1);
        job.register("t2", "a2", 1);
        let ids = vec!["t1".to_string(), "t2".to_string(), "nope".to_string()];
        assert!(!job.ready(&ids, false));
        assert!(!job.ready(&ids, true));
        assert_eq!(job.offer(&result("t1", 1)), Acceptance::Accepted);
        job.publish_accepted("t1");
        assert!(job.ready(&ids, false), "a result not handed out yet");
        assert!(!job.ready(&ids, true), "t2 is pending");
        job.mark_delivered(&ids);
        assert!(!job.ready(&ids, false), "t1 was handed out already");
        assert_eq!(job.offer(&result("t2", 1)), Acceptance::Accepted);
        job.publish_accepted("t2");
        assert!(job.ready(&ids, false));
        assert!(job.ready(&ids, true), "every known task has its result");
    }
}
