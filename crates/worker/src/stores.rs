//! The worker's handles on NATS: the connection and the buckets and stores
//! it writes (its record, quarantine records, checkpoints, approvals,
//! measurement records), the last three sealed or signed with the daemon's
//! record key ([`crate::provenance`]). Every handle is a cheap clone.

use mtswarm_auth::WorkerKey;
use mtswarm_bus::results::ResultsStore;
use mtswarm_bus::{Approvals, Bus, Checkpoints, Leases, Quarantine, Workers};

use crate::config::WorkerConfig;
use crate::error::WorkerError;

/// The NATS connection and the worker's stores.
#[derive(Clone)]
pub(crate) struct WorkerStores {
    pub(crate) bus: Bus,
    pub(crate) workers: Workers,
    pub(crate) quarantine: Quarantine,
    pub(crate) checkpoints: Checkpoints,
    pub(crate) approvals: Approvals,
    pub(crate) results: ResultsStore,
}

impl WorkerStores {
    /// Opens every store on `bus`; checkpoints are sealed and results
    /// signed with `record_key`. The leases bucket comes back apart, for
    /// [`crate::leases::SliceLeases`].
    pub(crate) async fn open(
        bus: Bus,
        config: &WorkerConfig,
        record_key: &WorkerKey,
    ) -> Result<(Self, Leases), WorkerError> {
        let leases = Leases::open(&bus).await?;
        let workers = Workers::open(&bus).await?;
        let quarantine = Quarantine::open(&bus).await?;
        let (seal, signer) =
            crate::provenance::seal_and_signer(record_key, config.leader_key.as_ref());
        let checkpoints = Checkpoints::open(&bus).await?.with_seal(seal);
        let approvals = Approvals::open(&bus).await?;
        let results = ResultsStore::open(&bus).await?.with_signer(signer);
        let stores = Self {
            bus,
            workers,
            quarantine,
            checkpoints,
            approvals,
            results,
        };
        Ok((stores, leases))
    }
}
