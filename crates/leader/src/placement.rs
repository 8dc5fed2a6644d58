//! Placement: where a job's agents run. One view of the fleet for every
//! part that needs it ([`Placement::fleet_view`]: tools, reassigner,
//! prompt, the `ListFleet` RPC), the slices this leader's agents hold or
//! are being spawned on ([`SliceClaims`]), starting a session on a slice
//! ([`Placement::spawn_on`], used by `spawn_agent` and the reassigner) and
//! cancelling agents ([`Placement::cancel_agent`],
//! [`Placement::cancel_all_agents`], [`Placement::stop_session`]).

use std::time::Duration;

use dashmap::DashMap;
use futures::StreamExt as _;
use mtswarm_bus::{BusError, Leases, Quarantine, Workers, v1};
use mtswarm_hw::SliceSelector;
use tracing::Instrument as _;

use crate::error::{CancelError, SpawnError};
use crate::fleet::{FleetView, read_fleet};
use crate::job::{AgentEntry, JobContext};
use crate::worker_dial::WorkerDialer;

/// Slices this leader's agents hold or are being spawned on (slice id ->
/// session id), so two spawns or moves never race for one slice before the
/// worker's lease shows the session.
#[derive(Default)]
pub(crate) struct SliceClaims(DashMap<String, String>);

impl SliceClaims {
    /// Claims `slice_id` for `session_id`: false when another session has
    /// it (a session's own claim counts as its own).
    pub(crate) fn claim(&self, slice_id: &str, session_id: &str) -> bool {
        // A read first: a thousand concurrent spawns walk past each other's
        // claims, and the entry below takes a write lock and a key copy.
        if let Some(holder) = self.0.get(slice_id) {
            return *holder == session_id;
        }
        match self.0.entry(slice_id.to_owned()) {
            dashmap::Entry::Occupied(entry) => *entry.get() == session_id,
            dashmap::Entry::Vacant(entry) => {
                entry.insert(session_id.to_owned());
                true
            }
        }
    }

    /// Records `session_id` as the holder of `slice_id` whoever had it (a
    /// resumed agent's placement, as its job's record has it).
    pub(crate) fn hold(&self, slice_id: &str, session_id: &str) {
        self.0.insert(slice_id.to_owned(), session_id.to_owned());
    }

    /// Whether some session of this leader has `slice_id`.
    pub(crate) fn is_claimed(&self, slice_id: &str) -> bool {
        self.0.contains_key(slice_id)
    }

    /// Gives `slice_id` up, whoever had it.
    pub(crate) fn release(&self, slice_id: &str) {
        self.0.remove(slice_id);
    }

    /// Gives `slice_id` up if `session_id` has it.
    pub(crate) fn release_of(&self, slice_id: &str, session_id: &str) {
        self.0
            .remove_if(slice_id, |_, session| session == session_id);
    }

    /// How many slices are claimed.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// How many agents [`Placement::cancel_all_agents`] cancels at a time. Each costs a
/// worker call and two record writes; one at a time, the end of a
/// 1,024-agent job took over a minute.
const CANCEL_CONCURRENCY: usize = 32;

/// What placing agents takes: the fleet's records, the way to call
/// workers, and this leader's slice claims.
pub(crate) struct Placement {
    workers: Workers,
    leases: Leases,
    quarantine: Quarantine,
    dialer: WorkerDialer,
    /// Workers whose record is older than this count as offline.
    stale_after: Duration,
    pub(crate) claims: SliceClaims,
}

impl Placement {
    pub(crate) fn new(
        workers: Workers,
        leases: Leases,
        quarantine: Quarantine,
        dialer: WorkerDialer,
        stale_after: Duration,
    ) -> Self {
        Self {
            workers,
            leases,
            quarantine,
            dialer,
            stale_after,
            claims: SliceClaims::default(),
        }
    }

    /// The fleet as this daemon sees it now: workers, leases and quarantine
    /// records joined, limited to `selector`, with workers older than the
    /// configured staleness offline.
    pub(crate) async fn fleet_view(
        &self,
        selector: Option<&SliceSelector>,
    ) -> Result<FleetView, BusError> {
        read_fleet(
            &self.workers,
            &self.leases,
            &self.quarantine,
            selector,
            self.stale_after,
        )
        .await
    }

