//! The kernel's tune.toml baseline, measured by the harness rather than by
//! an agent: the reference every speed-up of a job is quoted against.
//!
//! tune.toml's `baseline` (e.g. `{ VARIANT = "naive" }` over the defaults)
//! may lie outside the tuning space, so its defines are not checked against
//! it; it is built from the pristine harness like every candidate, and
//! measured on the session's slice under the slice lock with the session's
//! measurement defaults. It does not touch the session's state: the
//! baseline is not a candidate, and it must not become the reference of the
//! plausibility check (a naive kernel is orders of magnitude slower than a
//! tuned one, so every honest figure would look implausible against it).
//!
//! A kernel whose counters do not see its flops (a scalar loop) gets its
//! figure from tune.toml's `[model]` flops over the median time: the same
//! useful work every configuration does.

use std::collections::BTreeMap;

use mtswarm_hw::tune::{TuneError, TuneSpace};
use mtswarm_hw::{HwError, Measurement, measure};

use crate::env::ToolEnv;
use crate::hardware::{BuildJob, cores_of, run_build};

/// Why the baseline could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// The kernel directory does not resolve inside the workspace.
    #[error("kernel directory `{kernel_dir}`: {reason}")]
    KernelDir {
        /// Kernel directory as given, relative to the workspace.
        kernel_dir: String,
        /// Why it was refused.
        reason: String,
    },
    /// The kernel's tune.toml is missing or invalid.
    #[error("{kernel_dir}/tune.toml: {source}")]
    Tune {
        /// Kernel directory as given, relative to the workspace.
        kernel_dir: String,
        /// The tune.toml error.
        #[source]
        source: TuneError,
    },
    /// Staging the harness or compiling the baseline failed.
    #[error("building the baseline of `{kernel_dir}`: {message}")]
    Build {
        /// Kernel directory as given, relative to the workspace.
        kernel_dir: String,
        /// The staging or build error (compiler output included).
        message: String,
    },
    /// The backend could not run the measurement (a wrong answer is no error:
    /// it makes an invalid measurement).
    #[error("measuring the baseline of `{kernel_dir}`: {source}")]
    Measure {
        /// Kernel directory as given, relative to the workspace.
        kernel_dir: String,
        /// The hardware backend's error.
        #[source]
        source: HwError,
    },
}

/// The measured baseline: its defines and its measurement (valid or not).
#[derive(Debug, Clone)]
pub struct BaselineMeasurement {
    /// The tune.toml defaults the baseline was built with.
    pub defines: BTreeMap<String, String>,
    /// Its measurement; `valid` is false when the baseline gave a wrong answer.
    pub measurement: Measurement,
}

/// Builds and measures the tune.toml baseline of `kernel_dir` (relative to
/// the workspace) on the session's slice.
pub(crate) async fn measure_baseline(
    env: &ToolEnv,
    kernel_dir: &str,
) -> Result<BaselineMeasurement, BaselineError> {
    let shown = kernel_dir.to_string();
    let dir = env
        .workspace
        .resolve(kernel_dir)
        .map_err(|e| BaselineError::KernelDir {
            kernel_dir: shown.clone(),
            reason: e.to_string(),
        })?;
    let space = TuneSpace::load(&dir.join("tune.toml")).map_err(|source| BaselineError::Tune {
        kernel_dir: shown.clone(),
        source,
    })?;
    let config = space.baseline_config();
    let defines = space.defines(&config);
    let id = "baseline".to_string();
    let staged_dir = env
        .harness
        .stage(&dir, &id)
        .map_err(|e| BaselineError::Build {
            kernel_dir: shown.clone(),
            message: e.to_string(),
        })?;
    let source = env.pristine.diff(&dir, &staged_dir);
    let job = BuildJob {
        source,
        staged_dir,
        out_dir: env.workspace.root().join(".build").join(&id),
        kernel_dir_rel: env.workspace.relative(&dir),
        id,
        generation: 0,
        defines: defines.clone(),
    };
    let artifact = run_build(env.board.clone(), env.compile_gate.clone(), &job)
        .await
        .map_err(|e| BaselineError::Build {
            kernel_dir: shown.clone(),
            message: e.to_string(),
        })?;
    let mut config = env.measure_defaults.clone();
    config.cores = cores_of(env, None).map_err(|e| BaselineError::KernelDir {
        kernel_dir: shown.clone(),
        reason: e.to_string(),
    })?;
    // Its own figure is the reference: nothing to compare it with.
    config.baseline_seconds = None;
    let mut measurement = {
        let _slice = env.lock.acquire(&env.slice_id()).await;
        measure(env.board.as_ref(), &artifact, &env.spec, &config)
            .await
            .map_err(|source| BaselineError::Measure {
                kernel_dir: shown.clone(),
                source,
            })?
    };
    if measurement.gflops.is_none()
        && measurement.valid
        && let Some(median) = measurement.stats.as_ref().map(|s| s.median)
        && median > 0.0
        && let Ok(Some((flops, _bytes))) = space.model_figures(&defines, &env.spec)
    {
        let gflops = flops / median / 1e9;
        measurement.gflops = Some(gflops);
        let peak = env.spec.peak_flops(measurement.cores);
        if peak > 0.0 {
            measurement.peak_fraction = Some(gflops * 1e9 / peak);
        }
    }
    Ok(BaselineMeasurement {
        defines,
        measurement,
    })
}
