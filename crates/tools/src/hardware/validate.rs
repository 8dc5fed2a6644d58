//! validate: launches an artifact against the reference and reports the
//! check as evidence for the completion gate.

use std::sync::Arc;

use mtswarm_core::{
    Effect, EffectKind, Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of,
};
use serde_json::{Value, json};

use crate::env::{ToolEnv, parse_args};

use super::run::{RUN_SHAPE, RunArgs, launch};
use super::{hw_error, kernel_fault, outcome_text};

/// Check an artifact's output against the reference.
pub struct Validate(pub(crate) Arc<ToolEnv>);

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

#[async_trait::async_trait]
impl Tool for Validate {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn resource(&self) -> Option<String> {
        Some(self.0.slice_id())
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &RUN_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: RunArgs = parse_args(args)?;
        let (built, request, outcome) = launch(&self.0, args, 2).await?;
        let (passed, error, detail) = match outcome {
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
        Ok(ToolOutput::text(format!(
            "validation {verdict} for artifact {} on {} cores ({} executions): {detail}",
            built.id, request.cores, request.runs
        ))
        .with_data(summary.clone())
        .with_effect(Effect::Evidence {
            kind: "validate".into(),
            passed,
            summary,
        }))
    }
}
