//! The messages of the reassigner's queue: why an agent may have to move.
//! Defined apart from the reassigner so the parts that raise them (the
//! result consumer, the lease and quarantine watches) and the daemon's
//! shared handles do not depend on it.

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
