//! The harness is not the agent's: write_file and apply_patch refuse
//! host.c and tune.toml, and a harness changed on disk behind the tools'
//! back is not the one that builds and runs (the pristine one is, and its
//! hash is in the result).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::{
    call, call_ok, emulator_board, examples_dir, invalid_args, toolset, valid_modeled_outcome,
    vecadd_workspace,
};
use mtswarm_core::ToolOutput;
use mtswarm_hw::harness::file_hash;
use mtswarm_tools::ToolSet;
use serde_json::json;

fn tools() -> (tempfile::TempDir, ToolSet) {
    let ws = vecadd_workspace();
    let tools = toolset(ws.path(), Arc::new(emulator_board(2)));
    (ws, tools)
}

#[tokio::test]
async fn the_file_tools_refuse_harness_files() {
    let (ws, tools) = tools();
    let original = std::fs::read_to_string(ws.path().join("vecadd/host.c")).expect("host.c");
    for path in ["vecadd/host.c", "vecadd/tune.toml", "./vecadd/host.c"] {
        let msg = invalid_args(
            call(
                &tools,
                "write_file",
                json!({"path": path, "content": "int main(){}"}),
            )
            .await,
        );
        assert!(
            msg.contains("harness") && msg.contains("read-only"),
            "{msg}"
        );
    }
    let patch = "--- a/vecadd/tune.toml\n+++ b/vecadd/tune.toml\n@@ -1 +1 @@\n-# c = a + b over N doubles: bandwidth-bound.\n+# mine now\n";
    let msg = invalid_args(call(&tools, "apply_patch", json!({"patch": patch})).await);
    assert!(msg.contains("read-only"), "{msg}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("vecadd/host.c")).expect("host.c"),
        original
    );
    // The kernel itself stays the agent's to edit.
    let kernel = std::fs::read_to_string(ws.path().join("vecadd/kernel.c")).expect("kernel.c");
    call(
        &tools,
        "write_file",
        json!({"path": "vecadd/kernel.c", "content": kernel}),
    )
    .await
    .expect("kernel.c is writable");
}

#[tokio::test]
async fn a_harness_changed_on_disk_is_not_used() {
    let (ws, tools) = tools();
    // Behind the tools' back: a "harness" that reports success without
    // running anything, at an absurd rate.
    std::fs::write(
        ws.path().join("vecadd/host.c"),
        "#include <stdio.h>\nint main(void) { puts(\"MTSWARM_RESULT {\\\"valid\\\":true,\\\"flops\\\":1e15}\"); return 0; }\n",
    )
    .expect("tamper");
    call_ok(
        &tools,
        "compile",
        json!({"kernel_dir": "vecadd", "defines": "N=16384,CHUNK=1024"}),
    )
    .await;
    let out = call_ok(&tools, "run", json!({"cores": 2})).await;
    // The pristine harness ran the kernel (the tampered one never would).
    let outcome = valid_modeled_outcome(&out);
    let pristine = file_hash(&examples_dir().join("vecadd/host.c")).expect("hash");
    assert_eq!(
        outcome["harness"]["host.c"],
        json!(pristine),
        "{}",
        out.content
    );
    assert!(
        outcome["harness"]["tune.toml"].is_string(),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn an_edited_kernel_builds_with_its_diff_against_the_registered_pristine_source() {
    let (ws, tools) = tools();
    let pristine =
        std::fs::read_to_string(examples_dir().join("vecadd/kernel.c")).expect("kernel.c");
    // Edited before the session's first build (a resumed session finds its
    // earlier edits): the kernel root's copy is still the pristine one.
    let edited = pristine.replace(
        "const mtswarm_vdouble one = vec_svbcast(1.0);",
        "const mtswarm_vdouble one = vec_svbcast(1.0); /* edited */",
    );
    assert_ne!(edited, pristine);
    std::fs::write(ws.path().join("vecadd/kernel.c"), &edited).expect("edit");
    tools
        .register_pristine("vecadd", &examples_dir().join("vecadd"))
        .expect("register");
    let defines = json!({"N": "16384", "CHUNK": "1024"});
    let built = compile_vecadd(&tools, &defines).await;
    let data = built.data.as_ref().expect("data");
    assert_eq!(data["source_edited"], true, "{data}");
    assert_eq!(data["source_changes"], "kernel.c +1 -1", "{data}");
    let diff = data["source_diff"].as_str().expect("a diff");
    assert!(
        diff.starts_with("--- a/kernel.c\n+++ b/kernel.c\n") && diff.contains("/* edited */"),
        "{diff}"
    );
    assert!(
        built.content.contains("edited sources"),
        "{}",
        built.content
    );
    let bench = benchmark_once(&tools).await;
    let data = bench.data.as_ref().expect("data");
    assert_eq!(data["source"]["edited"], true, "{data}");
    assert_eq!(data["source"]["diff"], diff);
    assert_eq!(data["summary"]["source_edited"], true);
    assert!(bench.content.contains("built from edited sources"));

    // Back to the pristine text: no diff, and the hash of the pristine build.
    std::fs::write(ws.path().join("vecadd/kernel.c"), &pristine).expect("revert");
    let built = compile_vecadd(&tools, &defines).await;
    let data = built.data.as_ref().expect("data");
    assert!(data.get("source_diff").is_none() && data.get("source_edited").is_none());
    let bench = benchmark_once(&tools).await;
    let data = bench.data.as_ref().expect("data");
    assert_eq!(data["source"]["edited"], false, "{data}");
    assert_eq!(data["source"]["diff"], "");
}

/// One timed execution on two cores, no warm-up, of the latest artifact.
async fn benchmark_once(tools: &ToolSet) -> ToolOutput {
    call_ok(
        tools,
        "benchmark",
        json!({"cores": 2, "warmup": 0, "repeats": 1}),
    )
    .await
}

/// The workspace's vecadd compiled with `defines`.
async fn compile_vecadd(tools: &ToolSet, defines: &serde_json::Value) -> ToolOutput {
    call_ok(
        tools,
        "compile",
        json!({"kernel_dir": "vecadd", "defines": defines}),
    )
    .await
}
