//! Compile-ahead keeps the slice busy: the search plan compiles the next
//! candidates in the same step as the current candidate's validate or
//! benchmark, so the engine runs the compiles (host CPU) while the slice
//! lock is held. Measured as the slice lock's busy time over the task's wall
//! time, on a real emulated slice, with and without compile-ahead, same
//! candidates and budget.

mod policy_support;

use policy_support::*;
use serde_json::json;

const BUDGET: u32 = 8;
const VALIDATE_RUNS: u32 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compile_ahead_keeps_the_slice_lock_busier() {
    // A larger problem than the search test and more checked executions
    // per validate: each launch takes about as long as a compile, as on a
    // board, which is where overlapping them matters.
    let space = reduced_space_sized(512, 512, 512);
    let params = |ahead: bool| {
        json!({
            "candidates": space,
            "max_evaluations": BUDGET,
            "validate_runs": VALIDATE_RUNS,
            "compile_ahead": ahead,
        })
    };
    let ahead = run_policy(params(true)).await;
    let serial = run_policy(params(false)).await;
    for (name, run) in [("compile-ahead", &ahead), ("one call per step", &serial)] {
        eprintln!(
            "{name}: lock busy {:.2} s over {:.2} s of task = {:.1}% (lock's own figure since first use {:.1}%), {} hardware calls, best {}",
            run.lock_busy.as_secs_f64(),
            run.wall.as_secs_f64(),
            run.utilization() * 100.0,
            run.lock_stats_utilization * 100.0,
            run.hardware_calls,
            run.answer["best"]["median_seconds"]
        );
        assert!(run.best_seconds.is_some(), "{name}: {}", run.answer);
        assert_eq!(run.hardware_calls, BUDGET as usize, "{name}");
    }
    assert!(
        ahead.utilization() > serial.utilization(),
        "compile-ahead {:.3} vs serial {:.3}",
        ahead.utilization(),
        serial.utilization()
    );
}
