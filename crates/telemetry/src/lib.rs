//! Logging and distributed tracing for every mtswarm process.
//!
//! One call, [`init`], installs a `tracing` subscriber made of:
//! - an env-filter (explicit filter, else `MTSWARM_LOG`, else `RUST_LOG`, else `info`),
//! - a fmt layer (human-readable or JSON lines on stderr),
//! - a tracing-opentelemetry layer, so every `tracing` span is an OpenTelemetry
//!   span. When an OTLP endpoint is configured (or `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   is set) spans are exported over OTLP/gRPC through a batch processor;
//!   without one, spans still get trace and span ids so trace context received
//!   from upstream is passed on downstream and a trace is not cut in two.
//!
//! The W3C TraceContext propagator is installed globally, and [`propagation`]
//! and [`grpc`] carry the current span's context across process boundaries
//! (NATS headers are adapted in the bus crate, gRPC metadata here).
//!
//! [`init_scoped`] builds the same stack as a thread-local default instead of a
//! global one, so several tests in one binary can each export to their own
//! collector.

pub mod grpc;
pub mod propagation;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Dispatch;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::{Layer as _, Registry};

/// Environment variable for the log filter (takes precedence over `RUST_LOG`).
pub const LOG_ENV: &str = "MTSWARM_LOG";
/// Standard OpenTelemetry variable for the OTLP endpoint.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Filter used when neither the config nor the environment gives one.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// How long an OTLP export may take before it is abandoned.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// What to set up. Build with [`TelemetryConfig::new`] and adjust the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// `service.name` resource attribute of exported spans (e.g. "mtswarm-leader").
    pub service_name: String,
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317`. `None` falls back
    /// to `OTEL_EXPORTER_OTLP_ENDPOINT`; when both are absent nothing is exported.
    pub otlp_endpoint: Option<String>,
    /// `tracing_subscriber::EnvFilter` directives. `None` falls back to
    /// `MTSWARM_LOG`, then `RUST_LOG`, then [`DEFAULT_LOG_FILTER`].
    pub log_filter: Option<String>,
    /// JSON lines instead of human-readable logs (for log shippers).
    pub json_logs: bool,
}

impl TelemetryConfig {
    /// Config with defaults: endpoint and filter from the environment, text logs.
    pub fn new(service_name: impl Into<String>) -> Self {
        Self {
            service_name: service_name.into(),
            otlp_endpoint: None,
            log_filter: None,
            json_logs: false,
        }
    }

    /// The endpoint spans will be exported to: the configured one, else the
    /// non-empty value of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn resolved_otlp_endpoint(&self) -> Option<String> {
        self.otlp_endpoint
            .clone()
            .filter(|endpoint| !endpoint.trim().is_empty())
            .or_else(|| {
                std::env::var(OTLP_ENDPOINT_ENV)
                    .ok()
                    .filter(|endpoint| !endpoint.trim().is_empty())
            })
    }

    /// The filter directives that will be used (see [`TelemetryConfig::log_filter`]).
    pub fn resolved_log_filter(&self) -> String {
        self.log_filter
            .clone()
            .or_else(|| std::env::var(LOG_ENV).ok())
            .or_else(|| std::env::var("RUST_LOG").ok())
            .filter(|filter| !filter.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_LOG_FILTER.to_string())
    }
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter {filter:?}: {source}")]
    InvalidLogFilter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error(
        "the OTLP exporter must be created inside a tokio runtime (call init from within #[tokio::main] or Runtime::block_on)"
    )]
    NoTokioRuntime,
    #[error("cannot build the OTLP span exporter for {endpoint:?}: {source}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInitialized(#[from] tracing::dispatcher::SetGlobalDefaultError),
    #[error("cannot set the parent of span: {0}")]
    SetParent(#[from] tracing_opentelemetry::SetParentError),
    #[error("flushing or shutting down the tracer provider failed: {0}")]
    Shutdown(#[from] opentelemetry_sdk::error::OTelSdkError),
}

/// Keeps the tracer provider alive; flushes and shuts it down on drop or
/// [`TelemetryGuard::shutdown`]. Keep it in `main` for the life of the process.
///
/// Drop it (or call `shutdown`) on a multi-threaded tokio runtime: on a
/// current-thread runtime the exporter cannot make progress while the drop
/// blocks, and the flush times out.
#[must_use = "dropping the guard shuts tracing export down"]
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    exporting: bool,
}

impl TelemetryGuard {
    /// True when spans are exported over OTLP.
    pub fn is_exporting(&self) -> bool {
        self.exporting
    }

    /// The tracer provider (e.g. to build an extra layer or tracer).
    pub fn tracer_provider(&self) -> Option<&SdkTracerProvider> {
        self.provider.as_ref()
    }

    /// Exports every finished span now.
    pub fn force_flush(&self) -> Result<(), TelemetryError> {
        match &self.provider {
            Some(provider) => Ok(provider.force_flush()?),
            None => Ok(()),
        }
    }

    /// Flushes pending spans and stops the exporter. Later calls are no-ops.
    pub fn shutdown(&mut self) -> Result<(), TelemetryError> {
        match self.provider.take() {
            Some(provider) => Ok(provider.shutdown()?),
            None => Ok(()),
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown() {
            eprintln!("mtswarm-telemetry: shutdown on drop failed: {error}");
        }
    }
}

/// Builds a tracer provider for `service_name`: with an OTLP/gRPC batch
/// exporter to `otlp_endpoint` when given, otherwise without any exporter (spans
/// still get ids so context propagates). Must run inside a tokio runtime when
/// an endpoint is given.
pub fn tracer_provider(
    service_name: &str,
    otlp_endpoint: Option<&str>,
) -> Result<SdkTracerProvider, TelemetryError> {
    let resource = Resource::builder()
        .with_service_name(service_name.to_string())
        .build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let Some(endpoint) = otlp_endpoint else {
        return Ok(builder.build());
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(TelemetryError::NoTokioRuntime);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: endpoint.to_string(),
            source,
        })?;
    Ok(builder.with_batch_exporter(exporter).build())
}

/// Targets whose spans are never exported: the exporter's own transport would
/// otherwise trace itself (and every export would create more spans to export).
fn otel_targets() -> Targets {
    Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("h2", LevelFilter::OFF)
        .with_target("hyper", LevelFilter::OFF)
        .with_target("hyper_util", LevelFilter::OFF)
        .with_target("tower", LevelFilter::OFF)
        .with_target("tonic", LevelFilter::OFF)
        .with_target("opentelemetry", LevelFilter::OFF)
        .with_target("opentelemetry_sdk", LevelFilter::OFF)
        .with_target("opentelemetry_otlp", LevelFilter::OFF)
}

/// Builds the subscriber described by `config` without installing it.
/// `test_writer` routes logs through libtest's capture.
fn build_dispatch(
    config: &TelemetryConfig,
    test_writer: bool,
) -> Result<(Dispatch, TelemetryGuard), TelemetryError> {
    let filter_directives = config.resolved_log_filter();
    let filter = EnvFilter::builder()
        .parse(&filter_directives)
        .map_err(|source| TelemetryError::InvalidLogFilter {
            filter: filter_directives.clone(),
            source,
        })?;
    let endpoint = config.resolved_otlp_endpoint();
    let provider = tracer_provider(&config.service_name, endpoint.as_deref())?;
    let tracer = provider.tracer(config.service_name.clone());
    let otel_layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(otel_targets());

    let fmt_layer = match (config.json_logs, test_writer) {
        (true, false) => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
        (true, true) => tracing_subscriber::fmt::layer()
            .json()
            .with_test_writer()
            .boxed(),
        (false, false) => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        (false, true) => tracing_subscriber::fmt::layer().with_test_writer().boxed(),
    };

    let subscriber = Registry::default()
        .with(filter)
        .with(fmt_layer)
        .with(otel_layer);
    let guard = TelemetryGuard {
        provider: Some(provider),
        exporting: endpoint.is_some(),
    };
    Ok((Dispatch::new(subscriber), guard))
}

/// Installs logging and tracing for the whole process (global subscriber and
/// the W3C TraceContext propagator). Call once, early in `main`, inside the
/// tokio runtime; keep the returned guard until exit.
pub fn init(config: TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let (dispatch, guard) = build_dispatch(&config, false)?;
    tracing::dispatcher::set_global_default(dispatch)?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if let Some(provider) = guard.tracer_provider() {
        opentelemetry::global::set_tracer_provider(provider.clone());
    }
    Ok(guard)
}

/// The same stack as [`init`], installed as the *current thread's* default
/// subscriber until the returned value is dropped. Meant for tests: each test
/// can export to its own collector without clashing over global state. Spans
/// created on other threads (e.g. tasks spawned onto a multi-threaded runtime)
/// are not seen; keep the traced code on the test's thread.
pub fn init_scoped(config: TelemetryConfig) -> Result<ScopedTelemetry, TelemetryError> {
    let (dispatch, guard) = build_dispatch(&config, true)?;
    let default_guard = tracing::dispatcher::set_default(&dispatch);
    Ok(ScopedTelemetry {
        default_guard: Some(default_guard),
        guard,
    })
}

/// Returned by [`init_scoped`]: the subscriber stays the thread default while
/// this lives; dropping it flushes the exporter.
#[must_use = "dropping it uninstalls the subscriber"]
#[derive(Debug)]
pub struct ScopedTelemetry {
    default_guard: Option<tracing::dispatcher::DefaultGuard>,
    guard: TelemetryGuard,
}

impl ScopedTelemetry {
    /// Flushes and shuts down the exporter; the subscriber stays installed.
    pub fn shutdown(&mut self) -> Result<(), TelemetryError> {
        self.guard.shutdown()
    }

    /// Exports every finished span now.
    pub fn force_flush(&self) -> Result<(), TelemetryError> {
        self.guard.force_flush()
    }
}

impl Drop for ScopedTelemetry {
    fn drop(&mut self) {
        // Uninstall first so no span is recorded into a provider being shut down.
        self.default_guard.take();
    }
}
