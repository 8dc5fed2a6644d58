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
//! the placement (memory and the agent's key, `moves + 1`), then for each
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

mod lease_clock;
mod moving;
mod watches;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use mtswarm_bus::{Leases, Quarantine, v1};
use tokio::sync::{mpsc, watch};

pub(crate) use self::lease_clock::LeaseClock;
use self::watches::{watch_leases, watch_quarantine};
use crate::job::{AgentEntry, JobContext};
use crate::journal::Journal;
use crate::keys::LeaderKeys;
use crate::placement::Placement;
use crate::tables::JobTables;
use crate::trigger::{Trigger, Triggers};

/// Movable agents of one job from which a sweep lists the leases once
/// instead of reading each agent's.
const SWEEP_LISTING_FROM: usize = 16;

/// What the reassigner and its watches work with: the running jobs, the
/// placement of agents, the keys for the next attempts' tokens and grants,
/// the lease and quarantine buckets it watches, the journal it records
/// moves in, and its own queue (for the watches' triggers).
pub(crate) struct ReassignHandles {
    pub(crate) tables: Arc<JobTables>,
    pub(crate) placement: Arc<Placement>,
    pub(crate) keys: LeaderKeys,
    pub(crate) leases: Leases,
    pub(crate) quarantine: Quarantine,
    pub(crate) journal: Journal,
    pub(crate) triggers: Triggers,
    /// The lease TTL learnt from the lease records.
    pub(crate) lease_clock: LeaseClock,
}

/// The latest lease record seen per slice (for lapse times).
type LeaseCache = Arc<DashMap<String, v1::SliceLease>>;

const MAX_BACKOFF: Duration = Duration::from_secs(2);

fn time_of(timestamp: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    timestamp.and_then(|t| SystemTime::try_from(t).ok())
}

