//! The `simulated` backend: a board that costs a timer, not a machine, so a
//! farm of a thousand slices fits on one host and the leader, the bus and
//! the worker daemons can be measured at that scale.
//!
//! A build compiles nothing: it checks the kernel directory and the defines
//! as the other backends do, hashes the sources and defines the same way
//! ([`kernel_hash`]) and writes one small file (the seed of the figure
//! model) as the artifact's program. A run starts no process: it sleeps
//! (`tokio::time::sleep`) for the board's `run_ms` per execution and
//! reports figures from a deterministic model:
//!
//! - the time of one execution is the roofline bound of the kernel's
//!   tune.toml `[model]` (its flops at the peak of the cores used, its DDR
//!   bytes at the cluster's bandwidth share; [`DEFAULT_FLOPS`] flops when
//!   the kernel has no `[model]`) divided by an efficiency in `0.05..0.9`
//!   that is a function of the defines and the cores, seeded by the hash of
//!   the kernel's sources ([`efficiency`]): a tuning job has a real best
//!   configuration to find, and the same configuration always measures the
//!   same, within the board's `noise`;
//! - `incorrect_fraction` of the configurations, chosen from their defines
//!   alone ([`is_incorrect`]), give wrong answers: the execution is
//!   `valid: false` with the error a failed reference check gives.
//!
//! Every figure goes through the same plausibility check as the emulator's
//! ([`crate::plausibility`]); by construction none is ever flagged.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::board::{
    Artifact, BackendKind, Board, BuildRequest, Counters, ModelFigures, RunOutcome, RunRequest,
    RunSample, Slice,
};
use crate::error::HwError;
use crate::error::io_err;
use crate::fleet::SimulatedSettings;
use crate::plausibility;
use crate::process::kernel_hash;
use crate::spec::ChipSpec;
use crate::toolchain::{check_defines, model_figures};

/// Floating-point operations of one execution when the kernel's tune.toml
/// has no `[model]`.
pub const DEFAULT_FLOPS: f64 = 1e8;
/// The artifact's program: the figure model's seed, as hex.
const SEED_FILE: &str = "simulated.seed";
/// Lowest and highest efficiency of one core (share of its peak).
const EFFICIENCY: (f64, f64) = (0.05, 0.9);
/// Efficiency lost per additional core (parallel overhead).
const PER_CORE_OVERHEAD: f64 = 0.02;

/// A simulated slice (backend `simulated`).
#[derive(Debug)]
pub struct SimulatedBoard {
    slice: Slice,
    spec: ChipSpec,
    settings: SimulatedSettings,
    /// Launches made, for the per-launch draws of run time and noise.
    launches: AtomicU64,
}

impl SimulatedBoard {
    /// The simulated board of `slice` with `spec`'s peak and bandwidth.
    pub fn new(slice: Slice, spec: ChipSpec, settings: SimulatedSettings) -> Result<Self, HwError> {
        if slice.backend != BackendKind::Simulated {
            return Err(HwError::Config(format!(
                "slice {} has backend {}, not simulated",
                slice.id(),
                slice.backend
            )));
        }
        spec.validate()?;
        Ok(Self {
            slice,
            spec,
            settings,
            launches: AtomicU64::new(0),
        })
    }

    /// The run times, wrong-answer share and noise in force.
    pub fn settings(&self) -> &SimulatedSettings {
        &self.settings
    }

    /// Milliseconds of execution `index` of launch `launch`.
    fn execution_ms(&self, launch: u64, index: u32) -> u64 {
        let (low, high) = self.settings.run_ms;
        let span = (high - low + 1) as f64;
        let draw = unit(&[
            b"run_ms",
            self.slice.id().as_bytes(),
            &launch.to_le_bytes(),
            &index.to_le_bytes(),
        ]);
        low + ((draw * span) as u64).min(high - low)
    }
}

/// A number in `0..1` from sha256 over `parts` (each followed by a 0 byte).
fn unit(parts: &[&[u8]]) -> f64 {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    (u64::from_le_bytes(word) >> 11) as f64 / (1u64 << 53) as f64
}

/// The figure model's seed of a kernel directory: the hash of its sources
/// without defines (what a build writes as the artifact's program).
pub fn source_seed(kernel_dir: &Path) -> Result<String, HwError> {
    kernel_hash(kernel_dir, &BTreeMap::new())
}

/// Share of the peak of `cores` cores a configuration reaches, in
/// `0.05..0.9`: each define's value scores in `0..1` (a hash of the seed,
/// its name and its value), the mean score squared spreads the
/// configurations out, and every core past the first costs a little.
pub fn efficiency(seed: &str, defines: &BTreeMap<String, String>, cores: u32) -> f64 {
    let scores: Vec<f64> = defines
        .iter()
        .map(|(name, value)| {
            unit(&[
                b"efficiency",
                seed.as_bytes(),
                name.as_bytes(),
                value.as_bytes(),
            ])
        })
        .collect();
    let score = if scores.is_empty() {
        unit(&[b"efficiency", seed.as_bytes()])
    } else {
        scores.iter().sum::<f64>() / scores.len() as f64
    };
    let one_core = EFFICIENCY.0 + (EFFICIENCY.1 - EFFICIENCY.0) * score * score;
    one_core / (1.0 + PER_CORE_OVERHEAD * f64::from(cores.max(1) - 1))
}

/// Whether the configuration `defines` answers wrongly on a board whose
/// `incorrect_fraction` is `fraction` (the same configurations on every
/// board and kernel).
pub fn is_incorrect(defines: &BTreeMap<String, String>, fraction: f64) -> bool {
    if fraction <= 0.0 {
        return false;
    }
    let text: String = defines.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    unit(&[b"incorrect", text.as_bytes()]) < fraction
}

