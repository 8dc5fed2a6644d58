//! How the leader loop ended ([`JobEnd`]) and what its answer says: the
//! summary line, the `result_json` block and the usage, before the outcome
//! decides the job's final state. A summary is always a sentence a person
//! can read, whatever the model wrote (a bare JSON answer has no line of
//! prose to take).

use mtswarm_bus::v1;
use mtswarm_core::LoopState;
use serde_json::Value;

use mtswarm_core::answer::last_json;

/// Characters of a summary at most.
const SUMMARY_CHARS: usize = 1000;
/// The summary of an answer with neither a line of prose nor a `summary` or
/// `error` text in its JSON.
const NO_SUMMARY: &str = "The leader answered without a summary line.";

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
    JobEnd {
        state: v1::JobState::Succeeded,
        summary: summary_of(text, block.as_ref()),
        result_json: block.map(|b| b.to_string()).unwrap_or_default(),
        final_answer: text.to_string(),
        error: String::new(),
        usage: usage_of(state),
    }
}

/// An answer's summary: its first line of prose (not a fence, not a line of
/// JSON); else the `summary` or `error` text of its JSON; else
/// [`NO_SUMMARY`].
fn summary_of(text: &str, block: Option<&Value>) -> String {
    let field = || {
        let block = block?;
        ["summary", "error"].iter().find_map(|key| {
            block
                .get(key)?
                .as_str()
                .map(str::trim)
                .filter(|text| text.chars().any(char::is_alphanumeric))
        })
    };
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| is_prose(line))
        .or_else(field)
        .unwrap_or(NO_SUMMARY);
    line.chars().take(SUMMARY_CHARS).collect()
}

/// True for a line of words: not a fence, not a line of JSON (starting with
/// a bracket or a quote), not bare punctuation.
fn is_prose(line: &str) -> bool {
    !line.starts_with("```")
        && !line.starts_with(['{', '}', '[', ']', '"'])
        && line.chars().any(char::is_alphanumeric)
}

/// The summary of a loop stopped because its answers were refused until
/// the refusals were spent: the stop's first sentence, which says how many
/// times and why.
pub(super) fn refused_summary(message: &str) -> String {
    let sentence = match message.find(". ") {
        Some(end) => &message[..=end],
        None => message,
    };
    let sentence: String = sentence.chars().take(SUMMARY_CHARS).collect();
    format!("The leader's loop ended without an accepted answer: {sentence}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_prose_a_field_or_a_sentence_never_a_brace() {
        let summary = |text: &str| summary_of(text, last_json(text).as_ref());
        let pretty = "{\n  \"best\": null,\n  \"error\": \"nothing worked\"\n}";
        assert_eq!(summary(pretty), "nothing worked");
        assert_eq!(
            summary("```json\n{\n  \"summary\": \"Best N=8 at 3 GFLOPS\"\n}\n```"),
            "Best N=8 at 3 GFLOPS"
        );
        assert_eq!(summary("{\n  \"best\": null\n}"), NO_SUMMARY);
        assert_eq!(summary("```json\n{\n}\n```"), NO_SUMMARY);
        assert_eq!(summary(""), NO_SUMMARY);
        assert_eq!(
            summary("\n  Nothing to tune.\n```json\n{\"best\": null}\n```"),
            "Nothing to tune."
        );
        assert_eq!(summary("---\n* Best: N=8\n"), "* Best: N=8");
    }

    #[test]
    fn a_refused_answer_is_summed_up_in_its_first_sentence() {
        let message = "the answer was rejected 4 times by the completion gate: Your answer is not \
accepted: no task has been assigned yet. Do this next: call list_fleet.";
        let summary = refused_summary(message);
        assert!(
            summary.ends_with("no task has been assigned yet."),
            "{summary}"
        );
        assert!(!summary.contains("list_fleet"), "{summary}");
    }
}
