//! OTLP metrics configured by the standard environment variables alone:
//! `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` (winning over the common
//! protocol), `OTEL_EXPORTER_OTLP_ENDPOINT` (plus `/v1/metrics`),
//! `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_SERVICE_NAME` decide where the
//! daemons' metrics go; `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` alone turns
//! the export on, no endpoint or `OTEL_METRICS_EXPORTER=none` leaves it
//! off. The receiver is a real HTTP server on 127.0.0.1:0 taking
//! protobuf bodies, as a collector's `otlphttp` receiver does.
//!
//! The variables and the meter provider are the process's, so this binary
//! holds one test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::Duration;

use mtswarm_telemetry::metrics::provider::{MetricsConfig, init_metrics};
use mtswarm_telemetry::metrics::{ModelCall, catalog, metrics};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;

mod common;
use common::{next, set, start_receiver, unset};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_metrics_from_the_environment_alone() {
    let (addr, mut exports) = start_receiver::<ExportMetricsServiceRequest>().await;
    set("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
    set("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf");
    set("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}"));
    set("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=lab-7");
    set("OTEL_SERVICE_NAME", "named-by-env");

    let mut config = MetricsConfig::new("named-in-code");
    config.prometheus = false;
    assert!(config.exports_otlp());
    let mut guard = init_metrics(&config).expect("meter provider");
    assert!(guard.is_exporting() && guard.registry().is_none());
    metrics().task_assigned("worker-b0");
    metrics().model_call(ModelCall {
        provider: "openai",
        model: "qwen3",
        duration: Duration::from_millis(300),
        tokens: Some((100, 7)),
        error_type: None,
    });
    guard.force_flush().expect("flush");
    let export = next(&mut exports).await;
    assert_eq!(export.path, "/v1/metrics");
    assert_eq!(export.content_type(), "application/x-protobuf");
    assert_eq!(export.header("x-tenant"), Some("lab-7"));
    assert_eq!(
        export.resource_attribute("service.name").as_deref(),
        Some("named-by-env")
    );
    let names = export.metric_names();
    for def in [
        catalog::TASKS_ASSIGNED,
        catalog::GENAI_OPERATION_DURATION,
        catalog::GENAI_TOKEN_USAGE,
    ] {
        assert!(
            names.contains(def.name),
            "{} not exported: {names:?}",
            def.name
        );
    }
    guard.shutdown().expect("shutdown");

    // The metrics endpoint alone is enough to export (the exporter uses it
    // as it is); with no endpoint at all nothing is exported.
    unset("OTEL_EXPORTER_OTLP_ENDPOINT");
    let config = MetricsConfig::new("named-in-code");
    assert!(!config.exports_otlp());
    set(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        &format!("http://{addr}/gateway/metrics"),
    );
    assert!(config.exports_otlp());
    // The standard switch turns the push off.
    set("OTEL_METRICS_EXPORTER", "none");
    assert!(!config.exports_otlp());
    set("OTEL_METRICS_EXPORTER", "otlp");
    assert!(config.exports_otlp());
    set("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json");
    assert!(
        config
            .resolved_protocol()
            .unwrap_err()
            .to_string()
            .contains("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"),
        "an unsupported protocol names its variable"
    );
}
