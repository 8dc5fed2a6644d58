//! OTLP configured by the standard environment variables alone: with
//! nothing in the `TelemetryConfig`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` decide where spans go,
//! how, with which headers and under which resource; and
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` alone is enough (used as it is).
//! The receiver is a real HTTP server on 127.0.0.1:0 taking protobuf
//! bodies, as a collector's `otlphttp` receiver does.
//!
//! The variables are the process's, so this binary holds one test that
//! runs its cases in order.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use mtswarm_telemetry::{TelemetryConfig, init_scoped};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use tokio::sync::mpsc;

mod common;
use common::{next, set, start_receiver, unset};

type Export = common::Export<ExportTraceServiceRequest>;

/// Exports one span named `name` with a configuration that names nothing
/// but the service, and returns the first request the receiver gets.
async fn export_one(name: &'static str, exports: &mut mpsc::Receiver<Export>) -> Export {
    let config = TelemetryConfig::new("named-in-code");
    assert_eq!(config.otlp_endpoint, None);
    assert_eq!(config.otlp_protocol, None);
    let mut telemetry = init_scoped(config).expect("scoped telemetry");
    tracing::info_span!("env", otel.name = name).in_scope(|| {});
    telemetry.shutdown().expect("flush");
    next(exports).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_protobuf_from_the_environment_alone() {
    let (addr, mut exports) = start_receiver().await;

    // The common endpoint: the exporter adds /v1/traces.
    set("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    set("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}"));
    set("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=lab-7,x-team=tuning");
    set("OTEL_SERVICE_NAME", "named-by-env");
    set(
        "OTEL_RESOURCE_ATTRIBUTES",
        "deployment.environment.name=test,host.name=board-host",
    );
    let export = export_one("from the common endpoint", &mut exports).await;
    assert_eq!(export.path, "/v1/traces");
    assert_eq!(export.content_type(), "application/x-protobuf");
    assert_eq!(export.header("x-tenant"), Some("lab-7"));
    assert_eq!(export.header("x-team"), Some("tuning"));
    assert_eq!(
        export.resource_attribute("service.name").as_deref(),
        Some("named-by-env")
    );
    assert_eq!(
        export
            .resource_attribute("deployment.environment.name")
            .as_deref(),
        Some("test")
    );
    assert_eq!(
        export.resource_attribute("host.name").as_deref(),
        Some("board-host")
    );
    assert_eq!(export.span_names(), vec!["from the common endpoint"]);

    // The traces endpoint alone, with a path of its own, used as it is; the
    // traces protocol variable wins over the common one; without
    // OTEL_SERVICE_NAME the process's own name applies.
    unset("OTEL_EXPORTER_OTLP_ENDPOINT");
    unset("OTEL_SERVICE_NAME");
    set("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
    set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf");
    set(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        &format!("http://{addr}/gateway/traces"),
    );
    let export = export_one("from the traces endpoint", &mut exports).await;
    assert_eq!(export.path, "/gateway/traces");
    assert_eq!(
        export.resource_attribute("service.name").as_deref(),
        Some("named-in-code")
    );
    assert_eq!(export.span_names(), vec!["from the traces endpoint"]);
}
