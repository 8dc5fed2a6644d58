//! The loop's state machine: which node runs next, why the loop got there,
//! and everything needed to continue in another process.
//!
//! A [`LoopState`] is the checkpoint. It has no public mutators: the engine
//! moves from one state to the next with [`LoopState::next`], which records a
//! [`Transition`] (from, to, reason, step). The growing parts (history,
//! transitions, working state, evidence) sit behind `Arc`s and are extended
//! copy-on-write, so a state handed out earlier (to a checkpoint sink, to a
//! test) never changes, and the engine, which owns the only copy, pays no
//! clone for it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Message, ToolCall};
use crate::tool::Risk;
use crate::working::{EvidenceLedger, WorkingState};

/// The five nodes of the ReAct state machine, plus the terminal one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Node {
    /// Created, not yet started.
    Start,
    /// Build the model view, call the model, parse tool calls.
    Reasoning,
    /// Resolve, validate and risk-classify each requested call.
    ToolRouting,
    /// Wait for approve / deny / timeout decisions on risky calls.
    HumanApproval,
    /// Run the approved calls (concurrency-safe ones together).
    ToolExecution,
    /// Append results, fold effects, check budgets.
    Observation,
    /// The run is over; see [`LoopState::end`].
    Done,
}

/// Why the loop moved from one node to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TransitionReason {
    /// A run started from a user message.
    UserInput,
    /// The model asked for tools.
    ModelReturnedToolCalls,
    /// Every call was routed and none needs a human.
    ToolsRouted,
    /// At least one call waits for a human decision (the loop pauses).
    ApprovalRequired,
    /// Every awaited call got an explicit decision.
    ApprovalDecided,
    /// The approval timeout passed; the configured default decided the rest.
    ApprovalTimedOut,
    /// The approved calls ran.
    ToolsExecuted,
    /// Results were appended; the next step begins.
    ObservationsRecorded,
    /// The model answered and the completion gate let it through.
    ModelReturnedFinal,
    /// The completion gate rejected the answer; feedback was injected.
    StopHookBlocking,
    /// The completion gate kept rejecting answers; the run failed.
    CompletionGateExhausted,
    /// A model error was recovered from (compaction, nudge, protocol error).
    ModelRecoveryRetry,
    /// A model error could not be recovered from.
    ModelError,
    /// The step limit was reached.
    MaxStepsExceeded,
    /// The token budget was spent.
    TokenBudgetExceeded,
    /// The wall-time limit passed.
    WallTimeExceeded,
    /// The run was cancelled from outside.
    Cancelled,
    /// A middleware declined to run a node.
    Aborted,
}

/// One recorded move of the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// The node left.
    pub from: Node,
    /// `step` is the step of the state the transition leads to.
    pub to: Node,
    /// Why.
    pub reason: TransitionReason,
    /// The step of the state the transition leads to.
    pub step: u32,
    /// Milliseconds since the Unix epoch, from the engine's clock.
    pub at_ms: u64,
    /// More about why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Where a call of the current step stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CallStatus {
    /// Parsed, not yet routed.
    Pending,
    /// Routing refused it (unknown tool, not allowed, bad arguments, denied
    /// by a permission check); `observation` tells the model why.
    Rejected {
        /// What the model is told.
        observation: String,
    },
    /// Waits for a human decision.
    AwaitingApproval,
    /// Allowed to run (by the policy or a human).
    Approved,
    /// A human or the approval timeout denied it; `observation` tells the
    /// model why.
    Denied {
        /// What the model is told.
        observation: String,
    },
    /// It ran. `observation` is the full text the model will see (before
    /// truncation for the view).
    Finished {
        /// Whether the call succeeded.
        ok: bool,
        /// What the model is told.
        observation: String,
    },
}

