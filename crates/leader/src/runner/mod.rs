//! The job runner: one task per job that drives the leader's ReAct loop on
//! the shared engine with the leader tools, publishes the loop's events as
//! the leader agent's events, checkpoints the loop under the job's loop key
//! (`<job>.loop`) after every step, routes the loop's own approval pauses through the approval
//! broker, and records the job's final state.
//!
//! State machine of a job: QUEUED (stored by SubmitJob) -> RUNNING (runner
//! started) -> SUCCEEDED | FAILED | CANCELLED. Every change is written to the
//! jobs KV first and then journaled as a `JobStateChange`.
//!
//! A leader that starts finds the jobs a previous leader left QUEUED or
//! RUNNING and resumes them (`resume_job`): the job context is rebuilt
//! from the job's agent and task keys (each task at its recorded attempt,
//! done or not; a record of an earlier leader that embeds them has them
//! moved to their keys first), the job's results are replayed from the
//! results stream into its table (accepting each task's result once),
//! assignments recorded but never confirmed published are published again
//! (deduplicated by the stream), and the leader loop continues from its
//! loop key (a fresh start when there is none). Tool calls the loop re-executes are
//! idempotent by call key (see [`crate::tools`]).
//!
//! Parts: `drive` (the loop on the engine, through its approval pauses),
//! `transition` (the state changes), `checkpoint` (the loop's state
//! as stored: what the model is shown), `resume` (rebuilding a left job),
//! `relay` (the loop's events into the journal), `end`
//! (how the loop ended); the loop's approval pauses are in
//! [`crate::approvals`], its prompt in `prompt`.

mod checkpoint;
mod drive;
mod end;
mod ownership;
mod relay;
mod resume;
mod transition;

use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::v1;
use mtswarm_telemetry::metrics::metrics;
use tokio::sync::watch;
use tracing::Instrument as _;

use self::drive::drive;
use self::end::JobEnd;
use self::transition::now;
use crate::host::JobHost;
use crate::job::{JobContext, PendingStart, RunnerHandle};
use crate::validate::Attachment;

pub(crate) use self::ownership::{guard_ownership, standby, take_unowned, watch_cancellations};
pub(crate) use self::resume::resume_job;
pub(crate) use self::transition::is_final;
pub(crate) use self::transition::transition;

/// Characters of the model's final answer kept in the job record (the
/// record is one KV value; the outcome carries what was achieved).
const MAX_FINAL_ANSWER_CHARS: usize = 32 * 1024;

/// How long a job's end waits for results accepted but still being
/// recorded and journaled (a few KV and stream writes).
const RECORDING_WAIT: Duration = Duration::from_secs(5);

/// Starts the runner of an admitted job inside its span (the caller took a
/// run slot from the scheduler).
pub(crate) fn start(host: Arc<JobHost>, pending: PendingStart) {
    let PendingStart {
        context,
        attachments,
        span,
        resume_state,
    } = pending;
    let (cancel_tx, cancel_rx) = watch::channel(None);
    let (done_tx, done_rx) = watch::channel(false);
    let job_id = context.job_id.clone();
    host.tables.contexts.insert(job_id.clone(), context.clone());
    let task_host = host.clone();
    // Registered before the task starts, so the task's removal at its end
    // cannot precede the insertion.
    let (start_tx, start_rx) = tokio::sync::oneshot::channel::<()>();
    let slot_returned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let task_slot = slot_returned.clone();
    let task = tokio::spawn(
        async move {
            let _ = start_rx.await;
            run(
                task_host.clone(),
                context,
                attachments,
                resume_state,
                cancel_rx,
            )
            .await;
            done_tx.send_replace(true);
            if !task_slot.swap(true, std::sync::atomic::Ordering::AcqRel)
                && let Some(next) = task_host.tables.scheduler.finished()
            {
                start(task_host, next);
            }
        }
        .instrument(span),
    );
    host.tables.runners.insert(
        job_id,
        RunnerHandle::new(cancel_tx, done_rx, task, slot_returned),
    );
    let _ = start_tx.send(());
}

