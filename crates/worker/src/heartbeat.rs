//! The worker record's heartbeat: re-registers the record when a heartbeat
//! fails (after a NATS outage, say) and, on every beat, checks the slices'
//! leases (see [`crate::leases`]).

use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::{Versioned, Workers, v1};
use tokio::sync::watch;

use crate::identity::WorkerIdentity;
use crate::leases::SliceLeases;
use crate::slices::Slices;

/// What the heartbeat works with: the record it writes (the identity and
/// the slices it is built from), where, for how long, and the leases it
/// checks on every beat.
pub(crate) struct Beat {
    pub(crate) identity: Arc<WorkerIdentity>,
    pub(crate) slices: Arc<Slices>,
    pub(crate) workers: Workers,
    pub(crate) leases: Arc<SliceLeases>,
    /// The worker record's TTL; the heartbeat beats every third of it.
    pub(crate) ttl: Duration,
}

/// Beat until `stop` changes.
pub(crate) async fn heartbeat_loop(
    beat: Beat,
    mut held: Versioned<v1::WorkerRecord>,
    mut stop: watch::Receiver<bool>,
) {
    let ttl = beat.ttl;
    let mut ticker = tokio::time::interval((ttl / 3).max(Duration::from_millis(200)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => {}
        }
        let record = beat.identity.record(&beat.slices);
        match beat.workers.heartbeat(&held, &record, ttl).await {
            Ok(next) => held = next,
            Err(error) => {
                tracing::warn!(%error, "worker heartbeat failed; registering again");
                match beat.workers.register(&record, ttl).await {
                    Ok(next) => held = next,
                    Err(error) => tracing::warn!(%error, "worker registration failed"),
                }
            }
        }
        beat.leases.check_leases().await;
    }
}
