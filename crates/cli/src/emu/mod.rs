//! `mtswarm emu ...`: build and run a kernel directory on the emulator (or
//! the host backend) without the rest of the system, for kernel authors and
//! scripts. `--json` prints one machine-readable object; `emu space` lists
//! the tuning space's configurations, one JSON object a line, so a script
//! can sweep the same space the system searches; `emu sweep` runs them all
//! and writes the landscape as a Kernel Tuner cache file ([`sweep`]).

mod sweep;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::host::HostBoard;
use mtswarm_hw::tune::TuneSpace;
use mtswarm_hw::{
    Artifact, BackendKind, Board, BuildRequest, ChipSpec, HwError, RunOutcome, RunRequest, Slice,
};
use serde_json::json;

/// Arguments of `mtswarm emu`: which emulator subcommand to run.
#[derive(Debug, Args)]
pub struct EmuArgs {
    #[command(subcommand)]
    command: EmuCommand,
}

#[derive(Debug, Subcommand)]
enum EmuCommand {
    /// Build a kernel directory and run it once (`--runs` executions).
    Run(RunArgs),
    /// Print every configuration of the kernel's tune.toml space (constraints
    /// applied), one JSON object of `-D` values a line.
    Space(SpaceArgs),
    /// Run every configuration of the kernel's tune.toml space once and
    /// write the landscape as a Kernel Tuner cache file (resumable).
    Sweep(sweep::SweepArgs),
}

#[derive(Debug, Args)]
struct SpaceArgs {
    /// Kernel directory with a tune.toml.
    kernel_dir: PathBuf,
    /// Chip spec TOML the constraints read (default: the built-in MT-3000 numbers).
    #[arg(long)]
    spec: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    Emulator,
    Host,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Kernel directory (kernel.c, host.c, optional tune.toml).
    kernel_dir: PathBuf,
    /// `-D NAME=VALUE` define, over the tune.toml defaults and sizes;
    /// checked against tune.toml (name, value, constraints).
    #[arg(short = 'D', value_name = "NAME=VALUE")]
    defines: Vec<String>,
    /// Do not check the defines against tune.toml (fault knobs such as
    /// FAULT_AFTER, values outside the tuning space).
    #[arg(long)]
    unchecked_defines: bool,
    /// DSP cores to use (default: all cores of a cluster).
    #[arg(long)]
    cores: Option<u32>,
    /// Kernel executions in the launch, each validated.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Chip spec TOML (default: the built-in MT-3000 numbers).
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Cluster of the chip to run on.
    #[arg(long, default_value_t = 0)]
    cluster: u32,
    /// Seconds before the run is killed, counted from process start.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
    #[arg(long, value_enum, default_value_t = Backend::Emulator)]
    backend: Backend,
    /// Keep the build here instead of a temporary directory.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Print one JSON object instead of a human summary.
    #[arg(long)]
    json: bool,
}

/// `mtswarm emu run`: builds and runs the kernel. Exit 0 when the run was
/// valid (every execution matched the reference), 1 otherwise, also when
/// the build or run failed.
pub(crate) async fn main(args: EmuArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        EmuCommand::Run(run) => run_command(run).await,
        EmuCommand::Space(space) => space_command(&space),
        EmuCommand::Sweep(args) => sweep::sweep(args).await,
    }
}

