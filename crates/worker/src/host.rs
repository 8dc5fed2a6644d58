//! What running sessions takes: the parts that spawn, run, checkpoint,
//! resume and stop sessions (the `Worker` service, the task dispatch, the
//! session runner) hold one [`SessionHost`]. The background loops (the
//! heartbeat, the quarantine monitor and watch, the janitor) hold only the
//! handles they use.
//!
//! A plain struct of handles, low in the layering: it imports only the
//! types it holds, never the parts that use it.

use std::sync::Arc;
use std::time::Duration;

use mtswarm_hw::HwLock;

use crate::config::WorkerConfig;
use crate::disk::DiskState;
use crate::identity::WorkerIdentity;
use crate::leases::SliceLeases;
use crate::slices::Slices;
use crate::stores::WorkerStores;

/// The handles and settings the daemon's sessions use.
pub(crate) struct SessionHost {
    pub(crate) config: WorkerConfig,
    /// The model API key (from its file or environment), if any.
    pub(crate) api_key: Option<String>,
    pub(crate) identity: Arc<WorkerIdentity>,
    pub(crate) stores: WorkerStores,
    pub(crate) slices: Arc<Slices>,
    pub(crate) leases: Arc<SliceLeases>,
    /// The daemon's one hardware lock: hardware tools are serialized per
    /// slice through it.
    pub(crate) hw_lock: HwLock,
    /// The workspace root's usage and the janitor's bookkeeping.
    pub(crate) disk: Arc<DiskState>,
}

impl SessionHost {
    /// How often a running task tells JetStream it is still being worked on.
    pub(crate) fn progress_interval(&self) -> Duration {
        progress_interval(&self.config)
    }
}

/// How often a running task tells JetStream it is still being worked on:
/// a third of the ack wait.
pub(crate) fn progress_interval(config: &WorkerConfig) -> Duration {
    (config.task_ack_wait / 3).max(Duration::from_millis(300))
}
