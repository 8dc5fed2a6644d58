//! query_results over the in-memory results source: ranking, same vs
//! similar kernels, limits, the tool set hook, and bad arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{ScriptedBoard, call, invalid_args, toolset};
use mtswarm_core::{Risk, Tool, ToolError};
use mtswarm_hw::BackendKind;
use mtswarm_tools::results::{PastStats, ResultsSourceError};
use mtswarm_tools::{InMemoryResults, PastResult, QueryResultsTool, ResultsQuery, ResultsSource};
use serde_json::{Value, json};

const HASH_NOW: &str = "c0ffee00112233445566";
const HASH_OLD: &str = "0bad0bad998877665544";

fn result(id: &str, kernel: &str, hash: &str, tile: &str, gflops: Option<f64>) -> PastResult {
    let mut params = BTreeMap::new();
    params.insert("TILE".to_string(), tile.to_string());
    PastResult {
        record_id: id.into(),
        job_id: "job1".into(),
        slice_id: "board0/c1".into(),
        backend: "emulator".into(),
        kernel: kernel.into(),
        kernel_hash: hash.into(),
        params,
        cores: 24,
        stats: gflops.map(|_| PastStats {
            count: 3,
            median: 0.5,
            ..Default::default()
        }),
        gflops,
        peak_fraction: gflops.map(|g| g / 200.0),
        valid: gflops.is_some(),
        error: gflops
            .is_none()
            .then(|| "validation failed: output differs from the reference".into()),
        flags: vec![],
        model: "builtin".into(),
        timestamp_ms: 1_700_000_000_000,
    }
}

fn history() -> Arc<InMemoryResults> {
    let mut flagged = result("r4", "dgemm", HASH_NOW, "1024", Some(900.0));
    flagged.flags = vec!["900.0 GFLOPS exceeds the modeled peak".into()];
    Arc::new(InMemoryResults::new(vec![
        result("r1", "dgemm", HASH_NOW, "16", Some(10.0)),
        result("r2", "dgemm", HASH_NOW, "64", Some(40.0)),
        result("r3", "dgemm", HASH_NOW, "512", None),
        flagged,
        result("r5", "dgemm", HASH_OLD, "32", Some(25.0)),
        result("r6", "spmv", HASH_OLD, "8", Some(3.0)),
    ]))
}

fn tool() -> QueryResultsTool {
    QueryResultsTool::new(history())
}

async fn run(tool: &QueryResultsTool, args: Value) -> Result<mtswarm_core::ToolOutput, ToolError> {
    let args = tool
        .normalize(args)
        .map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
    tool.call(args, &common::ctx()).await
}

