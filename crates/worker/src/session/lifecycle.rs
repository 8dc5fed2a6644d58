//! A session's life: one tokio task per session that takes the deliveries
//! the daemon's task consumer filed in its inbox ([`crate::dispatch`]),
//! hands each to a [`TaskRun`], and at the end returns what is still
//! queued, publishes `session_finished` and frees the slice (lease first,
//! then the table).

use mtswarm_bus::{Delivery, v1};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument;

use super::runtime::SessionRuntime;
use super::task_run::TaskRun;
use crate::events::EventPublisher;
use crate::host::SessionHost;
use crate::session_entry::SessionEntry;
use crate::stop::StopMode;

use v1::AgentEventKind as Kind;
use v1::SessionState;

/// The session's task: take tasks from its inbox one at a time until told
/// to stop (the daemon's idle sweep is one such stop), then free the slice.
pub(super) async fn run_session(
    shared: Arc<SessionHost>,
    entry: Arc<SessionEntry>,
    runtime: SessionRuntime,
    mut stop: watch::Receiver<StopMode>,
) {
    // Opened with the first task (or at the end): an idle session costs
    // no read of the events stream and no stored event.
    let mut events = None;
    entry.update(|p| p.state = SessionState::Idle);
    entry.inbox.mark_idle();
    let (end_state, end_reason) = loop {
        let mode = stop.borrow().clone();
        match mode {
            StopMode::Run => {}
            StopMode::AfterTask => break (SessionState::Finished, "drained".to_owned()),
            StopMode::Idle(timeout) => {
                break (SessionState::Finished, format!("idle for {timeout:?}"));
            }
            StopMode::Cancel(reason) => break (SessionState::Cancelled, reason),
            StopMode::Abandon => {
                break (SessionState::Cancelled, "stopped by the daemon".to_owned());
            }
            StopMode::Fence(reason) => {
                break (SessionState::Cancelled, format!("fenced off: {reason}"));
            }
        }
        let delivery = tokio::select! {
            _ = stop.changed() => continue,
            delivery = entry.inbox.next() => delivery,
        };
        // Boxed: the engine's future is large, and an idle session should
        // hold only its own small state, not room for a running task.
        let events = opened_events(&mut events, &shared, &entry).await;
        Box::pin(handle_delivery(
            &shared, &entry, &runtime, events, &mut stop, &delivery,
        ))
        .await;
        entry.update(|p| {
            p.state = SessionState::Idle;
            p.task_id.clear();
        });
        entry.inbox.mark_idle();
    };
    return_queued_tasks(&entry).await;
    entry.update(|p| p.state = end_state);
    opened_events(&mut events, &shared, &entry)
        .await
        .publish(
            entry.progress().step,
            Kind::SessionFinished,
            json!({"type": "session_finished", "state": end_state.as_str_name(), "reason": end_reason}),
        )
        .await;
    // Free the slice: the lease first, then the table.
    if let Err(error) = shared
        .leases
        .set_lease_session(entry.slice_index, "", "")
        .await
    {
        tracing::warn!(%error, "lease not reset after the session");
    }
    {
        let mut table = shared.slices.table();
        table.sessions.remove(&entry.session_id);
        table.free(entry.slice_index, &entry.session_id);
    }
    tracing::info!(session.id = %entry.session_id, reason = %end_reason, "session ended");
}

/// The session's event publisher, opened on first use: it continues the
/// numbering of the agent's events and stages `session_started`, which
/// goes out with the first task's events (or with `session_finished`).
async fn opened_events<'a>(
    events: &'a mut Option<EventPublisher>,
    shared: &SessionHost,
    entry: &SessionEntry,
) -> &'a EventPublisher {
    let opened = match events.take() {
        Some(opened) => opened,
        None => {
            let opened = EventPublisher::resume(
                &shared.stores.bus,
                &entry.job_id,
                &entry.agent_id,
                &entry.session_id,
            )
            .await;
            opened.stage(
                0,
                Kind::SessionStarted,
                json!({"type": "session_started", "worker_id": shared.identity.worker_id,
                       "slice_id": shared.slices[entry.slice_index].bus_id,
                       "resumed_from_step": entry.resumed_from_step}),
            );
            opened
        }
    };
    events.insert(opened)
}

/// Tasks still waiting when the session ends go back to the daemon's
/// consumer, which terminates them once the slice has another session or
/// their deliveries run out. An abandoned session (shutdown) leaves them
/// unacknowledged, as it leaves its current task, for the next process.
async fn return_queued_tasks(entry: &SessionEntry) {
    let queued = entry.inbox.drain();
    if queued.is_empty() || entry.stop_mode() == StopMode::Abandon {
        return;
    }
    tracing::info!(
        tasks = queued.len(),
        "the session ends with tasks queued; returned"
    );
    for delivery in queued {
        if let Err(error) = delivery.nak(None).await {
            tracing::warn!(%error, "a queued task was not returned");
        }
    }
}

async fn handle_delivery(
    shared: &Arc<SessionHost>,
    entry: &Arc<SessionEntry>,
    runtime: &SessionRuntime,
    events: &EventPublisher,
    stop: &mut watch::Receiver<StopMode>,
    delivery: &Delivery<v1::TaskAssignment>,
) {
    let task = delivery.message().clone();
    // One task is one invocation of the agent (OpenTelemetry GenAI
    // conventions v1.41.1, `invoke_agent` in-process span); its parent is
    // the leader's `assign_task` tool span, from the message headers.
    let span = mtswarm_core::genai_span!(
        "invoke_agent",
        kind: "internal",
        name: format_args!("invoke_agent {}", entry.agent_id),
        gen_ai.provider.name = %runtime.model.provider_name(),
        gen_ai.request.model = %runtime.model.model_name(),
        gen_ai.agent.id = %entry.agent_id,
        gen_ai.agent.name = %entry.agent_id,
        gen_ai.conversation.id = %entry.session_id,
        task.id = %task.task_id,
        task.attempt = task.attempt,
        session.id = %entry.session_id,
        job.id = %task.job_id,
        agent.id = %entry.agent_id,
    );
    if let Err(error) = delivery.set_span_parent(&span) {
        tracing::debug!(%error, "task trace context not applied");
    }
    TaskRun::new(shared, entry, runtime, events, delivery, task)
        .run(stop)
        .instrument(span)
        .await;
    // Whatever way the attempt ended (a result, a fence, an abandon, a
    // failure before the run), nothing it staged stays behind.
    events.flush().await;
}
