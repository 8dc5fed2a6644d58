//! Per-slice utilization of the demo: the share of each slice's tuning
//! phase during which its hardware lock was held (see the demo's module
//! docs for why the phase, not the whole job, is the span).

use std::collections::BTreeMap;

use mtswarm_report::{BusyInterval, slice_utilization};

/// What the per-slice utilization figure means, as printed with it.
pub(crate) const UTILIZATION_DEFINITION: &str = "share of each slice's tuning phase (its first hardware-lock acquisition to its last release) during which the lock was held";

/// Each slice's tuning phase, `(first acquisition, last release)` in ms,
/// from the lock-holding intervals of its hardware calls.
pub(super) fn tuning_phases(busy: &[BusyInterval]) -> BTreeMap<String, (u64, u64)> {
    let mut phases: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for interval in busy {
        phases
            .entry(interval.slice.clone())
            .and_modify(|(from, to)| {
                *from = (*from).min(interval.start_ms);
                *to = (*to).max(interval.end_ms);
            })
            .or_insert((interval.start_ms, interval.end_ms));
    }
    phases
}

/// Lock held over the tuning phase, per slice (see [`UTILIZATION_DEFINITION`]).
pub(super) fn phase_utilization(
    busy: &[BusyInterval],
    phases: &BTreeMap<String, (u64, u64)>,
) -> BTreeMap<String, f64> {
    let mut utilization = BTreeMap::new();
    for (slice, (from, to)) in phases {
        let own: Vec<BusyInterval> = busy.iter().filter(|b| &b.slice == slice).cloned().collect();
        utilization.extend(slice_utilization(&own, *from, *to));
    }
    utilization
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(slice: &str, start_ms: u64, end_ms: u64) -> BusyInterval {
        BusyInterval {
            slice: slice.into(),
            start_ms,
            end_ms,
            agent: "tuner-1".into(),
            label: "validate".into(),
        }
    }

    #[test]
    fn utilization_is_lock_time_over_each_slices_own_tuning_phase() {
        // b/c0 starts late and idles 50 ms of its 250; b/c1 never idles.
        let busy = [
            interval("b/c0", 1000, 1100),
            interval("b/c1", 0, 400),
            interval("b/c0", 1150, 1250),
        ];
        let phases = tuning_phases(&busy);
        assert_eq!(phases["b/c0"], (1000, 1250));
        assert_eq!(phases["b/c1"], (0, 400));
        let utilization = phase_utilization(&busy, &phases);
        assert!((utilization["b/c0"] - 0.8).abs() < 1e-9, "{utilization:?}");
        assert!((utilization["b/c1"] - 1.0).abs() < 1e-9, "{utilization:?}");
    }
}
