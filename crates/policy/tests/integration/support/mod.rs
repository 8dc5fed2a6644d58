//! Shared set-up of the policy tests: a reduced dgemm tuning space on a real
//! emulated 2-core slice, the builtin policy driven through the engine with
//! the real tools, and direct measurements with the hw crate for reference.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mtswarm_core::answer::last_json;
use mtswarm_core::{AutoApprove, Engine, EngineConfig, Outcome, RiskPolicy, ToolRegistry};
use mtswarm_hw::lock::HwLock;
use mtswarm_hw::measure::{MeasureConfig, measure};
use mtswarm_hw::tune::{ParamValue, TuneSpace};
use mtswarm_hw::{BackendKind, Board, BuildRequest, ChipSpec, EmulatorBoard, Slice};
use mtswarm_policy::BuiltinWorkerPolicy;
use mtswarm_policy::worker::render_task_message;
use mtswarm_tools::{ToolSet, TuningPhase};
use serde_json::Value;

pub(crate) const CORES: u32 = 2;

pub(crate) fn slice() -> Slice {
    Slice {
        board: "emu0".into(),
        cluster: Some(0),
        cores: CORES,
        backend: BackendKind::Emulator,
    }
}

fn repo_kernel(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/kernels")
        .join(name)
}

/// A workspace holding a copy of the dgemm kernel directory as `dgemm`.
pub(crate) fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let dst = dir.path().join("dgemm");
    std::fs::create_dir_all(&dst).expect("mkdir");
    for entry in std::fs::read_dir(repo_kernel("dgemm")).expect("kernel dir") {
        let entry = entry.expect("entry");
        if entry.file_type().expect("type").is_file() {
            std::fs::copy(entry.path(), dst.join(entry.file_name())).expect("copy");
        }
    }
    dir
}

/// The dgemm space at a small size (M=128, N=512, K=128) with a few knobs
/// fixed, so that measuring every configuration stays quick: the `-D` maps
/// of all its configurations, in the tuning-space order.
pub(crate) fn reduced_space() -> Vec<BTreeMap<String, String>> {
    reduced_space_sized(128, 512, 128)
}

/// [`reduced_space`] with other problem sizes.
pub(crate) fn reduced_space_sized(m: i64, n: i64, k: i64) -> Vec<BTreeMap<String, String>> {
    let mut space = TuneSpace::load(&repo_kernel("dgemm")).expect("dgemm tune.toml");
    for (name, value) in [("M", m), ("N", n), ("K", k)] {
        space.sizes.insert(name.into(), ParamValue::Int(value));
    }
    let keep: BTreeMap<&str, Vec<i64>> = [
        ("MB", vec![32, 64, 128]),
        ("NB", vec![256, 512]),
        ("KB", vec![64]),
        ("MR", vec![4, 8]),
        ("NR", vec![2, 4]),
        ("BUF", vec![1, 2]),
        ("B_GSM", vec![0, 1]),
    ]
    .into_iter()
    .collect();
    for p in &mut space.params {
        if let Some(values) = keep.get(p.name.as_str()) {
            p.values = values.iter().map(|v| ParamValue::Int(*v)).collect();
            p.default = p.values[0].clone();
        }
    }
    space
        .configurations(&ChipSpec::default())
        .expect("configurations")
        .iter()
        .map(|c| space.defines(c))
        .collect()
}

pub(crate) fn board() -> Arc<dyn Board> {
    Arc::new(EmulatorBoard::new(slice(), ChipSpec::default()).expect("emulator board"))
}

/// Median seconds of every configuration, benchmarked directly with the hw
/// crate (compile, then `measure` with the tools' defaults on all cores of
/// the slice; no warm-up: the emulator's modeled time is deterministic).
pub(crate) async fn measure_all(configs: &[BTreeMap<String, String>]) -> Vec<Option<f64>> {
    let ws = workspace();
    let board = board();
    let spec = ChipSpec::default();
    let config = MeasureConfig {
        cores: CORES,
        warmup: 0,
        ..MeasureConfig::default()
    };
    let mut out = Vec::with_capacity(configs.len());
    for (i, defines) in configs.iter().enumerate() {
        let artifact = board
            .build(&BuildRequest {
                kernel_dir: ws.path().join("dgemm"),
                defines: defines.clone(),
                out_dir: ws.path().join(".ref").join(i.to_string()),
            })
            .await
            .expect("reference build");
        let m = measure(board.as_ref(), &artifact, &spec, &config)
            .await
            .expect("reference measurement");
        out.push(if m.valid {
            m.stats.map(|s| s.median)
        } else {
            None
        });
    }
    out
}

/// What one policy run produced.
pub(crate) struct PolicyRun {
    pub answer: Value,
    pub best_seconds: Option<f64>,
    pub evaluations: u64,
    pub hardware_calls: usize,
    pub wall: Duration,
    /// The slice's tuning phase: first lock acquisition to last release.
    pub phase: TuningPhase,
    /// Time the tool calls took, per tool (calls of a step overlap).
    pub tool_seconds: BTreeMap<String, f64>,
    /// Steps without a hardware call inside the tuning phase (the slice
    /// waited for a build), and their total time.
    pub waiting_steps: usize,
    pub waiting: Duration,
}

