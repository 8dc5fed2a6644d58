//! The tools that build and launch kernels: compile (host CPU work, runs
//! concurrently, never takes the slice), wait_build, run / validate /
//! benchmark (hardware: they report `needs_hardware` with the slice id as
//! their resource, so the engine holds the slice lock around each call) and
//! board_info.
//!
//! A compile with `background: true` returns at once and builds on its own
//! task; `wait_build` collects it later. A step that is a hardware call
//! plus compiles would otherwise last as long as its slowest compile, and
//! the slice would idle for the difference; background builds span steps,
//! so the next candidates build while the slice runs the current ones.
//! Hardware calls refuse an artifact whose build is still running (the
//! slice is never held waiting for the compiler).
//!
//! Their effects keep the engine's working state current: compile appends
//! `compile_results`; validate and benchmark emit evidence for the completion
//! gate; benchmark appends `benchmark_results` and updates
//! `current_candidates` and `best`. Artifacts built before the latest source
//! edit are refused, so evidence always belongs to the current code. On the
//! `host` backend, whose timing shares the CPU with the compiler, a
//! benchmark waits for the session's compiles and holds new ones back
//! while it measures.

mod benchmark;
mod board_info;
mod compile;
mod run;
mod validate;
mod wait_build;

pub use benchmark::{Benchmark, BenchmarkArgs};
pub use board_info::{BoardInfo, BoardInfoArgs};
pub(crate) use compile::{BuildJob, run_build};
pub use compile::{Compile, CompileArgs};
pub use run::{Launch, RunArgs};
pub use wait_build::{SLICE_IDLE_NOTE, WaitBuild, WaitBuildArgs};

use std::time::Duration;

use mtswarm_core::ToolError;
use mtswarm_hw::{HwError, RunOutcome};

use crate::env::ToolEnv;

/// Longest time-out a call may ask for.
pub(super) const MAX_TIMEOUT_SECONDS: f64 = 3600.0;
pub(super) const DEFAULT_TIMEOUT_SECONDS: f64 = 120.0;
/// Candidates kept in the working state.
pub(super) const CANDIDATES_SHOWN: usize = 5;

/// Artifacts board_info lists by id (the newest); it counts the rest, so
/// its output stays the same size however many builds a session made.
pub(super) const ARTIFACTS_SHOWN: usize = 12;

fn timeout_of(seconds: Option<f64>) -> Result<Duration, ToolError> {
    let s = seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if !(s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT_SECONDS) {
        return Err(ToolError::InvalidArgs(format!(
            "timeout_seconds must be in (0, {MAX_TIMEOUT_SECONDS}], got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

pub(crate) fn cores_of(env: &ToolEnv, cores: Option<u32>) -> Result<u32, ToolError> {
    let slice_cores = env.board.slice().cores;
    let cores = cores.unwrap_or(slice_cores);
    if cores == 0 || cores > slice_cores {
        return Err(ToolError::InvalidArgs(format!(
            "cores must be in 1..={slice_cores} (the slice's cores), got {cores}"
        )));
    }
    Ok(cores)
}

/// A launch error that is the kernel's fault (it ran and misbehaved) rather
/// than the system's: reported as a failed check, not a tool failure.
fn kernel_fault(e: &HwError) -> bool {
    matches!(e, HwError::Capacity(_) | HwError::Timeout(_))
}

fn hw_error(e: HwError) -> ToolError {
    match e {
        HwError::Config(m) => ToolError::InvalidArgs(m),
        HwError::Kernel(detail) => ToolError::InvalidArgs(detail.message().to_owned()),
        other => ToolError::Failed(other.to_string()),
    }
}

fn outcome_text(o: &RunOutcome) -> String {
    let mut s = format!(
        "{}: {:.4e} s, {:.2} GFLOPS ({:.1}% of peak)",
        if o.valid { "valid" } else { "INVALID" },
        o.seconds,
        o.gflops,
        o.peak_fraction * 100.0
    );
    if let Some(c) = o.modeled_cycles {
        s.push_str(&format!(", {c} modeled cycles"));
    }
    if let Some(e) = o.max_abs_err {
        s.push_str(&format!(", max_abs_err {e:.3e}"));
    }
    if o.samples.len() > 1 {
        s.push_str(&format!(", {} executions", o.samples.len()));
    }
    if let Some(err) = &o.error {
        s.push_str(&format!("\nerror: {err}"));
    }
    if !o.valid && !o.output_tail.trim().is_empty() {
        let tail: String = {
            let chars: Vec<char> = o.output_tail.chars().collect();
            chars[chars.len().saturating_sub(1500)..].iter().collect()
        };
        s.push_str(&format!("\noutput tail:\n{tail}"));
    }
    s
}

#[cfg(test)]
mod board_info_tests {
    use super::board_info::newest_artifacts;

    #[test]
    fn only_the_newest_artifacts_are_listed_in_build_order() {
        let ids: Vec<String> = (1..=40).map(|n| format!("b{n}")).collect();
        let shown = newest_artifacts(ids.iter(), 12);
        assert_eq!(shown.len(), 12);
        assert_eq!(shown.first().map(String::as_str), Some("b29"));
        assert_eq!(shown.last().map(String::as_str), Some("b40"));
        let few: Vec<String> = ["b2", "b10", "b1"].iter().map(|s| s.to_string()).collect();
        assert_eq!(newest_artifacts(few.iter(), 12), ["b1", "b2", "b10"]);
    }
}
