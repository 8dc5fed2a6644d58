//! A session's life: one tokio task per session that consumes its slice's
//! task subject through a durable consumer (re-opened with backoff when the
//! subscription ends), hands each delivery of this session to a
//! [`TaskRun`], and at the end publishes `session_finished` and frees the
//! slice (lease first, then the table).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mtswarm_bus::{Backoff, Delivery, v1};
use serde_json::json;
use tokio::sync::watch;
use tracing::Instrument;

use super::runtime::SessionRuntime;
use super::task_run::TaskRun;
use crate::events::EventPublisher;
use crate::session_entry::SessionEntry;
use crate::shared::Shared;
use crate::stop::StopMode;

use v1::AgentEventKind as Kind;
use v1::SessionState;

/// The session's task: take tasks one at a time until told to stop, idle
/// for too long or the consumer fails, then free the slice.
pub(super) async fn run_session(
    shared: Arc<Shared>,
    entry: Arc<SessionEntry>,
    runtime: SessionRuntime,
    consumer: mtswarm_bus::TaskConsumer,
    mut stop: watch::Receiver<StopMode>,
) {
    let events = EventPublisher::resume(
        &shared.bus,
        &entry.job_id,
        &entry.agent_id,
        &entry.session_id,
    )
    .await;
    let slice_id = shared.slices[entry.slice_index].bus_id.clone();
    events
        .publish(
            0,
            Kind::SessionStarted,
            json!({"type": "session_started", "worker_id": shared.worker_id, "slice_id": slice_id,
                   "resumed_from_step": entry.resumed_from_step}),
        )
        .await;
    entry.update(|p| p.state = SessionState::Idle);
    let mut end_state = SessionState::Finished;
    let end_reason: String;
    let mut delivery_errors = 0u32;
    match consumer.messages().await {
        Err(error) => {
            tracing::error!(%error, "task consumer unavailable; session ends");
            end_state = SessionState::Failed;
            end_reason = format!("task consumer unavailable: {error}");
        }
        Ok(mut messages) => loop {
            let mode = stop.borrow().clone();
            match mode {
                StopMode::Run => {}
                StopMode::AfterTask => {
                    end_reason = "drained".into();
                    break;
                }
                StopMode::Cancel(reason) => {
                    end_state = SessionState::Cancelled;
                    end_reason = reason;
                    break;
                }
                StopMode::Abandon => {
                    end_state = SessionState::Cancelled;
                    end_reason = "stopped by the daemon".into();
                    break;
                }
                StopMode::Fence(reason) => {
                    end_state = SessionState::Cancelled;
                    end_reason = format!("fenced off: {reason}");
                    break;
                }
            }
            let item = tokio::select! {
                _ = stop.changed() => continue,
                _ = tokio::time::sleep(shared.config.session_idle_timeout) => {
                    end_reason = format!("idle for {:?}", shared.config.session_idle_timeout);
                    break;
                }
                item = messages.next() => item,
            };
            match item {
                None => {
                    // The pull subscription ended (e.g. the server restarted):
                    // open it again; the durable consumer keeps our place.
                    tracing::warn!("the task subscription ended; re-opening it");
                    messages = reopen_tasks(&consumer, &mut stop).await;
                }
                Some(Err(error)) => {
                    delivery_errors += 1;
                    tracing::warn!(%error, errors_in_a_row = delivery_errors, "task delivery error");
                    if delivery_errors >= 3 {
                        messages = reopen_tasks(&consumer, &mut stop).await;
                        delivery_errors = 0;
                    } else {
                        // Avoid spinning on a broken subscription.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                Some(Ok(delivery)) => {
                    delivery_errors = 0;
                    handle_delivery(&shared, &entry, &runtime, &events, &mut stop, delivery).await;
                    entry.update(|p| {
                        p.state = SessionState::Idle;
                        p.task_id.clear();
                    });
                }
            }
        },
    }
    entry.update(|p| p.state = end_state);
    events
        .publish(
            entry.progress().step,
            Kind::SessionFinished,
            json!({"type": "session_finished", "state": end_state.as_str_name(), "reason": end_reason}),
        )
        .await;
    // Free the slice: the lease first, then the table.
    if let Err(error) = shared.set_lease_session(entry.slice_index, "", "").await {
        tracing::warn!(%error, "lease not reset after the session");
    }
    {
        let mut table = shared.table();
        table.sessions.remove(&entry.session_id);
        if table.slice_owner[entry.slice_index].as_deref() == Some(entry.session_id.as_str()) {
            table.slice_owner[entry.slice_index] = None;
        }
    }
    tracing::info!(session.id = %entry.session_id, reason = %end_reason, "session ended");
}

/// Open the task subscription again, with backoff, until it opens or the
/// session is told to stop (then an empty stream: the loop sees the stop).
async fn reopen_tasks(
    consumer: &mtswarm_bus::TaskConsumer,
    stop: &mut watch::Receiver<StopMode>,
) -> mtswarm_bus::DeliveryStream<v1::TaskAssignment> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match consumer.messages().await {
            Ok(messages) => {
                tracing::info!("task subscription re-opened");
                return messages;
            }
            Err(error) => {
                tracing::warn!(%error, "task subscription not re-opened yet; retrying");
            }
        }
        tokio::select! {
            _ = backoff.sleep() => {}
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() != StopMode::Run {
                    return Box::pin(futures::stream::empty());
                }
            }
        }
    }
}

async fn handle_delivery(
    shared: &Arc<Shared>,
    entry: &Arc<SessionEntry>,
    runtime: &SessionRuntime,
    events: &EventPublisher,
    stop: &mut watch::Receiver<StopMode>,
    delivery: Delivery<v1::TaskAssignment>,
) {
    let task = delivery.message().clone();
    if task.session_id != entry.session_id {
        tracing::warn!(
            task.id = %task.task_id,
            task.session_id = %task.session_id,
            session.id = %entry.session_id,
            "task for another session on this slice; terminated"
        );
        if let Err(error) = delivery.term().await {
            tracing::warn!(%error, "could not terminate the task");
        }
        return;
    }
    let span = tracing::info_span!(
        "worker.task",
        task.id = %task.task_id,
        task.attempt = task.attempt,
        session.id = %entry.session_id,
        job.id = %task.job_id,
        agent.id = %entry.agent_id,
    );
    if let Err(error) = delivery.set_span_parent(&span) {
        tracing::debug!(%error, "task trace context not applied");
    }
    TaskRun::new(shared, entry, runtime, events, &delivery, task)
        .run(stop)
        .instrument(span)
        .await;
}
