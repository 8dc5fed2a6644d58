//! The engine: runs the state machine of [`crate::state`] over a model, a
//! tool registry, a risk policy and a resource lock, and reports what happens
//! as a stream of [`Event`]s.
//!
//! A run is a future polled by its own [`RunStream`]: nothing runs in the
//! background, nothing is spawned, and a session that is not being polled
//! costs only its state. Events produced while the stream is polled are
//! handed out in order; the [`Outcome`] arrives through the stream (as the
//! final `ReplyEnd` / `ApprovalRequired` / `Stopped` event and
//! [`RunStream::outcome`]) and through [`RunHandle::outcome`].

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{Future, Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::clock::{Clock, SystemClock, format_rfc3339};
use crate::context::{
    CharsPerToken, ContextConfig, TokenEstimator, render_transcript, turn_starts, view_message,
};
use crate::event::{ApprovalRequest, Event, EventKind};
use crate::gate::{CompletionGate, EvidenceGate, GateConfig, GateVerdict};
use crate::lock::ResourceLock;
use crate::middleware::{
    CompactionTrigger, CompressionInput, CompressionReport, Middleware, ModelCallInput, ModelTurn,
    PermissionInput, StepInfo, StepReport, SystemPromptInput, ToolCallInfo, ToolCallOutcome,
    run_chain,
};
use crate::model::{ChatModel, ChatRequest, Message, ModelError, ModelEvent, Role, ToolChoice};
use crate::policy::{ApprovalConfig, ApprovalDecision, Permission, RiskPolicy};
use crate::registry::{CallRejection, ToolRegistry, parse_arguments};
use crate::state::{
    CallStatus, LoopState, Node, PendingCall, RunEnd, StopReason, TransitionReason, Verdict,
};
use crate::tool::{ToolContext, ToolError, ToolProgress};
use crate::working::apply_effect;

/// The resource hardware tools lock when they name none.
pub const DEFAULT_HARDWARE_RESOURCE: &str = "hardware";

/// Bounds of the recovery paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryConfig {
    /// Empty replies answered with a nudge before the run fails.
    pub max_empty_reply_nudges: u32,
    /// Consecutive turns of only unparseable tool calls before the run fails.
    pub max_protocol_retries: u32,
    /// Consecutive prompt-too-long errors answered with a compaction.
    pub max_prompt_too_long_retries: u32,
    /// The user message sent after an empty reply.
    pub nudge_message: String,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            max_empty_reply_nudges: 1,
            max_protocol_retries: 3,
            max_prompt_too_long_retries: 2,
            nudge_message: "Your last reply was empty. Reply with your final answer in the \
                            message content, or call a tool."
                .to_owned(),
        }
    }
}

/// What is appended to every model view as a trailing system message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectionConfig {
    pub time: bool,
    pub working_state: bool,
    pub context_usage: bool,
}

impl Default for InjectionConfig {
    fn default() -> Self {
        Self {
            time: true,
            working_state: true,
            context_usage: true,
        }
    }
}

/// Everything configurable about a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Steps (model turns that led to tools or to a rejected answer) before
    /// the run stops.
    pub max_steps: u32,
    /// Input plus output tokens over the run.
    pub token_budget: Option<u64>,
    /// Running time over the run (time paused for approval excluded).
    pub wall_time: Option<Duration>,
    /// Longest a single tool call may run (counted after the resource lock
    /// was taken); an overrun is a `ToolError::Timeout` observation. Tools
    /// normally enforce their own limits; when set, this needs a tokio
    /// runtime with the time driver enabled.
    pub tool_timeout: Option<Duration>,
    pub context: ContextConfig,
    pub recovery: RecoveryConfig,
    pub approval: ApprovalConfig,
    pub gate: GateConfig,
    pub injection: InjectionConfig,
    /// Tool groups active from the start.
    pub initial_groups: Vec<String>,
    /// Passed to the model with every request.
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_steps: 40,
            token_budget: None,
            wall_time: None,
            tool_timeout: None,
            context: ContextConfig::default(),
            recovery: RecoveryConfig::default(),
            approval: ApprovalConfig::default(),
            gate: GateConfig::default(),
            injection: InjectionConfig::default(),
            initial_groups: Vec::new(),
            max_output_tokens: None,
            temperature: None,
        }
    }
}

/// Receives the state after every transition (the worker stores it in KV).
#[async_trait::async_trait]
pub trait CheckpointSink: Send + Sync {
    /// A failure is reported as an `Error` event; the run goes on.
    async fn save(&self, state: &LoopState) -> Result<(), String>;
}

/// Errors of the engine's API (never of a run: runs end with an [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the checkpoint's run already ended")]
    AlreadyFinished,
    #[error("the checkpoint is not paused for approval")]
    NotPaused,
    #[error("no call '{0}' is waiting for approval in this checkpoint")]
    UnknownCall(String),
    #[error("the run was dropped before it ended")]
    RunDropped,
}

/// How a run (or one segment of it) ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// An accepted answer.
    Final {
        text: String,
        verdict: Verdict,
        state: LoopState,
    },
    /// Waiting for decisions; resume with [`Engine::resume_with_decisions`]
    /// or [`Engine::resume_with_timeout_default`].
    Paused {
        checkpoint: LoopState,
        approvals: Vec<ApprovalRequest>,
    },
    /// Ended without an accepted answer.
    Stopped {
        reason: StopReason,
        message: String,
        state: LoopState,
    },
}

impl Outcome {
    /// The state the run ended (or paused) in.
    pub fn state(&self) -> &LoopState {
        match self {
            Self::Final { state, .. } | Self::Stopped { state, .. } => state,
            Self::Paused { checkpoint, .. } => checkpoint,
        }
    }
}

/// The engine. Cheap to clone; one engine serves many sessions.
#[derive(Clone)]
pub struct Engine {
    config: Arc<EngineConfig>,
    model: Arc<dyn ChatModel>,
    registry: Arc<ToolRegistry>,
    policy: Arc<RiskPolicy>,
    lock: Arc<dyn ResourceLock>,
    middlewares: Arc<[Arc<dyn Middleware>]>,
    clock: Arc<dyn Clock>,
    estimator: Arc<dyn TokenEstimator>,
    gate: Arc<dyn CompletionGate>,
    sink: Option<Arc<dyn CheckpointSink>>,
}

impl Engine {
    pub fn new(
        config: EngineConfig,
        model: Arc<dyn ChatModel>,
        registry: ToolRegistry,
        policy: RiskPolicy,
        lock: Arc<dyn ResourceLock>,
    ) -> Self {
        let gate = Arc::new(EvidenceGate {
            config: config.gate.clone(),
        });
        Self {
            config: Arc::new(config),
            model,
            registry: Arc::new(registry),
            policy: Arc::new(policy),
            lock,
            middlewares: Arc::from(Vec::new()),
            clock: Arc::new(SystemClock),
            estimator: Arc::new(CharsPerToken),
            gate,
            sink: None,
        }
    }

