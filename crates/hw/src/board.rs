//! The one interface every hardware backend implements, and the vocabulary
//! (slices, builds, runs) shared by the backends, the measurement code and
//! the worker's tools.
//!
//! A backend does two things: *build* a kernel directory into something it
//! can launch (host CPU work, never takes the slice lock) and *run* it once on
//! its slice (hardware work: callers hold the slice lock). Repetition,
//! statistics and validation policy live in `measure`, not in backends.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::HwError;

/// Which kind of backend drives a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// The MT-3000 emulator that ships with the project (the default).
    Emulator,
    /// The real MT-3000 toolchain and boards, through command templates.
    Sdk,
    /// Plain C on the local CPU, real timing.
    Host,
    /// No compiler and no process: modeled figures after a timer (see
    /// [`crate::simulated`]), for farms larger than the machine.
    Simulated,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Emulator => "emulator",
            Self::Sdk => "sdk",
            Self::Host => "host",
            Self::Simulated => "simulated",
        })
    }
}

/// A piece of hardware one worker agent owns: a whole board, or one DSP
/// cluster of a board with a number of cores.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slice {
    /// Board id from `fleet.toml` (the prefix of the slice id).
    pub board: String,
    /// `None` = the whole board (all clusters).
    #[serde(default)]
    pub cluster: Option<u32>,
    /// DSP cores the slice offers (a run may use fewer); a whole board has
    /// every cluster's cores.
    pub cores: u32,
    /// The backend that drives the slice: its board's `backend` in `fleet.toml`.
    pub backend: BackendKind,
}

impl Slice {
    /// Stable identifier, also the key of the slice's lease and lock:
    /// `board0/c1` for a cluster slice, `board0` for a whole board.
    pub fn id(&self) -> String {
        match self.cluster {
            Some(c) => format!("{}/c{c}", self.board),
            None => self.board.clone(),
        }
    }
}

impl fmt::Display for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} cores, {})", self.id(), self.cores, self.backend)
    }
}

/// What to build: a kernel directory (see `examples/kernels/`) with
/// preprocessor parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildRequest {
    /// The kernel directory: `kernel.c` and `host.c`, optionally `tune.toml`
    /// and further harness files.
    pub kernel_dir: PathBuf,
    /// `-D NAME=VALUE` parameters (tuning knobs, problem sizes).
    #[serde(default)]
    pub defines: BTreeMap<String, String>,
    /// Where build outputs go; created if missing.
    pub out_dir: PathBuf,
}

/// A built kernel, ready to run on a slice of the backend that built it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    /// The backend that built it; only slices of that backend can run it.
    pub backend: BackendKind,
    /// Directory with the launchable files.
    pub dir: PathBuf,
    /// The program to launch (host harness binary).
    pub program: PathBuf,
    /// sha256 over the kernel sources and the defines: identifies "the code
    /// that was measured" in every result.
    pub kernel_hash: String,
    /// Compiler identity and flags, e.g. `gcc 12.2.0 -O2 (emulator)`.
    pub toolchain: String,
    /// Compiler output (warnings), kept for the model to read.
    #[serde(default)]
    pub log: String,
    /// The `-D` defines it was built with (the request's; also part of
    /// `kernel_hash`).
    #[serde(default)]
    pub defines: BTreeMap<String, String>,
    /// Provenance of the harness this build used: file name -> sha256 of
    /// each file that judges the kernel (host.c, tune.toml, the reference,
    /// declared harness files), as taken from the kernel root.
    #[serde(default)]
    pub harness: BTreeMap<String, String>,
    /// The tune.toml `[model]` figures of this build, for the plausibility
    /// check of its runs.
    #[serde(default)]
    pub model: Option<ModelFigures>,
}

/// How to launch an artifact once. One launch executes the kernel `runs`
/// times inside the same process (the harness's `--runs N`), validating
/// every execution, so repeated measurements do not pay process start-up and
/// a kernel that is right once and wrong later is caught.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// DSP cores to use (<= the slice's cores).
    pub cores: u32,
    /// Kernel executions in this launch (>= 1).
    pub runs: u32,
    /// Counted from the moment the process starts, not from when it queued.
    pub timeout: Duration,
    /// Extra arguments for the harness.
    #[serde(default)]
    pub args: Vec<String>,
    /// The launch's input seed (`MTSWARM_SEED`, see `mtswarm_harness.h`);
    /// `None`: a fresh one. A measurement's spot re-run passes the seed of
    /// the launch it checks, so the same inputs must give the same modeled
    /// cycles.
    #[serde(default)]
    pub seed: Option<u64>,
}

impl RunRequest {
    /// `runs` executions on `cores` cores within `timeout`, with no extra
    /// harness arguments and a fresh input seed.
    pub fn new(cores: u32, runs: u32, timeout: Duration) -> Self {
        Self {
            cores,
            runs,
            timeout,
            args: Vec::new(),
            seed: None,
        }
    }

    /// What every backend checks before a launch: `artifact` was built for
    /// `slice`'s backend, the cores are within the slice, at least one run.
    pub(crate) fn check(&self, artifact: &Artifact, slice: &Slice) -> Result<(), HwError> {
        if artifact.backend != slice.backend {
            return Err(HwError::Config(format!(
                "artifact was built for the {} backend, not {}",
                artifact.backend, slice.backend
            )));
        }
        if self.cores == 0 || self.cores > slice.cores {
            return Err(HwError::Config(format!(
                "cores = {} is out of range 1..={} for slice {}",
                self.cores,
                slice.cores,
                slice.id()
            )));
        }
        if self.runs == 0 {
            return Err(HwError::Config("runs must be at least 1".into()));
        }
        Ok(())
    }
}

