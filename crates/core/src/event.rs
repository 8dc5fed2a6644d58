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
    pub session_id: Arc<str>,
    pub step: u32,
    pub seq: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// The state machine moved.
    Transition {
        from: Node,
        to: Node,
        reason: TransitionReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// Model reasoning text (not part of the answer).
    Thinking { text: String },
    /// A piece of the visible answer text.
    TextDelta { text: String },
    /// A call is about to run.
    ToolCall {
        call_id: String,
        name: String,
        arguments: serde_json::Value,
        risk: Risk,
    },
    /// Progress reported by a running tool.
    ToolStateUpdate {
        call_id: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fraction: Option<f64>,
    },
    /// A call's outcome, untruncated. Also emitted for calls that routing
    /// rejected or a human denied (`ok = false`).
    ToolResult {
        call_id: String,
        name: String,
        ok: bool,
        content: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<serde_json::Value>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        effects: Vec<Effect>,
        /// Time spent waiting for the resource lock (hardware tools).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lock_wait_ms: Option<u64>,
        duration_ms: u64,
    },
    /// The loop paused; these calls need a decision.
    ApprovalRequired { approvals: Vec<ApprovalRequest> },
    /// Older turns were summarized to fit the context window.
    ContextCompacted {
        tokens_before: u64,
        tokens_after: u64,
        summarized_messages: usize,
    },
    /// The run ended with an accepted answer.
    ReplyEnd { text: String, verdict: Verdict },
    /// The run ended without one.
    Stopped { reason: StopReason, message: String },
    /// Something went wrong (a model error, a failed compaction); the
    /// message names the problem. A `Stopped` event follows if it was fatal.
    Error { message: String },
}
