//! The job runner: one task per job that drives the leader's ReAct loop on
//! the shared engine with the leader tools, publishes the loop's events as
//! the leader agent's events, checkpoints the loop into the JobRecord after
//! every step, routes the loop's own approval pauses through the approval
//! broker, and records the job's final state.
//!
//! State machine of a job: QUEUED (stored by SubmitJob) -> RUNNING (runner
//! started) -> SUCCEEDED | FAILED | CANCELLED. Every change is written to the
//! jobs KV first and then journaled as a `JobStateChange`.
//!
//! A leader that starts finds the jobs a previous leader left QUEUED or
//! RUNNING and resumes them (`resume_job`): the job context is rebuilt
//! from `JobRecord.agents` and `JobRecord.tasks` (each task at its recorded
//! attempt, done or not), the job's results are replayed from the results
//! stream into its table (accepting each task's result once), assignments
//! recorded but never confirmed published are published again (deduplicated
//! by the stream), and the leader loop continues from `leader_state_json`
//! (a fresh start when empty). Tool calls the loop re-executes are
//! idempotent by call key (see [`crate::tools`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use mtswarm_bus::v1;
use mtswarm_core::{
    ApprovalDecision, CheckpointSink, Engine, EngineConfig, Event, EventKind, LocalResourceLock,
    LoopState, Node, Outcome, RiskPolicy, RunEnd, RunHandle, RunStream, StopReason,
    TracingMiddleware,
};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::Instrument as _;

use crate::shared::Shared;
use crate::tools::{self, AgentEntry, JobContext};
use crate::validate::Attachment;

/// Characters of the model's final answer kept in the job record (the
/// record is one KV value; the outcome carries what was achieved).
const MAX_FINAL_ANSWER_CHARS: usize = 32 * 1024;

/// Agent id of the leader's own loop in events, approvals and sessions.
pub const LEADER_AGENT_ID: &str = "leader";

/// A job admitted to run (now or when a slot frees): everything its runner
/// needs.
pub(crate) struct PendingStart {
    pub context: Arc<JobContext>,
    pub attachments: Vec<Attachment>,
    /// The `leader.job` span the runner runs in.
    pub span: tracing::Span,
    /// The leader loop's checkpoint to continue from (resumed jobs).
    pub resume_state: Option<String>,
}

impl crate::scheduler::Pending for PendingStart {
    fn job_id(&self) -> &str {
        &self.context.job_id
    }
}

