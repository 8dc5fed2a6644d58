//! The completion gate: a final answer is accepted only when the evidence the
//! job requires was taken after the latest edit. A model that claims success
//! without checking gets feedback and another try (bounded).

use serde::{Deserialize, Serialize};

use crate::working::{EvidenceLedger, WorkingState};

/// What a job requires before an answer counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateConfig {
    /// Evidence kinds (e.g. "validate", "benchmark") that must be present,
    /// passed and newer than the latest mutation. `None` or empty: no
    /// requirement, every answer passes.
    pub require_evidence: Option<Vec<String>>,
    /// Accept an answer with missing evidence as UNVERIFIED instead of
    /// rejecting it.
    pub best_effort: bool,
    /// Rejections before the run stops with a failure.
    pub max_blocks: u32,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self {
            require_evidence: None,
            best_effort: false,
            max_blocks: 2,
        }
    }
}

/// The gate's judgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum GateVerdict {
    /// The answer is supported by valid evidence.
    Pass,
    /// Reject; `feedback` is injected as a user message.
    Fail {
        /// Why, fed back to the model as the next user message.
        feedback: String,
    },
    /// Accept, flagged as not verified.
    Unverified {
        /// The evidence kinds that were missing.
        missing: Vec<String>,
    },
}

/// Judges final answers. The default is [`EvidenceGate`]; jobs with other
/// acceptance rules plug in their own.
pub trait CompletionGate: Send + Sync {
    /// Judge `answer` against the evidence and the working state.
    fn evaluate(
        &self,
        answer: &str,
        evidence: &EvidenceLedger,
        working: &WorkingState,
    ) -> GateVerdict;
}

/// The gate driven by [`GateConfig`].
#[derive(Debug, Clone, Default)]
pub struct EvidenceGate {
    /// What evidence it asks for.
    pub config: GateConfig,
}

impl CompletionGate for EvidenceGate {
    fn evaluate(
        &self,
        _answer: &str,
        evidence: &EvidenceLedger,
        _working: &WorkingState,
    ) -> GateVerdict {
        let Some(required) = &self.config.require_evidence else {
            return GateVerdict::Pass;
        };
        let missing: Vec<String> = required
            .iter()
            .filter(|kind| !evidence.has_valid(kind))
            .cloned()
            .collect();
        if missing.is_empty() {
            return GateVerdict::Pass;
        }
        if self.config.best_effort {
            return GateVerdict::Unverified { missing };
        }
        let mut feedback = format!(
            "Your answer is not accepted yet: it lacks passing evidence of {} taken after the latest change.",
            missing.join(", ")
        );
        let voided: Vec<&str> = missing
            .iter()
            .filter(|k| evidence.has_voided(k))
            .map(String::as_str)
            .collect();
        if let (false, Some(mutation)) = (voided.is_empty(), &evidence.last_mutation) {
            feedback.push_str(&format!(
                " Earlier {} results no longer count because '{}' changed at step {} after them.",
                voided.join(", "),
                mutation.target,
                mutation.step
            ));
        }
        feedback.push_str(" Run the missing checks on the current code, then answer again.");
        GateVerdict::Fail { feedback }
    }
}
