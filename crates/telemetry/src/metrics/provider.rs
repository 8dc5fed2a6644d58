//! The process's meter provider: where the instruments of [`super::Metrics`]
//! go. A daemon reads them into a Prometheus registry (served by
//! [`super::endpoint`]) and, when the standard OpenTelemetry variables name
//! a collector, also pushes them over OTLP (gRPC or HTTP/protobuf) on the
//! SDK's periodic reader (`OTEL_METRIC_EXPORT_INTERVAL`, 60 s by default).
//!
//! The collector is `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (used as it is),
//! else `OTEL_EXPORTER_OTLP_ENDPOINT` (plus `/v1/metrics` over HTTP), else
//! the endpoint configured for the process's spans; the protocol
//! `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`,
//! else gRPC; headers come from `OTEL_EXPORTER_OTLP_{,METRICS_}HEADERS`,
//! read by the exporter. `OTEL_METRICS_EXPORTER=none` keeps the metrics
//! off OTLP (the Prometheus endpoint stays).

use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;

use crate::owned_provider::OwnedProvider;
use crate::{EXPORT_TIMEOUT, OtlpProtocol, SERVICE_NAME_ENV, TelemetryError, non_empty_env};

/// Standard OpenTelemetry variable for the metrics endpoint (used as it is).
pub const OTLP_METRICS_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
/// Standard OpenTelemetry variable choosing the metrics exporter; `none`
/// turns the OTLP push off.
pub const METRICS_EXPORTER_ENV: &str = "OTEL_METRICS_EXPORTER";
/// Standard OpenTelemetry variables for the metrics transport, most
/// specific first.
pub const OTLP_METRICS_PROTOCOL_ENVS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// What [`init_metrics`] sets up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `service.name` of the resource (`OTEL_SERVICE_NAME` wins).
    pub service_name: String,
    /// Read the instruments into a Prometheus registry for a `/metrics`
    /// endpoint.
    pub prometheus: bool,
    /// Collector of the process's spans (the `--otlp-endpoint` flag),
    /// used for metrics when no standard variable names one.
    pub otlp_endpoint: Option<String>,
    /// Transport of that collector (the `--otlp-protocol` flag), used when
    /// no standard variable names one.
    pub otlp_protocol: Option<OtlpProtocol>,
}

impl MetricsConfig {
    /// Prometheus registry on, OTLP as the environment says.
    pub fn new(service_name: impl Into<String>) -> Self {
        Self {
            service_name: service_name.into(),
            prometheus: true,
            otlp_endpoint: None,
            otlp_protocol: None,
        }
    }

    /// Whether metrics are pushed over OTLP: a standard variable or the
    /// configured endpoint names a collector, and `OTEL_METRICS_EXPORTER`
    /// does not say `none` (the standard way to keep a process's metrics
    /// from a collector that takes only traces).
    pub fn exports_otlp(&self) -> bool {
        let turned_off = non_empty_env(METRICS_EXPORTER_ENV)
            .is_some_and(|value| value.split(',').all(|e| e.trim() == "none"));
        !turned_off && self.names_a_collector()
    }

    fn names_a_collector(&self) -> bool {
        non_empty_env(OTLP_METRICS_ENDPOINT_ENV).is_some()
            || non_empty_env(crate::OTLP_ENDPOINT_ENV).is_some()
            || self
                .otlp_endpoint
                .as_deref()
                .is_some_and(|e| !e.trim().is_empty())
    }

    /// The metrics transport (see the module docs); an unknown value in
    /// the environment is an error naming the variable.
    pub fn resolved_protocol(&self) -> Result<OtlpProtocol, TelemetryError> {
        for variable in OTLP_METRICS_PROTOCOL_ENVS {
            if let Some(value) = non_empty_env(variable) {
                return OtlpProtocol::parse(&value).map_err(|_| {
                    TelemetryError::UnsupportedProtocolEnv {
                        variable,
                        value: value.clone(),
                    }
                });
            }
        }
        Ok(self.otlp_protocol.unwrap_or_default())
    }

