//! The event relay of the leader's own loop: every engine event becomes an
//! `AgentEvent` of the leader agent, appended to the job's journal, until
//! the run ends or is cancelled.
//!
//! The journal is the one place they are stored: `WatchJob` serves them from
//! there, in order with the leader's other entries. They are not published
//! on the workers' event subjects as well, where each would be stored twice
//! more (the events stream, and the journal's copy of it, which the watch
//! skips for the leader agent).

use futures::StreamExt as _;
use mtswarm_bus::v1;
use mtswarm_core::{Event, EventKind, RunHandle, RunStream};
use tokio::sync::watch;

use super::transition::now;
use crate::ids::LEADER_AGENT_ID;
use crate::job::JobContext;
use crate::stores::Stores;

/// Drives the run's events to their end, publishing each; a cancel request
/// stops the run (the stream then ends). Returns the cancel reason, if any.
pub(super) async fn pump(
    stores: &Stores,
    context: &JobContext,
    session_id: &str,
    events: &mut RunStream,
    handle: &RunHandle,
    cancel: &mut watch::Receiver<Option<String>>,
) -> Option<String> {
    let mut cancelled = cancel.borrow().clone();
    if cancelled.is_some() {
        handle.cancel();
    }
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(event) => journal_event(stores, context, session_id, &event).await,
                None => return cancelled,
            },
            changed = cancel.changed(), if cancelled.is_none() => {
                if changed.is_err() {
                    continue;
                }
                cancelled = cancel.borrow().clone();
                if cancelled.is_some() {
                    handle.cancel();
                }
            }
        }
    }
}

/// Maps a core engine event to the bus `AgentEvent` of the leader agent.
pub(crate) fn agent_event(
    job_id: &str,
    agent_id: &str,
    session_id: &str,
    event: &Event,
) -> v1::AgentEvent {
    use v1::AgentEventKind as K;
    let kind = match &event.kind {
        EventKind::Transition { .. } => K::StateTransition,
        EventKind::Thinking { .. } => K::Thinking,
        EventKind::TextDelta { .. } => K::TextDelta,
        EventKind::ToolCall { .. } => K::ToolCall,
        EventKind::ToolStateUpdate { .. } => K::Log,
        EventKind::ToolResult { .. } => K::ToolResult,
        EventKind::ApprovalRequired { .. } => K::ApprovalRequested,
        EventKind::ContextCompacted { .. } => K::Log,
        EventKind::ReplyEnd { .. } | EventKind::Stopped { .. } => K::SessionFinished,
        EventKind::Error { .. } => K::Error,
    };
    v1::AgentEvent {
        job_id: job_id.to_string(),
        agent_id: agent_id.to_string(),
        session_id: session_id.to_string(),
        // Engine sequence numbers start at 0; bus sequences start at 1.
        sequence: event.seq + 1,
        step: event.step,
        kind: kind as i32,
        payload_json: serde_json::to_string(&event.kind).unwrap_or_default(),
        timestamp: Some(now()),
    }
}

async fn journal_event(stores: &Stores, context: &JobContext, session_id: &str, event: &Event) {
    let message = agent_event(&context.job_id, LEADER_AGENT_ID, session_id, event);
    if let Err(error) = stores
        .journal
        .append(&context.job_id, v1::job_event::Event::AgentEvent(message))
        .await
    {
        tracing::warn!(%error, job_id = %context.job_id, "leader event not journaled");
    }
}
