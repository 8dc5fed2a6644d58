//! analyze_kernel and estimate: happy paths on the shipped examples and bad
//! inputs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::{assert_refused, call, call_ok, scripted_tools, vecadd_workspace};
use mtswarm_core::Effect;
use mtswarm_hw::{BackendKind, ChipSpec};
use serde_json::json;

fn setup() -> (tempfile::TempDir, mtswarm_tools::ToolSet) {
    let ws = vecadd_workspace();
    let tools = scripted_tools(ws.path(), BackendKind::Emulator);
    (ws, tools)
}

#[tokio::test]
async fn analyze_kernel_reports_loops_intrinsics_dma_and_footprint() {
    let (_ws, tools) = setup();
    let out = call(
        &tools,
        "analyze_kernel",
        json!({"path": "vecadd/kernel.c", "defines": "CHUNK=2048,BUF=2"}),
    )
    .await
    .expect("analyze");
    let a = &out.data.expect("data")["analysis"];
    assert_eq!(a["kernels"], json!(["vecadd_kernel"]));
    assert!(a["intrinsics"]["vec_mula"].as_u64() >= Some(1), "{a}");
    assert!(a["intrinsics"]["vec_ld"].as_u64() >= Some(2), "{a}");
    assert!(a["dma_calls"]["dma_wait"].as_u64() >= Some(2), "{a}");
    assert!(
        a["dma_calls"]["vector_load_async"].as_u64() >= Some(2),
        "{a}"
    );
    assert_eq!(a["async_dma"], true);
    assert_eq!(a["max_loop_depth"], 2);
    // Two vector_malloc(CHUNK * sizeof(double)) per buffer, BUF buffers.
    let am = a["footprint"]
        .as_array()
        .expect("footprint")
        .iter()
        .find(|f| f["level"] == "AM")
        .expect("AM");
    assert_eq!(am["buffers"], 4, "{am}");
    assert_eq!(am["known_bytes"], 4 * 2048 * 8, "{am}");
    assert_eq!(am["over_capacity"], false);
    assert!(
        out.content.contains("AM: 4 buffers, 65536 of"),
        "{}",
        out.content
    );

    // The same code with a chunk too large for AM is flagged.
    let out = call(
        &tools,
        "analyze_kernel",
        json!({"path": "vecadd/kernel.c", "defines": {"CHUNK": 65536}}),
    )
    .await
    .expect("analyze");
    assert!(out.content.contains("OVER CAPACITY"), "{}", out.content);
}

#[tokio::test]
async fn analyze_kernel_handles_gsm_and_unknown_sizes() {
    let (ws, tools) = setup();
    std::fs::write(
        ws.path().join("k.c"),
        "#define M 256\n__gsm__ double tile[M][M];\n/* vector_malloc(1<<40) in a comment */\n__global__ void f(int n) {\n  double *x = scalar_malloc(n * 8);\n  group_barrier(0);\n}\n",
    )
    .expect("write");
    let out = call(&tools, "analyze_kernel", json!({"path": "k.c"}))
        .await
        .expect("analyze");
    let a = &out.data.expect("data")["analysis"];
    let level = |name: &str| {
        a["footprint"]
            .as_array()
            .expect("fp")
            .iter()
            .find(|f| f["level"] == name)
            .cloned()
            .expect("level")
    };
    assert_eq!(level("GSM")["known_bytes"], 256 * 256 * 8);
    assert_eq!(level("SM")["unknown_sizes"], 1);
    assert_eq!(level("AM")["buffers"], 0, "comments are not code");
    assert_eq!(a["barriers"]["group_barrier"], 1);
    assert_eq!(a["uses_vectors"], false);
}

#[tokio::test]
async fn analyze_kernel_rejects_bad_input() {
    let (_ws, tools) = setup();
    assert_refused(
        &tools,
        &[
            ("analyze_kernel", json!({"path": "missing.c"}), "missing.c"),
            ("analyze_kernel", json!({"path": "/etc/passwd"}), "absolute"),
            (
                "analyze_kernel",
                json!({"defines": [{"N": [1]}]}),
                "defines",
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn estimate_gives_the_roofline_bound() {
    let (_ws, tools) = setup();
    let spec = ChipSpec::default();
    // DGEMM 1024^3 on 8 cores: 2 GFLOP, 24 MiB of traffic -> compute-bound.
    let flops = 2.0 * 1024f64.powi(3);
    let out = call_ok(
        &tools,
        "estimate",
        json!({"flops": flops, "bytes": "25165824", "cores": 8}),
    )
    .await;
    let data = out.data.clone().expect("data");
    assert_eq!(data["bound_by"], "compute-bound");
    let expected = flops / spec.peak_flops(8);
    assert!((data["bound_seconds"].as_f64().expect("s") - expected).abs() < 1e-12);
    assert!(out.effects.contains(&Effect::State {
        key: "optimization_mode".into(),
        value: json!("compute-bound"),
        append: false
    }));
    // vecadd: 1 flop per 24 bytes -> memory-bound at the cluster's bandwidth.
    let out = call_ok(
        &tools,
        "estimate",
        json!({"flops": 1e6, "bytes": 24e6, "measured_seconds": 0.001}),
    )
    .await;
    let data = out.data.expect("data");
    assert_eq!(data["bound_by"], "memory-bound");
    let bound = 24e6 / spec.cluster_bandwidth();
    assert!((data["bound_seconds"].as_f64().expect("s") - bound).abs() < 1e-12);
    assert!((data["fraction_of_bound"].as_f64().expect("f") - bound / 0.001).abs() < 1e-9);
}

#[tokio::test]
async fn estimate_rejects_bad_input() {
    let (_ws, tools) = setup();
    assert_refused(
        &tools,
        &[
            (
                "estimate",
                json!({"flops": 0, "bytes": 1}),
                "flops must be positive",
            ),
            (
                "estimate",
                json!({"flops": 1, "bytes": 1, "cores": 9}),
                "1..=8",
            ),
            ("estimate", json!({"flops": "a lot", "bytes": 1}), "`flops`"),
            ("estimate", json!({"bytes": 1}), "flops"),
        ],
    )
    .await;
}
