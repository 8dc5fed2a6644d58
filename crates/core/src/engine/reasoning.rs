//! The reasoning node: budgets, one model turn, and what its reply leads
//! to (an answer for the completion gate, tool calls, or a recovery retry).

use crate::event::EventKind;
use crate::gate::GateVerdict;
use crate::middleware::{CompactionTrigger, ModelTurn};
use crate::model::{Message, ModelError};
use crate::registry::{CallRejection, parse_arguments};
use crate::state::{CallStatus, Node, PendingCall, StopReason, TransitionReason, Verdict};

use super::Run;

impl Run {
    pub(super) fn apply_group_changes(&mut self) {
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
    pub(super) fn budget_stop(&mut self) -> bool {
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

    pub(super) async fn reasoning(&mut self) {
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

    pub(super) fn account_usage(&mut self, turn: &ModelTurn, estimated_input: u64) {
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

    pub(super) fn judge_answer(&mut self, text: String) {
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
                self.view.require_tool_call();
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

    pub(super) fn steps_exhausted(&mut self) -> bool {
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

    pub(super) fn accept_tool_calls(&mut self, turn: ModelTurn) {
        let step = self.state.step;
        let mut calls = turn.tool_calls;
        for (index, call) in calls.iter_mut().enumerate() {
            if call.id.is_empty() {
                call.id = format!("call_{step}_{index}");
            }
        }
        let mut pending = Vec::with_capacity(calls.len());
        let mut protocol_errors: u32 = 0;
        for call in calls.iter().cloned() {
            // A call the client saw attempted in text but could not read
            // is a protocol error naming its problem.
            let parsed = match call.unreadable_problem() {
                Some(problem) => Err(CallRejection::Protocol(format!(
                    "protocol error: {problem}"
                ))),
                None => parse_arguments(&call.arguments),
            };
            let (arguments, status) = match parsed {
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
                ignored_arguments: Vec::new(),
            });
        }
        self.state.risk.protocol_errors += protocol_errors;
        let nothing_readable = !pending.is_empty() && protocol_errors as usize == pending.len();
        if nothing_readable && self.state.recovery.protocol_retries == 0 {
            // The first reply of a streak with no readable call is asked
            // again as it was, without feedback: a small model shown its
            // garbled reply and the explanation tends to imitate them (it
            // answers with the error object itself), while a new sample
            // of the same request usually reads; the prompt is the one
            // the server has cached. A second one in a row is told.
            self.state.recovery.protocol_retries += 1;
            let problem = pending
                .iter()
                .find_map(|call| match &call.status {
                    CallStatus::Rejected { observation } => Some(observation.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            self.transition(
                Node::Reasoning,
                TransitionReason::ModelRecoveryRetry,
                Some(format!("no readable tool call, asked again: {problem}")),
            );
            return;
        }
        self.state
            .push_message(Message::assistant(turn.text, calls));
        if nothing_readable {
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
}
