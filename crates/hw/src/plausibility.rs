//! Plausibility flags: figures no board could produce are not results.
//!
//! A model optimising against the emulator is rewarded for any figure, so
//! a figure must also be physically possible before it counts: not above
//! the modeled peak of the cores used, not faster than the roofline bound of
//! the kernel's own `[model]` (its flops and DDR bytes at the spec's peak and
//! bandwidth), not moving DDR bytes faster than the cluster's share, and not
//! claiming more floating-point work than the kernel executed. A flagged
//! sample is made invalid here, so it can never become evidence, a best, a
//! recorded valid result or a job's answer further up.

pub use crate::board::{Flag, ModelFigures};
use crate::board::{RunOutcome, RunSample};
use crate::spec::ChipSpec;

/// Slack for rounding (modeled cycles are whole numbers).
const SLACK: f64 = 1e-3;

/// What one execution's figures are checked against.
#[derive(Debug, Clone, Copy)]
pub struct Bounds<'a> {
    /// The chip model whose peak and bandwidth bound the figures.
    pub spec: &'a ChipSpec,
    /// Cores the execution ran on (0 counts as 1).
    pub cores: u32,
    /// The build's `[model]` figures (`None`: no roofline check).
    pub model: Option<ModelFigures>,
    /// The kernel's executed flops are observed (emulator) and comparable to
    /// the harness's claim.
    pub counted_flops: bool,
}

/// Flags of one execution: `claimed_flops` from the harness, the sample's
/// time and counters from the backend.
pub fn flags_of(sample: &RunSample, claimed_flops: f64, bounds: &Bounds<'_>) -> Vec<Flag> {
    let mut flags = Vec::new();
    let seconds = sample.seconds;
    if seconds.is_nan() || seconds <= 0.0 {
        return flags;
    }
    let peak = bounds.spec.peak_flops(bounds.cores.max(1));
    if claimed_flops / seconds > peak * (1.0 + SLACK) {
        flags.push(Flag::AbovePeak);
    }
    if let Some(model) = bounds.model {
        let bound = (model.flops / peak).max(model.bytes / bounds.spec.cluster_bandwidth());
        if seconds < bound * (1.0 - SLACK) {
            flags.push(Flag::FasterThanRoofline);
        }
    }
    if sample.counters.ddr_bytes as f64 / seconds > bounds.spec.cluster_bandwidth() * (1.0 + SLACK)
    {
        flags.push(Flag::AboveDdrBandwidth);
    }
    if bounds.counted_flops && claimed_flops > sample.counters.flops as f64 * (1.0 + SLACK) + 1.0 {
        flags.push(Flag::ClaimsUnexecutedFlops);
    }
    flags
}

/// Mark a flagged sample invalid, with the reasons in its error.
pub fn apply(sample: &mut RunSample, flags: &[Flag]) {
    if flags.is_empty() {
        return;
    }
    let reasons: Vec<&str> = flags.iter().map(|f| f.describe()).collect();
    sample.valid = false;
    let text = format!("implausible figure: {}", reasons.join("; "));
    sample.error = Some(match sample.error.take() {
        Some(e) => format!("{e}; {text}"),
        None => text,
    });
}

/// The union of the samples' flags on the outcome; a flagged outcome is
/// invalid.
pub fn collect(outcome: &mut RunOutcome, per_sample: &[Vec<Flag>]) {
    for flag in per_sample.iter().flatten() {
        if !outcome.flags.contains(flag) {
            outcome.flags.push(*flag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::Counters;

    fn sample(seconds: f64, flops: u64, ddr: u64) -> RunSample {
        RunSample {
            valid: true,
            seconds,
            counters: Counters {
                flops,
                ddr_bytes: ddr,
                ..Counters::default()
            },
            ..RunSample::default()
        }
    }

    #[test]
    fn each_bound_flags_what_exceeds_it() {
        let spec = ChipSpec::default();
        let bounds = Bounds {
            spec: &spec,
            cores: 1,
            model: Some(ModelFigures {
                flops: 1e6,
                bytes: 3e6,
            }),
            counted_flops: true,
        };
        // 1e6 flops at 1 core (115.2 GFLOPS) need 8.7 us; 3 MB at 30 GB/s 100 us.
        assert_eq!(
            flags_of(&sample(2e-4, 2_000_000, 3_000_000), 1e6, &bounds),
            vec![]
        );
        let f = flags_of(&sample(5e-6, 2_000_000, 0), 1e6, &bounds);
        assert!(
            f.contains(&Flag::AbovePeak) && f.contains(&Flag::FasterThanRoofline),
            "{f:?}"
        );
        let f = flags_of(&sample(2e-4, 2_000_000, 9_000_000), 1e6, &bounds);
        assert_eq!(f, vec![Flag::AboveDdrBandwidth]);
        let f = flags_of(&sample(2e-4, 10, 0), 1e6, &bounds);
        assert_eq!(f, vec![Flag::ClaimsUnexecutedFlops]);
        let mut s = sample(5e-6, 0, 0);
        apply(&mut s, &[Flag::AbovePeak]);
        assert!(!s.valid && s.error.as_deref().is_some_and(|e| e.contains("peak")));
    }
}
