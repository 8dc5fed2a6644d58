//! The cluster-scale DGEMM (`examples/kernels/dgemm_gsm`): its tuning space
//! is large (>= 1,000 configurations that fit AM, SM and GSM), the best
//! configuration of the recorded sweep reaches 70 % of the
//! 24-core peak under the cost model, and the baseline is far below; the
//! tune.toml `[model]` states both runs' flops and DDR bytes exactly.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use std::collections::BTreeMap;
use std::path::Path;

use emulator_support::*;
use mtswarm_hw::ChipSpec;
use mtswarm_hw::landscape::Landscape;
use mtswarm_hw::tune::TuneSpace;

const CORES: u32 = 24;
const KERNEL: &str = "dgemm_gsm";

/// The defines of the fastest configuration of the recorded sweep
/// (`examples/landscapes/dgemm_gsm.json`, Kernel Tuner's cache format).
fn best_of_sweep() -> BTreeMap<String, String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/landscapes/dgemm_gsm.json");
    let text = std::fs::read_to_string(&path).expect("recorded landscape");
    let landscape = Landscape::from_kernel_tuner_json(&text).expect("a Kernel Tuner cache");
    let best = landscape.optimum().expect("a measured configuration");
    best.config
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

/// The `[model]` of tune.toml states this run's work and DDR traffic
/// exactly: flops of the product, A and B staged once per round, C once.
fn assert_model_matches(overrides: &[(&str, &str)], outcome: &mtswarm_hw::RunOutcome) {
    let space = TuneSpace::load(&kernels_dir().join(KERNEL)).expect("tune.toml");
    let (flops, bytes) = space
        .model_figures(&defines(KERNEL, overrides), &ChipSpec::default())
        .expect("model evaluates")
        .expect("tune.toml has a model");
    assert_eq!(flops, outcome.counters.flops as f64, "{overrides:?}");
    assert_eq!(bytes, outcome.counters.ddr_bytes as f64, "{overrides:?}");
}

#[test]
fn space_has_at_least_1000_configurations_that_fit_the_memories() {
    let spec = ChipSpec::default();
    let space = TuneSpace::load(&kernels_dir().join(KERNEL)).expect("tune.toml");
    let configs = space.configurations(&spec).expect("space");
    assert!(configs.len() >= 1000, "{} configurations", configs.len());
    let size = |name: &str| space.sizes[name].to_string().parse::<u64>().expect("size");
    let (m, n) = (size("M"), size("N"));
    for config in &configs {
        let defines = space.defines(config);
        let v = |name: &str| defines[name].parse::<u64>().expect("integer knob");
        let (mg, nb, kg, kb, buf) = (v("MG"), v("NB"), v("KG"), v("KB"), v("BUF"));
        assert!(2 * kg * (m + n) * 8 <= spec.gsm_bytes, "GSM: {defines:?}");
        assert!(buf * mg * kb * 8 <= spec.sm_bytes, "SM: {defines:?}");
        assert!((mg + buf * kb) * nb * 8 <= spec.am_bytes, "AM: {defines:?}");
    }
}

#[tokio::test]
async fn best_of_the_sweep_reaches_70_percent_of_the_24_core_peak() {
    let overrides = best_of_sweep();
    let pairs: Vec<(&str, &str)> = overrides
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let outcome = run_example(KERNEL, &pairs, CORES, 1)
        .await
        .expect("best configuration runs");
    eprintln!(
        "dgemm_gsm best {overrides:?}: {:.1}% of the {CORES}-core peak, {:?} cycles",
        outcome.peak_fraction * 100.0,
        outcome.modeled_cycles
    );
    assert!(outcome.valid, "{:?}", outcome.error);
    assert_model_matches(&pairs, &outcome);
    assert!(
        (0.70..=1.0).contains(&outcome.peak_fraction),
        "{:.3}",
        outcome.peak_fraction
    );
}

#[tokio::test]
async fn baseline_is_valid_and_far_below_the_best() {
    let space = TuneSpace::load(&kernels_dir().join(KERNEL)).expect("tune.toml");
    let baseline: Vec<(String, String)> = space
        .baseline
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    let pairs: Vec<(&str, &str)> = baseline
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let outcome = run_example(KERNEL, &pairs, CORES, 1)
        .await
        .expect("baseline runs");
    eprintln!(
        "dgemm_gsm baseline: {:.1}% of peak",
        outcome.peak_fraction * 100.0
    );
    assert!(outcome.valid, "{:?}", outcome.error);
    assert_model_matches(&pairs, &outcome);
    assert!(outcome.peak_fraction < 0.35, "{:.3}", outcome.peak_fraction);
}