    /// Add a middleware; the first added is the outermost layer.
    pub fn with_middleware(mut self, middleware: Arc<dyn Middleware>) -> Self {
        let mut all: Vec<Arc<dyn Middleware>> = self.middlewares.iter().cloned().collect();
        all.push(middleware);
        self.middlewares = Arc::from(all);
        self
    }
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    pub fn with_estimator(mut self, estimator: Arc<dyn TokenEstimator>) -> Self {
        self.estimator = estimator;
        self
    }
    /// Replace the evidence gate built from `config.gate`.
    pub fn with_gate(mut self, gate: Arc<dyn CompletionGate>) -> Self {
        self.gate = gate;
        self
    }
    pub fn with_checkpoint_sink(mut self, sink: Arc<dyn CheckpointSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// Start a session from a user message.
    pub fn start(
        &self,
        session_id: impl Into<String>,
        system_prompt: impl Into<String>,
        user_input: impl Into<String>,
    ) -> (RunStream, RunHandle) {
        let mut state = LoopState::new(session_id, system_prompt, user_input);
        for group in &self.config.initial_groups {
            state.set_group(group, true);
        }
        self.launch(state, Launch::Fresh)
    }

    /// Continue from any checkpoint: one taken after any transition, or a
    /// paused one (which pauses again at once if decisions are missing).
    pub fn resume(&self, checkpoint: LoopState) -> Result<(RunStream, RunHandle), EngineError> {
        if checkpoint.node == Node::Done {
            return Err(EngineError::AlreadyFinished);
        }
        Ok(self.launch(
            checkpoint,
            Launch::Resume(TransitionReason::ApprovalDecided),
        ))
    }

    /// Resume a paused checkpoint with decisions per call id. Calls left
    /// undecided keep the loop paused.
    pub fn resume_with_decisions(
        &self,
        mut checkpoint: LoopState,
        decisions: HashMap<String, ApprovalDecision>,
    ) -> Result<(RunStream, RunHandle), EngineError> {
        if !checkpoint.is_paused() {
            return Err(if checkpoint.node == Node::Done {
                EngineError::AlreadyFinished
            } else {
                EngineError::NotPaused
            });
        }
        for id in decisions.keys() {
            if !checkpoint.awaiting_approval().any(|c| &c.call.id == id) {
                return Err(EngineError::UnknownCall(id.clone()));
            }
        }
        for call in &mut checkpoint.calls {
            if let Some(decision) = decisions.get(&call.call.id) {
                decide(call, decision, &mut checkpoint.risk, false);
            }
        }
        Ok(self.launch(
            checkpoint,
            Launch::Resume(TransitionReason::ApprovalDecided),
        ))
    }

    /// Resume a paused checkpoint whose approval timeout passed: every
    /// undecided call gets `config.approval.on_timeout`.
    pub fn resume_with_timeout_default(
        &self,
        mut checkpoint: LoopState,
    ) -> Result<(RunStream, RunHandle), EngineError> {
        if !checkpoint.is_paused() {
            return Err(EngineError::NotPaused);
        }
        let default = self.config.approval.on_timeout.clone();
        for call in &mut checkpoint.calls {
            if call.status == CallStatus::AwaitingApproval {
                decide(call, &default, &mut checkpoint.risk, true);
            }
        }
        Ok(self.launch(
            checkpoint,
            Launch::Resume(TransitionReason::ApprovalTimedOut),
        ))
    }

    /// Convenience for in-process approval: collect decisions from
    /// `decisions` until every paused call has one or the approval timeout
    /// passes, then resume (undecided calls get the timeout default). Needs
    /// a tokio runtime with the time driver.
    pub async fn resume_when_decided(
        &self,
        mut checkpoint: LoopState,
        decisions: &mut mpsc::Receiver<(String, ApprovalDecision)>,
    ) -> Result<(RunStream, RunHandle), EngineError> {
        if !checkpoint.is_paused() {
            return Err(EngineError::NotPaused);
        }
        let deadline = tokio::time::Instant::now() + self.config.approval.timeout;
        while checkpoint.is_paused() {
            match tokio::time::timeout_at(deadline, decisions.recv()).await {
                Ok(Some((id, decision))) => {
                    let risk = &mut checkpoint.risk;
                    if let Some(call) = checkpoint
                        .calls
                        .iter_mut()
                        .find(|c| c.call.id == id && c.status == CallStatus::AwaitingApproval)
                    {
                        decide(call, &decision, risk, false);
                    }
                }
                Ok(None) | Err(_) => return self.resume_with_timeout_default(checkpoint),
            }
        }
        Ok(self.launch(
            checkpoint,
            Launch::Resume(TransitionReason::ApprovalDecided),
        ))
    }

    fn launch(&self, state: LoopState, launch: Launch) -> (RunStream, RunHandle) {
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let control = RunControl {
            cancel: Arc::new(cancel_tx),
            groups: Arc::new(Mutex::new(Vec::new())),
        };
        let (outcome_tx, outcome_rx) = oneshot::channel();
        let now = self.clock.now_ms();
        let session: Arc<str> = Arc::from(state.session_id.as_str());
        let run = Run {
            engine: self.clone(),
            emitter: Emitter {
                session: session.clone(),
                queue: queue.clone(),
                seq: state.event_seq,
            },
            session,
            control: control.clone(),
            cancel_rx,
            segment_start_ms: now,
            segment_base_active_ms: state.active_ms,
            state,
            view: ViewCache::default(),
            approval_reason: match launch {
                Launch::Resume(reason) => reason,
                Launch::Fresh => TransitionReason::ApprovalDecided,
            },
        };
        let span = tracing::Span::current();
        let driver = Box::pin(run.drive().instrument(span));
        (
            RunStream {
                driver: Some(driver),
                queue,
                outcome: None,
                outcome_tx: Some(outcome_tx),
            },
            RunHandle {
                control,
                outcome: outcome_rx,
            },
        )
    }
}

enum Launch {
    Fresh,
    Resume(TransitionReason),
}

fn decide(
    call: &mut PendingCall,
    decision: &ApprovalDecision,
    risk: &mut crate::state::RiskTracker,
    timed_out: bool,
) {
    match decision {
        ApprovalDecision::Approve => call.status = CallStatus::Approved,
        ApprovalDecision::Deny { reason } => {
            risk.denied_approvals += 1;
            let why = reason.as_deref().unwrap_or(if timed_out {
                "approval timed out"
            } else {
                "no reason given"
            });
            call.status = CallStatus::Denied {
                observation: format!(
                    "error: the call to '{}' was denied by the reviewer: {why}",
                    call.call.name
                ),
            };
        }
    }
}

/// Steers a running loop from outside: cancel it, switch tool groups.
#[derive(Clone)]
pub struct RunControl {
    cancel: Arc<watch::Sender<bool>>,
    groups: Arc<Mutex<Vec<(String, bool)>>>,
}

impl RunControl {
    /// Stop the run at the next opportunity (model calls and tool calls in
    /// flight are dropped).
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }
    /// Switch a tool group on or off from the next reasoning node on.
    pub fn set_group_active(&self, group: impl Into<String>, active: bool) {
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((group.into(), active));
    }
}

