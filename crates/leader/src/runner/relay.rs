//! The event relay of the leader's own loop: every engine event becomes an
//! `AgentEvent` of the leader agent, appended to the job's journal, until
//! the run ends or is cancelled.
//!
//! Polling the run's event stream is what drives the run, so the relay
//! never waits for the journal between two polls: the events go to a
//! writer task, which appends what gathered while its previous append was
//! being stored as one entry ([`Journal::append_leader_events`]). A turn
//! that spawns a thousand agents is not held up by a thousand synced
//! writes, and the journal gets one entry per round trip instead of one
//! per event. The relay returns once the writer stored everything, so the
//! job's final state change comes after its loop's last events.
//!
//! The journal is the one place they are stored: `WatchJob` serves them from
//! there, in order with the leader's other entries. They are not published
//! on the workers' event subjects as well, where each would be stored twice
//! more (the events stream, and the journal's copy of it, which the watch
//! skips for the leader agent).

use futures::StreamExt as _;
use mtswarm_bus::v1;
use mtswarm_core::{Event, EventKind, RunHandle, RunStream};
use tokio::sync::{mpsc, watch};

use super::transition::now;
use crate::ids::LEADER_AGENT_ID;
use crate::job::JobContext;
use crate::journal::Journal;
use crate::stores::Stores;

/// Drives the run's events to their end, journaling each; a cancel request
/// stops the run (the stream then ends). Returns the cancel reason, if any,
/// once every event is stored (or could not be).
pub(super) async fn pump(
    stores: &Stores,
    context: &JobContext,
    session_id: &str,
    events: &mut RunStream,
    handle: &RunHandle,
    cancel: &mut watch::Receiver<Option<String>>,
) -> Option<String> {
    let (to_writer, gathered) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_events(
        stores.journal.clone(),
        context.job_id.clone(),
        gathered,
    ));
    let as_message =
        |event: &Event| agent_event(&context.job_id, LEADER_AGENT_ID, session_id, event);
    let mut cancelled = cancel.borrow().clone();
    if cancelled.is_some() {
        handle.cancel();
    }
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(event) => {
                    // The rest of what the same poll emitted goes with it.
                    let mut batch = vec![as_message(&event)];
                    batch.extend(events.ready().iter().map(as_message));
                    // The writer outlives this loop: a send cannot fail.
                    let _ = to_writer.send(batch);
                }
                None => break,
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
    drop(to_writer);
    if let Err(error) = writer.await {
        tracing::warn!(%error, job_id = %context.job_id, "leader event writer ended abnormally");
    }
    cancelled
}

/// Appends the batches `gathered` sends, in order, each append taking
/// everything that arrived while the one before it was stored.
async fn write_events(
    journal: Journal,
    job_id: String,
    mut gathered: mpsc::UnboundedReceiver<Vec<v1::AgentEvent>>,
) {
    while let Some(mut events) = gathered.recv().await {
        while let Ok(more) = gathered.try_recv() {
            events.extend(more);
        }
        if let Err(error) = journal.append_leader_events(&job_id, &events).await {
            tracing::warn!(%error, %job_id, events = events.len(), "leader events not journaled");
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
