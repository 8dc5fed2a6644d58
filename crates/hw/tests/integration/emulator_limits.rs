//! Capacity limits, errors and confinement of the emulator: every limit of
//! the chip spec fails the run with a message naming it, compile errors come
//! back with the compiler's message, a hanging kernel is killed at the
//! timeout, a kernel that turns wrong after its first execution is
//! reported invalid on every later one, and an output element left NaN
//! fails the harness's check wherever it stands.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use std::time::{Duration, Instant};

use emulator_support::*;
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::host::HostBoard;
use mtswarm_hw::{BackendKind, Board, BuildRequest, ChipSpec, HwError, RunRequest};

async fn capacity_error(kernel_c: &str, board: &EmulatorBoard, cores: u32) -> String {
    let dir = fixture(kernel_c);
    match build_and_run(
        board,
        dir.path(),
        defines("vecadd", &[("N", "4096")]),
        cores,
        1,
    )
    .await
    {
        Err(HwError::Capacity(msg)) => msg,
        other => panic!("expected a capacity error, got {other:?}"),
    }
}

/// Device code of `prelude` and `body` is refused on `board` as over a
/// capacity, with a message naming every one of `needles`.
async fn assert_capacity_error(
    prelude: &str,
    body: &str,
    board: &EmulatorBoard,
    cores: u32,
    needles: &[&str],
) {
    let msg = capacity_error(&kernel_with_body(prelude, body), board, cores).await;
    for needle in needles {
        assert!(msg.contains(needle), "{needle}: {msg}");
    }
}

#[tokio::test]
async fn am_capacity_names_the_limit_and_follows_the_spec() {
    assert_capacity_error(
        "",
        "vector_malloc(800000);",
        &board(2),
        2,
        &[
            "AM capacity exceeded (786432 bytes per core",
            "vector_malloc(800000) on core",
        ],
    )
    .await;
    // The number comes from the spec, not the runtime.
    let spec = ChipSpec {
        am_bytes: 900_000,
        ..ChipSpec::default()
    };
    assert_capacity_error(
        "",
        "vector_malloc(950000);",
        &board_with_spec(2, spec),
        2,
        &["900000 bytes per core"],
    )
    .await;
}

#[tokio::test]
async fn am_buffer_count_names_the_limit() {
    assert_capacity_error(
        "",
        "for (int i = 0; i < 65; i++) vector_malloc(128);",
        &board(1),
        1,
        &["AM buffer limit exceeded (64 vector_malloc buffers per core)"],
    )
    .await;
}

#[tokio::test]
async fn sm_capacity_and_buffer_count_name_the_limits() {
    assert_capacity_error(
        "",
        "scalar_malloc(65537);",
        &board(1),
        1,
        &["SM capacity exceeded (65536 bytes per core"],
    )
    .await;
    assert_capacity_error(
        "",
        "for (int i = 0; i < 33; i++) scalar_malloc(16);",
        &board(1),
        1,
        &["SM buffer limit exceeded (32 scalar_malloc buffers per core)"],
    )
    .await;
}

#[tokio::test]
async fn a_stack_frame_larger_than_sm_is_a_capacity_error() {
    assert_capacity_error(
        "",
        "volatile double big[9000]; big[get_thread_id()] = 1.0; c[0] = big[0];",
        &board(1),
        1,
        &["vecadd_kernel needs a", "SM capacity exceeded"],
    )
    .await;
}

#[tokio::test]
async fn gsm_capacity_names_the_limit() {
    assert_capacity_error(
        "static double big[6291456 / 8 + 16] __gsm__;",
        "big[get_thread_id()] = 1.0;",
        &board(1),
        1,
        &["GSM capacity exceeded (6291456 bytes per cluster"],
    )
    .await;
}

#[tokio::test]
async fn more_than_a_cluster_of_cores_is_an_error() {
    match run_example("vecadd", &[("CORES", "25")], 24, 1).await {
        Err(HwError::Capacity(msg)) => {
            assert!(
                msg.contains("a cluster has 24 cores (cores_per_cluster)"),
                "{msg}"
            )
        }
        other => panic!("expected a capacity error, got {other:?}"),
    }
    // A slice cannot claim more cores than a cluster has.
    let err = EmulatorBoard::new(slice(25), ChipSpec::default()).expect_err("25 cores");
    assert!(err.to_string().contains("cores_per_cluster"), "{err}");
}

#[tokio::test]
async fn compile_errors_carry_the_compilers_message() {
    let dir = fixture("__global__ void vecadd_kernel(void) { this is not C; }\n");
    let out = tempfile::tempdir().expect("tempdir");
    let err = board(1)
        .build(&BuildRequest {
            kernel_dir: dir.path().to_path_buf(),
            defines: Default::default(),
            out_dir: out.path().to_path_buf(),
        })
        .await
        .expect_err("does not compile");
    match err {
        HwError::Compile(detail) => {
            let msg = detail.message();
            assert!(msg.starts_with("kernel.c"), "{msg}");
            assert!(msg.contains("error"), "{msg}");
        }
        other => panic!("expected a compile error, got {other}"),
    }
}

