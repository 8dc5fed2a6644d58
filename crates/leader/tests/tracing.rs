//! One job is one trace: `SubmitJob` is the root of the job in the leader
//! (its traceparent is stored in the JobRecord), the job's
//! `invoke_workflow mtswarm.job` span is its child with the leader's
//! `invoke_agent leader` below it, the engine's spans nest below that, and
//! the task message carries the context of the `execute_tool assign_task`
//! span.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use mtswarm_bus::v1;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::layer::SubscriberExt as _;

#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(batch);
        Ok(())
    }
}

fn by_worker(_: &v1::TaskAssignment) -> f64 {
    1.0
}

#[tokio::test]
async fn the_job_is_one_trace_from_submit_to_the_task_headers() {
    let spans = Collected::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("leader-test")));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let env = Env::start().await;
    let _worker = FakeWorker::start(&env.bus, "fw1", "fb0").await;
    let (answer, mut tasks) = answer_tasks(&env.bus, "fw1", by_worker);
    let model = ScriptedModel::new([
        ScriptedTurn::call("c1", "spawn_agent", r#"{"name":"a1"}"#),
        ScriptedTurn::call(
            "c2",
            "assign_task",
            r#"{"agent":"a1","instructions":"go","parameters":{"candidates":[{"A":2}]}}"#,
        ),
        // Collected first: an answer claiming nothing while the task runs
        // is pushed back.
        ScriptedTurn::call(
            "c3",
            "collect_result",
            r#"{"mode":"all","timeout_seconds":60}"#,
        ),
        ScriptedTurn::text("done"),
    ]);
    let leader = env.leader(Arc::new(model)).await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1.").await;
    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_eq!(
        final_state(&events),
        Some(v1::JobState::Succeeded),
        "{:#?}",
        events.last()
    );
    let (_, headers) = within("the task", tasks.recv()).await.expect("task");
    let record = get_job(&mut control, &job_id).await.expect("get_job");
    leader.shutdown().await.expect("shutdown");
    answer.abort();
    provider.force_flush().expect("flush");

    // traceparent = 00-<trace id>-<span id>-<flags>
    let parts: Vec<&str> = record.traceparent.split('-').collect();
    assert_eq!(
        parts.len(),
        4,
        "stored traceparent {:?}",
        record.traceparent
    );
    let (trace_id, submit_span_id) = (parts[1].to_string(), parts[2].to_string());
    let task_parent = headers
        .get("traceparent")
        .map(|v| v.as_str().to_string())
        .expect("task carries a traceparent");
    let task_parts: Vec<&str> = task_parent.split('-').collect();
    assert_eq!(task_parts[1], trace_id, "the task is in the job's trace");

    let spans = spans.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let find = |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };
    let submit = find("SubmitJob");
    assert_eq!(submit.len(), 1);
    assert_eq!(submit[0].span_context.trace_id().to_string(), trace_id);
    assert_eq!(submit[0].span_context.span_id().to_string(), submit_span_id);
    let job = find("invoke_workflow mtswarm.job");
    assert_eq!(job.len(), 1);
    assert_eq!(job[0].parent_span_id, submit[0].span_context.span_id());
    let agent = find("invoke_agent leader");
    assert_eq!(agent.len(), 1);
    assert_eq!(agent[0].parent_span_id, job[0].span_context.span_id());
    let steps = find("react.step");
    assert!(!steps.is_empty());
    assert!(
        steps
            .iter()
            .all(|s| s.span_context.trace_id().to_string() == trace_id)
    );
    let tool_span = find("execute_tool assign_task")
        .into_iter()
        .find(|s| s.span_context.span_id().to_string() == task_parts[2])
        .expect("the task's parent is the execute_tool span of assign_task");
    assert!(
        tool_span
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "gen_ai.tool.name" && kv.value.as_str() == "assign_task"),
        "{:?}",
        tool_span.attributes
    );
}
