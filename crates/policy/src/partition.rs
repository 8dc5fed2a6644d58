//! Splitting a tuning space between agents so each sees every value of
//! every parameter, not an aliased corner of the enumeration.

use std::collections::HashMap;

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
    // Each (parameter, value) gets a small integer id, so counting what a
    // part holds is indexing, not formatting and looking up text: the
    // leader splits a space of thousands of configurations over a thousand
    // agents, and the work is configurations x parts x parameters.
    let mut values: HashMap<(&str, String), usize> = HashMap::new();
    let mut order: Vec<([u8; 32], &Config, Vec<usize>)> = configurations
        .iter()
        .map(|config| {
            let mut hasher = Sha256::new();
            let mut ids = Vec::with_capacity(config.len());
            for (name, value) in config {
                let text = value.to_string();
                hasher.update(name.as_bytes());
                hasher.update(b"=");
                hasher.update(text.as_bytes());
                hasher.update(b";");
                let next = values.len();
                ids.push(*values.entry((name.as_str(), text)).or_insert(next));
            }
            (hasher.finalize().into(), config, ids)
        })
        .collect();
    order.sort_by_key(|entry| entry.0);
    // Each part's final size: the first `len % parts` get one more.
    let target = |part: usize| {
        configurations.len() / parts + usize::from(part < configurations.len() % parts)
    };
    // How many configurations of each part have each (parameter, value).
    let mut counts: Vec<Vec<usize>> = vec![vec![0; values.len()]; parts];
    for (_, config, ids) in order {
        // Values this configuration shares with the part, per slot the part
        // has in all: lowest is the part that most lacks them, then the
        // lowest index.
        let mut chosen: Option<(f64, usize)> = None;
        for part in (0..parts).filter(|&part| partitions[part].len() < target(part)) {
            let shared: usize = ids.iter().map(|&id| counts[part][id]).sum();
            let crowding = shared as f64 / target(part) as f64;
            if chosen.is_none_or(|(best, _)| crowding.total_cmp(&best).is_lt()) {
                chosen = Some((crowding, part));
            }
        }
        let chosen = chosen.map_or(0, |(_, part)| part);
        for &id in &ids {
            counts[chosen][id] += 1;
        }
        partitions[chosen].push(config.clone());
    }
    partitions
}
