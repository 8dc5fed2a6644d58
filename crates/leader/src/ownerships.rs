//! The jobs this leader owns: taking a job's ownership lease (free,
//! lapsed, or its own under the same leader id), the keeper that renews it
//! every third of the TTL, the fence every write for the job checks, and
//! giving it back. A job this leader lost or cannot run goes to the
//! standby loop (`runner/ownership.rs`), which takes it over when nobody
//! owns it.

use std::time::Duration;

use dashmap::DashMap;
use mtswarm_bus::{Fence, JobOwners, OwnershipError, OwnershipKeeper};
use tokio::sync::mpsc;

/// This leader's job ownerships.
pub(crate) struct Ownerships {
    /// The job ownership leases (bucket `mtswarm_job_owners`).
    pub(crate) owners: JobOwners,
    leader_id: String,
    /// `Control` URL of this leader, stored in its ownership records.
    grpc_url: String,
    ttl: Duration,
    /// Keepers of the jobs this leader owns, by job id.
    owned: DashMap<String, OwnershipKeeper>,
    /// Jobs to try to take over (their owner's lease lapsed or was lost
    /// here); the standby loop serializes every take-over.
    standby_tx: mpsc::UnboundedSender<String>,
}

impl Ownerships {
    pub(crate) fn new(
        owners: JobOwners,
        leader_id: String,
        grpc_url: String,
        ttl: Duration,
        standby_tx: mpsc::UnboundedSender<String>,
    ) -> Self {
        Self {
            owners,
            leader_id,
            grpc_url,
            ttl,
            owned: DashMap::new(),
            standby_tx,
        }
    }

    /// Takes the ownership of `job_id` for this leader and keeps renewing
    /// it every third of the TTL. The fence every write for the job checks.
    pub(crate) async fn take(&self, job_id: &str) -> Result<Fence, OwnershipError> {
        let held = self
            .owners
            .acquire(job_id, &self.leader_id, &self.grpc_url, self.ttl)
            .await?;
        tracing::info!(
            job_id,
            leader_id = %self.leader_id,
            epoch = held.value.epoch,
            "job ownership taken"
        );
        let keeper = self
            .owners
            .keep(held, (self.ttl / 3).max(Duration::from_millis(200)));
        let fence = keeper.fence().clone();
        self.owned.insert(job_id.to_string(), keeper);
        Ok(fence)
    }

    /// Whether this leader owns `job_id` now.
    pub(crate) fn owns(&self, job_id: &str) -> bool {
        self.owned.contains_key(job_id)
    }

    /// Ids of the jobs this leader owns now.
    pub(crate) fn job_ids(&self) -> Vec<String> {
        self.owned.iter().map(|k| k.key().clone()).collect()
    }

    /// The fence of a job this leader owns (`None`: not owned here).
    pub(crate) fn fence(&self, job_id: &str) -> Option<Fence> {
        self.owned.get(job_id).map(|k| k.fence().clone())
    }

    /// Forgets the keeper of a job whose ownership at `epoch` was lost (a
    /// later take-over's keeper stays).
    pub(crate) fn forget_lost(&self, job_id: &str, epoch: u64) {
        self.owned
            .remove_if(job_id, |_, keeper| keeper.fence().epoch() == epoch);
    }

    /// Gives up the ownership of a job that ended here (watchers see a
    /// release; the record is final, so nobody resumes it).
    pub(crate) async fn release(&self, job_id: &str) {
        if let Some((_, mut keeper)) = self.owned.remove(job_id)
            && let Err(error) = keeper.release().await
        {
            tracing::warn!(%error, job_id, "job ownership not released; it lapses");
        }
    }

    /// Stops renewing every ownership (closing their fences); the keys
    /// lapse after their TTL, as a crashed leader's do.
    pub(crate) async fn abandon_all(&self) {
        for job_id in self.job_ids() {
            if let Some((_, mut keeper)) = self.owned.remove(&job_id) {
                keeper.abandon().await;
            }
        }
    }

    /// Hands a job to the standby loop, which takes it over if nobody owns it.
    pub(crate) fn offer_take_over(&self, job_id: &str) {
        let _ = self.standby_tx.send(job_id.to_string());
    }
}
