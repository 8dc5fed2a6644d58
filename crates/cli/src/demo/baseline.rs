//! The naive baseline of the demo, measured directly on an emulator board
//! (the builtin leader policy only submits configurations of the tuning
//! space, and the tune.toml `baseline` is outside it).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::measure::{MeasureConfig, measure};
use mtswarm_hw::tune::TuneSpace;
use mtswarm_hw::{BackendKind, Board, BuildRequest, ChipSpec, Slice};
use mtswarm_report::Baseline;

use super::kernel::TUNE_FILE;

/// The naive kernel's figure and how it was obtained.
pub(super) struct BaselineFigure {
    pub(super) baseline: Baseline,
    pub(super) source: &'static str,
}

/// Measures the tune.toml baseline (the naive kernel) directly on an
/// emulator board, with the workers' measurement method.
pub(super) async fn measure_baseline(
    kernel_dir: PathBuf,
    space: TuneSpace,
    build_dir: PathBuf,
) -> anyhow::Result<BaselineFigure> {
    let spec = ChipSpec::default();
    let slice = Slice {
        board: "baseline".into(),
        cluster: Some(0),
        cores: spec.cores_per_cluster,
        backend: BackendKind::Emulator,
    };
    let board = EmulatorBoard::new(slice, spec.clone()).context("the baseline's emulator board")?;
    let config = space.baseline_config();
    let defines = space.defines(&config);
    let artifact = board
        .build(&BuildRequest {
            kernel_dir,
            defines,
            out_dir: build_dir,
        })
        .await
        .context("building the naive baseline")?;
    let measure_config = MeasureConfig {
        cores: spec.cores_per_cluster,
        ..MeasureConfig::default()
    };
    let measurement = measure(&board, &artifact, &spec, &measure_config)
        .await
        .context("measuring the naive baseline")?;
    if !measurement.valid {
        bail!(
            "the naive baseline is not valid: {}",
            measurement.error.unwrap_or_else(|| "wrong output".into())
        );
    }
    // The scalar kernel does not count its flops in the emulator's
    // counters, so its figure comes from the tune.toml model's flops (the
    // same useful work every configuration does) over the median time.
    let modeled_flops = space
        .model_figures(&space.defines(&config), &spec)
        .context("the tune.toml [model] flops of the baseline")?
        .map(|(flops, _bytes)| flops);
    let gflops = match (measurement.gflops, modeled_flops, &measurement.stats) {
        (Some(gflops), _, _) => gflops,
        (None, Some(flops), Some(stats)) if stats.median > 0.0 => flops / stats.median / 1e9,
        _ => bail!(
            "the naive baseline has no figure: its run reports no flops and {TUNE_FILE} has no [model] flops"
        ),
    };
    Ok(BaselineFigure {
        baseline: Baseline {
            gflops,
            params: config
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
            description: "naive kernel (tune.toml baseline), measured directly on the emulator"
                .into(),
        },
        source: "emulator, measured directly by the demo (the leader policy tunes only the tune.toml space)",
    })
}
