//! The stages of a task attempt, in order: validation
//! ([`super::validate`]), the resume point ([`super::resume`]), the run
//! itself ([`super::execute`]), then either the result ([`super::result`])
//! or, when the attempt lost its slice, a fenced result
//! ([`super::fencing`]).

use mtswarm_bus::v1;
use tokio::sync::watch;

use super::drive::Driven;
use super::result::{TaskEnd, task_end};
use super::resume::ResumePoint;
use super::task_run::TaskRun;
use crate::stop::StopMode;

use v1::SessionState;

impl TaskRun<'_> {
    /// Run the attempt to its end: a result and an ack, a fenced result and
    /// a term, or (abandoned) neither.
    pub(super) async fn run(self, stop: &mut watch::Receiver<StopMode>) {
        let task = &self.task;
        self.entry.update(|p| {
            p.state = SessionState::Running;
            p.task_id = task.task_id.clone();
            p.attempt = task.attempt;
        });
        let end = match self.prepare_and_run(stop).await {
            Ok(Driven::Outcome(outcome)) => task_end(*outcome, stop),
            Ok(Driven::Abandoned) => {
                tracing::info!(task.id = %task.task_id, "task left unacknowledged for a later resume");
                return;
            }
            Ok(Driven::Fenced) => {
                let reason = match &*stop.borrow() {
                    StopMode::Fence(reason) => reason.clone(),
                    _ => "a later attempt of the task owns the session's checkpoint".to_owned(),
                };
                self.publish_fenced(&reason).await;
                return;
            }
            Err(end) => end,
        };
        // A run that finished while its slice was already lost (the process was
        // paused past its lease, say) must not look like the attempt's outcome.
        if let Some(reason) = self.slice_lost().await {
            self.entry.stop(StopMode::Fence(reason.clone()));
            self.publish_fenced(&reason).await;
            return;
        }
        self.publish_result(end).await;
    }

    /// Validate the task, find its resume point and run it.
    async fn prepare_and_run(
        &self,
        stop: &mut watch::Receiver<StopMode>,
    ) -> Result<Driven, TaskEnd> {
        let prepared = self
            .validate()
            .map_err(|invalid| TaskEnd::failed(invalid.to_string()))?;
        let resumed = match self.resume_point().await {
            ResumePoint::Fenced => return Ok(Driven::Fenced),
            ResumePoint::Fresh => None,
            ResumePoint::From(state) => Some(*state),
        };
        self.execute(stop, prepared, resumed).await
    }
}
