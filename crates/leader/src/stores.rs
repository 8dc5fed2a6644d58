//! The leader's handles on NATS: the connection, the buckets it reads and
//! writes (jobs, approvals, workers, leases, quarantine) and the job event
//! journal. Opened once at start; every handle is a cheap clone, so each
//! part of the daemon holds the ones it uses.

use mtswarm_bus::{Approvals, Bus, JobOwners, Jobs, Leases, Quarantine, Workers};

use crate::config::LeaderConfig;
use crate::error::LeaderError;
use crate::journal::Journal;

/// The NATS connection, the leader's buckets and its job journal.
#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) bus: Bus,
    pub(crate) jobs: Jobs,
    pub(crate) approvals: Approvals,
    pub(crate) workers: Workers,
    pub(crate) leases: Leases,
    pub(crate) quarantine: Quarantine,
    pub(crate) journal: Journal,
}

impl Stores {
    /// Opens the journal and every bucket on `bus` (the topology exists);
    /// the job ownership bucket comes back apart, for
    /// [`crate::ownerships::Ownerships`].
    pub(crate) async fn open(
        bus: Bus,
        config: &LeaderConfig,
    ) -> Result<(Self, JobOwners), LeaderError> {
        let journal = Journal::ensure(&bus, &config.topology)
            .await
            .map_err(LeaderError::JobEvents)?;
        let (jobs, approvals, workers, leases, quarantine, owners) = tokio::try_join!(
            Jobs::open(&bus),
            Approvals::open(&bus),
            Workers::open(&bus),
            Leases::open(&bus),
            Quarantine::open(&bus),
            JobOwners::open(&bus),
        )?;
        let stores = Self {
            bus,
            jobs,
            approvals,
            workers,
            leases,
            quarantine,
            journal,
        };
        Ok((stores, owners))
    }
}
