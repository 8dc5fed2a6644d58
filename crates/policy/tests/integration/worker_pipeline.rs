//! Background builds keep the slice busy. The tuning phase of a slice runs
//! from the first acquisition of its hardware lock to the last release;
//! with the search plan's background builds the lock is held for at least
//! 80 % of it, on a real emulated slice with real gcc builds: the next
//! candidates build while the slice validates the current one, so the slice
//! never waits for a compile that fits in the time of the launches before
//! it. Without compile-ahead (every compile a step of its own) the same
//! candidates and budget keep the slice busy for a smaller share. The slice
//! measures like a board (no exact timing: screening is a `validate` of
//! `VALIDATE_RUNS` executions), so a launch lasts about as long as a build.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::support;

use mtswarm_hw::measure::MeasureConfig;
use serde_json::json;
use support::*;

const BUDGET: u32 = 8;
const VALIDATE_RUNS: u32 = 6;
/// The acceptance threshold.
const MIN_UTILIZATION: f64 = 0.80;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_builds_keep_the_slice_busy_for_most_of_the_tuning_phase() {
    // A larger problem than the search test and more checked executions
    // per validate: each launch takes about as long as a compile, as on a
    // board, which is where overlapping them matters.
    let space = reduced_space_sized(512, 512, 512);
    let params = |ahead: bool| {
        json!({
            "candidates": space,
            "max_hardware_calls": BUDGET,
            "validate_runs": VALIDATE_RUNS,
            "compile_ahead": ahead,
        })
    };
    let board_like = || MeasureConfig {
        exact: Some(false),
        ..MeasureConfig::default()
    };
    let ahead = run_policy_measuring(params(true), board_like()).await;
    let serial = run_policy_measuring(params(false), board_like()).await;
    for (name, run) in [
        ("background builds", &ahead),
        ("one call per step", &serial),
    ] {
        eprintln!(
            "{name}: tuning phase {:.2} s (task {:.2} s), lock held {:.2} s = {:.1}%, idle {:.2} s of which {} steps without a launch took {:.2} s; tool time {:?}; {} hardware calls, best {}",
            run.phase.span().as_secs_f64(),
            run.wall.as_secs_f64(),
            run.phase.busy.as_secs_f64(),
            run.utilization() * 100.0,
            run.phase
                .span()
                .saturating_sub(run.phase.busy)
                .as_secs_f64(),
            run.waiting_steps,
            run.waiting.as_secs_f64(),
            run.tool_seconds,
            run.hardware_calls,
            run.answer["best"]["median_seconds"]
        );
        assert!(run.best_seconds.is_some(), "{name}: {}", run.answer);
        assert_eq!(run.hardware_calls, BUDGET as usize, "{name}");
        assert_eq!(run.phase.holds, u64::from(BUDGET), "{name}");
    }
    assert!(
        ahead.utilization() >= MIN_UTILIZATION,
        "background builds: the slice lock was held {:.1}% of the tuning phase",
        ahead.utilization() * 100.0
    );
    assert!(
        ahead.utilization() > serial.utilization(),
        "background builds {:.3} vs serial {:.3}",
        ahead.utilization(),
        serial.utilization()
    );
}
