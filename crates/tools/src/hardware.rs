//! The tools that build and launch kernels: compile (host CPU work, runs
//! concurrently, never takes the slice), wait_build, run / validate /
//! benchmark (hardware: they report `needs_hardware` with the slice id as
//! their resource, so the engine holds the slice lock around each call) and
//! board_info.
//!
//! A compile with `background: true` returns at once and builds on its own
//! task; `wait_build` collects it later. A step that is a hardware call
//! plus compiles would otherwise last as long as its slowest compile, and
//! the slice would idle for the difference; background builds span steps,
//! so the next candidates build while the slice runs the current ones.
//! Hardware calls refuse an artifact whose build is still running (the
//! slice is never held waiting for the compiler).
//!
//! Their effects keep the engine's working state current: compile appends
//! `compile_results`; validate and benchmark emit evidence for the completion
//! gate; benchmark appends `benchmark_results` and updates
//! `current_candidates` and `best`. Artifacts built before the latest source
//! edit are refused, so evidence always belongs to the current code. On the
//! `host` backend, whose timing shares the CPU with the compiler, a
//! benchmark waits for the session's compiles and holds new ones back
//! while it measures.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_core::{Effect, Risk, Tool, ToolContext, ToolError, ToolOutput};
use mtswarm_hw::measure::{MeasureConfig, Measurement, measure};
use mtswarm_hw::{Artifact, BackendKind, Board, BuildRequest, HwError, RunOutcome, RunRequest};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::{BuildReport, BuiltArtifact, ToolEnv, parse_args};
use crate::files::tool_basics;
use crate::normalize::Shape;

/// Longest time-out a call may ask for.
const MAX_TIMEOUT_SECONDS: f64 = 3600.0;
const DEFAULT_TIMEOUT_SECONDS: f64 = 120.0;
/// Candidates kept in the working state.
const CANDIDATES_SHOWN: usize = 5;

/// Artifacts board_info lists by id (the newest); it counts the rest, so
/// its output stays the same size however many builds a session made.
const ARTIFACTS_SHOWN: usize = 12;

