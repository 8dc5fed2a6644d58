//! W3C trace-context propagation between processes.
//!
//! Every message that crosses a process boundary (NATS headers, gRPC metadata,
//! stored records such as a job's root span) carries `traceparent` and
//! `tracestate`, so one job is one trace across the leader and all workers.
//! These helpers work on OpenTelemetry's [`Injector`]/[`Extractor`] traits;
//! transport adapters implement them ([`crate::grpc`] for gRPC metadata, the bus
//! crate for NATS headers, `HashMap<String, String>` out of the box,
//! [`FnInjector`] for anything else).
//!
//! The W3C propagator is used directly rather than through the global one, so
//! propagation works even in processes (and tests) that never called
//! [`crate::init`].

use std::collections::HashMap;
use std::sync::LazyLock;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::TelemetryError;

/// Header carrying the W3C trace parent.
pub const TRACEPARENT: &str = "traceparent";
/// Header carrying the W3C vendor trace state.
pub const TRACESTATE: &str = "tracestate";

static PROPAGATOR: LazyLock<TraceContextPropagator> = LazyLock::new(TraceContextPropagator::new);

/// Writes `context`'s span context into `injector` (nothing when it has no valid span).
pub fn inject_context(context: &Context, injector: &mut dyn Injector) {
    PROPAGATOR.inject_context(context, injector);
}

/// Writes the current `tracing` span's OpenTelemetry context into `injector`.
pub fn inject_current(injector: &mut dyn Injector) {
    inject_context(&tracing::Span::current().context(), injector);
}

/// Writes `span`'s OpenTelemetry context into `injector`.
pub fn inject_span(span: &tracing::Span, injector: &mut dyn Injector) {
    inject_context(&span.context(), injector);
}

/// Reads a remote span context from `extractor`. The result has no valid span
/// (see [`has_remote_parent`]) when the carrier had no or a malformed
/// `traceparent`.
pub fn extract_context(extractor: &dyn Extractor) -> Context {
    PROPAGATOR.extract(extractor)
}

/// True when `context` holds a valid (remote or local) span context.
pub fn has_remote_parent(context: &Context) -> bool {
    context.span().span_context().is_valid()
}

/// Makes `parent` the parent of `span`. Must be called before `span` is first
/// entered. A context without a valid span is ignored (the span keeps its
/// local parent) and `Ok(false)` is returned.
pub fn set_parent(span: &tracing::Span, parent: Context) -> Result<bool, TelemetryError> {
    if !has_remote_parent(&parent) {
        return Ok(false);
    }
    span.set_parent(parent)?;
    Ok(true)
}

/// Extracts the remote context from `extractor` and makes it `span`'s parent
/// (see [`set_parent`]). `Ok(false)` when the carrier had no trace context.
pub fn set_parent_from(
    span: &tracing::Span,
    extractor: &dyn Extractor,
) -> Result<bool, TelemetryError> {
    set_parent(span, extract_context(extractor))
}

