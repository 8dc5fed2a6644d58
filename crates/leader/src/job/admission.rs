//! A job between admission and its end: what its runner needs to start
//! ([`PendingStart`], queued by the scheduler) and how the job manager
//! holds a running one ([`RunnerHandle`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use super::JobContext;
use crate::validate::Attachment;

/// A job admitted to run (now or when a slot frees): everything its runner
/// needs.
pub(crate) struct PendingStart {
    pub(crate) context: Arc<JobContext>,
    pub(crate) attachments: Vec<Attachment>,
    /// The job's `invoke_workflow mtswarm.job` span the runner runs in.
    pub(crate) span: tracing::Span,
    /// The leader loop's checkpoint to continue from (resumed jobs).
    pub(crate) resume_state: Option<String>,
}

impl crate::scheduler::Pending for PendingStart {
    fn job_id(&self) -> &str {
        &self.context.job_id
    }
}

/// A running job's runner, as the job manager holds it.
pub(crate) struct RunnerHandle {
    cancel: watch::Sender<Option<String>>,
    done: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Set by whoever gives the job's run slot back first: the runner at
    /// its end, or the ownership guard that stopped it.
    slot_returned: Arc<AtomicBool>,
}

impl RunnerHandle {
    /// The handle of a runner task: `cancel` asks it to stop, `done`
    /// becomes true once it recorded the job's final state.
    pub(crate) fn new(
        cancel: watch::Sender<Option<String>>,
        done: watch::Receiver<bool>,
        task: tokio::task::JoinHandle<()>,
        slot_returned: Arc<AtomicBool>,
    ) -> Self {
        Self {
            cancel,
            done,
            task,
            slot_returned,
        }
    }

    /// True for the first caller only: that one gives the run slot back.
    pub(crate) fn return_slot(&self) -> bool {
        !self.slot_returned.swap(true, Ordering::AcqRel)
    }

    /// Asks the runner to cancel the loop and the agents.
    pub(crate) fn cancel(&self, reason: &str) {
        self.cancel.send_replace(Some(reason.to_string()));
    }

    /// Becomes true once the runner recorded the job's final state.
    pub(crate) fn done(&self) -> watch::Receiver<bool> {
        self.done.clone()
    }

    /// Stops the runner without recording a final state (daemon shutdown:
    /// the job stays RUNNING with its last checkpoint).
    pub(crate) fn abort(&self) {
        self.task.abort();
    }
}
