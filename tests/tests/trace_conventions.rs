//! The job's trace follows the OpenTelemetry GenAI semantic conventions
//! v1.41.1. An in-process OTLP receiver takes the spans of the in-process
//! leader and of a worker process (OTEL_EXPORTER_OTLP_ENDPOINT) for one job
//! whose leader spawns an agent, assigns a task to an agent that does not
//! exist (a failing tool call), then runs a real task on the emulator.
//! Every span of the job's trace with a GenAI operation has the name, kind
//! and required attributes the conventions give it; the failed tool's span
//! has ERROR status and an `error.type`; no span carries message content
//! (capture is opt-in); the names the conventions replaced are gone.
//!
//! This binary installs the global tracing subscriber, so it holds this one
//! test only.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

// Shared with the e2e binary; this test uses only part of it.
#[allow(dead_code, unused_imports)]
#[path = "e2e/support.rs"]
mod support;

use std::time::Duration;

use mtswarm_core::ToolCall;
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_telemetry::TelemetryConfig;
use mtswarm_tests::{CollectedSpan, OtlpCollector, StackOptions, small_fleet_toml};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::json;

use support::{
    fan_out_script, job_spec, quick_vecadd_parameters, run_to_success, script_leader, start_stack,
    submit,
};

/// The GenAI operations and, for each, the span kind and the attribute
/// whose value follows the operation in the span name.
const OPERATIONS: &[(&str, SpanKind, &str)] = &[
    ("chat", SpanKind::Client, "gen_ai.request.model"),
    ("execute_tool", SpanKind::Internal, "gen_ai.tool.name"),
    ("invoke_agent", SpanKind::Internal, "gen_ai.agent.name"),
    ("create_agent", SpanKind::Client, "gen_ai.agent.name"),
    (
        "invoke_workflow",
        SpanKind::Internal,
        "gen_ai.workflow.name",
    ),
];

/// Attributes the conventions require (or require when available, and they
/// are) per operation, beyond `gen_ai.operation.name`.
fn required(operation: &str) -> &'static [&'static str] {
    match operation {
        "chat" => &[
            "gen_ai.provider.name",
            "gen_ai.request.model",
            "gen_ai.conversation.id",
        ],
        "execute_tool" => &["gen_ai.tool.name", "gen_ai.tool.call.id"],
        "invoke_agent" | "create_agent" => &[
            "gen_ai.provider.name",
            "gen_ai.agent.id",
            "gen_ai.agent.name",
            "gen_ai.conversation.id",
        ],
        "invoke_workflow" => &["gen_ai.workflow.name"],
        _ => &[],
    }
}

/// What is wrong with `span` by the conventions (empty when nothing).
fn violations(span: &CollectedSpan) -> Vec<String> {
    let name = &span.span.name;
    let operation_attr = span.attribute("gen_ai.operation.name");
    let named_after = OPERATIONS
        .iter()
        .find(|(op, _, _)| name == op || name.starts_with(&format!("{op} ")));
    let mut found = Vec::new();
    let (operation, kind, name_attr) = match (operation_attr.as_deref(), named_after) {
        (None, None) => return found,
        (Some(op), _) => match OPERATIONS.iter().find(|(known, _, _)| *known == op) {
            Some(entry) => *entry,
            None => return vec![format!("{name}: unknown gen_ai.operation.name {op}")],
        },
        (None, Some(_)) => {
            return vec![format!("{name}: no gen_ai.operation.name")];
        }
    };
    if span.span.kind != kind as i32 {
        found.push(format!(
            "{name}: kind {:?}, want {kind:?}",
            SpanKind::try_from(span.span.kind)
        ));
    }
    match span.attribute(name_attr) {
        Some(value) if *name == format!("{operation} {value}") => {}
        value => found.push(format!(
            "{name}: name is not `{operation} {{{name_attr}}}` ({name_attr} = {value:?})"
        )),
    }
    for attribute in required(operation) {
        if span.attribute(attribute).is_none_or(|v| v.is_empty()) {
            found.push(format!("{name}: {attribute} missing"));
        }
    }
    if let Some(kv) = span
        .span
        .attributes
        .iter()
        .find(|kv| kv.key == "gen_ai.response.finish_reasons")
        && !matches!(
            kv.value.as_ref().and_then(|v| v.value.as_ref()),
            Some(Value::ArrayValue(_))
        )
    {
        found.push(format!("{name}: finish_reasons is not a string[]"));
    }
    let failed = span
        .span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32);
    if failed != span.attribute("error.type").is_some() {
        found.push(format!("{name}: ERROR status and error.type disagree"));
    }
    for content in [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.result",
    ] {
        if span.attribute(content).is_some() {
            found.push(format!("{name}: {content} recorded without opt-in"));
        }
    }
    found
}

/// The leader's script: spawn `a1`, assign a task to an agent that does not
/// exist (the tool fails), then the fan-out's task, collection and answer.
fn script() -> Vec<ScriptedTurn> {
    let mut turns = fan_out_script(&[("a1", "")], &quick_vecadd_parameters());
    let failing = ScriptedTurn::tool_calls([ToolCall {
        id: "assign-ghost".into(),
        name: "assign_task".into(),
        arguments: json!({"agent": "ghost", "instructions": "run"}).to_string(),
    }]);
    turns.insert(1, failing);
    turns
}

