//! The reassigner: moves the agents of running jobs off slices they lost and
//! re-publishes their unfinished tasks as the next attempt, so a killed or
//! fenced worker costs a job time, not its work.
//!
//! Triggers (for agents that are not cancelled and have tasks without an
//! accepted result):
//! 1. the leases KV watch: the agent's slice lease lapsed (expiry marker),
//!    was released, or names another session;
//! 2. the quarantine KV watch: the agent's slice was quarantined;
//! 3. a fenced result of a task's current attempt (from the result consumer);
//! 4. a sweep every lease TTL / 2 that checks each such agent's lease still
//!    names its session (catches what the watches missed: NATS restart,
//!    leader restart), re-publishes assignments whose publish was never
//!    confirmed, and moves tasks still addressed to an agent's old slice.
//!
//! Lease triggers re-read the lease first and do nothing when it names the
//! agent's session (the watch may report a state that is already over);
//! quarantine and fenced triggers move the agent regardless. An agent whose
//! `SpawnSession` is in flight is left alone.
//!
//! The move: pick a FREE slice matching the job's selector (not quarantined,
//! not claimed by another agent of this leader, worker not draining or
//! offline, and idly leased by its worker: a slice nobody holds belongs to
//! a worker that stopped renewing). The lost slice itself is tried first
//! when its live worker holds it idle (the session ended but the slice is
//! fine), except after a quarantine or a fenced result. `SpawnSession` there with the same session id and
//! agent id and `resume = true` (checkpoints are keyed by session id), update
//! the placement (memory and `JobRecord.agents`, `moves + 1`), then for each
//! pending task: register `attempt + 1` in the result table BEFORE
//! publishing, store the task record, publish the assignment (new worker and
//! slice, `resume_from_checkpoint = true`) and journal a leader LOG event
//! `{"type":"task_reassigned","task_id","attempt","agent","from_slice",
//! "to_slice","reason","detected_ms"}`. Without a free slice the agent waits:
//! every sweep tries again; the shortage is logged once per attempt.
//!
//! `detected_ms` is the time from the trigger's cause to the re-publish
//! acknowledgement: for a lapse, from the lapsed lease's `expires_at` (the
//! holder's clock); for a release, a lease naming another session or a
//! sweep finding no lease, from the moment the leader saw it (a sweep uses
//! the last known `expires_at` when it has one); for a quarantine, from the
//! record's `since`; for a fenced result, from the result's `finished_at`.
//! A worker killed at time K has its lease expire at most one TTL after K,
//! so the kill-to-republish time is at most TTL + `detected_ms`.
//!
//! Every watch is re-created with backoff when it ends or fails (NATS
//! restart); nothing here ends before the daemon shuts down.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use futures::StreamExt as _;
use mtswarm_bus::{KvChange, LeaseEvent, v1};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::fleet::parse_selector;
use crate::ids::{LEADER_AGENT_ID, leader_session_id};
use crate::job::{AgentEntry, JobContext};
use crate::placement::{fleet_view, spawn_on};
use crate::shared::Shared;
use crate::trigger::Trigger;

/// The latest lease record seen per slice (for lapse times).
type LeaseCache = Arc<DashMap<String, v1::SliceLease>>;

const MAX_BACKOFF: Duration = Duration::from_secs(2);

fn time_of(timestamp: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    timestamp.and_then(|t| SystemTime::try_from(t).ok())
}

