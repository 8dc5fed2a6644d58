//! Turning launches into a benchmark figure that can be trusted.
//!
//! Backends launch; this module decides what a measurement is, the same way
//! for every backend: a validation launch first (a wrong answer gets no
//! timing at all), warm-up executions, then timed executions until both a
//! minimum count and a minimum total time are reached, every one of them
//! re-validated (a kernel that is right once and wrong later is invalid).
//! Statistics are robust (median, and the mean with min and max dropped) and
//! the raw samples are kept.
//!
//! On a backend whose timing is *exact* (the emulator: modeled cycles are a
//! function of the code and its inputs) repeating an execution only repeats
//! the figure, so one validated execution is the measurement and spot
//! re-runs, always for a figure that would be a best, check that it is
//! reproducible and stays right on other inputs (see [`exact`]). Figures
//! that beat the chip's modeled peak, or a baseline by an implausible
//! factor, are flagged. Every result names the
//! slice, backend, toolchain and kernel hash it belongs to.
//!
//! Callers hold the slice lock around [`measure`]; compiling happens before,
//! never while timing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::board::{Artifact, BackendKind, Board, RunOutcome, RunRequest, RunSample};
use crate::error::HwError;
use crate::spec::ChipSpec;

mod exact;

pub use exact::exact_timing;

/// How to measure. Defaults follow the published methodology (warm-up, then
/// at least 10 timed runs, drop min and max).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MeasureConfig {
    /// DSP cores to run on.
    pub cores: u32,
    /// Untimed executions after the validation launch (still validated).
    pub warmup: u32,
    /// Minimum timed executions on backends with real timing.
    pub min_repeats: u32,
    /// Minimum timed executions on deterministic modeled backends (>= 2 is
    /// enforced: one repeat cannot catch a kernel that goes wrong later).
    pub min_repeats_deterministic: u32,
    /// Stop adding executions once this many are timed, even if
    /// `min_seconds` is not reached.
    pub max_repeats: u32,
    /// Minimum total kernel time of the timed executions (real timing only).
    pub min_seconds: f64,
    /// Executions per launch for the timed phase (real timing; modeled
    /// backends run exactly the executions they still need).
    pub runs_per_launch: u32,
    /// Per-launch time-out, counted from process start.
    pub launch_timeout: Duration,
    /// Extra harness arguments.
    pub args: Vec<String>,
    /// Treat the backend as deterministic (modeled timing). `None`: the
    /// emulator and the simulated backend are, the others are not.
    pub deterministic: Option<bool>,
    /// Time of a reference version of the same kernel, seconds.
    pub baseline_seconds: Option<f64>,
    /// A speedup over `baseline_seconds` above this is flagged.
    pub max_plausible_speedup: f64,
    /// Tolerance over the modeled peak before a figure is flagged
    /// (0.05 = 5 % above peak).
    pub peak_tolerance: f64,
    /// Measure with one validated execution (see [`exact`]). `None`: on
    /// backends whose timing is exact ([`exact_timing`]: the emulator).
    pub exact: Option<bool>,
    /// Exact measurements: about one in this many, drawn at random (the
    /// kernel cannot tell which), gets a spot re-run with the same inputs;
    /// 0 = none unless `spot_check` asks.
    pub spot_check_every: u32,
    /// Exact measurements: always spot re-run (e.g. to confirm a best).
    pub spot_check: bool,
    /// Exact measurements: a figure at or below this many seconds gets a
    /// spot re-run (the caller's best so far, so that no figure becomes a
    /// best unreproduced).
    pub spot_check_at_or_below: Option<f64>,
}

impl Default for MeasureConfig {
    fn default() -> Self {
        Self {
            cores: 1,
            warmup: 2,
            min_repeats: 10,
            min_repeats_deterministic: 2,
            max_repeats: 200,
            min_seconds: 0.2,
            runs_per_launch: 10,
            launch_timeout: Duration::from_secs(120),
            args: Vec::new(),
            deterministic: None,
            baseline_seconds: None,
            max_plausible_speedup: 100.0,
            peak_tolerance: 0.05,
            exact: None,
            spot_check_every: exact::DEFAULT_SPOT_CHECK_EVERY,
            spot_check: false,
            spot_check_at_or_below: None,
        }
    }
}

