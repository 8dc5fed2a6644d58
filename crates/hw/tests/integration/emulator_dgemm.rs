//! DGEMM landscape on the emulator: the best configuration of the tune space
//! is near peak, the naive scalar loop is far below, an AM-overflowing
//! blocking fails with the capacity error, and a compute-bound configuration
//! scales with cores.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use emulator_support::*;
use mtswarm_hw::tune::TuneSpace;
use mtswarm_hw::{ChipSpec, HwError};

const CORES: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgemm_best_configuration_of_the_space_reaches_85_percent_of_peak() {
    let dir = kernels_dir().join("dgemm");
    let space = TuneSpace::load(&dir).expect("tune.toml");
    let configs = space.configurations(&ChipSpec::default()).expect("space");
    assert!(
        (30..=150).contains(&configs.len()),
        "space has {} configurations",
        configs.len()
    );
    let board = board(CORES);
    // Two candidates at a time: the host has few cores.
    let mut best: (f64, String) = (0.0, String::new());
    let mut fractions = Vec::new();
    for pair in configs.chunks(2) {
        let mut set = tokio::task::JoinSet::new();
        for config in pair {
            let board = board.clone();
            let dir = dir.clone();
            let defines = config_defines("dgemm", config);
            set.spawn(async move {
                let outcome = build_and_run(&board, &dir, defines.clone(), CORES, 1).await;
                (defines, outcome)
            });
        }
        while let Some(joined) = set.join_next().await {
            let (defines, outcome) = joined.expect("task");
            let outcome = outcome.unwrap_or_else(|e| panic!("{defines:?}: {e}"));
            assert!(outcome.valid, "{defines:?}: {:?}", outcome.error);
            fractions.push(outcome.peak_fraction);
            if outcome.peak_fraction > best.0 {
                best = (outcome.peak_fraction, format!("{defines:?}"));
            }
        }
    }
    eprintln!(
        "dgemm: {} configurations, best {:.1}% of peak on {CORES} cores: {}",
        fractions.len(),
        best.0 * 100.0,
        best.1
    );
    assert!(best.0 >= 0.85, "best {:.3} ({})", best.0, best.1);
    assert!(best.0 <= 1.0, "above peak: {:.3} ({})", best.0, best.1);
    let worst = fractions.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        worst < 0.8 * best.0,
        "the landscape is flat: worst {worst:.3}"
    );
}

#[tokio::test]
async fn dgemm_default_is_near_peak_and_naive_is_a_few_percent() {
    let blocked = run_example("dgemm", &[], CORES, 1)
        .await
        .expect("blocked runs");
    let naive = run_example("dgemm", &[("VARIANT", "naive")], CORES, 1)
        .await
        .expect("naive runs");
    eprintln!(
        "dgemm default {:.1}% of peak, naive {:.2}%",
        blocked.peak_fraction * 100.0,
        naive.peak_fraction * 100.0
    );
    assert!(blocked.valid && naive.valid);
    assert!(
        (0.90..=0.99).contains(&blocked.peak_fraction),
        "blocked {:.3}",
        blocked.peak_fraction
    );
    assert!(
        naive.peak_fraction <= 0.05,
        "naive {:.3}",
        naive.peak_fraction
    );
    assert!(naive.peak_fraction > 0.0);
}

#[tokio::test]
async fn dgemm_blocking_that_overflows_am_is_a_capacity_error() {
    let spec = ChipSpec::default();
    let over = [("MB", "32"), ("NB", "512"), ("KB", "128"), ("BUF", "2")];
    let err = run_example("dgemm", &over, CORES, 1)
        .await
        .expect_err("must not fit");
    match err {
        HwError::Capacity(msg) => {
            assert!(msg.contains("AM capacity exceeded"), "{msg}");
            assert!(msg.contains(&spec.am_bytes.to_string()), "{msg}");
            assert!(msg.contains("vector_malloc"), "{msg}");
        }
        other => panic!("expected a capacity error, got {other}"),
    }
}

#[tokio::test]
async fn dgemm_doubling_cores_on_a_compute_bound_config_scales() {
    let one = run_example("dgemm", &[], 1, 1).await.expect("1 core");
    let two = run_example("dgemm", &[], 2, 1).await.expect("2 cores");
    let ratio =
        one.modeled_cycles.expect("cycles") as f64 / two.modeled_cycles.expect("cycles") as f64;
    eprintln!("dgemm 1 -> 2 cores: {ratio:.3}x");
    assert!((1.7..=2.0).contains(&ratio), "ratio {ratio}");
}
