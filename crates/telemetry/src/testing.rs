//! An in-process OTLP/gRPC trace collector for tests (the `TraceService` of
//! opentelemetry-proto served by tonic on 127.0.0.1:0), behind the cargo
//! feature `testing`: this crate's own export tests and the end-to-end tests
//! export to it (directly, or through `OTEL_EXPORTER_OTLP_ENDPOINT` from
//! processes under test) and read back every span with the `service.name`
//! of the process that sent it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// One exported span with the exporting process's `service.name`.
#[derive(Debug, Clone)]
pub struct CollectedSpan {
    /// The `service.name` of the exporting process.
    pub service_name: String,
    /// The span as exported.
    pub span: Span,
}

impl CollectedSpan {
    /// The trace id in hex.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.span.trace_id)
    }
    /// The span id in hex.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span.span_id)
    }
    /// Empty for a root span.
    pub fn parent_span_id_hex(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    /// String value of a span attribute.
    pub fn attribute(&self, key: &str) -> Option<String> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|value| match value {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::BoolValue(b) => b.to_string(),
                Value::DoubleValue(d) => d.to_string(),
                other => format!("{other:?}"),
            })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Default)]
struct Shared {
    spans: Mutex<Vec<CollectedSpan>>,
    arrived: Notify,
}

struct Receiver {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service_name = resource_spans
                .resource
                .iter()
                .flat_map(|resource| resource.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone())
                .map(|value| match value {
                    Value::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    received.push(CollectedSpan {
                        service_name: service_name.clone(),
                        span,
                    });
                }
            }
        }
        if let Ok(mut spans) = self.shared.spans.lock() {
            spans.extend(received);
        }
        self.shared.arrived.notify_waiters();
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running collector; stops serving when dropped.
pub struct OtlpCollector {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

impl OtlpCollector {
    /// Serves on a free port of 127.0.0.1 (call inside a tokio runtime).
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let service = TraceServiceServer::new(Receiver {
            shared: shared.clone(),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                    stop_rx.await.ok();
                }),
        );
        Ok(Self {
            addr,
            shared,
            _stop: stop_tx,
        })
    }

    /// `http://127.0.0.1:PORT`, the value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.shared
            .spans
            .lock()
            .map(|spans| spans.clone())
            .unwrap_or_default()
    }

    /// Waits until `done` holds for the spans received so far, at most
    /// `timeout`; returns the spans either way with whether `done` held.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[CollectedSpan]) -> bool,
    ) -> (bool, Vec<CollectedSpan>) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register interest before looking, so no export is missed in between.
            let arrived = self.shared.arrived.notified();
            let spans = self.spans();
            if done(&spans) {
                return (true, spans);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                let spans = self.spans();
                let held = done(&spans);
                return (held, spans);
            }
        }
    }
}