/// Robust statistics of the timed executions, seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Timed executions the statistics cover.
    pub count: usize,
    /// Median time: GFLOPS, the peak fraction and the speedup derive from it.
    pub median: f64,
    /// Mean after dropping the single smallest and largest sample (plain
    /// mean below 3 samples).
    pub trimmed_mean: f64,
    /// Fastest timed execution.
    pub min: f64,
    /// Slowest timed execution.
    pub max: f64,
    /// Population standard deviation of all timed executions.
    pub stddev: f64,
}

impl Stats {
    /// Statistics of `samples`; `None` when empty or non-finite values occur.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let trimmed: &[f64] = if n >= 3 { &sorted[1..n - 1] } else { &sorted };
        let trimmed_mean = trimmed.iter().sum::<f64>() / trimmed.len() as f64;
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let variance = sorted.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n as f64;
        Some(Self {
            count: n,
            median,
            trimmed_mean,
            min: sorted[0],
            max: sorted[n - 1],
            stddev: variance.sqrt(),
        })
    }
}

/// One benchmark result. `stats`/`gflops` are present only when `valid`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Id of the slice measured on.
    pub slice: String,
    /// Backend of that slice.
    pub backend: BackendKind,
    /// The artifact's compiler identity and flags.
    pub toolchain: String,
    /// The artifact's kernel hash: which code was measured.
    pub kernel_hash: String,
    /// The `-D` defines the artifact was built with.
    pub defines: std::collections::BTreeMap<String, String>,
    /// DSP cores every launch used.
    pub cores: u32,
    /// Every execution (validation, warm-up and timed) produced the right answer.
    pub valid: bool,
    /// Why the result is invalid.
    pub error: Option<String>,
    /// The validation launch failed: nothing was timed.
    pub failed_validation: bool,
    /// Statistics of the timed executions' times (`None` unless valid).
    pub stats: Option<Stats>,
    /// Floating-point operations of one execution, as the harness reports.
    pub flops: Option<u64>,
    /// From the median time.
    pub gflops: Option<f64>,
    /// Of the modeled peak of the cores used (0..1, more is suspicious).
    pub peak_fraction: Option<f64>,
    /// Baseline time over the median (`None` without `baseline_seconds`).
    pub speedup_over_baseline: Option<f64>,
    /// Reasons the figure is not believable (empty = plausible).
    pub flags: Vec<String>,
    /// The backend was treated as deterministic (modeled timing): fewer
    /// repeats, no minimum total time.
    pub deterministic: bool,
    /// Timed executions, in order, kept raw.
    pub samples: Vec<RunSample>,
    /// Harness launches made (validation, warm-up and timed).
    pub launches: u32,
    /// Wall time of all launches of this measurement.
    pub wall_seconds: f64,
    /// Seconds since the Unix epoch when the measurement finished.
    pub finished_at: u64,
    /// Harness provenance: file -> sha256 of the harness that judged it.
    #[serde(default)]
    pub harness: std::collections::BTreeMap<String, String>,
    /// Exact timing: one validated execution is the figure (no warm-up, no
    /// repeats; see [`exact`]).
    #[serde(default)]
    pub exact: bool,
    /// Exact timing: a spot re-run with the same inputs reproduced the
    /// modeled cycles (a mismatch is a flag instead).
    #[serde(default)]
    pub spot_checked: bool,
}

impl Measurement {
    /// Valid and not flagged: a figure fit to report.
    pub fn trustworthy(&self) -> bool {
        self.valid && self.flags.is_empty() && self.stats.is_some()
    }
}

/// The samples of one launch (a backend that reports no per-execution
/// samples counts as one execution with the launch's figures).
pub(super) fn samples_of(outcome: &RunOutcome) -> Vec<RunSample> {
    if outcome.samples.is_empty() {
        vec![RunSample {
            valid: outcome.valid,
            error: outcome.error.clone(),
            modeled_cycles: outcome.modeled_cycles,
            seconds: outcome.seconds,
            max_abs_err: outcome.max_abs_err,
            counters: outcome.counters,
            seed: None,
            useful_flops: 0,
        }]
    } else {
        outcome.samples.clone()
    }
}

/// The first reason a launch is wrong, if it is.
pub(super) fn launch_error(
    outcome: &RunOutcome,
    samples: &[RunSample],
    first_index: usize,
) -> Option<String> {
    if let Some((i, s)) = samples.iter().enumerate().find(|(_, s)| !s.valid) {
        return Some(format!(
            "execution {}: {}",
            first_index + i + 1,
            s.error
                .clone()
                .unwrap_or_else(|| "output differs from the reference".into())
        ));
    }
    if !outcome.valid {
        return Some(
            outcome
                .error
                .clone()
                .unwrap_or_else(|| "the launch reported invalid output".into()),
        );
    }
    None
}

