//! A best is confirmed elsewhere before it is the job's: a worker can lie
//! about its own slices' measurements (provenance binds a record to its
//! producer, not to the truth), so before the job's outcome names a figure
//! the leader has it measured again on another worker's slice of the same
//! kind (backend and cores).
//!
//! When the leader loop has answered, the leader takes the best usable
//! record of the job, finds a confirmer (an idle agent of the job on
//! another worker's slice of that kind, else a free such slice, where it
//! spawns an agent) and assigns it one task: benchmark exactly that
//! configuration (`{"params": ..., "strategy": "sequential"}`). Then it
//! compares the medians with the slice kind's tolerance ([`tolerance`]):
//!
//! - within it, the best is **confirmed** (the outcome names where);
//! - beyond it, both figures are **disputed**: flagged in the outcome's
//!   confirmations and logged (no slice is quarantined for it), and the
//!   next candidate is tried, at most [`MAX_ROUNDS`] times; a job whose
//!   every round disagreed has no best and fails saying why;
//! - no other worker has such a slice: the best stands **unavailable** for
//!   confirmation, and the outcome says so; a confirming task that fails or
//!   measures nothing leaves the best standing as **failed** to confirm,
//!   with the reason.
//!
//! Confirming tasks are ordinary tasks of the job, recorded, published and
//! accepted like every other (their call keys start with
//! [`CONFIRM_CALL_PREFIX`]), but neither they nor their records are
//! candidates of the job's own: the outcome and the job's task counts
//! leave them out (the outcome's `confirmations` say what they found); its
//! stream shows their results like every other.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use mtswarm_bus::results::{ResultRecord, canonical_slice_id};
use mtswarm_bus::v1;
use mtswarm_core::{ToolContext, ToolRegistry};
use serde_json::{Value, json};

use crate::host::JobHost;
use crate::ids::leader_session_id;
use crate::job::JobContext;
use crate::outcome;
use crate::results::TaskView;

pub use crate::ids::CONFIRM_CALL_PREFIX;

/// Candidates tried at most: after this many disagreements the job has no
/// confirmed best.
pub(crate) const MAX_ROUNDS: usize = 2;

/// Longest a confirming task may take (the job's deadline may cut it).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Largest relative difference of two medians of the same build measured
/// on two slices of `backend`'s kind that still agrees: modeled timing
/// (the emulator) is exact but for its inputs; the simulated boards add
/// up to 10% noise per execution; real boards and host CPUs vary more.
pub(crate) fn tolerance(backend: &str) -> f64 {
    match backend {
        "emulator" => 0.02,
        "simulated" => 0.25,
        "sdk" => 0.10,
        _ => 0.25,
    }
}

/// What confirming the job's best found; [`Confirmed::apply`] writes it
/// into the final outcome.
#[derive(Debug, Default)]
pub(crate) struct Confirmed {
    /// Every round, in order.
    confirmations: Vec<v1::Confirmation>,
    /// Records whose figures a confirmation disputed (both sides).
    pub(crate) disputed: HashSet<String>,
    /// The confirmation of the best that stands (its original record).
    standing: Option<v1::Confirmation>,
    /// Every round disagreed: there is no confirmed best, for this reason.
    gave_up: Option<String>,
}

impl Confirmed {
    /// Writes the confirmations into `outcome`: every round, the one of its
    /// best (when it is the record confirmed), and no best when every
    /// round disagreed.
    pub(crate) fn apply(&self, outcome: &mut v1::JobOutcome) {
        outcome.confirmations = self.confirmations.clone();
        if let Some(reason) = &self.gave_up {
            outcome.best = None;
            outcome.failure_reason = reason.clone();
            return;
        }
        if let (Some(best), Some(standing)) = (outcome.best.as_mut(), &self.standing)
            && best.record_ids.contains(&standing.original_record_id)
        {
            best.confirmation = Some(standing.clone());
        }
    }
}

