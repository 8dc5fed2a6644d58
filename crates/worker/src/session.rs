//! Agent sessions: one tokio task per session, bound to one slice. The
//! session consumes its slice's task subject through a durable consumer and
//! runs one worker ReAct loop per task on the engine, publishing every
//! engine event, checkpointing every state, handling approvals across
//! processes, and ending each task with a `TaskResult` and an ack.
//!
//! A session that waits for tasks costs one task and one pull subscription;
//! its history lives in its checkpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mtswarm_bus::{Delivery, TaskConsumerConfig, subjects, v1};
use mtswarm_core::{
    ApprovalConfig, ApprovalDecision, AutoApprove, ChatModel, Engine, EngineConfig, Event,
    EventKind, GateConfig, LoopState, Node, Outcome, RiskPolicy, RunEnd, StopReason, ToolRegistry,
    TracingMiddleware, Verdict,
};
use mtswarm_llm::{OpenAiClient, OpenAiConfig, ReplayModel, RequestCheck};
use mtswarm_tools::ToolSet;

use crate::results::MeasurementRecorder;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::Status;
use tracing::Instrument;

use crate::approval::{self, ApprovalWait};
use crate::checkpoint::{KnownCheckpoint, KvCheckpointSink, SessionCheckpointCell};
use crate::config::{DefaultVerdict, SessionModelContext, WorkerModel};
use crate::daemon::Shared;
use crate::events::{EventPublisher, now_timestamp};
use crate::policy::{BuiltinWorkerPolicy, answer_json, render_task_message};
use crate::prompt::worker_system_prompt;
use crate::workspace::{ensure_kernel_copy, session_workspace};

use v1::AgentEventKind as Kind;
use v1::SessionState;

/// How a session is asked to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopMode {
    Run,
    /// Finish the current task, take no more (drain).
    AfterTask,
    /// Stop now; the current task ends CANCELLED (CancelSession).
    Cancel(String),
    /// Stop now without a result or an ack; the last checkpoint stays for a
    /// resume (shutdown, drain grace over).
    Abandon,
    /// The slice was lost (lease lost, slice quarantined): stop now, end the
    /// current task with a fenced result, end the session. The checkpoint
    /// stays for the session's resume on another slice.
    Fence(String),
}

/// What Status reports about a session.
#[derive(Debug, Clone)]
pub(crate) struct SessionProgress {
    pub(crate) state: SessionState,
    pub(crate) task_id: String,
    pub(crate) attempt: u32,
    pub(crate) step: u32,
    pub(crate) usage: v1::Usage,
}

/// A session in the daemon's table.
pub(crate) struct SessionEntry {
    pub(crate) session_id: String,
    pub(crate) job_id: String,
    pub(crate) agent_id: String,
    pub(crate) slice_index: usize,
    pub(crate) started_at: prost_types::Timestamp,
    pub(crate) lease_epoch: u64,
    pub(crate) resumed_from_step: u32,
    progress: Mutex<SessionProgress>,
    stop: watch::Sender<StopMode>,
    join: Mutex<Option<JoinHandle<()>>>,
}

impl SessionEntry {
    pub(crate) fn stop(&self, mode: StopMode) {
        self.stop.send_if_modified(|current| {
            // A harder stop replaces a softer one, never the reverse.
            let rank = |m: &StopMode| match m {
                StopMode::Run => 0,
                StopMode::AfterTask => 1,
                StopMode::Cancel(_) => 2,
                StopMode::Abandon => 3,
                // A fenced run still reports, even during a shutdown.
                StopMode::Fence(_) => 4,
            };
            if rank(&mode) > rank(current) {
                *current = mode.clone();
                true
            } else {
                false
            }
        });
    }

    pub(crate) fn abort(&self) {
        if let Some(join) = self.join.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            join.abort();
        }
    }

    pub(crate) fn take_join(&self) -> Option<JoinHandle<()>> {
        self.join.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn progress(&self) -> SessionProgress {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn update(&self, change: impl FnOnce(&mut SessionProgress)) {
        change(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub(crate) fn status(&self, slice_id: &str) -> v1::SessionStatus {
        let p = self.progress();
        v1::SessionStatus {
            session_id: self.session_id.clone(),
            job_id: self.job_id.clone(),
            agent_id: self.agent_id.clone(),
            slice_id: slice_id.to_owned(),
            task_id: p.task_id,
            attempt: p.attempt,
            state: p.state as i32,
            step: p.step,
            usage: Some(p.usage),
            started_at: Some(self.started_at),
        }
    }

    pub(crate) fn response(&self, worker_id: &str, slice_id: &str) -> v1::SpawnSessionResponse {
        v1::SpawnSessionResponse {
            session_id: self.session_id.clone(),
            worker_id: worker_id.to_owned(),
            slice_id: slice_id.to_owned(),
            lease_epoch: self.lease_epoch,
            resumed_from_step: self.resumed_from_step,
        }
    }
}

/// What a session keeps between tasks.
struct SessionRuntime {
    tools: ToolSet,
    /// The session's tool table, built once; each task's engine gets a clone.
    registry: ToolRegistry,
    model: Arc<dyn ChatModel>,
    system_prompt: String,
    workspace: std::path::PathBuf,
    policy: RiskPolicy,
    kernel_dir: String,
    budgets: v1::Budgets,
    hardware_tools: Vec<String>,
    temperature: Option<f32>,
    max_output_tokens: Option<u32>,
    /// The engine of the session's last task and the configuration it was
    /// built with. Building one clones the whole tool table, which costs
    /// more than a no-op task itself; tasks with the same configuration
    /// (the common case) share it, each with its own checkpoint sink.
    engine: Mutex<Option<(EngineConfig, Engine)>>,
    /// Kernel directories already copied into the workspace, by the name a
    /// task gave them, with the copy's name.
    kernel_copies: Mutex<HashMap<String, String>>,
    /// What the session knows of its stored checkpoint (see
    /// [`crate::checkpoint`]).
    checkpoint: SessionCheckpointCell,
}

impl SessionRuntime {
    /// An engine for `config`: the cached one when the configuration is the
    /// same, otherwise a new one (which replaces it in the cache).
    fn engine_for(&self, config: EngineConfig) -> Engine {
        let mut cached = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cached_config, engine)) = cached.as_ref()
            && *cached_config == config
        {
            return engine.clone();
        }
        // Schemas were compiled once for the session; the clone shares them.
        let engine = Engine::new(
            config.clone(),
            self.model.clone(),
            self.registry.clone(),
            self.policy.clone(),
            Arc::new(self.tools.resource_lock()),
        )
        .with_middleware(Arc::new(TracingMiddleware));
        *cached = Some((config, engine.clone()));
        engine
    }

    /// Copy `kernel_dir` into the workspace once per session (see
    /// [`ensure_kernel_copy`]); later tasks naming it again find the copy.
    fn kernel_copy(
        &self,
        kernel_root: &std::path::Path,
        kernel_dir: &str,
    ) -> Result<String, String> {
        let known = self
            .kernel_copies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(kernel_dir)
            .cloned();
        if let Some(name) = known
            && self.workspace.join(&name).is_dir()
        {
            return Ok(name);
        }
        let name = ensure_kernel_copy(kernel_root, &self.workspace, kernel_dir)?;
        self.kernel_copies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kernel_dir.to_owned(), name.clone());
        Ok(name)
    }

    /// Remember a checkpoint read from the store.
    fn saw_checkpoint(&self, stored: &mtswarm_bus::Versioned<v1::SessionCheckpoint>) {
        *self.checkpoint.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(KnownCheckpoint::of_stored(stored));
    }
}

fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message.into())
}

fn session_model(
    shared: &Shared,
    request: &v1::SpawnSessionRequest,
) -> Result<Arc<dyn ChatModel>, Status> {
    let context = SessionModelContext {
        session_id: request.session_id.clone(),
        job_id: request.job_id.clone(),
        agent_id: request.agent_id.clone(),
        role: request.role.clone(),
    };
    match &shared.config.model {
        WorkerModel::Factory(factory) => return Ok(factory(&context)),
        WorkerModel::Replay(path) => {
            let replay = ReplayModel::from_file(path)
                .map_err(|e| Status::failed_precondition(format!("replay cassette: {e}")))?
                .with_request_check(RequestCheck::Ignore);
            return Ok(Arc::new(replay));
        }
        WorkerModel::Builtin | WorkerModel::OpenAi { .. } => {}
    }
    let settings = request
        .model
        .as_ref()
        .filter(|m| !m.model.trim().is_empty());
    let (base_url, model) = match (settings, &shared.config.model) {
        (Some(s), daemon) => {
            let base_url = if s.base_url.trim().is_empty() {
                match daemon {
                    WorkerModel::OpenAi { base_url, .. } => base_url.clone(),
                    _ => {
                        return Err(invalid(
                            "model settings name a model but no base_url, and the daemon has no default endpoint",
                        ));
                    }
                }
            } else {
                let url = s.base_url.trim().to_owned();
                endpoints(shared)
                    .check(&url)
                    .map_err(|e| invalid(e.to_string()))?;
                url
            };
            (base_url, s.model.trim().to_owned())
        }
        (None, WorkerModel::OpenAi { base_url, model }) => (base_url.clone(), model.clone()),
        (None, _) => return Ok(Arc::new(BuiltinWorkerPolicy::new())),
    };
    // The key goes only to the endpoint it was configured for.
    let key_allowed = endpoints(shared).key_goes_to(&base_url);
    let mut config = OpenAiConfig::new(base_url, model);
    if let Some(key) = shared.api_key.as_ref().filter(|_| key_allowed) {
        config = config.with_api_key(key.clone());
    }
    let client = OpenAiClient::new(config).map_err(|e| invalid(format!("model settings: {e}")))?;
    Ok(Arc::new(client))
}

/// The operator's allowlist plus the daemon's own endpoint.
fn endpoints(shared: &Shared) -> mtswarm_auth::ModelEndpoints {
    let own = match &shared.config.model {
        WorkerModel::OpenAi { base_url, .. } => Some(base_url.as_str()),
        _ => None,
    };
    mtswarm_auth::ModelEndpoints::new(shared.config.model_endpoints.clone(), own)
}

