//! Measurement policy over a scripted board: validation before timing,
//! re-validation of timed executions, repeat counts, statistics, flags.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use mtswarm_hw::board::RunSample;
use mtswarm_hw::measure::{MeasureConfig, Measurement, Stats, measure};
use mtswarm_hw::{
    Artifact, BackendKind, Board, BuildRequest, ChipSpec, Counters, HwError, RunOutcome,
    RunRequest, Slice,
};

/// Answers each execution with `correct(n)` (n counts every execution the
/// board ever ran, from 0) and a fixed time; records launches.
struct ScriptedBoard {
    slice: Slice,
    correct: fn(u64) -> bool,
    seconds: f64,
    flops: u64,
    /// Modeled cycles of execution n (`None`: the backend reports none).
    cycles: fn(u64) -> Option<u64>,
    executions: Mutex<u64>,
    launches: Mutex<Vec<u32>>,
    seeds: Mutex<Vec<Option<u64>>>,
}

impl ScriptedBoard {
    fn new(backend: BackendKind, correct: fn(u64) -> bool) -> Self {
        Self {
            slice: Slice {
                board: "fake0".into(),
                cluster: Some(0),
                cores: 24,
                backend,
            },
            correct,
            seconds: 0.001,
            flops: 1_000_000,
            cycles: |_| None,
            executions: Mutex::new(0),
            launches: Mutex::new(Vec::new()),
            seeds: Mutex::new(Vec::new()),
        }
    }
    fn with_cycles(mut self, cycles: fn(u64) -> Option<u64>) -> Self {
        self.cycles = cycles;
        self
    }
    fn seeds(&self) -> Vec<Option<u64>> {
        self.seeds.lock().expect("seeds").clone()
    }
    fn launches(&self) -> Vec<u32> {
        self.launches.lock().expect("launches").clone()
    }
}

#[async_trait::async_trait]
impl Board for ScriptedBoard {
    fn slice(&self) -> &Slice {
        &self.slice
    }
    async fn build(&self, _request: &BuildRequest) -> Result<Artifact, HwError> {
        Err(HwError::compile("not used"))
    }
    async fn run(&self, _artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        self.launches.lock().expect("launches").push(request.runs);
        self.seeds.lock().expect("seeds").push(request.seed);
        let mut samples = Vec::new();
        for _ in 0..request.runs {
            let n = {
                let mut e = self.executions.lock().expect("executions");
                *e += 1;
                *e - 1
            };
            let valid = (self.correct)(n);
            samples.push(RunSample {
                valid,
                error: (!valid).then(|| format!("max_abs_err 3.0 at execution {n}")),
                modeled_cycles: (self.cycles)(n),
                seconds: self.seconds * (1.0 + (n % 3) as f64 * 0.1),
                max_abs_err: Some(if valid { 0.0 } else { 3.0 }),
                counters: Counters {
                    flops: self.flops,
                    ..Counters::default()
                },
                seed: None,
                useful_flops: self.flops,
            });
        }
        let valid = samples.iter().all(|s| s.valid);
        Ok(RunOutcome {
            valid,
            error: (!valid).then(|| "wrong output".to_string()),
            samples,
            ..RunOutcome::default()
        })
    }
}

fn artifact(backend: BackendKind) -> Artifact {
    Artifact {
        backend,
        dir: PathBuf::from("/nonexistent"),
        program: PathBuf::from("/nonexistent/host"),
        kernel_hash: "abc123".into(),
        toolchain: "fake-cc 1.0".into(),
        log: String::new(),
        defines: BTreeMap::from([("N".to_string(), "64".to_string())]),
        harness: BTreeMap::new(),
        model: None,
    }
}

fn config() -> MeasureConfig {
    MeasureConfig {
        cores: 8,
        warmup: 2,
        min_repeats: 10,
        min_seconds: 0.0,
        runs_per_launch: 5,
        launch_timeout: Duration::from_secs(5),
        ..MeasureConfig::default()
    }
}

