//! Placement: where a job's agents run. One view of the fleet for every
//! part that needs it ([`fleet_view`]: tools, reassigner, prompt, the
//! `ListFleet` RPC), starting a session on a slice ([`spawn_on`], used by
//! `spawn_agent` and the reassigner) and cancelling agents
//! ([`cancel_agent`], [`cancel_all_agents`], [`stop_session`]).

use futures::StreamExt as _;
use mtswarm_bus::{BusError, v1};
use mtswarm_hw::SliceSelector;
use tracing::Instrument as _;

use crate::error::{CancelError, SpawnError};
use crate::fleet::{FleetView, read_fleet};
use crate::job::{AgentEntry, JobContext};
use crate::shared::Shared;

/// The fleet as this daemon sees it now: workers, leases and quarantine
/// records joined, limited to `selector`, with workers older than the
/// configured staleness offline.
pub(crate) async fn fleet_view(
    shared: &Shared,
    selector: Option<&SliceSelector>,
) -> Result<FleetView, BusError> {
    read_fleet(
        &shared.workers,
        &shared.leases,
        &shared.quarantine,
        selector,
        shared.config.worker_stale_after,
    )
    .await
}

/// Calls `Worker.SpawnSession` for `agent` on `slice_id` of the agent's
/// worker (`agent.endpoint`).
pub(crate) async fn spawn_on(
    shared: &Shared,
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
    let spawned = spawn_session(shared, job, agent, slice_id, resume)
        .instrument(span.clone())
        .await;
    if let Err(error) = &spawned {
        crate::spans::record_failure(&span, "spawn_refused", &error.to_string());
    }
    spawned
}

/// The SpawnSession call itself, inside the `create_agent` span whose
/// trace context it sends along.
async fn spawn_session(
    shared: &Shared,
    job: &JobContext,
    agent: &AgentEntry,
    slice_id: &str,
    resume: bool,
) -> Result<v1::SpawnSessionResponse, SpawnError> {
    let mut client = shared.worker_client(&agent.worker_id, &agent.endpoint)?;
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
}

/// Marks the agent cancelled (memory and job record), cancels its session,
/// releases its slice claim and settles its unfinished tasks as cancelled.
/// The agent counts as cancelled even when the worker could not be told
/// (the error says so). A spawn or move of the agent in flight sees the
/// mark when it places the agent and stops the session it started.
pub(crate) async fn cancel_agent(
    shared: &Shared,
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
    let cancelled = stop_session(shared, &agent, reason).await;
    shared
        .claimed_slices
        .remove_if(&agent.slice_id, |_, session| *session == agent.session_id);
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
    shared: &Shared,
    agent: &AgentEntry,
    reason: &str,
) -> Result<bool, CancelError> {
    let mut client = shared.worker_client(&agent.worker_id, &agent.endpoint)?;
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

/// How many agents [`cancel_all_agents`] cancels at a time. Each costs a
/// worker call and two record writes; one at a time, the end of a
/// 1,024-agent job took over a minute.
const CANCEL_CONCURRENCY: usize = 32;

/// Cancels every live agent's session (job cancelled or finished), up to
/// [`CANCEL_CONCURRENCY`] at a time: each agent's cancellation touches only
/// its own keys, session and tasks.
pub(crate) async fn cancel_all_agents(shared: &Shared, job: &JobContext, reason: &str) {
    let live: Vec<String> = job
        .agent_list()
        .into_iter()
        .filter(|agent| !agent.cancelled)
        .map(|agent| agent.agent_id)
        .collect();
    futures::stream::iter(live)
        .for_each_concurrent(CANCEL_CONCURRENCY, |agent_id| async move {
            let _ = cancel_agent(shared, job, &agent_id, reason).await;
        })
        .await;
}
