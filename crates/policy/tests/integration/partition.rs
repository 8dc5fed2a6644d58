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

/// The rule as the doc states it, written the plain way (text keys, every
/// part's crowding computed in each comparison): the split the leader
/// makes must be exactly this one, since which agent searches which
/// configurations decides a replay's figures.
fn split_as_documented(
    configurations: &[mtswarm_hw::tune::Config],
    parts: usize,
) -> Vec<Vec<mtswarm_hw::tune::Config>> {
    use sha2::{Digest, Sha256};
    use std::collections::BTreeMap;
    let mut partitions = vec![Vec::new(); parts];
    let mut order: Vec<([u8; 32], &mtswarm_hw::tune::Config)> = configurations
        .iter()
        .map(|config| {
            let mut hasher = Sha256::new();
            for (name, value) in config {
                hasher.update(format!("{name}={value};").as_bytes());
            }
            (hasher.finalize().into(), config)
        })
        .collect();
    order.sort_by_key(|entry| entry.0);
    let target = |part: usize| {
        configurations.len() / parts + usize::from(part < configurations.len() % parts)
    };
    let mut counts: Vec<BTreeMap<(String, String), usize>> = vec![BTreeMap::new(); parts];
    for (_, config) in order {
        let crowding = |part: usize| {
            let shared: usize = config
                .iter()
                .map(|(name, value)| {
                    let key = (name.clone(), value.to_string());
                    counts[part].get(&key).copied().unwrap_or(0)
                })
                .sum();
            shared as f64 / target(part) as f64
        };
        let chosen = (0..parts)
            .filter(|&part| partitions[part].len() < target(part))
            .min_by(|&a, &b| crowding(a).total_cmp(&crowding(b)).then(a.cmp(&b)))
            .unwrap();
        for (name, value) in config {
            *counts[chosen]
                .entry((name.clone(), value.to_string()))
                .or_default() += 1;
        }
        partitions[chosen].push(config.clone());
    }
    partitions
}

#[test]
fn the_split_is_the_documented_rule_exactly() {
    for kernel in ["dgemm", "dgemm_gsm", "stencil2d"] {
        let space = TuneSpace::load(&kernels_dir().join(kernel)).expect(kernel);
        let configs = space.configurations(&ChipSpec::default()).expect("space");
        for parts in [1usize, 2, 7, 8, 64, configs.len() + 3] {
            assert_eq!(
                balanced_partitions(&configs, parts),
                split_as_documented(&configs, parts),
                "{kernel}, {parts} parts"
            );
        }
    }
}
