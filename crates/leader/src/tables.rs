//! The leader's in-memory tables of per-job state: the runners in this
//! process, the contexts of the jobs it runs (or is about to run), their
//! result tables, and the admission scheduler of running and queued jobs.
//! Each goes back to its idle size when the jobs end, whatever number of
//! jobs ran before ([`JobTables::sizes`]).

use std::sync::Arc;

use dashmap::DashMap;

use crate::job::{JobContext, PendingStart, RunnerHandle};
use crate::results::ResultTable;
use crate::scheduler::Scheduler;

/// The per-job tables of one leader process.
pub(crate) struct JobTables {
    /// Job runners of this process, by job id.
    pub(crate) runners: DashMap<String, RunnerHandle>,
    /// Contexts of the jobs this leader runs (or is about to run), by job id.
    pub(crate) contexts: DashMap<String, Arc<JobContext>>,
    /// Result tables, one per job.
    pub(crate) results: Arc<ResultTable>,
    /// Admission: running and queued jobs.
    pub(crate) scheduler: Scheduler<PendingStart>,
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

impl JobTables {
    /// Empty tables admitting `max_active` running and `max_queued` queued jobs.
    pub(crate) fn new(max_active: usize, max_queued: usize) -> Self {
        Self {
            runners: DashMap::new(),
            contexts: DashMap::new(),
            results: Arc::new(ResultTable::default()),
            scheduler: Scheduler::new(max_active, max_queued),
        }
    }

    /// Forgets a job that ended or left this leader: its runner, context
    /// and result table.
    pub(crate) fn forget(&self, job_id: &str) {
        self.runners.remove(job_id);
        self.contexts.remove(job_id);
        self.results.remove(job_id);
    }

    /// The sizes of the per-job tables now, with `claimed_slices` claims.
    pub(crate) fn sizes(&self, claimed_slices: usize) -> LeaderTableSizes {
        let (running, queued) = self.scheduler.counts();
        LeaderTableSizes {
            runners: self.runners.len(),
            contexts: self.contexts.len(),
            result_tables: self.results.len(),
            claimed_slices,
            running,
            queued,
        }
    }
}
