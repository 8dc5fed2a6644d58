//! Spans set up by this crate reach a real OTLP/gRPC collector (an in-process
//! `TraceService` server on 127.0.0.1:0), with parent/child links intact
//! across a real gRPC hop whose trace context travels in request metadata.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::Duration;

use mtswarm_telemetry::grpc::{TraceContextInterceptor, server_span};
use mtswarm_telemetry::testing::{CollectedSpan, OtlpCollector};
use mtswarm_telemetry::{TelemetryConfig, init, init_scoped, propagation};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tracing::Instrument as _;

/// The spans received once every name in `wanted` was seen; fails after a timeout.
async fn collect_spans(collector: &OtlpCollector, wanted: &[&str]) -> Vec<CollectedSpan> {
    let (done, spans) = collector
        .wait_until(Duration::from_secs(20), |spans| {
            wanted
                .iter()
                .all(|name| spans.iter().any(|s| s.span.name == *name))
        })
        .await;
    assert!(done, "spans {wanted:?} not exported in time; got {spans:?}");
    spans
}

/// A running collector, and a configuration for `service` that exports to
/// it with the log filter `filter`.
async fn exporting_to_a_collector(service: &str, filter: &str) -> (OtlpCollector, TelemetryConfig) {
    let collector = OtlpCollector::start().await.expect("collector");
    let mut config = TelemetryConfig::new(service);
    config.otlp_endpoint = Some(collector.endpoint());
    config.log_filter = Some(filter.into());
    (collector, config)
}

fn find<'a>(received: &'a [CollectedSpan], name: &str) -> &'a CollectedSpan {
    received
        .iter()
        .find(|r| r.span.name == name)
        .unwrap_or_else(|| panic!("no span named {name}"))
}

/// The only test in this binary that installs the global subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_exports_spans_linked_across_a_grpc_hop() {
    let (collector, config) = exporting_to_a_collector("telemetry-grpc-test", "info").await;
    let mut guard = init(config).expect("init telemetry");
    assert!(guard.is_exporting());

    // A real gRPC server (tonic-health) whose request spans come from `server_span`.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind grpc");
    let grpc_addr = listener.local_addr().expect("grpc addr");
    let (_reporter, health_service) = tonic_health::server::health_reporter();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .trace_fn(server_span)
            .add_service(health_service)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                stop_rx.await.ok();
            }),
    );

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic_health::pb::health_client::HealthClient::with_interceptor(
        channel,
        TraceContextInterceptor,
    );
    let client_span = tracing::info_span!("client.check");
    let client_trace_id = propagation::trace_id(&client_span).expect("client span has a trace");
    client
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .instrument(client_span.clone())
        .await
        .expect("health check");
    drop(client_span);
    stop_tx.send(()).expect("server running");
    server
        .await
        .expect("server task")
        .expect("server shut down cleanly");

    guard.shutdown().expect("flush and shutdown");

    let server_name = "/grpc.health.v1.Health/Check";
    let received = collect_spans(&collector, &["client.check", server_name]).await;
    let client = find(&received, "client.check");
    let server = find(&received, server_name);
    assert_eq!(client.service_name, "telemetry-grpc-test");
    assert_eq!(client.span.trace_id, client_trace_id.to_bytes().to_vec());
    assert_eq!(
        server.span.trace_id, client.span.trace_id,
        "one trace across the hop"
    );
    assert_eq!(
        server.span.parent_span_id, client.span.span_id,
        "server span is the child of the client span"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_setup_exports_local_and_propagated_children() {
    let (collector, config) = exporting_to_a_collector("telemetry-scoped-test", "debug").await;
    let mut telemetry = init_scoped(config).expect("scoped telemetry");

    let mut carrier = std::collections::HashMap::new();
    {
        let parent = tracing::info_span!("job");
        let _entered = parent.enter();
        let child = tracing::debug_span!("step");
        child.in_scope(|| propagation::inject_current(&mut carrier));
    }
    let remote = tracing::info_span!(parent: None, "remote.consume");
    assert!(propagation::set_parent_from(&remote, &carrier).expect("set parent"));
    drop(remote);
    telemetry.shutdown().expect("flush");

    let received = collect_spans(&collector, &["job", "step", "remote.consume"]).await;
    let job = find(&received, "job");
    let step = find(&received, "step");
    let remote = find(&received, "remote.consume");
    assert_eq!(job.service_name, "telemetry-scoped-test");
    assert!(job.span.parent_span_id.is_empty(), "job is a root span");
    assert_eq!(step.span.parent_span_id, job.span.span_id);
    assert_eq!(remote.span.parent_span_id, step.span.span_id);
    assert_eq!(remote.span.trace_id, job.span.trace_id);
}