    /// The endpoint to hand the exporter: `None` when a standard variable
    /// names one (the exporter reads it), else the configured one.
    fn explicit_endpoint(&self, protocol: OtlpProtocol) -> Option<String> {
        if non_empty_env(OTLP_METRICS_ENDPOINT_ENV).is_some()
            || non_empty_env(crate::OTLP_ENDPOINT_ENV).is_some()
        {
            return None;
        }
        let endpoint = self.otlp_endpoint.as_deref()?.trim();
        if endpoint.is_empty() {
            return None;
        }
        Some(match protocol {
            OtlpProtocol::Grpc => endpoint.to_string(),
            OtlpProtocol::HttpProtobuf => http_metrics_url(endpoint),
        })
    }
}

/// The OTLP/HTTP metrics URL for a collector address: a URL without a
/// path gets the standard `/v1/metrics`, one with a path is used as it is.
pub fn http_metrics_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim().trim_end_matches('/');
    let has_path = trimmed
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    if has_path {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1/metrics")
    }
}

/// Keeps the meter provider; flushes and shuts it down on drop.
#[must_use = "dropping the guard shuts metrics down"]
#[derive(Debug)]
pub struct MetricsGuard {
    provider: OwnedProvider<SdkMeterProvider>,
    registry: Option<prometheus::Registry>,
    otlp: bool,
}

impl MetricsGuard {
    /// The registry the Prometheus endpoint serves (when asked for).
    pub fn registry(&self) -> Option<&prometheus::Registry> {
        self.registry.as_ref()
    }

    /// True when metrics are pushed over OTLP.
    pub fn is_exporting(&self) -> bool {
        self.otlp
    }

    /// Pushes the current values now (OTLP).
    pub fn force_flush(&self) -> Result<(), TelemetryError> {
        self.provider.force_flush()
    }

    /// Flushes and stops the readers (also on drop). Later calls are no-ops.
    pub fn shutdown(&mut self) -> Result<(), TelemetryError> {
        self.provider.shutdown()
    }
}

/// Builds the meter provider `config` describes and makes it the global
/// one, which [`super::metrics`] and the observers create their
/// instruments from. Call once, inside the tokio runtime, before the
/// daemon records anything.
pub fn init_metrics(config: &MetricsConfig) -> Result<MetricsGuard, TelemetryError> {
    if super::instruments_created() {
        return Err(TelemetryError::MetricsAlreadyRecorded);
    }
    let mut resource = Resource::builder();
    if non_empty_env(SERVICE_NAME_ENV).is_none() {
        resource = resource.with_service_name(config.service_name.clone());
    }
    let mut builder = SdkMeterProvider::builder().with_resource(resource.build());
    let registry = if config.prometheus {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(TelemetryError::PrometheusExporter)?;
        builder = builder.with_reader(exporter);
        Some(registry)
    } else {
        None
    };
    let otlp = config.exports_otlp();
    if otlp {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(TelemetryError::NoTokioRuntime);
        }
        let protocol = config.resolved_protocol()?;
        let endpoint = config.explicit_endpoint(protocol);
        let exporter_error = |source| TelemetryError::MetricExporter {
            endpoint: endpoint
                .clone()
                .unwrap_or_else(|| format!("from the environment ({})", protocol.as_str())),
            source,
        };
        let exporter = match protocol {
            OtlpProtocol::Grpc => {
                let mut exporter = opentelemetry_otlp::MetricExporter::builder()
                    .with_tonic()
                    .with_timeout(EXPORT_TIMEOUT);
                if let Some(endpoint) = &endpoint {
                    exporter = exporter.with_endpoint(endpoint);
                }
                exporter.build().map_err(exporter_error)?
            }
            OtlpProtocol::HttpProtobuf => {
                let mut exporter = opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_timeout(EXPORT_TIMEOUT);
                if let Some(endpoint) = &endpoint {
                    exporter = exporter.with_endpoint(endpoint);
                }
                exporter.build().map_err(exporter_error)?
            }
        };
        builder = builder.with_periodic_exporter(exporter);
    }
    let provider = builder.build();
    opentelemetry::global::set_meter_provider(provider.clone());
    Ok(MetricsGuard {
        provider: OwnedProvider::new(provider, "metrics shutdown on drop failed"),
        registry,
        otlp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_urls_get_the_standard_path() {
        assert_eq!(
            http_metrics_url("http://collector:4318"),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            http_metrics_url("http://collector:4318/"),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            http_metrics_url("https://proxy/otlp/v1/metrics"),
            "https://proxy/otlp/v1/metrics"
        );
    }
}
