//! Helpers shared by the chaos scenarios: one scenario at a time (they
//! measure recovery times, which a second fleet on the same cores would
//! distort), job submission with the builtin policies, waiting for a job's
//! end across leader restarts, the accepted results, the figures every
//! scenario prints, and the opening of the mid-job scenarios.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::chaos::{
    ChaosOptions, ChaosStack, Observation, Seen, connect_control, tasks_of,
};
use mtswarm_tests::jobs::{agent_events, job_spec, try_get_job, watch_to_end};
pub(crate) use mtswarm_tests::jobs::{is_final, submit, task_results as accepted_results};
use mtswarm_tests::stack::Control;
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Held for the whole scenario.
pub(crate) async fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A job run by the builtin leader policy over vecadd's tuning space (ten
/// candidates), split among `agents` agents on the first free slices in
/// slice-id order.
pub(crate) fn vecadd_job(goal: &str, agents: u32, auto_approve: bool) -> v1::JobSpec {
    job_spec(goal, "vecadd", agents, auto_approve)
}

/// Waits until the job is final, asking whichever leader currently runs
/// (calls fail while none does; those are retried until the deadline).
pub(crate) async fn wait_final(
    stack: &ChaosStack,
    job_id: &str,
    timeout: Duration,
) -> v1::JobRecord {
    let deadline = Instant::now() + timeout;
    let mut last: Option<v1::JobRecord> = None;
    let mut last_error = String::new();
    loop {
        let mut control = connect_control(&stack.leader_url).await;
        match try_get_job(&mut control, job_id).await {
            Ok(Some(job)) if is_final(job.state()) => return job,
            Ok(Some(job)) => last = Some(job),
            Ok(None) => {}
            Err(status) => last_error = status.to_string(),
        }
        assert!(
            Instant::now() < deadline,
            "job {job_id} not final within {timeout:?} (last error: {last_error}); last record: {:#?}\n{}",
            last.map(|j| (j.state(), j.tasks_done, j.tasks_total, j.tasks, j.agents)),
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The job's whole WatchJob stream (the job is final, so it ends).
pub(crate) async fn job_events(control: &mut Control, job_id: &str) -> Vec<v1::JobEvent> {
    watch_to_end(control, job_id, Duration::from_secs(60), || {
        "the WatchJob stream of a final job did not end".to_string()
    })
    .await
}

/// The leader's log events of `kind` (e.g. `task_reassigned`) on the job's stream.
pub(crate) fn leader_log_events(events: &[v1::JobEvent], kind: &str) -> Vec<serde_json::Value> {
    agent_events(events)
        .iter()
        .filter_map(|a| mtswarm_tests::chaos::log_payload(a, kind))
        .collect()
}

/// Per task id: how many accepted results.
pub(crate) fn accepted_per_task(accepted: &[v1::TaskResult]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for result in accepted {
        *counts.entry(result.task_id.clone()).or_insert(0) += 1;
    }
    counts
}

/// The fate of every task the observer saw assigned for a job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    /// Distinct task ids published.
    pub tasks: usize,
    /// Tasks without an accepted result.
    pub lost: usize,
    /// Accepted results beyond the first per task.
    pub duplicates_accepted: usize,
    /// Results published on the results subject (every attempt, fenced too).
    pub results_seen: usize,
    pub accepted: usize,
    /// (task id, attempt) pairs published more than once.
    pub republished: usize,
    pub highest_attempt: u32,
}

/// Tallies the job's own tasks: the leader's confirmation of the best
/// (`confirmations`, task ids) is a task of its own, left out.
pub(crate) fn tally(
    observations: &[Observation],
    job_id: &str,
    accepted: &[v1::TaskResult],
    confirmations: &std::collections::BTreeSet<String>,
) -> Tally {
    let mut publishes: BTreeMap<(String, u32), usize> = BTreeMap::new();
    let mut results_seen = 0;
    for observation in observations {
        match &observation.seen {
            Seen::Task(t) if t.job_id == job_id && !confirmations.contains(&t.task_id) => {
                *publishes.entry((t.task_id.clone(), t.attempt)).or_insert(0) += 1;
            }
            Seen::Result(r) if r.job_id == job_id && !confirmations.contains(&r.task_id) => {
                results_seen += 1
            }
            _ => {}
        }
    }
    let accepted: Vec<v1::TaskResult> = accepted
        .iter()
        .filter(|r| !confirmations.contains(&r.task_id))
        .cloned()
        .collect();
    let accepted = accepted.as_slice();
    let per_task = accepted_per_task(accepted);
    let task_ids: std::collections::BTreeSet<&String> = publishes.keys().map(|(t, _)| t).collect();
    Tally {
        tasks: task_ids.len(),
        lost: task_ids
            .iter()
            .filter(|t| !per_task.contains_key(**t))
            .count(),
        duplicates_accepted: per_task.values().map(|n| n.saturating_sub(1)).sum(),
        results_seen,
        accepted: accepted.len(),
        republished: publishes.values().filter(|n| **n > 1).count(),
        highest_attempt: publishes.keys().map(|(_, a)| *a).max().unwrap_or(0),
    }
}

impl Tally {
    /// The tally as figures, in the order every scenario prints them.
    pub(crate) fn figures(&self) -> Vec<(&'static str, String)> {
        vec![
            ("tasks", self.tasks.to_string()),
            ("tasks_lost", self.lost.to_string()),
            ("results_seen", self.results_seen.to_string()),
            ("accepted", self.accepted.to_string()),
            ("duplicates_accepted", self.duplicates_accepted.to_string()),
            ("attempts_published_twice", self.republished.to_string()),
            ("highest_attempt", self.highest_attempt.to_string()),
        ]
    }
}

/// How a scenario's job ended: its final record, its WatchJob stream, the
/// results the leader accepted and the tally of everything the observer
/// saw for it.
pub(crate) struct Outcome {
    pub job: v1::JobRecord,
    /// When the job was seen final (before its stream was read).
    pub finished_at: Instant,
    pub events: Vec<v1::JobEvent>,
    pub accepted: Vec<v1::TaskResult>,
    pub counts: Tally,
}

/// Waits until the job is final (see [`wait_final`]), then reads its
/// stream and tallies it.
pub(crate) async fn outcome(
    stack: &ChaosStack,
    control: &mut Control,
    job_id: &str,
    timeout: Duration,
) -> Outcome {
    let job = wait_final(stack, job_id, timeout).await;
    let finished_at = Instant::now();
    let events = job_events(control, job_id).await;
    let accepted = accepted_results(&events);
    let counts = tally(
        &stack.observer.snapshot(),
        job_id,
        &accepted,
        &confirmation_tasks(&job),
    );
    Outcome {
        job,
        finished_at,
        events,
        accepted,
        counts,
    }
}

impl Outcome {
    /// Reports the scenario's own figures, then the tally's (see [`report`]).
    pub(crate) fn report(&self, scenario: &str, figures: &[(&str, String)]) {
        let mut all = figures.to_vec();
        all.extend(self.counts.figures());
        report(scenario, &all);
    }

    /// What every scenario promises whatever broke: the job succeeded,
    /// every task has an accepted result and none has two.
    pub(crate) fn assert_nothing_lost(&self, stack: &ChaosStack) {
        let (job, accepted) = (&self.job, &self.accepted);
        assert_eq!(
            job.state(),
            v1::JobState::Succeeded,
            "{job:#?}\n{}",
            stack.logs()
        );
        assert_eq!(
            self.counts.lost, 0,
            "tasks without an accepted result: {accepted:#?}"
        );
        assert_eq!(
            self.counts.duplicates_accepted,
            0,
            "more than one accepted result for a task: {:?}",
            accepted_per_task(accepted)
        );
    }
}

/// The task ids of the leader's confirmations of the job's best.
pub(crate) fn confirmation_tasks(job: &v1::JobRecord) -> std::collections::BTreeSet<String> {
    job.tasks
        .iter()
        .filter(|t| {
            t.assign_call_id
                .starts_with(mtswarm_leader::CONFIRM_CALL_PREFIX)
        })
        .filter_map(|t| t.assignment.as_ref().map(|a| a.task_id.clone()))
        .collect()
}

/// The job's own agents (an agent the leader spawned to confirm the best
/// is its own).
pub(crate) fn own_agents(job: &v1::JobRecord) -> Vec<&v1::AgentPlacement> {
    job.agents
        .iter()
        .filter(|a| !a.agent_id.starts_with(mtswarm_leader::CONFIRM_CALL_PREFIX))
        .collect()
}

/// Prints one scenario's figures as `CHAOS-FIGURES scenario=NAME key=value ...`
/// (cargo shows them with `--nocapture`) and appends the same line to the
/// file named by `MTSWARM_CHAOS_FIGURES`, when set (deploy/soak.sh reads it).
pub(crate) fn report(scenario: &str, figures: &[(&str, String)]) {
    let mut line = format!("CHAOS-FIGURES scenario={scenario}");
    for (key, value) in figures {
        let _ = write!(line, " {key}={value}");
    }
    println!("{line}");
    if let Ok(path) = std::env::var("MTSWARM_CHAOS_FIGURES")
        && !path.is_empty()
    {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(mut file) => {
                let _ = writeln!(file, "{line}");
            }
            Err(error) => eprintln!("cannot append figures to {path}: {error}"),
        }
    }
}

/// Milliseconds of a duration, for figures.
pub(crate) fn ms(duration: Duration) -> String {
    duration.as_millis().to_string()
}

/// The first assignment of `job_id`.
pub(crate) async fn first_assignment(stack: &ChaosStack, job_id: &str) -> v1::TaskAssignment {
    let job = job_id.to_string();
    stack
        .observer
        .wait_for(
            "the job's first task assignment",
            Duration::from_secs(60),
            |seen| {
                mtswarm_tests::chaos::tasks_of(seen, &job)
                    .into_iter()
                    .next()
                    .map(|(_, t)| t)
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()))
}

/// Waits until the session running `task` checkpointed step `min_step` or
/// later of that attempt; fails if the task's result arrived first (the
/// workload is then too small to interrupt mid-task).
pub(crate) async fn wait_checkpoint(
    stack: &ChaosStack,
    task: &v1::TaskAssignment,
    min_step: u32,
) -> u32 {
    let found = stack
        .observer
        .wait_for(
            &format!(
                "a checkpoint at step >= {min_step} of task {}",
                task.task_id
            ),
            Duration::from_secs(90),
            |seen| {
                seen.iter().find_map(|o| match &o.seen {
                    Seen::Checkpoint(c)
                        if c.session_id == task.session_id
                            && c.task_id == task.task_id
                            && c.attempt == task.attempt
                            && c.step >= min_step =>
                    {
                        Some(Ok(c.step))
                    }
                    Seen::Result(r) if r.task_id == task.task_id && r.attempt == task.attempt => {
                        Some(Err(Box::new(r.clone())))
                    }
                    _ => None,
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    match found {
        Ok(step) => step,
        Err(result) => panic!(
            "task {} finished before it could be interrupted (workload too small): {result:#?}",
            task.task_id
        ),
    }
}

/// Waits until one of `tasks` (each its attempt) checkpointed step
/// `min_step` or later while its result was not yet in; fails if every one
/// of them finished first (the workload is then too small to interrupt).
/// The mid-job scenarios need some task under way, not a particular one:
/// on a loaded machine the first task can finish before its checkpoints
/// are seen.
pub(crate) async fn wait_any_checkpoint(
    stack: &ChaosStack,
    tasks: &[v1::TaskAssignment],
    min_step: u32,
) -> u32 {
    let found = stack
        .observer
        .wait_for(
            &format!("a checkpoint at step >= {min_step} of a running task"),
            Duration::from_secs(90),
            |seen| {
                let mut finished: Vec<&str> = Vec::new();
                for observed in seen {
                    match &observed.seen {
                        Seen::Checkpoint(c)
                            if c.step >= min_step
                                && !finished.contains(&c.task_id.as_str())
                                && tasks.iter().any(|t| {
                                    t.session_id == c.session_id
                                        && t.task_id == c.task_id
                                        && t.attempt == c.attempt
                                }) =>
                        {
                            return Some(Ok(c.step));
                        }
                        Seen::Result(r)
                            if tasks
                                .iter()
                                .any(|t| t.task_id == r.task_id && t.attempt == r.attempt) =>
                        {
                            finished.push(r.task_id.as_str());
                            if finished.len() == tasks.len() {
                                return Some(Err(()));
                            }
                        }
                        _ => {}
                    }
                }
                None
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    match found {
        Ok(step) => step,
        Err(()) => panic!(
            "every task finished before one could be interrupted (workload too small)\n{}",
            stack.logs()
        ),
    }
}

/// Waits for the publish of `task_id` with `attempt`; returns when it was seen.
pub(crate) async fn wait_attempt(
    stack: &ChaosStack,
    job_id: &str,
    task_id: &str,
    attempt: u32,
    timeout: Duration,
) -> Result<(Instant, v1::TaskAssignment), String> {
    let job = job_id.to_string();
    stack
        .observer
        .wait_for(
            &format!("attempt {attempt} of task {task_id}"),
            timeout,
            |seen| {
                mtswarm_tests::chaos::tasks_of(seen, &job)
                    .into_iter()
                    .find(|(_, t)| t.task_id == task_id && t.attempt == attempt)
            },
        )
        .await
}

/// The `task_started` payload of `task_id` / `attempt`, once published.
pub(crate) async fn wait_task_started(
    stack: &ChaosStack,
    job_id: &str,
    task_id: &str,
    attempt: u32,
    timeout: Duration,
) -> serde_json::Value {
    stack
        .observer
        .wait_for(
            &format!("task_started of task {task_id} attempt {attempt}"),
            timeout,
            |seen| {
                seen.iter().find_map(|o| match &o.seen {
                    Seen::Event(e) if e.job_id == job_id => {
                        mtswarm_tests::chaos::log_payload(e, "task_started").filter(|p| {
                            p["task_id"] == task_id
                                && p["attempt"].as_u64() == Some(u64::from(attempt))
                        })
                    }
                    _ => None,
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()))
}

/// Waits until `text` appears in the leader's log (logs are written a
/// moment after the event they describe).
pub(crate) async fn wait_leader_log(stack: &ChaosStack, text: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if stack.leader_logs().contains(text) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A scenario's job, just submitted: the fleet, a Control client of its
/// leader, the job's id, and when it was submitted.
pub(crate) struct Started {
    pub stack: ChaosStack,
    pub control: Control,
    pub job_id: String,
    /// Just before the job was submitted.
    pub submitted_at: Instant,
}

/// Starts `options`' fleet, waits until `free_slices` slices are free and
/// submits `spec` (see [`Started`]).
pub(crate) async fn start_job(
    options: ChaosOptions,
    free_slices: usize,
    spec: v1::JobSpec,
) -> Started {
    let stack = ChaosStack::start(options).await;
    stack
        .wait_for_free_slices(free_slices, Duration::from_secs(30))
        .await;
    let mut control = stack.control().await;
    let submitted_at = Instant::now();
    let job_id = submit(&mut control, spec).await;
    Started {
        stack,
        control,
        job_id,
        submitted_at,
    }
}

/// Starts `options`' fleet (two free slices) and submits a two-agent vecadd
/// job with `goal`, then waits until it is under way, where the mid-job
/// scenarios inject their fault: both tasks assigned, one of them
/// checkpointed at step 2 or later before its result.
pub(crate) async fn start_mid_job(options: ChaosOptions, goal: &str) -> Started {
    let started = start_job(options, 2, vecadd_job(goal, 2, true)).await;
    let (stack, job) = (&started.stack, started.job_id.clone());
    let assigned = stack
        .observer
        .wait_for("both task assignments", Duration::from_secs(60), |seen| {
            let tasks = tasks_of(seen, &job);
            (tasks.len() >= 2).then(|| tasks.into_iter().map(|(_, t)| t).collect::<Vec<_>>())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    wait_any_checkpoint(stack, &assigned, 2).await;
    started
}

/// Every worker process of `stack` is still running (a scenario that hurt
/// only NATS must not have taken a daemon down with it).
pub(crate) fn assert_workers_alive(stack: &mut ChaosStack) {
    for worker in &mut stack.workers {
        assert!(
            worker.process.try_status().is_none(),
            "{} exited:\n{}",
            worker.process.name(),
            worker.process.stderr()
        );
    }
}
