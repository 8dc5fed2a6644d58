//! What every part of the daemon shares: the bus and its stores, the job
//! journal, the result tables, the running job runners, the admission
//! scheduler, the reassigner's trigger queue and the settings.
//!
//! A plain struct of handles, low in the layering: it imports only the
//! types it holds (job state, result tables, journal, scheduler), never the
//! parts that use it (runner, tools, reassigner, result consumer).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use mtswarm_bus::{
    Approvals, Bus, Fence, JobOwners, Jobs, Leases, OwnershipError, OwnershipKeeper, Quarantine,
    Workers, v1,
};
use tonic::transport::Channel;

use crate::config::{LeaderConfig, ModelFactory};
use crate::error::WorkerClientError;
use crate::job::{JobContext, PendingStart, RunnerHandle};
use crate::journal::Journal;
use crate::results::ResultTable;
use crate::scheduler::Scheduler;
use crate::trigger::Trigger;

/// A client of a worker daemon's `Worker` service, as the leader calls it.
pub(crate) type WorkerClient = v1::worker_client::WorkerClient<
    tonic::service::interceptor::InterceptedService<
        Channel,
        mtswarm_auth::BearerInterceptor<mtswarm_telemetry::grpc::TraceContextInterceptor>,
    >,
>;

/// The daemon's shared handles and settings (one per leader process).
pub(crate) struct Shared {
    pub(crate) config: LeaderConfig,
    /// Canonical kernel root.
    pub(crate) kernel_root: PathBuf,
    pub(crate) model_factory: ModelFactory,
    pub(crate) bus: Bus,
    pub(crate) jobs: Jobs,
    pub(crate) approvals: Approvals,
    pub(crate) workers: Workers,
    pub(crate) leases: Leases,
    pub(crate) quarantine: Quarantine,
    pub(crate) journal: Journal,
    pub(crate) results: Arc<ResultTable>,
    /// Job runners of this process, by job id.
    pub(crate) runners: DashMap<String, RunnerHandle>,
    /// Slices this leader is spawning a session on right now (slice id ->
    /// session id), so two spawns never race for one slice before the
    /// worker's lease shows the session.
    pub(crate) claimed_slices: DashMap<String, String>,
    /// Becomes true when the daemon shuts down (ends WatchJob streams).
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
    /// Admission: running and queued jobs.
    pub(crate) scheduler: Scheduler<PendingStart>,
    /// Contexts of the jobs this leader runs (or is about to run), by job id.
    pub(crate) contexts: DashMap<String, Arc<JobContext>>,
    /// Reassignment triggers for the reassigner.
    pub(crate) reassign_tx: tokio::sync::mpsc::UnboundedSender<Trigger>,
    /// Smallest lease TTL seen in the lease records, in milliseconds (0 =
    /// none seen yet: the configured default applies).
    pub(crate) lease_ttl_ms: AtomicU64,
    /// The job ownership leases (bucket `mtswarm_job_owners`).
    pub(crate) owners: JobOwners,
    /// `Control` URL of this leader, stored in its ownership records.
    pub(crate) grpc_url: String,
    /// Keepers of the jobs this leader owns, by job id.
    pub(crate) owned: DashMap<String, OwnershipKeeper>,
    /// Jobs to try to take over (their owner's lease lapsed or was lost
    /// here); the standby loop serializes every take-over.
    pub(crate) standby_tx: tokio::sync::mpsc::UnboundedSender<String>,
}

/// Entries of the leader's in-memory tables that hold per-job state: each
/// goes back to its idle size when the jobs end, whatever number of jobs
/// ran before (see [`crate::LeaderHandle::table_sizes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaderTableSizes {
    /// Job runners of this process.
    pub runners: usize,
    /// Job contexts (agents, tasks, result tables of running jobs).
    pub contexts: usize,
    /// Per-job result tables.
    pub result_tables: usize,
    /// Slices claimed for agents of running jobs.
    pub claimed_slices: usize,
    /// Jobs the scheduler counts as running.
    pub running: usize,
    /// Jobs the scheduler holds queued.
    pub queued: usize,
}

impl Shared {
    /// The sizes of the per-job tables now.
    pub(crate) fn table_sizes(&self) -> LeaderTableSizes {
        let (running, queued) = self.scheduler.counts();
        LeaderTableSizes {
            runners: self.runners.len(),
            contexts: self.contexts.len(),
            result_tables: self.results.len(),
            claimed_slices: self.claimed_slices.len(),
            running,
            queued,
        }
    }

    /// A fresh job's context on this daemon's bus, jobs KV and result
    /// tables (the job's table is registered here).
    pub(crate) fn job_context(
        &self,
        job_id: String,
        spec: v1::JobSpec,
        kernel_dir: PathBuf,
        deadline: std::time::SystemTime,
        fence: Fence,
    ) -> JobContext {
        let results = self.results.job(&job_id);
        JobContext::new(
            job_id,
            spec,
            kernel_dir,
            self.bus.clone(),
            self.jobs.clone(),
            results,
            deadline,
            fence,
        )
    }

