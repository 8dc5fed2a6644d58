//! Measurement on a backend whose timing is exact.
//!
//! The emulator's modeled cycles are a function of the code and its inputs:
//! warm-up does not change them and a repeat gives the same number, so the
//! warm-up and repeated timed executions of [`super::measure`] cost CPU and
//! tell nothing. Here one validated execution is the measurement: a launch
//! of one execution on fresh inputs (a seed the kernel cannot predict),
//! whose time counts only because its output was checked. What the repeats
//! guarded against is kept by a *spot re-run*: the same artifact launched
//! again with the same seed, for two executions. The first must give a
//! right answer and exactly the same modeled cycles (a mismatch means code
//! that reads anything but its inputs: state left by an earlier launch,
//! addresses, the clock; it is a flag, so the figure does not count). The
//! second runs on other fresh inputs in the same process and must be right
//! too (code that is right once and wrong later, e.g. state a double buffer
//! keeps between calls, is invalid); its time joins the statistics, so
//! data-dependent cycles show as a spread.
//!
//! Which measurements get a spot re-run:
//!
//! - every one that would be a best: a figure at or below
//!   [`super::MeasureConfig::spot_check_at_or_below`] (the caller passes its
//!   best time so far), so no figure becomes a best unreproduced;
//! - about one in [`super::MeasureConfig::spot_check_every`] of the others,
//!   drawn at random;
//! - all of them when the caller sets `spot_check`.
//!
//! The choice is made after the measuring launch has ended, and a re-run's
//! first execution is that launch again, so a kernel cannot tell a measured
//! launch from a checked one. Plausibility flags (the backend's, and the
//! peak and baseline checks) apply as to every measurement.
//!
//! One execution instead of two in every measuring launch is most of an
//! evaluation's CPU on the emulator: the product is computed in full.

use crate::board::{Artifact, BackendKind, Board, RunOutcome, RunRequest};
use crate::error::HwError;

use super::{MeasureConfig, Measurement, launch_error, note_flags, samples_of};

/// About one exact measurement in this many that is not a best gets a spot
/// re-run unasked.
pub(super) const DEFAULT_SPOT_CHECK_EVERY: u32 = 4;
/// Executions of the measuring launch: the one validated and timed.
const MEASURING_EXECUTIONS: u32 = 1;
/// Executions of a spot re-run: the measuring launch's again, and one more
/// on other inputs, to catch code that is right once and wrong later.
const SPOT_EXECUTIONS: u32 = 2;

/// Whether `backend`'s timing is exact: only the emulator's modeled cycles
/// are (the simulated backend draws noise, real boards have timers).
pub fn exact_timing(backend: BackendKind) -> bool {
    backend == BackendKind::Emulator
}

/// A fresh random value (a launch seed, a draw): from a v4 UUID, which the
/// kernel under test cannot predict.
fn random_u64() -> u64 {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    u64::from_le_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
    ])
}

/// Whether a measurement whose validated execution took `seconds` gets a
/// spot re-run.
fn wants_spot_check(config: &MeasureConfig, seconds: f64) -> bool {
    config.spot_check
        || config
            .spot_check_at_or_below
            .is_some_and(|best| seconds <= best)
        || (config.spot_check_every > 0
            && random_u64().is_multiple_of(u64::from(config.spot_check_every)))
}

/// One validated launch and, when due, its spot re-run, into `result`
/// (samples, flags, launches, `error` when invalid). Returns the last
/// launch's outcome for the statistics.
pub(super) async fn measure_exact(
    board: &dyn Board,
    artifact: &Artifact,
    config: &MeasureConfig,
    result: &mut Measurement,
) -> Result<RunOutcome, HwError> {
    result.exact = true;
    let seed = random_u64();
    let request = |runs: u32| RunRequest {
        cores: config.cores,
        runs,
        timeout: config.launch_timeout,
        args: config.args.clone(),
        seed: Some(seed),
    };
    // The validation execution is the timed one.
    let outcome = board.run(artifact, &request(MEASURING_EXECUTIONS)).await?;
    result.launches += 1;
    let samples = samples_of(&outcome);
    note_flags(result, &outcome);
    if let Some(reason) = launch_error(&outcome, &samples, 0) {
        result.failed_validation = true;
        result.error = Some(format!("validation failed: {reason}"));
        return Ok(outcome);
    }
    let first_cycles: Vec<Option<u64>> = samples.iter().map(|s| s.modeled_cycles).collect();
    let seconds = samples.iter().map(|s| s.seconds).fold(0.0, f64::max);
    result.samples.extend(samples);
    if !wants_spot_check(config, seconds) {
        return Ok(outcome);
    }

    let again = board.run(artifact, &request(SPOT_EXECUTIONS)).await?;
    result.launches += 1;
    let samples = samples_of(&again);
    note_flags(result, &again);
    if let Some(reason) = launch_error(&again, &samples, 0) {
        result.error = Some(format!("spot re-run {reason}"));
        return Ok(again);
    }
    let again_cycles: Vec<Option<u64>> = samples.iter().map(|s| s.modeled_cycles).collect();
    // Every execution is a sample: the median stays the measuring
    // launch's figure, the fresh inputs' time shows any spread.
    result.samples.extend(samples);
    // Execution by execution: the same seed gives the same inputs (the
    // re-run's further execution, on other inputs, has no counterpart).
    let mismatch = first_cycles
        .iter()
        .zip(again_cycles.iter().chain(std::iter::repeat(&None)))
        .find(|(a, b)| a.is_none() || a != b);
    match mismatch {
        None => result.spot_checked = true,
        Some((a, b)) => result.flags.push(format!(
            "modeled time not reproducible: {} cycles, then {} with the same inputs",
            cycles_text(*a),
            cycles_text(*b)
        )),
    }
    Ok(again)
}

fn cycles_text(cycles: Option<u64>) -> String {
    cycles.map_or_else(|| "no".to_owned(), |c| c.to_string())
}
