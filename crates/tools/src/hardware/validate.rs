//! validate: launches an artifact against the reference and reports the
//! check as evidence for the completion gate.

use std::sync::Arc;

use mtswarm_core::{Effect, EffectKind, Risk, ToolError, ToolOutput, ToolSpec, schema_of};
use serde_json::json;

use crate::env::ToolEnv;

use super::run::{Launch, Launched, RunArgs};
use super::{hw_error, kernel_fault, outcome_text};

/// What `validate` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "validate",
    "Run a compiled artifact on this slice and check every execution's output against the reference (default 2 executions). Records validation evidence.",
    schema_of::<RunArgs>,
)
.risk(Risk::Medium)
.writes()
.concurrent()
.hardware()
.effects(&[EffectKind::Evidence]);

impl Launch {
    /// `validate`: check an artifact's output against the reference (two
    /// executions by default) and report the verdict as evidence.
    pub(crate) fn validate(env: Arc<ToolEnv>) -> Self {
        Self::with_report(env, &SPEC, 2, validation_report)
    }
}

fn validation_report(launched: Launched) -> Result<ToolOutput, ToolError> {
    let (built, request) = (&launched.built, &launched.request);
    let (passed, error, detail) = match launched.outcome {
        Ok(o) => (o.valid, o.error.clone(), outcome_text(&o)),
        Err(e) if kernel_fault(&e) => (false, Some(e.to_string()), format!("INVALID: {e}")),
        Err(e) => return Err(hw_error(e)),
    };
    let summary = json!({
        "artifact": built.id,
        "kernel_hash": built.artifact.kernel_hash,
        "defines": built.artifact.defines,
        "cores": request.cores,
        "runs": request.runs,
        "valid": passed,
        "error": error,
    });
    let verdict = if passed { "PASSED" } else { "FAILED" };
    let next = if passed {
        format!("\nnext: benchmark artifact {}", built.id)
    } else {
        "\nnext: this candidate gives a wrong answer; compile the next one".to_string()
    };
    Ok(ToolOutput::text(format!(
        "validation {verdict} for artifact {} on {} cores ({} executions): {detail}{next}",
        built.id, request.cores, request.runs
    ))
    .with_data(summary.clone())
    .with_effect(Effect::Evidence {
        kind: "validate".into(),
        passed,
        summary,
    }))
}
