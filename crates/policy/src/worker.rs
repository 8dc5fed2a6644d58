//! The builtin worker policy: the model that drives a worker session when no
//! LLM is configured. It is an ordinary [`ChatModel`]: every turn it reads
//! the conversation (the task in the first user message, its own earlier
//! tool calls and their results) and answers with the next tool call or the
//! final answer, so the engine, the approvals, the hardware lock and the
//! events are exercised exactly as with a real model.
//!
//! # Task parameters
//!
//! The first user message carries a line `Kernel directory: <dir>` and a
//! fenced ```` ```json ```` block after `Task parameters:` (see
//! [`render_task_message`]) holding one [`crate::plan::TaskPlan`]:
//!
//! - `{"noop": true}`: answer at once, no tools (latency benchmarks);
//! - `{"candidates": [{"CHUNK": 1024, "BUF": 2}, ...]}`: `-D` maps to try;
//! - `{"params": {"CHUNK": 1024}}`: a single candidate;
//! - every candidate is checked against the kernel's tune.toml before the
//!   task runs (an unknown name, a value outside the space or a broken
//!   constraint fails the task naming it); `"unchecked_defines": true`
//!   skips the check (fault knobs, experiments outside the space);
//! - optional `"source_diff"`: a unified diff of edited kernel sources,
//!   applied with `apply_patch` before anything is built (see `patch`);
//! - optional `"cores"`, `"warmup"`, `"repeats"` (benchmark settings),
//!   `"validate_runs"` (executions checked per validate) and `"kernel_dir"`
//!   (overrides the line above);
//! - optional search settings (see [`search`]): `"search_budget"`
//!   (candidates screened at most), `"max_hardware_calls"` (at most this
//!   many hardware calls, i.e. `validate` plus `benchmark` calls, in the
//!   whole task; also read as `"max_evaluations"`), `"finalists"`
//!   (screened candidates that get a full benchmark, default 2), `"compile_ahead"` (build the next candidates
//!   in the background while the slice runs, default true),
//!   `"compile_depth"` (candidates kept built or building ahead, default
//!   [`search::DEFAULT_COMPILE_DEPTH`]), `"estimate"`
//!   (rank by the roofline estimate, default true), `"analyze"` (drop
//!   candidates whose static footprint overflows on-chip memory, default
//!   true) and `"strategy"`
//!   (`"search"` or `"sequential"`; default: `search` when a budget is
//!   given or there are more candidates than finalists, else `sequential`).
//!
//! Two plans:
//!
//! - `sequential`: per candidate, in list order, `compile`, then `validate`
//!   on the artifact, then `benchmark`; a failed or denied step drops the
//!   candidate. Every candidate gets its full benchmark.
//! - `search` ([`search`]): rank by the estimate, screen candidates with one
//!   `validate` each (which already yields a time; on a slice with exact
//!   timing, the emulator, a `benchmark` each, as cheap and recorded at
//!   once), walk from the best
//!   towards its neighbours, prune what the roofline says cannot win,
//!   build the next candidates in the background while the slice runs the
//!   current one, and spend full benchmarks on the finalists only.
//!
//! # Keeping the slice busy
//!
//! The search plan is built so that the slice's hardware lock is held as
//! much of the *tuning phase* as possible. The tuning phase of a slice runs
//! from the first time one of its hardware calls (`validate`, `benchmark`)
//! acquires the slice lock to the last time one releases it; its
//! utilization is the time the lock was held over that span
//! (`mtswarm_tools::TuningPhase`, and per slice in the `mtswarm demo`
//! output). Reading, analysing and the first compile come before it; the
//! answer comes after it. Inside it the slice waits only when a background
//! build is late (see [`search`]); validated artifacts are benchmarked as
//! they are, never rebuilt.
//!
//! The final answer names the fastest benchmarked candidate and ends with a
//! ```` ```json ```` block `{"best": {...} | null, "candidates": [...]}`
//! (the search plan adds `"strategy"`, `"evaluations"` and
//! `"max_hardware_calls"`).
//!
//! Call ids encode the plan (`c<index>-<tool>`), which is how the policy
//! finds its place again after a pause or a resume in another process. A
//! session resumed in another process has none of its earlier builds; a
//! validate or benchmark that reports its artifact unknown makes the policy
//! compile that candidate again (`c<index>-compile-r<n>`, at most twice).

mod outcome;
mod params;
mod patch;
pub mod search;
mod sequential;

use futures::stream;
use mtswarm_core::model::{FinishReason, ModelEvent};
use mtswarm_core::{ChatModel, ChatRequest, Message, ModelError, ModelStream, Role, ToolCall};
use serde_json::{Value, json};

pub use outcome::CandidateOutcome;
pub use params::{
    DEFAULT_FINALISTS, KERNEL_DIR_LINE, MAX_COMPILE_DEPTH, PARAMETERS_LINE, Strategy,
    TaskParameters, TaskParametersError, render_task_message,
};

use outcome::final_error;