/// Handle a SpawnSession request (idempotent per session id).
pub(crate) async fn spawn_session(
    shared: &Arc<Shared>,
    request: v1::SpawnSessionRequest,
) -> Result<v1::SpawnSessionResponse, Status> {
    for (kind, value) in [
        ("session id", &request.session_id),
        ("job id", &request.job_id),
        ("agent id", &request.agent_id),
    ] {
        subjects::validate_id(kind, value).map_err(|e| invalid(e.to_string()))?;
    }
    // Idempotency: the same session id gets the same answer.
    let existing = shared.table().sessions.get(&request.session_id).cloned();
    if let Some(existing) = existing {
        if existing.job_id != request.job_id || existing.agent_id != request.agent_id {
            return Err(Status::already_exists(format!(
                "session {} already runs for job {} / agent {}",
                existing.session_id, existing.job_id, existing.agent_id
            )));
        }
        let slice_id = &shared.slices[existing.slice_index].bus_id;
        return Ok(existing.response(&shared.worker_id, slice_id));
    }
    if shared.draining.load(Ordering::SeqCst) {
        return Err(Status::failed_precondition(format!(
            "worker {} is draining and accepts no new sessions",
            shared.worker_id
        )));
    }
    // Pick the slice.
    let candidates: Vec<usize> = if !request.slice_id.trim().is_empty() {
        let index = shared.slice_index(&request.slice_id).ok_or_else(|| {
            Status::not_found(format!(
                "slice `{}` is not on worker {} (slices: {})",
                request.slice_id,
                shared.worker_id,
                shared
                    .slices
                    .iter()
                    .map(|s| s.bus_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        vec![index]
    } else {
        let selector = if request.slice_selector.trim().is_empty() {
            mtswarm_hw::SliceSelector::all()
        } else {
            mtswarm_hw::SliceSelector::parse(&request.slice_selector)
                .map_err(|e| invalid(e.to_string()))?
        };
        let matching: Vec<usize> = (0..shared.slices.len())
            .filter(|&i| selector.matches(&shared.slices[i].slice))
            .collect();
        if matching.is_empty() {
            return Err(Status::not_found(format!(
                "no slice of worker {} matches `{}`",
                shared.worker_id, request.slice_selector
            )));
        }
        matching
    };
    let named = !request.slice_id.trim().is_empty();
    let mut quarantined = Vec::new();
    for &index in &candidates {
        let slice_id = &shared.slices[index].bus_id;
        match shared.quarantine.get(slice_id).await {
            Ok(Some(record)) => quarantined.push((index, record.value.reason)),
            Ok(None) => {}
            Err(error) => {
                return Err(Status::unavailable(format!("quarantine lookup: {error}")));
            }
        }
    }
    if named && let Some((_, reason)) = quarantined.first() {
        return Err(Status::failed_precondition(format!(
            "slice {} is quarantined: {reason}",
            shared.slices[candidates[0]].bus_id
        )));
    }
    // Reserve the slice (and check the session limit) atomically.
    let index = {
        let mut table = shared.table();
        if let Some(existing) = table.sessions.get(&request.session_id) {
            let slice_id = &shared.slices[existing.slice_index].bus_id;
            return Ok(existing.response(&shared.worker_id, slice_id));
        }
        if table
            .slice_owner
            .iter()
            .any(|owner| owner.as_deref() == Some(request.session_id.as_str()))
        {
            return Err(Status::unavailable(format!(
                "session {} is being started; retry",
                request.session_id
            )));
        }
        if table.sessions.len() >= shared.config.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "worker {} runs its maximum of {} sessions",
                shared.worker_id, shared.config.max_sessions
            )));
        }
        let free = candidates
            .iter()
            .copied()
            .find(|&i| table.slice_owner[i].is_none() && !quarantined.iter().any(|(q, _)| *q == i));
        let Some(index) = free else {
            let slice = &shared.slices[candidates[0]].bus_id;
            return Err(Status::failed_precondition(if named {
                format!(
                    "slice {slice} is busy with session {}",
                    table.slice_owner[candidates[0]].clone().unwrap_or_default()
                )
            } else {
                format!(
                    "no free slice of worker {} matches `{}`",
                    shared.worker_id, request.slice_selector
                )
            }));
        };
        table.slice_owner[index] = Some(request.session_id.clone());
        index
    };
    match start_session(shared, index, &request).await {
        Ok(entry) => {
            let slice_id = shared.slices[index].bus_id.clone();
            Ok(entry.response(&shared.worker_id, &slice_id))
        }
        Err(status) => {
            let mut table = shared.table();
            if table.slice_owner[index].as_deref() == Some(request.session_id.as_str()) {
                table.slice_owner[index] = None;
            }
            Err(status)
        }
    }
}

async fn start_session(
    shared: &Arc<Shared>,
    index: usize,
    request: &v1::SpawnSessionRequest,
) -> Result<Arc<SessionEntry>, Status> {
    let slice = &shared.slices[index];
    let workspace = session_workspace(&shared.config.workspace_root, &request.session_id);
    let mut kernel_copies = HashMap::new();
    if !request.kernel_dir.trim().is_empty() {
        let name = ensure_kernel_copy(&shared.config.kernel_root, &workspace, &request.kernel_dir)
            .map_err(invalid)?;
        kernel_copies.insert(request.kernel_dir.clone(), name);
    }
    let tools = ToolSet::builder(&workspace, slice.board.clone())
        .spec(slice.spec.clone())
        .lock(shared.hw_lock.clone())
        .measure_defaults(shared.config.measure.clone())
        .build()
        .map_err(|e| Status::internal(format!("tools: {e}")))?
        .with_results(
            crate::results::BusResults::new(shared.results.clone()),
            kernel_name_of(&request.kernel_dir),
        );
    let mut registry = ToolRegistry::new();
    tools
        .register_all(&mut registry)
        .map_err(|e| Status::internal(format!("tool registry: {e}")))?;
    let model = session_model(shared, request)?;
    let all_tools = tools.tools();
    let system_prompt = worker_system_prompt(
        &request.role,
        &request.instructions,
        &slice.slice,
        &slice.spec,
        &all_tools,
    );
    let hardware_tools = all_tools
        .iter()
        .filter(|t| t.needs_hardware())
        .map(|t| t.name().to_owned())
        .collect();
    let policy = RiskPolicy::default().with_auto_approve(if request.auto_approve {
        AutoApprove::UpToMedium
    } else {
        AutoApprove::LowOnly
    });
    let mut known_checkpoint = None;
    let resumed_from_step = if request.resume {
        match shared.checkpoints.get(&request.session_id).await {
            Ok(Some(checkpoint)) => {
                known_checkpoint = Some(KnownCheckpoint::of_stored(&checkpoint));
                checkpoint.value.step
            }
            Ok(None) => 0,
            // A record that is not a checkpoint never will be one: the
            // session starts afresh rather than refusing every move.
            Err(error) if error.is_undecodable() => {
                tracing::warn!(%error, "stored checkpoint unreadable; the session starts afresh");
                0
            }
            Err(error) => return Err(Status::unavailable(format!("checkpoint lookup: {error}"))),
        }
    } else {
        0
    };
    let consumer = shared
        .bus
        .task_consumer(
            &shared.worker_id,
            TaskConsumerConfig {
                slice_id: Some(slice.bus_id.clone()),
                ack_wait: shared.config.task_ack_wait,
                max_deliver: shared.config.task_max_deliver,
                max_ack_pending: 1,
                batch: 1,
                // A task that comes back after a server restart is still
                // resumed: the session knows it checkpointed that task.
                memory_state: true,
            },
        )
        .await
        .map_err(|e| Status::unavailable(format!("task consumer: {e}")))?;
    let lease_epoch = shared
        .set_lease_session(index, &request.session_id, &request.job_id)
        .await
        .map_err(Status::unavailable)?;
    let (stop, stop_rx) = watch::channel(StopMode::Run);
    let entry = Arc::new(SessionEntry {
        session_id: request.session_id.clone(),
        job_id: request.job_id.clone(),
        agent_id: request.agent_id.clone(),
        slice_index: index,
        started_at: now_timestamp(),
        lease_epoch,
        resumed_from_step,
        progress: Mutex::new(SessionProgress {
            state: SessionState::Starting,
            task_id: String::new(),
            attempt: 0,
            step: 0,
            usage: v1::Usage::default(),
        }),
        stop,
        join: Mutex::new(None),
    });
    let runtime = SessionRuntime {
        tools,
        registry,
        model,
        system_prompt,
        workspace,
        policy,
        kernel_dir: request.kernel_dir.clone(),
        budgets: request.budgets.unwrap_or_default(),
        hardware_tools,
        // Sampling settings only mean something to a real model.
        temperature: request
            .model
            .as_ref()
            .and_then(|m| m.temperature)
            .map(|t| t as f32),
        max_output_tokens: request
            .model
            .as_ref()
            .map(|m| m.max_output_tokens)
            .filter(|n| *n > 0),
        engine: Mutex::new(None),
        kernel_copies: Mutex::new(kernel_copies),
        checkpoint: Arc::new(Mutex::new(known_checkpoint)),
    };
    let span = tracing::info_span!(
        "worker.session",
        session.id = %request.session_id,
        job.id = %request.job_id,
        agent.id = %request.agent_id,
        slice.id = %slice.bus_id,
        worker.id = %shared.worker_id,
    );
    if !request.traceparent.is_empty() {
        let parent =
            mtswarm_telemetry::propagation::context_from_traceparent(&request.traceparent, None);
        if let Err(error) = mtswarm_telemetry::propagation::set_parent(&span, parent) {
            tracing::debug!(%error, "SpawnSession traceparent not applied");
        }
    }
    shared
        .table()
        .sessions
        .insert(request.session_id.clone(), entry.clone());
    let join = tokio::spawn(
        run_session(shared.clone(), entry.clone(), runtime, consumer, stop_rx).instrument(span),
    );
    *entry.join.lock().unwrap_or_else(|e| e.into_inner()) = Some(join);
    tracing::info!(session.id = %request.session_id, slice.id = %slice.bus_id, "session started");
    Ok(entry)
}

async fn run_session(
    shared: Arc<Shared>,
    entry: Arc<SessionEntry>,
    runtime: SessionRuntime,
    consumer: mtswarm_bus::TaskConsumer,
    mut stop: watch::Receiver<StopMode>,
) {
    let events = EventPublisher::resume(
        &shared.bus,
        &entry.job_id,
        &entry.agent_id,
        &entry.session_id,
    )
    .await;
    let slice_id = shared.slices[entry.slice_index].bus_id.clone();
    events
        .publish(
            0,
            Kind::SessionStarted,
            json!({"type": "session_started", "worker_id": shared.worker_id, "slice_id": slice_id,
                   "resumed_from_step": entry.resumed_from_step}),
        )
        .await;
    entry.update(|p| p.state = SessionState::Idle);
    let mut end_state = SessionState::Finished;
    let end_reason: String;
    let mut delivery_errors = 0u32;
    match consumer.messages().await {
        Err(error) => {
            tracing::error!(%error, "task consumer unavailable; session ends");
            end_state = SessionState::Failed;
            end_reason = format!("task consumer unavailable: {error}");
        }
        Ok(mut messages) => loop {
            let mode = stop.borrow().clone();
            match mode {
                StopMode::Run => {}
                StopMode::AfterTask => {
                    end_reason = "drained".into();
                    break;
                }
                StopMode::Cancel(reason) => {
                    end_state = SessionState::Cancelled;
                    end_reason = reason;
                    break;
                }
                StopMode::Abandon => {
                    end_state = SessionState::Cancelled;
                    end_reason = "stopped by the daemon".into();
                    break;
                }
                StopMode::Fence(reason) => {
                    end_state = SessionState::Cancelled;
                    end_reason = format!("fenced off: {reason}");
                    break;
                }
            }
            let item = tokio::select! {
                _ = stop.changed() => continue,
                _ = tokio::time::sleep(shared.config.session_idle_timeout) => {
                    end_reason = format!("idle for {:?}", shared.config.session_idle_timeout);
                    break;
                }
                item = messages.next() => item,
            };
            match item {
                None => {
                    // The pull subscription ended (e.g. the server restarted):
                    // open it again; the durable consumer keeps our place.
                    tracing::warn!("the task subscription ended; re-opening it");
                    messages = reopen_tasks(&consumer, &mut stop).await;
                }
                Some(Err(error)) => {
                    delivery_errors += 1;
                    tracing::warn!(%error, errors_in_a_row = delivery_errors, "task delivery error");
                    if delivery_errors >= 3 {
                        messages = reopen_tasks(&consumer, &mut stop).await;
                        delivery_errors = 0;
                    } else {
                        // Avoid spinning on a broken subscription.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                Some(Ok(delivery)) => {
                    delivery_errors = 0;
                    handle_delivery(&shared, &entry, &runtime, &events, &mut stop, delivery).await;
                    entry.update(|p| {
                        p.state = SessionState::Idle;
                        p.task_id.clear();
                    });
                }
            }
        },
    }
    entry.update(|p| p.state = end_state);
    events
        .publish(
            entry.progress().step,
            Kind::SessionFinished,
            json!({"type": "session_finished", "state": end_state.as_str_name(), "reason": end_reason}),
        )
        .await;
    // Free the slice: the lease first, then the table.
    if let Err(error) = shared.set_lease_session(entry.slice_index, "", "").await {
        tracing::warn!(%error, "lease not reset after the session");
    }
    {
        let mut table = shared.table();
        table.sessions.remove(&entry.session_id);
        if table.slice_owner[entry.slice_index].as_deref() == Some(entry.session_id.as_str()) {
            table.slice_owner[entry.slice_index] = None;
        }
    }
    tracing::info!(session.id = %entry.session_id, reason = %end_reason, "session ended");
}

/// Open the task subscription again, with backoff, until it opens or the
/// session is told to stop (then an empty stream: the loop sees the stop).
async fn reopen_tasks(
    consumer: &mtswarm_bus::TaskConsumer,
    stop: &mut watch::Receiver<StopMode>,
) -> mtswarm_bus::DeliveryStream<v1::TaskAssignment> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match consumer.messages().await {
            Ok(messages) => {
                tracing::info!("task subscription re-opened");
                return messages;
            }
            Err(error) => {
                tracing::warn!(%error, "task subscription not re-opened yet; retrying");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() != StopMode::Run {
                    return Box::pin(futures::stream::empty());
                }
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn handle_delivery(
    shared: &Arc<Shared>,
    entry: &Arc<SessionEntry>,
    runtime: &SessionRuntime,
    events: &EventPublisher,
    stop: &mut watch::Receiver<StopMode>,
    delivery: Delivery<v1::TaskAssignment>,
) {
    let task = delivery.message().clone();
    if task.session_id != entry.session_id {
        tracing::warn!(
            task.id = %task.task_id,
            task.session_id = %task.session_id,
            session.id = %entry.session_id,
            "task for another session on this slice; terminated"
        );
        if let Err(error) = delivery.term().await {
            tracing::warn!(%error, "could not terminate the task");
        }
        return;
    }
    let span = tracing::info_span!(
        "worker.task",
        task.id = %task.task_id,
        task.attempt = task.attempt,
        session.id = %entry.session_id,
        job.id = %task.job_id,
        agent.id = %entry.agent_id,
    );
    if let Err(error) = delivery.set_span_parent(&span) {
        tracing::debug!(%error, "task trace context not applied");
    }
    run_task(shared, entry, runtime, events, stop, &delivery, task)
        .instrument(span)
        .await;
}

/// How a task attempt ended, for its result.
struct TaskEnd {
    status: v1::TaskStatus,
    summary: String,
    result: Value,
    error: String,
    state: Option<LoopState>,
}

impl TaskEnd {
    fn failed(error: impl Into<String>) -> Self {
        let error = error.into();
        Self {
            status: v1::TaskStatus::Failed,
            summary: first_line(&error),
            result: json!({"error": error}),
            error,
            state: None,
        }
    }
}

fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .chars()
        .take(300)
        .collect()
}

fn merge_budgets(session: &v1::Budgets, task: Option<&v1::Budgets>) -> v1::Budgets {
    let task = task.copied().unwrap_or_default();
    v1::Budgets {
        max_steps: if task.max_steps > 0 {
            task.max_steps
        } else {
            session.max_steps
        },
        max_tokens: if task.max_tokens > 0 {
            task.max_tokens
        } else {
            session.max_tokens
        },
        device_seconds: if task.device_seconds > 0.0 {
            task.device_seconds
        } else {
            session.device_seconds
        },
        wall_time_seconds: if task.wall_time_seconds > 0 {
            task.wall_time_seconds
        } else {
            session.wall_time_seconds
        },
    }
}

/// Outcome of driving a run segment.
enum Driven {
    Outcome(Box<Outcome>),
    /// Stopped for a shutdown/lease loss: no result, no ack.
    Abandoned,
    /// The attempt lost its slice (lease lost, quarantine, a later attempt
    /// owns the session's checkpoint): a fenced result, then the delivery
    /// is terminated.
    Fenced,
}

#[allow(clippy::too_many_arguments)]
async fn run_task(
    shared: &Arc<Shared>,
    entry: &Arc<SessionEntry>,
    runtime: &SessionRuntime,
    events: &EventPublisher,
    stop: &mut watch::Receiver<StopMode>,
    delivery: &Delivery<v1::TaskAssignment>,
    task: v1::TaskAssignment,
) {
    let started = Instant::now();
    entry.update(|p| {
        p.state = SessionState::Running;
        p.task_id = task.task_id.clone();
        p.attempt = task.attempt;
    });
    let device_ms = AtomicU32::new(0);
    let end = match prepare_and_run(
        shared, entry, runtime, events, stop, delivery, &task, &device_ms,
    )
    .await
    {
        Ok(Driven::Outcome(outcome)) => task_end(*outcome, stop),
        Ok(Driven::Abandoned) => {
            tracing::info!(task.id = %task.task_id, "task left unacknowledged for a later resume");
            return;
        }
        Ok(Driven::Fenced) => {
            let reason = match &*stop.borrow() {
                StopMode::Fence(reason) => reason.clone(),
                _ => "a later attempt of the task owns the session's checkpoint".to_owned(),
            };
            publish_fenced(
                shared, entry, events, delivery, &task, &reason, started, &device_ms,
            )
            .await;
            return;
        }
        Err(end) => end,
    };
    // A run that finished while its slice was already lost (the process was
    // paused past its lease, say) must not look like the attempt's outcome.
    if let Some(reason) = slice_lost(shared, entry).await {
        entry.stop(StopMode::Fence(reason.clone()));
        publish_fenced(
            shared, entry, events, delivery, &task, &reason, started, &device_ms,
        )
        .await;
        return;
    }
    let usage = {
        let (steps, prompt, completion) = end
            .state
            .as_ref()
            .map(|s| (s.step(), s.usage().input_tokens, s.usage().output_tokens))
            .unwrap_or_default();
        v1::Usage {
            steps,
            prompt_tokens: prompt,
            completion_tokens: completion,
            device_seconds: f64::from(device_ms.load(Ordering::SeqCst)) / 1000.0,
            wall_seconds: started.elapsed().as_secs_f64(),
        }
    };
    entry.update(|p| p.usage = usage);
    let result = v1::TaskResult {
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        // The attempt's capability, returned to the leader that issued it.
        result_token: task.result_token.clone(),
        job_id: task.job_id.clone(),
        agent_id: entry.agent_id.clone(),
        session_id: entry.session_id.clone(),
        worker_id: shared.worker_id.clone(),
        slice_id: shared.slices[entry.slice_index].bus_id.clone(),
        status: end.status as i32,
        summary: end.summary.clone(),
        result_json: end.result.to_string(),
        error: end.error.clone(),
        usage: Some(usage),
        finished_at: Some(now_timestamp()),
        fenced: false,
    };
    events
        .publish(
            entry.progress().step,
            Kind::Log,
            json!({"type": "task_finished", "task_id": task.task_id, "attempt": task.attempt,
                   "status": end.status.as_str_name(), "summary": end.summary}),
        )
        .await;
    match shared.bus.publish_result(&result).await {
        Ok(receipt) => {
            tracing::info!(task.id = %task.task_id, status = end.status.as_str_name(), duplicate = receipt.duplicate, "task result published");
            // The result is stored and deduplicated by its message id, so a
            // lost ack only costs a redelivery that ends in a duplicate result.
            if let Err(error) = delivery.ack().await {
                tracing::warn!(%error, "task not acknowledged");
            }
        }
        Err(error) => {
            // Without a stored result the task must come back.
            tracing::error!(%error, "task result not published; asking for redelivery");
            let _ = delivery.nak(Some(Duration::from_secs(1))).await;
        }
    }
}

/// End an attempt that lost its slice: a CANCELLED result marked fenced (the
/// leader never takes it as the outcome, it reassigns), then terminate the
/// delivery so it is not delivered again. The publish is retried for a while
/// because a fenced worker is often one that was cut off (SIGSTOP, a NATS
/// outage) and is reconnecting.
#[allow(clippy::too_many_arguments)]
async fn publish_fenced(
    shared: &Arc<Shared>,
    entry: &Arc<SessionEntry>,
    events: &EventPublisher,
    delivery: &Delivery<v1::TaskAssignment>,
    task: &v1::TaskAssignment,
    reason: &str,
    started: Instant,
    device_ms: &AtomicU32,
) {
    tracing::warn!(task.id = %task.task_id, attempt = task.attempt, %reason, "the run was fenced off; publishing a fenced result");
    let error = format!("fenced off: {reason}");
    let usage = v1::Usage {
        steps: entry.progress().step,
        device_seconds: f64::from(device_ms.load(Ordering::SeqCst)) / 1000.0,
        wall_seconds: started.elapsed().as_secs_f64(),
        ..v1::Usage::default()
    };
    let result = v1::TaskResult {
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        // The attempt's capability, returned to the leader that issued it.
        result_token: task.result_token.clone(),
        job_id: task.job_id.clone(),
        agent_id: entry.agent_id.clone(),
        session_id: entry.session_id.clone(),
        worker_id: shared.worker_id.clone(),
        slice_id: shared.slices[entry.slice_index].bus_id.clone(),
        status: v1::TaskStatus::Cancelled as i32,
        summary: first_line(&error),
        result_json: json!({"error": error, "fenced": true}).to_string(),
        error: error.clone(),
        usage: Some(usage),
        finished_at: Some(now_timestamp()),
        fenced: true,
    };
    events
        .publish(
            entry.progress().step,
            Kind::Log,
            json!({"type": "task_finished", "task_id": task.task_id, "attempt": task.attempt,
                   "status": v1::TaskStatus::Cancelled.as_str_name(), "summary": error,
                   "fenced": true}),
        )
        .await;
    let mut retry = Patience::new(FENCED_RESULT_PATIENCE);
    // First the checkpoint: once it is marked, a redelivery of this attempt
    // (the task stream keeps it; a re-placed session on this slice gets it
    // again) is fenced at once instead of running on a lease it lost.
    while let Err(error) = shared
        .checkpoints
        .mark_fenced(&entry.session_id, &task.task_id, task.attempt)
        .await
    {
        if !retry.wait("fenced checkpoint not marked", &error).await {
            break;
        }
    }
    loop {
        match shared.bus.publish_result(&result).await {
            Ok(_) => {
                tracing::info!(task.id = %task.task_id, attempt = task.attempt, "fenced result published");
                break;
            }
            Err(error) => {
                if !retry.wait("fenced result not published", &error).await {
                    break;
                }
            }
        }
    }
    if let Err(error) = delivery.term().await {
        tracing::warn!(%error, "could not terminate the fenced task");
    }
}

/// Retries of a fenced attempt's last writes: a fenced worker is often one
/// that was cut off (SIGSTOP, a NATS outage) and is reconnecting, so each
/// write is retried with backoff until a shared deadline.
struct Patience {
    give_up: Instant,
    backoff: Duration,
}

impl Patience {
    fn new(patience: Duration) -> Self {
        Self {
            give_up: Instant::now() + patience,
            backoff: Duration::from_millis(200),
        }
    }

    /// Logs `error` and waits before the next try; false (logged as given
    /// up) once the deadline has passed.
    async fn wait(&mut self, what: &str, error: &(dyn std::fmt::Display + Sync)) -> bool {
        if Instant::now() >= self.give_up {
            tracing::error!(%error, "{what}; giving up");
            return false;
        }
        tracing::warn!(%error, "{what} yet; retrying");
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(5));
        true
    }
}

/// Why the session's slice is no longer its own, if it is not: a fence
/// already ordered, or a lease that is lost or past its expiry time (checked
/// here directly, since the lease keeper may not have run yet after the
/// process was paused).
async fn slice_lost(shared: &Shared, entry: &SessionEntry) -> Option<String> {
    if let StopMode::Fence(reason) = &*entry.stop.borrow() {
        return Some(reason.clone());
    }
    let slice = &shared.slices[entry.slice_index];
    let state = slice
        .lease
        .lock()
        .await
        .as_ref()
        .map(mtswarm_bus::LeaseKeeper::state);
    match state {
        Some(mtswarm_bus::KeptLease::Held(held)) => {
            let expires = held
                .value
                .expires_at
                .and_then(|ts| std::time::SystemTime::try_from(ts).ok())?;
            (std::time::SystemTime::now() > expires).then(|| {
                format!(
                    "the lease on slice {} expired before the run finished",
                    slice.bus_id
                )
            })
        }
        Some(mtswarm_bus::KeptLease::Lost { reason, .. }) => Some(format!(
            "the lease on slice {} was lost: {reason}",
            slice.bus_id
        )),
        // Released or being replaced: the daemon is changing the lease itself.
        Some(mtswarm_bus::KeptLease::Released) | None => None,
    }
}

/// How long a fenced result is retried while NATS is unreachable.
const FENCED_RESULT_PATIENCE: Duration = Duration::from_secs(120);

fn task_end(outcome: Outcome, stop: &watch::Receiver<StopMode>) -> TaskEnd {
    match outcome {
        Outcome::Final {
            text,
            verdict,
            state,
        } => TaskEnd {
            status: v1::TaskStatus::Ok,
            summary: first_line(&text),
            result: result_json(&state, Some(&text), Some(&verdict), None),
            error: String::new(),
            state: Some(state),
        },
        Outcome::Stopped {
            reason,
            message,
            state,
        } => {
            let status = if reason == StopReason::Cancelled {
                v1::TaskStatus::Cancelled
            } else {
                v1::TaskStatus::Failed
            };
            let message = match (&*stop.borrow(), reason) {
                (StopMode::Cancel(why), StopReason::Cancelled) => format!("cancelled: {why}"),
                _ => message,
            };
            TaskEnd {
                status,
                summary: first_line(&message),
                result: result_json(&state, None, None, Some(reason)),
                error: message,
                state: Some(state),
            }
        }
        Outcome::Paused { checkpoint, .. } => TaskEnd {
            status: v1::TaskStatus::Failed,
            summary: "the run is still waiting for approval".into(),
            result: result_json(&checkpoint, None, None, None),
            error: "the run is still waiting for approval".into(),
            state: Some(checkpoint),
        },
    }
}

/// The candidates of task parameters (`candidates`, `params`) checked
/// against the kernel's tune.toml when it has one: a typo or a value
/// outside the space fails the task with an error naming it, instead of
/// tuning something else than asked.
fn check_task_defines(
    kernel_dir: &std::path::Path,
    parameters: &Value,
    spec: &mtswarm_hw::ChipSpec,
) -> Result<(), String> {
    let file = kernel_dir.join("tune.toml");
    if !file.is_file() || parameters.get("unchecked_defines") == Some(&Value::Bool(true)) {
        return Ok(());
    }
    let Ok(space) = mtswarm_hw::tune::TuneSpace::load(&file) else {
        // The tools report an unreadable tune.toml when they read it.
        return Ok(());
    };
    let one = parameters.get("params").into_iter();
    let many = parameters
        .get("candidates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for (index, candidate) in one.chain(many).enumerate() {
        let Some(map) = candidate.as_object() else {
            continue;
        };
        let defines: std::collections::BTreeMap<String, String> = map
            .iter()
            .map(|(k, v)| {
                let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                (k.clone(), text)
            })
            .collect();
        space
            .check_defines(&defines, spec)
            .map_err(|e| format!("task parameters, candidate {index}: {e}"))?;
    }
    Ok(())
}

/// The structured result: the best measurement, the evidence, the answer.
fn result_json(
    state: &LoopState,
    answer: Option<&str>,
    verdict: Option<&Verdict>,
    stop: Option<StopReason>,
) -> Value {
    let working = state.working_state();
    let evidence: Vec<&mtswarm_core::working::EvidenceRecord> = state
        .evidence()
        .records
        .iter()
        .filter(|r| r.passed)
        .collect();
    json!({
        "best": working.extra.get("best").cloned().unwrap_or(Value::Null),
        "candidates": working.current_candidates.clone().unwrap_or(Value::Null),
        "benchmarks": working.benchmark_results,
        "evidence": evidence,
        "answer": answer,
        "answer_json": answer.and_then(answer_json),
        "verdict": verdict,
        "stop_reason": stop,
        "steps": state.step(),
    })
}

#[allow(clippy::too_many_arguments)]
async fn prepare_and_run(
    shared: &Arc<Shared>,
    entry: &Arc<SessionEntry>,
    runtime: &SessionRuntime,
    events: &EventPublisher,
    stop: &mut watch::Receiver<StopMode>,
    delivery: &Delivery<v1::TaskAssignment>,
    task: &v1::TaskAssignment,
    device_ms: &AtomicU32,
) -> Result<Driven, TaskEnd> {
    if task.attempt == 0 {
        return Err(TaskEnd::failed(
            "the task has attempt 0; attempts start at 1",
        ));
    }
    for (field, size, limit, name) in [
        (
            "parameters_json",
            task.parameters_json.len(),
            shared.config.max_task_parameters_bytes,
            "max_task_parameters_bytes",
        ),
        (
            "instructions",
            task.instructions.len(),
            shared.config.max_task_instructions_bytes,
            "max_task_instructions_bytes",
        ),
    ] {
        if size > limit {
            return Err(TaskEnd::failed(format!(
                "the task's {field} is {size} bytes, over the worker's limit of {limit} bytes ({name})"
            )));
        }
    }
    let deadline = match &task.deadline {
        Some(ts) => {
            let at = std::time::SystemTime::try_from(*ts)
                .map_err(|e| TaskEnd::failed(format!("the task deadline is invalid: {e}")))?;
            match at.duration_since(std::time::SystemTime::now()) {
                Ok(left) => Some(tokio::time::Instant::now() + left),
                Err(_) => {
                    return Err(TaskEnd::failed(
                        "the task's deadline passed before it started",
                    ));
                }
            }
        }
        None => None,
    };
    let parameters: Value = if task.parameters_json.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(&task.parameters_json)
            .map_err(|e| TaskEnd::failed(format!("parameters_json is not valid JSON: {e}")))?
    };
    let kernel_dir = if task.kernel_dir.trim().is_empty() {
        runtime.kernel_dir.clone()
    } else {
        task.kernel_dir.clone()
    };
    let kernel_name = if kernel_dir.trim().is_empty() {
        String::from(".")
    } else {
        runtime
            .kernel_copy(&shared.config.kernel_root, &kernel_dir)
            .map_err(TaskEnd::failed)?
    };
    check_task_defines(
        &runtime.workspace.join(&kernel_name),
        &parameters,
        &shared.slices[entry.slice_index].spec,
    )
    .map_err(TaskEnd::failed)?;

    // Resume from the session's checkpoint when this task was already
    // (partly) run: a reassignment, a redelivery, or a task this session
    // checkpointed before.
    // A first delivery of anything else has nothing to resume, so
    // the stored checkpoint is not read: an earlier task's checkpoint is
    // simply replaced by this task's first write (the store compares
    // attempts of the same task only), and a later attempt of this task
    // that owns the session is found by that write, which fences this run
    // off before any tool runs.
    let redelivered = delivery.info().delivered > 1;
    // The session checkpointed this task itself: the task came back without
    // the server counting a redelivery (its consumer state was lost in a
    // restart).
    let checkpointed_here = runtime
        .checkpoint
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|known| known.task_id == task.task_id);
    let may_resume = task.resume_from_checkpoint || redelivered || checkpointed_here;
    let mut resumed: Option<LoopState> = None;
    let stored = if may_resume {
        match shared.checkpoints.get(&entry.session_id).await {
            Ok(stored) => {
                if let Some(stored) = &stored {
                    runtime.saw_checkpoint(stored);
                }
                stored
            }
            Err(error) => {
                tracing::warn!(%error, "checkpoint lookup failed; starting the task afresh");
                None
            }
        }
    } else {
        None
    };
    // A later attempt owns the checkpoint, or this attempt was fenced off
    // before (a redelivery of it after its slice was lost and placed again).
    if let Some(stored) = &stored
        && stored.value.task_id == task.task_id
        && (stored.value.attempt > task.attempt
            || (stored.value.attempt == task.attempt && stored.value.fenced))
    {
        return Ok(Driven::Fenced);
    }
    if may_resume
        && let Some(stored) = stored
        && stored.value.task_id == task.task_id
    {
        let json = String::from_utf8_lossy(&stored.value.state_json).into_owned();
        match LoopState::from_json(&json) {
            Ok(state) => resumed = Some(state),
            Err(error) => {
                tracing::warn!(%error, "checkpoint unreadable; starting the task afresh");
            }
        }
    }

    let budgets = merge_budgets(&runtime.budgets, task.budgets.as_ref());
    let approval_default = match shared.config.approval_default {
        DefaultVerdict::Deny => ApprovalDecision::Deny {
            reason: Some("approval timed out".into()),
        },
        DefaultVerdict::Approve => ApprovalDecision::Approve,
    };
    let config = EngineConfig {
        max_steps: if budgets.max_steps > 0 {
            budgets.max_steps
        } else {
            shared.config.default_max_steps
        },
        token_budget: (budgets.max_tokens > 0).then_some(budgets.max_tokens),
        wall_time: (budgets.wall_time_seconds > 0)
            .then(|| Duration::from_secs(budgets.wall_time_seconds)),
        approval: ApprovalConfig {
            timeout: shared.config.approval_timeout,
            on_timeout: approval_default,
        },
        gate: GateConfig {
            require_evidence: (!shared.config.require_evidence.is_empty())
                .then(|| shared.config.require_evidence.clone()),
            best_effort: true,
            max_blocks: 2,
        },
        temperature: runtime.temperature,
        max_output_tokens: runtime.max_output_tokens,
        ..EngineConfig::default()
    };
    let sink = Arc::new(KvCheckpointSink::new(
        shared.checkpoints.clone(),
        &entry.session_id,
        &task.job_id,
        &entry.agent_id,
        &task.task_id,
        task.attempt,
        runtime.checkpoint.clone(),
    ));
    let engine = runtime
        .engine_for(config)
        .with_checkpoint_sink(sink.clone());

    let fresh_start = resumed.is_none();
    let resumed_from_step = resumed.as_ref().map(LoopState::step).unwrap_or(0);
    events
        .publish(
            resumed_from_step,
            Kind::Log,
            json!({"type": "task_started", "task_id": task.task_id, "attempt": task.attempt,
                   "resumed_from_step": resumed_from_step, "kernel_dir": kernel_name}),
        )
        .await;
    let first = match resumed {
        Some(state) if state.node() == Node::Done => {
            return Ok(Driven::Outcome(Box::new(outcome_of_done(state))));
        }
        Some(state) => {
            tracing::info!(step = state.step(), "resuming the task from its checkpoint");
            engine
                .resume(state)
                .map_err(|e| TaskEnd::failed(format!("resume: {e}")))?
        }
        None => {
            let message =
                render_task_message(&task.task_id, &kernel_name, &task.instructions, &parameters);
            engine.start(&entry.session_id, &runtime.system_prompt, message)
        }
    };
    let recorder = MeasurementRecorder::new(
        shared.results.clone(),
        task,
        &shared.worker_id,
        &kernel_name,
        runtime.model.model_name(),
    );
    // Before the agent's first step, so the slice's first use in the job is
    // the reference; a resumed attempt measured it already.
    if fresh_start && task.measure_baseline && kernel_name != "." {
        measure_baseline(runtime, events, &recorder, &kernel_name).await;
    }
    let mut run = first;
    loop {
        let (stream, handle) = run;
        sink.attach(handle.control());
        let driven = drive(
            runtime,
            entry,
            events,
            stop,
            delivery,
            task,
            &sink,
            deadline,
            stream,
            handle,
            device_ms,
            progress_interval(shared),
            (budgets.device_seconds > 0.0).then_some(budgets.device_seconds),
            &recorder,
        )
        .await;
        let outcome = match driven {
            Driven::Abandoned if sink.fenced() => return Ok(Driven::Fenced),
            Driven::Fenced => return Ok(Driven::Fenced),
            Driven::Abandoned => return Ok(Driven::Abandoned),
            Driven::Outcome(outcome) => *outcome,
        };
        let Outcome::Paused {
            checkpoint,
            approvals,
        } = outcome
        else {
            if sink.fenced() {
                return Ok(Driven::Fenced);
            }
            let answer = match &outcome {
                Outcome::Final { text, .. } => crate::policy::answer_json(text),
                _ => None,
            };
            recorder.finish(answer.as_ref()).await;
            return Ok(Driven::Outcome(Box::new(outcome)));
        };
        entry.update(|p| p.state = SessionState::AwaitingApproval);
        let wait = ApprovalWait {
            shared,
            session_id: &entry.session_id,
            agent_id: &entry.agent_id,
            task,
            events,
            step: checkpoint.step(),
        };
        let decisions = match approval::await_decisions(&wait, &approvals, stop, delivery).await {
            Ok(decisions) => decisions,
            Err(approval::Interrupted::Abandon) => return Ok(Driven::Abandoned),
            Err(approval::Interrupted::Fence) => return Ok(Driven::Fenced),
            Err(approval::Interrupted::Cancel(why)) => {
                return Ok(Driven::Outcome(Box::new(Outcome::Stopped {
                    reason: StopReason::Cancelled,
                    message: format!("cancelled while waiting for approval: {why}"),
                    state: checkpoint,
                })));
            }
        };
        entry.update(|p| p.state = SessionState::Running);
        run = engine
            .resume_with_decisions(checkpoint, decisions)
            .map_err(|e| TaskEnd::failed(format!("resume after approval: {e}")))?;
    }
}

