//! mtswarm-core: the ReAct engine shared by the leader and the workers.
//!
//! Pure by design: no network, no NATS, no hardware. Models, tools and the
//! hardware lock plug in behind the traits in [`model`], [`tool`] and
//! [`lock`].
//!
//! # The loop
//!
//! One explicit state machine ([`Node`]): `reasoning -> tool_routing ->
//! (human_approval ->) tool_execution -> observation -> reasoning ...`, until
//! an answer passes the completion gate or a budget runs out. Every move is
//! recorded in the immutable, serializable [`LoopState`] as a [`Transition`]
//! with a [`TransitionReason`]; the state *is* the checkpoint.
//!
//! # Using the engine
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use futures::StreamExt;
//! # use mtswarm_core::*;
//! # async fn demo(model: Arc<dyn ChatModel>, registry: ToolRegistry) {
//! let engine = Engine::new(
//!     EngineConfig::default(),
//!     model,
//!     registry,
//!     RiskPolicy::default(),
//!     Arc::new(LocalResourceLock::default()),
//! )
//! .with_middleware(Arc::new(TracingMiddleware::new()));
//!
//! let (mut events, handle) = engine.start("session-1", "You tune kernels.", "Tune gemm.c");
//! while let Some(event) = events.next().await {
//!     // publish `event` (serde) ...
//! }
//! match handle.outcome().await.unwrap() {
//!     Outcome::Final { text, verdict, .. } => { /* done */ }
//!     Outcome::Paused { checkpoint, approvals } => {
//!         // persist `checkpoint.to_json()`, ask a human; later, maybe in
//!         // another process:
//!         // engine.resume_with_decisions(LoopState::from_json(&json)?, decisions)
//!         // or engine.resume_with_timeout_default(checkpoint)
//!     }
//!     Outcome::Stopped { reason, message, .. } => { /* failed */ }
//! }
//! # }
//! ```
//!
//! # Invariants
//!
//! - The history in [`LoopState::history`] is append-only and complete (tool
//!   results untruncated); the model view is a projection of it: system
//!   prompt, the task (first user message), the summary of compacted turns,
//!   the recent turns (tool results truncated to
//!   [`ContextConfig::max_tool_result_chars`] with a marker giving the
//!   original length), and a trailing system message with the time, the
//!   context usage and the working state.
//! - Every tool call the model makes gets exactly one tool message in the
//!   history (result, error, refusal or denial), and compaction cuts only at
//!   turn starts, so a tool-call message is never separated from its results.
//! - Nothing the model sends can crash a run: unknown tools, calls off the
//!   allowlist, unparseable or invalid arguments become error observations
//!   and [`RiskTracker`] counts (the first reply of a streak with no
//!   readable call is asked again, unrecorded, before the model is told);
//!   tool failures become observations; model errors end the run with
//!   [`Outcome::Stopped`] unless recoverable.
//! - Evidence ([`Effect::Evidence`]) counts for the completion gate only if
//!   it passed and was recorded after the latest [`Effect::Mutation`].
//! - Concurrency-safe calls that follow each other in a step run together;
//!   any other call runs alone, in the model's order; hardware calls hold
//!   the [`ResourceLock`] of [`Tool::resource`] while they run.
//!
//! # Checkpoints and resumption
//!
//! - Checkpoints after every transition: [`Engine::with_checkpoint_sink`];
//!   any of them can be given to [`Engine::resume`] (a call that was running
//!   when the process died runs again: execution is at-least-once). Each
//!   comes with its [`Durability`]: whether a resume needs it stored before
//!   the run goes on (the state entering a batch with effects, every
//!   batch's results, a pause, the end) or whether a sink may write it
//!   behind.
//! - Paused for approval: [`Outcome::Paused`] (or a checkpoint with
//!   [`LoopState::is_paused`]); resume with [`Engine::resume_with_decisions`]
//!   (approve / deny per call id), [`Engine::resume_with_timeout_default`]
//!   (the configured default for every undecided call), or in-process with
//!   [`Engine::resume_when_decided`] (waits on a channel, with the approval
//!   timeout). [`LoopState::paused_at_ms`] tells when the pause began.
//! - Events ([`Event`]) carry session id, step and a sequence number that
//!   continues across resumes (events re-emitted after resuming from an
//!   earlier checkpoint reuse their numbers); tool results in events are
//!   never truncated.
//! - Cross-cutting behaviour goes in [`Middleware`]s (onion order);
//!   [`TracingMiddleware`] opens `react.step`, `chat {model}` and
//!   `execute_tool {tool}` spans by the OpenTelemetry GenAI semantic
//!   conventions v1.41.1 ([`genai_spans`]).
//! - [`testing::ScriptedModel`] replays scripted turns.
//!
//! # Around the loop
//!
//! - The extension points fail with the typed errors of [`error`]
//!   ([`NormalizeError`], [`CheckpointError`], [`CompactionError`]); none of
//!   them ends a run.
//! - [`answer::last_json`] reads the JSON block an answer ends with (the
//!   rules are in [`answer`]).

pub mod answer;
pub mod clock;
pub mod context;
pub mod engine;
pub mod error;
pub mod event;
pub mod gate;
pub mod genai_spans;
pub mod limits;
pub mod lock;
pub mod middleware;
pub mod model;
pub mod policy;
pub mod registry;
pub mod state;
pub mod testing;
pub mod tool;
pub mod working;

pub use clock::{Clock, ManualClock, SystemClock};
pub use context::{CharsPerToken, ContextConfig, TokenEstimator, truncate_for_model};
pub use engine::{
    CheckpointSink, Durability, Engine, EngineConfig, EngineError, InjectionConfig,
    InjectionPlacement, Outcome, RecoveryConfig, RunControl, RunHandle, RunStream,
};
pub use error::{CheckpointError, CompactionError, NormalizeError};
pub use event::{ApprovalRequest, Event, EventKind};
pub use gate::{CompletionGate, EvidenceGate, GateConfig, GateVerdict};
pub use genai_spans::{GENAI_SEMCONV_VERSION, TracingMiddleware};
pub use lock::{LocalResourceLock, ResourceGuard, ResourceLock};
pub use middleware::Middleware;
pub use model::{
    BUILTIN_PROVIDER, ChatModel, ChatRequest, Message, ModelError, ModelEvent, ModelStream, Role,
    ToolCall, ToolDefinition,
};
pub use policy::{
    ApprovalConfig, ApprovalDecision, ApprovalRule, AutoApprove, Permission, RiskPolicy, RuleAction,
};
pub use registry::{RegistryError, ToolRegistry};
pub use state::{
    CallStatus, Checkpoint, LoopState, Node, PendingCall, RiskTracker, RunEnd, StopReason,
    Transition, TransitionReason, Verdict,
};
pub use tool::{
    Effect, EffectKind, Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSchema, ToolSpec,
    schema_of,
};
pub use working::{EvidenceLedger, WorkingState};
