//! Acceptance 3: one job is one trace across processes. An in-process OTLP
//! collector receives the spans of the in-process leader and of the worker
//! processes (OTEL_EXPORTER_OTLP_ENDPOINT); every span of the job shares the
//! trace id, and a worker's tool span reaches SubmitJob through its parents:
//! worker `execute_tool` -> `invoke_agent {agent}` (one task) -> (NATS
//! hop) -> the leader's `execute_tool assign_task` -> ... -> SubmitJob.
//!
//! This binary installs the global tracing subscriber, so it holds this one
//! test only.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

// Shared with the e2e binary; this test uses only part of it.
#[allow(dead_code, unused_imports)]
#[path = "e2e/support.rs"]
mod support;

use std::collections::HashMap;
use std::time::Duration;

use mtswarm_telemetry::TelemetryConfig;
use mtswarm_tests::{CollectedSpan, OtlpCollector, small_fleet_toml};

use support::{fan_out_options, job_spec, run_to_success, start_stack, submit};

/// The chain of spans from `start` up to its root, following parent ids
/// among `spans`; stops at a parent that was not received.
fn ancestry<'a>(
    start: &'a CollectedSpan,
    by_id: &HashMap<String, &'a CollectedSpan>,
) -> Vec<&'a CollectedSpan> {
    let mut chain = vec![start];
    let mut current = start;
    while !current.span.parent_span_id.is_empty() {
        match by_id.get(&current.parent_span_id_hex()) {
            Some(parent) if chain.len() < 64 => {
                chain.push(parent);
                current = parent;
            }
            _ => break,
        }
    }
    chain
}

fn describe(chain: &[&CollectedSpan]) -> String {
    chain
        .iter()
        .map(|s| {
            format!(
                "{}:{}{}",
                s.service_name,
                s.span.name,
                s.attribute("gen_ai.tool.name")
                    .map(|t| format!("({t})"))
                    .unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(" <- ")
}

/// True when `chain` (child first) goes worker execute_tool -> invoke_agent
/// -> leader `execute_tool assign_task` -> ... -> SubmitJob at the root.
fn crosses_into_the_leader(chain: &[&CollectedSpan]) -> bool {
    let position = |pred: &dyn Fn(&CollectedSpan) -> bool| chain.iter().position(|s| pred(s));
    let task = position(&|s| {
        s.service_name == "mtswarm-worker" && s.span.name.starts_with("invoke_agent ")
    });
    let assign = position(&|s| {
        s.service_name == "mtswarm-leader" && s.span.name == "execute_tool assign_task"
    });
    let root = chain
        .last()
        .filter(|s| s.span.name == "SubmitJob" && s.span.parent_span_id.is_empty());
    matches!((task, assign, root), (Some(t), Some(a), Some(_)) if t < a)
}

fn is_tool(span: &CollectedSpan) -> bool {
    span.span.name.starts_with("execute_tool ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_job_is_one_trace_across_leader_and_worker_processes() {
    let collector = OtlpCollector::start().await.expect("collector");
    let mut telemetry = TelemetryConfig::new("mtswarm-leader");
    telemetry.otlp_endpoint = Some(collector.endpoint());
    telemetry.log_filter = Some("info".into());
    let mut guard = mtswarm_telemetry::init(telemetry).expect("telemetry");

    let mut options = fan_out_options(&[("traced", "")], small_fleet_toml(1, 1, 2));
    options.otlp_endpoint = Some(collector.endpoint());
    let (stack, mut control) = start_stack(options, 1).await;

    let job_id = submit(&mut control, job_spec("Trace vecadd", "vecadd", true)).await;
    run_to_success(&stack, &mut control, &job_id, Duration::from_secs(300)).await;
    guard.force_flush().expect("flush the leader's spans");

    // Worker processes export on their batch schedule; wait for a complete chain.
    let (complete, spans) = collector
        .wait_until(Duration::from_secs(60), |spans| {
            let by_id: HashMap<String, &CollectedSpan> =
                spans.iter().map(|s| (s.span_id_hex(), s)).collect();
            spans
                .iter()
                .filter(|s| s.service_name == "mtswarm-worker" && is_tool(s))
                .any(|s| crosses_into_the_leader(&ancestry(s, &by_id)))
        })
        .await;
    let by_id: HashMap<String, &CollectedSpan> =
        spans.iter().map(|s| (s.span_id_hex(), s)).collect();
    let worker_tools: Vec<&CollectedSpan> = spans
        .iter()
        .filter(|s| s.service_name == "mtswarm-worker" && is_tool(s))
        .collect();
    assert!(
        complete,
        "no worker tool span chains up to SubmitJob through assign_task; chains:\n{}",
        worker_tools
            .iter()
            .map(|s| describe(&ancestry(s, &by_id)))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // One trace id for the whole job: SubmitJob's.
    let submit_span = spans
        .iter()
        .find(|s| {
            s.span.name == "SubmitJob" && s.attribute("job.id").as_deref() == Some(job_id.as_str())
        })
        .or_else(|| spans.iter().find(|s| s.span.name == "SubmitJob"))
        .expect("the SubmitJob span was exported");
    let trace_id = submit_span.trace_id_hex();
    let job_spans: Vec<&CollectedSpan> = spans
        .iter()
        .filter(|s| s.attribute("job.id").as_deref() == Some(job_id.as_str()))
        .collect();
    assert!(
        job_spans.iter().any(|s| s.service_name == "mtswarm-worker"),
        "worker spans carry the job id"
    );
    for span in &job_spans {
        assert_eq!(
            span.trace_id_hex(),
            trace_id,
            "span {} of {} is in another trace",
            span.span.name,
            span.service_name
        );
    }
    for span in &worker_tools {
        assert_eq!(
            span.trace_id_hex(),
            trace_id,
            "worker tool span in another trace"
        );
    }
    stack.shutdown().await;
    let _ = guard.shutdown();
}