/// A running job's runner, as the job manager holds it.
pub(crate) struct RunnerHandle {
    cancel: watch::Sender<Option<String>>,
    done: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl RunnerHandle {
    /// Asks the runner to cancel the loop and the agents.
    pub fn cancel(&self, reason: &str) {
        self.cancel.send_replace(Some(reason.to_string()));
    }

    /// Becomes true once the runner recorded the job's final state.
    pub fn done(&self) -> watch::Receiver<bool> {
        self.done.clone()
    }

    /// Stops the runner without recording a final state (daemon shutdown:
    /// the job stays RUNNING with its last checkpoint).
    pub fn abort(&self) {
        self.task.abort();
    }
}

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

/// True for SUCCEEDED, FAILED and CANCELLED.
pub fn is_final(state: v1::JobState) -> bool {
    matches!(
        state,
        v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
    )
}

/// Writes a state change to the job record (applying `change` too) and
/// journals it. The journal entry follows the KV write so a watcher that
/// sees a final state can rely on the record.
pub(crate) async fn transition(
    shared: &Shared,
    job_id: &str,
    current: v1::JobState,
    reason: &str,
    mut change: impl FnMut(&mut v1::JobRecord),
) -> Option<v1::JobRecord> {
    let mut previous = v1::JobState::Unspecified;
    // A state change must not be lost to a NATS restart: retry with backoff
    // (bounded, and not past the daemon's shutdown).
    let mut backoff = Duration::from_millis(100);
    let give_up = tokio::time::Instant::now() + Duration::from_secs(120);
    let written = loop {
        let written = shared
            .jobs
            .modify(job_id, |record| {
                previous = record.state();
                if is_final(previous) {
                    return;
                }
                record.state = current as i32;
                record.updated_at = Some(now());
                change(record);
            })
            .await;
        match written {
            Err(error)
                if !matches!(error, mtswarm_bus::BusError::NotFound { .. })
                    && tokio::time::Instant::now() < give_up
                    && !*shared.shutdown.borrow() =>
            {
                tracing::warn!(%error, job_id, "job state not written yet; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            other => break other,
        }
    };
    let record = match written {
        Ok(versioned) => versioned.value,
        Err(error) => {
            tracing::error!(%error, job_id, state = current.as_str_name(), "job state not written");
            return None;
        }
    };
    if is_final(previous) {
        return Some(record);
    }
    let event = v1::job_event::Event::StateChange(v1::JobStateChange {
        previous: previous as i32,
        current: current as i32,
        reason: reason.to_string(),
        outcome: record.outcome.clone().filter(|_| is_final(current)),
    });
    if let Err(error) = shared.journal.append_confirmed(job_id, event).await {
        tracing::warn!(%error, job_id, "state change not journaled");
    }
    Some(record)
}

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
            if let Some(next) = task_shared.scheduler.finished() {
                start(task_shared, next);
            }
        }
        .instrument(span),
    );
    shared.runners.insert(
        job_id,
        RunnerHandle {
            cancel: cancel_tx,
            done: done_rx,
            task,
        },
    );
    let _ = start_tx.send(());
}

fn deadline_of(shared: &Shared, record: &v1::JobRecord) -> SystemTime {
    let budgets = record
        .spec
        .as_ref()
        .and_then(|s| s.budgets)
        .unwrap_or_default();
    let since = record
        .started_at
        .or(record.created_at)
        .and_then(|t| SystemTime::try_from(t).ok())
        .unwrap_or_else(SystemTime::now);
    since
        + if budgets.wall_time_seconds > 0 {
            Duration::from_secs(budgets.wall_time_seconds)
        } else {
            shared.config.default_task_deadline
        }
}