/// Starts the reassigner and its two watches; the handles end at shutdown.
pub(crate) fn start(
    handles: ReassignHandles,
    triggers: mpsc::UnboundedReceiver<Trigger>,
    shutdown: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let cache: LeaseCache = Arc::default();
    let handles = Arc::new(handles);
    vec![
        tokio::spawn(watch_leases(
            handles.clone(),
            cache.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(watch_quarantine(handles.clone(), shutdown.clone())),
        tokio::spawn(run(handles, cache, triggers, shutdown)),
    ]
}

/// State of the reassigner loop.
struct Reassigner {
    handles: Arc<ReassignHandles>,
    cache: LeaseCache,
    /// (job, task, attempt) whose "no free slice" was logged already.
    shortage_logged: HashSet<(String, String, u32)>,
    /// Agents that must move whatever their lease shows (quarantined slice,
    /// fenced result) but found no free slice yet: (job, agent) -> (slice
    /// it must leave, reason, cause time). Every sweep tries again.
    forced: HashMap<(String, String), (String, String, SystemTime)>,
}

async fn run(
    handles: Arc<ReassignHandles>,
    cache: LeaseCache,
    mut triggers: mpsc::UnboundedReceiver<Trigger>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reassigner = Reassigner {
        handles,
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
        (self.handles.lease_clock.ttl() / 2).max(Duration::from_millis(250))
    }

    fn contexts(&self) -> Vec<Arc<JobContext>> {
        self.handles
            .tables
            .contexts
            .iter()
            .map(|c| c.value().clone())
            .collect()
    }

    /// Agents that may be moved: not cancelled, not being spawned, with
    /// pending tasks.
    /// The agents with a pending task that may be moved, each with
    /// whether one of those tasks is addressed to another slice than the
    /// agent's (assigned while it was being moved).
    fn movable(context: &JobContext) -> Vec<(AgentEntry, bool)> {
        // One pass over the tasks, not one per agent: the sweep of a job
        // of a thousand agents would otherwise read a million task records.
        let pending = context.pending_task_slices();
        context
            .agents()
            .values()
            .filter(|a| !a.cancelled && !a.spawning)
            .filter_map(|a| {
                let slices = pending.get(&a.agent_id)?;
                let stray = slices.iter().any(|slice| *slice != a.slice_id);
                Some((a.clone(), stray))
            })
            .collect()
    }

    /// The movable agents placed on `slice_id`, each with its job. Only the
    /// agents on that slice are looked at: a lease changes for each of a
    /// job's thousand spawns and ends, and each change comes here.
    fn movable_on(
        contexts: Vec<Arc<JobContext>>,
        slice_id: &str,
    ) -> impl Iterator<Item = (Arc<JobContext>, AgentEntry)> + '_ {
        contexts.into_iter().flat_map(move |context| {
            let placed: Vec<AgentEntry> = context
                .agents()
                .values()
                .filter(|a| a.slice_id == slice_id && !a.cancelled && !a.spawning)
                .cloned()
                .collect();
            placed
                .into_iter()
                .filter(|agent| context.has_pending_task(&agent.agent_id))
                .map(|agent| (context.clone(), agent))
                .collect::<Vec<_>>()
        })
    }

    /// Every live lease by slice, read at once for a sweep (a listing reads
    /// the daemons' keys once, where a read per agent reads its daemon's
    /// key again for each of its slices); `None` when the bucket cannot be
    /// read (NATS away): then nothing is decided.
    async fn live_leases(&self) -> Option<HashMap<String, v1::SliceLease>> {
        match self.handles.leases.list().await {
            Ok(leases) => Some(
                leases
                    .into_iter()
                    .map(|lease| {
                        self.handles.lease_clock.observe(lease.value.ttl_seconds);
                        (lease.value.slice_id.clone(), lease.value)
                    })
                    .collect(),
            ),
            Err(error) => {
                tracing::debug!(%error, "leases not readable; the sweep decides later");
                None
            }
        }
    }

    /// True when the slice's live lease names `session_id`; `None` when the
    /// lease cannot be read (NATS away): then nothing is decided.
    async fn lease_names(&self, slice_id: &str, session_id: &str) -> Option<bool> {
        match self.handles.leases.get(slice_id).await {
            Ok(Some(lease)) => {
                self.handles.lease_clock.observe(lease.value.ttl_seconds);
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
                for (context, agent) in Self::movable_on(self.contexts(), &slice_id) {
                    if self.lease_names(&slice_id, &agent.session_id).await != Some(false) {
                        continue;
                    }
                    self.move_agent(&context, &agent.agent_id, &reason, cause_at, false)
                        .await;
                }
            }
            Trigger::Quarantined {
                slice_id,
                reason,
                cause_at,
            } => {
                for (context, agent) in Self::movable_on(self.contexts(), &slice_id) {
                    self.forced_move(&context, &agent, &reason, cause_at).await;
                }
            }
            Trigger::Fenced {
                job_id,
                task_id,
                attempt,
                reason,
                cause_at,
            } => {
                let Some(context) = self.handles.tables.contexts.get(&job_id).map(|c| c.clone())
                else {
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
        // Shortages of jobs that ended are never logged again.
        let contexts = &self.handles.tables.contexts;
        self.shortage_logged
            .retain(|(job_id, _, _)| contexts.contains_key(job_id));
        let forced: Vec<_> = self
            .forced
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((job_id, agent_id), (slice_id, reason, cause_at)) in forced {
            let context = self.handles.tables.contexts.get(&job_id).map(|c| c.clone());
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
            let unconfirmed = context.unconfirmed_assignments();
            for assignment in unconfirmed {
                if let Err(error) = context.publish_recorded(&assignment).await {
                    tracing::warn!(%error, task_id = %assignment.task_id, "task publish retry failed");
                }
            }
            let movable = Self::movable(&context);
            if movable.is_empty() {
                continue;
            }
            // Only a few agents: a read each is less than a listing.
            let leases = if movable.len() > SWEEP_LISTING_FROM {
                self.live_leases().await
            } else {
                None
            };
            for (agent, stray_seen) in movable {
                let names = match &leases {
                    Some(leases) => Some(
                        leases
                            .get(&agent.slice_id)
                            .is_some_and(|lease| lease.session_id == agent.session_id),
                    ),
                    None => self.lease_names(&agent.slice_id, &agent.session_id).await,
                };
                match names {
                    Some(true) if !stray_seen => {}
                    Some(true) => {
                        // Tasks still addressed to a slice the agent left
                        // (assigned while it was being moved), as they
                        // stand now.
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
}