    /// Takes the ownership of `job_id` for this leader (free, lapsed, or
    /// its own under the same leader id) and keeps renewing it every third
    /// of the TTL. The fence every write for the job checks.
    pub(crate) async fn take_ownership(&self, job_id: &str) -> Result<Fence, OwnershipError> {
        let ttl = self.config.job_lease_ttl;
        let held = self
            .owners
            .acquire(job_id, &self.config.leader_id, &self.grpc_url, ttl)
            .await?;
        tracing::info!(
            job_id,
            leader_id = %self.config.leader_id,
            epoch = held.value.epoch,
            "job ownership taken"
        );
        let keeper = self
            .owners
            .keep(held, (ttl / 3).max(Duration::from_millis(200)));
        let fence = keeper.fence().clone();
        self.owned.insert(job_id.to_string(), keeper);
        Ok(fence)
    }

    /// The fence of a job this leader owns (`None`: not owned here).
    pub(crate) fn fence(&self, job_id: &str) -> Option<Fence> {
        self.owned.get(job_id).map(|k| k.fence().clone())
    }

    /// Gives up the ownership of a job that ended here (watchers see a
    /// release; the record is final, so nobody resumes it).
    pub(crate) async fn release_ownership(&self, job_id: &str) {
        if let Some((_, mut keeper)) = self.owned.remove(job_id)
            && let Err(error) = keeper.release().await
        {
            tracing::warn!(%error, job_id, "job ownership not released; it lapses");
        }
    }

    /// Hands a job to the standby loop, which takes it over if nobody owns it.
    pub(crate) fn offer_take_over(&self, job_id: &str) {
        let _ = self.standby_tx.send(job_id.to_string());
    }

    /// Hands a trigger to the reassigner (dropped when it has stopped).
    pub(crate) fn trigger_reassign(&self, trigger: Trigger) {
        let _ = self.reassign_tx.send(trigger);
    }

    /// The lease TTL the leader assumes: the smallest `ttl_seconds` of the
    /// lease records seen, else the configured default.
    pub(crate) fn lease_ttl(&self) -> Duration {
        match self.lease_ttl_ms.load(Ordering::Relaxed) {
            0 => self.config.default_lease_ttl,
            ms => Duration::from_millis(ms),
        }
    }

    /// The result token of one task attempt (empty without a result key).
    pub(crate) fn result_token(&self, job_id: &str, task_id: &str, attempt: u32) -> String {
        self.config
            .result_key
            .as_ref()
            .map(|key| key.token(job_id, task_id, attempt))
            .unwrap_or_default()
    }

    /// The leader's signed placement grant of `assignment` on the worker
    /// whose record key is `worker_key` (`mtswarm_auth::provenance`);
    /// `None` without a decision key, or for a worker that registered no
    /// key (its records then carry nothing the leader would accept).
    pub(crate) fn grant(
        &self,
        assignment: &v1::TaskAssignment,
        worker_key: &str,
    ) -> Option<v1::PlacementGrant> {
        let signer = self.config.decision_key.as_ref()?;
        if worker_key.is_empty() {
            tracing::warn!(worker_id = %assignment.worker_id, task_id = %assignment.task_id, "the worker registered no record key; its records for this task will be refused");
            return None;
        }
        let mut grant = mtswarm_auth::grant_for(assignment, worker_key);
        match signer.sign_grant(&mut grant) {
            Ok(()) => Some(grant),
            Err(error) => {
                tracing::warn!(%error, "placement grant not signed");
                None
            }
        }
    }

    /// Learns the TTL of a lease record.
    pub(crate) fn observe_lease_ttl(&self, ttl_seconds: u32) {
        if ttl_seconds == 0 {
            return;
        }
        let ms = u64::from(ttl_seconds) * 1000;
        let _ = self
            .lease_ttl_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
                (current == 0 || ms < current).then_some(ms)
            });
    }

    /// A Worker service client for worker `worker_id` at `endpoint` that
    /// carries the current trace context and gives up after the configured
    /// call timeout. The call presents the leader's token
    /// (`LeaderConfig::worker_auth`); with a token or a CA the endpoint
    /// must be `https://` and its certificate must name the worker's own
    /// identity ([`mtswarm_auth::worker_tls_name`]), so the token never
    /// reaches an endpoint a worker's registration merely claims.
    pub(crate) fn worker_client(
        &self,
        worker_id: &str,
        endpoint: &str,
    ) -> Result<WorkerClient, WorkerClientError> {
        let timeout: Duration = self.config.worker_call_timeout;
        let channel = self
            .config
            .worker_auth
            .worker_endpoint(worker_id, endpoint, timeout)
            .map_err(|source| {
                tracing::warn!(worker_id, endpoint, error = %source, "worker endpoint refused");
                WorkerClientError {
                    endpoint: endpoint.to_string(),
                    source,
                }
            })?
            .timeout(timeout)
            .connect_lazy();
        Ok(v1::worker_client::WorkerClient::with_interceptor(
            channel,
            self.config
                .worker_auth
                .interceptor(mtswarm_telemetry::grpc::TraceContextInterceptor),
        ))
    }
}
