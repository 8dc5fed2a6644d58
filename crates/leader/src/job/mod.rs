//! The job's durable state: its agents and task records in memory, and the
//! writes that keep their keys in the jobs bucket (`<job>.agent.<id>`,
//! `<job>.task.<id>`, see [`mtswarm_bus::jobs`]) in step with them (see
//! [`crate::tools`] for why placements and tasks are recorded before
//! acting). Everything above (tools, placement, reassigner, runner) works on
//! a [`JobContext`]; this module depends only on the bus, the job's
//! result table and the kernel's tuning space.

mod admission;
mod agent;
mod records;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use mtswarm_bus::{Bus, Fence, Jobs, v1};
use mtswarm_hw::tune::TuneSpace;

use crate::results::JobResults;

pub(crate) use admission::{PendingStart, RunnerHandle};
pub(crate) use agent::AgentEntry;

/// Per-job state the tools work on.
pub(crate) struct JobContext {
    pub(crate) job_id: String,
    pub(crate) spec: v1::JobSpec,
    pub(crate) kernel_dir: PathBuf,
    /// The bus the job's tasks are published on.
    pub(crate) bus: Bus,
    /// The jobs KV holding the job's record.
    pub(crate) jobs: Jobs,
    pub(crate) results: Arc<JobResults>,
    pub(crate) agents: Mutex<BTreeMap<String, AgentEntry>>,
    /// The job's task records as last written to the job record, by task id.
    pub(crate) tasks: Mutex<BTreeMap<String, v1::TaskRecord>>,
    pub(crate) deadline: SystemTime,
    /// This leader's ownership of the job: every write below checks it
    /// (`records.rs`), so a leader that lost the job writes nothing more.
    pub(crate) fence: Fence,
    /// Changes of the record's agent count not written yet (`records.rs`).
    pub(crate) agent_count: records::PendingCount,
    /// The kernel's tuning space, read once for the job: every
    /// `assign_task` checks its plan against it (`None`: not readable).
    space: std::sync::OnceLock<Option<Arc<TuneSpace>>>,
}

impl JobContext {
    /// A fresh job's context (no agents, no tasks yet).
    // One caller (`JobHost::job_context`), which names every part.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        job_id: String,
        spec: v1::JobSpec,
        kernel_dir: PathBuf,
        bus: Bus,
        jobs: Jobs,
        results: Arc<JobResults>,
        deadline: SystemTime,
        fence: Fence,
    ) -> Self {
        Self {
            job_id,
            spec,
            kernel_dir,
            bus,
            jobs,
            results,
            agents: Default::default(),
            tasks: Default::default(),
            deadline,
            fence,
            agent_count: Default::default(),
            space: std::sync::OnceLock::new(),
        }
    }

    /// The kernel's tuning space (`tune.toml`), read at the first call of
    /// the job and kept: a thousand assignments would otherwise read and
    /// parse it a thousand times. `None` when it cannot be read (the
    /// tools then check nothing against it, as before).
    pub(crate) fn space(&self) -> Option<Arc<TuneSpace>> {
        self.space
            .get_or_init(|| {
                TuneSpace::load(&self.kernel_dir.join("tune.toml"))
                    .ok()
                    .map(Arc::new)
            })
            .clone()
    }

    pub(crate) fn agents(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AgentEntry>> {
        self.agents.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn tasks(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, v1::TaskRecord>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Assignments recorded but not confirmed published (a failed publish,
    /// or a crash between record and publish) whose result is still
    /// pending: what a resume and the sweep publish again.
    pub(crate) fn unconfirmed_assignments(&self) -> Vec<v1::TaskAssignment> {
        self.tasks()
            .values()
            .filter(|t| !t.done)
            .filter_map(|t| t.assignment.clone())
            .filter(|a| a.assigned_at.is_none() && self.results.is_pending(&a.task_id))
            .collect()
    }

    pub(crate) fn agent_list(&self) -> Vec<AgentEntry> {
        self.agents().values().cloned().collect()
    }

    pub(crate) fn agent(&self, agent_id: &str) -> Option<AgentEntry> {
        self.agents().get(agent_id).cloned()
    }

    /// Puts `entry` in place of its agent's entry unless the agent was
    /// cancelled meanwhile: a cancellation that races a spawn or a move
    /// wins, and the caller stops the session it started (the worker may
    /// have been told to cancel before that session existed). A cancelled
    /// agent keeps the placement `entry` names, so what is recorded says
    /// where its session ran. False when the agent is cancelled or gone.
    pub(crate) fn place_agent(&self, entry: &AgentEntry) -> bool {
        let mut agents = self.agents();
        match agents.get_mut(&entry.agent_id) {
            Some(current) if current.cancelled => {
                *current = AgentEntry {
                    cancelled: true,
                    spawning: false,
                    ..entry.clone()
                };
                false
            }
            Some(current) => {
                *current = entry.clone();
                true
            }
            None => false,
        }
    }

    /// Marks the agent cancelled and returns its entry as it is at that
    /// moment; `None` for an unknown agent. Marking comes first so that a
    /// spawn or move in flight sees it when it places the agent.
    pub(crate) fn mark_cancelled(&self, agent_id: &str) -> Option<AgentEntry> {
        let mut agents = self.agents();
        let entry = agents.get_mut(agent_id)?;
        entry.cancelled = true;
        Some(entry.clone())
    }

    /// The agents that have a task still pending, each with the slices
    /// those tasks are addressed to, in one pass over the tasks
    /// ([`JobContext::pending_tasks_of`] for every agent at once).
    pub(crate) fn pending_task_slices(&self) -> HashMap<String, HashSet<String>> {
        let mut slices: HashMap<String, HashSet<String>> = HashMap::new();
        for assignment in self
            .tasks()
            .values()
            .filter_map(|t| self.pending_assignment(t))
        {
            slices
                .entry(assignment.agent_id.clone())
                .or_default()
                .insert(assignment.slice_id.clone());
        }
        slices
    }

    /// Tasks of `agent_id` without a result, as last recorded.
    pub(crate) fn pending_tasks_of(&self, agent_id: &str) -> Vec<v1::TaskRecord> {
        self.tasks()
            .values()
            .filter(|t| self.pending_assignment_of(t, agent_id))
            .cloned()
            .collect()
    }

    /// Whether `agent_id` has a task without a result: what a lease change
    /// and the confirmer ask of every agent they look at, so it stops at
    /// the first, copies nothing, and looks up a result (a lock) only for
    /// the agent's own tasks.
    pub(crate) fn has_pending_task(&self, agent_id: &str) -> bool {
        self.tasks()
            .values()
            .any(|t| self.pending_assignment_of(t, agent_id))
    }

    /// Whether `task` is assigned to `agent_id` and still pending; the
    /// agent is compared first, so a scan over the job's tasks locks the
    /// results table only for that agent's.
    fn pending_assignment_of(&self, task: &v1::TaskRecord, agent_id: &str) -> bool {
        task.assignment
            .as_ref()
            .is_some_and(|a| a.agent_id == agent_id)
            && self.pending_assignment(task).is_some()
    }

    /// `task`'s assignment when the task is not done and its result is
    /// still pending.
    fn pending_assignment<'a>(&self, task: &'a v1::TaskRecord) -> Option<&'a v1::TaskAssignment> {
        task.assignment
            .as_ref()
            .filter(|a| !task.done && self.results.is_pending(&a.task_id))
    }
}
