//! Logging and distributed tracing for every mtswarm process.
//!
//! One call, [`init`], installs a `tracing` subscriber made of:
//! - an env-filter (explicit filter, else `MTSWARM_LOG`, else `RUST_LOG`, else `info`),
//! - a fmt layer (human-readable or JSON lines on stderr),
//! - a tracing-opentelemetry layer, so every `tracing` span is an OpenTelemetry
//!   span. When an OTLP endpoint is configured (or one of the standard
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//!   variables is set) spans are exported through a batch processor, over
//!   OTLP/gRPC or OTLP/HTTP with protobuf bodies as
//!   `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` says; without one, spans still get
//!   trace and span ids so trace context received from upstream is passed on
//!   downstream and a trace is not cut in two.
//!
//! The log filter applies to the log output only: spans of level INFO and
//! above are exported whatever the filter, so `--log warn` keeps a process
//! quiet without cutting its spans out of the job's trace.
//!
//! Export follows the OpenTelemetry specification's variables: the
//! endpoint (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` used as it is, else
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), protocol, `..._HEADERS` (read by the
//! exporter), `OTEL_SERVICE_NAME` (wins over the process's own name) and
//! `OTEL_RESOURCE_ATTRIBUTES`. The spans the engine, leader and workers open
//! follow the OpenTelemetry GenAI semantic conventions v1.41.1 (see
//! `mtswarm_core::genai_spans`); [`genai`] types their one array attribute
//! on the way out, and [`json_logs`] puts `trace_id` and `span_id` in JSON
//! log lines.
//!
//! Metrics go through the OpenTelemetry metrics API: [`metrics`] defines
//! every instrument the daemons record into, installs the meter provider
//! (a Prometheus registry, OTLP when the standard variables say so) and
//! serves the `/metrics` endpoint.
//!
//! The W3C TraceContext propagator is installed globally, and [`propagation`]
//! and [`grpc`] carry the current span's context across process boundaries
//! (NATS headers are adapted in the bus crate, gRPC metadata here).
//!
//! [`init_scoped`] builds the same stack as a thread-local default instead of a
//! global one, so several tests in one binary can each export to their own
//! collector.

pub mod genai;
pub mod grpc;
pub mod json_logs;
pub mod metrics;
mod owned_provider;
pub mod propagation;
#[cfg(feature = "testing")]
pub mod testing;

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

use crate::owned_provider::OwnedProvider;

/// Environment variable for the log filter (takes precedence over `RUST_LOG`).
pub const LOG_ENV: &str = "MTSWARM_LOG";
/// Standard OpenTelemetry variable for the OTLP endpoint of every signal (for
/// OTLP/HTTP, `/v1/traces` is appended to it).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Standard OpenTelemetry variable for the traces endpoint (used as it is).
pub const OTLP_TRACES_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// Standard OpenTelemetry variables for the transport, most specific first.
pub const OTLP_PROTOCOL_ENVS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];
/// Standard OpenTelemetry variable naming the service (wins over the
/// process's own `service_name`).
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";
/// Variable that opts in to message content on GenAI spans (the name the
/// OpenTelemetry GenAI instrumentations use); `true` or `1` turns it on.
pub const CAPTURE_CONTENT_ENV: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";
/// Filter used when neither the config nor the environment gives one.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// How long an OTLP export may take before it is abandoned.
pub(crate) const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (`grpc`), usually port 4317.
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`), usually port 4318.
    HttpProtobuf,
}

impl OtlpProtocol {
    /// The protocol named by an `OTEL_EXPORTER_OTLP_PROTOCOL` value.
    pub fn parse(value: &str) -> Result<Self, TelemetryError> {
        match value.trim() {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            other => Err(TelemetryError::UnsupportedProtocol {
                value: other.to_string(),
            }),
        }
    }

    /// The spelling of the OpenTelemetry variables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Where and how spans are exported (see [`TelemetryConfig::resolved_export`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpExport {
    /// Wire protocol of the exporter.
    pub protocol: OtlpProtocol,
    /// The configured endpoint; `None` leaves it to the exporter's reading of
    /// the standard variables (which tells signal-specific endpoints from
    /// the common one).
    pub endpoint: Option<String>,
}

/// What to set up. Build with [`TelemetryConfig::new`] and adjust the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// `service.name` resource attribute of exported spans (e.g. "mtswarm-leader").
    pub service_name: String,
    /// OTLP collector, e.g. `http://otel-collector:4317` (gRPC) or
    /// `http://otel-collector:4318` (HTTP; `/v1/traces` is added when the URL
    /// has no path). `None` falls back to the standard variables; when none
    /// is set nothing is exported.
    pub otlp_endpoint: Option<String>,
    /// Transport; `None` falls back to `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`,
    /// then `OTEL_EXPORTER_OTLP_PROTOCOL`, then gRPC.
    pub otlp_protocol: Option<OtlpProtocol>,
    /// `tracing_subscriber::EnvFilter` directives. `None` falls back to
    /// `MTSWARM_LOG`, then `RUST_LOG`, then [`DEFAULT_LOG_FILTER`].
    pub log_filter: Option<String>,
    /// JSON lines instead of human-readable logs (for log shippers).
    pub json_logs: bool,
    /// Record prompts, answers and tool results on GenAI spans; `None`
    /// falls back to [`CAPTURE_CONTENT_ENV`]. Off by default: they may hold
    /// anything a user or a tool wrote.
    pub capture_message_content: Option<bool>,
}

