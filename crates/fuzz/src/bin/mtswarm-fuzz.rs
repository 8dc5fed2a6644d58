//! `mtswarm-fuzz SECONDS [TARGET...] [--save-new DIR] [--seed N]
//! [--failures DIR] [--keep-current]`: runs each
//! target (all by default) for SECONDS after replaying its corpus, and
//! prints per target the executions, their rate, the distinct outcomes
//! and the failures (each failing input is written under
//! `fuzz-failures/<target>/`). `deploy/fuzz.sh` builds and runs it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use mtswarm_fuzz::{RunConfig, Target, run, targets};

/// Runs fuzz targets over the system's untrusted boundaries: each target
/// replays its checked-in corpus, then mutates inputs for SECONDS.
#[derive(Parser)]
#[command(name = "mtswarm-fuzz", version)]
struct Args {
    /// How long to mutate per target, in seconds (0: replay the corpus only).
    seconds: f64,
    /// Targets to run (default: all of them).
    #[arg(value_parser = target_named)]
    targets: Vec<Target>,
    /// Where failing inputs are written, one directory per target.
    #[arg(long = "failures", value_name = "DIR", default_value = "fuzz-failures")]
    failures_dir: PathBuf,
    /// Where inputs that gave an outcome not seen before are written.
    #[arg(long, value_name = "DIR")]
    save_new: Option<PathBuf>,
    /// Seed of the mutator (the same seed replays the same inputs).
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Write each input to <failures>/<target>/current before running it
    /// (slower), to keep one that kills the process.
    #[arg(long)]
    keep_current: bool,
}

fn target_named(name: &str) -> Result<Target, String> {
    targets::named(name).ok_or_else(|| {
        let names: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
        format!("no target {name:?}; the targets are {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !(args.seconds.is_finite() && args.seconds >= 0.0) {
        eprintln!(
            "error: SECONDS must be a non-negative number, got {}",
            args.seconds
        );
        return ExitCode::from(2);
    }
    let chosen = if args.targets.is_empty() {
        targets::all()
    } else {
        args.targets
    };
    let config = RunConfig {
        duration: Duration::from_secs_f64(args.seconds),
        seed: args.seed,
        failures_dir: args.failures_dir,
        slow: Duration::from_secs(1),
        hang: Duration::from_secs(30),
        memory_limit: 512 << 20,
        save_new: args.save_new,
        keep_current: args.keep_current,
    };
    println!(
        "{:<12} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9}",
        "target", "executions", "exec/s", "outcomes", "failures", "slowest", "peak MiB"
    );
    let mut failed = 0;
    for target in chosen {
        let report = run(&target, &config);
        println!(
            "{:<12} {:>10} {:>10.0} {:>9} {:>9} {:>9.1}ms {:>9.1}",
            report.target,
            report.executions,
            report.rate(),
            report.distinct_outcomes,
            report.failures.len(),
            report.slowest.as_secs_f64() * 1e3,
            report.peak_bytes as f64 / (1 << 20) as f64
        );
        for failure in report.failures.iter().take(10) {
            println!("  {}: {}", failure.input.display(), failure.what);
        }
        failed += report.failures.len();
    }
    if failed > 0 {
        eprintln!("error: {failed} failing input(s)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
