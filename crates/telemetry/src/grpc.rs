//! Trace context over gRPC (tonic) metadata.
//!
//! Clients add [`TraceContextInterceptor`] so every call carries the current
//! span's `traceparent`; servers install [`server_span`] with
//! `Server::builder().trace_fn(mtswarm_telemetry::grpc::server_span)`, so each
//! request runs in a span whose parent is the caller's span. Handlers that
//! build their own spans use [`set_parent_from_metadata`].

use opentelemetry::propagation::{Extractor, Injector};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};

use crate::TelemetryError;
use crate::propagation;

/// [`Injector`] writing ASCII metadata entries into a tonic `MetadataMap`.
pub struct MetadataInjector<'a>(pub &'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // Keys/values that are not valid gRPC metadata cannot be sent; drop them
        // rather than fail the call over tracing data.
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// [`Extractor`] reading ASCII metadata entries from a tonic `MetadataMap`.
pub struct MetadataExtractor<'a>(pub &'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// [`Extractor`] over raw HTTP headers (what `trace_fn` sees).
pub struct HttpHeaderExtractor<'a>(pub &'a tonic::codegen::http::HeaderMap);

impl Extractor for HttpHeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|key| key.as_str()).collect()
    }
}

/// Writes the current span's trace context into `metadata`.
pub fn inject_current_into_metadata(metadata: &mut MetadataMap) {
    propagation::inject_current(&mut MetadataInjector(metadata));
}

/// Makes the caller's span (from request metadata) the parent of `span`.
/// `Ok(false)` when the request carried no trace context.
pub fn set_parent_from_metadata(
    span: &tracing::Span,
    metadata: &MetadataMap,
) -> Result<bool, TelemetryError> {
    propagation::set_parent_from(span, &MetadataExtractor(metadata))
}

/// Client interceptor adding the current span's `traceparent`/`tracestate` to
/// every request: `ControlClient::with_interceptor(channel, TraceContextInterceptor)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContextInterceptor;

impl tonic::service::Interceptor for TraceContextInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        inject_current_into_metadata(request.metadata_mut());
        Ok(request)
    }
}

/// Span for one incoming gRPC request, child of the caller's span when the
/// request carries trace context. Use as
/// `tonic::transport::Server::builder().trace_fn(server_span)`.
pub fn server_span(request: &tonic::codegen::http::Request<()>) -> tracing::Span {
    let path = request.uri().path();
    let span = tracing::info_span!(
        "grpc.server",
        otel.name = path,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.method = path,
    );
    if let Err(error) = propagation::set_parent_from(&span, &HttpHeaderExtractor(request.headers()))
    {
        tracing::debug!(%error, "request trace context not applied");
    }
    span
}
