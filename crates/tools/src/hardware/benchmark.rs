//! benchmark: measures an artifact on the slice and records the candidate.

use std::sync::Arc;

use mtswarm_core::{
    Effect, EffectKind, Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of,
};
use mtswarm_hw::measure::{MeasureConfig, Measurement, measure};
use mtswarm_hw::{BackendKind, HwError};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::{BuiltArtifact, ToolEnv, parse_args};
use crate::normalize::Shape;
use crate::source_diff::SourceDiff;

use super::{CANDIDATES_SHOWN, cores_of, hw_error, kernel_fault, timeout_of};

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
    /// Minimum timed executions. On a backend with exact timing (the
    /// emulator) one validated execution is the figure and `repeats` above 1
    /// asks for a spot re-run with the same inputs, which must reproduce it
    /// (a figure that would be the session's best always gets one).
    #[serde(default)]
    pub repeats: Option<u32>,
    /// Minimum total timed kernel seconds (real-timing backends).
    #[serde(default)]
    pub min_seconds: Option<f64>,
    /// Per-launch time-out (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

const BENCHMARK_SHAPE: Shape = Shape {
    integers: &["cores", "warmup", "repeats"],
    numbers: &["min_seconds", "timeout_seconds"],
    aliases: &[
        ("artifact_id", "artifact"),
        ("build", "artifact"),
        ("runs", "repeats"),
        ("timeout", "timeout_seconds"),
    ],
    // What compile and run take, copied from their calls.
    //
    // `baseline_seconds` too: the plausibility check's reference is the
    // session's own first valid benchmark (or the job's measured
    // baseline), never a figure a model writes, which could flag an
    // honest measurement or clear an implausible one.
    ignored: &[
        "defines",
        "kernel_dir",
        "background",
        "unchecked",
        "args",
        "baseline_seconds",
    ],
    ..Shape::NONE
};

fn measurement_summary(artifact: &str, m: &Measurement, source: &SourceDiff) -> Value {
    let mut summary = json!({
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
        "exact": m.exact,
        "spot_checked": m.spot_checked,
    });
    if source.edited {
        summary["source_edited"] = json!(true);
        summary["source_changes"] = json!(source.stat());
    }
    summary
}

/// What the benchmark's data says about the source: the candidate's record
/// keeps the diff (the summary, which the working state keeps, only the stat).
fn source_data(source: &SourceDiff) -> Value {
    json!({
        "edited": source.edited,
        "diff": source.diff,
        "truncated": source.truncated,
        "files": source.files,
    })
}

/// Measure an artifact: validate, warm up, time, re-check.
pub struct Benchmark(pub(crate) Arc<ToolEnv>);

/// What `benchmark` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "benchmark",
    "Benchmark a compiled artifact (an id from compile) on this slice: a validation run first (a wrong answer gets no figure), then timed runs each re-checked (median, trimmed mean; implausible speedups flagged). With exact timing (the emulator's modeled cycles) one validated execution is the figure, re-checked by spot re-runs. Records benchmark evidence and updates the candidates.",
    schema_of::<BenchmarkArgs>,
)
.risk(Risk::Medium)
.writes()
.concurrent()
.hardware()
.effects(&[EffectKind::Evidence, EffectKind::State]);

#[async_trait::async_trait]
impl Tool for Benchmark {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn resource(&self) -> Option<String> {
        Some(self.0.slice_id())
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &BENCHMARK_SHAPE)
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: BenchmarkArgs = parse_args(args)?;
        let (built, config) = measure_config(&self.0, &args)?;
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
        match measured {
            Ok(m) => Ok(measured_output(&self.0, &built, &m)),
            Err(e) if kernel_fault(&e) => Ok(kernel_fault_output(&built, &e)),
            Err(e) => Err(hw_error(e)),
        }
    }
}

/// The artifact to measure and how: the session's defaults, the arguments
/// over them, the session's best and baseline.
fn measure_config(
    env: &ToolEnv,
    args: &BenchmarkArgs,
) -> Result<(BuiltArtifact, MeasureConfig), ToolError> {
    let mut config: MeasureConfig = env.measure_defaults.clone();
    config.cores = cores_of(env, args.cores)?;
    let (built, baseline) = {
        let session = env.session();
        // Exact timing: a figure that would be the session's best (the
        // first one is) is always reproduced by a spot re-run, so no
        // best stands on one unchecked execution.
        config.spot_check_at_or_below =
            Some(session.best_seconds(config.cores).unwrap_or(f64::INFINITY));
        (
            session.artifact(args.artifact.as_deref())?,
            session.baseline_seconds,
        )
    };
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
        // Exact timing: more than one execution asks for the check
        // that a repeat gives the same figure.
        config.spot_check |= r > 1;
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
    config.baseline_seconds = config.baseline_seconds.or(baseline);
    Ok((built, config))
}

/// A measurement the kernel itself stopped (it exceeded the chip's
/// capacity or its time): a failed benchmark, recorded as such.
fn kernel_fault_output(built: &BuiltArtifact, e: &HwError) -> ToolOutput {
    let summary = json!({
        "artifact": built.id, "kernel_hash": built.artifact.kernel_hash,
        "defines": built.artifact.defines, "valid": false, "error": e.to_string(),
        "source_edited": built.source.edited,
    });
    let mut data = summary.clone();
    data["source"] = source_data(&built.source);
    ToolOutput::text(format!("benchmark FAILED for artifact {}: {e}", built.id))
        .with_data(data)
        .with_effect(Effect::Evidence {
            kind: "benchmark".into(),
            passed: false,
            summary: summary.clone(),
        })
        .with_effect(Effect::State {
            key: "benchmark_results".into(),
            value: summary,
            append: true,
        })
}

/// A measurement's output: its text, data and evidence and, when it can be
/// trusted, the session's candidates and best updated.
fn measured_output(env: &ToolEnv, built: &BuiltArtifact, m: &Measurement) -> ToolOutput {
    let summary = measurement_summary(&built.id, m, &built.source);
    let passed = m.trustworthy();
    let mut out = ToolOutput::text(measurement_text(built, m))
        .with_data(json!({"summary": summary, "measurement": m,
                          "source": source_data(&built.source)}))
        // A measurement starts with a validation launch and re-checks
        // every execution: it is validation evidence as well (with
        // exact timing it is the only check a screened candidate gets).
        .with_effect(Effect::Evidence {
            kind: "validate".into(),
            passed: m.valid,
            summary: summary.clone(),
        })
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
        let candidates = env.session().add_candidate(&built.id, m);
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
    // The step after a measurement: the task's next candidate, or the answer.
    out.content = format!("{}\n{}", out.content, env.session().next_candidate_hint());
    out
}

/// What the model reads of a measurement: the figures with what qualifies
/// them, or why there are none.
fn measurement_text(built: &BuiltArtifact, m: &Measurement) -> String {
    let Some(s) = &m.stats else {
        return format!(
            "benchmark FAILED for artifact {}: {} (no timing reported for a wrong result)",
            built.id,
            m.error.clone().unwrap_or_else(|| "invalid".into())
        );
    };
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
    if built.source.edited {
        t.push_str(&format!(
            "; built from edited sources ({})",
            built.source.stat()
        ));
    }
    if m.exact {
        t.push_str(if m.spot_checked {
            "; exact modeled time, reproduced by a spot re-run"
        } else {
            "; exact modeled time of the validated launch"
        });
    }
    for f in &m.flags {
        t.push_str(&format!("\nFLAG: {f}"));
    }
    t
}