/// The model's time of one execution, seconds, before noise: the roofline
/// bound of `figures` on `cores` cores over the configuration's efficiency.
pub fn modeled_seconds(
    spec: &ChipSpec,
    figures: Option<ModelFigures>,
    efficiency: f64,
    cores: u32,
) -> f64 {
    let figures = figures.unwrap_or(ModelFigures {
        flops: DEFAULT_FLOPS,
        bytes: 0.0,
    });
    let bound = (figures.flops / spec.peak_flops(cores.max(1)))
        .max(figures.bytes / spec.cluster_bandwidth());
    bound / efficiency
}

/// The model's GFLOP/s of a configuration (no noise): what a tuning job over
/// a simulated board should find as its best among the correct ones.
pub fn modeled_gflops(
    spec: &ChipSpec,
    seed: &str,
    defines: &BTreeMap<String, String>,
    figures: Option<ModelFigures>,
    cores: u32,
) -> f64 {
    let flops = figures.map_or(DEFAULT_FLOPS, |f| f.flops);
    let seconds = modeled_seconds(spec, figures, efficiency(seed, defines, cores), cores);
    flops / seconds / 1e9
}

#[async_trait::async_trait]
impl Board for SimulatedBoard {
    fn slice(&self) -> &Slice {
        &self.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        check_defines(&request.defines)?;
        let kernel_dir = request.kernel_dir.canonicalize().map_err(|e| {
            HwError::kernel_caused(format!("{}: {e}", request.kernel_dir.display()), e)
        })?;
        for file in ["kernel.c", "host.c"] {
            if !kernel_dir.join(file).is_file() {
                return Err(HwError::kernel(format!(
                    "{}: missing {file}",
                    kernel_dir.display()
                )));
            }
        }
        let out_dir = &request.out_dir;
        std::fs::create_dir_all(out_dir).map_err(|e| io_err("creating", out_dir, e))?;
        let program = out_dir.join(SEED_FILE);
        std::fs::write(&program, source_seed(&kernel_dir)?)
            .map_err(|e| io_err("writing", &program, e))?;
        Ok(Artifact {
            backend: BackendKind::Simulated,
            dir: out_dir.clone(),
            program,
            kernel_hash: kernel_hash(&kernel_dir, &request.defines)?,
            toolchain: "simulated (no compiler)".to_owned(),
            log: String::new(),
            defines: request.defines.clone(),
            harness: crate::harness::harness_hashes(&kernel_dir)?,
            model: model_figures(&kernel_dir, &request.defines, &self.spec),
        })
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        request.check(artifact, &self.slice)?;
        let seed = std::fs::read_to_string(&artifact.program).map_err(|e| {
            HwError::launch_caused(
                format!("cannot read {}: {e}", artifact.program.display()),
                e,
            )
        })?;
        let seed = seed.trim();
        let launch = self.launches.fetch_add(1, Ordering::Relaxed);
        let cores = request.cores;
        let defines = &artifact.defines;
        let flops = artifact.model.map_or(DEFAULT_FLOPS, |m| m.flops);
        let bytes = artifact.model.map_or(0.0, |m| m.bytes);
        let base = modeled_seconds(
            &self.spec,
            artifact.model,
            efficiency(seed, defines, cores),
            cores,
        );
        let wrong = is_incorrect(defines, self.settings.incorrect_fraction);
        let bounds = plausibility::Bounds {
            spec: &self.spec,
            cores,
            model: artifact.model,
            counted_flops: true,
        };
        let mut outcome = RunOutcome {
            harness: artifact.harness.clone(),
            ..RunOutcome::default()
        };
        let mut wall_ms = 0u64;
        for index in 0..request.runs {
            wall_ms += self.execution_ms(launch, index);
            let draw = unit(&[
                b"noise",
                seed.as_bytes(),
                self.slice.id().as_bytes(),
                &launch.to_le_bytes(),
                &index.to_le_bytes(),
            ]);
            let seconds = base * (1.0 + self.settings.noise * (2.0 * draw - 1.0));
            let max_abs_err = if wrong { 1.0 + draw } else { 0.0 };
            let mut sample = RunSample {
                valid: !wrong,
                error: wrong.then(|| {
                    format!("output differs from the reference (max abs error {max_abs_err:.3e})")
                }),
                modeled_cycles: None,
                seconds,
                max_abs_err: Some(max_abs_err),
                counters: Counters {
                    flops: flops as u64,
                    dma_bytes: bytes as u64,
                    ddr_bytes: bytes as u64,
                    stall_cycles: 0,
                },
                seed: Some(launch),
                useful_flops: flops as u64,
            };
            let flags = plausibility::flags_of(&sample, flops, &bounds);
            plausibility::apply(&mut sample, &flags);
            plausibility::collect(&mut outcome, &[flags]);
            outcome.samples.push(sample);
        }
        let wall = Duration::from_millis(wall_ms);
        if wall > request.timeout {
            tokio::time::sleep(request.timeout).await;
            return Err(HwError::Timeout(request.timeout));
        }
        tokio::time::sleep(wall).await;
        if let Some(last) = outcome.samples.last() {
            outcome.seconds = last.seconds;
            outcome.counters = last.counters;
            outcome.max_abs_err = last.max_abs_err;
            let rate = flops / last.seconds;
            outcome.gflops = rate / 1e9;
            outcome.peak_fraction = rate / self.spec.peak_flops(cores);
        }
        outcome.valid = outcome.samples.iter().all(|s| s.valid);
        outcome.error = outcome.samples.iter().find_map(|s| s.error.clone());
        outcome.wall_seconds = wall.as_secs_f64();
        outcome.output_tail = format!(
            "simulated: {} execution(s) in {wall_ms} ms on {cores} core(s)",
            request.runs
        );
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests;
