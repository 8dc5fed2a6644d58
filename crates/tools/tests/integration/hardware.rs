//! compile / run / validate / benchmark / board_info: happy paths on the
//! shipped emulator with the vecadd example, bad inputs, stale artifacts,
//! and wrong-answer kernels that must never get a benchmark figure.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::{
    GOOD_KERNEL, ScriptedBoard, assert_refused, call, call_ok, emulator_board, invalid_args,
    scripted_tools, toolset, valid_modeled_outcome, vecadd_workspace, workspace_with,
};
use mtswarm_core::{Effect, ToolError, ToolOutput};
use mtswarm_hw::BackendKind;
use mtswarm_hw::measure::MeasureConfig;
use mtswarm_tools::ToolSet;
use serde_json::{Value, json};

fn emulator_tools() -> (tempfile::TempDir, ToolSet) {
    let ws = vecadd_workspace();
    let tools = ToolSet::builder(ws.path(), Arc::new(emulator_board(4)))
        .measure_defaults(MeasureConfig {
            warmup: 1,
            min_repeats: 3,
            runs_per_launch: 3,
            ..MeasureConfig::default()
        })
        .build()
        .expect("tools");
    (ws, tools)
}

fn evidence(out: &ToolOutput, kind: &str) -> Option<bool> {
    out.effects.iter().find_map(|e| match e {
        Effect::Evidence {
            kind: k, passed, ..
        } if k == kind => Some(*passed),
        _ => None,
    })
}

fn state<'a>(out: &'a ToolOutput, key: &str) -> Option<&'a Value> {
    out.effects.iter().find_map(|e| match e {
        Effect::State { key: k, value, .. } if k == key => Some(value),
        _ => None,
    })
}

const SMALL: &str = "N=16384,CHUNK=1024";

/// Emulator tools with the small vecadd built as artifact `b1`.
async fn small_vecadd_built() -> (tempfile::TempDir, ToolSet) {
    let (ws, tools) = emulator_tools();
    call_ok(
        &tools,
        "compile",
        json!({"kernel_dir": "vecadd", "defines": SMALL}),
    )
    .await;
    (ws, tools)
}

