//! What a run tells the outside world while it happens. Events are plain
//! serde data so the worker can publish them over NATS unchanged; each
//! carries the session id, the step and a sequence number that continues
//! across resumes, so a consumer can order and deduplicate them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

// Defined with the approval policy (the loop state builds it too); kept
// here as well because it is what the `ApprovalRequired` event carries.
pub use crate::policy::ApprovalRequest;
use crate::state::{Node, StopReason, TransitionReason, Verdict};
use crate::tool::{Effect, Risk};

/// An event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The session the run belongs to.
    pub session_id: Arc<str>,
    /// The step the event happened in.
    pub step: u32,
    /// Position in the session's event sequence (continues across resumes).
    pub seq: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// The state machine moved.
    Transition {
        /// The node left.
        from: Node,
        /// The node entered.
        to: Node,
        /// Why.
        reason: TransitionReason,
        /// More about why, in words.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// Model reasoning text (not part of the answer).
    Thinking {
        /// The next piece of it.
        text: String,
    },
    /// A piece of the visible answer text.
    TextDelta {
        /// The next piece of it.
        text: String,
    },
    /// A call is about to run.
    ToolCall {
        /// The call's id (the model's, or one the engine gave it).
        call_id: String,
        /// The tool.
        name: String,
        /// The arguments after normalization and validation.
        arguments: serde_json::Value,
        /// The call's risk as the policy judged it.
        risk: Risk,
    },
    /// Progress reported by a running tool.
    ToolStateUpdate {
        /// The running call.
        call_id: String,
        /// What the tool is doing.
        message: String,
        /// How far it is (0 to 1), when the tool knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fraction: Option<f64>,
    },
    /// A call's outcome, untruncated. Also emitted for calls that routing
    /// rejected or a human denied (`ok = false`).
    ToolResult {
        /// The call.
        call_id: String,
        /// The tool.
        name: String,
        /// Whether the call succeeded.
        ok: bool,
        /// The observation (what the model sees), untruncated.
        content: String,
        /// Structured output of the tool, if it gave any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<serde_json::Value>,
        /// The side effects the tool declared.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        effects: Vec<Effect>,
        /// Time spent waiting for the resource lock (hardware tools).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lock_wait_ms: Option<u64>,
        /// Wall time of the call including the lock wait.
        duration_ms: u64,
    },
    /// The loop paused; these calls need a decision.
    ApprovalRequired {
        /// The calls waiting for a decision.
        approvals: Vec<ApprovalRequest>,
    },
    /// Older turns were summarized to fit the context window.
    ContextCompacted {
        /// Estimated tokens of the view before.
        tokens_before: u64,
        /// Estimated tokens of the view after.
        tokens_after: u64,
        /// History messages the summary now stands for.
        summarized_messages: usize,
    },
    /// The run ended with an accepted answer.
    ReplyEnd {
        /// The answer.
        text: String,
        /// What the completion gate said about it.
        verdict: Verdict,
    },
    /// The run ended without one.
    Stopped {
        /// Why.
        reason: StopReason,
        /// The stop, in words.
        message: String,
    },
    /// Something went wrong (a model error, a failed compaction); the
    /// message names the problem. A `Stopped` event follows if it was fatal.
    Error {
        /// What went wrong.
        message: String,
    },
}