/// One call the model requested in the current step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The call as the model made it (with an id given if it had none).
    pub call: ToolCall,
    /// Arguments after parsing, normalization and validation (when they
    /// got that far).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
    /// The call's risk as the policy judged it (once routed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<Risk>,
    /// Where it stands.
    pub status: CallStatus,
    /// Effects of a successful call, folded in at the observation node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<crate::tool::Effect>,
    /// Arguments the tool does not take, dropped because an earlier call
    /// was refused for them (the observation says so).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_arguments: Vec<String>,
}

/// Counts of things that went wrong in the model's use of tools. They never
/// stop the loop on their own; they explain why a run went badly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RiskTracker {
    /// Calls to tools outside the allowlist of the active groups.
    pub tool_not_allowed: u32,
    /// Calls to tools that do not exist.
    pub unknown_tool: u32,
    /// Calls whose arguments were not JSON.
    pub protocol_errors: u32,
    /// Calls whose arguments the tool could not repair.
    pub normalize_errors: u32,
    /// Calls whose arguments failed the schema.
    pub schema_errors: u32,
    /// Calls a human (or the approval timeout) denied.
    pub denied_approvals: u32,
    /// Calls the permission check denied.
    pub permission_denied: u32,
    /// Calls that ran and failed.
    pub tool_errors: u32,
    /// Calls that ran without arguments the tool does not take, after an
    /// earlier call was refused for the same ones.
    #[serde(default)]
    pub arguments_ignored: u32,
}

/// Retry counters of the recovery paths (bounded by the config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryCounters {
    /// Times the completion gate rejected an answer.
    pub completion_blocks: u32,
    /// Consecutive empty replies answered with a nudge.
    pub empty_reply_nudges: u32,
    /// Consecutive turns whose tool calls were all unparseable.
    pub protocol_retries: u32,
    /// Consecutive prompt-too-long errors answered by compaction.
    pub prompt_too_long_retries: u32,
    /// Compactions done over the whole run.
    pub compactions: u32,
}

/// Tokens spent so far (reported by the model, or estimated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Tokens sent to the model.
    pub input_tokens: u64,
    /// Tokens the model produced.
    pub output_tokens: u64,
}

impl TokenUsage {
    /// Input plus output tokens (saturating).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// How the part of the history the model sees is projected: older turns are
/// replaced by a summary, the first user message (the task) is always kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextProjection {
    /// Summary of `history[..view_start]` (minus the task), once compacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// First history index shown verbatim.
    pub view_start: usize,
}

/// The completion gate's judgement of a final answer that was accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The required evidence was there.
    Pass,
    /// Accepted without the required evidence (best-effort jobs).
    Unverified {
        /// The evidence kinds that were missing.
        missing: Vec<String>,
    },
}

/// Why a run ended without an accepted answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The step limit was reached.
    MaxSteps,
    /// The token budget was spent.
    TokenBudget,
    /// The wall-time limit passed.
    WallTime,
    /// The completion gate kept rejecting the answer.
    CompletionGateFailed,
    /// The model kept replying with neither text nor tool calls.
    EmptyReply,
    /// The model kept sending unparseable tool-call arguments.
    ProtocolErrors,
    /// The prompt stayed too long after compaction.
    PromptTooLong,
    /// The model call failed and could not be recovered from.
    ModelError,
    /// The run was cancelled from outside.
    Cancelled,
    /// A middleware declined to run a node.
    Aborted,
}

/// How a finished run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum RunEnd {
    /// An accepted answer.
    Final {
        /// The answer.
        text: String,
        /// What the completion gate said about it.
        verdict: Verdict,
    },
    /// Ended without one.
    Stopped {
        /// Why.
        reason: StopReason,
        /// The stop, in words.
        message: String,
    },
}

