//! Engine overhead per ReAct step: a scripted model that asks for one no-op
//! tool call per step, so everything measured is the engine (view building,
//! routing, validation, scheduling, events, state transitions).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::*;

struct NoopTool;

fn noop_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}})
}

static NOOP: ToolSpec = ToolSpec::new("noop", "does nothing", noop_schema).concurrent();

#[async_trait::async_trait]
impl Tool for NoopTool {
    fn spec(&self) -> &ToolSpec {
        &NOOP
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text("ok"))
    }
}

fn script(steps: u32) -> Vec<ScriptedTurn> {
    let mut turns: Vec<ScriptedTurn> = (0..steps - 1)
        .map(|i| ScriptedTurn::call(&format!("c{i}"), "noop", r#"{"n": 1}"#))
        .collect();
    turns.push(ScriptedTurn::text("done"));
    turns
}

fn bench_steps(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("react_step");
    for (label, steps, tracing) in [
        ("noop_tool_10_steps", 10u32, false),
        ("noop_tool_40_steps", 40, false),
        ("noop_tool_10_steps_tracing_mw", 10, true),
    ] {
        let model = Arc::new(ScriptedModel::new(Vec::new()).without_recording());
        let mut registry = ToolRegistry::new();
        registry.register(Arc::new(NoopTool)).expect("valid schema");
        let config = EngineConfig {
            max_steps: steps + 1,
            ..EngineConfig::default()
        };
        let mut engine = Engine::new(
            config,
            model.clone(),
            registry,
            RiskPolicy::default(),
            Arc::new(LocalResourceLock::default()),
        );
        if tracing {
            engine = engine.with_middleware(Arc::new(TracingMiddleware::new()));
        }
        group.throughput(Throughput::Elements(u64::from(steps)));
        group.bench_function(label, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for turn in script(steps) {
                        model.push(turn);
                    }
                    let started = Instant::now();
                    let events = runtime.block_on(async {
                        let (mut stream, _) = engine.start("bench", "system", "go");
                        let mut count = 0usize;
                        while let Some(event) = stream.next().await {
                            count += usize::from(matches!(event.kind, EventKind::ReplyEnd { .. }));
                        }
                        count
                    });
                    total += started.elapsed();
                    assert_eq!(events, 1, "the run ended with an answer");
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_steps);
criterion_main!(benches);
