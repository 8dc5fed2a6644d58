//! The leader's completion gate: a final answer may only claim figures that
//! an accepted task result backs. A real model that summarizes from memory,
//! rounds creatively or invents a number gets feedback naming the figures it
//! may use and another try; the job's outcome never depends on the answer
//! (see [`crate::outcome`]), but the answer kept beside it must not
//! contradict it.
//!
//! Claims read from an answer: every `<number> GFLOP[S|/s]` in the text and
//! the `best.gflops` of its last ```` ```json ```` block. Backing figures:
//! every number under a `gflops` key anywhere in the accepted results'
//! `result_json` of the job. A claim is backed when it is within rounding
//! (half a percent, or 0.006 for two-decimal figures) of one of them.

use std::sync::{Arc, LazyLock};

use mtswarm_core::{CompletionGate, EvidenceLedger, GateVerdict, WorkingState};
use regex::Regex;
use serde_json::Value;

use crate::results::JobResults;

/// `<number> GFLOP...` in an answer's text. `None` only if the literal
/// pattern were invalid (the tests' claims show it compiles).
static GFLOPS_CLAIM: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)([0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?)\s*GFLOP").ok());

/// Figures listed in the feedback at most.
const FEEDBACK_FIGURES: usize = 8;

/// Rejects answers whose GFLOPS claims no accepted result backs.
pub(crate) struct GroundedAnswerGate {
    results: Arc<JobResults>,
}

impl GroundedAnswerGate {
    pub(crate) fn new(results: Arc<JobResults>) -> Self {
        Self { results }
    }

    fn backing_figures(&self) -> Vec<f64> {
        let mut figures = Vec::new();
        for view in self.results.snapshot() {
            let Some(result) = view.result else { continue };
            if let Ok(value) = serde_json::from_str::<Value>(&result.result_json) {
                collect_gflops(&value, &mut figures);
            }
        }
        figures.retain(|f| f.is_finite());
        figures.sort_by(|a, b| b.total_cmp(a));
        figures.dedup();
        figures
    }
}

fn collect_gflops(value: &Value, out: &mut Vec<f64>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                if key == "gflops"
                    && let Some(n) = item.as_f64()
                {
                    out.push(n);
                }
                collect_gflops(item, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_gflops(i, out)),
        _ => {}
    }
}

/// The GFLOPS figures an answer claims.
pub(crate) fn claimed_gflops(answer: &str) -> Vec<f64> {
    let mut claims: Vec<f64> = GFLOPS_CLAIM
        .iter()
        .flat_map(|re| re.captures_iter(answer))
        .filter_map(|c| c.get(1)?.as_str().parse().ok())
        .collect();
    if let Some(block) = mtswarm_core::answer::last_json(answer)
        && let Some(g) = block["best"]["gflops"].as_f64()
    {
        claims.push(g);
    }
    claims.retain(|c: &f64| c.is_finite() && *c > 0.0);
    claims
}

fn backed(claim: f64, figures: &[f64]) -> bool {
    figures
        .iter()
        .any(|f| (claim - f).abs() <= (f.abs() * 0.005).max(0.006))
}

impl CompletionGate for GroundedAnswerGate {
    fn evaluate(
        &self,
        answer: &str,
        _evidence: &EvidenceLedger,
        _working: &WorkingState,
    ) -> GateVerdict {
        let claims = claimed_gflops(answer);
        if claims.is_empty() {
            return GateVerdict::Pass;
        }
        let figures = self.backing_figures();
        let unbacked: Vec<String> = claims
            .iter()
            .filter(|c| !backed(**c, &figures))
            .map(|c| format!("{c}"))
            .collect();
        if unbacked.is_empty() {
            return GateVerdict::Pass;
        }
        let known = if figures.is_empty() {
            "no accepted task result reports a GFLOPS figure yet".to_string()
        } else {
            format!(
                "the accepted results report these GFLOPS figures (highest first): {}",
                figures
                    .iter()
                    .take(FEEDBACK_FIGURES)
                    .map(|f| format!("{f:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        GateVerdict::Fail {
            feedback: format!(
                "Your answer is not accepted: it claims {} GFLOPS, which no accepted task result backs; {known}. \
Answer again using only figures from collect_result or result_details.",
                unbacked.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_bus::v1;

    fn gate_with(result_json: &str) -> GroundedAnswerGate {
        let results = Arc::new(JobResults::default());
        results.register("t1", "a1", 1);
        let offered = v1::TaskResult {
            task_id: "t1".into(),
            attempt: 1,
            status: v1::TaskStatus::Ok as i32,
            result_json: result_json.into(),
            ..Default::default()
        };
        results.offer(&offered);
        results.publish_accepted("t1");
        GroundedAnswerGate::new(results)
    }

    #[test]
    fn claims_backed_by_an_accepted_result_pass_and_others_get_feedback() {
        let gate = gate_with(r#"{"best": {"gflops": 12.3456}, "candidates": [{"gflops": 3.0}]}"#);
        let evidence = EvidenceLedger::default();
        let working = WorkingState::default();
        let fine = "Best at 12.35 GFLOP/s.\n```json\n{\"best\": {\"gflops\": 12.3456}}\n```";
        assert_eq!(gate.evaluate(fine, &evidence, &working), GateVerdict::Pass);
        assert_eq!(
            gate.evaluate("no figures at all", &evidence, &working),
            GateVerdict::Pass
        );
        let GateVerdict::Fail { feedback } =
            gate.evaluate("It reaches 99.5 GFLOPS.", &evidence, &working)
        else {
            panic!("an invented figure must be rejected")
        };
        assert!(
            feedback.contains("99.5") && feedback.contains("12.346"),
            "{feedback}"
        );
        let empty = gate_with("{}");
        assert!(matches!(
            empty.evaluate("3 GFLOPS", &evidence, &working),
            GateVerdict::Fail { .. }
        ));
    }
}
