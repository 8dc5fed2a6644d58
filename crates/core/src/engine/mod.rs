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
//!
//! This module holds the [`Engine`] (configuration, entry points) and the
//! state of one run segment (`Run`); the stages of the loop each add an
//! `impl Run` block in their own module, in loop order: `run` (the driver
//! and the middleware hooks around steps and nodes), `reasoning`,
//! `model_view` and `compaction` (what the model sees), `routing`,
//! `execution`, `observation`. They use this module, the plain pieces beside
//! it (`config`, `checkpoint`, `control`, `stream`) and the rest of the
//! crate, never another stage's items, so the modules import one way.

mod checkpoint;
mod compaction;
mod config;
mod control;
mod execution;
mod model_view;
mod observation;
mod reasoning;
mod routing;
mod run;
mod stream;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::clock::{Clock, SystemClock};
use crate::context::{CharsPerToken, TokenEstimator};
use crate::event::ApprovalRequest;
use crate::gate::{CompletionGate, EvidenceGate};
use crate::lock::ResourceLock;
use crate::middleware::Middleware;
use crate::model::ChatModel;
use crate::policy::{ApprovalDecision, RiskPolicy};
use crate::registry::ToolRegistry;
use crate::state::{
    CallStatus, LoopState, Node, PendingCall, StopReason, TransitionReason, Verdict,
};

pub use checkpoint::{CheckpointSink, Durability};
pub use config::{
    DEFAULT_HARDWARE_RESOURCE, EngineConfig, InjectionConfig, InjectionPlacement, RecoveryConfig,
};
pub use control::{RunControl, RunHandle};
pub use stream::RunStream;

use model_view::ViewCache;
use stream::Emitter;

/// Errors of the engine's API (never of a run: runs end with an [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint is of a run that already reached `Done`.
    #[error("the checkpoint's run already ended")]
    AlreadyFinished,
    /// Decisions were given for a checkpoint that waits for none.
    #[error("the checkpoint is not paused for approval")]
    NotPaused,
    /// A decision names a call (by id) that is not waiting for approval.
    #[error("no call '{0}' is waiting for approval in this checkpoint")]
    UnknownCall(String),
    /// The [`RunStream`] was dropped before the run produced its outcome.
    #[error("the run was dropped before it ended")]
    RunDropped,
}

/// How a run (or one segment of it) ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// An accepted answer.
    Final {
        /// The answer.
        text: String,
        /// What the completion gate said about it.
        verdict: Verdict,
        /// The state at the end.
        state: LoopState,
    },
    /// Waiting for decisions; resume with [`Engine::resume_with_decisions`]
    /// or [`Engine::resume_with_timeout_default`].
    Paused {
        /// The state to resume from.
        checkpoint: LoopState,
        /// The calls waiting for a decision.
        approvals: Vec<ApprovalRequest>,
    },
    /// Ended without an accepted answer.
    Stopped {
        /// Why it stopped.
        reason: StopReason,
        /// The stop, in words (also the `Stopped` event's message).
        message: String,
        /// The state at the end.
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
    /// An engine over `model` and the tools of `registry`, deciding
    /// approvals with `policy` and serializing hardware calls through
    /// `lock`; system clock, chars-per-token estimate, the evidence gate of
    /// `config.gate`, no middleware and no checkpoint sink. A model served
    /// with a smaller context window than `config.context`'s
    /// ([`ChatModel::context_window`]) shrinks it, and the longest tool
    /// result the view keeps with it; a model that reads its whole
    /// conversation ([`ChatModel::reads_whole_conversation`]) is sent all
    /// of it, never compacted or cut.
    pub fn new(
        config: EngineConfig,
        model: Arc<dyn ChatModel>,
        registry: ToolRegistry,
        policy: RiskPolicy,
        lock: Arc<dyn ResourceLock>,
    ) -> Self {
        let mut config = config;
        if model.reads_whole_conversation() {
            config.context.window_tokens = u64::MAX;
            config.context.max_tool_result_chars = usize::MAX;
        } else if let Some(window) = model.context_window().filter(|w| *w > 0) {
            let context = &mut config.context;
            context.window_tokens = context.window_tokens.min(window);
            // One tool result takes at most about a quarter of a small
            // window (a character is about a quarter of a token).
            let chars = usize::try_from(context.window_tokens).unwrap_or(usize::MAX);
            context.max_tool_result_chars = context.max_tool_result_chars.min(chars);
        }
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
    /// Replace the system clock (tests use a manual one).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// Replace the chars-per-token estimate of the context size.
    pub fn with_estimator(mut self, estimator: Arc<dyn TokenEstimator>) -> Self {
        self.estimator = estimator;
        self
    }
    /// Replace the evidence gate built from `config.gate`.
    pub fn with_gate(mut self, gate: Arc<dyn CompletionGate>) -> Self {
        self.gate = gate;
        self
    }
    /// Save the state after every transition to `sink`.
    pub fn with_checkpoint_sink(mut self, sink: Arc<dyn CheckpointSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// The configuration runs use.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    /// The tools runs can call.
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