fn timeout_of(seconds: Option<f64>) -> Result<Duration, ToolError> {
    let s = seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if !(s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT_SECONDS) {
        return Err(ToolError::InvalidArgs(format!(
            "timeout_seconds must be in (0, {MAX_TIMEOUT_SECONDS}], got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

pub(crate) fn cores_of(env: &ToolEnv, cores: Option<u32>) -> Result<u32, ToolError> {
    let slice_cores = env.board.slice().cores;
    let cores = cores.unwrap_or(slice_cores);
    if cores == 0 || cores > slice_cores {
        return Err(ToolError::InvalidArgs(format!(
            "cores must be in 1..={slice_cores} (the slice's cores), got {cores}"
        )));
    }
    Ok(cores)
}

/// A launch error that is the kernel's fault (it ran and misbehaved) rather
/// than the system's: reported as a failed check, not a tool failure.
fn kernel_fault(e: &HwError) -> bool {
    matches!(e, HwError::Capacity(_) | HwError::Timeout(_))
}

fn hw_error(e: HwError) -> ToolError {
    match e {
        HwError::Config(m) | HwError::Kernel(m) => ToolError::InvalidArgs(m),
        other => ToolError::Failed(other.to_string()),
    }
}

fn outcome_text(o: &RunOutcome) -> String {
    let mut s = format!(
        "{}: {:.4e} s, {:.2} GFLOPS ({:.1}% of peak)",
        if o.valid { "valid" } else { "INVALID" },
        o.seconds,
        o.gflops,
        o.peak_fraction * 100.0
    );
    if let Some(c) = o.modeled_cycles {
        s.push_str(&format!(", {c} modeled cycles"));
    }
    if let Some(e) = o.max_abs_err {
        s.push_str(&format!(", max_abs_err {e:.3e}"));
    }
    if o.samples.len() > 1 {
        s.push_str(&format!(", {} executions", o.samples.len()));
    }
    if let Some(err) = &o.error {
        s.push_str(&format!("\nerror: {err}"));
    }
    if !o.valid && !o.output_tail.trim().is_empty() {
        let tail: String = {
            let chars: Vec<char> = o.output_tail.chars().collect();
            chars[chars.len().saturating_sub(1500)..].iter().collect()
        };
        s.push_str(&format!("\noutput tail:\n{tail}"));
    }
    s
}

// ------------------------------------------------------------------ compile

/// Arguments of compile.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompileArgs {
    /// Kernel directory relative to the workspace, holding kernel.c and
    /// host.c (default: the workspace root).
    #[serde(default)]
    pub kernel_dir: Option<String>,
    /// `-D` parameters: tuning knobs and problem sizes, NAME -> VALUE.
    #[serde(default)]
    pub defines: Option<BTreeMap<String, String>>,
    /// Start the build and return at once with its artifact id; call
    /// wait_build with the id before running it (default false). Lets the
    /// host compile the next candidates while the slice runs this one.
    #[serde(default)]
    pub background: Option<bool>,
    /// Skip the check of the defines against tune.toml (names, values,
    /// constraints); for knobs outside the tuning space such as fault
    /// injection (default false).
    #[serde(default)]
    pub unchecked: Option<bool>,
}

const COMPILE_SHAPE: Shape = Shape {
    integers: &[],
    numbers: &[],
    bools: &["background", "unchecked"],
    lists: &[],
    maps: &["defines"],
    aliases: &[
        ("dir", "kernel_dir"),
        ("path", "kernel_dir"),
        ("params", "defines"),
        ("knobs", "defines"),
        ("async", "background"),
    ],
};

/// One build: what to compile and where its artifact goes.
pub(crate) struct BuildJob {
    pub(crate) id: String,
    pub(crate) generation: u64,
    pub(crate) kernel_dir_rel: String,
    pub(crate) defines: BTreeMap<String, String>,
    pub(crate) out_dir: PathBuf,
    /// What is built: the kernel's sources with the pristine harness.
    pub(crate) staged_dir: PathBuf,
}

/// Compile on the host CPU (shared gate: a host-timed benchmark of this
/// session excludes compiles).
pub(crate) async fn run_build(
    board: Arc<dyn Board>,
    gate: Arc<tokio::sync::RwLock<()>>,
    job: &BuildJob,
) -> Result<Artifact, ToolError> {
    let _compiling = gate.read().await;
    let built = board
        .build(&BuildRequest {
            kernel_dir: job.staged_dir.clone(),
            defines: job.defines.clone(),
            out_dir: job.out_dir.clone(),
        })
        .await;
    let _ = std::fs::remove_dir_all(&job.staged_dir);
    built.map_err(|e| match e {
        HwError::Compile(m) => ToolError::Failed(format!("compile failed: {m}")),
        other => hw_error(other),
    })
}

/// Record a finished build in the session and describe it.
fn record_build(env: &ToolEnv, job: BuildJob, artifact: Artifact) -> BuildReport {
    let summary = json!({
        "artifact": job.id,
        "ok": true,
        "kernel_dir": job.kernel_dir_rel,
        "defines": job.defines,
        "kernel_hash": artifact.kernel_hash,
        "toolchain": artifact.toolchain,
    });
    let mut text = format!(
        "compiled {} as artifact {} (kernel {}, {})",
        job.kernel_dir_rel,
        job.id,
        artifact.kernel_hash.chars().take(12).collect::<String>(),
        artifact.toolchain
    );
    if !artifact.log.trim().is_empty() {
        let log: String = artifact.log.chars().take(3000).collect();
        text.push_str(&format!("\ncompiler output:\n{log}"));
    }
    let mut session = env.session();
    session.artifacts.insert(
        job.id.clone(),
        BuiltArtifact {
            id: job.id.clone(),
            kernel_dir: job.kernel_dir_rel,
            artifact,
            generation: job.generation,
        },
    );
    session.latest = Some(job.id);
    BuildReport { text, summary }
}

/// Defines are checked against the kernel's tune.toml, when it has a
/// readable one: an unknown name, a value outside the space or a broken
/// constraint is an error naming it (instead of a build of the defaults).
fn check_defines(
    kernel_dir: &std::path::Path,
    defines: &BTreeMap<String, String>,
    spec: &mtswarm_hw::ChipSpec,
) -> Result<(), ToolError> {
    let file = kernel_dir.join("tune.toml");
    if !file.is_file() {
        return Ok(());
    }
    match mtswarm_hw::tune::TuneSpace::load(&file) {
        Ok(space) => space
            .check_defines(defines, spec)
            .map_err(|e| ToolError::InvalidArgs(e.to_string())),
        // An unreadable tune.toml is the kernel's problem, reported by the
        // tools that read it; the build itself does not need it.
        Err(_) => Ok(()),
    }
}

fn build_output(report: BuildReport) -> ToolOutput {
    ToolOutput::text(report.text)
        .with_data(report.summary.clone())
        .with_effect(Effect::State {
            key: "compile_results".into(),
            value: report.summary,
            append: true,
        })
}

/// Build a kernel directory for the session's backend.
pub struct Compile(pub(crate) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for Compile {
    tool_basics!(
        "compile",
        "Compile the kernel directory (kernel.c + host.c) with the given -D defines for this slice's backend. Returns an artifact id for run/validate/benchmark. Runs on the host CPU; with background=true it returns at once and wait_build collects the result.",
        CompileArgs,
        Risk::Low,
        true,
        true,
        COMPILE_SHAPE
    );

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: CompileArgs = parse_args(args)?;
        let shown = args.kernel_dir.clone().unwrap_or_else(|| ".".into());
        let kernel_dir = self
            .0
            .workspace
            .resolve(&shown)
            .map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        if !kernel_dir.is_dir() {
            return Err(ToolError::InvalidArgs(format!(
                "kernel_dir `{shown}` is not a directory"
            )));
        }
        let defines = args.defines.unwrap_or_default();
        if !args.unchecked.unwrap_or(false) {
            check_defines(&kernel_dir, &defines, &self.0.spec)?;
        }
        let (id, generation) = {
            let mut session = self.0.session();
            (session.next_build_id(), session.source_generation)
        };
        let staged_dir = self.0.harness.stage(&kernel_dir, &id)?;
        let job = BuildJob {
            staged_dir,
            out_dir: self.0.workspace.root().join(".build").join(&id),
            kernel_dir_rel: self.0.workspace.relative(&kernel_dir),
            id,
            generation,
            defines,
        };
        let board = self.0.board.clone();
        let gate = self.0.compile_gate.clone();
        if !args.background.unwrap_or(false) {
            ctx.progress(format!("compiling {shown} as {}", job.id), None);
            let artifact = run_build(board, gate, &job).await?;
            return Ok(build_output(record_build(&self.0, job, artifact)));
        }
        let id = job.id.clone();
        let (publish, watch) = tokio::sync::watch::channel(None);
        self.0.session().background_builds.insert(id.clone(), watch);
        // The build must not keep the session's tools alive.
        let env = Arc::downgrade(&self.0);
        self.0.spawn_background(async move {
            let result = match run_build(board, gate, &job).await {
                Ok(artifact) => match env.upgrade() {
                    Some(env) => Ok(record_build(&env, job, artifact)),
                    None => return,
                },
                Err(e) => Err(e.to_string()),
            };
            publish.send_replace(Some(result));
        });
        let summary = json!({
            "artifact": id,
            "background": true,
            "kernel_dir": shown,
        });
        Ok(ToolOutput::text(format!(
            "building {shown} in the background as artifact {id}: call wait_build with artifact {id} before running it"
        ))
        .with_data(summary))
    }
}

// --------------------------------------------------------------- wait_build

/// What wait_build adds when the slice sat idle until the build finished.
pub const SLICE_IDLE_NOTE: &str =
    "the slice was idle until this build finished: start builds earlier";

/// Arguments of wait_build.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitBuildArgs {
    /// Artifact id returned by a background compile.
    pub artifact: String,
    /// Give up waiting after this many seconds (default 120; the build
    /// goes on).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

const WAIT_BUILD_SHAPE: Shape = Shape {
    integers: &[],
    numbers: &["timeout_seconds"],
    bools: &[],
    lists: &[],
    maps: &[],
    aliases: &[
        ("artifact_id", "artifact"),
        ("build", "artifact"),
        ("timeout", "timeout_seconds"),
    ],
};

/// Wait for a background build and report it as compile would have.
pub struct WaitBuild(pub(crate) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for WaitBuild {
    tool_basics!(
        "wait_build",
        "Wait for a build started with compile(background=true) and report it exactly as compile would (artifact id, or the compiler's errors). Runs on the host CPU; never takes the slice.",
        WaitBuildArgs,
        Risk::Low,
        true,
        true,
        WAIT_BUILD_SHAPE
    );

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: WaitBuildArgs = parse_args(args)?;
        let id = args.artifact.trim().to_owned();
        let timeout = timeout_of(args.timeout_seconds)?;
        let watch = {
            let session = self.0.session();
            match session.background_builds.get(&id) {
                Some(watch) => watch.clone(),
                None => {
                    let known: Vec<&str> = session
                        .background_builds
                        .keys()
                        .map(String::as_str)
                        .collect();
                    return Err(ToolError::InvalidArgs(format!(
                        "unknown artifact `{id}`: no background build of that id (background builds: {})",
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    )));
                }
            }
        };
        let mut watch = watch;
        let finished_already = watch.borrow().is_some();
        ctx.progress(format!("waiting for the build of {id}"), None);
        let finished = tokio::time::timeout(timeout, watch.wait_for(Option::is_some))
            .await
            .map_err(|_| ToolError::Timeout(timeout))?
            .map_err(|_| {
                ToolError::Failed(format!(
                    "the background build of `{id}` was abandoned (the session's tools were shut down)"
                ))
            })?
            .clone();
        // A build that finishes while nobody holds the slice kept the slice
        // waiting: say so, so the caller keeps more builds ahead.
        let slice_idle = !finished_already
            && self
                .0
                .lock
                .stats(&self.0.slice_id())
                .is_none_or(|stats| !stats.held);
        match finished {
            Some(Ok(mut report)) => {
                if slice_idle {
                    report.text.push_str(&format!("\n{SLICE_IDLE_NOTE}"));
                    report.summary["slice_idle"] = json!(true);
                }
                Ok(build_output(report))
            }
            Some(Err(error)) => Err(ToolError::Failed(error)),
            None => Err(ToolError::Failed(format!(
                "the background build of `{id}` reported nothing"
            ))),
        }
    }
}

// ---------------------------------------------------------------------- run

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
    bools: &[],
    lists: &["args"],
    maps: &[],
    aliases: &[
        ("artifact_id", "artifact"),
        ("build", "artifact"),
        ("timeout", "timeout_seconds"),
        ("repeats", "runs"),
    ],
};

async fn launch(
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
    };
    let outcome = env.board.run(&built.artifact, &request).await;
    Ok((built, request, outcome))
}

/// Launch an artifact once on the slice.
pub struct Run(pub(crate) Arc<ToolEnv>);

macro_rules! hardware_flags {
    () => {
        fn needs_hardware(&self) -> bool {
            true
        }
        fn resource(&self) -> Option<String> {
            Some(self.0.slice_id())
        }
    };
}

#[async_trait::async_trait]
impl Tool for Run {
    tool_basics!(
        "run",
        "Launch a compiled artifact on this slice (holds the slice) and report validity, time, GFLOPS and output. Use validate or benchmark for evidence.",
        RunArgs,
        Risk::Medium,
        false,
        true,
        RUN_SHAPE
    );
    hardware_flags!();

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

// ----------------------------------------------------------------- validate

/// Check an artifact's output against the reference.
pub struct Validate(pub(crate) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for Validate {
    tool_basics!(
        "validate",
        "Run a compiled artifact on this slice and check every execution's output against the reference (default 2 executions). Records validation evidence.",
        RunArgs,
        Risk::Medium,
        false,
        true,
        RUN_SHAPE
    );
    hardware_flags!();

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

// ---------------------------------------------------------------- benchmark

/// Arguments of benchmark.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchmarkArgs {
    /// Artifact id from compile (default: the latest).
    #[serde(default)]
    pub artifact: Option<String>,
    /// DSP cores (default: all cores of the slice).
    #[serde(default)]
    pub cores: Option<u32>,
    /// Untimed, validated executions before timing.
    #[serde(default)]
    pub warmup: Option<u32>,
    /// Minimum timed executions.
    #[serde(default)]
    pub repeats: Option<u32>,
    /// Minimum total timed kernel seconds (real-timing backends).
    #[serde(default)]
    pub min_seconds: Option<f64>,
    /// Reference time for the plausibility check (default: the session's
    /// first valid benchmark).
    #[serde(default)]
    pub baseline_seconds: Option<f64>,
    /// Per-launch time-out (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

const BENCHMARK_SHAPE: Shape = Shape {
    integers: &["cores", "warmup", "repeats"],
    numbers: &["min_seconds", "baseline_seconds", "timeout_seconds"],
    bools: &[],
    lists: &[],
    maps: &[],
    aliases: &[
        ("artifact_id", "artifact"),
        ("build", "artifact"),
        ("runs", "repeats"),
        ("timeout", "timeout_seconds"),
    ],
};

fn measurement_summary(artifact: &str, m: &Measurement) -> Value {
    json!({
        "artifact": artifact,
        "kernel_hash": m.kernel_hash,
        "defines": m.defines,
        "slice": m.slice,
        "backend": m.backend,
        "toolchain": m.toolchain,
        "cores": m.cores,
        "valid": m.valid,
        "error": m.error,
        "median_seconds": m.stats.as_ref().map(|s| s.median),
        "trimmed_mean_seconds": m.stats.as_ref().map(|s| s.trimmed_mean),
        "count": m.stats.as_ref().map(|s| s.count),
        "gflops": m.gflops,
        "peak_fraction": m.peak_fraction,
        "speedup_over_baseline": m.speedup_over_baseline,
        "flags": m.flags,
    })
}

/// Measure an artifact: validate, warm up, time, re-check.
pub struct Benchmark(pub(crate) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for Benchmark {
    tool_basics!(
        "benchmark",
        "Benchmark a compiled artifact on this slice: a validation run first (a wrong answer gets no figure), warm-up, repeated timed runs each re-checked, median and trimmed mean, implausible speedups flagged. Records benchmark evidence and updates the candidates.",
        BenchmarkArgs,
        Risk::Medium,
        false,
        true,
        BENCHMARK_SHAPE
    );
    hardware_flags!();

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: BenchmarkArgs = parse_args(args)?;
        let (built, baseline) = {
            let session = self.0.session();
            (
                session.artifact(args.artifact.as_deref())?,
                session.baseline_seconds,
            )
        };
        let mut config: MeasureConfig = self.0.measure_defaults.clone();
        config.cores = cores_of(&self.0, args.cores)?;
        if let Some(w) = args.warmup {
            config.warmup = w.min(1000);
        }
        if let Some(r) = args.repeats {
            if r == 0 || r > 10_000 {
                return Err(ToolError::InvalidArgs(format!(
                    "repeats must be in 1..=10000, got {r}"
                )));
            }
            config.min_repeats = r;
            config.min_repeats_deterministic = r;
            config.max_repeats = config.max_repeats.max(r);
        }
        if let Some(s) = args.min_seconds {
            if !(s.is_finite() && (0.0..=600.0).contains(&s)) {
                return Err(ToolError::InvalidArgs(format!(
                    "min_seconds must be in 0..=600, got {s}"
                )));
            }
            config.min_seconds = s;
        }
        if args.timeout_seconds.is_some() {
            config.launch_timeout = timeout_of(args.timeout_seconds)?;
        }
        config.baseline_seconds = args
            .baseline_seconds
            .or(config.baseline_seconds)
            .or(baseline);
        ctx.progress(format!("benchmarking artifact {}", built.id), None);
        // Host timing shares the CPU with the compiler: never time while
        // this session compiles.
        let _no_compiles = if self.0.board.backend() == BackendKind::Host {
            Some(self.0.compile_gate.write().await)
        } else {
            None
        };
        let measured = measure(
            self.0.board.as_ref(),
            &built.artifact,
            &self.0.spec,
            &config,
        )
        .await;
        let m = match measured {
            Ok(m) => m,
            Err(e) if kernel_fault(&e) => {
                let summary = json!({
                    "artifact": built.id, "kernel_hash": built.artifact.kernel_hash,
                    "defines": built.artifact.defines, "valid": false, "error": e.to_string(),
                });
                return Ok(ToolOutput::text(format!(
                    "benchmark FAILED for artifact {}: {e}",
                    built.id
                ))
                .with_data(summary.clone())
                .with_effect(Effect::Evidence {
                    kind: "benchmark".into(),
                    passed: false,
                    summary: summary.clone(),
                })
                .with_effect(Effect::State {
                    key: "benchmark_results".into(),
                    value: summary,
                    append: true,
                }));
            }
            Err(e) => return Err(hw_error(e)),
        };
        let summary = measurement_summary(&built.id, &m);
        let passed = m.trustworthy();
        let text = match (&m.stats, passed) {
            (Some(s), _) => {
                let mut t = format!(
                    "artifact {} on {} cores: median {:.4e} s, trimmed mean {:.4e} s over {} runs (min {:.4e}, max {:.4e})",
                    built.id, m.cores, s.median, s.trimmed_mean, s.count, s.min, s.max
                );
                if let Some(g) = m.gflops {
                    t.push_str(&format!(", {g:.2} GFLOPS"));
                }
                if let Some(p) = m.peak_fraction {
                    t.push_str(&format!(" ({:.1}% of peak)", p * 100.0));
                }
                if let Some(x) = m.speedup_over_baseline {
                    t.push_str(&format!(", {x:.2}x over baseline"));
                }
                for f in &m.flags {
                    t.push_str(&format!("\nFLAG: {f}"));
                }
                t
            }
            (None, _) => format!(
                "benchmark FAILED for artifact {}: {} (no timing reported for a wrong result)",
                built.id,
                m.error.clone().unwrap_or_else(|| "invalid".into())
            ),
        };
        let mut out = ToolOutput::text(text)
            .with_data(json!({"summary": summary, "measurement": m}))
            .with_effect(Effect::Evidence {
                kind: "benchmark".into(),
                passed,
                summary: summary.clone(),
            })
            .with_effect(Effect::State {
                key: "benchmark_results".into(),
                value: summary,
                append: true,
            });
        if passed {
            let candidates = self.0.session().add_candidate(&built.id, &m);
            let shown: Vec<_> = candidates.iter().take(CANDIDATES_SHOWN).collect();
            out = out.with_effect(Effect::State {
                key: "current_candidates".into(),
                value: serde_json::to_value(&shown).unwrap_or(Value::Null),
                append: false,
            });
            if let Some(best) = candidates.first() {
                out = out.with_effect(Effect::State {
                    key: "best".into(),
                    value: serde_json::to_value(best).unwrap_or(Value::Null),
                    append: false,
                });
            }
        }
        Ok(out)
    }
}

// --------------------------------------------------------------- board_info

/// Arguments of board_info (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardInfoArgs {}

const NO_SHAPE: Shape = Shape {
    integers: &[],
    numbers: &[],
    bools: &[],
    lists: &[],
    maps: &[],
    aliases: &[],
};

/// The slice, its chip and its lock statistics.
pub struct BoardInfo(pub(crate) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for BoardInfo {
    tool_basics!(
        "board_info",
        "Describe this session's slice: backend, cores, chip spec (peak, memory sizes, bandwidth), slice lock statistics, compiled artifacts and best candidates.",
        BoardInfoArgs,
        Risk::Low,
        true,
        true,
        NO_SHAPE
    );

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let _args: BoardInfoArgs = parse_args(args)?;
        let slice = self.0.board.slice().clone();
        let spec = &self.0.spec;
        let lock = self.0.lock.stats(&slice.id());
        let (artifacts, artifacts_total, candidates): (Vec<String>, usize, Vec<Value>) = {
            let session = self.0.session();
            (
                newest_artifacts(session.artifacts.keys(), ARTIFACTS_SHOWN),
                session.artifacts.len(),
                session
                    .candidates
                    .iter()
                    .take(CANDIDATES_SHOWN)
                    .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
                    .collect(),
            )
        };
        let peak = spec.peak_flops(slice.cores);
        let mut text = format!(
            "slice {} ({} backend, {} cores): {} at {:.2} GHz, peak {:.1} GFLOPS for these cores; per core AM {} KiB (max {} buffers), SM {} KiB (max {} buffers); GSM {} KiB per cluster; DDR bandwidth {:.1} GB/s per cluster",
            slice.id(),
            slice.backend,
            slice.cores,
            spec.name,
            spec.clock_hz / 1e9,
            peak / 1e9,
            spec.am_bytes / 1024,
            spec.am_max_buffers,
            spec.sm_bytes / 1024,
            spec.sm_max_buffers,
            spec.gsm_bytes / 1024,
            spec.cluster_bandwidth() / 1e9,
        );
        match &lock {
            Some(s) => text.push_str(&format!(
                "\nslice lock: {} acquisitions, busy {:.3} s ({:.1}% utilization), mean wait {:.3} s, {} waiting",
                s.acquisitions,
                s.busy.as_secs_f64(),
                s.utilization() * 100.0,
                s.mean_wait().as_secs_f64(),
                s.waiting
            )),
            None => text.push_str("\nslice lock: not used yet"),
        }
        text.push_str(&match artifacts_total {
            0 => "\nartifacts: none".to_string(),
            n if n == artifacts.len() => format!("\nartifacts: {}", artifacts.join(", ")),
            n => format!(
                "\nartifacts: {n}, the {} newest: {} (older ones stay usable by id)",
                artifacts.len(),
                artifacts.join(", ")
            ),
        });
        Ok(ToolOutput::text(text).with_data(json!({
            "slice": slice,
            "slice_id": slice.id(),
            "spec": spec,
            "peak_gflops": peak / 1e9,
            "lock": lock,
            "artifacts": artifacts,
            "artifacts_total": artifacts_total,
            "candidates": candidates,
        })))
    }
}

/// The `limit` newest of build ids `b1`, `b2`, ... in build order (ids that
/// do not parse sort first, as the oldest).
fn newest_artifacts<'a>(ids: impl Iterator<Item = &'a String>, limit: usize) -> Vec<String> {
    let mut ids: Vec<(u64, &String)> = ids
        .map(|id| {
            (
                id.strip_prefix('b')
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
                id,
            )
        })
        .collect();
    ids.sort();
    let skip = ids.len().saturating_sub(limit);
    ids.into_iter()
        .skip(skip)
        .map(|(_, id)| id.clone())
        .collect()
}

#[cfg(test)]
mod board_info_tests {
    use super::newest_artifacts;

    #[test]
    fn only_the_newest_artifacts_are_listed_in_build_order() {
        let ids: Vec<String> = (1..=40).map(|n| format!("b{n}")).collect();
        let shown = newest_artifacts(ids.iter(), 12);
        assert_eq!(shown.len(), 12);
        assert_eq!(shown.first().map(String::as_str), Some("b29"));
        assert_eq!(shown.last().map(String::as_str), Some("b40"));
        let few: Vec<String> = ["b2", "b10", "b1"].iter().map(|s| s.to_string()).collect();
        assert_eq!(newest_artifacts(few.iter(), 12), ["b1", "b2", "b10"]);
    }
}