fn space_command(args: &SpaceArgs) -> anyhow::Result<ExitCode> {
    let spec = match &args.spec {
        Some(path) => ChipSpec::load(path)?,
        None => ChipSpec::default(),
    };
    let space = TuneSpace::load(&args.kernel_dir)?;
    let mut out = std::io::stdout().lock();
    for config in space.configurations(&spec)? {
        // Only the tuning parameters: the sizes are the tune.toml's.
        let defines: BTreeMap<String, String> = space
            .defines(&config)
            .into_iter()
            .filter(|(name, _)| config.contains_key(name))
            .collect();
        writeln!(out, "{}", serde_json::to_string(&defines)?)
            .context("writing the configurations")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_define(text: &str) -> anyhow::Result<(String, String)> {
    let (name, value) = text.split_once('=').unwrap_or((text, "1"));
    if name.is_empty() {
        bail!("-D {text}: empty name");
    }
    Ok((name.to_owned(), value.to_owned()))
}

async fn run_command(args: RunArgs) -> anyhow::Result<ExitCode> {
    let spec = match &args.spec {
        Some(path) => ChipSpec::load(path)?,
        None => ChipSpec::default(),
    };
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    for d in &args.defines {
        let (name, value) = parse_define(d)?;
        given.insert(name, value);
    }
    let mut defines: BTreeMap<String, String> = BTreeMap::new();
    if args.kernel_dir.join("tune.toml").is_file() {
        let space = TuneSpace::load(&args.kernel_dir)?;
        // A typo (`-D MBB=64`) must not silently run the defaults.
        if !args.unchecked_defines {
            space.check_defines(&given, &spec)?;
        }
        defines = space.defines(&space.default_config());
    }
    defines.extend(given);
    let cores = args.cores.unwrap_or(spec.cores_per_cluster);
    if !args.timeout.is_finite() || args.timeout <= 0.0 {
        bail!("--timeout must be a positive number of seconds");
    }
    let temp;
    let out_dir = match &args.out_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a build directory")?;
            temp.path().to_path_buf()
        }
    };
    let slice = Slice {
        board: "local".into(),
        cluster: Some(args.cluster),
        cores,
        backend: match args.backend {
            Backend::Emulator => BackendKind::Emulator,
            Backend::Host => BackendKind::Host,
        },
    };
    let board: Box<dyn Board> = match args.backend {
        Backend::Emulator => Box::new(EmulatorBoard::new(slice, spec)?),
        Backend::Host => Box::new(HostBoard::new(slice, spec)?),
    };
    let build = BuildRequest {
        kernel_dir: args.kernel_dir.clone(),
        defines,
        out_dir,
    };
    let run = RunRequest {
        cores,
        runs: args.runs,
        timeout: Duration::from_secs_f64(args.timeout),
        args: Vec::new(),
        seed: None,
    };
    let result = match board.build(&build).await {
        Ok(artifact) => board
            .run(&artifact, &run)
            .await
            .map(|outcome| (artifact, outcome)),
        Err(e) => Err(e),
    };
    let valid = matches!(&result, Ok((_, o)) if o.valid);
    if args.json {
        println!("{}", report_json(&result, cores));
    } else {
        print_human(&result, cores);
    }
    Ok(if valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn report_json(result: &Result<(Artifact, RunOutcome), HwError>, cores: u32) -> serde_json::Value {
    match result {
        Ok((artifact, o)) => json!({
            "valid": o.valid,
            "error": o.error,
            "modeled_cycles": o.modeled_cycles,
            "seconds": o.seconds,
            "gflops": o.gflops,
            "peak_fraction": o.peak_fraction,
            "max_abs_err": o.max_abs_err,
            "counters": o.counters,
            "cores": cores,
            "wall_seconds": o.wall_seconds,
            "kernel_hash": artifact.kernel_hash,
            "toolchain": artifact.toolchain,
            "defines": artifact.defines,
            "flags": o.flags,
            "flag_reasons": o.flags.iter().map(|f| f.describe()).collect::<Vec<_>>(),
            "harness": o.harness,
            "samples": o.samples,
        }),
        Err(e) => json!({
            "valid": false,
            "error": e.to_string(),
            "error_kind": error_kind(e),
            "modeled_cycles": null,
            "seconds": null,
            "gflops": null,
            "peak_fraction": null,
            "flags": [],
            "cores": cores,
        }),
    }
}

fn error_kind(e: &HwError) -> &'static str {
    match e {
        HwError::Config(_) => "config",
        HwError::Kernel(_) => "kernel",
        HwError::Compile(_) => "compile",
        HwError::Launch(_) => "launch",
        HwError::Timeout(_) => "timeout",
        HwError::Capacity(_) => "capacity",
        HwError::Io { .. } => "io",
    }
}

fn print_human(result: &Result<(Artifact, RunOutcome), HwError>, cores: u32) {
    match result {
        Err(e) => println!("FAILED: {e}"),
        Ok((artifact, o)) => {
            println!(
                "{} on {cores} cores: {}",
                artifact.backend,
                if o.valid { "valid" } else { "INVALID" }
            );
            if let Some(err) = &o.error {
                println!("  error:          {err}");
            }
            for flag in &o.flags {
                println!("  FLAGGED:        {}", flag.describe());
            }
            if let Some(cycles) = o.modeled_cycles {
                println!("  modeled cycles: {cycles}");
            }
            println!("  seconds:        {:.6e}", o.seconds);
            println!(
                "  GFLOPS:         {:.2} (useful flops over modeled time)",
                o.gflops
            );
            if artifact.backend == BackendKind::Emulator {
                println!("  of peak:        {:.1}%", o.peak_fraction * 100.0);
                println!(
                    "  counters:       {} executed flops, {} DMA bytes, {} DDR bytes, {} stall cycles",
                    o.counters.flops,
                    o.counters.dma_bytes,
                    o.counters.ddr_bytes,
                    o.counters.stall_cycles
                );
            }
            if let Some(err) = o.max_abs_err {
                println!("  max abs error:  {err:e}");
            }
            println!(
                "  executions:     {} ({} valid)",
                o.samples.len(),
                o.samples.iter().filter(|s| s.valid).count()
            );
            println!("  kernel hash:    {}", &artifact.kernel_hash);
            println!("  toolchain:      {}", artifact.toolchain);
        }
    }
}