/// Measures on `board` with an artifact built for its backend.
async fn measure_on(board: &ScriptedBoard, cfg: &MeasureConfig) -> Measurement {
    let artifact = artifact(board.slice.backend);
    measure(board, &artifact, &ChipSpec::default(), cfg)
        .await
        .expect("measure")
}

#[tokio::test]
async fn wrong_answer_gets_no_timing_at_all() {
    let board = ScriptedBoard::new(BackendKind::Host, |_| false);
    let m = measure_on(&board, &config()).await;
    assert!(!m.valid);
    assert!(m.failed_validation);
    assert!(m.stats.is_none() && m.gflops.is_none());
    assert!(m.samples.is_empty());
    assert!(
        m.error
            .as_deref()
            .unwrap_or("")
            .contains("validation failed"),
        "{:?}",
        m.error
    );
    // Only the single validation execution ran.
    assert_eq!(board.launches(), [1]);
}

#[tokio::test]
async fn kernel_wrong_on_a_later_timed_run_is_invalid() {
    // Right for validation (0), warm-up (1, 2) and the first timed runs,
    // wrong from execution 6 on.
    let board = ScriptedBoard::new(BackendKind::Host, |n| n < 6);
    let m = measure_on(&board, &config()).await;
    assert!(!m.valid);
    assert!(!m.failed_validation);
    assert!(
        m.stats.is_none() && m.gflops.is_none(),
        "no figure for a wrong kernel"
    );
    let err = m.error.clone().unwrap_or_default();
    assert!(err.starts_with("timed execution 4"), "{err}");
    assert!(!m.trustworthy());
}