/// A backend's plausibility flags (see [`crate::plausibility`]) become the
/// measurement's: a flagged figure is never trustworthy.
pub(super) fn note_flags(result: &mut Measurement, outcome: &RunOutcome) {
    for flag in &outcome.flags {
        let text = flag.describe().to_owned();
        if !result.flags.contains(&text) {
            result.flags.push(text);
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Measure `artifact` on `board`. The caller holds the slice lock. Launch
/// failures (process could not start, time-out) are errors; wrong answers
/// are an invalid [`Measurement`] without figures.
pub async fn measure(
    board: &dyn Board,
    artifact: &Artifact,
    spec: &ChipSpec,
    config: &MeasureConfig,
) -> Result<Measurement, HwError> {
    if config.cores == 0 {
        return Err(HwError::Config("measure: cores must be at least 1".into()));
    }
    let deterministic = config.deterministic.unwrap_or(matches!(
        board.backend(),
        BackendKind::Emulator | BackendKind::Simulated
    ));
    let wall_start = std::time::Instant::now();
    let mut result = Measurement::unmeasured(board, artifact, config, deterministic);
    let exact = config
        .exact
        .unwrap_or_else(|| exact_timing(board.backend()));
    let outcome = if exact {
        exact::measure_exact(board, artifact, config, &mut result).await?
    } else {
        measure_repeated(board, artifact, config, deterministic, &mut result).await?
    };
    // A measurement stopped by a wrong launch has no figures.
    if result.error.is_none() {
        conclude(&mut result, &outcome, spec, config);
    }
    result.wall_seconds = wall_start.elapsed().as_secs_f64();
    result.finished_at = unix_now();
    Ok(result)
}

impl Measurement {
    /// A measurement of `artifact` on `board` before any launch.
    fn unmeasured(
        board: &dyn Board,
        artifact: &Artifact,
        config: &MeasureConfig,
        deterministic: bool,
    ) -> Self {
        Self {
            slice: board.slice().id(),
            backend: board.backend(),
            toolchain: artifact.toolchain.clone(),
            kernel_hash: artifact.kernel_hash.clone(),
            defines: artifact.defines.clone(),
            cores: config.cores,
            valid: false,
            error: None,
            failed_validation: false,
            stats: None,
            flops: None,
            gflops: None,
            peak_fraction: None,
            speedup_over_baseline: None,
            flags: Vec::new(),
            deterministic,
            samples: Vec::new(),
            launches: 0,
            wall_seconds: 0.0,
            finished_at: 0,
            harness: artifact.harness.clone(),
            exact: false,
            spot_checked: false,
        }
    }
}

/// One launch of `runs` executions (at least one), counted, its flags
/// noted; its outcome and samples.
async fn launch(
    board: &dyn Board,
    artifact: &Artifact,
    config: &MeasureConfig,
    runs: u32,
    result: &mut Measurement,
) -> Result<(RunOutcome, Vec<RunSample>), HwError> {
    let request = RunRequest {
        cores: config.cores,
        runs: runs.max(1),
        timeout: config.launch_timeout,
        args: config.args.clone(),
        seed: None,
    };
    let outcome = board.run(artifact, &request).await?;
    result.launches += 1;
    let samples = samples_of(&outcome);
    note_flags(result, &outcome);
    Ok((outcome, samples))
}

/// The measurement of a backend whose timing varies: validation, warm-up,
/// then timed executions. Stops at the first wrong launch, its reason in
/// `result.error`. Returns the validation launch's outcome (whose counters
/// stand in for samples without any).
async fn measure_repeated(
    board: &dyn Board,
    artifact: &Artifact,
    config: &MeasureConfig,
    deterministic: bool,
    result: &mut Measurement,
) -> Result<RunOutcome, HwError> {
    // 1. Validation: one execution, checked before anything is timed.
    let (outcome, samples) = launch(board, artifact, config, 1, result).await?;
    if let Some(reason) = launch_error(&outcome, &samples, 0) {
        result.failed_validation = true;
        result.error = Some(format!("validation failed: {reason}"));
        return Ok(outcome);
    }
    // 2. Warm-up: untimed but validated.
    if config.warmup > 0 {
        let (warm_up, samples) = launch(board, artifact, config, config.warmup, result).await?;
        if let Some(reason) = launch_error(&warm_up, &samples, 0) {
            result.error = Some(format!("warm-up {reason}"));
            return Ok(outcome);
        }
    }
    // 3. Timed executions, each re-validated.
    timed_executions(board, artifact, config, deterministic, result).await?;
    Ok(outcome)
}

/// Timed executions until both the minimum count and the minimum total time
/// are reached (at most `max_repeats`), each re-validated; a wrong one stops
/// them, its reason in `result.error`.
async fn timed_executions(
    board: &dyn Board,
    artifact: &Artifact,
    config: &MeasureConfig,
    deterministic: bool,
    result: &mut Measurement,
) -> Result<(), HwError> {
    let min_count = if deterministic {
        config.min_repeats_deterministic.max(2)
    } else {
        config.min_repeats.max(2)
    } as usize;
    let max_count = (config.max_repeats as usize).max(min_count);
    let min_seconds = if deterministic {
        0.0
    } else {
        config.min_seconds
    };
    let mut total_seconds = 0.0;
    while result.samples.len() < min_count
        || (total_seconds < min_seconds && result.samples.len() < max_count)
    {
        // Modeled time does not vary: take exactly the executions needed.
        let wanted = if deterministic {
            min_count.saturating_sub(result.samples.len())
        } else {
            config.runs_per_launch as usize
        };
        let batch = wanted
            .min(max_count.saturating_sub(result.samples.len()))
            .max(1);
        let runs = u32::try_from(batch).unwrap_or(u32::MAX);
        let (outcome, samples) = launch(board, artifact, config, runs, result).await?;
        let first_index = result.samples.len();
        let error = launch_error(&outcome, &samples, first_index);
        total_seconds += samples.iter().map(|s| s.seconds).sum::<f64>();
        let produced = samples.len();
        result.samples.extend(samples);
        if let Some(reason) = error {
            result.error = Some(format!("timed {reason}"));
            return Ok(());
        }
        if produced == 0 {
            result.error = Some("a timed launch produced no executions".into());
            return Ok(());
        }
    }
    Ok(())
}

/// Statistics of the timed samples and the plausibility flags, on any path;
/// `outcome` is the last launch (its counters stand in for samples without
/// any).
fn conclude(
    result: &mut Measurement,
    outcome: &RunOutcome,
    spec: &ChipSpec,
    config: &MeasureConfig,
) {
    let seconds: Vec<f64> = result.samples.iter().map(|s| s.seconds).collect();
    let Some(stats) = Stats::of(&seconds) else {
        result.error = Some("timed executions reported no usable time".into());
        return;
    };
    result.valid = true;
    if stats.median <= 0.0 {
        result.flags.push(format!(
            "median time {} s is not positive: the timer did not measure the kernel",
            stats.median
        ));
    }
    // The useful work (model or harness), never the executed flops: code
    // padded with useless arithmetic must not raise its own figure.
    let flops = result
        .samples
        .iter()
        .map(|s| s.useful_flops)
        .find(|f| *f > 0)
        .or_else(|| {
            result
                .samples
                .iter()
                .map(|s| s.counters.flops)
                .find(|f| *f > 0)
        })
        .or((outcome.counters.flops > 0).then_some(outcome.counters.flops));
    result.flops = flops;
    if let Some(flops) = flops
        && stats.median > 0.0
    {
        let rate = flops as f64 / stats.median;
        let peak = spec.peak_flops(config.cores);
        result.gflops = Some(rate / 1e9);
        result.peak_fraction = (peak > 0.0).then(|| rate / peak);
        if rate > peak * (1.0 + config.peak_tolerance) {
            result.flags.push(format!(
                "{:.1} GFLOPS exceeds the modeled peak of {:.1} GFLOPS for {} cores",
                rate / 1e9,
                peak / 1e9,
                config.cores
            ));
        }
    }
    if let Some(baseline) = config.baseline_seconds
        && baseline > 0.0
        && stats.median > 0.0
    {
        let speedup = baseline / stats.median;
        result.speedup_over_baseline = Some(speedup);
        if speedup > config.max_plausible_speedup {
            result.flags.push(format!(
                "speedup {speedup:.1}x over the baseline exceeds the plausible {:.0}x",
                config.max_plausible_speedup
            ));
        }
    }
    result.stats = Some(stats);
}
