//! Calling a worker daemon's `Worker` service: the channel carries the
//! current trace context and the leader's token, gives up after the
//! configured call timeout, and reaches only an endpoint whose certificate
//! names the worker's own identity ([`mtswarm_auth::worker_tls_name`]), so
//! the token never goes to an address a worker's registration merely claims.
//!
//! One channel per worker daemon is kept and shared by every call to it
//! (HTTP/2 multiplexes them): a job of a thousand agents makes a
//! `SpawnSession` and a `CancelSession` per agent, and a connection (and a
//! TLS handshake) per call cost more than the calls. A channel reconnects
//! by itself after its daemon restarts; a daemon that registers another
//! endpoint gets a new one.

use std::time::Duration;

use dashmap::DashMap;
use mtswarm_auth::ClientAuth;
use mtswarm_bus::v1;
use tonic::transport::Channel;

use crate::error::WorkerClientError;

/// A client of a worker daemon's `Worker` service, as the leader calls it.
pub(crate) type WorkerClient = v1::worker_client::WorkerClient<
    tonic::service::interceptor::InterceptedService<
        Channel,
        mtswarm_auth::BearerInterceptor<mtswarm_telemetry::grpc::TraceContextInterceptor>,
    >,
>;

/// How often a kept channel pings its daemon, and how long it waits for
/// the answer before it drops the connection.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the leader reaches workers: its client credentials and call timeout.
pub(crate) struct WorkerDialer {
    auth: ClientAuth,
    timeout: Duration,
    /// Per worker id: the endpoint its channel reaches, and the channel.
    channels: DashMap<String, (String, Channel)>,
}

impl WorkerDialer {
    pub(crate) fn new(auth: ClientAuth, timeout: Duration) -> Self {
        Self {
            auth,
            timeout,
            channels: DashMap::new(),
        }
    }

    /// A `Worker` client for worker `worker_id` at `endpoint`. With a token
    /// or a CA the endpoint must be `https://` and its certificate must
    /// name the worker.
    pub(crate) fn client(
        &self,
        worker_id: &str,
        endpoint: &str,
    ) -> Result<WorkerClient, WorkerClientError> {
        let channel = self.channel(worker_id, endpoint)?;
        Ok(v1::worker_client::WorkerClient::with_interceptor(
            channel,
            self.auth
                .interceptor(mtswarm_telemetry::grpc::TraceContextInterceptor),
        ))
    }

    /// The shared channel to `worker_id` at `endpoint`, made on first use
    /// (lazily: it connects on the first call).
    fn channel(&self, worker_id: &str, endpoint: &str) -> Result<Channel, WorkerClientError> {
        if let Some(entry) = self.channels.get(worker_id)
            && entry.0 == endpoint
        {
            return Ok(entry.1.clone());
        }
        let channel = self
            .auth
            .worker_endpoint(worker_id, endpoint, self.timeout)
            .map_err(|source| {
                tracing::warn!(worker_id, endpoint, error = %source, "worker endpoint refused");
                WorkerClientError {
                    endpoint: endpoint.to_string(),
                    source,
                }
            })?
            .timeout(self.timeout)
            // A connection kept open must notice a daemon that vanished
            // (a partition, a host lost) instead of timing out every call
            // until TCP gives up: an unanswered ping closes it, and the
            // next call connects afresh.
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_lazy();
        self.channels.insert(
            worker_id.to_string(),
            (endpoint.to_string(), channel.clone()),
        );
        Ok(channel)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt as _;
    use tonic::{Request, Response, Status};

    use super::*;

    /// A Worker service that answers `Status` and nothing else.
    struct StatusOnly;

    #[tonic::async_trait]
    impl v1::worker_server::Worker for StatusOnly {
        async fn spawn_session(
            &self,
            _: Request<v1::SpawnSessionRequest>,
        ) -> Result<Response<v1::SpawnSessionResponse>, Status> {
            Err(Status::unimplemented("spawn"))
        }
        async fn cancel_session(
            &self,
            _: Request<v1::CancelSessionRequest>,
        ) -> Result<Response<v1::CancelSessionResponse>, Status> {
            Err(Status::unimplemented("cancel"))
        }
        async fn drain(
            &self,
            _: Request<v1::DrainRequest>,
        ) -> Result<Response<v1::DrainResponse>, Status> {
            Err(Status::unimplemented("drain"))
        }
        async fn status(
            &self,
            _: Request<v1::StatusRequest>,
        ) -> Result<Response<v1::StatusResponse>, Status> {
            Ok(Response::new(v1::StatusResponse::default()))
        }
    }

    /// A Worker server on a free loopback port that counts the connections
    /// it accepts.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let incoming =
            tokio_stream::wrappers::TcpListenerStream::new(listener).inspect(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
            });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(v1::worker_server::WorkerServer::new(StatusOnly))
                .serve_with_incoming(incoming),
        );
        (url, accepted)
    }

    async fn status(dialer: &WorkerDialer, worker_id: &str, url: &str) {
        dialer
            .client(worker_id, url)
            .expect("client")
            .status(v1::StatusRequest::default())
            .await
            .expect("status");
    }

    #[tokio::test]
    async fn calls_to_one_daemon_share_one_connection_until_its_endpoint_changes() {
        let dialer = WorkerDialer::new(ClientAuth::none(), Duration::from_secs(5));
        let (first, first_accepted) = counting_server().await;
        for _ in 0..5 {
            status(&dialer, "w1", &first).await;
        }
        assert_eq!(
            first_accepted.load(Ordering::SeqCst),
            1,
            "five calls, one connection"
        );
        // The daemon came back on another endpoint: its calls go there.
        let (second, second_accepted) = counting_server().await;
        status(&dialer, "w1", &second).await;
        status(&dialer, "w1", &second).await;
        assert_eq!(second_accepted.load(Ordering::SeqCst), 1);
        assert_eq!(first_accepted.load(Ordering::SeqCst), 1);
        // Another daemon has its own.
        status(&dialer, "w2", &first).await;
        assert_eq!(first_accepted.load(Ordering::SeqCst), 2);
    }
}
