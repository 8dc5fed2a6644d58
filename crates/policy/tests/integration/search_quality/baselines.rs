//! The strategies the builtin search is compared with, at equal
//! evaluations: random search, and a genetic algorithm as Kernel Tuner
//! runs it (`strategy="genetic_algorithm"`: a population of 20, parents
//! drawn by rank, uniform crossover, each gene mutated with chance 1/10;
//! a child outside the space is drawn again, and a configuration seen
//! before costs no evaluation).

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};

use super::Defines;

const POPULATION: usize = 20;
const MUTATION_CHANCE: f64 = 0.1;
/// Draws of a child before a random configuration of the space replaces it.
const CHILD_ATTEMPTS: usize = 20;

/// Modeled seconds of each evaluation of a random search, in order.
pub(crate) fn random_search(
    times: &BTreeMap<Defines, f64>,
    evaluations: usize,
    seed: u64,
) -> Vec<f64> {
    let mut order: Vec<f64> = times.values().copied().collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order.truncate(evaluations);
    order
}

/// Modeled seconds of each evaluation of the genetic algorithm, in order.
pub(crate) fn genetic_algorithm(
    times: &BTreeMap<Defines, f64>,
    evaluations: usize,
    seed: u64,
) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let space: Vec<&Defines> = times.keys().collect();
    // Every value each parameter takes in the space.
    let mut values: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for config in &space {
        for (name, value) in *config {
            values.entry(name).or_default().insert(value);
        }
    }
    let mut seen: BTreeSet<Defines> = BTreeSet::new();
    let mut order = Vec::new();
    let evaluate = |config: &Defines, seen: &mut BTreeSet<Defines>, order: &mut Vec<f64>| -> f64 {
        let t = times[config];
        if seen.insert(config.clone()) && order.len() < evaluations {
            order.push(t);
        }
        t
    };
    let mut population: Vec<Defines> = space
        .choose_multiple(&mut rng, POPULATION.min(space.len()))
        .map(|c| (*c).clone())
        .collect();
    // Enough generations for any budget; stops when the budget is spent.
    for _ in 0..10 * evaluations.max(1) {
        if order.len() >= evaluations || seen.len() >= space.len() {
            break;
        }
        let mut scored: Vec<(f64, Defines)> = population
            .iter()
            .map(|c| (evaluate(c, &mut seen, &mut order), c.clone()))
            .collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Parents by rank: the i-th fastest with weight (n - i).
        let n = scored.len();
        let weights: Vec<usize> = (0..n).map(|i| n - i).collect();
        let total: usize = weights.iter().sum();
        let pick = |rng: &mut StdRng| -> Defines {
            let mut ticket = rng.random_range(0..total);
            for (i, w) in weights.iter().enumerate() {
                if ticket < *w {
                    return scored[i].1.clone();
                }
                ticket -= w;
            }
            scored[0].1.clone()
        };
        let mut next = Vec::with_capacity(POPULATION);
        while next.len() < POPULATION {
            let (a, b) = (pick(&mut rng), pick(&mut rng));
            let mut child = None;
            for _ in 0..CHILD_ATTEMPTS {
                let candidate: Defines = a
                    .iter()
                    .map(|(name, value)| {
                        let mut gene = if rng.random_bool(0.5) {
                            value.clone()
                        } else {
                            b.get(name).cloned().unwrap_or_else(|| value.clone())
                        };
                        if rng.random_bool(MUTATION_CHANCE)
                            && let Some(choices) = values.get(name.as_str())
                        {
                            let choices: Vec<&&str> = choices.iter().collect();
                            if let Some(v) = choices.choose(&mut rng) {
                                gene = (**v).to_owned();
                            }
                        }
                        (name.clone(), gene)
                    })
                    .collect();
                if times.contains_key(&candidate) {
                    child = Some(candidate);
                    break;
                }
            }
            let child =
                child.unwrap_or_else(|| (*space.choose(&mut rng).expect("a space")).clone());
            next.push(child);
        }
        population = next;
    }
    order
}
