//! Turning a session's engine events (and the session's own milestones)
//! into `AgentEvent`s on `mtswarm.event.<job>.<agent>`, numbered per session
//! without gaps. Everything a session publishes goes through one
//! `EventPublisher`, so its sequence is the order of publication.
//!
//! A session that resumes in another process continues the numbering: at
//! start the publisher reads the last event of its agent from the events
//! stream and carries on after it when it belongs to the same session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use mtswarm_bus::{Bus, codec, subjects, v1};
use mtswarm_core::{Event, EventKind, StopReason};
use serde_json::{Value, json};

use v1::AgentEventKind as Kind;

/// The proto kind of an engine event.
pub fn agent_event_kind(kind: &EventKind) -> Kind {
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
    /// The last sequence handed out.
    seq: AtomicU64,
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
            seq: AtomicU64::new(last),
        }
    }

    /// Publish one event; a failed publish is logged (events are progress
    /// reports, the run does not depend on them).
    pub(crate) async fn publish(&self, step: u32, kind: Kind, payload: Value) {
        let sequence = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let event = v1::AgentEvent {
            job_id: self.job_id.clone(),
            agent_id: self.agent_id.clone(),
            session_id: self.session_id.clone(),
            sequence,
            step,
            kind: kind as i32,
            payload_json: payload.to_string(),
            timestamp: Some(now_timestamp()),
        };
        if let Err(error) = self.bus.publish_event(&event).await {
            tracing::warn!(session.id = %self.session_id, %error, "agent event not published");
        }
    }

    /// Publish an engine event of a task's run.
    pub(crate) async fn engine_event(&self, task_id: &str, attempt: u32, event: &Event) {
        let mut payload = serde_json::to_value(&event.kind)
            .unwrap_or_else(|e| json!({"type": "unserializable", "error": e.to_string()}));
        if let Value::Object(map) = &mut payload {
            map.insert("task_id".into(), json!(task_id));
            map.insert("attempt".into(), json!(attempt));
            map.insert("engine_seq".into(), json!(event.seq));
        }
        self.publish(event.step, agent_event_kind(&event.kind), payload)
            .await;
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
            match codec::decode::<v1::AgentEvent>(
                &subject,
                Some(&message.headers),
                &message.payload,
            ) {
                Ok(event) if event.session_id == session_id => event.sequence,
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
