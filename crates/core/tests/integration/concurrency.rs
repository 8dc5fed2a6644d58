//! Scheduling of the calls of one step: concurrency-safe calls run together,
//! the others in the model's order, hardware calls one at a time per
//! resource; progress reports become events.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::*;
use tokio::sync::Barrier;

#[tokio::test]
async fn concurrency_safe_calls_of_one_step_run_together() {
    // Both calls must reach the barrier before either can finish: run one
    // after the other, they would wait forever (caught by the timeout).
    let barrier = Arc::new(Barrier::new(2));
    let tool = {
        let barrier = barrier.clone();
        FnTool::new("grep", move |_, _| {
            let barrier = barrier.clone();
            async move {
                barrier.wait().await;
                Ok(ToolOutput::text("met"))
            }
        })
        .concurrent()
    };
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::tool_calls([call("g1", "grep", "{}"), call("g2", "grep", "{}")]),
            ScriptedTurn::text("done"),
        ],
        registry(vec![tool]),
        auto_all(),
    );
    let (stream, _) = engine.start("s", "", "go");
    let (events, outcome) = tokio::time::timeout(Duration::from_secs(5), stream.collect_all())
        .await
        .expect("both calls reached the barrier together");
    assert_eq!(final_text(&outcome), "done");
    let results = tool_results(&events);
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|(_, ok, content)| *ok && content == "met")
    );
}

/// A shared monotonic counter and the [start, end) interval of every call
/// its tools made on it.
#[derive(Default)]
struct Recording {
    clock: Arc<AtomicU64>,
    intervals: Arc<Mutex<Vec<(String, u64, u64)>>>,
}

impl Recording {
    /// A tool `name` recording its calls' intervals.
    fn tool(&self, name: &str) -> FnTool {
        let clock = self.clock.clone();
        let intervals = self.intervals.clone();
        FnTool::new(name, move |_, ctx| {
            let clock = clock.clone();
            let intervals = intervals.clone();
            async move {
                let start = clock.fetch_add(1, Ordering::SeqCst);
                // Give a concurrent call every chance to start in between.
                for _ in 0..5 {
                    tokio::task::yield_now().await;
                }
                let end = clock.fetch_add(1, Ordering::SeqCst);
                intervals
                    .lock()
                    .map_err(|e| ToolError::Failed(e.to_string()))?
                    .push((ctx.call_id.clone(), start, end));
                Ok(ToolOutput::text("ran"))
            }
        })
    }

    fn intervals(&self) -> Vec<(String, u64, u64)> {
        self.intervals.lock().expect("lock").clone()
    }
}

/// Runs one step making every call of `calls` (id, tool) at once, then
/// the answer "done", over `tools`.
async fn run_step(calls: &[(&str, &str)], tools: Vec<FnTool>) -> Vec<Event> {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::tool_calls(calls.iter().map(|(id, tool)| call(id, tool, "{}"))),
            ScriptedTurn::text("done"),
        ],
        registry(tools),
        auto_all(),
    );
    run_go(&engine).await.0
}

#[tokio::test]
async fn calls_on_the_same_resource_never_overlap() {
    let recording = Recording::default();
    let run_tool = recording
        .tool("run")
        .concurrent()
        .hardware("board0/cluster0");
    let analyze = recording.tool("analyze_kernel").concurrent();
    let events = run_step(
        &[
            ("r1", "run"),
            ("a1", "analyze_kernel"),
            ("r2", "run"),
            ("r3", "run"),
        ],
        vec![run_tool, analyze],
    )
    .await;
    let intervals = recording.intervals();
    assert_eq!(intervals.len(), 4);
    let hardware: Vec<&(String, u64, u64)> = intervals
        .iter()
        .filter(|(id, _, _)| id.starts_with('r'))
        .collect();
    for (i, a) in hardware.iter().enumerate() {
        for b in &hardware[i + 1..] {
            assert!(
                a.2 < b.1 || b.2 < a.1,
                "hardware calls overlapped: {a:?} and {b:?}"
            );
        }
    }
    // The analysis call is not held back by the lock: it overlaps a run.
    let analysis = intervals
        .iter()
        .find(|(id, _, _)| id == "a1")
        .expect("analysis ran");
    assert!(
        hardware
            .iter()
            .any(|h| analysis.1 < h.2 && h.1 < analysis.2),
        "analysis ran alongside the hardware calls: {intervals:?}"
    );
    // Lock waits are reported on hardware results only.
    for event in &events {
        if let EventKind::ToolResult {
            call_id,
            lock_wait_ms,
            ..
        } = &event.kind
        {
            assert_eq!(
                lock_wait_ms.is_some(),
                call_id.starts_with('r'),
                "{call_id}"
            );
        }
    }
}

#[tokio::test]
async fn unsafe_calls_run_alone_and_in_order() {
    let recording = Recording::default();
    let write = recording.tool("write_file");
    let read = recording.tool("read_file").concurrent();
    run_step(
        &[
            ("w1", "write_file"),
            ("r1", "read_file"),
            ("r2", "read_file"),
            ("w2", "write_file"),
        ],
        vec![write, read],
    )
    .await;
    let intervals = recording.intervals();
    let get = |id: &str| {
        intervals
            .iter()
            .find(|(i, _, _)| i == id)
            .cloned()
            .expect("ran")
    };
    let (w1, r1, r2, w2) = (get("w1"), get("r1"), get("r2"), get("w2"));
    assert!(w1.2 < r1.1 && w1.2 < r2.1, "write before reads");
    assert!(r1.2 < w2.1 && r2.2 < w2.1, "reads before the second write");
    assert!(r1.1 < r2.2 && r2.1 < r1.2, "the two reads overlapped");
}

#[tokio::test]
async fn tool_progress_becomes_state_update_events_before_the_result() {
    let tool = FnTool::new("benchmark", |_, ctx| async move {
        ctx.progress("warming up", Some(0.1));
        tokio::task::yield_now().await;
        ctx.progress("timing", Some(0.6));
        Ok(ToolOutput::text("1.2 ms"))
    });
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("b1", "benchmark", "{}", "ok"),
        registry(vec![tool]),
        auto_all(),
    );
    let (events, _) = run_go(&engine).await;
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall { .. } => Some("call".to_owned()),
            EventKind::ToolStateUpdate { message, .. } => Some(message.clone()),
            EventKind::ToolResult { .. } => Some("result".to_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, vec!["call", "warming up", "timing", "result"]);
}

#[tokio::test]
async fn a_tool_call_past_its_timeout_becomes_a_timeout_observation() {
    let stuck = FnTool::new("profile", |_, _| futures::future::pending());
    let config = EngineConfig {
        tool_timeout: Some(Duration::from_millis(50)),
        ..EngineConfig::default()
    };
    let (engine, _) = engine(
        config,
        call_then("p1", "profile", "{}", "gave up"),
        registry(vec![stuck]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(final_text(&outcome), "gave up");
    assert!(observation(outcome.state(), "p1").contains("timed out after 50ms"));
    assert_eq!(outcome.state().risk().tool_errors, 1);
}
