//! Spans reach a real OTLP/HTTP receiver (an in-process HTTP server on
//! 127.0.0.1:0 that accepts `POST /v1/traces` with protobuf bodies, as a
//! collector's `otlphttp` receiver does) when the protocol is
//! `http/protobuf`, and spans are exported even when the log filter is
//! quieter than their level.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::Duration;

use mtswarm_telemetry::{OtlpProtocol, TelemetryConfig, http_traces_url, init_scoped};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

mod common;
use common::start_receiver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_exports_to_v1_traces_whatever_the_log_filter() {
    let (addr, mut exports) = start_receiver::<ExportTraceServiceRequest>().await;
    let mut config = TelemetryConfig::new("telemetry-http-test");
    config.otlp_endpoint = Some(format!("http://{addr}"));
    config.otlp_protocol = Some(OtlpProtocol::HttpProtobuf);
    // Quieter than the span: logs are filtered, the span is still exported.
    config.log_filter = Some("warn".into());
    let mut telemetry = init_scoped(config).expect("scoped telemetry");
    {
        let root = tracing::info_span!("cli.submit");
        let _entered = root.enter();
        tracing::info_span!("step").in_scope(|| {});
    }
    telemetry.shutdown().expect("flush");

    let export = tokio::time::timeout(Duration::from_secs(20), exports.recv())
        .await
        .expect("an export within 20 s")
        .expect("receiver alive");
    assert_eq!(export.path, "/v1/traces");
    assert_eq!(export.content_type(), "application/x-protobuf");
    let names = export.span_names();
    assert!(
        names.contains(&"cli.submit".to_string()) && names.contains(&"step".to_string()),
        "{names:?}"
    );
}

#[test]
fn http_traces_url_adds_the_standard_path_only_when_there_is_none() {
    assert_eq!(
        http_traces_url("http://127.0.0.1:4318"),
        "http://127.0.0.1:4318/v1/traces"
    );
    assert_eq!(
        http_traces_url("http://127.0.0.1:4318/"),
        "http://127.0.0.1:4318/v1/traces"
    );
    assert_eq!(
        http_traces_url("https://gateway.example/otlp/v1/traces"),
        "https://gateway.example/otlp/v1/traces"
    );
}

#[test]
fn unknown_protocols_are_errors_naming_the_supported_ones() {
    let error = OtlpProtocol::parse("http/json").expect_err("not supported");
    let message = error.to_string();
    assert!(
        message.contains("http/json") && message.contains("http/protobuf"),
        "{message}"
    );
    assert_eq!(
        OtlpProtocol::parse("grpc").expect("grpc"),
        OtlpProtocol::Grpc
    );
}