impl TelemetryConfig {
    /// Config with defaults: endpoint and filter from the environment, text logs.
    pub fn new(service_name: impl Into<String>) -> Self {
        Self {
            service_name: service_name.into(),
            otlp_endpoint: None,
            otlp_protocol: None,
            log_filter: None,
            json_logs: false,
            capture_message_content: None,
        }
    }

    /// Whether GenAI spans carry message content (see
    /// [`TelemetryConfig::capture_message_content`]).
    pub fn resolved_capture_message_content(&self) -> bool {
        self.capture_message_content.unwrap_or_else(|| {
            non_empty_env(CAPTURE_CONTENT_ENV)
                .is_some_and(|value| matches!(value.trim(), "true" | "TRUE" | "True" | "1"))
        })
    }

    /// The endpoint spans will be exported to: the configured one, else the
    /// non-empty value of `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else of
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn resolved_otlp_endpoint(&self) -> Option<String> {
        self.otlp_endpoint
            .clone()
            .filter(|endpoint| !endpoint.trim().is_empty())
            .or_else(|| non_empty_env(OTLP_TRACES_ENDPOINT_ENV))
            .or_else(|| non_empty_env(OTLP_ENDPOINT_ENV))
    }

    /// The transport (see [`TelemetryConfig::otlp_protocol`]); an unknown
    /// value in the environment is an error naming the variable.
    pub fn resolved_otlp_protocol(&self) -> Result<OtlpProtocol, TelemetryError> {
        if let Some(protocol) = self.otlp_protocol {
            return Ok(protocol);
        }
        for variable in OTLP_PROTOCOL_ENVS {
            if let Some(value) = non_empty_env(variable) {
                return OtlpProtocol::parse(&value).map_err(|_| {
                    TelemetryError::UnsupportedProtocolEnv {
                        variable,
                        value: value.clone(),
                    }
                });
            }
        }
        Ok(OtlpProtocol::Grpc)
    }