/// Rebuilds a QUEUED or RUNNING job a previous leader left behind (see the
/// module docs). The job's table is registered before its results are
/// replayed, so results arriving meanwhile reach it through the live
/// consumer or the replay, once.
pub(crate) async fn resume_job(
    shared: &Arc<Shared>,
    record: v1::JobRecord,
) -> Result<PendingStart, String> {
    let job_id = record.job_id.clone();
    let validated = crate::validate::validate_submit(
        record.spec.as_ref(),
        &shared.kernel_root,
        &shared.config.limits,
    )
    .map_err(|e| format!("the job's spec is no longer valid here: {e}"))?;
    let context = Arc::new(JobContext::new(
        job_id.clone(),
        validated.spec,
        validated.kernel_dir,
        shared.clone(),
        deadline_of(shared, &record),
    ));
    for placement in &record.agents {
        let agent = AgentEntry::from_placement(placement);
        if !agent.cancelled {
            shared
                .claimed_slices
                .insert(agent.slice_id.clone(), agent.session_id.clone());
        }
        context.agents().insert(agent.agent_id.clone(), agent);
    }
    for task in &record.tasks {
        let Some(assignment) = &task.assignment else {
            continue;
        };
        context.results.register_recorded(
            &assignment.task_id,
            &assignment.agent_id,
            assignment.attempt,
            task.done,
        );
        context
            .tasks()
            .insert(assignment.task_id.clone(), task.clone());
    }
    let mut attempts = 0;
    loop {
        match crate::results::replay_job_results(shared, &job_id).await {
            Ok(read) => {
                tracing::info!(job_id, read, "job results replayed");
                break;
            }
            Err(error) if attempts < 10 => {
                attempts += 1;
                tracing::warn!(job_id, %error, "job results not replayed yet; retrying");
                tokio::time::sleep(Duration::from_millis(200 * attempts)).await;
            }
            Err(error) => return Err(format!("the job's results could not be replayed: {error}")),
        }
    }
    // Done before the restart but the result is gone from the stream (aged
    // out): the recorded status stands.
    for task_id in context.results.recorded_done_without_result() {
        let status = context
            .tasks()
            .get(&task_id)
            .map(|t| t.status())
            .unwrap_or(v1::TaskStatus::Unspecified);
        context.results.settle(
            &task_id,
            status,
            "result recorded before a leader restart; no longer in the results stream",
        );
    }
    let unconfirmed: Vec<v1::TaskAssignment> = context
        .tasks()
        .values()
        .filter(|t| !t.done)
        .filter_map(|t| t.assignment.clone())
        .filter(|a| a.assigned_at.is_none() && context.results.is_pending(&a.task_id))
        .collect();
    for assignment in unconfirmed {
        if let Err(error) = context.publish_recorded(&assignment).await {
            tracing::warn!(job_id, %error, task_id = %assignment.task_id, "unconfirmed task not published; the sweep retries");
        }
    }
    let span = tracing::info_span!("leader.job", job.id = %job_id, resumed = true);
    if !record.traceparent.is_empty() {
        let parent =
            mtswarm_telemetry::propagation::context_from_traceparent(&record.traceparent, None);
        if let Err(error) = mtswarm_telemetry::propagation::set_parent(&span, parent) {
            tracing::debug!(%error, "resumed job's traceparent not applied");
        }
    }
    let resume_state = String::from_utf8(record.leader_state_json.clone())
        .ok()
        .filter(|s| !s.trim().is_empty());
    Ok(PendingStart {
        context,
        attachments: validated.attachments,
        span,
        resume_state,
    })
}

/// How the leader loop ended.
struct JobEnd {
    state: v1::JobState,
    summary: String,
    result_json: String,
    /// The model's final answer as written (empty when it gave none).
    final_answer: String,
    error: String,
    usage: v1::Usage,
}

impl JobEnd {
    fn failed(error: impl Into<String>) -> Self {
        Self {
            state: v1::JobState::Failed,
            summary: String::new(),
            result_json: String::new(),
            final_answer: String::new(),
            error: error.into(),
            usage: v1::Usage::default(),
        }
    }

    /// Applies the outcome: an answered job without an accepted valid
    /// measurement FAILED with the outcome's reason, whatever the answer
    /// says; with one it SUCCEEDED and its summary is the outcome's.
    fn settle(&mut self, outcome: &v1::JobOutcome) {
        if self.state != v1::JobState::Succeeded {
            return;
        }
        match &outcome.best {
            Some(best) => self.summary = crate::outcome::summary_line(best),
            None => {
                self.state = v1::JobState::Failed;
                self.error = outcome.failure_reason.clone();
            }
        }
    }
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
        return;
    }
    let started = std::time::Instant::now();
    let mut end = drive(&shared, &context, &attachments, resume_state, &mut cancel).await;
    end.usage.wall_seconds = started.elapsed().as_secs_f64();
    context
        .cancel_all_agents(match end.state {
            v1::JobState::Cancelled => "job cancelled",
            _ => "job finished",
        })
        .await;
    let outcome = crate::outcome::compute(&shared, &context).await;
    end.settle(&outcome);
    let reason = match end.state {
        v1::JobState::Succeeded => "leader answered".to_string(),
        v1::JobState::Cancelled => format!("cancelled: {}", end.error),
        _ => format!("failed: {}", end.error),
    };
    let state = end.state;
    transition(&shared, &job_id, state, &reason, |record| {
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
    })
    .await;
    tracing::info!(job_id, state = state.as_str_name(), "job finished");
    shared.runners.remove(&job_id);
    shared.contexts.remove(&job_id);
    shared.results.remove(&job_id);
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
    // The leader reads whole result tables; keep more of each for the model.
    config.context.max_tool_result_chars = config.context.max_tool_result_chars.max(16_000);
    if let Some(model) = &spec.model {
        config.temperature = model.temperature.map(|t| t as f32);
        config.max_output_tokens = (model.max_output_tokens > 0).then_some(model.max_output_tokens);
    }
    config
}

