//! One tool batch on one slice: the read-only tools overlap each other, two
//! benchmark calls never overlap. Checked twice: driving the calls the way
//! the engine does (slice lock around `needs_hardware` calls, everything
//! joined), and through the real `mtswarm_core::Engine` executing a scripted
//! model's batch.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{GOOD_KERNEL, ScriptedBoard, call, call_ok, ctx, toolset, workspace_with};
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::{
    AutoApprove, Engine, EngineConfig, EventKind, ResourceLock, RiskPolicy, Tool, ToolCall,
    ToolContext, ToolError, ToolOutput, ToolRegistry,
};
use mtswarm_hw::BackendKind;
use serde_json::{Value, json};
use tokio::sync::Barrier;

/// How long a read-only call waits for its peers before concluding that
/// the calls were serialized.
const RENDEZVOUS: Duration = Duration::from_secs(10);

type Intervals = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

/// Delegates to a real tool, recording the call's interval. Read-only calls
/// first meet at a barrier: they only get past it if all of them are in
/// flight at the same time.
struct Recording {
    inner: Arc<dyn Tool>,
    barrier: Option<Arc<Barrier>>,
    intervals: Intervals,
}

#[async_trait::async_trait]
impl Tool for Recording {
    fn spec(&self) -> &mtswarm_core::ToolSpec {
        self.inner.spec()
    }
    fn resource(&self) -> Option<String> {
        self.inner.resource()
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        self.inner.normalize(args)
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let start = Instant::now();
        if let Some(barrier) = &self.barrier {
            tokio::time::timeout(RENDEZVOUS, barrier.wait())
                .await
                .map_err(|_| ToolError::Failed("read-only calls did not overlap".into()))?;
        }
        let result = self.inner.call(args, ctx).await;
        self.intervals.lock().expect("intervals").push((
            self.inner.spec().name.to_string(),
            start,
            Instant::now(),
        ));
        result
    }
}