    /// Where and how spans will be exported; `None` when nothing is.
    pub fn resolved_export(&self) -> Result<Option<OtlpExport>, TelemetryError> {
        if self.resolved_otlp_endpoint().is_none() {
            return Ok(None);
        }
        Ok(Some(OtlpExport {
            protocol: self.resolved_otlp_protocol()?,
            endpoint: self
                .otlp_endpoint
                .clone()
                .filter(|endpoint| !endpoint.trim().is_empty()),
        }))
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

pub(crate) fn non_empty_env(variable: &str) -> Option<String> {
    std::env::var(variable)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter (explicit, `MTSWARM_LOG` or `RUST_LOG`) does not parse.
    #[error("invalid log filter {filter:?}: {source}")]
    InvalidLogFilter {
        /// The filter text.
        filter: String,
        /// The parser's error.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// OTLP export was asked for outside a tokio runtime.
    #[error(
        "the OTLP exporter must be created inside a tokio runtime (call init from within #[tokio::main] or Runtime::block_on)"
    )]
    NoTokioRuntime,
    /// The configured OTLP protocol is neither `grpc` nor `http/protobuf`.
    #[error("unsupported OTLP protocol {value:?}: use \"grpc\" or \"http/protobuf\"")]
    UnsupportedProtocol {
        /// The protocol as configured.
        value: String,
    },
    /// An `OTEL_EXPORTER_OTLP_*PROTOCOL` variable names an unsupported protocol.
    #[error(
        "{variable}={value:?} is not a supported OTLP protocol: use \"grpc\" or \"http/protobuf\""
    )]
    UnsupportedProtocolEnv {
        /// The environment variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The OTLP span exporter could not be built.
    #[error("cannot build the OTLP span exporter for {endpoint:?}: {source}")]
    Exporter {
        /// The endpoint it was built for.
        endpoint: String,
        /// The exporter's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// [`init`] ran twice, or another subscriber was installed first.
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInitialized(#[from] tracing::dispatcher::SetGlobalDefaultError),
    /// A remote trace context could not be made a span's parent.
    #[error("cannot set the parent of span: {0}")]
    SetParent(#[from] tracing_opentelemetry::SetParentError),
    /// The OTLP metric exporter could not be built.
    #[error("cannot build the OTLP metric exporter for {endpoint:?}: {source}")]
    MetricExporter {
        /// The endpoint it was built for.
        endpoint: String,
        /// The exporter's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The Prometheus reader of the meter provider could not be built.
    #[error("cannot build the Prometheus metrics reader: {0}")]
    PrometheusExporter(#[source] opentelemetry_sdk::error::OTelSdkError),
    /// The metrics endpoint could not listen.
    #[error("cannot serve metrics on {addr}: {source}")]
    MetricsBind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Instruments were created before the meter provider was installed:
    /// they would stay no-ops.
    #[error(
        "metrics were recorded before the meter provider was installed; call init_metrics first"
    )]
    MetricsAlreadyRecorded,
    /// Flushing or shutting down the span exporter failed.
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
    provider: OwnedProvider<SdkTracerProvider>,
    exporting: bool,
}

impl TelemetryGuard {
    /// True when spans are exported over OTLP.
    pub fn is_exporting(&self) -> bool {
        self.exporting
    }

    /// The tracer provider (e.g. to build an extra layer or tracer).
    pub fn tracer_provider(&self) -> Option<&SdkTracerProvider> {
        self.provider.get()
    }

    /// Exports every finished span now.
    pub fn force_flush(&self) -> Result<(), TelemetryError> {
        self.provider.force_flush()
    }

    /// Flushes pending spans and stops the exporter (also on drop). Later
    /// calls are no-ops.
    pub fn shutdown(&mut self) -> Result<(), TelemetryError> {
        self.provider.shutdown()
    }
}

/// Builds a tracer provider for `service_name`: with an OTLP batch exporter
/// when `export` is given, otherwise without any exporter (spans still get
/// ids so context propagates). Must run inside a tokio runtime when
/// exporting.
pub fn tracer_provider(
    service_name: &str,
    export: Option<&OtlpExport>,
) -> Result<SdkTracerProvider, TelemetryError> {
    // The builder's detectors read `OTEL_RESOURCE_ATTRIBUTES` and
    // `OTEL_SERVICE_NAME`; the process's own name applies only when the
    // operator did not name the service (the standard's precedence).
    let mut resource = Resource::builder();
    if non_empty_env(SERVICE_NAME_ENV).is_none() {
        resource = resource.with_service_name(service_name.to_string());
    }
    let resource = resource.build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let Some(export) = export else {
        return Ok(builder.build());
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(TelemetryError::NoTokioRuntime);
    }
    let exporter_error = |source| TelemetryError::Exporter {
        endpoint: export
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("from the environment ({})", export.protocol.as_str())),
        source,
    };
    let exporter = match export.protocol {
        OtlpProtocol::Grpc => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_timeout(EXPORT_TIMEOUT);
            if let Some(endpoint) = &export.endpoint {
                exporter = exporter.with_endpoint(endpoint);
            }
            exporter.build().map_err(exporter_error)?
        }
        OtlpProtocol::HttpProtobuf => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(EXPORT_TIMEOUT);
            if let Some(endpoint) = &export.endpoint {
                exporter = exporter.with_endpoint(http_traces_url(endpoint));
            }
            exporter.build().map_err(exporter_error)?
        }
    };
    Ok(builder
        .with_batch_exporter(genai::GenAiSpanExporter::new(exporter))
        .build())
}

/// The OTLP/HTTP traces URL for a configured collector address: a URL
/// without a path gets the standard `/v1/traces`, one with a path is used as
/// it is (a collector behind a proxy prefix).
pub fn http_traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim().trim_end_matches('/');
    let path_start = trimmed
        .find("://")
        .map(|scheme_end| scheme_end + 3)
        .and_then(|host_start| trimmed[host_start..].find('/').map(|p| host_start + p));
    match path_start {
        Some(_) => trimmed.to_string(),
        None => format!("{trimmed}/v1/traces"),
    }
}

