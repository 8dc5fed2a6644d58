//! Measurement on a backend whose timing is exact.
//!
//! The emulator's modeled cycles are a function of the code and its inputs:
//! warm-up does not change them and a repeat gives the same number, so the
//! warm-up and repeated timed executions of [`super::measure`] cost CPU and
//! tell nothing. Here one launch is the measurement: its first execution,
//! on fresh inputs, is validated and timed, and a second one on other fresh
//! inputs in the same process is validated too (code that is right once and
//! wrong later is invalid, as everywhere; its time joins the statistics, so
//! data-dependent cycles show as a spread). What the repeats guarded against
//! is kept:
//!
//! - validation before timing: every timed execution is a validated one,
//!   and a wrong answer gets no figure;
//! - reproducibility: a *spot re-run* launches the same artifact again with
//!   the same input seed and must report the same modeled cycles and a right
//!   answer. A mismatch (code that reads anything but its inputs: state left
//!   by an earlier launch, addresses, the clock) is a flag, so the figure
//!   does not count. Which measurements get one is drawn at random (about
//!   one in [`super::MeasureConfig::spot_check_every`]), so a kernel cannot
//!   tell a measured launch from a checked one; a caller confirming a best
//!   asks for one with `spot_check`;
//! - plausibility: the same flags as every measurement (the backend's, and
//!   the peak and baseline checks).

use crate::HwError;
use crate::board::{Artifact, BackendKind, Board, RunOutcome, RunRequest};

use super::{MeasureConfig, Measurement, launch_error, note_flags, samples_of};

/// About one exact measurement in this many gets a spot re-run unasked.
pub(super) const DEFAULT_SPOT_CHECK_EVERY: u32 = 4;
/// Executions of the measuring launch: the timed one and one more on other
/// inputs, to catch code that is right once and wrong later.
const EXECUTIONS: u32 = 2;

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

/// Whether this measurement gets a spot re-run.
fn wants_spot_check(config: &MeasureConfig) -> bool {
    config.spot_check
        || (config.spot_check_every > 0
            && random_u64().is_multiple_of(u64::from(config.spot_check_every)))
}

/// One validated launch and, when drawn or asked, its spot re-run, into
/// `result` (samples, flags, launches, `error` when invalid). Returns the
/// last launch's outcome for the statistics.
pub(super) async fn measure_exact(
    board: &dyn Board,
    artifact: &Artifact,
    config: &MeasureConfig,
    result: &mut Measurement,
) -> Result<RunOutcome, HwError> {
    result.exact = true;
    let seed = random_u64();
    let request = RunRequest {
        cores: config.cores,
        runs: EXECUTIONS,
        timeout: config.launch_timeout,
        args: config.args.clone(),
        seed: Some(seed),
    };
    // The validation executions are the timed ones.
    let outcome = board.run(artifact, &request).await?;
    result.launches += 1;
    let samples = samples_of(&outcome);
    note_flags(result, &outcome);
    if let Some(reason) = launch_error(&outcome, &samples, 0) {
        // Wrong at once: no figure at all; wrong later: invalid all the same.
        let first_wrong = samples.first().is_none_or(|s| !s.valid);
        result.failed_validation = first_wrong;
        result.error = Some(if first_wrong {
            format!("validation failed: {reason}")
        } else {
            reason
        });
        return Ok(outcome);
    }
    let first_cycles: Vec<Option<u64>> = samples.iter().map(|s| s.modeled_cycles).collect();
    result.samples.extend(samples);
    if !wants_spot_check(config) {
        return Ok(outcome);
    }

    let again = board.run(artifact, &request).await?;
    result.launches += 1;
    let samples = samples_of(&again);
    note_flags(result, &again);
    if let Some(reason) = launch_error(&again, &samples, 0) {
        result.error = Some(format!("spot re-run {reason}"));
        return Ok(again);
    }
    let again_cycles: Vec<Option<u64>> = samples.iter().map(|s| s.modeled_cycles).collect();
    result.samples.extend(samples);
    // Execution by execution: the same seed gives the same inputs.
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
