//! Moving an agent: choosing a free slice, `SpawnSession` there with
//! `resume = true`, updating the placement, and re-publishing the agent's
//! pending tasks as their next attempt (journaled as `task_reassigned`).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use mtswarm_bus::{Leases, v1};
use serde_json::json;

use super::Reassigner;
use crate::fleet::{FleetView, parse_selector};
use crate::ids::{LEADER_AGENT_ID, leader_session_id};
use crate::job::{AgentEntry, JobContext};
use crate::placement::Placement;

impl Reassigner {
    /// Moves the agent to a free slice and re-publishes its pending tasks.
    /// False when it has to be tried again (no free slice, NATS away).
    /// Unless `forced`, the slice the agent lost is a candidate too (first)
    /// when its live worker holds it idle: the session ended (e.g. after
    /// an idle timeout) but the slice is fine.
    pub(super) async fn move_agent(
        &mut self,
        context: &Arc<JobContext>,
        agent_id: &str,
        reason: &str,
        cause_at: SystemTime,
        forced: bool,
    ) -> bool {
        let Some((agent, pending)) = agent_to_move(context, agent_id) else {
            return true;
        };
        let handles = self.handles.clone();
        let Some(free) = free_slices(&handles.placement, &handles.leases, context, agent_id).await
        else {
            return false;
        };
        let moved = match spawn_elsewhere(&handles.placement, context, &agent, &free, forced).await
        {
            SliceSearch::Moved(moved) => moved,
            SliceSearch::Cancelled => return true,
            SliceSearch::NoSlice(refusals) => {
                self.log_shortage(context, agent_id, reason, &pending, &refusals);
                return false;
            }
        };
        if !place_moved(&self.handles.placement, context, &agent, &moved).await {
            return true;
        }
        let from_slice = agent.slice_id.clone();
        let to_slice = moved.slice_id.clone();
        self.republish(context, &moved, pending, reason, cause_at, &from_slice)
            .await;
        tracing::info!(job_id = %context.job_id, agent_id, from_slice, to_slice, reason, "agent moved");
        if agent.endpoint != moved.endpoint {
            cancel_old_session(self.handles.placement.clone(), agent, moved.slice_id);
        }
        true
    }

    /// Logs that no slice took the agent, once per pending task attempt
    /// (the sweep tries again every time).
    fn log_shortage(
        &mut self,
        context: &JobContext,
        agent_id: &str,
        reason: &str,
        pending: &[v1::TaskRecord],
        refusals: &[String],
    ) {
        for task in pending {
            let Some(a) = &task.assignment else { continue };
            if self
                .shortage_logged
                .insert((context.job_id.clone(), a.task_id.clone(), a.attempt))
            {
                tracing::warn!(
                    job_id = %context.job_id,
                    agent_id,
                    task_id = %a.task_id,
                    attempt = a.attempt,
                    reason,
                    refusals = %refusals.join("; "),
                    "no free slice to move the agent to; retrying on every sweep"
                );
            }
        }
    }

    /// Registers, records and publishes the next attempt of each of
    /// `tasks` on the agent's (new) slice, and journals each move.
    pub(super) async fn republish(
        &mut self,
        context: &Arc<JobContext>,
        agent: &AgentEntry,
        tasks: Vec<v1::TaskRecord>,
        reason: &str,
        cause_at: SystemTime,
        from_slice: &str,
    ) {
        let mut records = Vec::new();
        for mut record in tasks {
            let Some(assignment) = record.assignment.as_mut() else {
                continue;
            };
            assignment.attempt = assignment.attempt.saturating_add(1);
            assignment.worker_id = agent.worker_id.clone();
            assignment.slice_id = agent.slice_id.clone();
            assignment.session_id = agent.session_id.clone();
            assignment.resume_from_checkpoint = true;
            assignment.result_token = self.handles.keys.result_token(
                &assignment.job_id,
                &assignment.task_id,
                assignment.attempt,
            );
            assignment.assigned_at = None;
            assignment.grant = self.handles.keys.grant(assignment, &agent.worker_key);
            // The new attempt is the only one accepted from now on, before
            // anything can answer it.
            context
                .results
                .register(&assignment.task_id, &agent.agent_id, assignment.attempt);
            context
                .tasks()
                .insert(assignment.task_id.clone(), record.clone());
            records.push(record);
        }
        if let Err(error) = context.store_tasks(&records, 0).await {
            tracing::warn!(%error, job_id = %context.job_id, "reassigned tasks not recorded; the sweep publishes them");
        }
        for record in records {
            let Some(assignment) = record.assignment else {
                continue;
            };
            if let Err(error) = context.publish_recorded(&assignment).await {
                tracing::warn!(%error, task_id = %assignment.task_id, "reassigned task not published; the sweep retries");
                continue;
            }
            self.handles
                .tables
                .results
                .counters
                .reassigned
                .fetch_add(1, Ordering::Relaxed);
            mtswarm_telemetry::metrics::metrics().task_reassigned();
            let detected_ms = SystemTime::now()
                .duration_since(cause_at)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            tracing::info!(
                job_id = %context.job_id,
                task_id = %assignment.task_id,
                attempt = assignment.attempt,
                agent_id = %agent.agent_id,
                from_slice,
                to_slice = %agent.slice_id,
                reason,
                detected_ms,
                "task reassigned"
            );
            let payload = json!({
                "type": "task_reassigned",
                "task_id": assignment.task_id,
                "attempt": assignment.attempt,
                "agent": agent.agent_id,
                "from_slice": from_slice,
                "to_slice": agent.slice_id,
                "reason": reason,
                "detected_ms": detected_ms,
            });
            let event = v1::AgentEvent {
                job_id: context.job_id.clone(),
                agent_id: LEADER_AGENT_ID.to_string(),
                session_id: leader_session_id(&context.job_id),
                sequence: 0,
                step: 0,
                kind: v1::AgentEventKind::Log as i32,
                payload_json: payload.to_string(),
                timestamp: Some(prost_types::Timestamp::from(SystemTime::now())),
            };
            if let Err(error) = self
                .handles
                .journal
                .append_confirmed(&context.job_id, v1::job_event::Event::AgentEvent(event))
                .await
            {
                tracing::warn!(%error, job_id = %context.job_id, "reassignment not journaled");
            }
        }
    }
}

