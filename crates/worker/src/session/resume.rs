//! Where a task attempt starts: afresh, from the session's checkpoint of
//! the same task (a reassignment, a redelivery, a task this session
//! checkpointed before), or not at all because a later attempt owns the
//! checkpoint or this attempt was fenced off before.

use mtswarm_core::LoopState;

use super::task_run::TaskRun;
use crate::checkpoint::restored_state;

/// Where an attempt starts.
pub(super) enum ResumePoint {
    /// Nothing to resume: a new run.
    Fresh,
    /// The checkpointed state of this task.
    From(Box<LoopState>),
    /// A later attempt owns the session's checkpoint, or this attempt was
    /// fenced off: the attempt must not run.
    Fenced,
}

impl TaskRun<'_> {
    /// Resume from the session's checkpoint when this task was already
    /// (partly) run: a reassignment, a redelivery, or a task this session
    /// checkpointed before.
    /// A first delivery of anything else has nothing to resume, so
    /// the stored checkpoint is not read: an earlier task's checkpoint is
    /// simply replaced by this task's first write (the store compares
    /// attempts of the same task only), and a later attempt of this task
    /// that owns the session is found by that write, which fences this run
    /// off before any tool runs.
    pub(super) async fn resume_point(&self) -> ResumePoint {
        let (shared, entry, runtime, delivery, task) = (
            self.shared,
            self.entry,
            self.runtime,
            self.delivery,
            &self.task,
        );
        let redelivered = delivery.info().delivered > 1;
        // The session checkpointed this task itself: the task came back without
        // the server counting a redelivery (its consumer state was lost in a
        // restart).
        let checkpointed_here = runtime
            .checkpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|known| known.task_id == task.task_id);
        let may_resume = task.resume_from_checkpoint || redelivered || checkpointed_here;
        let stored = if may_resume {
            match shared
                .stores
                .checkpoints
                .get_genuine(&entry.session_id)
                .await
            {
                Ok(stored) => {
                    if let Some(stored) = &stored {
                        runtime.saw_checkpoint(stored);
                    }
                    stored
                }
                Err(error) => {
                    tracing::warn!(%error, "checkpoint lookup failed; starting the task afresh");
                    None
                }
            }
        } else {
            None
        };
        // A later attempt owns the checkpoint, or this attempt was fenced off
        // before (a redelivery of it after its slice was lost and placed again).
        if let Some(stored) = &stored
            && stored.value.task_id == task.task_id
            && (stored.value.attempt > task.attempt
                || (stored.value.attempt == task.attempt && stored.value.fenced))
        {
            return ResumePoint::Fenced;
        }
        if may_resume
            && let Some(stored) = stored
            && stored.value.task_id == task.task_id
        {
            match restored_state(&shared.stores.checkpoints, &stored.value).await {
                Ok(state) => return ResumePoint::From(Box::new(state)),
                Err(error) => {
                    tracing::warn!(%error, "checkpoint unreadable; starting the task afresh");
                }
            }
        }
        ResumePoint::Fresh
    }
}
