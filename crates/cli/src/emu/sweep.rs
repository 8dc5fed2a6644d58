//! `mtswarm emu sweep KERNEL --out FILE`: every configuration of the
//! kernel's tune.toml space run once on the emulator, written as a Kernel
//! Tuner cache file: the exhaustive landscape a search is judged against
//! (`mtswarm search replay FILE`), and one Kernel Tuner's own strategies can
//! replay (`simulation_mode`). The emulator's modeled cycles are exact, so
//! one validated execution is a configuration's figure.
//!
//! A sweep of a large space takes hours on a laptop: the file is rewritten
//! every few configurations, and a sweep started again with the same
//! `--out` skips what the file already holds, so an interrupted sweep
//! resumes where it stopped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::landscape::{Entry, Landscape, Outcome};
use mtswarm_hw::tune::{Config, TuneSpace};
use mtswarm_hw::{BackendKind, Board, BuildRequest, ChipSpec, RunRequest, Slice};
use tokio::task::JoinSet;

/// Configurations finished between two rewrites of the file.
const SAVE_EVERY: usize = 16;
/// How long one configuration may run.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Arguments of `mtswarm emu sweep`.
#[derive(Debug, Args)]
pub(super) struct SweepArgs {
    /// Kernel directory with a tune.toml.
    kernel_dir: PathBuf,
    /// The Kernel Tuner cache file to write (and to resume from).
    #[arg(long, short = 'o')]
    out: PathBuf,
    /// Configurations run at a time (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// DSP cores each run uses (default: all cores of a cluster).
    #[arg(long)]
    cores: Option<u32>,
    /// Only the first N configurations of the space (a trial sweep).
    #[arg(long)]
    limit: Option<usize>,
    /// Chip spec TOML (default: the built-in MT-3000 numbers).
    #[arg(long)]
    spec: Option<PathBuf>,
}

/// Runs the sweep (see the module docs).
pub(super) async fn sweep(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let spec = match &args.spec {
        Some(path) => ChipSpec::load(path)?,
        None => ChipSpec::default(),
    };
    let space = TuneSpace::load(&args.kernel_dir)?;
    let cores = args.cores.unwrap_or(spec.cores_per_cluster);
    let mut configurations = space.configurations(&spec)?;
    if let Some(limit) = args.limit {
        configurations.truncate(limit);
    }
    let mut landscape = start_or_resume(&args, &space, cores)?;
    let done: BTreeSet<String> = landscape
        .entries
        .iter()
        .map(|e| landscape.cache_key(&e.config))
        .collect();
    let todo: Vec<Config> = configurations
        .into_iter()
        .filter(|c| !done.contains(&landscape.cache_key(c)))
        .collect();
    if !done.is_empty() {
        eprintln!(
            "resuming {}: {} configurations done, {} to go",
            args.out.display(),
            done.len(),
            todo.len()
        );
    }
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let board: Arc<dyn Board> = Arc::new(EmulatorBoard::new(
        Slice {
            board: "sweep".into(),
            cluster: Some(0),
            cores,
            backend: BackendKind::Emulator,
        },
        spec,
    )?);
    let work = tempfile::tempdir().context("creating a build directory")?;
    let bar = ProgressBar::new(todo.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} configurations, {eta} left")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut pending = todo.into_iter().enumerate();
    let mut running = JoinSet::new();
    let mut since_save = 0;
    loop {
        while running.len() < jobs {
            let Some((i, config)) = pending.next() else {
                break;
            };
            let board = Arc::clone(&board);
            let build = BuildRequest {
                kernel_dir: args.kernel_dir.clone(),
                defines: space.defines(&config),
                out_dir: work.path().join(i.to_string()),
            };
            running.spawn(async move {
                let outcome = run_one(board.as_ref(), &build, cores).await;
                // The build is not needed once it ran.
                let _ = std::fs::remove_dir_all(&build.out_dir);
                Entry { config, outcome }
            });
        }
        let Some(finished) = running.join_next().await else {
            break;
        };
        landscape
            .entries
            .push(finished.context("a sweep run panicked")?);
        bar.inc(1);
        since_save += 1;
        if since_save >= SAVE_EVERY {
            save(&landscape, &args.out)?;
            since_save = 0;
        }
    }
    bar.finish_and_clear();
    save(&landscape, &args.out)?;
    println!(
        "{}: {} configurations, {} measured",
        args.out.display(),
        landscape.entries.len(),
        landscape.measured()
    );
    Ok(ExitCode::SUCCESS)
}

/// The landscape already in `--out` (it must be of this kernel's
/// parameters), or an empty one.
fn start_or_resume(args: &SweepArgs, space: &TuneSpace, cores: u32) -> anyhow::Result<Landscape> {
    let keys: Vec<String> = space.params.iter().map(|p| p.name.clone()).collect();
    if args.out.exists() {
        let text = std::fs::read_to_string(&args.out)
            .with_context(|| format!("reading {}", args.out.display()))?;
        let landscape = Landscape::from_kernel_tuner_json(&text)
            .with_context(|| format!("resuming from {}", args.out.display()))?;
        if landscape.keys != keys {
            bail!(
                "{} holds a sweep over {:?}, not this kernel's parameters {keys:?}; give another --out",
                args.out.display(),
                landscape.keys
            );
        }
        return Ok(landscape);
    }
    Ok(Landscape {
        device_name: format!("MT-3000 emulator, {cores} cores of one cluster"),
        kernel_name: kernel_name(&args.kernel_dir),
        values: space
            .params
            .iter()
            .map(|p| (p.name.clone(), p.values.clone()))
            .collect(),
        keys,
        objective: mtswarm_hw::landscape::DEFAULT_OBJECTIVE.to_owned(),
        entries: Vec::new(),
    })
}

fn kernel_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string())
}

/// Builds and runs one configuration once: its modeled time, or why not.
async fn run_one(board: &dyn Board, build: &BuildRequest, cores: u32) -> Outcome {
    let artifact = match board.build(build).await {
        Ok(artifact) => artifact,
        Err(_) => {
            return Outcome::Failed {
                error: "CompilationFailedConfig".into(),
            };
        }
    };
    let run = RunRequest {
        cores,
        runs: 1,
        timeout: RUN_TIMEOUT,
        args: Vec::new(),
        seed: None,
    };
    match board.run(&artifact, &run).await {
        Ok(outcome) if outcome.valid && outcome.flags.is_empty() && outcome.seconds > 0.0 => {
            Outcome::Measured {
                ms: outcome.seconds * 1000.0,
                runs_ms: vec![outcome.seconds * 1000.0],
            }
        }
        _ => Outcome::Failed {
            error: "RuntimeFailedConfig".into(),
        },
    }
}

/// Writes the landscape to `out` through a temporary file, so an
/// interruption never leaves half a file.
fn save(landscape: &Landscape, out: &Path) -> anyhow::Result<()> {
    let tmp = out.with_extension("json.tmp");
    std::fs::write(&tmp, landscape.to_kernel_tuner_json())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))
}
