//! The example kernels' tune.toml files: they parse, their defaults satisfy
//! their own constraints, and their spaces are a sensible size.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use emulator_support::kernels_dir;
use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::{TuneError, TuneSpace};

#[test]
fn every_example_space_is_valid_at_its_defaults() {
    let spec = ChipSpec::default();
    for kernel in ["vecadd", "dgemm", "spmv", "stencil2d"] {
        let space = TuneSpace::load(&kernels_dir().join(kernel)).expect(kernel);
        assert_eq!(space.kernel, kernel);
        space
            .check(&space.default_config(), &spec)
            .unwrap_or_else(|e| panic!("{kernel} defaults: {e}"));
        let configs = space.configurations(&spec).expect(kernel);
        assert!(!configs.is_empty(), "{kernel} has no valid configuration");
        assert!(configs.contains(&space.default_config()), "{kernel}");
    }
}

#[test]
fn dgemm_space_shrinks_with_the_chip_and_names_the_broken_constraint() {
    let dir = kernels_dir().join("dgemm");
    let space = TuneSpace::load(&dir).expect("dgemm");
    let full = space
        .configurations(&ChipSpec::default())
        .expect("space")
        .len();
    let small = ChipSpec {
        am_bytes: 256 * 1024,
        ..ChipSpec::default()
    };
    let fewer = space.configurations(&small).expect("space").len();
    assert!(fewer < full, "{fewer} vs {full}");
    match space.check(&space.default_config(), &small) {
        Err(TuneError::Violated { constraint }) => {
            assert!(constraint.contains("am_bytes"), "{constraint}")
        }
        other => panic!("expected the AM constraint to fail, got {other:?}"),
    }
    // The baseline is selectable even though it is not a tuning value.
    assert!(
        space
            .check(&space.baseline_config(), &ChipSpec::default())
            .is_ok()
    );
}

/// Largest minus smallest, over the parts, of how many configurations hold
/// each (parameter, value); the worst over all of them.
fn worst_value_spread(parts: &[Vec<mtswarm_hw::tune::Config>]) -> usize {
    use std::collections::BTreeMap;
    let mut per_value: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (index, part) in parts.iter().enumerate() {
        for config in part {
            for (name, value) in config {
                per_value
                    .entry((name.clone(), value.to_string()))
                    .or_insert_with(|| vec![0; parts.len()])[index] += 1;
            }
        }
    }
    per_value
        .values()
        .map(|counts| counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0))
        .max()
        .unwrap_or(0)
}

#[test]
fn balanced_partitions_spread_every_parameter_value_across_the_parts() {
    use mtswarm_hw::tune::balanced_partitions;
    let space = TuneSpace::load(&kernels_dir().join("dgemm")).expect("dgemm");
    let configs = space.configurations(&ChipSpec::default()).expect("space");
    for parts in [2usize, 3, 8] {
        let split = balanced_partitions(&configs, parts);
        assert_eq!(split.len(), parts);
        let sizes: Vec<usize> = split.iter().map(Vec::len).collect();
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(max - min <= 1, "{parts} parts: sizes {sizes:?}");
        // Every configuration exactly once.
        let mut all: Vec<String> = split.iter().flatten().map(|c| format!("{c:?}")).collect();
        all.sort();
        let mut expected: Vec<String> = configs.iter().map(|c| format!("{c:?}")).collect();
        expected.sort();
        assert_eq!(all, expected, "{parts} parts");
        // Dealt round-robin in enumeration order, the fastest-varying
        // parameters alias with the part count (the case this avoids).
        let mut round_robin = vec![Vec::new(); parts];
        for (i, config) in configs.iter().enumerate() {
            round_robin[i % parts].push(config.clone());
        }
        let balanced = worst_value_spread(&split);
        let aliased = worst_value_spread(&round_robin);
        eprintln!("{parts} parts: worst value spread {balanced} (round-robin {aliased})");
        assert!(
            balanced <= 3,
            "{parts} parts: a value is {balanced} configurations more frequent in one part than in another"
        );
        if parts == 8 {
            assert!(
                aliased > 2 * balanced,
                "round-robin {aliased} vs {balanced}"
            );
        }
        // The same space splits the same way every time.
        assert_eq!(split, balanced_partitions(&configs, parts));
    }
    assert!(balanced_partitions(&configs, 0).is_empty());
}