/// Event counters of one run (modeled on the emulator, zero where a backend
/// cannot observe them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Floating-point operations the kernel executed (vector and scalar).
    pub flops: u64,
    /// Bytes moved by DMA transfers, summed over the cores.
    pub dma_bytes: u64,
    /// Bytes moved over DDR, by DMA and by direct loads and stores.
    #[serde(default)]
    pub ddr_bytes: u64,
    /// Cycles the cores spent waiting (DMA completion, barriers, direct DDR and
    /// GSM accesses), summed over the cores.
    pub stall_cycles: u64,
}

/// One kernel execution inside a launch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSample {
    /// The output matched the reference and no figure was flagged implausible.
    pub valid: bool,
    /// Why the execution is invalid (`None` when it is valid).
    pub error: Option<String>,
    /// Emulator only: the slowest core's modeled cycles of this execution.
    pub modeled_cycles: Option<u64>,
    /// Kernel time of this execution, seconds: modeled on the emulator,
    /// measured elsewhere.
    pub seconds: f64,
    /// Largest absolute deviation from the reference, when the harness says.
    pub max_abs_err: Option<f64>,
    /// Event counters of this execution (the sdk backend fills only `flops`,
    /// with the harness's claim).
    pub counters: Counters,
    /// The input seed the harness drew this execution's inputs from.
    #[serde(default)]
    pub seed: Option<u64>,
    /// The useful work of this execution, flops: the tune.toml `[model]`
    /// figure of the build, else the harness's count (0: unknown). Every
    /// GFLOPS figure is this over the execution's time, never the flops
    /// the code happened to execute (`counters.flops`).
    #[serde(default)]
    pub useful_flops: u64,
}

/// The outcome of one launch. A launch whose output was wrong is `valid:
/// false`, with the reason in `error`; one that could not start at all is an
/// `Err(HwError)` instead. The top-level figures describe the last execution;
/// `samples` holds every execution in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// Every execution was valid, the program ended normally and reported one
    /// result per requested run.
    pub valid: bool,
    /// The first reason the launch is invalid (`None` when it is valid).
    pub error: Option<String>,
    /// Emulator only: the slowest core's modeled cycles.
    pub modeled_cycles: Option<u64>,
    /// Kernel time: modeled on the emulator, measured elsewhere.
    pub seconds: f64,
    /// GFLOP/s of the last execution: the harness's flops over `seconds`.
    pub gflops: f64,
    /// Fraction (0..1) of the modeled peak of the cores used.
    pub peak_fraction: f64,
    /// Event counters of the last execution.
    pub counters: Counters,
    /// Largest absolute deviation from the reference, when the harness says.
    pub max_abs_err: Option<f64>,
    /// Wall time of the whole process.
    pub wall_seconds: f64,
    /// Last lines of the program's output, for diagnosis.
    #[serde(default)]
    pub output_tail: String,
    /// Every execution of the launch, in order (empty when the harness reported
    /// none).
    #[serde(default)]
    pub samples: Vec<RunSample>,
    /// Why a figure of this launch is implausible (see [`crate::plausibility`]);
    /// a flagged launch is never valid.
    #[serde(default)]
    pub flags: Vec<Flag>,
    /// Harness provenance of the artifact that ran (see [`Artifact::harness`]).
    #[serde(default)]
    pub harness: BTreeMap<String, String>,
}

/// A hardware backend bound to one slice.
#[async_trait::async_trait]
pub trait Board: Send + Sync {
    /// The slice this board drives.
    fn slice(&self) -> &Slice;
    /// The slice's backend kind.
    fn backend(&self) -> BackendKind {
        self.slice().backend
    }
    /// Compile and link on the host CPU. Never touches the slice.
    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError>;
    /// Launch once on the slice. Callers hold the slice lock.
    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError>;
}

// The plausibility check's vocabulary (see `crate::plausibility`), here
// because artifacts and outcomes carry it.

/// tune.toml `[model]` figures of one build: per execution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelFigures {
    /// Floating-point operations.
    pub flops: f64,
    /// DDR bytes.
    pub bytes: f64,
}

/// Why a figure is implausible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flag {
    /// More flop/s than the modeled peak of the cores used.
    AbovePeak,
    /// Faster than the roofline bound of the kernel's `[model]`.
    FasterThanRoofline,
    /// DDR bytes moved faster than the cluster's bandwidth share.
    AboveDdrBandwidth,
    /// The harness claims more flops than the kernel executed (emulator).
    ClaimsUnexecutedFlops,
}

impl Flag {
    /// The reason in words, as it appears in a flagged sample's error and in
    /// reports.
    pub fn describe(self) -> &'static str {
        match self {
            Self::AbovePeak => "above the modeled peak of the cores used",
            Self::FasterThanRoofline => "faster than the roofline bound of tune.toml [model]",
            Self::AboveDdrBandwidth => "moves DDR bytes faster than the cluster's bandwidth share",
            Self::ClaimsUnexecutedFlops => {
                "the harness claims more flops than the kernel executed (work the cost model \
                 did not see)"
            }
        }
    }
}
