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
//! Parts: `transition` (the state changes), `checkpoint` (the loop's state
//! as stored: what the model is shown), `resume` (rebuilding a left job),
//! `relay` (the loop's events onto the bus and into the journal), `end`
//! (how the loop ended); the loop's approval pauses are in
//! [`crate::approvals`], its prompt in `prompt`.

mod checkpoint;
mod end;
mod ownership;
mod relay;
mod resume;
mod transition;

use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::v1;
use mtswarm_core::{
    Engine, EngineConfig, LocalResourceLock, LoopState, Node, Outcome, RiskPolicy, RunEnd,
    StopReason, TracingMiddleware,
};
use mtswarm_telemetry::metrics::metrics;
use tokio::sync::watch;
use tracing::Instrument as _;

use self::checkpoint::JobCheckpointSink;
use self::end::{JobEnd, final_answer, usage_of};
use self::relay::pump;
use self::transition::now;
use crate::approvals::leader_wait::{Decisions, await_decisions};
use crate::job::{JobContext, PendingStart, RunnerHandle};
use crate::shared::Shared;
use crate::validate::Attachment;

pub(crate) use self::ownership::{guard_ownership, standby, take_unowned, watch_cancellations};
pub use self::relay::agent_event;
pub(crate) use self::resume::resume_job;
pub use self::transition::is_final;
pub(crate) use self::transition::transition;
pub use crate::ids::{LEADER_AGENT_ID, leader_session_id};

/// Characters of the model's final answer kept in the job record (the
/// record is one KV value; the outcome carries what was achieved).
const MAX_FINAL_ANSWER_CHARS: usize = 32 * 1024;

/// How long a job's end waits for results accepted but still being
/// recorded and journaled (a few KV and stream writes).
const RECORDING_WAIT: Duration = Duration::from_secs(5);

/// Starts the runner of an admitted job inside its span (the caller took a
/// run slot from the scheduler).
pub(crate) fn start(shared: Arc<Shared>, pending: PendingStart) {
    let PendingStart {
        context,
        attachments,
        span,
        resume_state,
    } = pending;
    let (cancel_tx, cancel_rx) = watch::channel(None);
    let (done_tx, done_rx) = watch::channel(false);
    let job_id = context.job_id.clone();
    shared.contexts.insert(job_id.clone(), context.clone());
    let task_shared = shared.clone();
    // Registered before the task starts, so the task's removal at its end
    // cannot precede the insertion.
    let (start_tx, start_rx) = tokio::sync::oneshot::channel::<()>();
    let slot_returned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let task_slot = slot_returned.clone();
    let task = tokio::spawn(
        async move {
            let _ = start_rx.await;
            run(
                task_shared.clone(),
                context,
                attachments,
                resume_state,
                cancel_rx,
            )
            .await;
            done_tx.send_replace(true);
            if !task_slot.swap(true, std::sync::atomic::Ordering::AcqRel)
                && let Some(next) = task_shared.scheduler.finished()
            {
                start(task_shared, next);
            }
        }
        .instrument(span),
    );
    shared.runners.insert(
        job_id,
        RunnerHandle::new(cancel_tx, done_rx, task, slot_returned),
    );
    let _ = start_tx.send(());
}

