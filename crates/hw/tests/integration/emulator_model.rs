//! Properties of the cycle model a tuner relies on: scalar work costs cycles
//! however it is unrolled, asynchronous double buffering hides transfer
//! time, and the DMA bandwidth is shared by the cores of the group.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use emulator_support::*;

async fn cycles_of(kernel_c: &str, cores: u32) -> u64 {
    let dir = fixture(kernel_c);
    let outcome = build_and_run(
        &board(cores),
        dir.path(),
        defines("vecadd", &[("N", "4096")]),
        cores,
        1,
    )
    .await
    .expect("runs");
    // The fixture does not compute c, so the harness reports it invalid;
    // the model's figures are still there.
    outcome.samples[0].modeled_cycles.expect("cycles")
}

fn scalar_chain(unroll: u32) -> String {
    kernel_with_body(
        "",
        &format!(
            "double s = (double)n;\n#pragma GCC unroll {unroll}\n\
             for (int i = 0; i < 65536; i++) s = s * 0.999 + 1.0;\n\
             c[get_thread_id()] = s;"
        ),
    )
}

#[tokio::test]
async fn unrolling_scalar_code_does_not_make_it_free() {
    let rolled = cycles_of(&scalar_chain(1), 1).await;
    let unrolled = cycles_of(&scalar_chain(16), 1).await;
    eprintln!("scalar chain: rolled {rolled} cycles, unrolled x16 {unrolled}");
    // 65536 dependent multiply-adds in scalar code: at least ~2 instructions
    // each over 5 issue slots, whatever the unrolling.
    assert!(unrolled as f64 >= 65536.0 * 2.0 / 5.0, "{unrolled}");
    // Unrolling saves the loop's own instructions (as on the board), not
    // the arithmetic.
    assert!(
        (unrolled as f64) > rolled as f64 / 3.0,
        "rolled {rolled}, unrolled {unrolled}"
    );
}

#[tokio::test]
async fn double_buffering_hides_transfer_time() {
    let single = run_example("stencil2d", &[("BUF", "1")], 2, 1)
        .await
        .expect("runs");
    let double = run_example("stencil2d", &[("BUF", "2")], 2, 1)
        .await
        .expect("runs");
    let (s, d) = (
        single.modeled_cycles.expect("cycles"),
        double.modeled_cycles.expect("cycles"),
    );
    assert!(single.valid && double.valid);
    assert!(d < s, "double {d} vs single {s}");
    // Overlap shows up as fewer stall cycles, not as less data moved.
    assert_eq!(single.counters.dma_bytes, double.counters.dma_bytes);
    assert!(double.counters.stall_cycles < single.counters.stall_cycles);
}

#[tokio::test]
async fn a_bandwidth_bound_kernel_does_not_scale_with_cores() {
    let two = run_example("vecadd", &[], 2, 1).await.expect("runs");
    let eight = run_example("vecadd", &[], 8, 1).await.expect("runs");
    let ratio =
        two.modeled_cycles.expect("cycles") as f64 / eight.modeled_cycles.expect("cycles") as f64;
    // The cluster's DDR bandwidth is shared: 4x the cores, about the same time.
    assert!((0.8..1.3).contains(&ratio), "2 -> 8 cores: {ratio}");
}
