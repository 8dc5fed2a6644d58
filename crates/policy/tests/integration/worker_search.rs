//! The search plan of the builtin worker policy on a real emulated slice:
//! with a budget smaller than the space it finds a configuration within 5 %
//! of the exhaustive best, and at an equal number of evaluations it beats
//! random search.
//!
//! Reference figures come from benchmarking every configuration of a
//! reduced dgemm space directly with the hw crate. The emulator's modeled
//! times are deterministic, so random search (benchmark N uniformly drawn
//! configurations) is evaluated on those same figures, for five fixed seeds.
//! One evaluation is one hardware call on a candidate (validate or
//! benchmark); random search spends one per drawn configuration.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::support;

use serde_json::json;
use support::*;

/// Evaluations the policy and each random search may spend.
const BUDGET: usize = 12;
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_finds_the_near_best_and_beats_random_search_at_equal_evaluations() {
    let space = reduced_space();
    assert!(
        space.len() > 2 * BUDGET,
        "the budget must be well below the space size"
    );
    let reference = measure_all(&space).await;
    let exhaustive_best = reference
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    assert!(
        exhaustive_best.is_finite(),
        "no valid configuration: {reference:?}"
    );

    let run = run_policy(json!({
        "candidates": space,
        "max_hardware_calls": BUDGET,
    }))
    .await;
    let reported = run
        .best_seconds
        .expect("the policy found a valid configuration");
    // Compare configurations by their reference figures (the answer's
    // median is printed with five significant digits).
    let chosen = space
        .iter()
        .position(|d| serde_json::to_value(d).ok().as_ref() == Some(&run.answer["best"]["defines"]))
        .expect("the answer's best is a configuration of the space");
    let best = reference[chosen].expect("the chosen configuration is valid");
    assert!(
        (reported - best).abs() <= best * 1e-3,
        "the answer's median {reported} is the configuration's time {best}"
    );
    eprintln!(
        "space {} configurations; exhaustive best {exhaustive_best:.6e} s; policy best {best:.6e} s with {} evaluations ({} hardware calls) in {:.1} s",
        space.len(),
        run.evaluations,
        run.hardware_calls,
        run.wall.as_secs_f64()
    );
    assert!(
        run.hardware_calls <= BUDGET,
        "{} hardware calls",
        run.hardware_calls
    );
    assert_eq!(run.evaluations as usize, run.hardware_calls);
    let quality = exhaustive_best / best;
    eprintln!(
        "policy reaches {:.1}% of the exhaustive best",
        quality * 100.0
    );
    assert!(
        quality >= 0.95,
        "policy best {best} vs exhaustive {exhaustive_best}"
    );

    // Random search: BUDGET distinct configurations per seed.
    let mut random_bests = Vec::new();
    for seed in SEEDS {
        let picks = SplitMix(seed).sample(space.len(), BUDGET);
        let random_best = picks
            .iter()
            .filter_map(|&i| reference[i])
            .fold(f64::INFINITY, f64::min);
        eprintln!(
            "seed {seed}: random best {random_best:.6e} s ({:.1}% of exhaustive), policy {best:.6e} s",
            exhaustive_best / random_best * 100.0
        );
        random_bests.push(random_best);
    }
    // Criterion: never slower than random search's best on any seed, and
    // strictly faster on average.
    for (seed, random_best) in SEEDS.iter().zip(&random_bests) {
        assert!(
            best <= *random_best,
            "seed {seed}: policy {best} vs random {random_best}"
        );
    }
    let mean_random = random_bests.iter().sum::<f64>() / random_bests.len() as f64;
    assert!(
        best < mean_random,
        "policy {best} vs random mean {mean_random}"
    );
}
