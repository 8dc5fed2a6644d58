//! The leader's loop on the engine: the engine a job runs on (its budgets,
//! the leader tools, the middleware, the completion gate and the job's
//! checkpoint sink), started fresh or resumed from the job's loop key, and
//! driven through its approval pauses until it ends ([`JobEnd`]).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::v1;
use mtswarm_core::{
    ApprovalRequest, ChatModel, Engine, EngineConfig, LocalResourceLock, LoopState, Node, Outcome,
    RiskPolicy, Role, RunEnd, RunHandle, RunStream, StopReason, TracingMiddleware,
};
use mtswarm_policy::BuiltinLeaderPolicy;
use tokio::sync::watch;
use tracing::Instrument as _;

use super::checkpoint::JobCheckpointSink;
use super::end::{JobEnd, final_answer, refused_summary, usage_of};
use super::relay::pump;
use crate::approvals::leader_wait::{Decisions, await_decisions};
use crate::grounding::{GroundedAnswerGate, MAX_ANSWER_REFUSALS};
use crate::host::JobHost;
use crate::ids::leader_session_id;
use crate::job::JobContext;
use crate::validate::Attachment;

/// A run of the loop: its events and its handle.
type Run = (RunStream, RunHandle);

/// The leader's loop for the job on the job's model, inside the
/// `invoke_agent leader` span, until its end.
pub(super) async fn drive(
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    attachments: &[Attachment],
    resume_state: Option<String>,
    cancel: &mut watch::Receiver<Option<String>>,
) -> JobEnd {
    let spec = &context.spec;
    let model = match (host.model_factory)(spec) {
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
    let mut end = drive_engine(host, context, attachments, resume_state, cancel, model)
        .instrument(span.clone())
        .await;
    // The outcome prices the loop's tokens by the model that produced them.
    end.usage.model = model_name;
    if end.state == v1::JobState::Failed {
        crate::spans::record_failure(&span, "leader_loop_failed", &end.error);
    }
    end
}

/// The leader's loop on `model` until the job's end: started or resumed,
/// then each run pumped until it ends, pauses for approvals resumed with
/// their decisions.
async fn drive_engine(
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    attachments: &[Attachment],
    resume_state: Option<String>,
    cancel: &mut watch::Receiver<Option<String>>,
    model: Arc<dyn ChatModel>,
) -> JobEnd {
    let engine = build_engine(host, context, model);
    let session_id = leader_session_id(&context.job_id);
    let launched = match resume_state {
        None => ControlFlow::Continue(start_fresh(&engine, host, context, attachments).await),
        Some(json) => resume_from(&engine, &json),
    };
    let (mut events, mut handle) = match launched {
        ControlFlow::Continue(run) => run,
        ControlFlow::Break(end) => return end,
    };
    loop {
        let cancelled = pump(
            &host.stores,
            context,
            &session_id,
            &mut events,
            &handle,
            cancel,
        )
        .await;
        let outcome = handle.outcome().await;
        if let Some(reason) = cancelled {
            let mut end = JobEnd::cancelled(reason);
            if let Ok(outcome) = &outcome {
                end.usage = usage_of(outcome.state());
            }
            return end;
        }
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => return JobEnd::failed(format!("leader loop: {error}")),
        };
        let (checkpoint, approvals) = match outcome {
            Outcome::Final { text, state, .. } => return final_answer(&text, &state),
            Outcome::Stopped {
                reason,
                message,
                state,
            } => {
                let mut end = stopped(&reason, &message, &state);
                end.usage = usage_of(&state);
                return end;
            }
            Outcome::Paused {
                checkpoint,
                approvals,
            } => (checkpoint, approvals),
        };
        let decided = decide_and_resume(
            &engine,
            host,
            context,
            &session_id,
            checkpoint,
            &approvals,
            cancel,
        );
        (events, handle) = match decided.await {
            ControlFlow::Continue(run) => run,
            ControlFlow::Break(end) => return end,
        };
    }
}

/// The engine of the job's loop: its configuration, the leader tools, the
/// risk policy, tracing and metrics middleware, the leader's completion
/// gate (pushing back on early answers of every model but the builtin
/// policy) and the job's checkpoint sink.
fn build_engine(
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    model: Arc<dyn ChatModel>,
) -> Engine {
    let spec = &context.spec;
    let config = engine_config(host, spec);
    let max_tool_result_chars = config.context.max_tool_result_chars;
    // The builtin policy answers early only when it cannot go on (no free
    // slice, nothing spawned): pushing back would only repeat its answer.
    let mut gate = GroundedAnswerGate::new(context.results.clone());
    if model.model_name() != BuiltinLeaderPolicy::MODEL_NAME {
        let job = Arc::downgrade(context);
        gate = gate
            .with_push_back(context.deadline)
            .with_agents(Arc::new(move || {
                job.upgrade()
                    .map(|job| job.agents().keys().cloned().collect())
                    .unwrap_or_default()
            }));
    }
    Engine::new(
        config,
        model,
        crate::tools::registry(host.tool_handles(), context.clone()),
        RiskPolicy::default().with_auto_approve(if spec.auto_approve {
            mtswarm_core::AutoApprove::All
        } else {
            host.config.auto_approve
        }),
        Arc::new(LocalResourceLock::default()),
    )
    .with_middleware(Arc::new(TracingMiddleware::with_message_content(
        mtswarm_telemetry::capture_message_content(),
    )))
    .with_middleware(Arc::new(mtswarm_llm::MetricsMiddleware::new()))
    .with_gate(Arc::new(gate))
    .with_checkpoint_sink(Arc::new(JobCheckpointSink {
        jobs: host.stores.jobs.clone(),
        job_id: context.job_id.clone(),
        max_tool_result_chars,
        fence: context.fence.clone(),
    }))
}

