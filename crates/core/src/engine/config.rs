//! The engine's settings: budgets, recovery bounds, what is injected into
//! the model view, and the defaults a deployment starts from.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::context::ContextConfig;
use crate::gate::GateConfig;
use crate::policy::ApprovalConfig;

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

/// Where the per-step session context goes in each model request. Never a
/// system message: chat templates of many open models refuse a system
/// message that is not the first one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectionPlacement {
    /// Appended to the request's last message when that is a user message,
    /// else a trailing user message of its own.
    #[default]
    UserMessage,
    /// Appended to the last tool result when the request ends with one
    /// (no extra user turn between tool results and the model's reply),
    /// else as [`InjectionPlacement::UserMessage`].
    ToolResult,
}

/// What is added to every model view as its per-step tail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectionConfig {
    /// The current time (RFC 3339).
    pub time: bool,
    /// The working state, the latest change and the evidence per kind.
    pub working_state: bool,
    /// Context tokens used of the window, steps taken, tokens spent.
    pub context_usage: bool,
    /// Where the session context goes.
    #[serde(default)]
    pub placement: InjectionPlacement,
}

impl Default for InjectionConfig {
    fn default() -> Self {
        Self {
            time: true,
            working_state: true,
            context_usage: true,
            placement: InjectionPlacement::default(),
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
    /// What the model sees of the history, and when it is compacted.
    pub context: ContextConfig,
    /// Bounds of the recovery paths.
    pub recovery: RecoveryConfig,
    /// Approval timeout and its default decision.
    pub approval: ApprovalConfig,
    /// The evidence the completion gate asks for.
    pub gate: GateConfig,
    /// What the trailing system message of the model view carries.
    pub injection: InjectionConfig,
    /// Tool groups active from the start.
    pub initial_groups: Vec<String>,
    /// Passed to the model with every request.
    pub max_output_tokens: Option<u32>,
    /// Passed to the model with every request but summarization requests.
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
