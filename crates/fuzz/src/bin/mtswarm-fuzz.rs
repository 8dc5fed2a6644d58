//! `mtswarm-fuzz SECONDS [TARGET...] [--save-new DIR] [--seed N]
//! [--failures DIR] [--keep-current]`: runs each
//! target (all by default) for SECONDS after replaying its corpus, and
//! prints per target the executions, their rate, the distinct outcomes
//! and the failures (each failing input is written under
//! `fuzz-failures/<target>/`). `deploy/fuzz.sh` builds and runs it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use mtswarm_fuzz::{RunConfig, Target, run, targets};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args
        .next()
        .context("usage: mtswarm-fuzz SECONDS [TARGET...] [--save-new DIR] [--seed N]")?
        .parse()
        .context("SECONDS is not a number")?;
    let mut chosen: Vec<Target> = Vec::new();
    let mut save_new = None;
    let mut seed = 0x5eed_u64;
    let mut failures_dir = PathBuf::from("fuzz-failures");
    let mut keep_current = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--save-new" => save_new = Some(PathBuf::from(args.next().context("--save-new DIR")?)),
            "--failures" => failures_dir = PathBuf::from(args.next().context("--failures DIR")?),
            "--keep-current" => keep_current = true,
            "--seed" => {
                seed = args
                    .next()
                    .context("--seed N")?
                    .parse()
                    .context("--seed N")?
            }
            name => match targets::named(name) {
                Some(target) => chosen.push(target),
                None => {
                    let names: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
                    bail!("no target {name:?}; the targets are {}", names.join(", "))
                }
            },
        }
    }
    if chosen.is_empty() {
        chosen = targets::all();
    }
    let config = RunConfig {
        duration: Duration::from_secs_f64(seconds),
        seed,
        failures_dir,
        slow: Duration::from_secs(1),
        hang: Duration::from_secs(30),
        memory_limit: 512 << 20,
        save_new,
        keep_current,
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
        bail!("{failed} failing input(s)");
    }
    Ok(())
}
