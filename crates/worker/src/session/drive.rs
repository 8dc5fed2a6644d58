//! Driving one run segment of a task attempt: the engine's event stream is
//! relayed (session status, measurements, agent events) while the
//! delivery is kept alive and stop requests, the task's deadline and its
//! device-seconds budget are watched.

use std::sync::atomic::Ordering;

use futures::StreamExt;
use mtswarm_core::{Event, EventKind, LoopState, Outcome, StopReason};
use tokio::sync::watch;

use super::task_run::TaskRun;
use crate::checkpoint::KvCheckpointSink;
use crate::results::MeasurementRecorder;
use crate::stop::StopMode;

/// Outcome of driving a run segment.
pub(super) enum Driven {
    Outcome(Box<Outcome>),
    /// Stopped for a shutdown/lease loss: no result, no ack.
    Abandoned,
    /// The attempt lost its slice (lease lost, quarantine, a later attempt
    /// owns the session's checkpoint): a fenced result, then the delivery
    /// is terminated.
    Fenced,
}

/// What one run segment is watched with, besides the attempt itself.
#[derive(Clone, Copy)]
pub(super) struct Segment<'s> {
    /// The attempt's checkpoint sink (frozen on an abandon or a fence).
    pub(super) sink: &'s KvCheckpointSink,
    /// When the task's deadline cancels the run.
    pub(super) deadline: Option<tokio::time::Instant>,
    /// Device seconds the attempt may use.
    pub(super) device_budget: Option<f64>,
    /// Records the attempt's measurements.
    pub(super) recorder: &'s MeasurementRecorder,
}

impl TaskRun<'_> {
    /// Drive one run segment to its end, relaying its events, keeping the
    /// delivery alive, and stopping it for a stop request, the task's
    /// deadline or its device-seconds budget.
    pub(super) async fn drive(
        &self,
        stop: &mut watch::Receiver<StopMode>,
        segment: &Segment<'_>,
        mut stream: mtswarm_core::RunStream,
        handle: mtswarm_core::RunHandle,
    ) -> Driven {
        let (events, delivery, task) = (self.events, self.delivery, &self.task);
        let Segment {
            sink,
            deadline,
            device_budget,
            recorder,
        } = *segment;
        let control = handle.control();
        // The first progress ack is one period from now. (Not `interval`
        // plus a first `tick().await`: that first tick waits for the timer
        // wheel's next millisecond, which was most of a short task's time.)
        let period = self.shared.progress_interval();
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let deadline_sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline_sleep);
        let mut abandoned = false;
        let mut fenced = false;
        let mut deadline_hit = false;
        let mut device_budget_hit = false;
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(event) => {
                        // The rest of what the same poll emitted goes with it
                        // in one message; the run waits on something now (or
                        // has ended), so nothing is held back from a watcher
                        // while the step goes on.
                        let mut ready = vec![event];
                        ready.extend(stream.ready());
                        for event in &ready {
                            self.observe(event);
                            recorder.observe(event).await;
                            events.stage_engine_event(&task.task_id, task.attempt, event);
                        }
                        // A run that ended leaves its last events staged: they
                        // travel with the attempt's `task_finished` (every way
                        // out of the attempt flushes, see `lifecycle`).
                        if !stream.finished() {
                            events.flush().await;
                        }
                        let used = self.device_seconds();
                        if !device_budget_hit && device_budget.is_some_and(|limit| used > limit) {
                            device_budget_hit = true;
                            control.cancel();
                        }
                    }
                    None => break,
                },
                _ = progress.tick() => {
                    if let Err(error) = delivery.in_progress().await {
                        tracing::debug!(%error, "progress ack failed");
                    }
                }
                changed = stop.changed(), if !abandoned => {
                    let mode = stop.borrow().clone();
                    match mode {
                        StopMode::Abandon => {
                            sink.freeze();
                            abandoned = true;
                            control.cancel();
                        }
                        StopMode::Fence(_) => {
                            sink.freeze();
                            abandoned = true;
                            fenced = true;
                            control.cancel();
                        }
                        StopMode::Cancel(_) => control.cancel(),
                        StopMode::Run | StopMode::AfterTask | StopMode::Idle(_) => {}
                    }
                    if changed.is_err() {
                        abandoned = true;
                        sink.freeze();
                        control.cancel();
                    }
                }
                _ = &mut deadline_sleep, if !deadline_hit => {
                    deadline_hit = true;
                    control.cancel();
                }
            }
        }
        if fenced {
            return Driven::Fenced;
        }
        if abandoned {
            return Driven::Abandoned;
        }
        let outcome = match stream.outcome().cloned() {
            Some(outcome) => outcome,
            None => match handle.outcome().await {
                Ok(outcome) => outcome,
                Err(error) => Outcome::Stopped {
                    reason: StopReason::Aborted,
                    message: error.to_string(),
                    state: LoopState::default(),
                },
            },
        };
        if device_budget_hit && let Outcome::Stopped { state, .. } = outcome {
            let used = self.device_seconds();
            return Driven::Outcome(Box::new(Outcome::Stopped {
                reason: StopReason::Aborted,
                message: format!(
                    "device-seconds budget exhausted: {used:.3} s used of {:.3} s",
                    device_budget.unwrap_or_default()
                ),
                state,
            }));
        }
        if deadline_hit && let Outcome::Stopped { state, .. } = outcome {
            return Driven::Outcome(Box::new(Outcome::Stopped {
                reason: StopReason::WallTime,
                message: "the task's deadline passed".into(),
                state,
            }));
        }
        Driven::Outcome(Box::new(outcome))
    }

    /// Keep the session's status current from its events.
    fn observe(&self, event: &Event) {
        let (runtime, entry, device_ms) = (self.runtime, self.entry, &self.device_ms);
        entry.update(|p| p.step = event.step);
        if let EventKind::ToolResult {
            name, duration_ms, ..
        } = &event.kind
            && runtime.hardware_tools.iter().any(|t| t == name)
        {
            let ms = u32::try_from(*duration_ms).unwrap_or(u32::MAX);
            device_ms.fetch_add(ms, Ordering::SeqCst);
        }
    }
}
