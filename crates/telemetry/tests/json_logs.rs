//! JSON log lines inside a traced span carry that span's `trace_id` and
//! `span_id`; lines outside any span carry neither. And the exporter's
//! GenAI pass types `gen_ai.response.finish_reasons` as a string array.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::io::Write;
use std::sync::{Arc, Mutex};

use mtswarm_telemetry::genai::conform;
use mtswarm_telemetry::json_logs::TraceJsonFormat;
use opentelemetry::trace::{TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Array, KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn json_lines_name_the_trace_and_span_they_were_logged_in() {
    let provider = SdkTracerProvider::builder().build();
    let lines = Lines::default();
    let writer = lines.clone();
    let format = TraceJsonFormat::new();
    let binder = format.binder();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("json-test")))
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .event_format(format)
                .with_writer(move || writer.clone()),
        );
    let dispatch = tracing::Dispatch::new(subscriber);
    binder.bind(&dispatch);
    let (trace_id, span_id) = tracing::dispatcher::with_default(&dispatch, || {
        tracing::info!("outside");
        let span = tracing::info_span!("job");
        let _entered = span.enter();
        tracing::info!(job.id = "j1", "inside");
        let context = span.context();
        let otel = context.span();
        (
            otel.span_context().trace_id().to_string(),
            otel.span_context().span_id().to_string(),
        )
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let parsed: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect();
    assert_eq!(parsed.len(), 2, "{text}");
    assert!(parsed[0].get("trace_id").is_none(), "{}", parsed[0]);
    assert_eq!(parsed[1]["fields"]["message"], "inside");
    assert_eq!(parsed[1]["trace_id"], trace_id.as_str());
    assert_eq!(parsed[1]["span_id"], span_id.as_str());
    assert_eq!(trace_id.len(), 32);
}

/// Keeps what it is given.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

#[test]
fn finish_reasons_leave_as_a_string_array() {
    let collected = Collected::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(collected.clone())
        .build();
    let tracer = provider.tracer("genai-test");
    let span = tracer
        .span_builder("chat m")
        .with_attributes([
            KeyValue::new("gen_ai.response.finish_reasons", "tool_calls"),
            KeyValue::new("gen_ai.operation.name", "chat"),
        ])
        .start(&tracer);
    drop(span);
    let mut spans = collected.0.lock().unwrap().clone();
    conform(&mut spans[0]);
    let value = |key: &str| {
        spans[0]
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    };
    assert_eq!(
        value("gen_ai.response.finish_reasons"),
        Some(Value::Array(Array::String(vec!["tool_calls".into()])))
    );
    assert_eq!(value("gen_ai.operation.name"), Some(Value::from("chat")));
}
