//! Splitting a tuning space between agents: every part sees every value of
//! every parameter, every configuration lands in exactly one part, and the
//! same space splits the same way every time.

use std::path::{Path, PathBuf};

use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::TuneSpace;
use mtswarm_policy::balanced_partitions;

fn kernels_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels")
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
