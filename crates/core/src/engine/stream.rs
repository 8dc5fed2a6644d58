//! The events of a run and the future that produces them: the run is
//! driven by polling its [`RunStream`]; the [`Emitter`] is the run's end of
//! the event queue.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Future, Stream, StreamExt};
use tokio::sync::oneshot;

use super::Outcome;
use crate::event::{Event, EventKind};
use crate::state::{LoopState, StopReason};
pub(super) type Driver = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// The events of a run; polling it is what drives the run.
pub struct RunStream {
    pub(super) driver: Option<Driver>,
    pub(super) queue: Arc<Mutex<VecDeque<Event>>>,
    pub(super) outcome: Option<Outcome>,
    pub(super) outcome_tx: Option<oneshot::Sender<Outcome>>,
}

impl RunStream {
    fn pop(&self) -> Option<Event> {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// The events the run has emitted and the stream has not handed out
    /// yet, without driving the run any further: after an event arrives,
    /// the rest of what the same poll emitted (typically the rest of a
    /// step up to its next wait), for a reader that publishes them together.
    pub fn ready(&mut self) -> Vec<Event> {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect()
    }

    /// True once the run has ended: nothing is emitted after the events
    /// still queued.
    pub fn finished(&self) -> bool {
        self.driver.is_none()
    }

    /// The outcome, once the stream has ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Drive the run to its end, returning every event and the outcome.
    pub async fn collect_all(mut self) -> (Vec<Event>, Outcome) {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        match self.outcome.take() {
            Some(outcome) => (events, outcome),
            // The stream only ends after the driver produced an outcome.
            None => unreachable_outcome(events),
        }
    }
}

fn unreachable_outcome(events: Vec<Event>) -> (Vec<Event>, Outcome) {
    let state = LoopState::default();
    (
        events,
        Outcome::Stopped {
            reason: StopReason::Aborted,
            message: "the run ended without an outcome".to_owned(),
            state,
        },
    )
}

impl Stream for RunStream {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            if let Some(event) = self.pop() {
                return Poll::Ready(Some(event));
            }
            let Some(driver) = self.driver.as_mut() else {
                return Poll::Ready(None);
            };
            match driver.as_mut().poll(cx) {
                Poll::Ready(outcome) => {
                    self.driver = None;
                    if let Some(tx) = self.outcome_tx.take() {
                        let _ = tx.send(outcome.clone());
                    }
                    self.outcome = Some(outcome);
                }
                Poll::Pending => {
                    return match self.pop() {
                        Some(event) => Poll::Ready(Some(event)),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }
}

pub(super) struct Emitter {
    pub(super) session: Arc<str>,
    pub(super) queue: Arc<Mutex<VecDeque<Event>>>,
    pub(super) seq: u64,
}

impl Emitter {
    pub(super) fn emit(&mut self, step: u32, kind: EventKind) {
        let event = Event {
            session_id: self.session.clone(),
            step,
            seq: self.seq,
            kind,
        };
        self.seq += 1;
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(event);
    }
}