/// What is exported: spans of INFO and above (every span of the system's
/// own crates is INFO) whatever the log filter says, more when the log
/// filter asks for more, except the exporter's own transport, which would
/// otherwise trace itself (and every export would create more spans to
/// export).
fn otel_targets(log_level: Option<LevelFilter>) -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO.max(log_level.unwrap_or(LevelFilter::INFO)))
        .with_target("reqwest", LevelFilter::OFF)
        .with_target("h2", LevelFilter::OFF)
        .with_target("hyper", LevelFilter::OFF)
        .with_target("hyper_util", LevelFilter::OFF)
        .with_target("tower", LevelFilter::OFF)
        .with_target("tonic", LevelFilter::OFF)
        .with_target("opentelemetry", LevelFilter::OFF)
        .with_target("opentelemetry_sdk", LevelFilter::OFF)
        .with_target("opentelemetry_otlp", LevelFilter::OFF)
}

/// Whether human logs on stderr get colour escapes: only on a terminal,
/// and never with `NO_COLOR` set to anything (<https://no-color.org>).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && non_empty_env("NO_COLOR").is_none()
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
    let export = config.resolved_export()?;
    let provider = tracer_provider(&config.service_name, export.as_ref())?;
    let tracer = provider.tracer(config.service_name.clone());
    let otel_layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(otel_targets(filter.max_level_hint()));

    let json_format = json_logs::TraceJsonFormat::new();
    let binder = json_format.binder();
    let fmt_layer = match (config.json_logs, test_writer) {
        (true, false) => tracing_subscriber::fmt::layer()
            .json()
            .event_format(json_format)
            .with_writer(std::io::stderr)
            .boxed(),
        (true, true) => tracing_subscriber::fmt::layer()
            .json()
            .event_format(json_format)
            .with_test_writer()
            .boxed(),
        (false, false) => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(colour_on_stderr())
            .boxed(),
        (false, true) => tracing_subscriber::fmt::layer().with_test_writer().boxed(),
    };

    // Each layer filters for itself: the log filter must not decide which
    // spans reach the trace.
    let subscriber = Registry::default()
        .with(fmt_layer.with_filter(filter))
        .with(otel_layer);
    let guard = TelemetryGuard {
        provider: OwnedProvider::new(provider, "shutdown on drop failed"),
        exporting: export.is_some(),
    };
    let dispatch = Dispatch::new(subscriber);
    binder.bind(&dispatch);
    Ok((dispatch, guard))
}

/// Installs logging and tracing for the whole process (global subscriber and
/// the W3C TraceContext propagator). Call once, early in `main`, inside the
/// tokio runtime; keep the returned guard until exit.
pub fn init(config: TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let (dispatch, guard) = build_dispatch(&config, false)?;
    CAPTURE_CONTENT.store(
        config.resolved_capture_message_content(),
        std::sync::atomic::Ordering::Relaxed,
    );
    tracing::dispatcher::set_global_default(dispatch)?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if let Some(provider) = guard.tracer_provider() {
        opentelemetry::global::set_tracer_provider(provider.clone());
    }
    Ok(guard)
}

/// Set by [`init`] from [`TelemetryConfig::capture_message_content`].
static CAPTURE_CONTENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process records message content on its GenAI spans, as
/// [`init`] was configured (false before it ran); the engine's tracing
/// middleware is built with it.
pub fn capture_message_content() -> bool {
    CAPTURE_CONTENT.load(std::sync::atomic::Ordering::Relaxed)
}

/// The same stack as [`init`], installed as the *current thread's* default
/// subscriber until the returned value is dropped. Meant for tests: each test
/// can export to its own collector without clashing over global state. Spans
/// created on other threads (e.g. tasks spawned onto a multi-threaded runtime)
/// are not seen; keep the traced code on the test's thread.
///
/// The subscriber itself is kept until the process ends (see
/// [`RETIRED_DISPATCHES`]).
pub fn init_scoped(config: TelemetryConfig) -> Result<ScopedTelemetry, TelemetryError> {
    let (dispatch, guard) = build_dispatch(&config, true)?;
    let default_guard = tracing::dispatcher::set_default(&dispatch);
    RETIRED_DISPATCHES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(dispatch);
    Ok(ScopedTelemetry {
        default_guard: Some(default_guard),
        guard,
    })
}

/// Every scoped subscriber, kept until the process ends. A subscriber's
/// last reference must not be dropped by tracing itself: another thread
/// registering a subscriber walks every live one, and if it holds the last
/// reference, the drop (and the tracer provider's own drop, which logs
/// through tracing) runs inside tracing-core's callsite lock and deadlocks
/// on it (seen: a test binary hung for good). Kept here, a subscriber is
/// never dropped at all; they are a few per test process.
static RETIRED_DISPATCHES: std::sync::Mutex<Vec<Dispatch>> = std::sync::Mutex::new(Vec::new());

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
