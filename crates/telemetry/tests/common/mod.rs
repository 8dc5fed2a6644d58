//! A loopback OTLP/HTTP receiver shared by the telemetry tests: a real HTTP
//! server on 127.0.0.1:0 that decodes each protobuf body as `R` (a trace
//! or metrics export request), as a collector's `otlphttp` receiver does,
//! and hands every request to the test; plus the environment helpers of
//! the tests that configure OTLP through the standard variables.

#![allow(dead_code)] // each test binary uses its own share of these

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio::sync::mpsc;

/// One request the receiver got: its path, headers and decoded body.
#[derive(Debug)]
pub(crate) struct Export<R> {
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) request: R,
}

impl<R> Export<R> {
    /// The request's content type ("" when none was sent).
    pub(crate) fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

/// Starts the receiver; a body that does not decode as `R` is answered 400.
pub(crate) async fn start_receiver<R>() -> (std::net::SocketAddr, mpsc::Receiver<Export<R>>)
where
    R: prost::Message + Default + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    let app = axum::Router::new()
        .route(
            "/{*path}",
            axum::routing::post(
                |State(tx): State<mpsc::Sender<Export<R>>>,
                 uri: axum::http::Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let Ok(request) = R::decode(body) else {
                        return StatusCode::BAD_REQUEST;
                    };
                    let export = Export {
                        path: uri.path().to_string(),
                        headers,
                        request,
                    };
                    match tx.send(export).await {
                        Ok(()) => StatusCode::OK,
                        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                    }
                },
            ),
        )
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let addr = listener.local_addr().expect("receiver addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, rx)
}

/// The next request, failing the test after 20 s.
pub(crate) async fn next<R>(exports: &mut mpsc::Receiver<Export<R>>) -> Export<R> {
    tokio::time::timeout(Duration::from_secs(20), exports.recv())
        .await
        .expect("an export within 20 s")
        .expect("receiver alive")
}

pub(crate) fn set(variable: &str, value: &str) {
    // SAFETY: each binary that changes the environment holds one test;
    // nothing else reads the environment while it changes.
    unsafe { std::env::set_var(variable, value) };
}

pub(crate) fn unset(variable: &str) {
    // SAFETY: as in `set`.
    unsafe { std::env::remove_var(variable) };
}
