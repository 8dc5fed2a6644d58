//! Calling a worker daemon's `Worker` service: the channel carries the
//! current trace context and the leader's token, gives up after the
//! configured call timeout, and reaches only an endpoint whose certificate
//! names the worker's own identity ([`mtswarm_auth::worker_tls_name`]), so
//! the token never goes to an address a worker's registration merely claims.
//! One channel per worker endpoint is kept and shared by every call to it
//! (HTTP/2 multiplexes them): a job that spawns a thousand agents would
//! otherwise open a thousand connections, each with its own TLS handshake.

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

/// Channels kept at most; past this many (a farm whose workers keep
/// coming back on new ports) the kept ones are dropped and dialed again.
const MAX_KEPT_CHANNELS: usize = 4096;

/// How the leader reaches workers: its client credentials, call timeout
/// and the channels it keeps, by worker id and endpoint.
pub(crate) struct WorkerDialer {
    auth: ClientAuth,
    timeout: Duration,
    channels: DashMap<(String, String), Channel>,
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

    /// The kept channel to `worker_id` at `endpoint`, or a new one (lazy:
    /// it connects at its first call and reconnects after a failure).
    fn channel(&self, worker_id: &str, endpoint: &str) -> Result<Channel, WorkerClientError> {
        let key = (worker_id.to_string(), endpoint.to_string());
        if let Some(channel) = self.channels.get(&key) {
            return Ok(channel.clone());
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
            .connect_lazy();
        if self.channels.len() >= MAX_KEPT_CHANNELS {
            self.channels.clear();
        }
        Ok(self.channels.entry(key).or_insert(channel).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_to_one_worker_share_a_channel() {
        let dialer = WorkerDialer::new(ClientAuth::none(), Duration::from_secs(1));
        for _ in 0..3 {
            dialer
                .client("w1", "http://127.0.0.1:1")
                .expect("a plaintext endpoint without credentials");
        }
        assert_eq!(dialer.channels.len(), 1);
        dialer.client("w2", "http://127.0.0.1:2").expect("w2");
        dialer.client("w1", "http://127.0.0.1:3").expect("w1 moved");
        assert_eq!(dialer.channels.len(), 3, "one per worker and endpoint");
    }
}
