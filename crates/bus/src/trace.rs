//! W3C trace context in NATS headers: publishers inject the current `tracing`
//! span's OpenTelemetry context (`traceparent`, `tracestate`), receivers
//! extract it and make it the parent of their processing span, so a job is
//! one trace across the leader and every worker.

use std::str::FromStr as _;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use mtswarm_telemetry::TelemetryError;
use mtswarm_telemetry::propagation;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};

/// [`Injector`] writing into NATS headers.
pub struct NatsHeaderInjector<'a>(pub &'a mut HeaderMap);

impl Injector for NatsHeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // A header that NATS cannot carry is dropped: tracing data must never
        // make a publish fail.
        if let (Ok(name), Ok(value)) = (HeaderName::from_str(key), HeaderValue::from_str(&value)) {
            self.0.insert(name, value);
        }
    }
}

/// [`Extractor`] reading NATS headers.
pub struct NatsHeaderExtractor<'a>(pub &'a HeaderMap);

impl Extractor for NatsHeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(HeaderValue::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

/// Writes the current span's trace context into `headers`.
pub fn inject_current(headers: &mut HeaderMap) {
    propagation::inject_current(&mut NatsHeaderInjector(headers));
}

/// The remote context carried by `headers` (no valid span when absent).
pub fn context_from_headers(headers: &HeaderMap) -> Context {
    propagation::extract_context(&NatsHeaderExtractor(headers))
}

/// Makes the publisher's span (from `headers`) the parent of `span`. Call
/// before `span` is entered. `Ok(false)` when the message had no trace context.
pub fn set_parent_from_headers(
    span: &tracing::Span,
    headers: &HeaderMap,
) -> Result<bool, TelemetryError> {
    propagation::set_parent(span, context_from_headers(headers))
}