/// Stores the leader loop's state in the job record after every transition.
struct JobCheckpointSink {
    shared: Arc<Shared>,
    job_id: String,
}

#[async_trait::async_trait]
impl CheckpointSink for JobCheckpointSink {
    async fn save(&self, state: &LoopState) -> Result<(), mtswarm_core::CheckpointError> {
        let json = state
            .to_json()
            .map_err(|source| mtswarm_core::CheckpointError::Serialize {
                what: "leader state",
                source,
            })?;
        self.shared
            .jobs
            .modify(&self.job_id, |record| {
                record.leader_state_json = json.clone().into_bytes();
                record.updated_at = Some(now());
            })
            .await
            .map(|_| ())
            .map_err(|e| mtswarm_core::CheckpointError::Store {
                reason: format!("leader checkpoint not stored: {e}"),
            })
    }
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
    let engine = Engine::new(
        engine_config(shared, spec),
        model,
        tools::registry(context.clone()),
        RiskPolicy::default().with_auto_approve(if spec.auto_approve {
            mtswarm_core::AutoApprove::All
        } else {
            shared.config.auto_approve
        }),
        Arc::new(LocalResourceLock::default()),
    )
    .with_middleware(Arc::new(TracingMiddleware))
    .with_gate(Arc::new(crate::grounding::GroundedAnswerGate::new(
        context.results.clone(),
    )))
    .with_checkpoint_sink(Arc::new(JobCheckpointSink {
        shared: shared.clone(),
        job_id: context.job_id.clone(),
    }));
    let session_id = leader_session_id(&context.job_id);
    let (mut events, mut handle) = match resume_state {
        None => {
            let system = system_prompt(shared, context).await;
            let input = user_input(context, attachments);
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

/// Drives the run's events to their end, publishing each; a cancel request
/// stops the run (the stream then ends). Returns the cancel reason, if any.
async fn pump(
    shared: &Shared,
    context: &JobContext,
    session_id: &str,
    events: &mut RunStream,
    handle: &RunHandle,
    cancel: &mut watch::Receiver<Option<String>>,
) -> Option<String> {
    let mut cancelled = cancel.borrow().clone();
    if cancelled.is_some() {
        handle.cancel();
    }
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(event) => publish_event(shared, context, session_id, &event).await,
                None => return cancelled,
            },
            changed = cancel.changed(), if cancelled.is_none() => {
                if changed.is_err() {
                    continue;
                }
                cancelled = cancel.borrow().clone();
                if cancelled.is_some() {
                    handle.cancel();
                }
            }
        }
    }
}

/// `leader-<job_id>`, cut to the id limit.
pub fn leader_session_id(job_id: &str) -> String {
    format!("leader-{job_id}")
        .chars()
        .take(mtswarm_bus::subjects::MAX_ID_LEN)
        .collect()
}

fn usage_of(state: &LoopState) -> v1::Usage {
    let tokens = state.usage();
    v1::Usage {
        steps: state.step(),
        prompt_tokens: tokens.input_tokens,
        completion_tokens: tokens.output_tokens,
        ..Default::default()
    }
}

