//! A daemon's metrics: the meter provider (OTLP as the standard variables
//! say) and, with `--metrics-addr`, the Prometheus scrape endpoint. Set up
//! right after logging and tracing, before the daemon records anything.

use std::net::SocketAddr;

use anyhow::Context as _;
use mtswarm_telemetry::metrics::endpoint::MetricsEndpoint;
use mtswarm_telemetry::metrics::provider::{MetricsConfig, MetricsGuard, init_metrics};

use crate::common::TelemetryArgs;

/// What a daemon keeps of its metrics until it stops.
#[derive(Debug, Default)]
pub(crate) struct DaemonMetrics {
    guard: Option<MetricsGuard>,
    endpoint: Option<MetricsEndpoint>,
}

impl DaemonMetrics {
    /// Installs the meter provider of `service_name` when metrics go
    /// anywhere (a `/metrics` endpoint on `addr`, or an OTLP collector the
    /// environment or `--otlp-endpoint` names); otherwise the instruments
    /// stay no-ops.
    pub(crate) async fn start(
        telemetry: &TelemetryArgs,
        service_name: &str,
        addr: Option<SocketAddr>,
    ) -> anyhow::Result<Self> {
        let mut config = MetricsConfig::new(service_name);
        config.otlp_endpoint = telemetry
            .otlp_endpoint
            .clone()
            .filter(|e| !e.trim().is_empty());
        config.otlp_protocol = telemetry.otlp_protocol;
        Self::start_with(config, addr).await
    }

    /// [`DaemonMetrics::start`] with the OTLP settings of `config`.
    pub(crate) async fn start_with(
        mut config: MetricsConfig,
        addr: Option<SocketAddr>,
    ) -> anyhow::Result<Self> {
        config.prometheus = addr.is_some();
        if !config.prometheus && !config.exports_otlp() {
            return Ok(Self::default());
        }
        let guard = init_metrics(&config).context("setting up metrics")?;
        let endpoint = match (addr, guard.registry()) {
            (Some(addr), Some(registry)) => Some(
                MetricsEndpoint::serve(addr, registry.clone())
                    .await
                    .with_context(|| format!("serving metrics on {addr} (--metrics-addr)"))?,
            ),
            _ => None,
        };
        if let Some(endpoint) = &endpoint {
            tracing::info!(url = %endpoint.url(), "serving Prometheus metrics");
        }
        Ok(Self {
            guard: Some(guard),
            endpoint,
        })
    }

    /// `http://ADDR/metrics` when the endpoint runs.
    pub(crate) fn url(&self) -> Option<String> {
        self.endpoint.as_ref().map(|endpoint| {
            let addr = endpoint.local_addr();
            if addr.ip().is_unspecified() {
                format!("http://127.0.0.1:{}/metrics", addr.port())
            } else {
                endpoint.url()
            }
        })
    }

    /// Stops the endpoint and pushes the last values (OTLP).
    pub(crate) async fn shutdown(mut self) {
        if let Some(endpoint) = self.endpoint.take() {
            endpoint.shutdown().await;
        }
        if let Some(mut guard) = self.guard.take()
            && let Err(error) = guard.shutdown()
        {
            eprintln!("mtswarm: flushing metrics: {error}");
        }
    }
}