/// What the policy does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// One tool call; its id encodes the candidate (`c<index>-<tool>`).
    Call(ToolCall),
    /// Several calls in one step (the engine runs concurrency-safe ones
    /// together, e.g. a compile while the slice benchmarks).
    Calls(Vec<ToolCall>),
    /// The final answer text, ending with its ```` ```json ```` block
    /// (also how a task that cannot run is reported).
    Final(String),
}

/// Candidate index encoded in a call id: `c<index>-<tool>[-r<n>]`.
pub(crate) fn parse_call_id(id: &str) -> Option<usize> {
    let rest = id.strip_prefix('c')?;
    let (index, _) = rest.split_once('-')?;
    index.parse().ok()
}

/// Recompiles of one candidate allowed when its artifact is unknown (a
/// session resumed in another process has none of its earlier builds).
pub(crate) const MAX_RECOMPILES: u32 = 2;

/// The result says the artifact is gone or stale: compile again.
pub(crate) fn artifact_missing(content: &str) -> bool {
    content.contains("unknown artifact") || content.contains("compile again")
}

/// Decide the next move from the conversation so far.
pub fn decide(messages: &[Message]) -> Decision {
    let Some(task) = messages.iter().find(|m| m.role == Role::User) else {
        return Decision::Final(final_error("no task message in the conversation"));
    };
    let params = match TaskParameters::from_task_message(&task.content) {
        Ok(p) => p,
        Err(e) => return Decision::Final(final_error(&e.to_string())),
    };
    if params.noop {
        return Decision::Final(
            "No-op task: nothing to run.\n```json\n{\"noop\":true,\"best\":null}\n```".to_owned(),
        );
    }
    if let Some(decision) = patch::decide(&params, messages) {
        return decision;
    }
    if params.strategy() == Strategy::Search {
        return search::decide(&params, messages);
    }
    sequential::decide(&params, messages)
}

/// A `validate` or `benchmark` call of candidate `index` with the task's
/// hardware settings (cores, runs, warmup, repeats).
pub(crate) fn hardware_call(
    params: &TaskParameters,
    index: usize,
    tool: &str,
    artifact: Option<&str>,
) -> ToolCall {
    let mut args = serde_json::Map::new();
    if let Some(artifact) = artifact {
        args.insert("artifact".into(), json!(artifact));
    }
    if let Some(cores) = params.cores {
        args.insert("cores".into(), json!(cores));
    }
    if tool == "validate"
        && let Some(runs) = params.validate_runs
    {
        args.insert("runs".into(), json!(runs));
    }
    if tool == "benchmark" {
        if let Some(warmup) = params.warmup {
            args.insert("warmup".into(), json!(warmup));
        }
        if let Some(repeats) = params.repeats {
            args.insert("repeats".into(), json!(repeats));
        }
    }
    ToolCall {
        id: format!("c{index}-{tool}"),
        name: tool.to_owned(),
        arguments: Value::Object(args).to_string(),
    }
}

/// The builtin worker policy (see the module docs).
#[derive(Debug, Clone)]
pub struct BuiltinWorkerPolicy {
    name: String,
}

impl Default for BuiltinWorkerPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl BuiltinWorkerPolicy {
    /// The policy; its model name is `builtin-worker`. It keeps no state:
    /// every answer is derived from the conversation.
    pub fn new() -> Self {
        Self {
            name: "builtin-worker".to_owned(),
        }
    }
}

#[async_trait::async_trait]
impl ChatModel for BuiltinWorkerPolicy {
    fn model_name(&self) -> &str {
        &self.name
    }

    fn reads_whole_conversation(&self) -> bool {
        // It replays its own calls and their results every turn: the
        // candidates it built and measured and the budget it spent are
        // counted from them. (The builtin leader policy is not such a
        // model: its tools answer in summaries sized for a view, and its
        // checkpoint is bounded by the view.)
        true
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        Ok(respond(&request))
    }

    async fn stream_shared(
        &self,
        request: std::sync::Arc<ChatRequest>,
    ) -> Result<ModelStream, ModelError> {
        Ok(respond(&request))
    }
}

fn respond(request: &ChatRequest) -> ModelStream {
    let calls = match decide(&request.messages) {
        Decision::Call(call) => vec![call],
        Decision::Calls(calls) => calls,
        Decision::Final(text) => {
            return Box::pin(stream::iter(vec![
                Ok(ModelEvent::TextDelta { text }),
                Ok(ModelEvent::Finish {
                    reason: FinishReason::Stop,
                }),
            ]));
        }
    };
    let summary = calls
        .iter()
        .map(|c| format!("{} ({})", c.name, c.id))
        .collect::<Vec<_>>()
        .join(", ");
    let mut items: Vec<Result<ModelEvent, ModelError>> = vec![Ok(ModelEvent::ThinkingDelta {
        text: format!("next: {summary}"),
    })];
    items.extend(
        calls
            .into_iter()
            .map(|call| Ok(ModelEvent::ToolCall { call })),
    );
    items.push(Ok(ModelEvent::Finish {
        reason: FinishReason::ToolCalls,
    }));
    Box::pin(stream::iter(items))
}

#[cfg(test)]
mod tests;