/// The immutable, serializable state of one session's loop: a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    pub(crate) session_id: String,
    pub(crate) system_prompt: String,
    pub(crate) node: Node,
    pub(crate) step: u32,
    /// Append-only full history (tool results untruncated).
    pub(crate) history: Arc<Vec<Message>>,
    pub(crate) projection: ContextProjection,
    pub(crate) calls: Vec<PendingCall>,
    pub(crate) working: Arc<WorkingState>,
    pub(crate) evidence: Arc<EvidenceLedger>,
    pub(crate) usage: TokenUsage,
    /// Running time spent so far, excluding time paused between processes.
    pub(crate) active_ms: u64,
    pub(crate) recovery: RecoveryCounters,
    pub(crate) risk: RiskTracker,
    pub(crate) active_groups: Vec<String>,
    /// Per tool, the arguments it does not take that a call was already
    /// refused for: a model that sends them again has read the refusal
    /// and not acted on it, so they are dropped and the call runs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) refused_arguments: BTreeMap<String, BTreeSet<String>>,
    /// Sequence number of the next event (continues across resumes).
    pub(crate) event_seq: u64,
    pub(crate) transitions: Arc<Vec<Transition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) end: Option<RunEnd>,
}

impl Default for LoopState {
    fn default() -> Self {
        Self::new("", "", "")
    }
}

impl LoopState {
    /// A fresh state, about to start. The engine creates
    /// these in [`crate::Engine::start`]; building one by hand is for tests
    /// and tools that inspect checkpoints.
    pub fn new(
        session_id: impl Into<String>,
        system_prompt: impl Into<String>,
        user_input: impl Into<String>,
    ) -> Self {
        let user_input = user_input.into();
        let history = if user_input.is_empty() {
            Vec::new()
        } else {
            vec![Message::user(user_input)]
        };
        Self {
            session_id: session_id.into(),
            system_prompt: system_prompt.into(),
            node: Node::Start,
            step: 1,
            history: Arc::new(history),
            projection: ContextProjection::default(),
            calls: Vec::new(),
            working: Arc::default(),
            evidence: Arc::default(),
            usage: TokenUsage::default(),
            active_ms: 0,
            recovery: RecoveryCounters::default(),
            risk: RiskTracker::default(),
            active_groups: Vec::new(),
            refused_arguments: BTreeMap::new(),
            event_seq: 0,
            transitions: Arc::default(),
            end: None,
        }
    }

    /// Move to `to` for `reason`: consumes this state and returns the next
    /// one, with the transition appended to the record.
    pub fn next(
        mut self,
        to: Node,
        reason: TransitionReason,
        detail: Option<String>,
        at_ms: u64,
    ) -> Self {
        self.advance(to, reason, detail, at_ms);
        self
    }

    /// [`LoopState::next`] on the engine's own copy, without moving the
    /// state (nobody else can observe the difference).
    pub(crate) fn advance(
        &mut self,
        to: Node,
        reason: TransitionReason,
        detail: Option<String>,
        at_ms: u64,
    ) {
        Arc::make_mut(&mut self.transitions).push(Transition {
            from: self.node,
            to,
            reason,
            step: self.step,
            at_ms,
            detail,
        });
        self.node = to;
    }