/// The agent and its pending tasks, when there is something to move: the
/// agent is known, not cancelled, and has tasks without an accepted result.
fn agent_to_move(
    context: &JobContext,
    agent_id: &str,
) -> Option<(AgentEntry, Vec<v1::TaskRecord>)> {
    let agent = context.agent(agent_id)?;
    if agent.cancelled {
        return None;
    }
    let pending = context.pending_tasks_of(agent_id);
    if pending.is_empty() {
        return None;
    }
    Some((agent, pending))
}

/// The fleet as the move sees it: the slices of the job's selector and the
/// (slice, worker) pairs a live worker holds a lease on.
struct FreeSlices {
    view: FleetView,
    held: HashSet<(String, String)>,
}

impl FreeSlices {
    /// The slices the agent may move to, the one it lost first (when
    /// `same_slice_ok`): FREE, idly held by their worker, whose worker is
    /// known and not draining.
    fn candidates<'a>(
        &'a self,
        from_slice: &'a str,
        same_slice_ok: bool,
    ) -> impl Iterator<Item = (&'a v1::SliceDescriptor, &'a v1::WorkerRecord)> + 'a {
        let mut slices: Vec<&v1::FleetSlice> = self.view.slices.iter().collect();
        slices.sort_by_key(|s| s.slice.as_ref().is_none_or(|d| d.slice_id != from_slice));
        slices.into_iter().filter_map(move |slice| {
            let descriptor = slice.slice.as_ref()?;
            if (descriptor.slice_id == from_slice && !same_slice_ok)
                || slice.state() != v1::SliceState::Free
                || !self
                    .held
                    .contains(&(descriptor.slice_id.clone(), slice.worker_id.clone()))
            {
                return None;
            }
            let worker = self
                .view
                .workers
                .iter()
                .find(|w| w.worker_id == slice.worker_id && !w.draining)?;
            Some((descriptor, worker))
        })
    }
}

/// Reads the fleet for the job's selector and the leases; `None` (logged)
/// when either is not readable now.
async fn free_slices(
    placement: &Placement,
    leases: &Leases,
    context: &JobContext,
    agent_id: &str,
) -> Option<FreeSlices> {
    let selector = match parse_selector(&context.spec.slice_selector) {
        Ok(selector) => selector,
        Err(error) => {
            tracing::error!(job_id = %context.job_id, %error, "job selector unusable for a reassignment");
            return None;
        }
    };
    let view = match placement.fleet_view(selector.as_ref()).await {
        Ok(view) => view,
        Err(error) => {
            tracing::warn!(%error, job_id = %context.job_id, agent_id, "fleet not readable; reassignment retried on the next sweep");
            return None;
        }
    };
    // A live worker holds a lease on each of its idle slices (naming no
    // session); a FREE slice without one belongs to a worker that is not
    // renewing (dead or stopped but not yet expired from the workers
    // bucket): calling it would only time out.
    let held: HashSet<(String, String)> = match leases.list().await {
        Ok(leases) => leases
            .into_iter()
            .map(|l| (l.value.slice_id, l.value.worker_id))
            .collect(),
        Err(error) => {
            tracing::warn!(%error, job_id = %context.job_id, agent_id, "leases not readable; reassignment retried on the next sweep");
            return None;
        }
    };
    Some(FreeSlices { view, held })
}

