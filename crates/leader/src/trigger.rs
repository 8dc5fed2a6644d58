//! The messages of the reassigner's queue: why an agent may have to move.
//! Defined apart from the reassigner so the parts that raise them (the
//! result consumer, the lease and quarantine watches) do not depend on it.

use std::time::SystemTime;

/// Why an agent may have to move.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Trigger {
    /// A slice's lease lapsed, was released, or names another session.
    Lease {
        slice_id: String,
        reason: String,
        cause_at: SystemTime,
    },
    /// A slice was quarantined.
    Quarantined {
        slice_id: String,
        reason: String,
        cause_at: SystemTime,
    },
    /// A fenced result of a task's current attempt.
    Fenced {
        job_id: String,
        task_id: String,
        attempt: u32,
        reason: String,
        cause_at: SystemTime,
    },
}

/// The sending end of the reassigner's queue, for the parts that raise
/// triggers.
#[derive(Clone)]
pub(crate) struct Triggers(tokio::sync::mpsc::UnboundedSender<Trigger>);

impl Triggers {
    pub(crate) fn new(sender: tokio::sync::mpsc::UnboundedSender<Trigger>) -> Self {
        Self(sender)
    }

    /// Hands a trigger to the reassigner (dropped when it has stopped).
    pub(crate) fn send(&self, trigger: Trigger) {
        let _ = self.0.send(trigger);
    }
}
