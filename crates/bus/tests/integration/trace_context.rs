//! W3C trace context crosses NATS: the consumer's span joins the publisher's
//! trace, through JetStream (tasks) and core NATS (events).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::{next_ok, setup, task, w1_tasks};
use mtswarm_bus::v1;
use mtswarm_telemetry::{TelemetryConfig, init_scoped, propagation};
use tracing::Instrument as _;

fn scoped_telemetry() -> mtswarm_telemetry::ScopedTelemetry {
    let mut config = TelemetryConfig::new("bus-trace-test");
    config.log_filter = Some("info".into());
    init_scoped(config).expect("scoped telemetry")
}

// Current-thread runtime: the scoped subscriber is per thread.
#[tokio::test]
async fn trace_id_survives_a_task_publish_consume_hop() {
    let _telemetry = scoped_telemetry();
    let (_server, bus) = setup().await;
    let mut tasks = w1_tasks(&bus).await;

    let assign_span = tracing::info_span!("leader.assign_task");
    let leader_trace = propagation::trace_id(&assign_span).expect("leader span traced");
    let leader_span_id = propagation::span_id(&assign_span).expect("span id");
    bus.publish_task(&task("t1", 1, "w1", "s1"))
        .instrument(assign_span.clone())
        .await
        .expect("publish");

    let delivery = next_ok("task", &mut tasks).await;
    let remote = delivery.trace_context();
    assert!(
        propagation::has_remote_parent(&remote),
        "headers carry traceparent"
    );
    let worker_span = tracing::info_span!(parent: None, "worker.run_task");
    assert!(delivery.set_span_parent(&worker_span).expect("set parent"));
    assert_eq!(propagation::trace_id(&worker_span), Some(leader_trace));
    assert_ne!(propagation::span_id(&worker_span), Some(leader_span_id));
    use opentelemetry::trace::TraceContextExt as _;
    assert_eq!(
        remote.span().span_context().span_id(),
        leader_span_id,
        "the parent is the publishing span"
    );
    delivery.ack().await.expect("ack");
}

#[tokio::test]
async fn trace_id_survives_a_core_event_hop_and_untraced_messages_have_none() {
    let _telemetry = scoped_telemetry();
    let (_server, bus) = setup().await;
    let mut events = bus.subscribe_events("job1").await.expect("subscribe");
    bus.flush().await.expect("flush");
    let event = v1::AgentEvent {
        job_id: "job1".into(),
        agent_id: "a1".into(),
        sequence: 1,
        ..Default::default()
    };

    // Published outside any span: no trace context is sent.
    bus.publish_event(&event).await.expect("publish untraced");
    let untraced = next_ok("untraced event", &mut events).await;
    let span = tracing::info_span!(parent: None, "consume.untraced");
    assert!(!untraced.set_span_parent(&span).expect("no error"));

    let step_span = tracing::info_span!("worker.step");
    let trace_id = propagation::trace_id(&step_span).expect("traced");
    bus.publish_event(&event)
        .instrument(step_span)
        .await
        .expect("publish traced");
    let traced = next_ok("traced event", &mut events).await;
    let watch_span = tracing::info_span!(parent: None, "leader.watch_job");
    assert!(traced.set_span_parent(&watch_span).expect("set parent"));
    assert_eq!(propagation::trace_id(&watch_span), Some(trace_id));
}