/// Measures the kernel's tune.toml baseline on the slice and records it. A
/// baseline that cannot be measured costs the job its speed-up figure, not
/// the task: it is logged and reported as an event.
async fn measure_baseline(
    runtime: &SessionRuntime,
    events: &EventPublisher,
    recorder: &MeasurementRecorder,
    kernel_name: &str,
) {
    match runtime.tools.measure_baseline(kernel_name).await {
        Ok(baseline) => {
            let m = &baseline.measurement;
            tracing::info!(
                kernel = kernel_name,
                valid = m.valid,
                gflops = m.gflops,
                median_seconds = m.stats.as_ref().map(|s| s.median),
                "tune.toml baseline measured"
            );
            events
                .publish(
                    0,
                    Kind::Log,
                    json!({"type": "baseline_measured", "kernel": kernel_name,
                           "defines": baseline.defines, "valid": m.valid,
                           "gflops": m.gflops,
                           "median_seconds": m.stats.as_ref().map(|s| s.median),
                           "error": m.error}),
                )
                .await;
            recorder.baseline(m).await;
        }
        Err(error) => {
            tracing::warn!(%error, kernel = kernel_name, "tune.toml baseline not measured");
            events
                .publish(
                    0,
                    Kind::Log,
                    json!({"type": "baseline_failed", "kernel": kernel_name,
                           "error": error.to_string()}),
                )
                .await;
        }
    }
}