#[tokio::test]
async fn deterministic_backend_still_times_two_executions() {
    // Right for validation and warm-up, wrong on the second timed execution.
    // (The simulated backend's timing is modeled but noisy, not exact.)
    let board = ScriptedBoard::new(BackendKind::Simulated, |n| n != 4);
    let cfg = MeasureConfig {
        runs_per_launch: 1,
        min_repeats_deterministic: 1,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    assert!(m.deterministic);
    assert!(!m.valid, "the second timed execution was wrong");
    assert_eq!(board.launches(), [1, 2, 2]);
    assert_eq!(
        m.error
            .as_deref()
            .map(|e| e.starts_with("timed execution 2")),
        Some(true),
        "{:?}",
        m.error
    );
}

#[tokio::test]
async fn valid_kernel_gets_robust_statistics_and_tags() {
    let board = ScriptedBoard::new(BackendKind::Host, |_| true);
    let m = measure_on(&board, &config()).await;
    assert!(m.valid && m.flags.is_empty(), "{m:?}");
    assert!(m.trustworthy());
    let stats = m.stats.clone().expect("stats");
    assert_eq!(stats.count, 10);
    assert_eq!(m.samples.len(), 10);
    // validation 1 + warm-up 2 + two timed launches of 5.
    assert_eq!(board.launches(), [1, 2, 5, 5]);
    assert!(stats.min <= stats.median && stats.median <= stats.max);
    let expected_median = Stats::of(&m.samples.iter().map(|s| s.seconds).collect::<Vec<_>>())
        .expect("stats")
        .median;
    assert_eq!(stats.median, expected_median);
    let gflops = m.gflops.expect("gflops");
    assert!((gflops - 1e6 / stats.median / 1e9).abs() < 1e-9);
    assert_eq!(m.slice, "fake0/c0");
    assert_eq!(m.backend, BackendKind::Host);
    assert_eq!(m.kernel_hash, "abc123");
    assert_eq!(m.toolchain, "fake-cc 1.0");
    assert_eq!(m.cores, 8);
    let json = serde_json::to_value(&m).expect("serializes");
    assert_eq!(json["kernel_hash"], "abc123");
}

#[tokio::test]
async fn min_duration_adds_repeats_on_real_timing() {
    let board = ScriptedBoard::new(BackendKind::Host, |_| true);
    let cfg = MeasureConfig {
        min_repeats: 2,
        min_seconds: 0.02,
        runs_per_launch: 4,
        max_repeats: 1000,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    let total: f64 = m.samples.iter().map(|s| s.seconds).sum();
    assert!(
        total >= 0.02,
        "kept repeating until the minimum time: {total}"
    );
    assert!(m.samples.len() >= 16);
    // Capped by max_repeats.
    let capped = MeasureConfig {
        max_repeats: 6,
        min_seconds: 100.0,
        ..cfg
    };
    let board = ScriptedBoard::new(BackendKind::Host, |_| true);
    let m = measure_on(&board, &capped).await;
    assert_eq!(m.samples.len(), 6);
}

#[tokio::test]
async fn implausible_figures_are_flagged() {
    let mut board = ScriptedBoard::new(BackendKind::Host, |_| true);
    // 1e15 flop in 1 ms on 8 cores is far beyond the modeled peak.
    board.flops = 1_000_000_000_000_000;
    let m = measure_on(&board, &config()).await;
    assert!(m.valid);
    assert!(
        m.flags
            .iter()
            .any(|f| f.contains("exceeds the modeled peak")),
        "{:?}",
        m.flags
    );
    assert!(!m.trustworthy());

    let board = ScriptedBoard::new(BackendKind::Host, |_| true);
    let cfg = MeasureConfig {
        baseline_seconds: Some(10.0),
        max_plausible_speedup: 50.0,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    assert!(m.speedup_over_baseline.expect("speedup") > 50.0);
    assert!(
        m.flags.iter().any(|f| f.contains("over the baseline")),
        "{:?}",
        m.flags
    );
}

#[test]
fn stats_drop_min_and_max_for_the_trimmed_mean() {
    let s = Stats::of(&[5.0, 1.0, 2.0, 3.0, 100.0]).expect("stats");
    assert_eq!(s.median, 3.0);
    assert_eq!(s.trimmed_mean, (2.0 + 3.0 + 5.0) / 3.0);
    assert_eq!((s.min, s.max, s.count), (1.0, 100.0, 5));
    let s = Stats::of(&[2.0, 4.0]).expect("stats");
    assert_eq!(s.median, 3.0);
    assert_eq!(s.trimmed_mean, 3.0);
    assert!(Stats::of(&[]).is_none());
    assert!(Stats::of(&[1.0, f64::NAN]).is_none());
}

/// Exact timing (the emulator's modeled cycles): one validated execution is
/// the figure, with no warm-up and no repeats.
#[tokio::test]
async fn exact_backend_times_the_one_validated_execution() {
    let board = ScriptedBoard::new(BackendKind::Emulator, |_| true).with_cycles(|_| Some(1000));
    let cfg = MeasureConfig {
        spot_check_every: 0,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    assert!(m.exact && m.trustworthy(), "{m:?}");
    assert!(!m.spot_checked);
    assert_eq!(board.launches(), [1]);
    assert_eq!(m.stats.as_ref().map(|s| s.count), Some(1));
    assert_eq!(m.launches, 1);
    // The launch had its own seed, chosen by the measurement.
    assert!(board.seeds()[0].is_some());
}

#[tokio::test]
async fn exact_backend_wrong_answer_gets_no_figure() {
    let board = ScriptedBoard::new(BackendKind::Emulator, |_| false).with_cycles(|_| Some(1000));
    let m = measure_on(&board, &config()).await;
    assert!(!m.valid && m.failed_validation && m.stats.is_none());
    assert_eq!(board.launches(), [1]);
}

/// The spot re-run's second execution, on other inputs in the same process,
/// catches code that is right once and wrong later.
#[tokio::test]
async fn spot_rerun_catches_code_right_once_and_wrong_later() {
    // Executions: the measuring one (0), then the re-run's same-seed (1)
    // and fresh (2) ones; wrong from the second of a process on.
    let board = ScriptedBoard::new(BackendKind::Emulator, |n| n != 2).with_cycles(|_| Some(1000));
    let cfg = MeasureConfig {
        spot_check: true,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    assert!(
        !m.valid && !m.failed_validation && m.stats.is_none(),
        "{m:?}"
    );
    assert!(
        m.error
            .as_deref()
            .unwrap_or("")
            .starts_with("spot re-run execution 2"),
        "{:?}",
        m.error
    );
}

#[tokio::test]
async fn spot_rerun_repeats_the_inputs_and_confirms_the_cycles() {
    let board = ScriptedBoard::new(BackendKind::Emulator, |_| true).with_cycles(|_| Some(1000));
    let cfg = MeasureConfig {
        spot_check: true,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    assert!(m.trustworthy() && m.spot_checked, "{m:?}");
    assert_eq!(board.launches(), [1, 2]);
    let seeds = board.seeds();
    assert!(seeds[0].is_some() && seeds[0] == seeds[1], "{seeds:?}");
    assert_eq!(m.samples.len(), 3);
}

/// A figure that would be the caller's best is always reproduced; a slower
/// one is not (with no random draws).
#[tokio::test]
async fn a_figure_at_or_below_the_best_so_far_is_spot_checked() {
    let cfg = |best: f64| MeasureConfig {
        spot_check_every: 0,
        spot_check_at_or_below: Some(best),
        ..config()
    };
    // The scripted measuring execution takes 1 ms.
    for (best, checked) in [(0.001, true), (f64::INFINITY, true), (0.000_999, false)] {
        let board = ScriptedBoard::new(BackendKind::Emulator, |_| true).with_cycles(|_| Some(1000));
        let m = measure_on(&board, &cfg(best)).await;
        assert!(m.trustworthy(), "{m:?}");
        assert_eq!(m.spot_checked, checked, "best so far {best}: {m:?}");
        let expected: &[u32] = if checked { &[1, 2] } else { &[1] };
        assert_eq!(board.launches(), expected, "best so far {best}");
    }
}

#[tokio::test]
async fn spot_rerun_with_other_cycles_is_flagged_and_does_not_count() {
    // Cycles that depend on something other than the inputs.
    let board = ScriptedBoard::new(BackendKind::Emulator, |_| true).with_cycles(|n| Some(1000 + n));
    let cfg = MeasureConfig {
        spot_check: true,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    assert!(m.valid && !m.spot_checked);
    assert!(!m.trustworthy(), "a mismatch must not count");
    assert!(
        m.flags.iter().any(|f| f.contains("not reproducible")),
        "{:?}",
        m.flags
    );
}

#[tokio::test]
async fn spot_rerun_with_a_wrong_answer_is_invalid() {
    // Right in the measuring launch, wrong on the same inputs again.
    let board = ScriptedBoard::new(BackendKind::Emulator, |n| n == 0).with_cycles(|_| Some(1000));
    let cfg = MeasureConfig {
        spot_check: true,
        ..config()
    };
    let m = measure_on(&board, &cfg).await;
    assert!(!m.valid && m.stats.is_none(), "{m:?}");
    assert!(
        m.error
            .as_deref()
            .unwrap_or("")
            .starts_with("spot re-run execution 1"),
        "{:?}",
        m.error
    );
}

#[tokio::test]
async fn every_exact_measurement_is_spot_checked_at_a_rate_of_one() {
    let board = ScriptedBoard::new(BackendKind::Emulator, |_| true).with_cycles(|_| Some(7));
    let cfg = MeasureConfig {
        spot_check_every: 1,
        ..config()
    };
    for _ in 0..3 {
        assert!(measure_on(&board, &cfg).await.spot_checked);
    }
    assert_eq!(board.launches(), [1, 2, 1, 2, 1, 2]);
}