const READ_ONLY_CALLS: [(&str, &str); 5] = [
    ("read_file", r#"{"path": "kernel.c"}"#),
    ("grep", r#"{"pattern": "vector_malloc"}"#),
    ("list_files", "{}"),
    ("analyze_kernel", "{}"),
    ("board_info", "{}"),
];

fn wrap(tools: &mtswarm_tools::ToolSet, intervals: &Intervals) -> Vec<Arc<dyn Tool>> {
    let barrier = Arc::new(Barrier::new(READ_ONLY_CALLS.len()));
    tools
        .tools()
        .into_iter()
        .map(|inner| {
            let barrier = READ_ONLY_CALLS
                .iter()
                .any(|(name, _)| *name == inner.spec().name)
                .then(|| barrier.clone());
            Arc::new(Recording {
                inner,
                barrier,
                intervals: intervals.clone(),
            }) as Arc<dyn Tool>
        })
        .collect()
}

fn assert_schedule(intervals: &Intervals, board: &ScriptedBoard) {
    let all = intervals.lock().expect("intervals").clone();
    let benches: Vec<&(String, Instant, Instant)> =
        all.iter().filter(|(n, _, _)| n == "benchmark").collect();
    assert_eq!(benches.len(), 2, "{all:?}");
    let (a, b) = (benches[0], benches[1]);
    assert!(
        a.2 <= b.1 || b.2 <= a.1,
        "benchmark calls overlapped: {a:?} {b:?}"
    );
    assert_eq!(
        board.max_in_flight.load(Ordering::SeqCst),
        1,
        "two launches ran at once"
    );
    let read_only = all.iter().filter(|(n, _, _)| n != "benchmark").count();
    assert_eq!(read_only, READ_ONLY_CALLS.len(), "{all:?}");
}

async fn setup() -> (
    tempfile::TempDir,
    Arc<ScriptedBoard>,
    mtswarm_tools::ToolSet,
) {
    let ws = workspace_with(GOOD_KERNEL);
    let board = Arc::new(ScriptedBoard::new(BackendKind::Host));
    let tools = toolset(ws.path(), board.clone());
    call_ok(&tools, "compile", json!({})).await;
    (ws, board, tools)
}

#[tokio::test]
async fn batch_driven_through_the_slice_lock_overlaps_reads_and_serializes_benchmarks() {
    let (_ws, board, tools) = setup().await;
    let intervals: Intervals = Arc::default();
    let wrapped = wrap(&tools, &intervals);
    let lock = tools.resource_lock();
    let mut batch: Vec<(&str, &str)> = vec![("benchmark", "{}")];
    batch.extend(READ_ONLY_CALLS);
    batch.push(("benchmark", r#"{"repeats": "4"}"#));
    let calls = batch.into_iter().map(|(name, args)| {
        let tool = wrapped
            .iter()
            .find(|t| t.spec().name == name)
            .cloned()
            .expect("tool");
        let lock = lock.clone();
        async move {
            let args = tool
                .normalize(serde_json::from_str(args).expect("json"))
                .expect("normalize");
            let guard = match (tool.spec().needs_hardware, tool.resource()) {
                (true, Some(resource)) => Some(lock.acquire(&resource).await),
                _ => None,
            };
            let result = tool.call(args, &ctx()).await;
            drop(guard);
            (name, result)
        }
    });
    for (name, result) in futures::future::join_all(calls).await {
        assert!(result.is_ok(), "{name}: {result:?}");
    }
    assert_schedule(&intervals, &board);
    let stats = lock.hw_lock().stats("fake0/c1").expect("lock stats");
    assert_eq!(stats.acquisitions, 2);
    assert!(
        stats.max_wait > Duration::ZERO,
        "the second benchmark queued: {stats:?}"
    );
}

#[tokio::test]
async fn engine_batch_overlaps_reads_and_serializes_benchmarks() {
    let (_ws, board, tools) = setup().await;
    let intervals: Intervals = Arc::default();
    let mut registry = ToolRegistry::new();
    for tool in wrap(&tools, &intervals) {
        registry.register(tool).expect("register");
    }
    let mut calls = vec![ToolCall {
        id: "c0".into(),
        name: "benchmark".into(),
        arguments: "{}".into(),
    }];
    for (i, (name, args)) in READ_ONLY_CALLS.iter().enumerate() {
        calls.push(ToolCall {
            id: format!("c{}", i + 1),
            name: (*name).into(),
            arguments: (*args).into(),
        });
    }
    calls.push(ToolCall {
        id: "c9".into(),
        name: "benchmark".into(),
        arguments: r#"{"repeats": 4}"#.into(),
    });
    let model = ScriptedModel::new([
        ScriptedTurn::tool_calls(calls),
        ScriptedTurn::text("Benchmarked the kernel."),
        ScriptedTurn::text("Benchmarked the kernel."),
        ScriptedTurn::text("Benchmarked the kernel."),
    ]);
    let engine = Engine::new(
        EngineConfig::default(),
        Arc::new(model),
        registry,
        RiskPolicy::default().with_auto_approve(AutoApprove::UpToMedium),
        Arc::new(tools.resource_lock()),
    );
    let (stream, _handle) = engine.start("s1", "You tune kernels.", "Benchmark kernel.c");
    let (events, _outcome) = tokio::time::timeout(Duration::from_secs(60), stream.collect_all())
        .await
        .expect("run finished");
    let results: Vec<(String, bool, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult {
                name, ok, content, ..
            } => Some((name.clone(), *ok, content.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 7, "{results:?}");
    for (name, ok, content) in &results {
        assert!(ok, "{name}: {content}");
    }
    assert_schedule(&intervals, &board);
}

#[tokio::test]
async fn host_benchmarks_never_overlap_a_compile_of_the_session() {
    let ws = workspace_with(GOOD_KERNEL);
    let mut board = ScriptedBoard::new(BackendKind::Host);
    board.build_time = Duration::from_millis(40);
    let board = Arc::new(board);
    let tools = toolset(ws.path(), board.clone());
    call_ok(&tools, "compile", json!({})).await;
    let lock = tools.resource_lock();
    let bench = async {
        let _slice = lock.acquire("fake0/c1").await;
        call(&tools, "benchmark", json!({"warmup": 0, "repeats": 2})).await
    };
    let compiles = futures::future::join_all((0..3).map(|i| {
        let tools = &tools;
        async move { call(tools, "compile", json!({"defines": {"V": i}})).await }
    }));
    let (bench, compiles) = tokio::join!(bench, compiles);
    assert!(bench.is_ok(), "{bench:?}");
    assert!(compiles.iter().all(Result::is_ok), "{compiles:?}");
    let runs = board.intervals.lock().expect("runs").clone();
    let builds = board.build_intervals.lock().expect("builds").clone();
    assert_eq!(builds.len(), 4);
    for (rs, re) in &runs {
        for (bs, be) in &builds {
            assert!(be <= rs || re <= bs, "a compile ran while timing");
        }
    }
}