async fn run(
    shared: Arc<Shared>,
    context: Arc<JobContext>,
    attachments: Vec<Attachment>,
    resume_state: Option<String>,
    mut cancel: watch::Receiver<Option<String>>,
) {
    let job_id = context.job_id.clone();
    let current = match shared.jobs.get(&job_id).await {
        Ok(Some(record)) => Some(record.value.state()),
        _ => None,
    };
    let record = if current == Some(v1::JobState::Running) {
        tracing::info!(job_id, "leader loop resumed");
        None
    } else {
        transition(
            &shared,
            &job_id,
            Some(&context.fence),
            v1::JobState::Running,
            "leader loop started",
            |r| {
                r.started_at = Some(now());
            },
        )
        .await
    };
    if record.as_ref().is_some_and(|r| is_final(r.state())) {
        // Cancelled while it waited in the queue.
        shared.runners.remove(&job_id);
        shared.contexts.remove(&job_id);
        shared.results.remove(&job_id);
        shared.release_ownership(&job_id).await;
        return;
    }
    let started = std::time::Instant::now();
    let mut end = drive(&shared, &context, &attachments, resume_state, &mut cancel).await;
    end.usage.wall_seconds = started.elapsed().as_secs_f64();
    if !context.results.wait_recorded(RECORDING_WAIT).await {
        tracing::warn!(%job_id, "a result still being recorded as the job ended; its task counts as cancelled");
    }
    // An answered job's best is measured again on another worker before it
    // is the job's (`crate::confirm`), while the job's agents still run.
    let confirmed = if end.state == v1::JobState::Succeeded {
        crate::confirm::confirm(&shared, &context, &mut cancel).await
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
    crate::placement::cancel_all_agents(
        &shared,
        &context,
        match end.state {
            v1::JobState::Cancelled => "job cancelled",
            _ => "job finished",
        },
    )
    .await;
    let mut outcome = crate::outcome::compute_excluding(
        &shared,
        &context,
        &crate::confirm::confirmation_tasks(&context),
        &confirmed.disputed,
    )
    .await;
    confirmed.apply(&mut outcome);
    let (agent_costs, total_cost) = crate::cost::job_costs(
        &context.results.snapshot(),
        &end.usage,
        &shared.config.prices,
    );
    for cost in agent_costs.iter().filter(|c| c.estimated_cost > 0.0) {
        metrics().model_cost(&cost.model, cost.estimated_cost);
    }
    outcome.agent_costs = agent_costs;
    outcome.total_cost = Some(total_cost);
    end.settle(&outcome);
    if end.state == v1::JobState::Failed {
        // The runner's task runs inside the job's workflow span.
        crate::spans::record_failure(&tracing::Span::current(), "job_failed", &end.error);
    }
    let reason = match end.state {
        v1::JobState::Succeeded => "leader answered".to_string(),
        v1::JobState::Cancelled => format!("cancelled: {}", end.error),
        _ => format!("failed: {}", end.error),
    };
    let state = end.state;
    transition(
        &shared,
        &job_id,
        Some(&context.fence),
        state,
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
    if let Err(error) = context.fence.check("the job's end") {
        // Another leader owns the job now and finishes it; the ownership
        // guard (`ownership.rs`) clears it from this leader.
        tracing::warn!(job_id, %error, "job's end not recorded here: this leader lost the job");
        return;
    }
    tracing::info!(job_id, state = state.as_str_name(), "job finished");
    shared.runners.remove(&job_id);
    shared.contexts.remove(&job_id);
    shared.results.remove(&job_id);
    shared.release_ownership(&job_id).await;
}

fn engine_config(shared: &Shared, spec: &v1::JobSpec) -> EngineConfig {
    let budgets = spec.budgets.unwrap_or_default();
    let mut config = EngineConfig {
        max_steps: if budgets.max_steps > 0 {
            budgets.max_steps
        } else {
            shared.config.default_max_steps
        },
        token_budget: (budgets.max_tokens > 0).then_some(budgets.max_tokens),
        wall_time: (budgets.wall_time_seconds > 0)
            .then(|| Duration::from_secs(budgets.wall_time_seconds)),
        ..EngineConfig::default()
    };
    config.injection.placement = shared.config.context_placement;
    // The leader reads whole result tables; keep more of each for the model.
    config.context.max_tool_result_chars = config.context.max_tool_result_chars.max(16_000);
    if let Some(model) = &spec.model {
        config.temperature = model.temperature.map(|t| t as f32);
        config.max_output_tokens = (model.max_output_tokens > 0).then_some(model.max_output_tokens);
    }
    config
}

async fn drive(
    shared: &Arc<Shared>,
    context: &Arc<JobContext>,
    attachments: &[Attachment],
    resume_state: Option<String>,
    cancel: &mut watch::Receiver<Option<String>>,
) -> JobEnd {
    let spec = &context.spec;
    let model = match (shared.model_factory)(spec) {
        Ok(model) => model,
        Err(error) => return JobEnd::failed(format!("leader model: {error}")),
    };
    let span = crate::spans::leader_agent_span(
        &context.job_id,
        &leader_session_id(&context.job_id),
        model.provider_name(),
        model.model_name(),
    );
    let model_name = model.model_name().to_string();
    let mut end = drive_engine(shared, context, attachments, resume_state, cancel, model)
        .instrument(span.clone())
        .await;
    // The outcome prices the loop's tokens by the model that produced them.
    end.usage.model = model_name;
    if end.state == v1::JobState::Failed {
        crate::spans::record_failure(&span, "leader_loop_failed", &end.error);
    }
    end
}

/// The leader's loop on `model` until the job's end.
async fn drive_engine(
    shared: &Arc<Shared>,
    context: &Arc<JobContext>,
    attachments: &[Attachment],
    resume_state: Option<String>,
    cancel: &mut watch::Receiver<Option<String>>,
    model: Arc<dyn mtswarm_core::ChatModel>,
) -> JobEnd {
    let spec = &context.spec;
    let config = engine_config(shared, spec);
    let max_tool_result_chars = config.context.max_tool_result_chars;
    let engine = Engine::new(
        config,
        model,
        crate::tools::registry(shared.clone(), context.clone()),
        RiskPolicy::default().with_auto_approve(if spec.auto_approve {
            mtswarm_core::AutoApprove::All
        } else {
            shared.config.auto_approve
        }),
        Arc::new(LocalResourceLock::default()),
    )
    .with_middleware(Arc::new(TracingMiddleware::with_message_content(
        mtswarm_telemetry::capture_message_content(),
    )))
    .with_middleware(Arc::new(mtswarm_llm::MetricsMiddleware::new()))
    .with_gate(Arc::new(crate::grounding::GroundedAnswerGate::new(
        context.results.clone(),
    )))
    .with_checkpoint_sink(Arc::new(JobCheckpointSink {
        shared: shared.clone(),
        job_id: context.job_id.clone(),
        max_tool_result_chars,
        fence: context.fence.clone(),
    }));
    let session_id = leader_session_id(&context.job_id);
    let (mut events, mut handle) = match resume_state {
        None => {
            let system = crate::prompt::system_prompt(shared, context).await;
            let input = crate::prompt::user_input(shared, context, attachments);
            engine.start(session_id.clone(), system, input)
        }
        Some(json) => {
            let state = match LoopState::from_json(&json) {
                Ok(state) => state,
                Err(error) => {
                    return JobEnd::failed(format!("leader checkpoint is not readable: {error}"));
                }
            };
            if state.node() == Node::Done {
                // The loop had ended before the restart; only its end was
                // not recorded.
                return match state.end() {
                    Some(RunEnd::Final { text, .. }) => final_answer(text, &state),
                    Some(RunEnd::Stopped { reason, message }) => {
                        let mut end =
                            JobEnd::failed(format!("leader loop stopped ({reason:?}): {message}"));
                        if *reason == StopReason::Cancelled {
                            end.state = v1::JobState::Cancelled;
                        }
                        end
                    }
                    None => JobEnd::failed("leader loop ended without an outcome"),
                };
            }
            match engine.resume(state) {
                Ok(run) => run,
                Err(error) => return JobEnd::failed(format!("leader loop not resumed: {error}")),
            }
        }
    };
    loop {
        let cancelled = pump(shared, context, &session_id, &mut events, &handle, cancel).await;
        let outcome = handle.outcome().await;
        if let Some(reason) = cancelled {
            let mut end = JobEnd::failed(reason);
            end.state = v1::JobState::Cancelled;
            if let Ok(outcome) = &outcome {
                end.usage = usage_of(outcome.state());
            }
            return end;
        }
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => return JobEnd::failed(format!("leader loop: {error}")),
        };
        match outcome {
            Outcome::Final { text, state, .. } => return final_answer(&text, &state),
            Outcome::Stopped {
                reason,
                message,
                state,
            } => {
                let mut end =
                    JobEnd::failed(format!("leader loop stopped ({reason:?}): {message}"));
                if reason == StopReason::Cancelled {
                    end.state = v1::JobState::Cancelled;
                }
                end.usage = usage_of(&state);
                return end;
            }
            Outcome::Paused {
                checkpoint,
                approvals,
            } => {
                let resumed = match await_decisions(
                    shared,
                    context,
                    &session_id,
                    &approvals,
                    engine.config().approval.timeout,
                    cancel,
                )
                .await
                {
                    Decisions::Decided(decisions) => {
                        engine.resume_with_decisions(checkpoint, decisions)
                    }
                    Decisions::Cancelled(reason) => {
                        let mut end = JobEnd::failed(reason);
                        end.state = v1::JobState::Cancelled;
                        return end;
                    }
                    Decisions::Failed(error) => return JobEnd::failed(error),
                };
                match resumed {
                    Ok((next_events, next_handle)) => {
                        events = next_events;
                        handle = next_handle;
                    }
                    Err(error) => {
                        return JobEnd::failed(format!("leader loop not resumed: {error}"));
                    }
                }
            }
        }
    }
}