/// Where the search for a new slice ended.
enum SliceSearch {
    /// The agent's session runs at this placement now.
    Moved(AgentEntry),
    /// The agent was cancelled since the move began: nothing to move.
    Cancelled,
    /// No slice took the session; why each one tried refused.
    NoSlice(Vec<String>),
}

/// What one slice answered.
enum SliceAttempt {
    Moved(AgentEntry),
    Cancelled,
    Refused(String),
}

/// Tries the candidate slices in order until one runs the agent's session.
async fn spawn_elsewhere(
    placement: &Placement,
    context: &JobContext,
    agent: &AgentEntry,
    free: &FreeSlices,
    forced: bool,
) -> SliceSearch {
    let mut refusals = Vec::new();
    for (descriptor, worker) in free.candidates(&agent.slice_id, !forced) {
        if !placement
            .claims
            .claim(&descriptor.slice_id, &agent.session_id)
        {
            continue;
        }
        match spawn_on_slice(placement, context, agent, descriptor, worker).await {
            SliceAttempt::Moved(moved) => return SliceSearch::Moved(moved),
            SliceAttempt::Cancelled => return SliceSearch::Cancelled,
            SliceAttempt::Refused(refusal) => refusals.push(refusal),
        }
    }
    SliceSearch::NoSlice(refusals)
}

/// `SpawnSession` with `resume = true` on one claimed slice; on a refusal
/// the claim is released and the agent placed back where it was.
async fn spawn_on_slice(
    placement: &Placement,
    context: &JobContext,
    agent: &AgentEntry,
    descriptor: &v1::SliceDescriptor,
    worker: &v1::WorkerRecord,
) -> SliceAttempt {
    let from_slice = &agent.slice_id;
    let mut candidate = AgentEntry {
        worker_id: worker.worker_id.clone(),
        slice_id: descriptor.slice_id.clone(),
        endpoint: worker.endpoint.clone(),
        worker_key: worker.record_key.clone(),
        spawning: true,
        ..agent.clone()
    };
    if !context.place_agent(&candidate) {
        // Cancelled since the move began: nothing to move.
        if descriptor.slice_id != *from_slice {
            placement.claims.release(&descriptor.slice_id);
        }
        return SliceAttempt::Cancelled;
    }
    let refusal = match placement
        .spawn_on(context, &candidate, &descriptor.slice_id, true)
        .await
    {
        // A worker that still runs the session elsewhere answers with that
        // placement: not a move.
        Ok(response)
            if response.slice_id.is_empty() || response.slice_id == descriptor.slice_id =>
        {
            candidate.spawning = false;
            candidate.moves = agent.moves.saturating_add(1);
            return SliceAttempt::Moved(candidate);
        }
        Ok(response) => format!(
            "{}: the session still runs on {}",
            descriptor.slice_id, response.slice_id
        ),
        Err(refusal) => format!("{}: {refusal}", descriptor.slice_id),
    };
    if descriptor.slice_id != *from_slice {
        placement.claims.release(&descriptor.slice_id);
    }
    if !context.place_agent(agent) {
        return SliceAttempt::Cancelled;
    }
    SliceAttempt::Refused(refusal)
}

/// Releases the old slice's claim and records the new placement; false
/// when the agent was cancelled while its new session started (that
/// session is stopped then, and both claims released).
async fn place_moved(
    placement: &Placement,
    context: &JobContext,
    agent: &AgentEntry,
    moved: &AgentEntry,
) -> bool {
    let agent_id = agent.agent_id.as_str();
    let from_slice = &agent.slice_id;
    if moved.slice_id != *from_slice {
        placement.claims.release_of(from_slice, &agent.session_id);
    }
    if !context.place_agent(moved) {
        // Cancelled while the new session started: the cancellation may
        // have reached the worker before that session existed.
        if let Err(error) = placement
            .stop_session(moved, "agent cancelled while moving")
            .await
        {
            tracing::warn!(%error, job_id = %context.job_id, agent_id, "session of an agent cancelled while moving not stopped");
        }
        for slice_id in [&moved.slice_id, from_slice] {
            placement.claims.release_of(slice_id, &agent.session_id);
        }
        return false;
    }
    if let Err(error) = context.store_placement(moved).await {
        tracing::warn!(%error, job_id = %context.job_id, agent_id, "moved placement not recorded");
    }
    true
}

/// The old worker may still run the session (quarantined slice, fenced
/// run, a stopped process that comes back): free its slice. In the
/// background: a dead worker only times out.
fn cancel_old_session(placement: Arc<Placement>, old: AgentEntry, new_slice: String) {
    tokio::spawn(async move {
        let reason = format!("session moved to slice {new_slice}");
        if let Err(error) = placement.stop_session(&old, &reason).await {
            tracing::debug!(worker_id = %old.worker_id, %error, "old session of a moved agent not cancelled");
        }
    });
}
