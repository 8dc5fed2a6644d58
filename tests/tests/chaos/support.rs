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
use mtswarm_tests::stack::Control;
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;
use tokio_stream::StreamExt as _;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Held for the whole scenario.
pub(crate) async fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A job run by the builtin leader policy over vecadd's tuning space (ten
/// candidates), split among `agents` agents on the first free slices in
/// slice-id order.
pub(crate) fn vecadd_job(goal: &str, agents: u32, auto_approve: bool) -> v1::JobSpec {
    v1::JobSpec {
        goal: goal.to_string(),
        kernel_dir: "vecadd".to_string(),
        slice_selector: String::new(),
        budgets: Some(v1::Budgets {
            wall_time_seconds: 600,
            ..Default::default()
        }),
        num_agents: agents,
        model: None,
        auto_approve,
        allow_shell: false,
    }
}

pub(crate) async fn submit(control: &mut Control, spec: v1::JobSpec) -> String {
    control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: String::new(),
        })
        .await
        .expect("SubmitJob accepted")
        .into_inner()
        .job_id
}

pub(crate) fn is_final(state: v1::JobState) -> bool {
    matches!(
        state,
        v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
    )
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
        match control
            .get_job(v1::GetJobRequest {
                job_id: job_id.to_string(),
            })
            .await
        {
            Ok(response) => {
                if let Some(job) = response.into_inner().job {
                    if is_final(job.state()) {
                        return job;
                    }
                    last = Some(job);
                }
            }
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
    let mut stream = control
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_string(),
            from_sequence: 0,
        })
        .await
        .expect("WatchJob")
        .into_inner();
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!("the WatchJob stream of final job {job_id} did not end"),
            Ok(None) => return events,
            Ok(Some(Err(status))) => panic!("WatchJob failed: {status}"),
            Ok(Some(Ok(event))) => events.push(event),
        }
    }
}

/// The results the leader accepted (journaled on the job's stream).
pub(crate) fn accepted_results(events: &[v1::JobEvent]) -> Vec<v1::TaskResult> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::TaskResult(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// The leader's log events of `kind` (e.g. `task_reassigned`) on the job's stream.
pub(crate) fn leader_log_events(events: &[v1::JobEvent], kind: &str) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::AgentEvent(a)) => mtswarm_tests::chaos::log_payload(a, kind),
            _ => None,
        })
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

pub(crate) fn tally(
    observations: &[Observation],
    job_id: &str,
    accepted: &[v1::TaskResult],
) -> Tally {
    let mut publishes: BTreeMap<(String, u32), usize> = BTreeMap::new();
    let mut results_seen = 0;
    for observation in observations {
        match &observation.seen {
            Seen::Task(t) if t.job_id == job_id => {
                *publishes.entry((t.task_id.clone(), t.attempt)).or_insert(0) += 1;
            }
            Seen::Result(r) if r.job_id == job_id => results_seen += 1,
            _ => {}
        }
    }
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

/// A scenario at the point where its fault is injected: a two-agent vecadd
/// job submitted, both tasks assigned, the first one checkpointed at step 2
/// or later.
pub(crate) struct MidJob {
    pub stack: ChaosStack,
    pub control: Control,
    pub job_id: String,
    /// Just before the job was submitted.
    pub submitted_at: Instant,
}

/// Starts `options`' fleet (two free slices), submits a two-agent vecadd
/// job with `goal` and waits until it is under way (see [`MidJob`]).
pub(crate) async fn start_mid_job(options: ChaosOptions, goal: &str) -> MidJob {
    let stack = ChaosStack::start(options).await;
    stack.wait_for_free_slices(2, Duration::from_secs(30)).await;
    let mut control = stack.control().await;
    let submitted_at = Instant::now();
    let job_id = submit(&mut control, vecadd_job(goal, 2, true)).await;
    let job = job_id.clone();
    let assigned = stack
        .observer
        .wait_for("both task assignments", Duration::from_secs(60), |seen| {
            let tasks = tasks_of(seen, &job);
            (tasks.len() >= 2).then(|| tasks.into_iter().map(|(_, t)| t).collect::<Vec<_>>())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    wait_checkpoint(&stack, &assigned[0], 2).await;
    MidJob {
        stack,
        control,
        job_id,
        submitted_at,
    }
}
