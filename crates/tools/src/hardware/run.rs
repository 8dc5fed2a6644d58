//! run: launches a built artifact on the slice and reports its outcome.

use std::sync::Arc;

use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use mtswarm_hw::{HwError, RunOutcome, RunRequest};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::{BuiltArtifact, ToolEnv, parse_args};
use crate::normalize::Shape;

use super::{cores_of, hw_error, outcome_text, timeout_of};

/// Arguments of run and validate.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// Artifact id from compile (default: the latest).
    #[serde(default)]
    pub artifact: Option<String>,
    /// DSP cores (default: all cores of the slice).
    #[serde(default)]
    pub cores: Option<u32>,
    /// Kernel executions in this launch (default 1 for run, 2 for validate).
    #[serde(default)]
    pub runs: Option<u32>,
    /// Kill the launch after this many seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Extra harness arguments.
    #[serde(default)]
    pub args: Option<Vec<String>>,
}

pub(super) const RUN_SHAPE: Shape = Shape {
    integers: &["cores", "runs"],
    numbers: &["timeout_seconds"],
    lists: &["args"],
    aliases: &[
        ("artifact_id", "artifact"),
        ("build", "artifact"),
        ("timeout", "timeout_seconds"),
        ("repeats", "runs"),
    ],
    ..Shape::NONE
};

pub(super) async fn launch(
    env: &ToolEnv,
    args: RunArgs,
    default_runs: u32,
) -> Result<(BuiltArtifact, RunRequest, Result<RunOutcome, HwError>), ToolError> {
    let built = env.session().artifact(args.artifact.as_deref())?;
    let runs = args.runs.unwrap_or(default_runs);
    if runs == 0 || runs > 1000 {
        return Err(ToolError::InvalidArgs(format!(
            "runs must be in 1..=1000, got {runs}"
        )));
    }
    let request = RunRequest {
        cores: cores_of(env, args.cores)?,
        runs,
        timeout: timeout_of(args.timeout_seconds)?,
        args: args.args.unwrap_or_default(),
        seed: None,
    };
    let outcome = env.board.run(&built.artifact, &request).await;
    Ok((built, request, outcome))
}

/// Launch an artifact once on the slice.
pub struct Run(pub(crate) Arc<ToolEnv>);

/// What `run` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "run",
    "Launch a compiled artifact on this slice (holds the slice) and report validity, time, GFLOPS and output. Use validate or benchmark for evidence.",
    schema_of::<RunArgs>,
)
.risk(Risk::Medium)
.writes()
.concurrent()
.hardware();

#[async_trait::async_trait]
impl Tool for Run {
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
        let (built, request, outcome) = launch(&self.0, args, 1).await?;
        let outcome = outcome.map_err(hw_error)?;
        let text = format!(
            "artifact {} on {} cores: {}",
            built.id,
            request.cores,
            outcome_text(&outcome)
        );
        Ok(ToolOutput::text(text).with_data(json!({
            "artifact": built.id,
            "cores": request.cores,
            "runs": request.runs,
            "outcome": outcome,
        })))
    }
}
