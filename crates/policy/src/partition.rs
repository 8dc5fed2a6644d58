//! Splitting a tuning space between agents so each sees every value of
//! every parameter, not an aliased corner of the enumeration.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use mtswarm_hw::tune::Config;

/// Splits `configurations` into `parts` partitions of near-equal size (they
/// differ by at most one) in which every parameter value is spread as evenly
/// as the sizes allow.
///
/// Dealing the enumeration order round-robin would alias with it: with 8
/// parts, the three fastest-varying binary parameters would fix one value
/// each per part, so one agent would only ever see, say, `NR = 4` (the
/// costly compiles and the short runs) and its search would never learn
/// what the other value does. Here configurations are visited in a fixed
/// pseudo-random order (a hash of their text, so the split is the same
/// every time the same space is split) and each goes to the part, among
/// those not full yet, holding the fewest configurations that share a
/// parameter value with it (relative to the part's size), then to the
/// lowest index; parts take exactly their share of the configurations.
pub fn balanced_partitions(configurations: &[Config], parts: usize) -> Vec<Vec<Config>> {
    let mut partitions: Vec<Vec<Config>> = vec![Vec::new(); parts];
    if parts == 0 {
        return partitions;
    }
    let mut order: Vec<([u8; 32], &Config)> = configurations
        .iter()
        .map(|config| {
            let mut hasher = Sha256::new();
            for (name, value) in config {
                hasher.update(name.as_bytes());
                hasher.update(b"=");
                hasher.update(value.to_string().as_bytes());
                hasher.update(b";");
            }
            (hasher.finalize().into(), config)
        })
        .collect();
    order.sort_by_key(|entry| entry.0);
    // Each part's final size: the first `len % parts` get one more.
    let target = |part: usize| {
        configurations.len() / parts + usize::from(part < configurations.len() % parts)
    };
    // How many configurations of each part have each (parameter, value).
    let mut counts: Vec<BTreeMap<(&str, String), usize>> = vec![BTreeMap::new(); parts];
    for (_, config) in order {
        // Values this configuration shares with the part, per slot the part
        // has in all: lowest is the part that most lacks them.
        let crowding = |part: usize| -> f64 {
            let shared: usize = config
                .iter()
                .map(|(name, value)| {
                    counts[part]
                        .get(&(name.as_str(), value.to_string()))
                        .copied()
                        .unwrap_or(0)
                })
                .sum();
            shared as f64 / target(part) as f64
        };
        let chosen = (0..parts)
            .filter(|&part| partitions[part].len() < target(part))
            .min_by(|&a, &b| crowding(a).total_cmp(&crowding(b)).then(a.cmp(&b)))
            .unwrap_or(0);
        for (name, value) in config {
            *counts[chosen]
                .entry((name.as_str(), value.to_string()))
                .or_insert(0) += 1;
        }
        partitions[chosen].push(config.clone());
    }
    partitions
}
