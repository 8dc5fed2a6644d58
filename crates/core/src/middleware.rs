//! Cross-cutting behaviour (tracing, logging, policy tweaks) wrapped around
//! the engine's phases in onion order: the first middleware registered is the
//! outermost layer. Every hook receives its input and a [`Next`] that runs
//! the inner layers and finally the engine's own implementation; a layer may
//! change the input, change the output, or not call `next` at all (which a
//! permission check uses to deny, and which for the node hooks stops the run
//! with [`crate::StopReason::Aborted`]).
//!
//! Hooks: a whole ReAct step, reasoning, acting (tool execution), each model
//! call, each tool call, the permission check, context compression and the
//! system-prompt assembly.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::CompactionError;
use crate::model::{ChatRequest, FinishReason, ModelError, ToolCall, Usage};
use crate::policy::Permission;
use crate::state::{Node, TransitionReason};
use crate::tool::{Risk, ToolError, ToolOutput};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One hook of [`Middleware`], as the chain calls it.
pub(crate) type Layer<'a, I, O> = fn(&'a dyn Middleware, I, Next<'a, I, O>) -> BoxFuture<'a, O>;

/// The rest of the onion: the inner middlewares, then the engine.
pub struct Next<'a, I, O> {
    rest: &'a [Arc<dyn Middleware>],
    layer: Layer<'a, I, O>,
    core: Box<dyn FnOnce(I) -> BoxFuture<'a, O> + Send + 'a>,
}

impl<'a, I: Send + 'a, O: Send + 'a> Next<'a, I, O> {
    /// Run the inner layers and the engine with `input`.
    pub fn run(self, input: I) -> BoxFuture<'a, O> {
        match self.rest.split_first() {
            Some((outer, rest)) => (self.layer)(
                outer.as_ref(),
                input,
                Next {
                    rest,
                    layer: self.layer,
                    core: self.core,
                },
            ),
            None => (self.core)(input),
        }
    }
}

/// Run `core` wrapped by `middlewares` through the hook `layer`.
pub(crate) fn run_chain<'a, I: Send + 'a, O: Send + 'a>(
    middlewares: &'a [Arc<dyn Middleware>],
    input: I,
    layer: Layer<'a, I, O>,
    core: Box<dyn FnOnce(I) -> BoxFuture<'a, O> + Send + 'a>,
) -> BoxFuture<'a, O> {
    Next {
        rest: middlewares,
        layer,
        core,
    }
    .run(input)
}

/// Where a step or node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInfo {
    /// The session.
    pub session_id: Arc<str>,
    /// The step.
    pub step: u32,
    /// The node the step (or phase) starts at; a resumed step may start
    /// past reasoning.
    pub node: Node,
}

/// What a step or node did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepReport {
    /// The node it ended at.
    pub node: Node,
    /// The reason of its last transition.
    pub reason: Option<TransitionReason>,
}

/// One model call.
#[derive(Debug, Clone)]
pub struct ModelCallInput {
    /// The session.
    pub session_id: Arc<str>,
    /// The step.
    pub step: u32,
    /// The model's name.
    pub model: String,
    /// Who serves the model, as `gen_ai.provider.name` spells it
    /// ([`crate::ChatModel::provider_name`]).
    pub provider: String,
    /// True for the summarization request of a compaction.
    pub summarization: bool,
    /// Shared with the engine's kept view; change it with
    /// `Arc::make_mut` (which copies it for this call only).
    pub request: Arc<ChatRequest>,
}

/// A whole model turn, assembled from the stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelTurn {
    /// The visible text.
    pub text: String,
    /// The reasoning text.
    pub thinking: String,
    /// The tool calls, in the model's order.
    pub tool_calls: Vec<ToolCall>,
    /// Token usage, if the model reported it.
    pub usage: Option<Usage>,
    /// Why the model stopped, if it said.
    pub finish: Option<FinishReason>,
}

/// One call about to be executed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallInfo {
    /// The session.
    pub session_id: Arc<str>,
    /// The step.
    pub step: u32,
    /// The call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The call's risk.
    pub risk: Risk,
}

