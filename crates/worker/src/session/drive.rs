//! Driving one run segment of a task attempt: the engine's event stream is
//! relayed (session status, measurements, agent events) while the
//! delivery is kept alive and stop requests, the task's deadline and its
//! device-seconds budget are watched.

use std::sync::atomic::Ordering;

use futures::StreamExt;
use mtswarm_core::{
    Event, EventKind, LoopState, Outcome, RunControl, RunHandle, RunStream, StopReason,
};
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

/// Why a segment was stopped besides its own end.
#[derive(Default)]
struct Stops {
    /// A shutdown, a lost lease or a dropped stop channel: no result.
    abandoned: bool,
    /// The slice was lost (see `StopMode::Fence`).
    fenced: bool,
    /// The task's deadline passed.
    deadline_hit: bool,
    /// The attempt used up its device seconds.
    device_budget_hit: bool,
}

impl Stops {
    /// A stop request: an abandon or a fence freezes the checkpoint sink
    /// and cancels the run, a cancel only cancels it; a dropped stop
    /// channel (`gone`) abandons the run.
    fn request(
        &mut self,
        mode: StopMode,
        gone: bool,
        sink: &KvCheckpointSink,
        control: &RunControl,
    ) {
        match mode {
            StopMode::Abandon => {
                sink.freeze();
                self.abandoned = true;
                control.cancel();
            }
            StopMode::Fence(_) => {
                sink.freeze();
                self.abandoned = true;
                self.fenced = true;
                control.cancel();
            }
            StopMode::Cancel(_) => control.cancel(),
            StopMode::Run | StopMode::AfterTask | StopMode::Idle(_) => {}
        }
        if gone {
            self.abandoned = true;
            sink.freeze();
            control.cancel();
        }
    }

    /// The run's outcome, said as what stopped it: the device-seconds
    /// budget or the deadline, when one of them cancelled it.
    fn explain(&self, outcome: Outcome, used: f64, device_budget: Option<f64>) -> Outcome {
        if self.device_budget_hit
            && let Outcome::Stopped { state, .. } = outcome
        {
            return Outcome::Stopped {
                reason: StopReason::Aborted,
                message: format!(
                    "device-seconds budget exhausted: {used:.3} s used of {:.3} s",
                    device_budget.unwrap_or_default()
                ),
                state,
            };
        }
        if self.deadline_hit
            && let Outcome::Stopped { state, .. } = outcome
        {
            return Outcome::Stopped {
                reason: StopReason::WallTime,
                message: "the task's deadline passed".into(),
                state,
            };
        }
        outcome
    }
}

impl TaskRun<'_> {
    /// Drive one run segment to its end, relaying its events, keeping the
    /// delivery alive, and stopping it for a stop request, the task's
    /// deadline or its device-seconds budget.
    pub(super) async fn drive(
        &self,
        stop: &mut watch::Receiver<StopMode>,
        segment: &Segment<'_>,
        mut stream: RunStream,
        handle: RunHandle,
    ) -> Driven {
        let control = handle.control();
        // The first progress ack is one period from now. (Not `interval`
        // plus a first `tick().await`: that first tick waits for the timer
        // wheel's next millisecond, which was most of a short task's time.)
        let period = self.shared.progress_interval();
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let deadline_sleep = async {
            match segment.deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline_sleep);
        let mut stops = Stops::default();
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(event) => {
                        self.relay(event, &mut stream, segment.recorder).await;
                        let used = self.device_seconds();
                        if !stops.device_budget_hit
                            && segment.device_budget.is_some_and(|limit| used > limit)
                        {
                            stops.device_budget_hit = true;
                            control.cancel();
                        }
                    }
                    None => break,
                },
                _ = progress.tick() => {
                    if let Err(error) = self.delivery.in_progress().await {
                        tracing::debug!(%error, "progress ack failed");
                    }
                }
                changed = stop.changed(), if !stops.abandoned => {
                    let mode = stop.borrow().clone();
                    stops.request(mode, changed.is_err(), segment.sink, &control);
                }
                _ = &mut deadline_sleep, if !stops.deadline_hit => {
                    stops.deadline_hit = true;
                    control.cancel();
                }
            }
        }
        if stops.fenced {
            return Driven::Fenced;
        }
        if stops.abandoned {
            return Driven::Abandoned;
        }
        let outcome = run_outcome(stream.outcome().cloned(), handle).await;
        let explained = stops.explain(outcome, self.device_seconds(), segment.device_budget);
        Driven::Outcome(Box::new(explained))
    }

    /// Relays `event` and the rest of what the same poll emitted, in one
    /// message: the session's status, the measurements, the agent events.
    /// The run waits on something now (or has ended), so nothing is held
    /// back from a watcher while the step goes on.
    async fn relay(&self, event: Event, stream: &mut RunStream, recorder: &MeasurementRecorder) {
        let (events, task) = (self.events, &self.task);
        let mut ready = vec![event];
        ready.extend(stream.ready());
        for event in &ready {
            self.observe(event);
            recorder.observe(event).await;
            events.stage_engine_event(&task.task_id, task.attempt, event);
        }
        // A run that ended leaves its last events staged: they travel with
        // the attempt's `task_finished` (every way out of the attempt
        // flushes, see `lifecycle`).
        if !stream.finished() {
            events.flush().await;
        }
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

/// How the run ended: the outcome its stream saw (`seen`), else its
/// handle's (an aborted run when the handle has none).
async fn run_outcome(seen: Option<Outcome>, handle: RunHandle) -> Outcome {
    if let Some(outcome) = seen {
        return outcome;
    }
    match handle.outcome().await {
        Ok(outcome) => outcome,
        Err(error) => Outcome::Stopped {
            reason: StopReason::Aborted,
            message: error.to_string(),
            state: LoopState::default(),
        },
    }
}
