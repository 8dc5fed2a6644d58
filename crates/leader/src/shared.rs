//! What every part of the daemon shares: the bus and its stores, the job
//! journal, the result tables, the running job runners and the settings.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use mtswarm_bus::{Approvals, Bus, Jobs, Leases, Quarantine, Workers, v1};
use tonic::transport::{Channel, Endpoint};

use crate::config::{LeaderConfig, ModelFactory};
use crate::journal::Journal;
use crate::results::ResultTable;
use crate::runner::RunnerHandle;

pub(crate) struct Shared {
    pub config: LeaderConfig,
    /// Canonical kernel root.
    pub kernel_root: PathBuf,
    pub model_factory: ModelFactory,
    pub bus: Bus,
    pub jobs: Jobs,
    pub approvals: Approvals,
    pub workers: Workers,
    pub leases: Leases,
    pub quarantine: Quarantine,
    pub journal: Journal,
    pub results: Arc<ResultTable>,
    /// Job runners of this process, by job id.
    pub runners: DashMap<String, RunnerHandle>,
    /// Slices this leader is spawning a session on right now (slice id ->
    /// session id), so two spawns never race for one slice before the
    /// worker's lease shows the session.
    pub claimed_slices: DashMap<String, String>,
    /// Becomes true when the daemon shuts down (ends WatchJob streams).
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Shared {
    /// A Worker service client for `endpoint` that carries the current
    /// trace context and gives up after the configured call timeout.
    pub fn worker_client(
        &self,
        endpoint: &str,
    ) -> Result<
        v1::worker_client::WorkerClient<
            tonic::service::interceptor::InterceptedService<
                Channel,
                mtswarm_telemetry::grpc::TraceContextInterceptor,
            >,
        >,
        String,
    > {
        let timeout: Duration = self.config.worker_call_timeout;
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| format!("worker endpoint {endpoint:?} is not a URL: {e}"))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_lazy();
        Ok(v1::worker_client::WorkerClient::with_interceptor(
            channel,
            mtswarm_telemetry::grpc::TraceContextInterceptor,
        ))
    }
}
