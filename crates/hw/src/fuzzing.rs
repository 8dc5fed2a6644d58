//! The entry points of this crate's untrusted-input parsers for the fuzz
//! targets of `mtswarm-fuzz`: a kernel's printed output as the emulator,
//! the host backend and a real board's harness reader take it. The other
//! parsers a fuzz target drives (`tune.toml`, fleet.toml, slice selectors)
//! are public already.

use std::time::Duration;

use crate::board::{ModelFigures, RunOutcome, RunSample};
use crate::emu::Flavor;
use crate::error::HwError;
use crate::spec::ChipSpec;

/// A harness's stdout as the emulator reads it (`emulated`: with the
/// cycle model's figures, else the host backend's wall clock), the
/// kernel's `[model]` figures `model` holding its samples to the chip's
/// bounds.
pub fn emulator_output(
    stdout: &str,
    spec: &ChipSpec,
    emulated: bool,
    model: Option<ModelFigures>,
) -> Result<RunOutcome, HwError> {
    let flavor = if emulated {
        Flavor::Emulated
    } else {
        Flavor::Native
    };
    crate::emu::protocol::parse_output(stdout, spec, flavor, model)
}

/// A harness's stdout as a real board's backend reads it, `wall` the time
/// the whole run took.
pub fn board_output(stdout: &str, wall: Duration) -> Vec<RunSample> {
    crate::sdk::parse_harness_output(stdout, wall)
}