/// The current span's context as `traceparent` (and `tracestate` when not
/// empty), e.g. to store a job's root span in its record. `None` without a
/// valid span.
pub fn current_trace_headers() -> Option<HashMap<String, String>> {
    let mut carrier = HashMap::new();
    inject_current(&mut carrier);
    carrier.contains_key(TRACEPARENT).then_some(carrier)
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`),
/// as trace backends show it; `None` for a value that is not one.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.trim().split('-');
    let (_version, trace_id, span_id) = (parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(trace_id, 32) && hex(span_id, 16) && trace_id.bytes().any(|b| b != b'0'))
        .then_some(trace_id)
}

/// Rebuilds a context from a stored `traceparent` (and optional `tracestate`).
pub fn context_from_traceparent(traceparent: &str, tracestate: Option<&str>) -> Context {
    let mut carrier = HashMap::new();
    carrier.insert(TRACEPARENT.to_string(), traceparent.to_string());
    if let Some(state) = tracestate {
        carrier.insert(TRACESTATE.to_string(), state.to_string());
    }
    extract_context(&carrier)
}

/// Trace id of `span`, when it has a valid OpenTelemetry context.
pub fn trace_id(span: &tracing::Span) -> Option<TraceId> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| span_context.trace_id())
}

/// Span id of `span`, when it has a valid OpenTelemetry context.
pub fn span_id(span: &tracing::Span) -> Option<SpanId> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| span_context.span_id())
}

/// An [`Injector`] over a closure, for carriers this crate does not know
/// (e.g. `FnInjector(|key, value| headers.insert(key, value))`).
pub struct FnInjector<F: FnMut(&str, String)>(pub F);

impl<F: FnMut(&str, String)> Injector for FnInjector<F> {
    fn set(&mut self, key: &str, value: String) {
        (self.0)(key, value);
    }
}

/// An [`Extractor`] over a lookup closure plus the list of keys it knows.
pub struct FnExtractor<'a, G: Fn(&str) -> Option<&'a str>> {
    /// Returns the value of a header/key, if present.
    pub get: G,
    /// All keys present in the carrier.
    pub keys: Vec<&'a str>,
}

impl<'a, G: Fn(&str) -> Option<&'a str>> Extractor for FnExtractor<'a, G> {
    fn get(&self, key: &str) -> Option<&str> {
        (self.get)(key)
    }
    fn keys(&self) -> Vec<&str> {
        self.keys.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ScopedTelemetry, TelemetryConfig, init_scoped};

    /// Telemetry for this thread that keeps every span (`trace`).
    fn scoped(service: &str) -> ScopedTelemetry {
        let mut config = TelemetryConfig::new(service);
        config.log_filter = Some("trace".into());
        init_scoped(config).expect("scoped telemetry")
    }

    #[test]
    fn trace_id_of_reads_only_well_formed_traceparents() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            trace_id_of(&format!("00-{id}-00f067aa0ba902b7-01")),
            Some(id)
        );
        assert_eq!(trace_id_of(""), None);
        assert_eq!(trace_id_of("00-abc-00f067aa0ba902b7-01"), None);
        assert_eq!(
            trace_id_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            None
        );
    }

    #[test]
    fn round_trip_through_a_map_keeps_trace_and_parent() {
        let _telemetry = scoped("propagation-test");

        let sender = tracing::info_span!("sender");
        let mut carrier: HashMap<String, String> = HashMap::new();
        sender.in_scope(|| inject_current(&mut carrier));
        assert!(carrier.contains_key(TRACEPARENT), "{carrier:?}");

        let receiver = tracing::info_span!(parent: None, "receiver");
        assert!(set_parent_from(&receiver, &carrier).expect("set parent"));
        assert_eq!(trace_id(&receiver), trace_id(&sender));
        assert_ne!(span_id(&receiver), span_id(&sender));
    }

    #[test]
    fn missing_or_malformed_traceparent_is_not_a_parent() {
        let empty: HashMap<String, String> = HashMap::new();
        assert!(!has_remote_parent(&extract_context(&empty)));
        let bad = context_from_traceparent("00-not-a-trace-01", None);
        assert!(!has_remote_parent(&bad));
        let good = context_from_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        );
        assert!(has_remote_parent(&good));
        assert_eq!(
            good.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }

    #[test]
    fn fn_adapters_carry_context() {
        let _telemetry = scoped("fn-adapter-test");
        let span = tracing::info_span!("producer");
        let mut pairs: Vec<(String, String)> = Vec::new();
        inject_span(
            &span,
            &mut FnInjector(|k: &str, v| pairs.push((k.to_string(), v))),
        );
        let extractor = FnExtractor {
            get: |key: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.as_str())
            },
            keys: pairs.iter().map(|(k, _)| k.as_str()).collect(),
        };
        let context = extract_context(&extractor);
        assert_eq!(
            Some(context.span().span_context().trace_id()),
            trace_id(&span)
        );
    }
}