#[tokio::test]
async fn a_hanging_kernel_is_killed_at_the_timeout() {
    let kernel = kernel_with_body("", "volatile int spin = 1; while (spin) { }");
    let dir = fixture(&kernel);
    let board = board(2);
    let out = tempfile::tempdir().expect("tempdir");
    let artifact = board
        .build(&BuildRequest {
            kernel_dir: dir.path().to_path_buf(),
            defines: defines("vecadd", &[("N", "4096")]),
            out_dir: out.path().to_path_buf(),
        })
        .await
        .expect("builds");
    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = board
        .run(&artifact, &RunRequest::new(2, 1, timeout))
        .await
        .expect_err("hangs");
    let elapsed = started.elapsed();
    assert_eq!(err, HwError::Timeout(timeout));
    assert!(elapsed >= timeout, "returned early: {elapsed:?}");
    assert!(
        elapsed < timeout + Duration::from_secs(5),
        "killed late: {elapsed:?}"
    );
}

#[tokio::test]
async fn a_kernel_wrong_after_its_first_execution_is_caught_on_every_later_run() {
    let outcome = run_example("vecadd", &[("FAULT_AFTER", "1")], 2, 4)
        .await
        .expect("runs");
    assert!(!outcome.valid);
    assert_eq!(outcome.samples.len(), 4);
    assert!(outcome.samples[0].valid, "{:?}", outcome.samples[0]);
    for sample in &outcome.samples[1..] {
        assert!(!sample.valid);
        assert!(
            sample
                .error
                .as_deref()
                .is_some_and(|e| e.contains("exceeds tolerance")),
            "{sample:?}"
        );
    }
    let clean = run_example("vecadd", &[], 2, 4).await.expect("runs");
    assert!(clean.valid && clean.samples.iter().all(|s| s.valid));
}

/// An output element left NaN fails the check wherever it stands, not only
/// as the last one (a NaN error must not be replaced by the next finite one).
#[tokio::test]
async fn an_output_element_left_nan_is_invalid_wherever_it_stands() {
    let kernel = kernel_with_body(
        "",
        "if (get_thread_id() != 0) return;\n\
         for (uint64_t i = 0; i < n; i++) c[i] = a[i] + b[i];\n\
         c[0] = __builtin_nan(\"\");",
    );
    let dir = fixture(&kernel);
    let outcome = build_and_run(
        &board(1),
        dir.path(),
        defines("vecadd", &[("N", "4096")]),
        1,
        1,
    )
    .await
    .expect("runs");
    assert!(!outcome.valid, "{outcome:?}");
    assert_eq!(outcome.max_abs_err, None, "{outcome:?}");
}

#[tokio::test]
async fn the_spec_drives_the_model() {
    let dir = kernels_dir().join("vecadd");
    let d = defines("vecadd", &[]);
    let fast = run_example("vecadd", &[], 2, 1).await.expect("runs");
    let slow_spec = ChipSpec {
        ddr_bandwidth: ChipSpec::default().ddr_bandwidth / 2.0,
        ..ChipSpec::default()
    };
    let slow = build_and_run(&board_with_spec(2, slow_spec), &dir, d, 2, 1)
        .await
        .expect("runs");
    let ratio =
        slow.modeled_cycles.expect("cycles") as f64 / fast.modeled_cycles.expect("cycles") as f64;
    // vecadd is bandwidth-bound: half the bandwidth, about twice the time.
    assert!((1.8..=2.05).contains(&ratio), "ratio {ratio}");
}

#[tokio::test]
async fn every_example_kernel_is_valid_at_its_defaults() {
    for kernel in ["vecadd", "dgemm", "spmv", "stencil2d"] {
        let outcome = run_example(kernel, &[], 2, 2)
            .await
            .unwrap_or_else(|e| panic!("{kernel}: {e}"));
        assert!(outcome.valid, "{kernel}: {:?}", outcome.error);
        assert!(
            outcome.peak_fraction > 0.0 && outcome.peak_fraction <= 1.0,
            "{kernel}"
        );
        assert!(outcome.counters.dma_bytes > 0, "{kernel} moves data by DMA");
    }
}

#[tokio::test]
async fn the_host_backend_runs_the_same_directory_with_wall_clock_time() {
    let board = HostBoard::new(slice(2), ChipSpec::default())
        .expect("slice")
        .with_cache_dir(cache_dir());
    assert_eq!(board.backend(), BackendKind::Host);
    let out = tempfile::tempdir().expect("tempdir");
    let artifact = board
        .build(&BuildRequest {
            kernel_dir: kernels_dir().join("vecadd"),
            defines: defines("vecadd", &[]),
            out_dir: out.path().to_path_buf(),
        })
        .await
        .expect("builds");
    assert_eq!(artifact.backend, BackendKind::Host);
    let outcome = board
        .run(&artifact, &RunRequest::new(2, 2, Duration::from_secs(60)))
        .await
        .expect("runs");
    assert!(outcome.valid, "{:?}", outcome.error);
    assert_eq!(outcome.modeled_cycles, None);
    assert!(outcome.seconds > 0.0 && outcome.gflops > 0.0);
    assert_eq!(outcome.samples.len(), 2);
}