/// Maps a core engine event to the bus `AgentEvent` of the leader agent.
pub fn agent_event(
    job_id: &str,
    agent_id: &str,
    session_id: &str,
    event: &Event,
) -> v1::AgentEvent {
    use v1::AgentEventKind as K;
    let kind = match &event.kind {
        EventKind::Transition { .. } => K::StateTransition,
        EventKind::Thinking { .. } => K::Thinking,
        EventKind::TextDelta { .. } => K::TextDelta,
        EventKind::ToolCall { .. } => K::ToolCall,
        EventKind::ToolStateUpdate { .. } => K::Log,
        EventKind::ToolResult { .. } => K::ToolResult,
        EventKind::ApprovalRequired { .. } => K::ApprovalRequested,
        EventKind::ContextCompacted { .. } => K::Log,
        EventKind::ReplyEnd { .. } | EventKind::Stopped { .. } => K::SessionFinished,
        EventKind::Error { .. } => K::Error,
    };
    v1::AgentEvent {
        job_id: job_id.to_string(),
        agent_id: agent_id.to_string(),
        session_id: session_id.to_string(),
        // Engine sequence numbers start at 0; bus sequences start at 1.
        sequence: event.seq + 1,
        step: event.step,
        kind: kind as i32,
        payload_json: serde_json::to_string(&event.kind).unwrap_or_default(),
        timestamp: Some(now()),
    }
}

async fn publish_event(shared: &Shared, context: &JobContext, session_id: &str, event: &Event) {
    let message = agent_event(&context.job_id, LEADER_AGENT_ID, session_id, event);
    if let Err(error) = shared.bus.publish_event(&message).await {
        tracing::warn!(%error, job_id = %context.job_id, "leader event not published");
    }
    // Journaled directly rather than through the relay, so the leader's
    // last events precede the final state change on the same connection.
    if let Err(error) = shared
        .journal
        .append(&context.job_id, v1::job_event::Event::AgentEvent(message))
        .await
    {
        tracing::warn!(%error, job_id = %context.job_id, "leader event not journaled");
    }
}

/// Extracts the last fenced ```json block of `text`.
pub fn last_json_block(text: &str) -> Option<Value> {
    let mut found = None;
    let mut rest = text;
    while let Some(start) = rest.find("```json") {
        let body = &rest[start + 7..];
        let Some(end) = body.find("```") else { break };
        if let Ok(value) = serde_json::from_str::<Value>(body[..end].trim()) {
            found = Some(value);
        }
        rest = &body[end + 3..];
    }
    found
}

/// The loop answered: the job's state is decided by its outcome
/// ([`JobEnd::settle`]); the answer is kept beside it.
fn final_answer(text: &str, state: &LoopState) -> JobEnd {
    let block = last_json_block(text);
    let summary: String = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("```"))
        .unwrap_or_default()
        .chars()
        .take(1000)
        .collect();
    JobEnd {
        state: v1::JobState::Succeeded,
        summary,
        result_json: block.map(|b| b.to_string()).unwrap_or_default(),
        final_answer: text.to_string(),
        error: String::new(),
        usage: usage_of(state),
    }
}

enum Decisions {
    Decided(HashMap<String, ApprovalDecision>),
    Cancelled(String),
    Failed(String),
}

/// Marks a still-pending approval as denied by timeout.
async fn record_timeout(shared: &Shared, approval_id: &str) {
    let Ok(Some(current)) = shared.approvals.get(approval_id).await else {
        return;
    };
    let signer = shared.config.decision_key.as_ref();
    let current = crate::approvals::as_worker_sees_it(signer, &current);
    let request = current.value.request.clone().unwrap_or_default();
    let mut decision = v1::ApprovalDecision {
        approval_id: approval_id.to_string(),
        job_id: request.job_id.clone(),
        session_id: request.session_id.clone(),
        call_id: request.call_id.clone(),
        verdict: v1::ApprovalVerdict::Deny as i32,
        reason: "approval timed out".to_string(),
        decided_by: "timeout".to_string(),
        decided_at: Some(now()),
        timed_out: true,
        signature: Vec::new(),
    };
    if let Some(signer) = signer
        && let Err(error) = signer.sign(&mut decision)
    {
        tracing::warn!(%error, "timeout decision not signed");
    }
    if shared
        .approvals
        .decide_at(&decision, &current)
        .await
        .is_ok()
    {
        let _ = shared
            .journal
            .append(
                &request.job_id,
                v1::job_event::Event::ApprovalDecided(decision),
            )
            .await;
    }
}

