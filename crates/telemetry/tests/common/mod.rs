//! A loopback OTLP/HTTP receiver shared by the telemetry tests: a real HTTP
//! server on 127.0.0.1:0 that decodes each protobuf body as `R` (a trace
//! or metrics export request), as a collector's `otlphttp` receiver does,
//! and hands every request to the test, with what the tests read of one
//! (headers, span and metric names, resource attributes); plus the
//! environment helpers of the tests that configure OTLP through the
//! standard variables.

#![allow(dead_code)] // each test binary uses its own share of these

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::mpsc;

/// One request the receiver got: its path, headers and decoded body.
#[derive(Debug)]
pub(crate) struct Export<R> {
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) request: R,
}

impl<R> Export<R> {
    /// The request's content type ("" when none was sent).
    pub(crate) fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or_default()
    }

    /// The value of the header `name`, if it was sent as text.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Export<ExportTraceServiceRequest> {
    /// The names of the exported spans, in order.
    pub(crate) fn span_names(&self) -> Vec<String> {
        self.request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| s.name.clone())
            .collect()
    }

    /// The resource attribute `key` of the exported spans.
    pub(crate) fn resource_attribute(&self, key: &str) -> Option<String> {
        let resources = self.request.resource_spans.iter();
        attribute(resources.filter_map(|r| r.resource.as_ref()), key)
    }
}

impl Export<ExportMetricsServiceRequest> {
    /// The names of the exported metrics.
    pub(crate) fn metric_names(&self) -> BTreeSet<String> {
        self.request
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(|m| m.name.clone())
            .collect()
    }

    /// The resource attribute `key` of the exported metrics.
    pub(crate) fn resource_attribute(&self, key: &str) -> Option<String> {
        let resources = self.request.resource_metrics.iter();
        attribute(resources.filter_map(|r| r.resource.as_ref()), key)
    }
}

/// The first attribute `key` of `resources`, a string as it is, any other
/// value as it prints.
fn attribute<'a>(resources: impl Iterator<Item = &'a Resource>, key: &str) -> Option<String> {
    resources
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
        .map(|value| match value {
            Value::StringValue(s) => s,
            other => format!("{other:?}"),
        })
}

/// Starts the receiver; a body that does not decode as `R` is answered 400.
pub(crate) async fn start_receiver<R>() -> (std::net::SocketAddr, mpsc::Receiver<Export<R>>)
where
    R: prost::Message + Default + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    let app = axum::Router::new()
        .route(
            "/{*path}",
            axum::routing::post(
                |State(tx): State<mpsc::Sender<Export<R>>>,
                 uri: axum::http::Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let Ok(request) = R::decode(body) else {
                        return StatusCode::BAD_REQUEST;
                    };
                    let export = Export {
                        path: uri.path().to_string(),
                        headers,
                        request,
                    };
                    match tx.send(export).await {
                        Ok(()) => StatusCode::OK,
                        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                    }
                },
            ),
        )
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let addr = listener.local_addr().expect("receiver addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, rx)
}

/// The next request, failing the test after 20 s.
pub(crate) async fn next<R>(exports: &mut mpsc::Receiver<Export<R>>) -> Export<R> {
    tokio::time::timeout(Duration::from_secs(20), exports.recv())
        .await
        .expect("an export within 20 s")
        .expect("receiver alive")
}

pub(crate) fn set(variable: &str, value: &str) {
    // SAFETY: each binary that changes the environment holds one test;
    // nothing else reads the environment while it changes.
    unsafe { std::env::set_var(variable, value) };
}

pub(crate) fn unset(variable: &str) {
    // SAFETY: as in `set`.
    unsafe { std::env::remove_var(variable) };
}
