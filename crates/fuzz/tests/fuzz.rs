//! The fuzz stage of the test suite: every target replays its corpus and
//! is mutated for a few seconds (`MTSWARM_FUZZ_SECONDS`, default 5 per
//! target); any input that breaks a target's property fails the test and
//! is written under the test's temporary directory (or
//! `MTSWARM_FUZZ_FAILURES`) to be added to the corpus once fixed.
//! `MTSWARM_FUZZ_TARGETS=a,b` runs only those targets, and
//! `MTSWARM_FUZZ_KEEP_CURRENT=1` keeps each input before it runs (to find
//! one that kills the process).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mtswarm_fuzz::{RunConfig, run, targets};

#[test]
fn every_target_keeps_its_property() {
    let seconds: f64 = std::env::var("MTSWARM_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let failures_dir = std::env::var_os("MTSWARM_FUZZ_FAILURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures"));
    let config = RunConfig {
        duration: Duration::from_secs_f64(seconds),
        seed: 0x5eed,
        failures_dir,
        // A debug build: the bound is loose, a hang or a quadratic blow-up
        // on a 256 KiB input still breaks it.
        slow: Duration::from_secs(3),
        hang: Duration::from_secs(60),
        memory_limit: 512 << 20,
        save_new: None,
        keep_current: std::env::var_os("MTSWARM_FUZZ_KEEP_CURRENT").is_some(),
    };
    let only = std::env::var("MTSWARM_FUZZ_TARGETS").ok();
    let started = Instant::now();
    let mut failures = Vec::new();
    for target in targets::all() {
        if only
            .as_deref()
            .is_some_and(|only| !only.split(',').any(|name| name == target.name))
        {
            continue;
        }
        let report = run(&target, &config);
        println!(
            "fuzz {:<12} corpus {:>4}  executions {:>7} ({:>7.0}/s)  distinct outcomes {:>5}  failures {}",
            report.target,
            report.corpus_inputs,
            report.executions,
            report.rate(),
            report.distinct_outcomes,
            report.failures.len()
        );
        assert!(
            report.corpus_inputs > 0,
            "{}: the corpus is empty",
            target.name
        );
        for failure in report.failures.iter().take(5) {
            failures.push(format!(
                "{}: {} ({})",
                target.name,
                failure.what,
                failure.input.display()
            ));
        }
    }
    println!("fuzz stage: {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "inputs that break a target's property:\n{}",
        failures.join("\n")
    );
}