impl PolicyRun {
    /// Slice-lock busy time over the tuning phase.
    pub(crate) fn utilization(&self) -> f64 {
        self.phase.utilization()
    }
}

/// Run the builtin worker policy through the engine with the real tools on
/// a fresh emulated slice, with these task parameters. With the environment
/// variable `POLICY_TEST_LOG` set, prints when each tool call finished.
pub(crate) async fn run_policy(parameters: Value) -> PolicyRun {
    run_policy_measuring(parameters, MeasureConfig::default()).await
}

/// [`run_policy`] with these measurement defaults for the benchmark tool
/// (e.g. `exact: Some(false)`: the emulator measured like a board, with
/// repeats, and screened with `validate`).
pub(crate) async fn run_policy_measuring(parameters: Value, measure: MeasureConfig) -> PolicyRun {
    let ws = workspace();
    let lock = HwLock::new();
    let tools = ToolSet::builder(ws.path(), board())
        .lock(lock.clone())
        .measure_defaults(measure)
        .build()
        .expect("tools");
    let resource_lock = tools.resource_lock();
    let mut registry = ToolRegistry::new();
    tools.register_all(&mut registry).expect("register");
    let engine = Engine::new(
        EngineConfig {
            max_steps: 200,
            ..EngineConfig::default()
        },
        Arc::new(BuiltinWorkerPolicy::new()),
        registry,
        RiskPolicy::default().with_auto_approve(AutoApprove::UpToMedium),
        Arc::new(resource_lock.clone()),
    );
    let task = render_task_message("t1", "dgemm", "", &parameters);
    let started = Instant::now();
    let (mut events, handle) = engine.start("policy-test", "You tune kernels.", &task);
    // Per step: its end, whether it had a hardware call, and its span.
    let drain = tokio::spawn(async move {
        let mut log = Vec::new();
        let mut tool_seconds: BTreeMap<String, f64> = BTreeMap::new();
        let mut steps: BTreeMap<u32, (Instant, Instant, bool)> = BTreeMap::new();
        while let Some(event) = events.next().await {
            if let mtswarm_core::EventKind::ToolResult {
                call_id,
                name,
                duration_ms,
                ..
            } = &event.kind
            {
                let now = Instant::now();
                let took = Duration::from_millis(*duration_ms);
                *tool_seconds.entry(name.clone()).or_default() += took.as_secs_f64();
                let hardware = name == "validate" || name == "benchmark";
                let entry = steps.entry(event.step).or_insert((
                    now.checked_sub(took).unwrap_or(now),
                    now,
                    false,
                ));
                entry.0 = entry.0.min(now.checked_sub(took).unwrap_or(now));
                entry.1 = entry.1.max(now);
                entry.2 |= hardware;
                log.push(format!(
                    "{:>6} ms: step {} {call_id} took {duration_ms} ms",
                    started.elapsed().as_millis(),
                    event.step
                ));
            }
        }
        (log, tool_seconds, steps)
    });
    let outcome = tokio::time::timeout(Duration::from_secs(600), handle.outcome())
        .await
        .expect("the task finishes in time")
        .expect("outcome");
    let wall = started.elapsed();
    let (log, tool_seconds, steps) = drain.await.expect("events drained");
    if std::env::var_os("POLICY_TEST_LOG").is_some() {
        eprintln!("{}", log.join("\n"));
    }
    let (text, state) = match outcome {
        Outcome::Final { text, state, .. } => (text, state),
        other => panic!("the task did not finish with an answer: {other:?}"),
    };
    let hardware_calls = state
        .history()
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .filter(|c| c.name == "validate" || c.name == "benchmark")
        .count();
    let answer = last_json(&text).expect("the answer has a json block");
    let phase = resource_lock
        .tuning_phase(&slice().id())
        .expect("the slice lock was used");
    let stats = lock.stats(&slice().id()).expect("the slice lock was used");
    assert_eq!(
        stats.acquisitions, phase.holds,
        "the tuning phase books every hold of the slice lock"
    );
    let phase_end = phase.last_released.unwrap_or(phase.first_acquired);
    let waiting_spans: Vec<Duration> = steps
        .values()
        .filter(|(from, to, hardware)| {
            !hardware && *from >= phase.first_acquired && *to <= phase_end
        })
        .map(|(from, to, _)| to.saturating_duration_since(*from))
        .collect();
    PolicyRun {
        best_seconds: answer["best"]["median_seconds"].as_f64(),
        evaluations: answer["evaluations"].as_u64().unwrap_or_default(),
        answer,
        hardware_calls,
        wall,
        phase,
        tool_seconds,
        waiting_steps: waiting_spans.len(),
        waiting: waiting_spans.iter().sum(),
    }
}

/// splitmix64: a fixed-seed generator for reproducible random search.
pub(crate) struct SplitMix(pub u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `n` distinct indices out of `0..len`, uniformly (partial shuffle).
    pub(crate) fn sample(&mut self, len: usize, n: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..len).collect();
        for i in 0..n.min(len) {
            let j = i + (self.next() % (len - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(n.min(len));
        all
    }
}