/// Starts the reassigner and its two watches; the handles end at shutdown.
pub(crate) fn start(
    shared: Arc<Shared>,
    triggers: mpsc::UnboundedReceiver<Trigger>,
    shutdown: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let cache: LeaseCache = Arc::default();
    vec![
        tokio::spawn(watch_leases(
            shared.clone(),
            cache.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(watch_quarantine(shared.clone(), shutdown.clone())),
        tokio::spawn(run(shared, cache, triggers, shutdown)),
    ]
}

/// Sleeps `backoff` (doubling it up to [`MAX_BACKOFF`]); false on shutdown.
async fn back_off(backoff: &mut Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    tokio::select! {
        _ = tokio::time::sleep(wait) => !*shutdown.borrow(),
        _ = shutdown.changed() => false,
    }
}

async fn watch_leases(shared: Arc<Shared>, cache: LeaseCache, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if *shutdown.borrow() {
            return;
        }
        let mut changes = match shared.leases.watch_with_current().await {
            Ok(changes) => changes,
            Err(error) => {
                tracing::warn!(%error, "lease watch unavailable; retrying");
                if !back_off(&mut backoff, &mut shutdown).await {
                    return;
                }
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        loop {
            let change = tokio::select! {
                change = changes.next() => change,
                _ = shutdown.changed() => return,
            };
            let event = match change {
                Some(Ok(event)) => event,
                Some(Err(error)) => {
                    tracing::warn!(%error, "lease watch failed; re-creating it");
                    break;
                }
                None => break,
            };
            match event {
                LeaseEvent::Held(lease) => {
                    let lease = lease.value;
                    shared.observe_lease_ttl(lease.ttl_seconds);
                    let slice_id = lease.slice_id.clone();
                    let session = lease.session_id.clone();
                    let previous = cache.insert(slice_id.clone(), lease);
                    if previous.is_none_or(|p| p.session_id != session) {
                        shared.trigger_reassign(Trigger::Lease {
                            slice_id,
                            reason: if session.is_empty() {
                                "the slice's lease names no session".to_string()
                            } else {
                                format!("the slice's lease names session {session}")
                            },
                            cause_at: SystemTime::now(),
                        });
                    }
                }
                LeaseEvent::Released { slice_id } => {
                    cache.remove(&slice_id);
                    shared.trigger_reassign(Trigger::Lease {
                        slice_id,
                        reason: "the slice's lease was released".to_string(),
                        cause_at: SystemTime::now(),
                    });
                }
                LeaseEvent::Lapsed { slice_id } => {
                    let expired_at = cache
                        .remove(&slice_id)
                        .and_then(|(_, lease)| time_of(lease.expires_at));
                    shared.trigger_reassign(Trigger::Lease {
                        slice_id,
                        reason: "the slice's lease lapsed".to_string(),
                        cause_at: expired_at.unwrap_or_else(SystemTime::now),
                    });
                }
            }
        }
        if !back_off(&mut backoff, &mut shutdown).await {
            return;
        }
    }
}

async fn watch_quarantine(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if *shutdown.borrow() {
            return;
        }
        let mut changes = match shared.quarantine.kv().watch().await {
            Ok(changes) => changes,
            Err(error) => {
                tracing::warn!(%error, "quarantine watch unavailable; retrying");
                if !back_off(&mut backoff, &mut shutdown).await {
                    return;
                }
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        loop {
            let change = tokio::select! {
                change = changes.next() => change,
                _ = shutdown.changed() => return,
            };
            match change {
                Some(Ok(KvChange::Put { key, value })) => {
                    let record = value.value;
                    shared.trigger_reassign(Trigger::Quarantined {
                        slice_id: key,
                        reason: format!("slice quarantined: {}", record.reason),
                        cause_at: time_of(record.since).unwrap_or_else(SystemTime::now),
                    });
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    tracing::warn!(%error, "quarantine watch failed; re-creating it");
                    break;
                }
                None => break,
            }
        }
        if !back_off(&mut backoff, &mut shutdown).await {
            return;
        }
    }
}

/// State of the reassigner loop.
struct Reassigner {
    shared: Arc<Shared>,
    cache: LeaseCache,
    /// (job, task, attempt) whose "no free slice" was logged already.
    shortage_logged: HashSet<(String, String, u32)>,
    /// Agents that must move whatever their lease shows (quarantined slice,
    /// fenced result) but found no free slice yet: (job, agent) -> (slice
    /// it must leave, reason, cause time). Every sweep tries again.
    forced: HashMap<(String, String), (String, String, SystemTime)>,
}

async fn run(
    shared: Arc<Shared>,
    cache: LeaseCache,
    mut triggers: mpsc::UnboundedReceiver<Trigger>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reassigner = Reassigner {
        shared,
        cache,
        shortage_logged: HashSet::new(),
        forced: HashMap::new(),
    };
    let mut next_sweep = tokio::time::Instant::now() + reassigner.sweep_period();
    loop {
        tokio::select! {
            trigger = triggers.recv() => match trigger {
                Some(trigger) => reassigner.handle(trigger).await,
                None => return,
            },
            _ = tokio::time::sleep_until(next_sweep) => {
                reassigner.sweep().await;
                next_sweep = tokio::time::Instant::now() + reassigner.sweep_period();
            }
            _ = shutdown.changed() => return,
        }
    }
}

impl Reassigner {
    fn sweep_period(&self) -> Duration {
        (self.shared.lease_ttl() / 2).max(Duration::from_millis(250))
    }

    fn contexts(&self) -> Vec<Arc<JobContext>> {
        self.shared
            .contexts
            .iter()
            .map(|c| c.value().clone())
            .collect()
    }

    /// Agents that may be moved: not cancelled, not being spawned, with
    /// pending tasks.
    fn movable(context: &JobContext) -> Vec<AgentEntry> {
        context
            .agent_list()
            .into_iter()
            .filter(|a| !a.cancelled && !a.spawning)
            .filter(|a| !context.pending_tasks_of(&a.agent_id).is_empty())
            .collect()
    }

    /// True when the slice's live lease names `session_id`; `None` when the
    /// lease cannot be read (NATS away): then nothing is decided.
    async fn lease_names(&self, slice_id: &str, session_id: &str) -> Option<bool> {
        match self.shared.leases.get(slice_id).await {
            Ok(Some(lease)) => {
                self.shared.observe_lease_ttl(lease.value.ttl_seconds);
                Some(lease.value.session_id == session_id)
            }
            Ok(None) => Some(false),
            Err(error) => {
                tracing::debug!(%error, slice_id, "lease not readable; deciding later");
                None
            }
        }
    }

    async fn handle(&mut self, trigger: Trigger) {
        match trigger {
            Trigger::Lease {
                slice_id,
                reason,
                cause_at,
            } => {
                for context in self.contexts() {
                    for agent in Self::movable(&context) {
                        if agent.slice_id != slice_id {
                            continue;
                        }
                        if self.lease_names(&slice_id, &agent.session_id).await != Some(false) {
                            continue;
                        }
                        self.move_agent(&context, &agent.agent_id, &reason, cause_at, false)
                            .await;
                    }
                }
            }
            Trigger::Quarantined {
                slice_id,
                reason,
                cause_at,
            } => {
                for context in self.contexts() {
                    for agent in Self::movable(&context) {
                        if agent.slice_id == slice_id {
                            self.forced_move(&context, &agent, &reason, cause_at).await;
                        }
                    }
                }
            }
            Trigger::Fenced {
                job_id,
                task_id,
                attempt,
                reason,
                cause_at,
            } => {
                let Some(context) = self.shared.contexts.get(&job_id).map(|c| c.clone()) else {
                    return;
                };
                if context.results.attempt(&task_id) != Some(attempt)
                    || !context.results.is_pending(&task_id)
                {
                    return;
                }
                let agent = context
                    .tasks()
                    .get(&task_id)
                    .and_then(|t| t.assignment.as_ref().map(|a| a.agent_id.clone()))
                    .and_then(|agent_id| context.agent(&agent_id));
                if let Some(agent) = agent
                    && !agent.cancelled
                {
                    self.forced_move(&context, &agent, &reason, cause_at).await;
                }
            }
        }
    }

    /// A move that does not depend on the lease: remembered until it
    /// succeeds (or the agent left that slice, or has nothing pending).
    async fn forced_move(
        &mut self,
        context: &Arc<JobContext>,
        agent: &AgentEntry,
        reason: &str,
        cause_at: SystemTime,
    ) {
        let key = (context.job_id.clone(), agent.agent_id.clone());
        self.forced.insert(
            key.clone(),
            (agent.slice_id.clone(), reason.to_string(), cause_at),
        );
        if self
            .move_agent(context, &agent.agent_id, reason, cause_at, true)
            .await
        {
            self.forced.remove(&key);
        }
    }

    async fn sweep(&mut self) {
        let forced: Vec<_> = self
            .forced
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((job_id, agent_id), (slice_id, reason, cause_at)) in forced {
            let context = self.shared.contexts.get(&job_id).map(|c| c.clone());
            let agent = context.as_ref().and_then(|c| c.agent(&agent_id));
            match (context, agent) {
                (Some(context), Some(agent)) if agent.slice_id == slice_id => {
                    self.forced_move(&context, &agent, &reason, cause_at).await;
                }
                _ => {
                    self.forced.remove(&(job_id, agent_id));
                }
            }
        }
        for context in self.contexts() {
            // Assignments recorded but not confirmed published (a failed
            // publish, or a crash between record and publish): publish
            // again; the stream drops a copy of a publish that did go out.
            let unconfirmed: Vec<v1::TaskAssignment> = context
                .tasks()
                .values()
                .filter(|t| !t.done)
                .filter_map(|t| t.assignment.clone())
                .filter(|a| a.assigned_at.is_none() && context.results.is_pending(&a.task_id))
                .collect();
            for assignment in unconfirmed {
                if let Err(error) = context.publish_recorded(&assignment).await {
                    tracing::warn!(%error, task_id = %assignment.task_id, "task publish retry failed");
                }
            }
            for agent in Self::movable(&context) {
                match self.lease_names(&agent.slice_id, &agent.session_id).await {
                    Some(true) => {
                        // Tasks still addressed to a slice the agent left
                        // (assigned while it was being moved).
                        let stray: Vec<v1::TaskRecord> = context
                            .pending_tasks_of(&agent.agent_id)
                            .into_iter()
                            .filter(|t| {
                                t.assignment
                                    .as_ref()
                                    .is_some_and(|a| a.slice_id != agent.slice_id)
                            })
                            .collect();
                        if !stray.is_empty() {
                            self.republish(
                                &context,
                                &agent,
                                stray,
                                "the task was addressed to the agent's previous slice",
                                SystemTime::now(),
                                &agent.slice_id,
                            )
                            .await;
                        }
                    }
                    Some(false) => {
                        let cause_at = self
                            .cache
                            .get(&agent.slice_id)
                            .and_then(|l| time_of(l.expires_at))
                            .filter(|at| *at <= SystemTime::now())
                            .unwrap_or_else(SystemTime::now);
                        self.move_agent(
                            &context,
                            &agent.agent_id,
                            &format!(
                                "sweep: the lease of slice {} does not name session {}",
                                agent.slice_id, agent.session_id
                            ),
                            cause_at,
                            false,
                        )
                        .await;
                    }
                    None => {}
                }
            }
        }
    }

    /// Moves the agent to a free slice and re-publishes its pending tasks.
    /// False when it has to be tried again (no free slice, NATS away).
    /// Unless `forced`, the slice the agent lost is a candidate too (first)
    /// when its live worker holds it idle: the session ended (e.g. after
    /// an idle timeout) but the slice is fine.
    async fn move_agent(
        &mut self,
        context: &Arc<JobContext>,
        agent_id: &str,
        reason: &str,
        cause_at: SystemTime,
        forced: bool,
    ) -> bool {
        let Some(agent) = context.agent(agent_id) else {
            return true;
        };
        if agent.cancelled {
            return true;
        }
        let pending = context.pending_tasks_of(agent_id);
        if pending.is_empty() {
            return true;
        }
        let shared = &self.shared;
        let from_slice = agent.slice_id.clone();
        let selector = match parse_selector(&context.spec.slice_selector) {
            Ok(selector) => selector,
            Err(error) => {
                tracing::error!(job_id = %context.job_id, %error, "job selector unusable for a reassignment");
                return false;
            }
        };
        let view = match fleet_view(shared, selector.as_ref()).await {
            Ok(view) => view,
            Err(error) => {
                tracing::warn!(%error, job_id = %context.job_id, agent_id, "fleet not readable; reassignment retried on the next sweep");
                return false;
            }
        };
        // A live worker holds a lease on each of its idle slices (naming no
        // session); a FREE slice without one belongs to a worker that is
        // not renewing (dead or stopped but not yet expired from the
        // workers bucket): calling it would only time out.
        let held: HashSet<(String, String)> = match shared.leases.list().await {
            Ok(leases) => leases
                .into_iter()
                .map(|l| (l.value.slice_id, l.value.worker_id))
                .collect(),
            Err(error) => {
                tracing::warn!(%error, job_id = %context.job_id, agent_id, "leases not readable; reassignment retried on the next sweep");
                return false;
            }
        };
        let mut moved: Option<AgentEntry> = None;
        let mut refusals = Vec::new();
        let same_slice_ok = !forced;
        let mut candidates: Vec<&v1::FleetSlice> = view.slices.iter().collect();
        candidates.sort_by_key(|s| s.slice.as_ref().is_none_or(|d| d.slice_id != from_slice));
        for slice in candidates {
            let Some(descriptor) = &slice.slice else {
                continue;
            };
            if (descriptor.slice_id == from_slice && !same_slice_ok)
                || slice.state() != v1::SliceState::Free
                || !held.contains(&(descriptor.slice_id.clone(), slice.worker_id.clone()))
            {
                continue;
            }
            let Some(worker) = view
                .workers
                .iter()
                .find(|w| w.worker_id == slice.worker_id && !w.draining)
            else {
                continue;
            };
            let claimed = match shared.claimed_slices.entry(descriptor.slice_id.clone()) {
                // The agent's own claim on the slice it is on.
                dashmap::Entry::Occupied(entry) => *entry.get() == agent.session_id,
                dashmap::Entry::Vacant(entry) => {
                    entry.insert(agent.session_id.clone());
                    true
                }
            };
            if !claimed {
                continue;
            }
            let mut candidate = AgentEntry {
                worker_id: worker.worker_id.clone(),
                slice_id: descriptor.slice_id.clone(),
                endpoint: worker.endpoint.clone(),
                spawning: true,
                ..agent.clone()
            };
            context
                .agents()
                .insert(agent_id.to_string(), candidate.clone());
            match spawn_on(shared, context, &candidate, &descriptor.slice_id, true).await {
                // A worker that still runs the session elsewhere answers
                // with that placement: not a move.
                Ok(response)
                    if response.slice_id.is_empty() || response.slice_id == descriptor.slice_id =>
                {
                    candidate.spawning = false;
                    candidate.moves = agent.moves.saturating_add(1);
                    moved = Some(candidate);
                    break;
                }
                Ok(response) => {
                    refusals.push(format!(
                        "{}: the session still runs on {}",
                        descriptor.slice_id, response.slice_id
                    ));
                }
                Err(refusal) => refusals.push(format!("{}: {refusal}", descriptor.slice_id)),
            }
            if descriptor.slice_id != from_slice {
                shared.claimed_slices.remove(&descriptor.slice_id);
            }
            context.agents().insert(agent_id.to_string(), agent.clone());
        }
        let Some(moved) = moved else {
            for task in &pending {
                let Some(a) = &task.assignment else { continue };
                if self.shortage_logged.insert((
                    context.job_id.clone(),
                    a.task_id.clone(),
                    a.attempt,
                )) {
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
            return false;
        };
        if moved.slice_id != from_slice {
            shared
                .claimed_slices
                .remove_if(&from_slice, |_, session| *session == agent.session_id);
        }
        context.agents().insert(agent_id.to_string(), moved.clone());
        if let Err(error) = context.store_placement(&moved).await {
            tracing::warn!(%error, job_id = %context.job_id, agent_id, "moved placement not recorded");
        }
        let to_slice = moved.slice_id.clone();
        self.republish(context, &moved, pending, reason, cause_at, &from_slice)
            .await;
        tracing::info!(job_id = %context.job_id, agent_id, from_slice, to_slice, reason, "agent moved");
        if agent.endpoint != moved.endpoint {
            // The old worker may still run the session (quarantined slice,
            // fenced run, a stopped process that comes back): free its
            // slice. In the background: a dead worker only times out.
            let old = agent.clone();
            let new_slice = moved.slice_id.clone();
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let Ok(mut client) = shared.worker_client(&old.endpoint) else {
                    return;
                };
                let request = v1::CancelSessionRequest {
                    session_id: old.session_id.clone(),
                    reason: format!("session moved to slice {new_slice}"),
                };
                if let Err(status) = client.cancel_session(request).await {
                    tracing::debug!(worker_id = %old.worker_id, error = %status.message(), "old session of a moved agent not cancelled");
                }
            });
        }
        true
    }

    /// Registers, records and publishes the next attempt of each of
    /// `tasks` on the agent's (new) slice, and journals each move.
    async fn republish(
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
            assignment.result_token = self.shared.result_token(
                &assignment.job_id,
                &assignment.task_id,
                assignment.attempt,
            );
            assignment.assigned_at = None;
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
            self.shared
                .results
                .counters
                .reassigned
                .fetch_add(1, Ordering::Relaxed);
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
                .shared
                .journal
                .append_confirmed(&context.job_id, v1::job_event::Event::AgentEvent(event))
                .await
            {
                tracing::warn!(%error, job_id = %context.job_id, "reassignment not journaled");
            }
        }
    }
}