#[tokio::test]
async fn emulator_compile_run_validate_benchmark_happy_path() {
    let (_ws, tools) = emulator_tools();
    let out = call_ok(
        &tools,
        "compile",
        json!({"kernel_dir": "vecadd", "defines": SMALL}),
    )
    .await;
    let compiled = state(&out, "compile_results").expect("compile_results effect");
    assert_eq!(compiled["artifact"], "b1");
    assert_eq!(compiled["defines"], json!({"N": "16384", "CHUNK": "1024"}));

    let out = call_ok(&tools, "run", json!({"cores": "2"})).await;
    valid_modeled_outcome(&out);

    let out = call_ok(&tools, "validate", json!({"artifact": "b1"})).await;
    assert_eq!(evidence(&out, "validate"), Some(true), "{}", out.content);

    let out = call_ok(&tools, "benchmark", json!({"artifact": "b1", "cores": 4})).await;
    assert_eq!(evidence(&out, "benchmark"), Some(true), "{}", out.content);
    let summary = state(&out, "benchmark_results").expect("benchmark_results");
    assert_eq!(summary["valid"], true);
    assert_eq!(summary["backend"], "emulator");
    assert_eq!(summary["slice"], "emu0/c0");
    assert!(summary["median_seconds"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(
        summary["kernel_hash"]
            .as_str()
            .is_some_and(|h| h.len() == 64)
    );
    let candidates = state(&out, "current_candidates").expect("candidates");
    assert_eq!(candidates[0]["artifact"], "b1");
    assert!(state(&out, "best").is_some());

    let out = call_ok(&tools, "board_info", json!({})).await;
    assert!(
        out.content
            .contains("slice emu0/c0 (emulator backend, 4 cores)"),
        "{}",
        out.content
    );
    assert_eq!(out.data.expect("data")["artifacts"], json!(["b1"]));
}

/// The plausibility check's reference is the session's own first valid
/// benchmark: a `baseline_seconds` a model writes into a benchmark call (a
/// small one copies figures from elsewhere) is dropped, so it can neither
/// flag an honest figure as implausibly fast nor clear a suspicious one.
#[tokio::test]
async fn a_baseline_a_model_writes_does_not_flag_the_measurement() {
    let (_ws, tools) = small_vecadd_built().await;
    let out = call_ok(
        &tools,
        "benchmark",
        json!({"artifact": "b1", "cores": 4, "baseline_seconds": 120}),
    )
    .await;
    let summary = state(&out, "benchmark_results").expect("benchmark_results");
    assert_eq!(summary["valid"], true, "{}", out.content);
    assert!(
        summary["flags"].as_array().is_none_or(Vec::is_empty) && !out.content.contains("FLAG"),
        "a model's baseline flagged the measurement: {}",
        out.content
    );
    assert_eq!(evidence(&out, "benchmark"), Some(true), "{}", out.content);
}

/// A model that calls compile and validate in one reply names the artifact
/// it cannot know yet with a placeholder: that means the latest build, and
/// the answer names which one it was. A name of the session's own shape
/// that was never built is still refused.
#[tokio::test]
async fn a_placeholder_artifact_means_the_latest_build() {
    let (_ws, tools) = small_vecadd_built().await;
    let out = call_ok(
        &tools,
        "validate",
        json!({"artifact": "compile_result", "cores": 4}),
    )
    .await;
    assert!(out.content.contains("artifact b1"), "{}", out.content);
    assert_eq!(evidence(&out, "validate"), Some(true), "{}", out.content);
    let refused = invalid_args(call(&tools, "benchmark", json!({"artifact": "b7"})).await);
    assert!(refused.contains("unknown artifact `b7`"), "{refused}");
}

/// The emulator's modeled cycles are exact: one launch is the measurement,
/// a benchmark is validation evidence too, and `repeats: 2` asks for a spot
/// re-run with the same inputs, which reproduces the figure.
#[tokio::test]
async fn emulator_benchmark_is_one_launch_and_its_spot_rerun_reproduces_it() {
    let (_ws, tools) = small_vecadd_built().await;
    let out = call_ok(&tools, "board_info", json!({})).await;
    assert!(
        out.content.contains("measurement: exact timing"),
        "{}",
        out.content
    );

    let out = call_ok(&tools, "benchmark", json!({})).await;
    assert_eq!(evidence(&out, "validate"), Some(true), "{}", out.content);
    assert_eq!(evidence(&out, "benchmark"), Some(true), "{}", out.content);
    let m = &out.data.as_ref().expect("data")["measurement"];
    assert_eq!(m["exact"], true, "{m}");
    // The session's first figure is its best so far: always reproduced, by
    // a second launch with the same inputs and one more execution on others.
    assert_eq!(m["spot_checked"], true, "{m}");
    assert_eq!(m["launches"], 2, "{m}");
    assert!(m["flags"].as_array().is_some_and(Vec::is_empty), "{m}");
    let cycles: Vec<u64> = m["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .filter_map(|s| s["modeled_cycles"].as_u64())
        .collect();
    assert_eq!(cycles.len(), 3, "{m}");
    assert!(cycles.iter().all(|c| *c == cycles[0]), "{cycles:?}");
    assert!(
        out.content.contains("reproduced by a spot re-run"),
        "{}",
        out.content
    );

    // A slower candidate is not a best: one launch, or two when a spot
    // re-run is drawn at random.
    call_ok(
        &tools,
        "compile",
        json!({"kernel_dir": "vecadd", "defines": "N=16384,CHUNK=256,BUF=1"}),
    )
    .await;
    let out = call_ok(&tools, "benchmark", json!({})).await;
    let m = &out.data.as_ref().expect("data")["measurement"];
    let slower = m["samples"][0]["modeled_cycles"].as_u64().expect("cycles");
    assert!(slower > cycles[0], "{slower} vs {}", cycles[0]);
    let launches = m["launches"].as_u64().expect("launches");
    let checked = m["spot_checked"] == true;
    assert_eq!(launches, if checked { 2 } else { 1 }, "{m}");

    // Asking for repeats asks for the check.
    let out = call_ok(&tools, "benchmark", json!({"repeats": 2})).await;
    let m = &out.data.as_ref().expect("data")["measurement"];
    assert_eq!(m["spot_checked"], true, "{m}");
    assert_eq!(m["launches"], 2, "{m}");
    assert!(
        out.content.contains("reproduced by a spot re-run"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn emulator_fault_after_first_run_gets_no_benchmark_figure() {
    let (_ws, tools) = emulator_tools();
    call_ok(&tools, "compile", json!({"kernel_dir": "vecadd", "defines": format!("{SMALL},FAULT_AFTER=1"), "unchecked": true})).await;
    // The session's first figure would be its best, so it is spot-checked,
    // and the check's execution on other inputs goes wrong.
    let out = call_ok(&tools, "benchmark", json!({})).await;
    assert_eq!(evidence(&out, "benchmark"), Some(false), "{}", out.content);
    let summary = state(&out, "benchmark_results").expect("results");
    assert_eq!(summary["valid"], false);
    assert!(
        summary["median_seconds"].is_null() && summary["gflops"].is_null(),
        "{summary}"
    );
    assert!(state(&out, "current_candidates").is_none());
    assert!(out.content.contains("no timing"), "{}", out.content);
    // It was right at first: validation passed, a later execution failed.
    let m = &out.data.expect("data")["measurement"];
    assert_eq!(m["failed_validation"], false, "{m}");
    assert!(
        m["error"]
            .as_str()
            .unwrap_or("")
            .contains("exceeds tolerance"),
        "{m}"
    );
}

#[tokio::test]
async fn wrong_answer_fails_validation_before_any_timing() {
    let ws = workspace_with(&GOOD_KERNEL.replace("* 2.0", "* 2.0 /* WRONG */"));
    let board = Arc::new(ScriptedBoard::new(BackendKind::Host));
    let tools = toolset(ws.path(), board.clone());
    call_ok(&tools, "compile", json!({})).await;
    let out = call_ok(&tools, "validate", json!({})).await;
    assert_eq!(evidence(&out, "validate"), Some(false));
    let before = board.launches.load(Ordering::SeqCst);
    let out = call_ok(&tools, "benchmark", json!({})).await;
    assert_eq!(evidence(&out, "benchmark"), Some(false));
    // Only the validation launch ran: nothing was timed.
    assert_eq!(board.launches.load(Ordering::SeqCst) - before, 1);
    let m = &out.data.expect("data")["measurement"];
    assert_eq!(m["failed_validation"], true);
    assert!(m["stats"].is_null() && m["samples"].as_array().is_some_and(Vec::is_empty));
}

#[tokio::test]
async fn kernel_wrong_on_later_runs_is_caught_by_benchmark() {
    let ws = workspace_with(&GOOD_KERNEL.replace("* 2.0", "* 2.0 /* WRONG_LATER */"));
    let tools = scripted_tools(ws.path(), BackendKind::Host);
    call_ok(&tools, "compile", json!({})).await;
    // Without warm-up the first timed execution must catch it.
    let out = call_ok(&tools, "benchmark", json!({"warmup": "0"})).await;
    assert_eq!(evidence(&out, "benchmark"), Some(false), "{}", out.content);
    let m = &out.data.expect("data")["measurement"];
    assert_eq!(m["failed_validation"], false);
    assert!(m["stats"].is_null() && m["gflops"].is_null());
    assert!(
        m["error"]
            .as_str()
            .unwrap_or("")
            .starts_with("timed execution 1"),
        "{m}"
    );
}

#[tokio::test]
async fn hardware_tools_reject_bad_input() {
    let ws = workspace_with(GOOD_KERNEL);
    let tools = scripted_tools(ws.path(), BackendKind::Host);
    assert_refused(
        &tools,
        &[
            ("run", json!({}), "compile first"),
            ("validate", json!({}), "compile first"),
            ("benchmark", json!({}), "compile first"),
            ("compile", json!({"kernel_dir": "nope"}), "not a directory"),
            ("compile", json!({"kernel_dir": "../.."}), "`..`"),
        ],
    )
    .await;

    call_ok(&tools, "compile", json!({"defines": ["-DN=64"]})).await;
    assert_refused(&tools, &[("run", json!({"cores": 99}), "1..=8")]).await;
    let msg = invalid_args(call(&tools, "run", json!({"artifact": "b7"})).await);
    assert!(
        msg.contains("unknown artifact `b7`") && msg.contains("b1"),
        "{msg}"
    );
    assert_refused(
        &tools,
        &[
            (
                "validate",
                json!({"timeout_seconds": -1}),
                "timeout_seconds",
            ),
            ("benchmark", json!({"repeats": 0}), "repeats"),
            ("board_info", json!({"verbose": true}), "verbose"),
        ],
    )
    .await;

    // A compile error is a failed call with the compiler's message.
    std::fs::write(ws.path().join("kernel.c"), "SYNTAX_ERROR").expect("write");
    match call(&tools, "compile", json!({})).await {
        Err(ToolError::Failed(msg)) => assert!(msg.contains("expected ';'"), "{msg}"),
        other => panic!("expected a compile failure, got {other:?}"),
    }
}

#[tokio::test]
async fn artifacts_built_before_an_edit_are_refused() {
    let ws = workspace_with(GOOD_KERNEL);
    let tools = scripted_tools(ws.path(), BackendKind::Host);
    call_ok(&tools, "compile", json!({})).await;
    call(&tools, "validate", json!({}))
        .await
        .expect("validate before the edit");
    call(
        &tools,
        "write_file",
        json!({"path": "kernel.c", "content": GOOD_KERNEL.replace("2.0", "4.0")}),
    )
    .await
    .expect("edit");
    let msg = invalid_args(call(&tools, "benchmark", json!({})).await);
    assert!(msg.contains("before the latest source edit"), "{msg}");
    // Editing a note does not make the build stale.
    call(&tools, "compile", json!({})).await.expect("recompile");
    call(
        &tools,
        "write_file",
        json!({"path": "notes.md", "content": "x"}),
    )
    .await
    .expect("note");
    let out = call_ok(&tools, "benchmark", json!({})).await;
    assert_eq!(evidence(&out, "benchmark"), Some(true), "{}", out.content);
}

#[tokio::test]
async fn hardware_tools_declare_the_slice_as_their_resource() {
    let ws = workspace_with(GOOD_KERNEL);
    let tools = scripted_tools(ws.path(), BackendKind::Host);
    for name in ["run", "validate", "benchmark"] {
        let tool = tools.get(name).expect("tool");
        assert!(
            tool.spec().needs_hardware && tool.spec().concurrency_safe && !tool.spec().read_only,
            "{name}"
        );
        assert_eq!(tool.resource().as_deref(), Some("fake0/c1"), "{name}");
        assert_eq!(tool.spec().risk, mtswarm_core::Risk::Medium, "{name}");
    }
    for name in [
        "compile",
        "wait_build",
        "read_file",
        "list_files",
        "grep",
        "analyze_kernel",
        "estimate",
        "board_info",
    ] {
        let tool = tools.get(name).expect("tool");
        assert!(
            !tool.spec().needs_hardware && tool.spec().concurrency_safe,
            "{name}"
        );
        assert_eq!(tool.spec().risk, mtswarm_core::Risk::Low, "{name}");
        assert!(
            tool.spec().schema()["properties"].is_object() || name == "board_info",
            "{name}"
        );
    }
    assert_eq!(tools.names().len(), 13);
    let mut registry = mtswarm_core::ToolRegistry::new();
    tools.register_all(&mut registry).expect("register");
    assert_eq!(registry.names().count(), 13);
    assert!(
        tools.register_all(&mut registry).is_err(),
        "names are unique"
    );
}

#[tokio::test]
async fn a_background_build_is_collected_by_wait_build_and_never_run_before() {
    let ws = workspace_with(GOOD_KERNEL);
    let mut board = ScriptedBoard::new(BackendKind::Emulator);
    board.build_time = std::time::Duration::from_millis(300);
    let board = Arc::new(board);
    let tools = toolset(ws.path(), board.clone());
    let started = call(&tools, "compile", json!({"background": "true"}))
        .await
        .expect("background compile");
    assert!(
        started.content.contains("artifact b1"),
        "{}",
        started.content
    );
    assert!(
        state(&started, "compile_results").is_none(),
        "nothing is compiled yet: {}",
        started.content
    );
    // The build is still running: the slice is not taken for it.
    let refused = invalid_args(call(&tools, "validate", json!({"artifact": "b1"})).await);
    assert!(refused.contains("wait_build"), "{refused}");
    assert_eq!(board.launches.load(Ordering::SeqCst), 0);

    let done = call_ok(&tools, "wait_build", json!({"artifact": "b1"})).await;
    assert!(
        done.content.starts_with("compiled . as artifact b1"),
        "{}",
        done.content
    );
    assert_eq!(
        state(&done, "compile_results").expect("compile_results")["artifact"],
        "b1"
    );
    assert_eq!(board.build_intervals.lock().expect("builds").len(), 1);
    let out = call_ok(&tools, "validate", json!({"artifact": "b1"})).await;
    assert_eq!(evidence(&out, "validate"), Some(true), "{}", out.content);
    // Nobody held the slice while the build finished: the slice waited.
    assert!(
        done.content
            .contains(mtswarm_tools::hardware::SLICE_IDLE_NOTE),
        "{}",
        done.content
    );
    // Waiting again reports the same build, without waiting.
    let again = call(&tools, "wait_build", json!({"artifact": "b1"}))
        .await
        .expect("wait_build again");
    assert_eq!(
        again.content.lines().next(),
        done.content.lines().next(),
        "{}",
        again.content
    );
    assert!(
        !again
            .content
            .contains(mtswarm_tools::hardware::SLICE_IDLE_NOTE)
    );

    std::fs::write(ws.path().join("kernel.c"), "SYNTAX_ERROR").expect("write");
    call(&tools, "compile", json!({"background": true}))
        .await
        .expect("background compile of a broken kernel");
    match call(&tools, "wait_build", json!({"artifact": "b2"})).await {
        Err(ToolError::Failed(msg)) => assert!(msg.contains("compile failed"), "{msg}"),
        other => panic!("expected the compile error, got {other:?}"),
    }
    let refused = invalid_args(call(&tools, "benchmark", json!({"artifact": "b2"})).await);
    assert!(refused.contains("did not build"), "{refused}");
    let unknown = invalid_args(call(&tools, "wait_build", json!({"artifact": "b9"})).await);
    assert!(unknown.contains("unknown artifact"), "{unknown}");
}

/// A model that leaves out `kernel_dir`, or names a file of the kernel
/// without its directory, means the session's only kernel; with several
/// kernels, or a wrong one, the error names those there are.
#[tokio::test]
async fn the_only_kernel_directory_is_the_default_and_errors_name_the_kernels() {
    let ws = vecadd_workspace();
    let tools = scripted_tools(ws.path(), BackendKind::Host);
    let out = call(&tools, "compile", json!({"defines": {"CHUNK": "1024"}}))
        .await
        .expect("compiles the only kernel directory");
    assert_eq!(
        state(&out, "compile_results").expect("compile_results")["kernel_dir"],
        "vecadd"
    );
    let read = call(&tools, "read_file", json!({"path": "tune.toml"}))
        .await
        .expect("tune.toml of the only kernel");
    assert!(read.content.contains("CHUNK"), "{}", read.content);
    assert_eq!(
        read.data.as_ref().expect("data")["path"],
        "vecadd/tune.toml"
    );
    assert_refused(
        &tools,
        &[
            (
                "compile",
                json!({"kernel_dir": "nope"}),
                "kernel directories: vecadd",
            ),
            (
                "read_file",
                json!({"path": "missing.c"}),
                "kernel directories: vecadd",
            ),
        ],
    )
    .await;

    common::copy_dir(
        &common::examples_dir().join("vecadd"),
        &ws.path().join("vecadd2"),
    );
    let refused = invalid_args(call(&tools, "compile", json!({})).await);
    assert!(
        refused.contains("kernel_dir is required") && refused.contains("vecadd, vecadd2"),
        "{refused}"
    );
}

/// After each measurement the answer names the task's next candidate not
/// measured yet, and once every one is, says to answer with the best.
#[tokio::test]
async fn a_benchmark_names_the_tasks_next_candidate_then_the_answer() {
    let ws = vecadd_workspace();
    let tools = scripted_tools(ws.path(), BackendKind::Host);
    let candidate = |chunk: &str| {
        [("BUF", "2"), ("CHUNK", chunk)]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect()
    };
    tools.set_task_candidates(vec![candidate("1024"), candidate("2048")]);
    call_ok(
        &tools,
        "compile",
        json!({"defines": {"BUF": "2", "CHUNK": "1024"}}),
    )
    .await;
    let first = call_ok(&tools, "benchmark", json!({})).await;
    assert!(
        first.content.ends_with(
            r#"next: compile the task's next candidate, defines {"BUF":"2","CHUNK":"2048"}"#
        ),
        "{}",
        first.content
    );
    call_ok(
        &tools,
        "compile",
        json!({"defines": {"BUF": 2, "CHUNK": 2048.0}}),
    )
    .await;
    let second = call_ok(&tools, "benchmark", json!({})).await;
    assert!(
        second
            .content
            .contains("next: every candidate of the task is measured; answer now with the best"),
        "{}",
        second.content
    );
}

/// A compile with no defines in a task with candidates builds the task's
/// next unmeasured candidate, not the kernel's defaults again.
#[tokio::test]
async fn a_compile_without_defines_builds_the_tasks_next_candidate() {
    let ws = vecadd_workspace();
    let tools = scripted_tools(ws.path(), BackendKind::Host);
    let candidate = |chunk: &str| -> std::collections::BTreeMap<String, String> {
        [("BUF", "1"), ("CHUNK", chunk)]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect()
    };
    tools.set_task_candidates(vec![candidate("1024"), candidate("256")]);
    let built = |out: &ToolOutput| out.data.as_ref().map(|d| d["defines"].clone());
    let first = call_ok(&tools, "compile", json!({})).await;
    assert_eq!(built(&first), Some(json!({"BUF": "1", "CHUNK": "1024"})));
    call_ok(&tools, "benchmark", json!({})).await;
    let second = call_ok(&tools, "compile", json!({})).await;
    assert_eq!(built(&second), Some(json!({"BUF": "1", "CHUNK": "256"})));
    let given = call_ok(&tools, "compile", json!({"defines": {}})).await;
    assert_eq!(
        built(&given),
        Some(json!({})),
        "empty defines are the defaults"
    );
}

/// A model's huge value or key comes back in a rejection of bounded size:
/// what it reads next is the problem, not its own value again.
#[test]
fn a_rejection_quotes_a_huge_value_in_part() {
    let ws = tempfile::tempdir().expect("workspace");
    let tools = common::scripted_tools(ws.path(), BackendKind::Emulator);
    let mut registry = mtswarm_core::ToolRegistry::new();
    tools.register_all(&mut registry).expect("registry");
    let huge = "8or".repeat(10_000);
    for (tool, args) in [
        ("run", json!({"artifact": "a1", "cores": huge})),
        ("compile", json!({"kernel_dir": "k", huge.clone(): 1})),
    ] {
        let entry = registry.get(tool).expect("tool");
        let rejection =
            mtswarm_core::ToolRegistry::prepare_arguments(entry, args, &Default::default())
                .unwrap_err();
        let seen = rejection.observation();
        assert!(seen.len() < 2_000, "{tool}: {} bytes", seen.len());
        assert!(seen.contains("8or8or"), "{seen}");
    }
}
