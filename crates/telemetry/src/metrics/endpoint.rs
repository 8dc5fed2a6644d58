//! The Prometheus scrape endpoint of a daemon: `GET /metrics` answers the
//! registry's families in the Prometheus text format (0.0.4). It serves
//! nothing else and holds no state of its own; it stops when its handle is
//! dropped or [`MetricsEndpoint::shutdown`] is called.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder as _, TextEncoder};
use tokio::sync::oneshot;

use crate::TelemetryError;

/// The path Prometheus scrapes.
pub const METRICS_PATH: &str = "/metrics";

/// A running `/metrics` server.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Binds `addr` (port 0 picks a free one) and serves `registry` on
    /// [`METRICS_PATH`]. Must run inside a tokio runtime.
    pub async fn serve(
        addr: SocketAddr,
        registry: prometheus::Registry,
    ) -> Result<Self, TelemetryError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| TelemetryError::MetricsBind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| TelemetryError::MetricsBind { addr, source })?;
        let app = Router::new()
            .route(METRICS_PATH, get(scrape))
            .with_state(registry);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, %addr, "the metrics endpoint stopped");
            }
        });
        Ok(Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/metrics`.
    pub fn url(&self) -> String {
        format!("http://{}{METRICS_PATH}", self.addr)
    }

    /// Stops serving and waits for the server to end.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn scrape(State(registry): State<prometheus::Registry>) -> impl IntoResponse {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, encoder.format_type().to_string())],
            body,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".to_string())],
            format!("encoding the metrics failed: {error}").into_bytes(),
        ),
    }
}
