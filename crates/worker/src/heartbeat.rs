//! The worker record's heartbeat: re-registers the record when a heartbeat
//! fails (after a NATS outage, say) and, on every beat, checks the slices'
//! leases (see [`crate::leases`]).

use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::{Versioned, v1};
use tokio::sync::watch;

use crate::shared::Shared;

/// Beat until `stop` changes.
pub(crate) async fn heartbeat_loop(
    shared: Arc<Shared>,
    mut held: Versioned<v1::WorkerRecord>,
    mut stop: watch::Receiver<bool>,
) {
    let ttl = shared.config.worker_ttl;
    let mut ticker = tokio::time::interval((ttl / 3).max(Duration::from_millis(200)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => {}
        }
        let record = shared.record();
        match shared.workers.heartbeat(&held, &record, ttl).await {
            Ok(next) => held = next,
            Err(error) => {
                tracing::warn!(%error, "worker heartbeat failed; registering again");
                match shared.workers.register(&record, ttl).await {
                    Ok(next) => held = next,
                    Err(error) => tracing::warn!(%error, "worker registration failed"),
                }
            }
        }
        shared.check_leases().await;
    }
}
