//! How a task attempt ends: its [`TaskEnd`] (status, summary, error, the
//! final state), the structured `result_json` built from the final loop
//! state, and the published `TaskResult` with its `task_finished` event.

use std::time::Duration;

use mtswarm_bus::v1;
use mtswarm_core::{LoopState, Outcome, StopReason, Verdict};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::task_run::TaskRun;
use crate::events::now_timestamp;
use crate::stop::StopMode;
use crate::text::first_line;
use mtswarm_core::answer::last_json;

use v1::AgentEventKind as Kind;

/// How a task attempt ended, for its result.
pub(super) struct TaskEnd {
    pub(super) status: v1::TaskStatus,
    pub(super) summary: String,
    pub(super) result: Value,
    pub(super) error: String,
    pub(super) state: Option<LoopState>,
}

impl TaskEnd {
    pub(super) fn failed(error: impl Into<String>) -> Self {
        let error = error.into();
        Self {
            status: v1::TaskStatus::Failed,
            summary: first_line(&error),
            result: json!({"error": error}),
            error,
            state: None,
        }
    }
}

pub(super) fn task_end(outcome: Outcome, stop: &watch::Receiver<StopMode>) -> TaskEnd {
    match outcome {
        Outcome::Final {
            text,
            verdict,
            state,
        } => TaskEnd {
            status: v1::TaskStatus::Ok,
            summary: first_line(&text),
            result: result_json(&state, Some(&text), Some(&verdict), None),
            error: String::new(),
            state: Some(state),
        },
        Outcome::Stopped {
            reason,
            message,
            state,
        } => {
            let status = if reason == StopReason::Cancelled {
                v1::TaskStatus::Cancelled
            } else {
                v1::TaskStatus::Failed
            };
            let message = match (&*stop.borrow(), reason) {
                (StopMode::Cancel(why), StopReason::Cancelled) => format!("cancelled: {why}"),
                _ => message,
            };
            TaskEnd {
                status,
                summary: first_line(&message),
                result: result_json(&state, None, None, Some(reason)),
                error: message,
                state: Some(state),
            }
        }
        Outcome::Paused { checkpoint, .. } => TaskEnd {
            status: v1::TaskStatus::Failed,
            summary: "the run is still waiting for approval".into(),
            result: result_json(&checkpoint, None, None, None),
            error: "the run is still waiting for approval".into(),
            state: Some(checkpoint),
        },
    }
}

/// The structured result: the best measurement, the evidence, the answer.
fn result_json(
    state: &LoopState,
    answer: Option<&str>,
    verdict: Option<&Verdict>,
    stop: Option<StopReason>,
) -> Value {
    let working = state.working_state();
    let evidence: Vec<&mtswarm_core::working::EvidenceRecord> = state
        .evidence()
        .records
        .iter()
        .filter(|r| r.passed)
        .collect();
    json!({
        "best": working.extra.get("best").cloned().unwrap_or(Value::Null),
        "candidates": working.current_candidates.clone().unwrap_or(Value::Null),
        "benchmarks": working.benchmark_results,
        "evidence": evidence,
        "answer": answer,
        "answer_json": answer.and_then(last_json),
        "verdict": verdict,
        "stop_reason": stop,
        "steps": state.step(),
    })
}

impl TaskRun<'_> {
    /// Publish the attempt's result, then ack the delivery (or ask for a
    /// redelivery when the result could not be stored).
    pub(super) async fn publish_result(&self, end: TaskEnd) {
        if end.status == v1::TaskStatus::Failed {
            // The task's `invoke_agent` span: a failed attempt is a failed
            // invocation (the conventions' error status).
            let span = tracing::Span::current();
            span.record("error.type", "task_failed");
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", end.error.as_str());
        }
        let task = &self.task;
        let usage = {
            let (steps, prompt, completion) = end
                .state
                .as_ref()
                .map(|s| (s.step(), s.usage().input_tokens, s.usage().output_tokens))
                .unwrap_or_default();
            v1::Usage {
                steps,
                prompt_tokens: prompt,
                completion_tokens: completion,
                device_seconds: self.device_seconds(),
                wall_seconds: self.started.elapsed().as_secs_f64(),
                // The leader prices the tokens by the model that produced them.
                model: self.runtime.model.model_name().to_string(),
            }
        };
        self.entry.update(|p| p.usage = usage.clone());
        let result = v1::TaskResult {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            // The attempt's capability, returned to the leader that issued it.
            result_token: task.result_token.clone(),
            job_id: task.job_id.clone(),
            agent_id: self.entry.agent_id.clone(),
            session_id: self.entry.session_id.clone(),
            worker_id: self.shared.identity.worker_id.clone(),
            slice_id: self.slice_id(),
            status: end.status as i32,
            summary: end.summary.clone(),
            result_json: end.result.to_string(),
            error: end.error.clone(),
            usage: Some(usage),
            finished_at: Some(now_timestamp()),
            fenced: false,
        };
        self.events
            .publish(
                self.entry.progress().step,
                Kind::Log,
                json!({"type": "task_finished", "task_id": task.task_id, "attempt": task.attempt,
                       "status": end.status.as_str_name(), "summary": end.summary}),
            )
            .await;
        match self.shared.stores.bus.publish_result(&result).await {
            Ok(receipt) => {
                tracing::info!(task.id = %task.task_id, status = end.status.as_str_name(), duplicate = receipt.duplicate, "task result published");
                // The result is stored and deduplicated by its message id, so a
                // lost ack only costs a redelivery that ends in a duplicate result.
                if let Err(error) = self.delivery.ack().await {
                    tracing::warn!(%error, "task not acknowledged");
                }
            }
            Err(error) => {
                // Without a stored result the task must come back.
                tracing::error!(%error, "task result not published; asking for redelivery");
                let _ = self.delivery.nak(Some(Duration::from_secs(1))).await;
            }
        }
    }
}