/// Task ids of the job's confirming tasks.
pub(crate) fn confirmation_tasks(context: &JobContext) -> HashSet<String> {
    context
        .tasks()
        .iter()
        .filter(|(_, t)| crate::ids::is_confirmation(t))
        .map(|(id, _)| id.clone())
        .collect()
}

/// Confirms the job's best (see the module docs). Never fails: what could
/// not be done is a confirmation state with its reason. A cancellation of
/// the job (`cancel`) ends a confirmation that is waiting as failed.
pub(crate) async fn confirm(
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    cancel: &mut tokio::sync::watch::Receiver<Option<String>>,
) -> Confirmed {
    let mut confirmed = Confirmed::default();
    for round in 1..=MAX_ROUNDS {
        if cancel.borrow().is_some() {
            break;
        }
        let (best_record_ids, original) =
            match next_candidate(host, context, &confirmed.disputed).await {
                Ok(Some(candidate)) => candidate,
                Ok(None) => break,
                Err(()) => return confirmed,
            };
        let started = Instant::now();
        let mut confirmation = opening(&original);
        let measured = measure_elsewhere(host, context, round, &original, cancel).await;
        confirmation.seconds = started.elapsed().as_secs_f64();
        let state = judge(&mut confirmation, measured, &original, &context.job_id);
        if state == v1::ConfirmationState::Disagreed {
            confirmed.disputed.extend(best_record_ids);
            confirmed.disputed.insert(confirmation.record_id.clone());
        }
        confirmation.state = state as i32;
        tracing::info!(
            job_id = %context.job_id,
            round,
            state = state.as_str_name(),
            seconds = confirmation.seconds,
            reason = %confirmation.reason,
            "confirmation of the best"
        );
        confirmed.confirmations.push(confirmation.clone());
        if state != v1::ConfirmationState::Disagreed {
            confirmed.standing = Some(confirmation);
            return confirmed;
        }
    }
    confirmed.gave_up = gave_up_reason(&confirmed.confirmations);
    confirmed
}

/// The job's best among its own records not disputed yet: the best's
/// record ids and its first record. `Ok(None)` when there is none; `Err`
/// (logged) when the results store is not readable.
async fn next_candidate(
    host: &Arc<JobHost>,
    context: &JobContext,
    disputed: &HashSet<String>,
) -> Result<Option<(Vec<String>, ResultRecord)>, ()> {
    let records = match host.believed_records(&context.job_id).await {
        Ok((records, _)) => records,
        Err(error) => {
            tracing::warn!(%error, job_id = %context.job_id, "results store unreadable; the best is not confirmed");
            return Err(());
        }
    };
    let skip = confirmation_tasks(context);
    let tasks: Vec<TaskView> = context
        .results
        .snapshot()
        .into_iter()
        .filter(|t| !skip.contains(&t.task_id))
        .collect();
    let candidates: Vec<ResultRecord> = records
        .iter()
        .filter(|r| !skip.contains(&r.task_id) && !disputed.contains(&r.record_id))
        .cloned()
        .collect();
    let Some(best) = outcome::from_records(&tasks, &candidates).best else {
        return Ok(None);
    };
    let original = candidates
        .iter()
        .find(|r| best.record_ids.first() == Some(&r.record_id))
        .cloned();
    Ok(original.map(|original| (best.record_ids, original)))
}

/// A round's confirmation before anything is measured: the original
/// record's side and the tolerance of its kind.
fn opening(original: &ResultRecord) -> v1::Confirmation {
    v1::Confirmation {
        original_record_id: original.record_id.clone(),
        original_worker_id: original.worker_id.clone(),
        original_slice_id: original.slice_id.clone(),
        original_gflops: original.gflops.unwrap_or_default(),
        original_median_seconds: median(original),
        tolerance: tolerance(&original.backend),
        ..Default::default()
    }
}

