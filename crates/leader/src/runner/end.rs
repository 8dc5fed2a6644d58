//! How the leader loop ended ([`JobEnd`]) and what its answer says: the
//! summary line, the `result_json` block and the usage, before the outcome
//! decides the job's final state.

use mtswarm_bus::v1;
use mtswarm_core::LoopState;

use mtswarm_core::answer::last_json;

/// How the leader loop ended.
pub(super) struct JobEnd {
    pub(super) state: v1::JobState,
    pub(super) summary: String,
    pub(super) result_json: String,
    /// The model's final answer as written (empty when it gave none).
    pub(super) final_answer: String,
    pub(super) error: String,
    pub(super) usage: v1::Usage,
}

impl JobEnd {
    pub(super) fn failed(error: impl Into<String>) -> Self {
        Self {
            state: v1::JobState::Failed,
            summary: String::new(),
            result_json: String::new(),
            final_answer: String::new(),
            error: error.into(),
            usage: v1::Usage::default(),
        }
    }

    /// The job was cancelled, for `reason`.
    pub(super) fn cancelled(reason: impl Into<String>) -> Self {
        Self {
            state: v1::JobState::Cancelled,
            ..Self::failed(reason)
        }
    }

    /// Applies the outcome: an answered job without an accepted valid
    /// measurement FAILED with the outcome's reason, whatever the answer
    /// says; with one it SUCCEEDED and its summary is the outcome's.
    pub(super) fn settle(&mut self, outcome: &v1::JobOutcome) {
        if self.state != v1::JobState::Succeeded {
            return;
        }
        match &outcome.best {
            Some(best) => self.summary = crate::outcome::summary_line(best),
            None => {
                self.state = v1::JobState::Failed;
                self.error = outcome.failure_reason.clone();
            }
        }
    }
}

/// The loop's usage so far, as the job record counts it.
pub(super) fn usage_of(state: &LoopState) -> v1::Usage {
    let tokens = state.usage();
    v1::Usage {
        steps: state.step(),
        prompt_tokens: tokens.input_tokens,
        completion_tokens: tokens.output_tokens,
        ..Default::default()
    }
}

/// The loop answered: the job's state is decided by its outcome
/// ([`JobEnd::settle`]); the answer is kept beside it.
pub(super) fn final_answer(text: &str, state: &LoopState) -> JobEnd {
    let block = last_json(text);
    let summary: String = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("```"))
        .unwrap_or_default()
        .chars()
        .take(1000)
        .collect();
    JobEnd {
        state: v1::JobState::Succeeded,
        summary,
        result_json: block.map(|b| b.to_string()).unwrap_or_default(),
        final_answer: text.to_string(),
        error: String::new(),
        usage: usage_of(state),
    }
}
