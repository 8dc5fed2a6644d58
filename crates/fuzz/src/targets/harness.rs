//! A kernel's printed output: the harness protocol lines
//! (`crates/hw/src/harness_line.rs`: `MTSWARM_RESULT`, `MTSWARM_EMU`,
//! `MTSWARM_ERROR`, `MTSWARM_TIME`) among the kernel's own prints, as the
//! emulator, the host backend and a real board's backend read them. The
//! kernel is untrusted: whatever it prints, what the reader makes of it
//! must be finite, non-negative figures (a time, a rate, a peak fraction)
//! or an error.

use std::time::Duration;

use mtswarm_hw::ChipSpec;
use mtswarm_hw::board::{ModelFigures, RunSample};
use mtswarm_hw::fuzzing::{board_output, emulator_output};

use crate::{Checked, Outcome, Target, Violation, refused_with};

pub(super) const TARGET: Target = Target {
    name: "harness",
    about: "harness result protocol lines and a kernel's output (crates/hw/src/harness_line.rs)",
    check,
    dictionary: &[
        b"MTSWARM_RESULT ",
        b"MTSWARM_EMU ",
        b"MTSWARM_ERROR ",
        b"MTSWARM_TIME ",
        b"{\"valid\":true,\"max_abs_err\":0.0,\"flops\":2048,\"seed\":7}",
        b"{\"threads\":8,\"kernel_cycles\":1000,\"flops\":4096,\"dma_bytes\":64,\"ddr_bytes\":64,\"stall_cycles\":3,\"wall_seconds\":0.001}",
        b"{\"kind\":\"capacity\",\"message\":\"AM full\"}",
        b"{\"kind\":\"launch\",\"message\":\"x\"}",
        b"{\"seconds\":0.25}",
        b"\"error\":\"mismatch\"",
        b"\n",
        b"null",
    ],
    seeds: crate::no_seeds,
    max_len: 64 * 1024,
};

/// Longest error a run may end with.
const MAX_ERROR_BYTES: usize = 4096;

fn finite_sample(sample: &RunSample, reader: &str) -> Result<(), Violation> {
    if !(sample.seconds.is_finite() && sample.seconds >= 0.0) {
        return Err(Violation(format!(
            "{reader}: a sample of {} seconds",
            sample.seconds
        )));
    }
    Ok(())
}

fn check(input: &[u8]) -> Checked {
    let stdout = String::from_utf8_lossy(input);
    let spec = ChipSpec::default();
    let model = Some(ModelFigures {
        flops: 1.0e6,
        bytes: 8.0e3,
    });
    let mut signature = Vec::new();
    let mut accepted = true;
    for (emulated, model) in [(true, model), (false, None)] {
        match emulator_output(&stdout, &spec, emulated, model) {
            Ok(outcome) => {
                for figure in [
                    outcome.seconds,
                    outcome.gflops,
                    outcome.peak_fraction,
                    outcome.wall_seconds,
                ] {
                    if !(figure.is_finite() && figure >= 0.0) {
                        return Err(Violation(format!(
                            "emulated={emulated}: an outcome with the figure {figure}: {outcome:?}"
                        )));
                    }
                }
                for sample in &outcome.samples {
                    finite_sample(sample, "emulator")?;
                }
                signature.push(format!(
                    "{} samples valid={} flags={:?}",
                    outcome.samples.len().min(3),
                    outcome.valid,
                    outcome.flags
                ));
            }
            Err(e) => {
                accepted = false;
                let refused = refused_with(&e.to_string(), MAX_ERROR_BYTES)?;
                signature.push(refused.signature);
            }
        }
    }
    let samples = board_output(&stdout, Duration::from_millis(10));
    for sample in &samples {
        finite_sample(sample, "board")?;
    }
    signature.push(format!("board {}", samples.len().min(3)));
    let signature = signature.join(" | ");
    Ok(if accepted {
        Outcome::accepted(signature)
    } else {
        Outcome::refused(signature)
    })
}