/// The result of one executed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallOutcome {
    /// What the tool returned (a timeout is `ToolError::Timeout`).
    pub result: Result<ToolOutput, ToolError>,
    /// Time spent waiting for the resource lock (hardware tools only).
    pub lock_wait: Option<Duration>,
    /// Wall time of the call including the lock wait.
    pub duration: Duration,
}

/// One permission check.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionInput {
    /// The session.
    pub session_id: Arc<str>,
    /// The step.
    pub step: u32,
    /// The call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The validated arguments.
    pub arguments: serde_json::Value,
    /// The call's risk as the policy judged it.
    pub risk: Risk,
}

/// Why a compaction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionTrigger {
    /// The view passed the trigger ratio.
    Threshold,
    /// The model rejected the prompt as too long.
    PromptTooLong,
}

/// One compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressionInput {
    /// The session.
    pub session_id: Arc<str>,
    /// The step.
    pub step: u32,
    /// Why it runs.
    pub trigger: CompactionTrigger,
    /// Estimated tokens of the view before.
    pub tokens_before: u64,
}

/// What a compaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressionReport {
    /// History messages the summary now stands for.
    pub summarized_messages: usize,
    /// Estimated tokens of the view after.
    pub tokens_after: u64,
}

/// The system prompt about to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemPromptInput {
    /// The session.
    pub session_id: Arc<str>,
    /// The step.
    pub step: u32,
    /// The prompt; the hook's output replaces it.
    pub prompt: String,
}

/// A layer of the onion. Every hook defaults to passing straight through.
pub trait Middleware: Send + Sync {
    /// Around one ReAct step (reasoning through observation, or the part of
    /// it that a resumed run still has to do).
    fn on_step<'a>(
        &'a self,
        info: StepInfo,
        next: Next<'a, StepInfo, StepReport>,
    ) -> BoxFuture<'a, StepReport> {
        next.run(info)
    }
    /// Around the reasoning node.
    fn on_reasoning<'a>(
        &'a self,
        info: StepInfo,
        next: Next<'a, StepInfo, StepReport>,
    ) -> BoxFuture<'a, StepReport> {
        next.run(info)
    }
    /// Around the tool-execution node.
    fn on_acting<'a>(
        &'a self,
        info: StepInfo,
        next: Next<'a, StepInfo, StepReport>,
    ) -> BoxFuture<'a, StepReport> {
        next.run(info)
    }
    /// Around each model call (including summarization requests).
    fn on_model_call<'a>(
        &'a self,
        input: ModelCallInput,
        next: Next<'a, ModelCallInput, Result<ModelTurn, ModelError>>,
    ) -> BoxFuture<'a, Result<ModelTurn, ModelError>> {
        next.run(input)
    }
    /// Around each tool call (including the resource-lock wait).
    fn on_tool_call<'a>(
        &'a self,
        info: ToolCallInfo,
        next: Next<'a, ToolCallInfo, ToolCallOutcome>,
    ) -> BoxFuture<'a, ToolCallOutcome> {
        next.run(info)
    }
    /// Around the risk policy's permission verdict for one call.
    fn on_check_permission<'a>(
        &'a self,
        input: PermissionInput,
        next: Next<'a, PermissionInput, Permission>,
    ) -> BoxFuture<'a, Permission> {
        next.run(input)
    }
    /// Around a context compaction.
    fn on_compress_context<'a>(
        &'a self,
        input: CompressionInput,
        next: Next<'a, CompressionInput, Result<CompressionReport, CompactionError>>,
    ) -> BoxFuture<'a, Result<CompressionReport, CompactionError>> {
        next.run(input)
    }
    /// Around the assembly of the system prompt for a model call.
    fn on_system_prompt<'a>(
        &'a self,
        input: SystemPromptInput,
        next: Next<'a, SystemPromptInput, String>,
    ) -> BoxFuture<'a, String> {
        next.run(input)
    }
}