fn outcome_of_done(state: LoopState) -> Outcome {
    match state.end().cloned() {
        Some(RunEnd::Final { text, verdict }) => Outcome::Final {
            text,
            verdict,
            state,
        },
        Some(RunEnd::Stopped { reason, message }) => Outcome::Stopped {
            reason,
            message,
            state,
        },
        None => Outcome::Stopped {
            reason: StopReason::Aborted,
            message: "the checkpointed run ended without a recorded end".into(),
            state,
        },
    }
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    runtime: &SessionRuntime,
    entry: &Arc<SessionEntry>,
    events: &EventPublisher,
    stop: &mut watch::Receiver<StopMode>,
    delivery: &Delivery<v1::TaskAssignment>,
    task: &v1::TaskAssignment,
    sink: &KvCheckpointSink,
    deadline: Option<tokio::time::Instant>,
    mut stream: mtswarm_core::RunStream,
    handle: mtswarm_core::RunHandle,
    device_ms: &AtomicU32,
    progress_every: Duration,
    device_budget: Option<f64>,
    recorder: &MeasurementRecorder,
) -> Driven {
    let control = handle.control();
    let mut progress = tokio::time::interval(progress_every);
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    progress.tick().await;
    let deadline_sleep = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline_sleep);
    let mut abandoned = false;
    let mut fenced = false;
    let mut deadline_hit = false;
    let mut device_budget_hit = false;
    loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(event) => {
                    observe(runtime, entry, &event, device_ms);
                    recorder.observe(&event).await;
                    events.engine_event(&task.task_id, task.attempt, &event).await;
                    let used = f64::from(device_ms.load(Ordering::SeqCst)) / 1000.0;
                    if !device_budget_hit && device_budget.is_some_and(|limit| used > limit) {
                        device_budget_hit = true;
                        control.cancel();
                    }
                }
                None => break,
            },
            _ = progress.tick() => {
                if let Err(error) = delivery.in_progress().await {
                    tracing::debug!(%error, "progress ack failed");
                }
            }
            changed = stop.changed(), if !abandoned => {
                let mode = stop.borrow().clone();
                match mode {
                    StopMode::Abandon => {
                        sink.freeze();
                        abandoned = true;
                        control.cancel();
                    }
                    StopMode::Fence(_) => {
                        sink.freeze();
                        abandoned = true;
                        fenced = true;
                        control.cancel();
                    }
                    StopMode::Cancel(_) => control.cancel(),
                    StopMode::Run | StopMode::AfterTask => {}
                }
                if changed.is_err() {
                    abandoned = true;
                    sink.freeze();
                    control.cancel();
                }
            }
            _ = &mut deadline_sleep, if !deadline_hit => {
                deadline_hit = true;
                control.cancel();
            }
        }
    }
    if fenced {
        return Driven::Fenced;
    }
    if abandoned {
        return Driven::Abandoned;
    }
    let outcome = match stream.outcome().cloned() {
        Some(outcome) => outcome,
        None => match handle.outcome().await {
            Ok(outcome) => outcome,
            Err(error) => Outcome::Stopped {
                reason: StopReason::Aborted,
                message: error.to_string(),
                state: LoopState::default(),
            },
        },
    };
    if device_budget_hit && let Outcome::Stopped { state, .. } = outcome {
        let used = f64::from(device_ms.load(Ordering::SeqCst)) / 1000.0;
        return Driven::Outcome(Box::new(Outcome::Stopped {
            reason: StopReason::Aborted,
            message: format!(
                "device-seconds budget exhausted: {used:.3} s used of {:.3} s",
                device_budget.unwrap_or_default()
            ),
            state,
        }));
    }
    if deadline_hit && let Outcome::Stopped { state, .. } = outcome {
        return Driven::Outcome(Box::new(Outcome::Stopped {
            reason: StopReason::WallTime,
            message: "the task's deadline passed".into(),
            state,
        }));
    }
    Driven::Outcome(Box::new(outcome))
}

/// How often a running task tells JetStream it is still being worked on.
pub(crate) fn progress_interval(shared: &Shared) -> Duration {
    (shared.config.task_ack_wait / 3).max(Duration::from_millis(300))
}

/// Keep the session's status current from its events.
fn observe(runtime: &SessionRuntime, entry: &SessionEntry, event: &Event, device_ms: &AtomicU32) {
    entry.update(|p| p.step = event.step);
    if let EventKind::ToolResult {
        name, duration_ms, ..
    } = &event.kind
        && runtime.hardware_tools.iter().any(|t| t == name)
    {
        let ms = u32::try_from(*duration_ms).unwrap_or(u32::MAX);
        device_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

/// Decisions per call id, as the engine wants them.
pub(crate) type Decisions = HashMap<String, ApprovalDecision>;

/// The kernel's name as results are filed under it: the last component of
/// the kernel directory (`examples/kernels/dgemm` -> `dgemm`).
fn kernel_name_of(kernel_dir: &str) -> Option<String> {
    std::path::Path::new(kernel_dir.trim())
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| !name.is_empty())
}