/// Writes what was measured into `confirmation` and says what it makes of
/// the original: unavailable, failed, confirmed or disagreed.
fn judge(
    confirmation: &mut v1::Confirmation,
    measured: Measured,
    original: &ResultRecord,
    job_id: &str,
) -> v1::ConfirmationState {
    match measured {
        Measured::Unavailable(reason) => {
            confirmation.reason = reason;
            v1::ConfirmationState::Unavailable
        }
        Measured::Failed { task_id, reason } => {
            confirmation.task_id = task_id;
            confirmation.reason = reason;
            v1::ConfirmationState::Failed
        }
        Measured::Record { task_id, record } => {
            confirmation.task_id = task_id;
            compare(confirmation, &record, original, job_id)
        }
    }
}

/// Compares the confirming record's median with the original's within the
/// kind's tolerance; a disagreement is logged with both sides.
fn compare(
    confirmation: &mut v1::Confirmation,
    record: &ResultRecord,
    original: &ResultRecord,
    job_id: &str,
) -> v1::ConfirmationState {
    confirmation.record_id = record.record_id.clone();
    confirmation.worker_id = record.worker_id.clone();
    confirmation.slice_id = record.slice_id.clone();
    confirmation.gflops = record.gflops.unwrap_or_default();
    confirmation.median_seconds = median(record);
    let difference = relative_difference(
        confirmation.original_median_seconds,
        confirmation.median_seconds,
    );
    if difference <= confirmation.tolerance {
        confirmation.reason = format!(
            "reproduced on slice {} of worker {} ({:.4e} s against {:.4e} s, {:.1}% apart, tolerance {:.0}%)",
            record.slice_id,
            record.worker_id,
            confirmation.median_seconds,
            confirmation.original_median_seconds,
            difference * 100.0,
            confirmation.tolerance * 100.0
        );
        return v1::ConfirmationState::Confirmed;
    }
    confirmation.reason = format!(
        "not reproduced: slice {} of worker {} measured {:.4e} s where slice {} of worker {} reported {:.4e} s ({:.0}% apart, tolerance {:.0}%); both figures are flagged",
        record.slice_id,
        record.worker_id,
        confirmation.median_seconds,
        original.slice_id,
        original.worker_id,
        confirmation.original_median_seconds,
        difference * 100.0,
        confirmation.tolerance * 100.0
    );
    tracing::warn!(
        job_id = %job_id,
        original_record = %original.record_id,
        original_worker = %original.worker_id,
        original_slice = %original.slice_id,
        confirming_record = %record.record_id,
        confirming_worker = %record.worker_id,
        confirming_slice = %record.slice_id,
        difference,
        "measurements disagree: both figures flagged (no slice quarantined)"
    );
    v1::ConfirmationState::Disagreed
}

/// Why the job has no confirmed best, when every round disagreed.
fn gave_up_reason(confirmations: &[v1::Confirmation]) -> Option<String> {
    if confirmations.is_empty()
        || !confirmations
            .iter()
            .all(|c| c.state() == v1::ConfirmationState::Disagreed)
    {
        return None;
    }
    let rounds: Vec<&str> = confirmations.iter().map(|c| c.reason.as_str()).collect();
    Some(format!(
        "the confirmation failed: no best figure was reproduced on another worker's slice of the same kind ({})",
        rounds.join("; ")
    ))
}

/// The median of a record, seconds (0 without one).
fn median(record: &ResultRecord) -> f64 {
    record.stats.as_ref().map_or(0.0, |s| s.median)
}

/// How far apart two medians are, relative to the smaller one (infinite
/// when either is missing).
fn relative_difference(a: f64, b: f64) -> f64 {
    let smaller = a.min(b);
    if smaller.is_nan() || smaller <= 0.0 || !a.is_finite() || !b.is_finite() {
        return f64::INFINITY;
    }
    (a - b).abs() / smaller
}

