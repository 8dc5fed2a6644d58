//! Fencing: an attempt that lost its slice (its lease lapsed or was taken
//! over, a later attempt owns the session's checkpoint, the slice was
//! quarantined) must not look like the task's outcome. It marks the
//! session's checkpoint fenced, publishes a CANCELLED result with
//! `fenced = true` and terminates the delivery, retrying the writes while
//! NATS is away.

use std::time::{Duration, Instant};

use mtswarm_bus::{Backoff, v1};
use serde_json::json;

use super::task_run::TaskRun;
use crate::events::now_timestamp;
use crate::stop::StopMode;
use crate::text::first_line;

use v1::AgentEventKind as Kind;

impl TaskRun<'_> {
    /// End an attempt that lost its slice: a CANCELLED result marked fenced (the
    /// leader never takes it as the outcome, it reassigns), then terminate the
    /// delivery so it is not delivered again. The publish is retried for a while
    /// because a fenced worker is often one that was cut off (SIGSTOP, a NATS
    /// outage) and is reconnecting.
    pub(super) async fn publish_fenced(&self, reason: &str) {
        let (shared, entry, events, delivery, task) = (
            self.shared,
            self.entry,
            self.events,
            self.delivery,
            &self.task,
        );
        tracing::warn!(task.id = %task.task_id, attempt = task.attempt, %reason, "the run was fenced off; publishing a fenced result");
        let error = format!("fenced off: {reason}");
        let usage = v1::Usage {
            steps: entry.progress().step,
            device_seconds: self.device_seconds(),
            wall_seconds: self.started.elapsed().as_secs_f64(),
            ..v1::Usage::default()
        };
        let result = v1::TaskResult {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            // The attempt's capability, returned to the leader that issued it.
            result_token: task.result_token.clone(),
            job_id: task.job_id.clone(),
            agent_id: entry.agent_id.clone(),
            session_id: entry.session_id.clone(),
            worker_id: shared.identity.worker_id.clone(),
            slice_id: self.slice_id(),
            status: v1::TaskStatus::Cancelled as i32,
            summary: first_line(&error),
            result_json: json!({"error": error, "fenced": true}).to_string(),
            error: error.clone(),
            usage: Some(usage),
            finished_at: Some(now_timestamp()),
            fenced: true,
        };
        events
            .publish(
                entry.progress().step,
                Kind::Log,
                json!({"type": "task_finished", "task_id": task.task_id, "attempt": task.attempt,
                       "status": v1::TaskStatus::Cancelled.as_str_name(), "summary": error,
                       "fenced": true}),
            )
            .await;
        let mut retry = Patience::new(FENCED_RESULT_PATIENCE);
        // First the checkpoint: once it is marked, a redelivery of this attempt
        // (the task stream keeps it; a re-placed session on this slice gets it
        // again) is fenced at once instead of running on a lease it lost.
        while let Err(error) = shared
            .stores
            .checkpoints
            .mark_fenced(&entry.session_id, &task.task_id, task.attempt)
            .await
        {
            if !retry.wait("fenced checkpoint not marked", &error).await {
                break;
            }
        }
        loop {
            match shared.stores.bus.publish_result(&result).await {
                Ok(_) => {
                    tracing::info!(task.id = %task.task_id, attempt = task.attempt, "fenced result published");
                    break;
                }
                Err(error) => {
                    if !retry.wait("fenced result not published", &error).await {
                        break;
                    }
                }
            }
        }
        if let Err(error) = delivery.term().await {
            tracing::warn!(%error, "could not terminate the fenced task");
        }
    }

    /// Why the session's slice is no longer its own, if it is not: a fence
    /// already ordered, or a lease that is lost or past its expiry time (checked
    /// here directly, since the lease keeper may not have run yet after the
    /// process was paused).
    pub(super) async fn slice_lost(&self) -> Option<String> {
        let (shared, entry) = (self.shared, self.entry);
        if let StopMode::Fence(reason) = entry.stop_mode() {
            return Some(reason);
        }
        let slice = &shared.slices[entry.slice_index];
        let state = shared.leases.state(entry.slice_index);
        match state {
            Some(mtswarm_bus::KeptLease::Held(held)) => {
                let expires = held
                    .value
                    .expires_at
                    .and_then(|ts| std::time::SystemTime::try_from(ts).ok())?;
                (std::time::SystemTime::now() > expires).then(|| {
                    format!(
                        "the lease on slice {} expired before the run finished",
                        slice.bus_id
                    )
                })
            }
            Some(mtswarm_bus::KeptLease::Lost { reason, .. }) => Some(format!(
                "the lease on slice {} was lost: {reason}",
                slice.bus_id
            )),
            // Released or being replaced: the daemon is changing the lease itself.
            Some(mtswarm_bus::KeptLease::Released) | None => None,
        }
    }
}

/// Retries of a fenced attempt's last writes: a fenced worker is often one
/// that was cut off (SIGSTOP, a NATS outage) and is reconnecting, so each
/// write is retried with backoff until a shared deadline.
struct Patience {
    give_up: Instant,
    backoff: Backoff,
}

impl Patience {
    fn new(patience: Duration) -> Self {
        Self {
            give_up: Instant::now() + patience,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(5)),
        }
    }

    /// Logs `error` and waits before the next try; false (logged as given
    /// up) once the deadline has passed.
    async fn wait(&mut self, what: &str, error: &(dyn std::fmt::Display + Sync)) -> bool {
        if Instant::now() >= self.give_up {
            tracing::error!(%error, "{what}; giving up");
            return false;
        }
        tracing::warn!(%error, "{what} yet; retrying");
        self.backoff.sleep().await;
        true
    }
}

/// How long a fenced result is retried while NATS is unreachable.
const FENCED_RESULT_PATIENCE: Duration = Duration::from_secs(120);