/// The leader loop paused: store and announce its approval requests like
/// any agent's, then wait for the decisions (DecideApproval publishes them
/// to the leader session's decision subject).
async fn await_decisions(
    shared: &Shared,
    context: &JobContext,
    session_id: &str,
    approvals: &[mtswarm_core::ApprovalRequest],
    timeout: Duration,
    cancel: &mut watch::Receiver<Option<String>>,
) -> Decisions {
    let mut decisions_in = match shared.bus.subscribe_approval_decisions(session_id).await {
        Ok(stream) => stream,
        Err(error) => return Decisions::Failed(format!("cannot wait for approvals: {error}")),
    };
    let mut waiting: HashMap<String, String> = HashMap::new();
    for approval in approvals {
        let approval_id = uuid::Uuid::now_v7().simple().to_string();
        let request = v1::ApprovalRequest {
            approval_id: approval_id.clone(),
            job_id: context.job_id.clone(),
            agent_id: LEADER_AGENT_ID.to_string(),
            session_id: session_id.to_string(),
            call_id: approval.call_id.clone(),
            tool_name: approval.tool.clone(),
            arguments_json: approval.arguments.to_string(),
            risk: match approval.risk {
                mtswarm_core::Risk::Low => v1::RiskLevel::Low,
                mtswarm_core::Risk::Medium => v1::RiskLevel::Medium,
                mtswarm_core::Risk::High => v1::RiskLevel::High,
            } as i32,
            reason: format!("{:?}-risk leader tool", approval.risk).to_lowercase(),
            requested_at: Some(now()),
            timeout_seconds: timeout.as_secs(),
            default_verdict: v1::ApprovalVerdict::Deny as i32,
        };
        if let Err(error) = shared.approvals.create(&request).await {
            return Decisions::Failed(format!("approval not stored: {error}"));
        }
        if let Err(error) = shared.bus.publish_approval_request(&request).await {
            tracing::warn!(%error, "leader approval request not announced");
        }
        waiting.insert(approval_id, approval.call_id.clone());
    }
    let mut decided = HashMap::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while decided.len() < waiting.len() {
        tokio::select! {
            message = decisions_in.next() => match message {
                Some(Ok(received)) => {
                    let decision = received.message;
                    if let Some(call_id) = waiting.get(&decision.approval_id) {
                        let verdict = match decision.verdict() {
                            v1::ApprovalVerdict::Approve => ApprovalDecision::Approve,
                            _ => ApprovalDecision::Deny {
                                reason: (!decision.reason.is_empty()).then(|| decision.reason.clone()),
                            },
                        };
                        decided.insert(call_id.clone(), verdict);
                    }
                }
                Some(Err(error)) => tracing::warn!(%error, "undecodable approval decision"),
                None => return Decisions::Failed("approval decision subscription ended".into()),
            },
            _ = tokio::time::sleep_until(deadline) => {
                // Undecided calls get the default verdict (deny), recorded
                // as timed out so they leave the pending list.
                for (approval_id, call_id) in &waiting {
                    if decided.contains_key(call_id) {
                        continue;
                    }
                    record_timeout(shared, approval_id).await;
                    decided.insert(
                        call_id.clone(),
                        ApprovalDecision::Deny {
                            reason: Some("approval timed out".to_string()),
                        },
                    );
                }
                break;
            }
            changed = cancel.changed() => {
                if changed.is_ok()
                    && let Some(reason) = cancel.borrow().clone()
                {
                    return Decisions::Cancelled(reason);
                }
            }
        }
    }
    Decisions::Decided(decided)
}