/// The caller's side of a run.
pub struct RunHandle {
    control: RunControl,
    outcome: oneshot::Receiver<Outcome>,
}

impl RunHandle {
    pub fn control(&self) -> RunControl {
        self.control.clone()
    }
    pub fn cancel(&self) {
        self.control.cancel();
    }
    /// The outcome, once the stream has been driven to its end.
    pub async fn outcome(self) -> Result<Outcome, EngineError> {
        self.outcome.await.map_err(|_| EngineError::RunDropped)
    }
}

type Driver = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// The events of a run; polling it is what drives the run.
pub struct RunStream {
    driver: Option<Driver>,
    queue: Arc<Mutex<VecDeque<Event>>>,
    outcome: Option<Outcome>,
    outcome_tx: Option<oneshot::Sender<Outcome>>,
}

impl RunStream {
    fn pop(&self) -> Option<Event> {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// The outcome, once the stream has ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Drive the run to its end, returning every event and the outcome.
    pub async fn collect_all(mut self) -> (Vec<Event>, Outcome) {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        match self.outcome.take() {
            Some(outcome) => (events, outcome),
            // The stream only ends after the driver produced an outcome.
            None => unreachable_outcome(events),
        }
    }
}

fn unreachable_outcome(events: Vec<Event>) -> (Vec<Event>, Outcome) {
    let state = LoopState::default();
    (
        events,
        Outcome::Stopped {
            reason: StopReason::Aborted,
            message: "the run ended without an outcome".to_owned(),
            state,
        },
    )
}

impl Stream for RunStream {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            if let Some(event) = self.pop() {
                return Poll::Ready(Some(event));
            }
            let Some(driver) = self.driver.as_mut() else {
                return Poll::Ready(None);
            };
            match driver.as_mut().poll(cx) {
                Poll::Ready(outcome) => {
                    self.driver = None;
                    if let Some(tx) = self.outcome_tx.take() {
                        let _ = tx.send(outcome.clone());
                    }
                    self.outcome = Some(outcome);
                }
                Poll::Pending => {
                    return match self.pop() {
                        Some(event) => Poll::Ready(Some(event)),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }
}

struct Emitter {
    session: Arc<str>,
    queue: Arc<Mutex<VecDeque<Event>>>,
    seq: u64,
}

impl Emitter {
    fn emit(&mut self, step: u32, kind: EventKind) {
        let event = Event {
            session_id: self.session.clone(),
            step,
            seq: self.seq,
            kind,
        };
        self.seq += 1;
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(event);
    }
}

/// The model view of `history[covered_from..covered_to]`, built
/// incrementally: each step only converts the messages added since.
struct ViewCache {
    /// The request of the last model call, kept and extended in place:
    /// `[system?, task?, summary?, view..., injection?]`. The model gets a
    /// shared reference, so once it is done with it the engine owns it
    /// alone again and appending costs no copy.
    request: Arc<ChatRequest>,
    has_system: bool,
    injected: bool,
    built_from: usize,
    built_for_compactions: u32,
    covered_to: usize,
    /// Estimated tokens of everything but the injection.
    tokens: u64,
    valid: bool,
    tools_for_groups: Option<Vec<String>>,
}

impl Default for ViewCache {
    fn default() -> Self {
        Self {
            request: Arc::new(ChatRequest {
                messages: Vec::new(),
                tools: Vec::new(),
                tool_choice: ToolChoice::Auto,
                max_tokens: None,
                temperature: None,
            }),
            has_system: false,
            injected: false,
            built_from: 0,
            built_for_compactions: 0,
            covered_to: 0,
            tokens: 0,
            valid: false,
            tools_for_groups: None,
        }
    }
}

/// One run segment (from start or resume to end or pause).
struct Run {
    engine: Engine,
    session: Arc<str>,
    state: LoopState,
    emitter: Emitter,
    control: RunControl,
    cancel_rx: watch::Receiver<bool>,
    segment_start_ms: u64,
    segment_base_active_ms: u64,
    view: ViewCache,
    approval_reason: TransitionReason,
}

impl Run {
    fn cancelled(&self) -> bool {
        *self.cancel_rx.borrow()
    }

    fn emit(&mut self, kind: EventKind) {
        let step = self.state.step;
        self.emitter.emit(step, kind);
    }

    /// Record a transition; emits the Transition event.
    fn transition(&mut self, to: Node, reason: TransitionReason, detail: Option<String>) {
        let now = self.engine.clock.now_ms();
        let state = &mut self.state;
        state.active_ms = self.segment_base_active_ms + now.saturating_sub(self.segment_start_ms);
        let from = state.node;
        state.advance(to, reason, detail.clone(), now);
        self.emit(EventKind::Transition {
            from,
            to,
            reason,
            detail,
        });
        self.state.event_seq = self.emitter.seq;
    }

    fn finish(&mut self, text: String, verdict: Verdict) {
        self.state.end = Some(RunEnd::Final {
            text: text.clone(),
            verdict: verdict.clone(),
        });
        self.emit(EventKind::ReplyEnd { text, verdict });
        self.transition(Node::Done, TransitionReason::ModelReturnedFinal, None);
    }

    fn stop(&mut self, reason: StopReason, transition: TransitionReason, message: String) {
        self.state.end = Some(RunEnd::Stopped {
            reason,
            message: message.clone(),
        });
        self.emit(EventKind::Stopped {
            reason,
            message: message.clone(),
        });
        self.transition(Node::Done, transition, Some(message));
    }

    async fn checkpoint(&mut self) {
        if let Some(sink) = self.engine.sink.clone()
            && let Err(message) = sink.save(&self.state).await
        {
            self.emit(EventKind::Error {
                message: format!("checkpoint could not be saved: {message}"),
            });
        }
    }

    async fn drive(mut self) -> Outcome {
        loop {
            if self.state.node == Node::Done {
                return self.outcome();
            }
            if self.cancelled() {
                self.stop(
                    StopReason::Cancelled,
                    TransitionReason::Cancelled,
                    "the run was cancelled".to_owned(),
                );
                self.checkpoint().await;
                continue;
            }
            if self.state.is_paused() {
                let approvals = self.state.approval_requests();
                self.emit(EventKind::ApprovalRequired {
                    approvals: approvals.clone(),
                });
                self.state.event_seq = self.emitter.seq;
                self.checkpoint().await;
                return Outcome::Paused {
                    checkpoint: self.state.clone(),
                    approvals,
                };
            }
            let before = self.state.transitions.len();
            self.step_hooked().await;
            if self.state.transitions.len() == before && !self.cancelled() {
                self.stop(
                    StopReason::Aborted,
                    TransitionReason::Aborted,
                    "a middleware did not run the step".to_owned(),
                );
            }
        }
    }

    fn outcome(&self) -> Outcome {
        match &self.state.end {
            Some(RunEnd::Final { text, verdict }) => Outcome::Final {
                text: text.clone(),
                verdict: verdict.clone(),
                state: self.state.clone(),
            },
            Some(RunEnd::Stopped { reason, message }) => Outcome::Stopped {
                reason: *reason,
                message: message.clone(),
                state: self.state.clone(),
            },
            None => Outcome::Stopped {
                reason: StopReason::Aborted,
                message: "the run ended without a recorded end".to_owned(),
                state: self.state.clone(),
            },
        }
    }

    fn info(&self) -> StepInfo {
        StepInfo {
            session_id: self.session.clone(),
            step: self.state.step,
            node: self.state.node,
        }
    }

    fn report(&self) -> StepReport {
        StepReport {
            node: self.state.node,
            reason: self.state.last_transition().map(|t| t.reason),
        }
    }

    async fn step_hooked(&mut self) {
        let middlewares = self.engine.middlewares.clone();
        let info = self.info();
        let this = &mut *self;
        run_chain(
            &middlewares,
            info,
            |m, i, n| m.on_step(i, n),
            Box::new(move |_| {
                Box::pin(async move {
                    this.step_body().await;
                    this.report()
                })
            }),
        )
        .await;
    }

    /// Run nodes until the next step begins, the run ends or it pauses.
    async fn step_body(&mut self) {
        loop {
            match self.state.node {
                Node::Start => {
                    self.transition(Node::Reasoning, TransitionReason::UserInput, None);
                }
                Node::Reasoning => self.reasoning_hooked().await,
                Node::ToolRouting => self.route().await,
                Node::HumanApproval => {
                    if self.state.is_paused() {
                        return;
                    }
                    let reason = self.approval_reason;
                    self.transition(Node::ToolExecution, reason, None);
                }
                Node::ToolExecution => self.acting_hooked().await,
                Node::Observation => self.observe(),
                Node::Done => return,
            }
            self.checkpoint().await;
            if self.cancelled() {
                return;
            }
            let new_step = matches!(
                self.state.last_transition().map(|t| t.reason),
                Some(TransitionReason::ObservationsRecorded | TransitionReason::StopHookBlocking)
            );
            match self.state.node {
                Node::Done => return,
                Node::HumanApproval if self.state.is_paused() => return,
                Node::Reasoning if new_step => return,
                _ => {}
            }
        }
    }

    // ---------------------------------------------------------------- reasoning

    async fn reasoning_hooked(&mut self) {
        let middlewares = self.engine.middlewares.clone();
        let info = self.info();
        let before = self.state.transitions.len();
        let this = &mut *self;
        run_chain(
            &middlewares,
            info,
            |m, i, n| m.on_reasoning(i, n),
            Box::new(move |_| {
                Box::pin(async move {
                    this.reasoning().await;
                    this.report()
                })
            }),
        )
        .await;
        if self.state.transitions.len() == before && !self.cancelled() {
            self.stop(
                StopReason::Aborted,
                TransitionReason::Aborted,
                "a middleware did not run the reasoning node".to_owned(),
            );
        }
    }

    fn apply_group_changes(&mut self) {
        let changes: Vec<(String, bool)> = std::mem::take(
            &mut *self
                .control
                .groups
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (group, active) in changes {
            self.state.set_group(&group, active);
        }
    }

    /// Stop when a budget that does not need a model call to check is spent.
    fn budget_stop(&mut self) -> bool {
        let config = self.engine.config.clone();
        if let Some(budget) = config.token_budget
            && self.state.usage.total() >= budget
        {
            let used = self.state.usage.total();
            self.stop(
                StopReason::TokenBudget,
                TransitionReason::TokenBudgetExceeded,
                format!("token budget exhausted: {used} of {budget} tokens used"),
            );
            return true;
        }
        if let Some(limit) = config.wall_time {
            let now = self.engine.clock.now_ms();
            let active = self.segment_base_active_ms + now.saturating_sub(self.segment_start_ms);
            let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
            if active >= limit_ms {
                self.stop(
                    StopReason::WallTime,
                    TransitionReason::WallTimeExceeded,
                    format!("wall time exhausted: {active} ms of {limit_ms} ms"),
                );
                return true;
            }
        }
        false
    }

    async fn reasoning(&mut self) {
        self.apply_group_changes();
        if self.budget_stop() {
            return;
        }
        let config = self.engine.config.clone();
        self.sync_view();
        let window = config.context.window_tokens as f64;
        if self.view_tokens() as f64 > config.context.trigger_ratio * window
            && let Err(message) = self.compact(CompactionTrigger::Threshold).await
        {
            self.emit(EventKind::Error {
                message: format!("context compaction failed: {message}"),
            });
        }
        let request = self.build_request().await;
        let estimated_input = self.view_tokens();
        let result = self.model_turn(request, false).await;
        if self.cancelled() {
            return;
        }
        let turn = match result {
            Ok(turn) => turn,
            Err(ModelError::PromptTooLong(message)) => {
                self.emit(EventKind::Error {
                    message: format!("prompt too long: {message}"),
                });
                if self.state.recovery.prompt_too_long_retries
                    < config.recovery.max_prompt_too_long_retries
                {
                    self.state.recovery.prompt_too_long_retries += 1;
                    match self.compact(CompactionTrigger::PromptTooLong).await {
                        Ok(()) => {
                            self.transition(
                                Node::Reasoning,
                                TransitionReason::ModelRecoveryRetry,
                                Some("prompt too long: history compacted".to_owned()),
                            );
                            return;
                        }
                        Err(why) => {
                            self.stop(
                                StopReason::PromptTooLong,
                                TransitionReason::ModelError,
                                format!("prompt too long and compaction failed: {why}"),
                            );
                            return;
                        }
                    }
                }
                self.stop(
                    StopReason::PromptTooLong,
                    TransitionReason::ModelError,
                    format!("prompt still too long after compaction: {message}"),
                );
                return;
            }
            Err(error) => {
                let message = error.to_string();
                self.emit(EventKind::Error {
                    message: message.clone(),
                });
                self.stop(
                    StopReason::ModelError,
                    TransitionReason::ModelError,
                    message,
                );
                return;
            }
        };
        self.account_usage(&turn, estimated_input);
        self.state.recovery.prompt_too_long_retries = 0;

        if turn.tool_calls.is_empty() && turn.text.trim().is_empty() {
            if self.state.recovery.empty_reply_nudges < config.recovery.max_empty_reply_nudges {
                self.state.recovery.empty_reply_nudges += 1;
                self.state
                    .push_message(Message::user(config.recovery.nudge_message.clone()));
                self.transition(
                    Node::Reasoning,
                    TransitionReason::ModelRecoveryRetry,
                    Some("empty reply: nudged".to_owned()),
                );
            } else {
                self.stop(
                    StopReason::EmptyReply,
                    TransitionReason::ModelError,
                    "the model kept replying with neither text nor tool calls".to_owned(),
                );
            }
            return;
        }
        self.state.recovery.empty_reply_nudges = 0;

        if turn.tool_calls.is_empty() {
            self.judge_answer(turn.text);
        } else {
            self.accept_tool_calls(turn);
        }
    }

    fn account_usage(&mut self, turn: &ModelTurn, estimated_input: u64) {
        match turn.usage {
            Some(usage) => {
                self.state.usage.input_tokens += usage.input_tokens;
                self.state.usage.output_tokens += usage.output_tokens;
            }
            None => {
                let reply = Message::assistant(turn.text.clone(), turn.tool_calls.clone());
                self.state.usage.input_tokens += estimated_input;
                self.state.usage.output_tokens += self.engine.estimator.estimate(&reply);
            }
        }
    }

    fn judge_answer(&mut self, text: String) {
        let verdict = self
            .engine
            .gate
            .evaluate(&text, &self.state.evidence, &self.state.working);
        match verdict {
            GateVerdict::Pass => {
                self.state
                    .push_message(Message::assistant(text.clone(), Vec::new()));
                self.finish(text, Verdict::Pass);
            }
            GateVerdict::Unverified { missing } => {
                self.state
                    .push_message(Message::assistant(text.clone(), Vec::new()));
                self.finish(text, Verdict::Unverified { missing });
            }
            GateVerdict::Fail { feedback } => {
                self.state
                    .push_message(Message::assistant(text, Vec::new()));
                let max_blocks = self.engine.config.gate.max_blocks;
                if self.state.recovery.completion_blocks >= max_blocks {
                    self.stop(
                        StopReason::CompletionGateFailed,
                        TransitionReason::CompletionGateExhausted,
                        format!(
                            "the answer was rejected {} times by the completion gate: {feedback}",
                            max_blocks + 1
                        ),
                    );
                    return;
                }
                self.state.recovery.completion_blocks += 1;
                self.state.push_message(Message::user(feedback.clone()));
                if self.steps_exhausted() {
                    return;
                }
                self.state.step += 1;
                self.transition(
                    Node::Reasoning,
                    TransitionReason::StopHookBlocking,
                    Some(feedback),
                );
            }
        }
    }

    fn steps_exhausted(&mut self) -> bool {
        let max = self.engine.config.max_steps;
        if self.state.step >= max {
            self.stop(
                StopReason::MaxSteps,
                TransitionReason::MaxStepsExceeded,
                format!("step limit reached: {max} steps"),
            );
            true
        } else {
            false
        }
    }

    fn accept_tool_calls(&mut self, turn: ModelTurn) {
        let step = self.state.step;
        let mut calls = turn.tool_calls;
        for (index, call) in calls.iter_mut().enumerate() {
            if call.id.is_empty() {
                call.id = format!("call_{step}_{index}");
            }
        }
        self.state
            .push_message(Message::assistant(turn.text, calls.clone()));
        let mut pending = Vec::with_capacity(calls.len());
        let mut protocol_errors: u32 = 0;
        for call in calls {
            let (arguments, status) = match parse_arguments(&call.arguments) {
                Ok(value) => (Some(value), CallStatus::Pending),
                Err(rejection) => {
                    protocol_errors += 1;
                    (
                        None,
                        CallStatus::Rejected {
                            observation: rejection.observation(),
                        },
                    )
                }
            };
            pending.push(PendingCall {
                call,
                arguments,
                risk: None,
                status,
                effects: Vec::new(),
            });
        }
        self.state.risk.protocol_errors += protocol_errors;
        if protocol_errors as usize == pending.len() {
            // Nothing usable: answer every call with the protocol error and
            // let the model try again, within bounds.
            for call in &pending {
                if let CallStatus::Rejected { observation } = &call.status {
                    self.emit(EventKind::ToolResult {
                        call_id: call.call.id.clone(),
                        name: call.call.name.clone(),
                        ok: false,
                        content: observation.clone(),
                        data: None,
                        effects: Vec::new(),
                        lock_wait_ms: None,
                        duration_ms: 0,
                    });
                    self.state
                        .push_message(Message::tool(call.call.id.clone(), observation.clone()));
                }
            }
            self.state.recovery.protocol_retries += 1;
            let max = self.engine.config.recovery.max_protocol_retries;
            if self.state.recovery.protocol_retries > max {
                self.stop(
                    StopReason::ProtocolErrors,
                    TransitionReason::ModelError,
                    format!(
                        "tool-call arguments were unparseable {} times in a row",
                        max + 1
                    ),
                );
            } else {
                self.transition(
                    Node::Reasoning,
                    TransitionReason::ModelRecoveryRetry,
                    Some("unparseable tool-call arguments".to_owned()),
                );
            }
            return;
        }
        self.state.recovery.protocol_retries = 0;
        self.state.calls = pending;
        self.transition(
            Node::ToolRouting,
            TransitionReason::ModelReturnedToolCalls,
            None,
        );
    }

    // ------------------------------------------------------------- model view

    /// Bring the kept request up to date with the history: append what was
    /// added since the last call, or rebuild after a compaction.
    fn sync_view(&mut self) {
        let history = &self.state.history;
        let projection = &self.state.projection;
        let context = &self.engine.config.context;
        let estimator = &self.engine.estimator;
        let pinned = history.first().filter(|m| m.role == Role::User);
        let cache = &mut self.view;
        let request = Arc::make_mut(&mut cache.request);
        if cache.injected {
            request.messages.pop();
            cache.injected = false;
        }
        if !cache.valid
            || cache.built_from != projection.view_start
            || cache.built_for_compactions != self.state.recovery.compactions
            || cache.covered_to > history.len()
        {
            request.messages.clear();
            cache.tokens = 0;
            let prompt = &self.state.system_prompt;
            cache.has_system = !prompt.is_empty();
            if cache.has_system {
                request.messages.push(Message::system(prompt.clone()));
            }
            if projection.view_start > 0 {
                if let Some(task) = pinned {
                    request.messages.push(task.clone());
                }
                if let Some(summary) = &projection.summary {
                    request.messages.push(Message::system(format!(
                        "Summary of the earlier conversation:\n{summary}"
                    )));
                }
            }
            cache.tokens = request.messages.iter().map(|m| estimator.estimate(m)).sum();
            cache.built_from = projection.view_start;
            cache.covered_to = projection.view_start;
            cache.built_for_compactions = self.state.recovery.compactions;
            cache.valid = true;
        }
        for message in &history[cache.covered_to.min(history.len())..] {
            let shown = view_message(message, context);
            cache.tokens += estimator.estimate(&shown);
            request.messages.push(shown);
        }
        cache.covered_to = history.len();
    }

    /// Estimated tokens of the view without the trailing injection.
    fn view_tokens(&self) -> u64 {
        self.view.tokens
    }

    fn pinned_task(&self) -> Option<&Message> {
        self.state.history.first().filter(|m| m.role == Role::User)
    }

    /// The request for the next model call (shared with the kept view).
    async fn build_request(&mut self) -> Arc<ChatRequest> {
        let middlewares = self.engine.middlewares.clone();
        let prompt = if middlewares.is_empty() {
            None
        } else {
            Some(
                run_chain(
                    &middlewares,
                    SystemPromptInput {
                        session_id: self.session.clone(),
                        step: self.state.step,
                        prompt: self.state.system_prompt.clone(),
                    },
                    |m, i, n| m.on_system_prompt(i, n),
                    Box::new(|input: SystemPromptInput| Box::pin(async move { input.prompt })),
                )
                .await,
            )
        };
        self.sync_view();
        let injection = self.injection();
        let groups_changed = self.view.tools_for_groups.as_ref() != Some(&self.state.active_groups);
        let specs = groups_changed.then(|| self.engine.registry.specs(&self.state.active_groups));
        let config = &self.engine.config;
        let cache = &mut self.view;
        let request = Arc::make_mut(&mut cache.request);
        if let Some(prompt) = prompt {
            match (cache.has_system, prompt.is_empty()) {
                (true, false) => {
                    if let Some(first) = request.messages.first_mut()
                        && first.content != prompt
                    {
                        first.content = prompt;
                    }
                }
                (true, true) => {
                    request.messages.remove(0);
                    cache.has_system = false;
                }
                (false, false) => {
                    request.messages.insert(0, Message::system(prompt));
                    cache.has_system = true;
                }
                (false, true) => {}
            }
        }
        if let Some(injection) = injection {
            request.messages.push(Message::system(injection));
            cache.injected = true;
        }
        if let Some(specs) = specs {
            request.tools = specs;
            cache.tools_for_groups = Some(self.state.active_groups.clone());
        }
        request.max_tokens = config.max_output_tokens;
        request.temperature = config.temperature;
        cache.request.clone()
    }

    fn injection(&self) -> Option<String> {
        use std::fmt::Write as _;
        let config = &self.engine.config;
        let injection = &config.injection;
        if !(injection.time || injection.working_state || injection.context_usage) {
            return None;
        }
        let mut text = String::from("[session context]");
        if injection.time {
            let _ = write!(
                text,
                "\ncurrent time: {}",
                format_rfc3339(self.engine.clock.now_ms())
            );
        }
        if injection.context_usage {
            let used = self.view_tokens();
            let window = config.context.window_tokens.max(1);
            let _ = write!(
                text,
                "\ncontext: {used} of {window} tokens ({}%); step {} of {}",
                used.saturating_mul(100) / window,
                self.state.step,
                config.max_steps
            );
            if let Some(budget) = config.token_budget {
                let _ = write!(
                    text,
                    "; tokens spent {} of {budget}",
                    self.state.usage.total()
                );
            }
        }
        if injection.working_state {
            if !self.state.working.is_empty() {
                let json = serde_json::to_string(&*self.state.working).unwrap_or_default();
                let _ = write!(text, "\nworking state: {json}");
            }
            let ledger = &self.state.evidence;
            if let Some(mutation) = &ledger.last_mutation {
                let _ = write!(
                    text,
                    "\nlatest change: {} at step {}",
                    mutation.target, mutation.step
                );
            }
            let mut kinds: Vec<&str> = ledger.records.iter().map(|r| r.kind.as_str()).collect();
            kinds.sort_unstable();
            kinds.dedup();
            for kind in kinds {
                let status = if ledger.has_valid(kind) {
                    "passed on the current code"
                } else if ledger.has_voided(kind) {
                    "passed earlier, void after the latest change"
                } else {
                    "failed"
                };
                let _ = write!(text, "\nevidence {kind}: {status}");
            }
        }
        Some(text)
    }

    /// One model call through the middleware chain, streamed into events
    /// (unless it is a summarization request).
    async fn model_turn(
        &mut self,
        request: Arc<ChatRequest>,
        summarization: bool,
    ) -> Result<ModelTurn, ModelError> {
        let middlewares = self.engine.middlewares.clone();
        let input = ModelCallInput {
            session_id: self.session.clone(),
            step: self.state.step,
            model: self.engine.model.model_name().to_owned(),
            summarization,
            request,
        };
        let model = self.engine.model.clone();
        let step = self.state.step;
        let emitter = &mut self.emitter;
        let mut cancel = self.cancel_rx.clone();
        run_chain(
            &middlewares,
            input,
            |m, i, n| m.on_model_call(i, n),
            Box::new(move |input: ModelCallInput| {
                Box::pin(async move {
                    let streamed = stream_turn(model.as_ref(), input.request, emitter, step, !summarization);
                    tokio::select! {
                        biased;
                        turn = streamed => turn,
                        _ = cancel.wait_for(|c| *c) => Err(ModelError::Other("cancelled".to_owned())),
                    }
                })
            }),
        )
        .await
    }

    // ---------------------------------------------------------------- compaction

    async fn compact(&mut self, trigger: CompactionTrigger) -> Result<(), String> {
        let middlewares = self.engine.middlewares.clone();
        let input = CompressionInput {
            session_id: self.session.clone(),
            step: self.state.step,
            trigger,
            tokens_before: self.view_tokens(),
        };
        let tokens_before = input.tokens_before;
        let this = &mut *self;
        let report = run_chain(
            &middlewares,
            input,
            |m, i, n| m.on_compress_context(i, n),
            Box::new(move |input: CompressionInput| {
                Box::pin(async move { this.compact_core(input.trigger).await })
            }),
        )
        .await?;
        self.emit(EventKind::ContextCompacted {
            tokens_before,
            tokens_after: report.tokens_after,
            summarized_messages: report.summarized_messages,
        });
        Ok(())
    }

    async fn compact_core(
        &mut self,
        trigger: CompactionTrigger,
    ) -> Result<CompressionReport, String> {
        let context = self.engine.config.context.clone();
        let history = self.state.history.clone();
        // The task is pinned, never summarized.
        let pinned = usize::from(self.pinned_task().is_some());
        let region_start = self.state.projection.view_start.max(pinned);
        let turns = turn_starts(&history, region_start);
        let mut keep = context.keep_recent_turns.max(1);
        if trigger == CompactionTrigger::PromptTooLong {
            keep = (keep >> self.state.recovery.prompt_too_long_retries.min(16)).max(1);
        }
        // Aim under the reserve: drop kept turns while the kept part alone
        // would not fit.
        let target = (context.window_tokens as f64 * (1.0 - context.reserve_ratio)) as u64;
        let estimator = self.engine.estimator.clone();
        while keep > 1 && turns.len() >= keep {
            let cut = turns[turns.len() - keep];
            let kept: u64 = history[cut..].iter().map(|m| estimator.estimate(m)).sum();
            if kept <= target {
                break;
            }
            keep -= 1;
        }
        if turns.len() <= keep {
            return Err(format!(
                "nothing old enough to summarize ({} turns in view, {keep} kept)",
                turns.len()
            ));
        }
        let cut = turns[turns.len() - keep];
        let older = &history[region_start..cut];
        let transcript =
            render_transcript(self.state.projection.summary.as_deref(), older, &context);
        let request = Arc::new(ChatRequest {
            messages: vec![
                Message::system(context.summary_instruction.clone()),
                Message::user(transcript),
            ],
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            max_tokens: self.engine.config.max_output_tokens,
            temperature: None,
        });
        let estimated_input = request.messages.iter().map(|m| estimator.estimate(m)).sum();
        let turn = self
            .model_turn(request, true)
            .await
            .map_err(|e| format!("the summarization request failed: {e}"))?;
        self.account_usage(&turn, estimated_input);
        let summary = turn.text.trim().to_owned();
        if summary.is_empty() {
            return Err("the summarization request returned no text".to_owned());
        }
        self.state.projection.summary = Some(summary);
        self.state.projection.view_start = cut;
        self.state.recovery.compactions += 1;
        self.sync_view();
        Ok(CompressionReport {
            summarized_messages: cut - region_start,
            tokens_after: self.view_tokens(),
        })
    }

    // ------------------------------------------------------------------ routing

    async fn route(&mut self) {
        let middlewares = self.engine.middlewares.clone();
        let registry = self.engine.registry.clone();
        let policy = self.engine.policy.clone();
        let mut calls = std::mem::take(&mut self.state.calls);
        for call in &mut calls {
            if call.status != CallStatus::Pending {
                continue;
            }
            let entry = match registry.available(&call.call.name, &self.state.active_groups) {
                Ok(entry) => entry,
                Err(rejection) => {
                    self.count_rejection(&rejection);
                    call.status = CallStatus::Rejected {
                        observation: rejection.observation(),
                    };
                    continue;
                }
            };
            let parsed = call.arguments.take().unwrap_or(serde_json::Value::Null);
            let arguments = match ToolRegistry::prepare_arguments(entry, parsed) {
                Ok(arguments) => arguments,
                Err(rejection) => {
                    self.count_rejection(&rejection);
                    call.status = CallStatus::Rejected {
                        observation: rejection.observation(),
                    };
                    continue;
                }
            };
            let risk = policy.risk_of(&call.call.name, entry.tool.risk());
            call.risk = Some(risk);
            let policy_verdict = policy.permission(risk);
            let permission = if middlewares.is_empty() {
                policy_verdict
            } else {
                run_chain(
                    &middlewares,
                    PermissionInput {
                        session_id: self.session.clone(),
                        step: self.state.step,
                        call_id: call.call.id.clone(),
                        tool: call.call.name.clone(),
                        arguments: arguments.clone(),
                        risk,
                    },
                    |m, i, n| m.on_check_permission(i, n),
                    Box::new(move |_| Box::pin(async move { policy_verdict })),
                )
                .await
            };
            call.arguments = Some(arguments);
            call.status = match permission {
                Permission::Allow => CallStatus::Approved,
                Permission::Ask => CallStatus::AwaitingApproval,
                Permission::Deny { reason } => {
                    self.state.risk.permission_denied += 1;
                    CallStatus::Denied {
                        observation: format!(
                            "error: permission to call '{}' was denied: {reason}",
                            call.call.name
                        ),
                    }
                }
            };
        }
        let awaiting = calls
            .iter()
            .filter(|c| c.status == CallStatus::AwaitingApproval)
            .count();
        self.state.calls = calls;
        if awaiting > 0 {
            self.transition(
                Node::HumanApproval,
                TransitionReason::ApprovalRequired,
                Some(format!("{awaiting} call(s) need approval")),
            );
        } else {
            self.transition(Node::ToolExecution, TransitionReason::ToolsRouted, None);
        }
    }

    fn count_rejection(&mut self, rejection: &CallRejection) {
        let risk = &mut self.state.risk;
        match rejection {
            CallRejection::UnknownTool(_) => risk.unknown_tool += 1,
            CallRejection::NotAllowed(_) => risk.tool_not_allowed += 1,
            CallRejection::Protocol(_) => risk.protocol_errors += 1,
            CallRejection::Normalize(_) => risk.normalize_errors += 1,
            CallRejection::Schema(_) => risk.schema_errors += 1,
        }
    }

    // ---------------------------------------------------------------- execution

    async fn acting_hooked(&mut self) {
        let middlewares = self.engine.middlewares.clone();
        let info = self.info();
        let before = self.state.transitions.len();
        let this = &mut *self;
        run_chain(
            &middlewares,
            info,
            |m, i, n| m.on_acting(i, n),
            Box::new(move |_| {
                Box::pin(async move {
                    this.execute().await;
                    this.report()
                })
            }),
        )
        .await;
        if self.state.transitions.len() == before && !self.cancelled() {
            self.stop(
                StopReason::Aborted,
                TransitionReason::Aborted,
                "a middleware did not run the tool-execution node".to_owned(),
            );
        }
    }

    async fn execute(&mut self) {
        // Report refusals first, so every requested call has a result event.
        let refused: Vec<(String, String, String)> = self
            .state
            .calls
            .iter()
            .filter_map(|c| match &c.status {
                CallStatus::Rejected { observation } | CallStatus::Denied { observation } => {
                    Some((c.call.id.clone(), c.call.name.clone(), observation.clone()))
                }
                _ => None,
            })
            .collect();
        for (call_id, name, content) in refused {
            self.emit(EventKind::ToolResult {
                call_id,
                name,
                ok: false,
                content,
                data: None,
                effects: Vec::new(),
                lock_wait_ms: None,
                duration_ms: 0,
            });
        }

        // Consecutive concurrency-safe calls form one concurrent batch;
        // every other call runs alone, in the model's order.
        let registry = self.engine.registry.clone();
        let approved: Vec<usize> = self
            .state
            .calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.status == CallStatus::Approved)
            .map(|(i, _)| i)
            .collect();
        let mut batches: Vec<Vec<usize>> = Vec::new();
        let mut open_concurrent = false;
        for index in approved {
            let safe = registry
                .get(&self.state.calls[index].call.name)
                .is_some_and(|e| e.tool.concurrency_safe());
            match batches.last_mut() {
                Some(batch) if safe && open_concurrent => batch.push(index),
                _ => batches.push(vec![index]),
            }
            open_concurrent = safe;
        }
        for batch in batches {
            if self.cancelled() {
                return;
            }
            self.run_batch(&batch).await;
        }
        if self.cancelled() {
            return;
        }
        self.transition(Node::Observation, TransitionReason::ToolsExecuted, None);
    }

    async fn run_batch(&mut self, batch: &[usize]) {
        let engine = self.engine.clone();
        let step = self.state.step;
        let (progress_tx, mut progress_rx) = mpsc::unbounded_channel::<(String, ToolProgress)>();
        let mut jobs = Vec::with_capacity(batch.len());
        for &index in batch {
            let call = &self.state.calls[index];
            let Some(entry) = engine.registry.get(&call.call.name) else {
                continue;
            };
            let risk = call.risk.unwrap_or(crate::tool::Risk::High);
            let arguments = call.arguments.clone().unwrap_or(serde_json::Value::Null);
            jobs.push((
                index,
                entry,
                ToolCallInfo {
                    session_id: self.session.clone(),
                    step,
                    call_id: call.call.id.clone(),
                    tool: call.call.name.clone(),
                    risk,
                },
                arguments,
            ));
        }
        for (_, _, info, arguments) in &jobs {
            let event = EventKind::ToolCall {
                call_id: info.call_id.clone(),
                name: info.tool.clone(),
                arguments: arguments.clone(),
                risk: info.risk,
            };
            self.emit(event);
        }
        let middlewares = engine.middlewares.clone();
        let lock = engine.lock.clone();
        let tool_timeout = engine.config.tool_timeout;
        let mut running: FuturesUnordered<_> = jobs
            .into_iter()
            .map(|(index, entry, info, arguments)| {
                let ctx = ToolContext::new(self.session.to_string(), info.call_id.clone(), step)
                    .with_progress(progress_tx.clone());
                let lock = lock.clone();
                let middlewares = &middlewares;
                async move {
                    let outcome = run_chain(
                        middlewares,
                        info,
                        |m, i, n| m.on_tool_call(i, n),
                        Box::new(move |_info: ToolCallInfo| {
                            Box::pin(async move {
                                let started = Instant::now();
                                let guard = if entry.tool.needs_hardware() {
                                    // Without a named resource, all such
                                    // tools share one lock: the safe default.
                                    let resource = entry
                                        .tool
                                        .resource()
                                        .unwrap_or_else(|| DEFAULT_HARDWARE_RESOURCE.to_owned());
                                    Some(lock.acquire(&resource).await)
                                } else {
                                    None
                                };
                                let lock_wait = guard.as_ref().map(|g| g.waited);
                                let call = entry.tool.call(arguments, &ctx);
                                let result = match tool_timeout {
                                    Some(limit) => tokio::time::timeout(limit, call)
                                        .await
                                        .unwrap_or(Err(ToolError::Timeout(limit))),
                                    None => call.await,
                                };
                                drop(guard);
                                ToolCallOutcome {
                                    result,
                                    lock_wait,
                                    duration: started.elapsed(),
                                }
                            })
                        }),
                    )
                    .await;
                    (index, outcome)
                }
            })
            .collect();
        drop(progress_tx);
        let mut cancel = self.cancel_rx.clone();
        loop {
            tokio::select! {
                biased;
                Some((call_id, progress)) = progress_rx.recv() => {
                    self.emit(EventKind::ToolStateUpdate {
                        call_id,
                        message: progress.message,
                        fraction: progress.fraction,
                    });
                }
                finished = running.next() => {
                    let Some((index, outcome)) = finished else { break };
                    // Progress sent before the call returned comes first.
                    while let Ok((call_id, progress)) = progress_rx.try_recv() {
                        self.emit(EventKind::ToolStateUpdate {
                            call_id,
                            message: progress.message,
                            fraction: progress.fraction,
                        });
                    }
                    self.record_result(index, outcome);
                }
                _ = cancel.wait_for(|c| *c) => return,
            }
        }
    }

    fn record_result(&mut self, index: usize, outcome: ToolCallOutcome) {
        let Some(call) = self.state.calls.get_mut(index) else {
            return;
        };
        let lock_wait_ms = outcome
            .lock_wait
            .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
        let duration_ms = u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX);
        let call_id = call.call.id.clone();
        let name = call.call.name.clone();
        let event = match outcome.result {
            Ok(output) => {
                call.status = CallStatus::Finished {
                    ok: true,
                    observation: output.content.clone(),
                };
                call.effects = output.effects.clone();
                EventKind::ToolResult {
                    call_id,
                    name,
                    ok: true,
                    content: output.content,
                    data: output.data,
                    effects: output.effects,
                    lock_wait_ms,
                    duration_ms,
                }
            }
            Err(error) => {
                let content = format!("error: {error}");
                call.status = CallStatus::Finished {
                    ok: false,
                    observation: content.clone(),
                };
                self.state.risk.tool_errors += 1;
                EventKind::ToolResult {
                    call_id,
                    name,
                    ok: false,
                    content,
                    data: None,
                    effects: Vec::new(),
                    lock_wait_ms,
                    duration_ms,
                }
            }
        };
        self.emit(event);
    }

    // --------------------------------------------------------------- observation

    fn observe(&mut self) {
        let calls = std::mem::take(&mut self.state.calls);
        let step = self.state.step;
        let mut working = None;
        let mut ledger = None;
        for call in calls {
            let content = match call.status {
                CallStatus::Rejected { observation }
                | CallStatus::Denied { observation }
                | CallStatus::Finished { observation, .. } => observation,
                CallStatus::Pending | CallStatus::AwaitingApproval | CallStatus::Approved => {
                    format!("error: the call to '{}' was not executed", call.call.name)
                }
            };
            if !call.effects.is_empty() {
                let working = working.get_or_insert_with(|| (*self.state.working).clone());
                let ledger = ledger.get_or_insert_with(|| (*self.state.evidence).clone());
                for effect in &call.effects {
                    apply_effect(working, ledger, effect, step);
                }
            }
            self.state
                .push_message(Message::tool(call.call.id, content));
        }
        if let Some(working) = working {
            self.state.working = Arc::new(working);
        }
        if let Some(ledger) = ledger {
            self.state.evidence = Arc::new(ledger);
        }
        if self.budget_stop() || self.steps_exhausted() {
            return;
        }
        self.state.step += 1;
        self.transition(
            Node::Reasoning,
            TransitionReason::ObservationsRecorded,
            None,
        );
    }
}

/// Stream one model turn, emitting thinking and text deltas as they come.
async fn stream_turn(
    model: &dyn ChatModel,
    request: Arc<ChatRequest>,
    emitter: &mut Emitter,
    step: u32,
    emit: bool,
) -> Result<ModelTurn, ModelError> {
    let mut stream = model.stream_shared(request).await?;
    let mut turn = ModelTurn::default();
    while let Some(item) = stream.next().await {
        match item? {
            ModelEvent::ThinkingDelta { text } => {
                if emit {
                    emitter.emit(step, EventKind::Thinking { text: text.clone() });
                }
                turn.thinking.push_str(&text);
            }
            ModelEvent::TextDelta { text } => {
                if emit {
                    emitter.emit(step, EventKind::TextDelta { text: text.clone() });
                }
                turn.text.push_str(&text);
            }
            ModelEvent::ToolCall { call } => turn.tool_calls.push(call),
            ModelEvent::Usage { usage } => {
                let total = turn.usage.get_or_insert_with(Default::default);
                total.input_tokens += usage.input_tokens;
                total.output_tokens += usage.output_tokens;
            }
            ModelEvent::Finish { reason } => turn.finish = Some(reason),
        }
    }
    Ok(turn)
}
