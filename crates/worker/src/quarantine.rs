//! Quarantine of failing slices. The daemon's monitor receives the slices
//! whose hardware runs failed `quarantine_after` times in a row (see
//! [`crate::health`]), writes their `SliceQuarantine` record (`by` = this
//! worker) and fences the session running there: the run stops and its task
//! ends with a fenced result, so the leader moves the agent to another
//! slice. A watch on the quarantine bucket fences the session of any of this
//! daemon's slices quarantined by someone else (an operator, the leader).
//! SpawnSession refuses a quarantined slice; deleting the record
//! (`Control.LiftQuarantine`) returns it to service.
//!
//! Both survive a NATS outage: a record that cannot be written is retried
//! with backoff, and the watch is re-created when it ends or fails.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mtswarm_bus::{Backoff, KvChange, Quarantine, v1};
use tokio::sync::mpsc;

use crate::events::now_timestamp;
use crate::health::FailingSlice;
use crate::slices::Slices;
use crate::stop::StopMode;
use crate::text::first_line;

/// What the quarantine monitor and watch work with: the daemon's slices
/// (their health, the sessions to fence), the quarantine bucket, and who
/// writes the records.
pub(crate) struct Quarantining {
    pub(crate) slices: Arc<Slices>,
    pub(crate) quarantine: Quarantine,
    pub(crate) worker_id: String,
    /// Consecutive failed runs that quarantine a slice.
    pub(crate) quarantine_after: u32,
}

/// Longest pause between retries of a failed write or watch.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Fence the session running on the slice, if any.
pub(crate) fn fence_slice(slices: &Slices, slice_index: usize, reason: &str) {
    let session = {
        let table = slices.table();
        table.slice_owner[slice_index]
            .as_ref()
            .and_then(|id| table.sessions.get(id).cloned())
    };
    if let Some(session) = session {
        tracing::warn!(slice.id = %slices[slice_index].bus_id, session.id = %session.session_id, %reason, "fencing the slice's session");
        session.stop(StopMode::Fence(reason.to_owned()));
    }
}

/// Write quarantine records for failing slices and fence their sessions.
pub(crate) async fn monitor(
    quarantining: Arc<Quarantining>,
    mut failing: mpsc::UnboundedReceiver<FailingSlice>,
) {
    while let Some(report) = failing.recv().await {
        let entry = &quarantining.slices[report.slice_index];
        // Reports that raced with an earlier quarantine of the same streak.
        if entry.health.consecutive_failures() < quarantining.quarantine_after {
            continue;
        }
        let reason = format!(
            "{} consecutive failed hardware runs; last: {}",
            report.consecutive_failures,
            first_line(&report.reason)
        );
        let record = v1::SliceQuarantine {
            slice_id: entry.bus_id.clone(),
            worker_id: quarantining.worker_id.clone(),
            reason: reason.clone(),
            consecutive_failures: report.consecutive_failures,
            since: Some(now_timestamp()),
            by: quarantining.worker_id.clone(),
        };
        // The session stops now; the record follows as soon as NATS takes it.
        fence_slice(
            &quarantining.slices,
            report.slice_index,
            &format!("slice {} quarantined: {reason}", entry.bus_id),
        );
        let mut backoff = Backoff::new(Duration::from_millis(100), MAX_BACKOFF);
        loop {
            match quarantining.quarantine.put(&record).await {
                Ok(_) => {
                    tracing::error!(slice.id = %entry.bus_id, consecutive_failures = report.consecutive_failures, %reason, "slice quarantined");
                    mtswarm_telemetry::metrics::metrics()
                        .slice_quarantined(&quarantining.worker_id, &entry.bus_id);
                    entry.health.reset();
                    break;
                }
                Err(error) => {
                    tracing::warn!(slice.id = %entry.bus_id, %error, "quarantine record not written; retrying");
                    backoff.sleep().await;
                }
            }
        }
    }
}

/// Fence the sessions of slices quarantined by anyone, for the daemon's life.
pub(crate) async fn watch(quarantining: Arc<Quarantining>) {
    let mut backoff = Backoff::new(Duration::from_millis(100), MAX_BACKOFF);
    loop {
        match quarantining.quarantine.kv().watch().await {
            Ok(mut changes) => {
                backoff.reset();
                while let Some(change) = changes.next().await {
                    match change {
                        Ok(KvChange::Put { key, value }) => {
                            if let Some(index) =
                                quarantining.slices.iter().position(|s| s.bus_id == key)
                            {
                                fence_slice(
                                    &quarantining.slices,
                                    index,
                                    &format!("slice {key} quarantined: {}", value.value.reason),
                                );
                            }
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(%error, "quarantine watch error; re-creating it");
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "quarantine watch unavailable; retrying");
            }
        }
        backoff.sleep().await;
    }
}
