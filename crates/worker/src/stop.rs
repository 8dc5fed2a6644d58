//! How a session is asked to stop: the vocabulary shared by the daemon, the
//! gRPC service, the quarantine monitor, approvals and the session loop. It
//! sits at the bottom of the layering so that none of those needs the
//! session code to name a stop.

/// How a session is asked to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopMode {
    /// Keep running.
    Run,
    /// Finish the current task, take no more (drain).
    AfterTask,
    /// No task came for this long: end the idle session and free its
    /// slice (the dispatcher's idle sweep).
    Idle(std::time::Duration),
    /// Stop now; the current task ends CANCELLED (CancelSession).
    Cancel(String),
    /// Stop now without a result or an ack; the last checkpoint stays for a
    /// resume (shutdown, drain grace over).
    Abandon,
    /// The slice was lost (lease lost, slice quarantined): stop now, end the
    /// current task with a fenced result, end the session. The checkpoint
    /// stays for the session's resume on another slice.
    Fence(String),
}

impl StopMode {
    /// Order of severity: a harder stop replaces a softer one, never the
    /// reverse.
    pub(crate) fn rank(&self) -> u8 {
        match self {
            StopMode::Run => 0,
            StopMode::AfterTask | StopMode::Idle(_) => 1,
            StopMode::Cancel(_) => 2,
            StopMode::Abandon => 3,
            // A fenced run still reports, even during a shutdown.
            StopMode::Fence(_) => 4,
        }
    }
}