fn in_trace<'a>(spans: &'a [CollectedSpan], trace_id: &str) -> Vec<&'a CollectedSpan> {
    spans
        .iter()
        .filter(|s| s.trace_id_hex() == trace_id)
        .collect()
}

/// Names a complete job trace has, by service.
const EXPECTED: &[(&str, &str)] = &[
    ("mtswarm-leader", "invoke_workflow mtswarm.job"),
    ("mtswarm-leader", "invoke_agent leader"),
    ("mtswarm-leader", "create_agent a1"),
    ("mtswarm-leader", "execute_tool assign_task"),
    ("mtswarm-leader", "execute_tool collect_result"),
    ("mtswarm-worker", "invoke_agent a1"),
];

fn complete(job: &[&CollectedSpan]) -> bool {
    let has = |service: &str, name: &str| {
        job.iter()
            .any(|s| s.service_name == service && s.span.name == name)
    };
    EXPECTED.iter().all(|(service, name)| has(service, name))
        && ["mtswarm-leader", "mtswarm-worker"].iter().all(|service| {
            job.iter()
                .any(|s| s.service_name == *service && s.span.name.starts_with("chat "))
        })
        && job
            .iter()
            .any(|s| s.service_name == "mtswarm-worker" && s.span.name.starts_with("execute_tool "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_jobs_spans_follow_the_genai_conventions() {
    let collector = OtlpCollector::start().await.expect("collector");
    let mut telemetry = TelemetryConfig::new("mtswarm-leader");
    telemetry.otlp_endpoint = Some(collector.endpoint());
    telemetry.log_filter = Some("warn".into());
    let mut guard = mtswarm_telemetry::init(telemetry).expect("telemetry");

    let turns = script();
    let mut options = StackOptions::new(mtswarm_tests::node_bin!(), small_fleet_toml(1, 1, 2));
    options.configure_leader = Box::new(move |config| script_leader(config, turns));
    options.otlp_endpoint = Some(collector.endpoint());
    let (stack, mut control) = start_stack(options, 1).await;

    let job_id = submit(&mut control, job_spec("Conventions", "vecadd", true)).await;
    let (_, record) = run_to_success(&stack, &mut control, &job_id, Duration::from_secs(300)).await;
    guard.force_flush().expect("flush the leader's spans");
    let trace_id = record
        .traceparent
        .split('-')
        .nth(1)
        .expect("the job record names its trace")
        .to_string();

    // The worker process exports on its batch schedule.
    let (done, spans) = collector
        .wait_until(Duration::from_secs(60), |spans| {
            complete(&in_trace(spans, &trace_id))
        })
        .await;
    let job = in_trace(&spans, &trace_id);
    let names: Vec<String> = job
        .iter()
        .map(|s| format!("{}:{}", s.service_name, s.span.name))
        .collect();
    assert!(done, "the job's trace is incomplete: {names:#?}");

    let checked = job
        .iter()
        .filter(|s| s.attribute("gen_ai.operation.name").is_some())
        .count();
    assert!(checked >= EXPECTED.len() + 3, "only {checked} GenAI spans");
    let problems: Vec<String> = job.iter().flat_map(|s| violations(s)).collect();
    assert!(problems.is_empty(), "{problems:#?}");

    for old in ["gen_ai.chat", "tool.call", "worker.task", "leader.job"] {
        assert!(
            !job.iter().any(|s| s.span.name == old),
            "{old} is still emitted"
        );
    }

    let failed = job
        .iter()
        .find(|s| s.attribute("gen_ai.tool.call.id").as_deref() == Some("assign-ghost"))
        .expect("the failing assign_task span");
    assert_eq!(failed.span.name, "execute_tool assign_task");
    let status = failed.span.status.clone().unwrap_or_default();
    assert_eq!(status.code, StatusCode::Error as i32, "{status:?}");
    assert!(status.message.contains("ghost"), "{status:?}");
    assert_eq!(
        failed.attribute("error.type").as_deref(),
        Some("invalid_arguments")
    );
    let assigned = job
        .iter()
        .find(|s| {
            s.span.name == "execute_tool assign_task"
                && s.attribute("gen_ai.tool.call.id").as_deref() != Some("assign-ghost")
        })
        .expect("the assign_task that worked");
    assert_ne!(
        assigned.span.status.clone().unwrap_or_default().code,
        StatusCode::Error as i32
    );

    let provider = |service: &str, prefix: &str| {
        job.iter()
            .find(|s| s.service_name == service && s.span.name.starts_with(prefix))
            .and_then(|s| s.attribute("gen_ai.provider.name"))
    };
    // The leader is scripted and the worker runs its builtin policy: both
    // models run in their process.
    assert_eq!(
        provider("mtswarm-leader", "chat ").as_deref(),
        Some("mtswarm.builtin")
    );
    assert_eq!(
        provider("mtswarm-worker", "invoke_agent ").as_deref(),
        Some("mtswarm.builtin")
    );
    let agent = job
        .iter()
        .find(|s| s.span.name == "invoke_agent a1")
        .expect("the worker's agent span");
    assert_eq!(agent.attribute("gen_ai.agent.id").as_deref(), Some("a1"));

    stack.shutdown().await;
    let _ = guard.shutdown();
}