async fn system_prompt(shared: &Shared, context: &JobContext) -> String {
    let spec = &context.spec;
    let selector = if spec.slice_selector.is_empty() {
        "*"
    } else {
        &spec.slice_selector
    };
    let fleet = match crate::fleet::read_fleet(
        &shared.workers,
        &shared.leases,
        &shared.quarantine,
        crate::fleet::parse_selector(&spec.slice_selector)
            .ok()
            .flatten()
            .as_ref(),
        shared.config.worker_stale_after,
    )
    .await
    {
        Ok(view) => {
            let free = view
                .slices
                .iter()
                .filter(|s| s.state() == v1::SliceState::Free)
                .count();
            format!(
                "{} worker daemon(s); {} slice(s) match the job's selector, {free} of them free right now",
                view.workers.len(),
                view.slices.len()
            )
        }
        Err(error) => format!("unknown (the fleet could not be read: {error})"),
    };
    format!(
        "You are the leader of an mtswarm tuning job: you tune a compute kernel for MT-3000 boards \
by directing worker agents, each running on one slice of hardware.\n\n\
Tools:\n\
- list_fleet(selector?): slices matching a selector with their state (free/leased/quarantined).\n\
- spawn_agent(selector?, role?, instructions?, name?): start a worker agent on a free matching slice; \
`name` becomes its agent id.\n\
- assign_task(agent, instructions, parameters): give an agent a task. parameters is a JSON object; \
to split a tuning space use {{\"candidates\": [{{\"PARAM\": value, ...}}, ...]}} (each candidate a map of -D defines from tune.toml).\n\
- collect_result(agents? | tasks?, mode any|all, timeout_seconds): wait for task results.\n\
- cancel_agent(agent, reason?): stop an agent.\n\
- read_file(path): read a file of the kernel directory (tune.toml describes the tuning space).\n\
- job_status(): the job's agents and tasks.\n\n\
Fleet: {fleet}.\n\
Job: kernel directory {kernel}, slice selector {selector}, agents requested: {agents}.\n\n\
Work plan: look at the fleet and tune.toml, spawn agents on free slices, split the tuning space among \
them, assign, collect all results, then answer. Your final answer starts with a one-line summary and \
ends with a ```json block: {{\"best\": {{\"params\": {{...}}, \"gflops\": n, \"peak_fraction\": n, \
\"agent\": id, \"slice\": id}}, \"results\": [...]}} (or {{\"best\": null, \"error\": \"why\"}} when nothing worked).",
        kernel = spec.kernel_dir,
        agents = if spec.num_agents == 0 {
            "leader decides".to_string()
        } else {
            spec.num_agents.to_string()
        },
    )
}

/// The task message: the goal, the attached files, and a machine-readable
/// `job_spec:` line (last line) the builtin policy reads.
fn user_input(context: &JobContext, attachments: &[Attachment]) -> String {
    let spec = &context.spec;
    let mut text = spec.goal.trim().to_string();
    for attachment in attachments {
        text.push_str(&format!(
            "\n\n--- @{} ---\n{}\n--- end of @{} ---",
            attachment.path, attachment.content, attachment.path
        ));
    }
    let collect_timeout = spec
        .budgets
        .map(|b| b.wall_time_seconds)
        .filter(|s| *s > 0)
        .unwrap_or(context.shared.config.default_collect_timeout.as_secs());
    let machine = json!({
        "job_id": context.job_id,
        "kernel_dir": spec.kernel_dir,
        "slice_selector": spec.slice_selector,
        "num_agents": spec.num_agents,
        "collect_timeout_seconds": collect_timeout,
    });
    text.push_str(&format!("\n\n{}{machine}", crate::policy::JOB_SPEC_PREFIX));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_parsable_json_block_is_the_result() {
        let text =
            "Best: x\n```json\n{\"a\":1}\n```\nthen\n```json\n{\"best\":{\"gflops\":2}}\n```";
        assert_eq!(last_json_block(text), Some(json!({"best":{"gflops":2}})));
        assert_eq!(last_json_block("no block"), None);
    }
}
