//! What hosting a job takes: the parts that admit, run, resume, cancel and
//! end jobs (the job manager, the runners, the `Control` service) hold one
//! [`JobHost`]. The loops that serve every job (result intake, reassigner,
//! relays) and the tools hold only the handles they use.
//!
//! A plain struct of handles, low in the layering: it imports only the
//! types it holds, never the parts that use it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use mtswarm_bus::results::ResultRecord;
use mtswarm_bus::{Fence, v1};
use tokio::sync::watch;

use crate::config::{LeaderConfig, ModelFactory};
use crate::job::JobContext;
use crate::keys::LeaderKeys;
use crate::ownerships::Ownerships;
use crate::placement::Placement;
use crate::result_consumer::ResultIntake;
use crate::stores::Stores;
use crate::tables::JobTables;
use crate::tools::ToolHandles;

/// The handles and settings a job's life on this leader uses.
pub(crate) struct JobHost {
    pub(crate) config: LeaderConfig,
    /// Canonical kernel root.
    pub(crate) kernel_root: PathBuf,
    pub(crate) model_factory: ModelFactory,
    pub(crate) stores: Stores,
    pub(crate) tables: Arc<JobTables>,
    pub(crate) ownerships: Arc<Ownerships>,
    pub(crate) placement: Arc<Placement>,
    pub(crate) keys: LeaderKeys,
    /// Where the results of the jobs here are taken in (and replayed on resume).
    pub(crate) intake: Arc<ResultIntake>,
    /// Becomes true when the daemon shuts down (ends WatchJob streams).
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl JobHost {
    /// A fresh job's context on this daemon's bus, jobs KV and result
    /// tables (the job's table is registered here).
    pub(crate) fn job_context(
        &self,
        job_id: String,
        spec: v1::JobSpec,
        kernel_dir: PathBuf,
        deadline: SystemTime,
        fence: Fence,
    ) -> JobContext {
        let results = self.tables.results.job(&job_id);
        JobContext::new(
            job_id,
            spec,
            kernel_dir,
            self.stores.bus.clone(),
            self.stores.jobs.clone(),
            results,
            deadline,
            fence,
        )
    }

    /// The job's measurement records the leader believes, and how many it
    /// refused ([`crate::outcome::believed_records`]).
    pub(crate) async fn believed_records(
        &self,
        job_id: &str,
    ) -> Result<(Vec<ResultRecord>, u32), mtswarm_bus::BusError> {
        crate::outcome::believed_records(&self.stores, &self.keys, job_id).await
    }

    /// What the job's leader tools work with.
    pub(crate) fn tool_handles(&self) -> ToolHandles {
        ToolHandles {
            placement: self.placement.clone(),
            keys: self.keys.clone(),
            default_collect_timeout: self.config.default_collect_timeout,
            max_collect_timeout: self.config.max_collect_timeout,
        }
    }

    /// Forgets a job that ended or left here and gives up its ownership.
    pub(crate) async fn forget_job(&self, job_id: &str) {
        self.tables.forget(job_id);
        self.ownerships.release(job_id).await;
    }
}