/// What measuring the candidate elsewhere gave.
enum Measured {
    /// No other worker has a slice of the kind (or none is usable).
    Unavailable(String),
    /// The confirming task did not measure the candidate.
    Failed { task_id: String, reason: String },
    /// Its usable record of the candidate.
    Record {
        task_id: String,
        record: Box<ResultRecord>,
    },
}

/// A slice of the job's fleet that can measure the candidate: an idle agent
/// of the job there, or a free slice to spawn one on.
enum Confirmer {
    Agent(String),
    FreeSlice(String),
}

/// Runs round `round`'s confirming task for `original` and reads its record.
async fn measure_elsewhere(
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    round: usize,
    original: &ResultRecord,
    cancel: &mut tokio::sync::watch::Receiver<Option<String>>,
) -> Measured {
    let kind = format!("{}/{} cores", original.backend, original.cores);
    let confirmer = match find_confirmer(host, context, original).await {
        Ok(Some(confirmer)) => confirmer,
        Ok(None) => {
            return Measured::Unavailable(format!(
                "no other worker than {} has a usable slice of the same kind ({kind}) for this job",
                original.worker_id
            ));
        }
        Err(reason) => return Measured::Unavailable(reason),
    };
    let tools = RoundTools::new(host, context, round);
    let steps = async {
        let agent = confirming_agent(&tools, confirmer).await?;
        let task_id = assign_confirmation(&tools, &agent, original).await?;
        let result = await_result(context, &task_id, cancel).await?;
        Ok::<_, Measured>(read_record(host, context, task_id, &result, original).await)
    };
    match steps.await {
        Ok(measured) | Err(measured) => measured,
    }
}

/// The leader's own tools, called by the confirmation of round `round`
/// (call ids `<CONFIRM_CALL_PREFIX><round>-<step>`).
struct RoundTools {
    registry: ToolRegistry,
    session: String,
    round: usize,
}

impl RoundTools {
    fn new(host: &Arc<JobHost>, context: &Arc<JobContext>, round: usize) -> Self {
        Self {
            registry: crate::tools::registry(host.tool_handles(), context.clone()),
            session: leader_session_id(&context.job_id),
            round,
        }
    }

    /// Calls `tool` as step `step` of the round; its data, or why it failed.
    async fn run(&self, tool: &'static str, args: Value, step: &str) -> Result<Value, String> {
        let ctx = ToolContext::new(
            self.session.clone(),
            format!("{CONFIRM_CALL_PREFIX}{}-{step}", self.round),
            u32::MAX,
        );
        let Some(registered) = self.registry.get(tool) else {
            return Err(format!("the leader has no {tool} tool"));
        };
        registered
            .tool
            .call(args, &ctx)
            .await
            .map(|out| out.data.unwrap_or(Value::Null))
            .map_err(|e| e.to_string())
    }
}

/// The confirmer's agent: the idle one, or one spawned on the free slice.
async fn confirming_agent(tools: &RoundTools, confirmer: Confirmer) -> Result<String, Measured> {
    let slice_id = match confirmer {
        Confirmer::Agent(agent) => return Ok(agent),
        Confirmer::FreeSlice(slice_id) => slice_id,
    };
    let spawned = tools
        .run(
            "spawn_agent",
            json!({
                "name": format!("{CONFIRM_CALL_PREFIX}{}", tools.round),
                "slice_id": slice_id,
                "role": "tuner",
                "instructions": "Measure exactly the configuration you are given, as the task says.",
            }),
            "spawn",
        )
        .await;
    match spawned.map(|v| v["agent"].as_str().map(str::to_string)) {
        Ok(Some(agent)) => Ok(agent),
        Ok(None) => Err(Measured::Unavailable(format!(
            "no agent could be started on slice {slice_id}"
        ))),
        Err(error) => Err(Measured::Unavailable(format!(
            "no agent could be started on slice {slice_id}: {error}"
        ))),
    }
}