/// The job's run: RUNNING, the leader's loop, the confirmation of its best,
/// its outcome and its final state; then the job leaves this leader.
async fn run(
    host: Arc<JobHost>,
    context: Arc<JobContext>,
    attachments: Vec<Attachment>,
    resume_state: Option<String>,
    mut cancel: watch::Receiver<Option<String>>,
) {
    let job_id = context.job_id.clone();
    let record = mark_running(&host, &context).await;
    if record.as_ref().is_some_and(|r| is_final(r.state())) {
        // Cancelled while it waited in the queue.
        host.forget_job(&job_id).await;
        return;
    }
    let started = std::time::Instant::now();
    let mut end = drive(&host, &context, &attachments, resume_state, &mut cancel).await;
    end.usage.wall_seconds = started.elapsed().as_secs_f64();
    if !context.results.wait_recorded(RECORDING_WAIT).await {
        tracing::warn!(%job_id, "a result still being recorded as the job ended; its task counts as cancelled");
    }
    let outcome = conclude(&host, &context, &mut end, &mut cancel).await;
    if end.state == v1::JobState::Failed {
        // The runner's task runs inside the job's workflow span.
        crate::spans::record_failure(&tracing::Span::current(), "job_failed", &end.error);
    }
    let state = end.state;
    record_end(&host, &context, &end, &outcome).await;
    if let Err(error) = context.fence.check("the job's end") {
        // Another leader owns the job now and finishes it; the ownership
        // guard (`ownership.rs`) clears it from this leader.
        tracing::warn!(job_id, %error, "job's end not recorded here: this leader lost the job");
        return;
    }
    tracing::info!(job_id, state = state.as_str_name(), "job finished");
    host.forget_job(&job_id).await;
}

/// Marks the job RUNNING unless it is already (a resumed job); the record
/// as written, `None` when it was RUNNING or could not be written.
async fn mark_running(host: &JobHost, context: &JobContext) -> Option<v1::JobRecord> {
    let job_id = &context.job_id;
    let current = match host.stores.jobs.get(job_id).await {
        Ok(Some(record)) => Some(record.value.state()),
        _ => None,
    };
    if current == Some(v1::JobState::Running) {
        tracing::info!(job_id, "leader loop resumed");
        return None;
    }
    transition(
        host,
        job_id,
        Some(&context.fence),
        v1::JobState::Running,
        "leader loop started",
        |r| {
            r.started_at = Some(now());
        },
    )
    .await
}

/// The job's outcome once its loop ended: its best confirmed elsewhere
/// (`crate::confirm`) when it answered, its agents cancelled, its records
/// read into the outcome with the costs, and the end settled by it.
async fn conclude(
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    end: &mut JobEnd,
    cancel: &mut watch::Receiver<Option<String>>,
) -> v1::JobOutcome {
    // An answered job's best is measured again on another worker before it
    // is the job's, while the job's agents still run.
    let confirmed = if end.state == v1::JobState::Succeeded {
        crate::confirm::confirm(host, context, cancel).await
    } else {
        crate::confirm::Confirmed::default()
    };
    // Cancelled while its best was being confirmed: cancellation wins.
    let cancelled_meanwhile = cancel.borrow().clone();
    if end.state == v1::JobState::Succeeded
        && let Some(reason) = cancelled_meanwhile
    {
        end.state = v1::JobState::Cancelled;
        end.error = reason;
    }
    host.placement
        .cancel_all_agents(
            context,
            match end.state {
                v1::JobState::Cancelled => "job cancelled",
                _ => "job finished",
            },
        )
        .await;
    let mut outcome = crate::outcome::compute_excluding(
        &host.stores,
        &host.keys,
        context,
        &crate::confirm::confirmation_tasks(context),
        &confirmed.disputed,
    )
    .await;
    confirmed.apply(&mut outcome);
    let (agent_costs, total_cost) =
        crate::cost::job_costs(&context.results.snapshot(), &end.usage, &host.config.prices);
    for cost in agent_costs.iter().filter(|c| c.estimated_cost > 0.0) {
        metrics().model_cost(&cost.model, cost.estimated_cost);
    }
    outcome.agent_costs = agent_costs;
    outcome.total_cost = Some(total_cost);
    end.settle(&outcome);
    outcome
}

/// Writes the job's final state with its answer, outcome and usage.
async fn record_end(host: &JobHost, context: &JobContext, end: &JobEnd, outcome: &v1::JobOutcome) {
    let reason = match end.state {
        v1::JobState::Succeeded => "leader answered".to_string(),
        v1::JobState::Cancelled => format!("cancelled: {}", end.error),
        _ => format!("failed: {}", end.error),
    };
    transition(
        host,
        &context.job_id,
        Some(&context.fence),
        end.state,
        &reason,
        |record| {
            record.finished_at = Some(now());
            record.summary = end.summary.clone();
            record.result_json = end.result_json.clone();
            record.final_answer = end
                .final_answer
                .chars()
                .take(MAX_FINAL_ANSWER_CHARS)
                .collect();
            record.outcome = Some(outcome.clone());
            record.error = end.error.clone();
            let usage = record.usage.get_or_insert_with(Default::default);
            usage.steps = usage.steps.saturating_add(end.usage.steps);
            usage.prompt_tokens = usage.prompt_tokens.saturating_add(end.usage.prompt_tokens);
            usage.completion_tokens = usage
                .completion_tokens
                .saturating_add(end.usage.completion_tokens);
            usage.wall_seconds = end.usage.wall_seconds;
        },
    )
    .await;
}
