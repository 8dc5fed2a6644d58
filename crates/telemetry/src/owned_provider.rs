//! An SDK provider a guard owns (the tracer provider of
//! [`crate::TelemetryGuard`], the meter provider of
//! [`crate::metrics::provider::MetricsGuard`]): flushed on request and shut
//! down once, on request or when the guard is dropped.

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::TelemetryError;

/// What a guard does with its provider.
pub(crate) trait Provider {
    /// Exports what is pending now.
    fn force_flush(&self) -> OTelSdkResult;
    /// Flushes and stops the exporters.
    fn shutdown(&self) -> OTelSdkResult;
}

impl Provider for SdkTracerProvider {
    fn force_flush(&self) -> OTelSdkResult {
        SdkTracerProvider::force_flush(self)
    }
    fn shutdown(&self) -> OTelSdkResult {
        SdkTracerProvider::shutdown(self)
    }
}

impl Provider for SdkMeterProvider {
    fn force_flush(&self) -> OTelSdkResult {
        SdkMeterProvider::force_flush(self)
    }
    fn shutdown(&self) -> OTelSdkResult {
        SdkMeterProvider::shutdown(self)
    }
}

/// A provider until it is shut down.
#[derive(Debug)]
pub(crate) struct OwnedProvider<P: Provider> {
    provider: Option<P>,
    /// What a failed shutdown on drop is reported as (on stderr: tracing
    /// may be what failed).
    drop_failure: &'static str,
}

impl<P: Provider> OwnedProvider<P> {
    /// Owns `provider`; `drop_failure` names a shutdown on drop that failed.
    pub(crate) fn new(provider: P, drop_failure: &'static str) -> Self {
        Self {
            provider: Some(provider),
            drop_failure,
        }
    }

    /// The provider, until it is shut down.
    pub(crate) fn get(&self) -> Option<&P> {
        self.provider.as_ref()
    }

    /// Exports what is pending now.
    pub(crate) fn force_flush(&self) -> Result<(), TelemetryError> {
        match &self.provider {
            Some(provider) => Ok(provider.force_flush()?),
            None => Ok(()),
        }
    }

    /// Flushes and stops the exporters. Later calls are no-ops.
    pub(crate) fn shutdown(&mut self) -> Result<(), TelemetryError> {
        match self.provider.take() {
            Some(provider) => Ok(provider.shutdown()?),
            None => Ok(()),
        }
    }
}

impl<P: Provider> Drop for OwnedProvider<P> {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown() {
            eprintln!("mtswarm-telemetry: {}: {error}", self.drop_failure);
        }
    }
}