/// Assigns `agent` the task of benchmarking exactly the original's
/// configuration (its parameters and source diff); the task id.
async fn assign_confirmation(
    tools: &RoundTools,
    agent: &str,
    original: &ResultRecord,
) -> Result<String, Measured> {
    let mut parameters = json!({"params": original.params, "strategy": "sequential"});
    let mut instructions = "Confirm a measurement: compile, validate and benchmark exactly this configuration once, and answer with its figure.".to_string();
    if let Some(diff) = original.source_diff.as_ref().filter(|d| !d.is_empty()) {
        parameters["source_diff"] = json!(diff);
        instructions
            .push_str(" Apply the unified diff in `source_diff` to the kernel sources first.");
    }
    let assigned = tools
        .run(
            "assign_task",
            json!({"agent": agent, "instructions": instructions, "parameters": parameters}),
            "assign",
        )
        .await;
    match assigned.map(|v| v["task_id"].as_str().map(str::to_string)) {
        Ok(Some(task_id)) => Ok(task_id),
        Ok(None) | Err(_) => Err(Measured::Failed {
            task_id: String::new(),
            reason: format!("the confirming task could not be assigned to agent {agent}"),
        }),
    }
}

/// Waits for the confirming task's OK result, within the job's deadline
/// and [`CONFIRM_TIMEOUT`], unless the job is cancelled first.
async fn await_result(
    context: &JobContext,
    task_id: &str,
    cancel: &mut tokio::sync::watch::Receiver<Option<String>>,
) -> Result<v1::TaskResult, Measured> {
    let failed = |reason: String| Measured::Failed {
        task_id: task_id.to_owned(),
        reason,
    };
    let left = context
        .deadline
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .min(CONFIRM_TIMEOUT);
    let cancelled = async {
        if cancel.wait_for(Option::is_some).await.is_err() {
            // No one can cancel any more: only the task ends the wait.
            std::future::pending::<()>().await;
        }
    };
    let ids = [task_id.to_owned()];
    let collected = tokio::select! {
        collected = context.results.collect(&ids, true, left) => collected,
        () = cancelled => {
            return Err(failed(
                "the job was cancelled while its best was being confirmed".into(),
            ));
        }
    };
    let (views, timed_out) = collected;
    let result = views.into_iter().find_map(|v| v.result);
    let Some(result) = result.filter(|_| !timed_out) else {
        return Err(failed(format!(
            "the confirming task did not finish within {} s",
            left.as_secs()
        )));
    };
    if result.status() != v1::TaskStatus::Ok {
        return Err(failed(format!(
            "the confirming task ended {}: {}",
            result.status().as_str_name(),
            result.error.chars().take(300).collect::<String>()
        )));
    }
    Ok(result)
}

/// The confirming task's usable record of the same build (its attempt, the
/// original's parameters and kernel hash).
async fn read_record(
    host: &Arc<JobHost>,
    context: &JobContext,
    task_id: String,
    result: &v1::TaskResult,
    original: &ResultRecord,
) -> Measured {
    let records = match host.believed_records(&context.job_id).await {
        Ok((records, _)) => records,
        Err(error) => {
            return Measured::Failed {
                task_id,
                reason: format!("the results store could not be read: {error}"),
            };
        }
    };
    let record = records.into_iter().find(|r| {
        r.task_id == task_id
            && r.attempt == result.attempt
            && r.params == original.params
            && r.kernel_hash == original.kernel_hash
            && outcome::usable(r)
    });
    match record {
        Some(record) => Measured::Record {
            task_id,
            record: Box::new(record),
        },
        None => Measured::Failed {
            task_id,
            reason: format!(
                "the confirming task recorded no valid figure of the same build (parameters {:?}, kernel hash {})",
                original.params,
                original.kernel_hash.chars().take(16).collect::<String>()
            ),
        },
    }
}