    /// Calls `Worker.SpawnSession` for `agent` on `slice_id` of the agent's
    /// worker (`agent.endpoint`).
    pub(crate) async fn spawn_on(
        &self,
        job: &JobContext,
        agent: &AgentEntry,
        slice_id: &str,
        resume: bool,
    ) -> Result<v1::SpawnSessionResponse, SpawnError> {
        let span = crate::spans::create_agent_span(
            &job.job_id,
            &agent.agent_id,
            &agent.session_id,
            job.spec.model.as_ref(),
        );
        // The call runs inside the span, whose trace context it sends along.
        let call = async {
            let mut client = self.dialer.client(&agent.worker_id, &agent.endpoint)?;
            let traceparent = mtswarm_telemetry::propagation::current_trace_headers()
                .and_then(|h| h.get(mtswarm_telemetry::propagation::TRACEPARENT).cloned())
                .unwrap_or_default();
            let request = v1::SpawnSessionRequest {
                job_id: job.job_id.clone(),
                agent_id: agent.agent_id.clone(),
                session_id: agent.session_id.clone(),
                slice_id: slice_id.to_string(),
                slice_selector: job.spec.slice_selector.clone(),
                role: agent.role.clone(),
                instructions: agent.instructions.clone(),
                kernel_dir: job.spec.kernel_dir.clone(),
                budgets: job.spec.budgets,
                model: job.spec.model.clone(),
                resume,
                auto_approve: job.spec.auto_approve,
                allow_shell: job.spec.allow_shell,
                traceparent,
                approval_rules: job.spec.approval_rules.clone(),
            };
            client
                .spawn_session(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| SpawnError::Refused {
                    code: status.code(),
                    message: status.message().to_string(),
                })
        };
        let spawned = call.instrument(span.clone()).await;
        if let Err(error) = &spawned {
            crate::spans::record_failure(&span, "spawn_refused", &error.to_string());
        }
        spawned
    }

    /// Marks the agent cancelled (memory and job record), cancels its session,
    /// releases its slice claim and settles its unfinished tasks as cancelled.
    /// The agent counts as cancelled even when the worker could not be told
    /// (the error says so). A spawn or move of the agent in flight sees the
    /// mark when it places the agent and stops the session it started.
    pub(crate) async fn cancel_agent(
        &self,
        job: &JobContext,
        agent_id: &str,
        reason: &str,
    ) -> Result<bool, CancelError> {
        let agent = job
            .mark_cancelled(agent_id)
            .ok_or_else(|| CancelError::UnknownAgent {
                agent_id: agent_id.to_string(),
            })?;
        if let Err(error) = job.store_placement(&agent).await {
            tracing::warn!(%error, job_id = %job.job_id, agent_id, "cancellation not recorded");
        }
        let cancelled = self.stop_session(&agent, reason).await;
        self.claims.release_of(&agent.slice_id, &agent.session_id);
        let mut settled = Vec::new();
        for task_id in job.results.task_ids(Some(&[agent_id.to_string()])) {
            if job.results.is_pending(&task_id) {
                settled.push(task_id.clone());
            }
            job.results.settle(
                &task_id,
                v1::TaskStatus::Cancelled,
                &format!("agent cancelled: {reason}"),
            );
        }
        job.record_settled(&settled, v1::TaskStatus::Cancelled)
            .await;
        cancelled
    }

    /// Calls `Worker.CancelSession` for the agent's session on its worker
    /// (`agent.endpoint`): true when the worker ran it and stops it now.
    pub(crate) async fn stop_session(
        &self,
        agent: &AgentEntry,
        reason: &str,
    ) -> Result<bool, CancelError> {
        let mut client = self.dialer.client(&agent.worker_id, &agent.endpoint)?;
        client
            .cancel_session(v1::CancelSessionRequest {
                session_id: agent.session_id.clone(),
                reason: reason.to_string(),
            })
            .await
            .map(|r| r.into_inner().cancelled)
            .map_err(|status| CancelError::Worker {
                worker_id: agent.worker_id.clone(),
                message: status.message().to_string(),
            })
    }

    /// Cancels every live agent's session (job cancelled or finished), up to
    /// [`CANCEL_CONCURRENCY`] at a time: each agent's cancellation touches only
    /// its own keys, session and tasks.
    pub(crate) async fn cancel_all_agents(&self, job: &JobContext, reason: &str) {
        let live: Vec<String> = job
            .agent_list()
            .into_iter()
            .filter(|agent| !agent.cancelled)
            .map(|agent| agent.agent_id)
            .collect();
        futures::stream::iter(live)
            .for_each_concurrent(CANCEL_CONCURRENCY, |agent_id| async move {
                let _ = self.cancel_agent(job, &agent_id, reason).await;
            })
            .await;
    }
}
