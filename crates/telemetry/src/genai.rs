//! What the OTLP export adds to the spans of `mtswarm_core::TracingMiddleware`
//! so they match the OpenTelemetry GenAI semantic conventions v1.41.1:
//! `tracing` fields carry only scalars, while the conventions type
//! `gen_ai.response.finish_reasons` as a string array. [`GenAiSpanExporter`]
//! wraps the OTLP exporter and turns that one attribute into a `string[]`
//! (comma-separated values, one per choice) before the spans leave.

use std::time::Duration;

use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Attributes the conventions type as `string[]`.
const STRING_ARRAY_ATTRIBUTES: &[&str] = &["gen_ai.response.finish_reasons"];

/// A span exporter that hands `inner` the spans with the attributes of
/// [`STRING_ARRAY_ATTRIBUTES`] as string arrays.
#[derive(Debug)]
pub struct GenAiSpanExporter<E> {
    inner: E,
}

impl<E> GenAiSpanExporter<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self { inner }
    }
}

/// `value` as the array the conventions name, when it is a string.
fn as_string_array(value: &Value) -> Option<Value> {
    match value {
        Value::String(text) => {
            let items: Vec<StringValue> = text
                .as_str()
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| StringValue::from(item.to_string()))
                .collect();
            Some(Value::Array(Array::String(items)))
        }
        _ => None,
    }
}

/// Rewrites the attributes of one span in place.
pub fn conform(span: &mut SpanData) {
    for attribute in &mut span.attributes {
        if STRING_ARRAY_ATTRIBUTES.contains(&attribute.key.as_str())
            && let Some(array) = as_string_array(&attribute.value)
        {
            *attribute = KeyValue::new(attribute.key.clone(), array);
        }
    }
}

impl<E: SpanExporter> SpanExporter for GenAiSpanExporter<E> {
    fn export(
        &self,
        mut batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        batch.iter_mut().for_each(conform);
        self.inner.export(batch)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