/// An idle agent of the job, else a free slice, on a worker other than the
/// original's with a slice of the same backend and cores; `Ok(None)` when
/// the fleet has neither.
async fn find_confirmer(
    host: &JobHost,
    context: &JobContext,
    original: &ResultRecord,
) -> Result<Option<Confirmer>, String> {
    let selector = crate::fleet::parse_selector(&context.spec.slice_selector)
        .map_err(|e| format!("the job's slice selector is unusable: {e}"))?;
    let view = host
        .placement
        .fleet_view(selector.as_ref())
        .await
        .map_err(|e| format!("the fleet could not be read: {e}"))?;
    let same_kind = |slice: &v1::FleetSlice| {
        slice.worker_id != original.worker_id
            && slice
                .slice
                .as_ref()
                .is_some_and(|d| d.backend == original.backend && d.cores == original.cores)
    };
    let live_worker = |worker_id: &str| {
        view.workers
            .iter()
            .any(|w| w.worker_id == worker_id && !w.draining)
    };
    for agent in context.agent_list() {
        if agent.cancelled || agent.spawning || context.has_pending_task(&agent.agent_id) {
            continue;
        }
        let here = view.slices.iter().find(|s| {
            s.slice.as_ref().is_some_and(|d| {
                canonical_slice_id(&d.slice_id) == canonical_slice_id(&agent.slice_id)
            })
        });
        if let Some(slice) = here
            && same_kind(slice)
            && live_worker(&slice.worker_id)
            && slice.state() != v1::SliceState::Quarantined
        {
            return Ok(Some(Confirmer::Agent(agent.agent_id)));
        }
    }
    let free = view.slices.iter().find(|slice| {
        same_kind(slice)
            && slice.state() == v1::SliceState::Free
            && live_worker(&slice.worker_id)
            && slice
                .slice
                .as_ref()
                .is_some_and(|d| !host.placement.claims.is_claimed(&d.slice_id))
    });
    Ok(free
        .and_then(|s| s.slice.as_ref())
        .map(|d| Confirmer::FreeSlice(d.slice_id.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_agree_within_the_kinds_tolerance_only() {
        assert!(relative_difference(1.0, 1.01) <= tolerance("emulator"));
        assert!(relative_difference(1.0, 1.1) > tolerance("emulator"));
        // A tenfold lie is beyond every kind's tolerance.
        for backend in ["emulator", "simulated", "sdk", "host"] {
            assert!(
                relative_difference(0.1, 1.0) > tolerance(backend),
                "{backend}"
            );
        }
        assert!(relative_difference(0.0, 1.0).is_infinite());
        assert!(relative_difference(f64::NAN, 1.0).is_infinite());
    }

    #[test]
    fn a_disagreement_leaves_no_best_and_says_why() {
        let confirmed = Confirmed {
            confirmations: vec![v1::Confirmation {
                state: v1::ConfirmationState::Disagreed as i32,
                original_record_id: "r1".into(),
                ..Default::default()
            }],
            disputed: ["r1".to_string()].into(),
            standing: None,
            gave_up: Some("the confirmation failed: x".into()),
        };
        let mut outcome = v1::JobOutcome {
            best: Some(v1::BestCandidate {
                record_ids: vec!["r1".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        confirmed.apply(&mut outcome);
        assert!(outcome.best.is_none());
        assert!(
            outcome
                .failure_reason
                .starts_with("the confirmation failed")
        );
        assert_eq!(outcome.confirmations.len(), 1);

        let standing = v1::Confirmation {
            state: v1::ConfirmationState::Confirmed as i32,
            original_record_id: "r2".into(),
            ..Default::default()
        };
        let confirmed = Confirmed {
            confirmations: vec![standing.clone()],
            standing: Some(standing.clone()),
            ..Default::default()
        };
        let mut outcome = v1::JobOutcome {
            best: Some(v1::BestCandidate {
                record_ids: vec!["r2".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        confirmed.apply(&mut outcome);
        assert_eq!(
            outcome.best.and_then(|b| b.confirmation),
            Some(standing),
            "the best names its confirmation"
        );
    }
}