fn ids(data: &Value, group: &str) -> Vec<String> {
    data[group]
        .as_array()
        .unwrap_or_else(|| panic!("{group} in {data}"))
        .iter()
        .map(|r| r["record_id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn same_code_ranks_first_then_similar_kernels() {
    let out = run(&tool(), json!({"kernel": "dgemm", "kernel_hash": HASH_NOW}))
        .await
        .expect("query");
    let data = out.data.clone().expect("data");
    // Trustworthy by GFLOPS, then flagged / invalid.
    assert_eq!(ids(&data, "same"), ["r2", "r1", "r4", "r3"]);
    assert_eq!(ids(&data, "similar"), ["r5"], "same name, other code only");
    assert_eq!(data["same_total"], 4);
    assert_eq!(data["same"][0]["params"]["TILE"], "64");
    assert_eq!(data["same"][0]["trustworthy"], true);
    assert_eq!(data["same"][2]["trustworthy"], false);

    let text = &out.content;
    assert!(
        text.contains("4 of the same code, 1 of other versions"),
        "{text}"
    );
    let best = text.find("40.00 GFLOPS").expect("best figure shown");
    let second = text.find("10.00 GFLOPS").expect("second figure shown");
    assert!(best < second, "{text}");
    assert!(text.contains("TILE=64"), "{text}");
    assert!(text.contains("INVALID  TILE=512"), "{text}");
    assert!(text.contains("validation failed"), "{text}");
    assert!(text.contains("FLAGGED"), "{text}");
    assert!(
        !text.contains("spmv") && !text.contains("TILE=8 "),
        "{text}"
    );
}

#[tokio::test]
async fn hash_alone_finds_the_kernel_name_and_its_other_versions() {
    let out = run(&tool(), json!({"hash": &HASH_NOW[..8]}))
        .await
        .expect("query by hash prefix");
    let data = out.data.expect("data");
    assert_eq!(data["kernel"], "dgemm");
    assert_eq!(ids(&data, "similar"), ["r5"]);

    let out = run(
        &tool(),
        json!({"kernel_hash": HASH_NOW, "same_kernel_only": "true"}),
    )
    .await
    .expect("same only");
    let data = out.data.expect("data");
    assert!(ids(&data, "similar").is_empty());
    assert_eq!(ids(&data, "same").len(), 4);
}

#[tokio::test]
async fn limit_truncates_each_group_and_says_so() {
    let out = run(
        &tool(),
        json!({"kernel": "dgemm", "kernel_hash": HASH_NOW, "limit": "2"}),
    )
    .await
    .expect("limited");
    let data = out.data.expect("data");
    assert_eq!(ids(&data, "same"), ["r2", "r1"]);
    assert!(out.content.contains("... 2 more"), "{}", out.content);
}

#[tokio::test]
async fn unknown_kernels_answer_plainly() {
    let out = run(&tool(), json!({"kernel": "stencil2d"}))
        .await
        .expect("none");
    assert_eq!(out.content, "no earlier results for kernel stencil2d");
    assert!(ids(out.data.as_ref().expect("data"), "same").is_empty());
}

#[tokio::test]
async fn tool_set_hook_uses_the_session_kernel_by_default() {
    let ws = tempfile::tempdir().expect("workspace");
    let tools = toolset(
        ws.path(),
        Arc::new(ScriptedBoard::new(BackendKind::Emulator)),
    )
    .with_results(history(), Some("spmv".into()));
    let tool = tools.get("query_results").expect("registered");
    assert_eq!(tool.spec().risk, Risk::Low);
    assert!(tool.spec().read_only && tool.spec().concurrency_safe && !tool.spec().needs_hardware);
    let out = call(&tools, "query_results", json!({}))
        .await
        .expect("default kernel");
    assert_eq!(ids(out.data.as_ref().expect("data"), "same"), ["r6"]);
    assert!(out.content.contains("TILE=8"), "{}", out.content);
    // The names a job's approval rules are checked against are exactly
    // the session's tools.
    let mut names = tools.names();
    names.sort();
    let mut published = mtswarm_tools::SESSION_TOOL_NAMES.map(String::from).to_vec();
    published.sort();
    assert_eq!(names, published);
    // Attaching again replaces, never duplicates.
    let tools = tools.with_results(history(), None);
    assert_eq!(
        tools
            .names()
            .iter()
            .filter(|n| *n == "query_results")
            .count(),
        1
    );
}

#[tokio::test]
async fn bad_arguments_are_named() {
    let tool = tool();
    for (args, expected) in [
        (json!({"kernel": "dgemm", "limit": 0}), "limit"),
        (json!({"kernel": "dgemm", "limit": -3}), "limit"),
        (json!({"kernel": "dgemm", "limit": 51}), "limit"),
        (json!({"kernel": "dgemm", "limit": "lots"}), "`limit`"),
        (json!({"kernel": 42}), "invalid type"),
        (
            json!({"kernel": "dgemm", "same_kernel_only": "maybe"}),
            "same_kernel_only",
        ),
        (json!({"kernel": "dgemm", "colour": "red"}), "unknown field"),
        (json!({}), "give `kernel`"),
        (json!({"kernel_hash": "ab"}), "kernel_hash"),
        (json!({"kernel_hash": "ab cd ef"}), "kernel_hash"),
        (json!([1, 2]), "JSON object"),
    ] {
        let message = invalid_args(run(&tool, args.clone()).await);
        assert!(message.contains(expected), "{args}: {message}");
    }
}

struct Unavailable;

#[async_trait::async_trait]
impl ResultsSource for Unavailable {
    async fn query(&self, _query: &ResultsQuery) -> Result<Vec<PastResult>, ResultsSourceError> {
        Err(ResultsSourceError("NATS connection closed".into()))
    }
}

#[tokio::test]
async fn source_failures_are_tool_failures_not_panics() {
    let tool = QueryResultsTool::new(Arc::new(Unavailable));
    match run(&tool, json!({"kernel": "dgemm"})).await {
        Err(ToolError::Failed(message)) => {
            assert!(message.contains("NATS connection closed"), "{message}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}
