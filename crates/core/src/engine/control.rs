//! The caller's side of a run: cancel it, switch tool groups, and wait for
//! its outcome.

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};

use super::{EngineError, Outcome};

/// Steers a running loop from outside: cancel it, switch tool groups.
#[derive(Clone)]
pub struct RunControl {
    pub(super) cancel: Arc<watch::Sender<bool>>,
    pub(super) groups: Arc<Mutex<Vec<(String, bool)>>>,
}

impl RunControl {
    /// Stop the run at the next opportunity (model calls and tool calls in
    /// flight are dropped).
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }
    /// Switch a tool group on or off from the next reasoning node on.
    pub fn set_group_active(&self, group: impl Into<String>, active: bool) {
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((group.into(), active));
    }
}

/// The caller's side of a run.
pub struct RunHandle {
    pub(super) control: RunControl,
    pub(super) outcome: oneshot::Receiver<Outcome>,
}

impl RunHandle {
    /// A handle that steers the run (and can be cloned and moved away).
    pub fn control(&self) -> RunControl {
        self.control.clone()
    }
    /// Same as [`RunControl::cancel`].
    pub fn cancel(&self) {
        self.control.cancel();
    }
    /// The outcome, once the stream has been driven to its end.
    pub async fn outcome(self) -> Result<Outcome, EngineError> {
        self.outcome.await.map_err(|_| EngineError::RunDropped)
    }
}