fn engine_config(host: &JobHost, spec: &v1::JobSpec) -> EngineConfig {
    let budgets = spec.budgets.unwrap_or_default();
    let mut config = EngineConfig {
        max_steps: if budgets.max_steps > 0 {
            budgets.max_steps
        } else {
            host.config.default_max_steps
        },
        token_budget: (budgets.max_tokens > 0).then_some(budgets.max_tokens),
        wall_time: (budgets.wall_time_seconds > 0)
            .then(|| Duration::from_secs(budgets.wall_time_seconds)),
        ..EngineConfig::default()
    };
    config.injection.placement = host.config.context_placement;
    config.gate.max_blocks = MAX_ANSWER_REFUSALS;
    // The leader reads whole result tables; keep more of each for the model.
    config.context.max_tool_result_chars = config.context.max_tool_result_chars.max(16_000);
    if let Some(model) = &spec.model {
        config.temperature = model.temperature.map(|t| t as f32);
        config.max_output_tokens = (model.max_output_tokens > 0).then_some(model.max_output_tokens);
    }
    config
}

/// A new loop: the system prompt and the job's input.
async fn start_fresh(
    engine: &Engine,
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    attachments: &[Attachment],
) -> Run {
    let system = crate::prompt::system_prompt(&host.placement, context).await;
    let input =
        crate::prompt::user_input(host.config.default_collect_timeout, context, attachments);
    engine.start(leader_session_id(&context.job_id), system, input)
}

/// The loop continued from the job's loop key; the job's end instead when
/// the checkpoint is not readable or the loop had ended already.
fn resume_from(engine: &Engine, json: &str) -> ControlFlow<JobEnd, Run> {
    let state = match LoopState::from_json(json) {
        Ok(state) => state,
        Err(error) => {
            return ControlFlow::Break(JobEnd::failed(format!(
                "leader checkpoint is not readable: {error}"
            )));
        }
    };
    if state.node() == Node::Done {
        // The loop had ended before the restart; only its end was not
        // recorded.
        return ControlFlow::Break(match state.end() {
            Some(RunEnd::Final { text, .. }) => final_answer(text, &state),
            Some(RunEnd::Stopped { reason, message }) => stopped(reason, message, &state),
            None => JobEnd::failed("leader loop ended without an outcome"),
        });
    }
    match engine.resume(state) {
        Ok(run) => ControlFlow::Continue(run),
        Err(error) => {
            ControlFlow::Break(JobEnd::failed(format!("leader loop not resumed: {error}")))
        }
    }
}

/// A loop that stopped without an answer: failed, or cancelled. One whose
/// answers were refused until the refusals were spent says so in its
/// summary and keeps the last refused answer.
fn stopped(reason: &StopReason, message: &str, state: &LoopState) -> JobEnd {
    let mut end = JobEnd::failed(format!("leader loop stopped ({reason:?}): {message}"));
    match reason {
        StopReason::Cancelled => end.state = v1::JobState::Cancelled,
        StopReason::CompletionGateFailed => {
            end.summary = refused_summary(message);
            end.final_answer = state
                .history()
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
                .map(|m| m.content.clone())
                .unwrap_or_default();
        }
        _ => {}
    }
    end
}

/// Waits for the decisions of a paused loop's approvals (through the
/// approval broker) and resumes the loop with them; the job's end instead
/// when the job is cancelled meanwhile or the wait fails.
async fn decide_and_resume(
    engine: &Engine,
    host: &Arc<JobHost>,
    context: &Arc<JobContext>,
    session_id: &str,
    checkpoint: LoopState,
    approvals: &[ApprovalRequest],
    cancel: &mut watch::Receiver<Option<String>>,
) -> ControlFlow<JobEnd, Run> {
    let decided = await_decisions(
        &host.stores,
        &host.keys,
        context,
        session_id,
        approvals,
        engine.config().approval.timeout,
        cancel,
    )
    .await;
    let resumed = match decided {
        Decisions::Decided(decisions) => engine.resume_with_decisions(checkpoint, decisions),
        Decisions::Cancelled(reason) => return ControlFlow::Break(JobEnd::cancelled(reason)),
        Decisions::Failed(error) => return ControlFlow::Break(JobEnd::failed(error)),
    };
    match resumed {
        Ok(run) => ControlFlow::Continue(run),
        Err(error) => {
            ControlFlow::Break(JobEnd::failed(format!("leader loop not resumed: {error}")))
        }
    }
}
