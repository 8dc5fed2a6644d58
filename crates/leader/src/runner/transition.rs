//! Job state transitions: the one way a job's state changes. The jobs KV is
//! written first (retried through a NATS restart), then the change is
//! journaled, so a watcher that sees a final state can rely on the record.

use std::time::{Duration, SystemTime};

use mtswarm_bus::{Backoff, Fence, v1};

use crate::host::JobHost;

/// The current time as a protobuf timestamp.
pub(crate) fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

/// True for SUCCEEDED, FAILED and CANCELLED.
pub(crate) fn is_final(state: v1::JobState) -> bool {
    matches!(
        state,
        v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
    )
}

/// Writes a state change to the job record (applying `change` too) and
/// journals it. The journal entry follows the KV write so a watcher that
/// sees a final state can rely on the record. With `fence` (the job's
/// owner writing) nothing is written once the ownership is lost; without
/// (a cancellation carried through KV to the owner by another leader) the
/// record's CAS alone orders it.
pub(crate) async fn transition(
    host: &JobHost,
    job_id: &str,
    fence: Option<&Fence>,
    current: v1::JobState,
    reason: &str,
    mut change: impl FnMut(&mut v1::JobRecord),
) -> Option<v1::JobRecord> {
    let mut previous = v1::JobState::Unspecified;
    // A state change must not be lost to a NATS restart: retry with backoff
    // (bounded, and not past the daemon's shutdown).
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let give_up = tokio::time::Instant::now() + Duration::from_secs(120);
    let written = loop {
        if let Some(Err(error)) = fence.map(|f| f.check("a job state change")) {
            tracing::warn!(%error, job_id, state = current.as_str_name(), "job state not written");
            return None;
        }
        let apply = |record: &mut v1::JobRecord| {
            previous = record.state();
            if is_final(previous) {
                return;
            }
            record.state = current as i32;
            record.updated_at = Some(now());
            change(record);
        };
        let written = match fence {
            Some(fence) => {
                let owner = host.stores.jobs.as_owner(fence.epoch());
                // Boxed: this future nests in every job runner's.
                let written = Box::pin(owner.modify(job_id, apply)).await;
                match written.map_err(|error| fence.refused(error)) {
                    Ok(written) => Ok(written),
                    Err(Ok(lost)) => {
                        tracing::warn!(error = %lost, job_id, state = current.as_str_name(), "job state not written");
                        return None;
                    }
                    Err(Err(other)) => Err(other),
                }
            }
            None => host.stores.jobs.modify(job_id, apply).await,
        };
        match written {
            Err(error)
                if !matches!(error, mtswarm_bus::BusError::NotFound { .. })
                    && tokio::time::Instant::now() < give_up
                    && !*host.shutdown.borrow() =>
            {
                tracing::warn!(%error, job_id, "job state not written yet; retrying");
                backoff.sleep().await;
            }
            other => break other,
        }
    };
    let record = match written {
        Ok(versioned) => versioned.value,
        Err(error) => {
            tracing::error!(%error, job_id, state = current.as_str_name(), "job state not written");
            return None;
        }
    };
    if is_final(previous) {
        return Some(record);
    }
    let event = v1::job_event::Event::StateChange(v1::JobStateChange {
        previous: previous as i32,
        current: current as i32,
        reason: reason.to_string(),
        outcome: record.outcome.clone().filter(|_| is_final(current)),
    });
    // The final state ends every watch: the job's last worker events go first.
    if is_final(current)
        && let Err(error) = host.stores.journal.settle(job_id).await
    {
        tracing::warn!(%error, job_id, "final state journaled before the job's last events");
    }
    if let Err(error) = host.stores.journal.append_confirmed(job_id, event).await {
        tracing::warn!(%error, job_id, "state change not journaled");
    }
    if is_final(current) {
        mtswarm_telemetry::metrics::metrics().job_finished(&state_label(current));
    }
    Some(record)
}

/// A job state as the `state` attribute spells it (`succeeded`).
fn state_label(state: v1::JobState) -> String {
    let name = state.as_str_name();
    name.strip_prefix("JOB_STATE_")
        .unwrap_or(name)
        .to_ascii_lowercase()
}
