//! Turning a session's engine events (and the session's own milestones)
//! into `AgentEvent`s on `mtswarm.event.<job>.<agent>`, numbered per session
//! without gaps. Everything a session publishes goes through one
//! `EventPublisher`, so its sequence is the order of publication.
//!
//! A session that resumes in another process continues the numbering: at
//! start the publisher reads the last event of its agent from the events
//! stream and carries on after it when it belongs to the same session.
//!
//! Events are numbered when they are handed over and published in batches:
//! [`EventPublisher::stage`] only numbers an event, the next
//! [`EventPublisher::publish`] or [`EventPublisher::flush`] sends everything
//! staged as one `AgentEventBatch` (one stored message in `MTSWARM_EVENTS`
//! instead of one per event). The session stages what an engine poll emits
//! at once and flushes before anything that may wait (a model call, a tool
//! run, an approval), so a watcher sees a step's events as soon as the step
//! waits, and a task's last events travel with its `task_finished`.

use std::sync::Mutex;
use std::time::SystemTime;

use mtswarm_bus::{Bus, codec, subjects, v1};
use mtswarm_core::{Event, EventKind, StopReason};
use serde_json::{Value, json};

use v1::AgentEventKind as Kind;

/// The proto kind of an engine event.
pub(crate) fn agent_event_kind(kind: &EventKind) -> Kind {
    match kind {
        EventKind::Transition { .. } => Kind::StateTransition,
        EventKind::Thinking { .. } => Kind::Thinking,
        EventKind::TextDelta { .. } => Kind::TextDelta,
        EventKind::ToolCall { .. } => Kind::ToolCall,
        EventKind::ToolStateUpdate { .. } | EventKind::ContextCompacted { .. } => Kind::Log,
        EventKind::ToolResult { .. } => Kind::ToolResult,
        EventKind::ApprovalRequired { .. } => Kind::ApprovalRequested,
        EventKind::ReplyEnd { .. } => Kind::Log,
        EventKind::Stopped { reason, .. } => match reason {
            StopReason::MaxSteps | StopReason::TokenBudget | StopReason::WallTime => Kind::Budget,
            StopReason::Cancelled => Kind::Log,
            _ => Kind::Error,
        },
        EventKind::Error { .. } => Kind::Error,
    }
}

pub(crate) fn now_timestamp() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

/// Publishes one session's events in order with consecutive sequence numbers.
pub(crate) struct EventPublisher {
    bus: Bus,
    job_id: String,
    agent_id: String,
    session_id: String,
    /// Numbered events not published yet, in sequence order; the last
    /// sequence handed out is the last one staged (or published).
    staged: Mutex<Staged>,
    /// Held while a batch is taken and sent, so batches leave in order.
    sending: tokio::sync::Mutex<()>,
}

struct Staged {
    /// The last sequence handed out.
    seq: u64,
    events: Vec<v1::AgentEvent>,
}

impl EventPublisher {
    /// A publisher that continues after the last event this session
    /// published (in any process), or starts at 1.
    pub(crate) async fn resume(bus: &Bus, job_id: &str, agent_id: &str, session_id: &str) -> Self {
        let last = last_sequence(bus, job_id, agent_id, session_id).await;
        Self {
            bus: bus.clone(),
            job_id: job_id.to_owned(),
            agent_id: agent_id.to_owned(),
            session_id: session_id.to_owned(),
            staged: Mutex::new(Staged {
                seq: last,
                events: Vec::new(),
            }),
            sending: tokio::sync::Mutex::new(()),
        }
    }

    fn staged(&self) -> std::sync::MutexGuard<'_, Staged> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number an event and keep it for the next publish or flush.
    pub(crate) fn stage(&self, step: u32, kind: Kind, payload: Value) {
        let payload_json = payload.to_string();
        let mut staged = self.staged();
        staged.seq += 1;
        let event = v1::AgentEvent {
            job_id: self.job_id.clone(),
            agent_id: self.agent_id.clone(),
            session_id: self.session_id.clone(),
            sequence: staged.seq,
            step,
            kind: kind as i32,
            payload_json,
            timestamp: Some(now_timestamp()),
        };
        staged.events.push(event);
    }

    /// Publish one event, with everything staged before it in the same
    /// message; a failed publish is logged (events are progress reports,
    /// the run does not depend on them).
    pub(crate) async fn publish(&self, step: u32, kind: Kind, payload: Value) {
        self.stage(step, kind, payload);
        self.flush().await;
    }

    /// Publish everything staged (nothing when nothing is), as one message.
    pub(crate) async fn flush(&self) {
        let _sending = self.sending.lock().await;
        let events = std::mem::take(&mut self.staged().events);
        if events.is_empty() {
            return;
        }
        if let Err(error) = self.bus.publish_events(&events).await {
            tracing::warn!(session.id = %self.session_id, events = events.len(), %error, "agent events not published");
        }
    }

    /// Stage an engine event of a task's run.
    pub(crate) fn stage_engine_event(&self, task_id: &str, attempt: u32, event: &Event) {
        let mut payload = serde_json::to_value(&event.kind)
            .unwrap_or_else(|e| json!({"type": "unserializable", "error": e.to_string()}));
        if let Value::Object(map) = &mut payload {
            map.insert("task_id".into(), json!(task_id));
            map.insert("attempt".into(), json!(attempt));
            map.insert("engine_seq".into(), json!(event.seq));
        }
        self.stage(event.step, agent_event_kind(&event.kind), payload);
    }
}

/// The sequence of this session's last event on its agent's subject, or 0.
async fn last_sequence(bus: &Bus, job_id: &str, agent_id: &str, session_id: &str) -> u64 {
    let Ok(subject) = subjects::event(job_id, agent_id) else {
        return 0;
    };
    let stream = match bus
        .jetstream()
        .get_stream_no_info(subjects::EVENTS_STREAM)
        .await
    {
        Ok(stream) => stream,
        Err(error) => {
            tracing::debug!(%error, "events stream not available; numbering from 1");
            return 0;
        }
    };
    match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => {
            // The last message may be a batch: its last event is the last one.
            match codec::decode_agent_events(&subject, Some(&message.headers), &message.payload)
                .map(|events| events.into_iter().last())
            {
                Ok(Some(event)) if event.session_id == session_id => event.sequence,
                Ok(_) => 0,
                Err(error) => {
                    tracing::warn!(%error, "last agent event unreadable; numbering from 1");
                    0
                }
            }
        }
        // No message on the subject yet (or the stream is unreachable).
        Err(_) => 0,
    }
}
