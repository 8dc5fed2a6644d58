//! run: launches a built artifact on the slice and reports its outcome;
//! with [`Launch`], the launching tool it shares with validate.

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

const RUN_SHAPE: Shape = Shape {
    integers: &["cores", "runs"],
    numbers: &["timeout_seconds"],
    lists: &["args"],
    aliases: &[
        ("artifact_id", "artifact"),
        ("build", "artifact"),
        ("timeout", "timeout_seconds"),
        ("repeats", "runs"),
    ],
    // What compile and benchmark take, copied from their calls.
    ignored: &[
        "defines",
        "kernel_dir",
        "background",
        "unchecked",
        "warmup",
        "baseline_seconds",
        "min_seconds",
    ],
    ..Shape::NONE
};

/// One launch of an artifact: what was launched, how, and how it went.
pub(super) struct Launched {
    /// The artifact.
    pub(super) built: BuiltArtifact,
    /// The launch's cores, executions and time-out.
    pub(super) request: RunRequest,
    /// Its outcome, or why the board could not give one.
    pub(super) outcome: Result<RunOutcome, HwError>,
}

async fn launch(env: &ToolEnv, args: RunArgs, default_runs: u32) -> Result<Launched, ToolError> {
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
    Ok(Launched {
        built,
        request,
        outcome,
    })
}

/// A tool that launches an artifact on the slice (`run`, `validate`): the
/// arguments, their normalization, the slice it holds and the launch are
/// the same for both; each declares itself and reports the launch its own
/// way.
pub struct Launch {
    env: Arc<ToolEnv>,
    spec: &'static ToolSpec,
    default_runs: u32,
    report: fn(Launched) -> Result<ToolOutput, ToolError>,
}

#[async_trait::async_trait]
impl Tool for Launch {
    fn spec(&self) -> &ToolSpec {
        self.spec
    }
    fn resource(&self) -> Option<String> {
        Some(self.env.slice_id())
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &RUN_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: RunArgs = parse_args(args)?;
        (self.report)(launch(&self.env, args, self.default_runs).await?)
    }
}

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

impl Launch {
    /// `run`: launch an artifact once on the slice and report its outcome
    /// as it came.
    pub(crate) fn run(env: Arc<ToolEnv>) -> Self {
        Self::with_report(env, &SPEC, 1, run_report)
    }

    /// A launching tool declared by `spec`, reporting with `report`.
    pub(super) fn with_report(
        env: Arc<ToolEnv>,
        spec: &'static ToolSpec,
        default_runs: u32,
        report: fn(Launched) -> Result<ToolOutput, ToolError>,
    ) -> Self {
        Self {
            env,
            spec,
            default_runs,
            report,
        }
    }
}

fn run_report(launched: Launched) -> Result<ToolOutput, ToolError> {
    let (built, request) = (&launched.built, &launched.request);
    let outcome = launched.outcome.map_err(hw_error)?;
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
