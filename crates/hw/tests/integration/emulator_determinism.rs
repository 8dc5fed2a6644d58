//! Determinism of the cycle model: the same build and inputs give the same
//! modeled cycles whatever the host scheduler does, across launches, across
//! executions inside one launch, and across rebuilds.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use std::time::Duration;

use emulator_support::*;
use mtswarm_hw::{Board, BuildRequest, RunRequest};

#[tokio::test]
async fn same_build_and_inputs_give_identical_cycles() {
    // B in GSM exercises barriers and the shared-bandwidth model; 4 cores on
    // a 2-core host exercise preemption.
    let dir = kernels_dir().join("dgemm");
    let d = defines(
        "dgemm",
        &[("B_GSM", "1"), ("M", "256"), ("N", "256"), ("K", "256")],
    );
    let board = board(4);
    let out = tempfile::tempdir().expect("tempdir");
    let artifact = board
        .build(&BuildRequest {
            kernel_dir: dir.clone(),
            defines: d.clone(),
            out_dir: out.path().to_path_buf(),
        })
        .await
        .expect("builds");
    let mut cycles = Vec::new();
    for runs in [1u32, 3, 2] {
        let outcome = board
            .run(
                &artifact,
                &RunRequest::new(4, runs, Duration::from_secs(120)),
            )
            .await
            .expect("runs");
        assert!(outcome.valid, "{:?}", outcome.error);
        assert_eq!(outcome.samples.len(), runs as usize);
        for sample in &outcome.samples {
            cycles.push((sample.modeled_cycles.expect("cycles"), sample.counters));
        }
    }
    let first = cycles[0];
    assert!(first.0 > 0);
    assert!(cycles.iter().all(|c| *c == first), "{cycles:?}");
    // A rebuild of the same sources gives the same model too.
    let again = build_and_run(&board, &dir, d, 4, 1).await.expect("runs");
    assert_eq!(again.modeled_cycles, Some(first.0));
}
