//! One task attempt: a [`TaskRun`] holds what every stage of the attempt
//! needs (the session, its runtime, the delivery, the attempt's clock and
//! device time), in place of a long argument list. The stages are methods
//! on it, one module each (see [`super::task`] for their order).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use mtswarm_bus::{Delivery, v1};

use super::runtime::SessionRuntime;
use crate::events::EventPublisher;
use crate::host::SessionHost;
use crate::session_entry::SessionEntry;

/// One attempt of one task on a session.
pub(super) struct TaskRun<'a> {
    pub(super) shared: &'a Arc<SessionHost>,
    pub(super) entry: &'a Arc<SessionEntry>,
    pub(super) runtime: &'a SessionRuntime,
    pub(super) events: &'a EventPublisher,
    pub(super) delivery: &'a Delivery<v1::TaskAssignment>,
    pub(super) task: v1::TaskAssignment,
    /// When the attempt started, for its wall time.
    pub(super) started: Instant,
    /// Milliseconds spent in hardware tools so far.
    pub(super) device_ms: AtomicU32,
}

impl<'a> TaskRun<'a> {
    /// An attempt of `task` starting now.
    pub(super) fn new(
        shared: &'a Arc<SessionHost>,
        entry: &'a Arc<SessionEntry>,
        runtime: &'a SessionRuntime,
        events: &'a EventPublisher,
        delivery: &'a Delivery<v1::TaskAssignment>,
        task: v1::TaskAssignment,
    ) -> Self {
        Self {
            shared,
            entry,
            runtime,
            events,
            delivery,
            task,
            started: Instant::now(),
            device_ms: AtomicU32::new(0),
        }
    }

    /// Device seconds used so far.
    pub(super) fn device_seconds(&self) -> f64 {
        f64::from(self.device_ms.load(Ordering::SeqCst)) / 1000.0
    }

    /// The bus id of the session's slice.
    pub(super) fn slice_id(&self) -> String {
        self.shared.slices[self.entry.slice_index].bus_id.clone()
    }
}