    /// The session this state belongs to.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }
    /// The system prompt the run started with.
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }
    /// The node that runs next.
    pub fn node(&self) -> Node {
        self.node
    }
    /// The current step.
    pub fn step(&self) -> u32 {
        self.step
    }
    /// The full, append-only history.
    pub fn history(&self) -> &[Message] {
        &self.history
    }
    /// Which part of the history the model sees.
    pub fn projection(&self) -> &ContextProjection {
        &self.projection
    }
    /// Calls of the current step.
    pub fn calls(&self) -> &[PendingCall] {
        &self.calls
    }
    /// The working state the tools' effects built.
    pub fn working_state(&self) -> &WorkingState {
        &self.working
    }
    /// The evidence recorded so far.
    pub fn evidence(&self) -> &EvidenceLedger {
        &self.evidence
    }
    /// Tokens spent so far.
    pub fn usage(&self) -> TokenUsage {
        self.usage
    }
    /// Milliseconds the run was active (pauses excluded).
    pub fn active_ms(&self) -> u64 {
        self.active_ms
    }
    /// The retry counters of the recovery paths.
    pub fn recovery(&self) -> &RecoveryCounters {
        &self.recovery
    }
    /// The counts of the model's misuse of tools.
    pub fn risk(&self) -> &RiskTracker {
        &self.risk
    }
    /// The tool groups active now.
    pub fn active_groups(&self) -> &[String] {
        &self.active_groups
    }
    /// Every transition so far, in order.
    pub fn transitions(&self) -> &[Transition] {
        &self.transitions
    }
    /// The reasons of all transitions so far, in order.
    pub fn reasons(&self) -> Vec<TransitionReason> {
        self.transitions.iter().map(|t| t.reason).collect()
    }
    /// The latest transition.
    pub fn last_transition(&self) -> Option<&Transition> {
        self.transitions.last()
    }
    /// How the run ended, once `node() == Node::Done`.
    pub fn end(&self) -> Option<&RunEnd> {
        self.end.as_ref()
    }
    /// Calls waiting for a human decision.
    pub fn awaiting_approval(&self) -> impl Iterator<Item = &PendingCall> {
        self.calls
            .iter()
            .filter(|c| c.status == CallStatus::AwaitingApproval)
    }
    /// The approval requests of a paused loop (what the approval broker
    /// shows), rebuilt from the state alone.
    pub fn approval_requests(&self) -> Vec<crate::policy::ApprovalRequest> {
        self.awaiting_approval()
            .map(|c| crate::policy::ApprovalRequest {
                call_id: c.call.id.clone(),
                tool: c.call.name.clone(),
                arguments: c.arguments.clone().unwrap_or(serde_json::Value::Null),
                risk: c.risk.unwrap_or(Risk::High),
                step: self.step,
            })
            .collect()
    }
    /// When the loop paused for approval (clock milliseconds), so whoever
    /// holds the checkpoint can apply the approval timeout.
    pub fn paused_at_ms(&self) -> Option<u64> {
        if !self.is_paused() {
            return None;
        }
        self.transitions
            .iter()
            .rev()
            .find(|t| t.reason == TransitionReason::ApprovalRequired)
            .map(|t| t.at_ms)
    }
    /// True when the loop is paused for approvals.
    pub fn is_paused(&self) -> bool {
        self.node == Node::HumanApproval && self.awaiting_approval().next().is_some()
    }

    /// Serialize as a checkpoint.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
    /// Restore a checkpoint written by [`LoopState::to_json`].
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// A copy of this state without its history and with only its latest
    /// `transitions` transitions: the parts of a checkpoint that do not
    /// grow with the run, for a store that keeps the (append-only) history
    /// message by message and so need not serialize it again at every
    /// write.
    pub fn without_history(&self, transitions: usize) -> Self {
        let kept = self.transitions.len().saturating_sub(transitions);
        Self {
            history: Arc::default(),
            transitions: Arc::new(self.transitions[kept..].to_vec()),
            ..self.clone()
        }
    }

    /// A copy of this state holding `history` instead of its own, shown
    /// from `view_start` on: for a store that keeps a shorter history
    /// than the run's (the turns a compaction summarized dropped, long
    /// results cut) and resumes from it.
    pub fn with_history(&self, history: Vec<Message>, view_start: usize) -> Self {
        Self {
            history: Arc::new(history),
            projection: ContextProjection {
                view_start,
                ..self.projection.clone()
            },
            ..self.clone()
        }
    }

    pub(crate) fn push_message(&mut self, message: Message) {
        Arc::make_mut(&mut self.history).push(message);
    }

    /// Activate a tool group for the rest of the run (e.g. before resuming).
    pub fn with_group_active(mut self, group: &str, active: bool) -> Self {
        self.set_group(group, active);
        self
    }

    pub(crate) fn set_group(&mut self, group: &str, active: bool) {
        let present = self.active_groups.iter().any(|g| g == group);
        if active && !present {
            self.active_groups.push(group.to_owned());
        } else if !active && present {
            self.active_groups.retain(|g| g != group);
        }
    }
}

/// A checkpoint is the state itself.
pub type Checkpoint = LoopState;
