//! The task's span joins the trace of whoever published the task: the
//! worker's result and its agent events carry the publisher's trace id.
//!
//! A binary of its own: the telemetry it installs (the OpenTelemetry
//! propagator and tracer provider) is process-wide, and a test of the shared
//! integration binary that sets up telemetry at the same time would take it
//! over.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

#[path = "integration/common/mod.rs"]
mod common;

use common::*;
use mtswarm_bus::v1;
use mtswarm_telemetry::{TelemetryConfig, init_scoped, propagation};
use serde_json::json;
use tracing::Instrument as _;

// Current-thread runtime: the scoped subscriber is per thread, and the
// daemon's tasks run on this thread too.
#[tokio::test]
async fn the_task_span_continues_the_publishers_trace() {
    let mut telemetry_config = TelemetryConfig::new("worker-trace-test");
    telemetry_config.log_filter = Some("info".into());
    let _telemetry = init_scoped(telemetry_config).expect("scoped telemetry");
    let env = Env::start().await;
    let handle = env.daemon(env.config("emu0")).await;
    let slice = handle.slice_ids()[0].clone();
    let mut watch = env.watch("jobX", "tx").await;
    let session = Session::on(&handle, &slice, "jobX", "agentX", "sessX");
    spawn(&handle, session.spawn_request()).await;

    let assign = tracing::info_span!("leader.assign_task");
    let leader_trace = propagation::trace_id(&assign).expect("traced");
    let assignment = session.task("taskX", 1, json!({"noop": true}));
    env.bus
        .publish_task(&assignment)
        .instrument(assign)
        .await
        .expect("publish");

    let delivery = next(&mut watch.results, "the result")
        .await
        .expect("result");
    assert_eq!(delivery.message().status, v1::TaskStatus::Ok as i32);
    let span = tracing::info_span!(parent: None, "check.result");
    assert!(delivery.set_span_parent(&span).expect("parent"));
    assert_eq!(propagation::trace_id(&span), Some(leader_trace));

    // Every event of the task's run is in the same trace.
    let mut in_task = 0;
    loop {
        let received = next(&mut watch.events, "events").await.expect("event");
        let p = payload(&received.message);
        if p.get("engine_seq").is_some() {
            let span = tracing::info_span!(parent: None, "check.event");
            assert!(received.set_span_parent(&span).expect("parent"), "{p}");
            assert_eq!(propagation::trace_id(&span), Some(leader_trace), "{p}");
            in_task += 1;
        }
        if task_finished(&received.message, 1) {
            break;
        }
    }
    assert!(in_task >= 2, "engine events seen: {in_task}");
    handle.shutdown().await.expect("shutdown");
}
