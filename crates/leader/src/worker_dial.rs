//! Calling a worker daemon's `Worker` service: the channel carries the
//! current trace context and the leader's token, gives up after the
//! configured call timeout, and reaches only an endpoint whose certificate
//! names the worker's own identity ([`mtswarm_auth::worker_tls_name`]), so
//! the token never goes to an address a worker's registration merely claims.

use std::time::Duration;

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

/// How the leader reaches workers: its client credentials and call timeout.
pub(crate) struct WorkerDialer {
    auth: ClientAuth,
    timeout: Duration,
}

impl WorkerDialer {
    pub(crate) fn new(auth: ClientAuth, timeout: Duration) -> Self {
        Self { auth, timeout }
    }

    /// A `Worker` client for worker `worker_id` at `endpoint`. With a token
    /// or a CA the endpoint must be `https://` and its certificate must
    /// name the worker.
    pub(crate) fn client(
        &self,
        worker_id: &str,
        endpoint: &str,
    ) -> Result<WorkerClient, WorkerClientError> {
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
            .connect_lazy();
        Ok(v1::worker_client::WorkerClient::with_interceptor(
            channel,
            self.auth
                .interceptor(mtswarm_telemetry::grpc::TraceContextInterceptor),
        ))
    }
}
