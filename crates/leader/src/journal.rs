//! A job's event stream, as `WatchJob` serves it: every agent event of the
//! job's agents (the leader's own loop included), state changes, approval
//! requests and decisions, and accepted task results, in one order.
//!
//! The journal is a JetStream stream of its own (`MTSWARM_JOB_EVENTS`,
//! subjects `mtswarm.jobevent.<job_id>`, protobuf `JobEvent`), written only
//! by the leader: agent events published by workers on `mtswarm.event.>` are
//! relayed into it by one subscription, so a watcher reads a single ordered
//! source that survives leader restarts. A `JobEvent`'s `sequence` is its
//! stream sequence (increasing within a job, not dense): `from_sequence`
//! maps directly onto a JetStream start sequence.

use std::pin::Pin;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::stream;
use futures::{Stream, StreamExt as _};
use mtswarm_bus::{Backoff, Bus, TopologyConfig, reopen, subjects, v1};
use prost::Message as _;

use crate::error::JournalError;

/// Stream holding every job's events.
pub const JOB_EVENTS_STREAM: &str = "MTSWARM_JOB_EVENTS";
/// Wildcard of the journal subjects.
pub const ALL_JOB_EVENTS: &str = "mtswarm.jobevent.>";
/// Content type of journal messages.
const CONTENT_TYPE: &str = "application/x-protobuf; proto=mtswarm.v1.JobEvent";

/// `mtswarm.jobevent.<job_id>`.
pub fn job_events_subject(job_id: &str) -> Result<String, mtswarm_bus::BusError> {
    subjects::validate_id("job id", job_id)?;
    Ok(format!("mtswarm.jobevent.{job_id}"))
}

/// Boxed stream of journal entries (sequence filled in).
pub type JobEventStream = Pin<Box<dyn Stream<Item = Result<v1::JobEvent, JournalError>> + Send>>;

/// Writer and reader of the job event journal.
#[derive(Clone, Debug)]
pub struct Journal {
    bus: Bus,
}

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

impl Journal {
    /// Creates or updates the journal stream (same limits as the events stream).
    pub async fn ensure(bus: &Bus, topology: &TopologyConfig) -> Result<Self, JournalError> {
        bus.jetstream()
            .create_or_update_stream(stream::Config {
                name: JOB_EVENTS_STREAM.to_string(),
                description: Some("mtswarm job event journal (WatchJob)".to_string()),
                subjects: vec![ALL_JOB_EVENTS.to_string()],
                retention: stream::RetentionPolicy::Limits,
                storage: topology.storage,
                num_replicas: topology.replicas,
                max_age: topology.event_max_age,
                max_bytes: topology.event_max_bytes,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            })
            .await
            .map_err(|e| JournalError::CreateStream {
                stream: JOB_EVENTS_STREAM,
                source: Box::new(e),
            })?;
        Ok(Self { bus: bus.clone() })
    }

    fn message(job_id: &str, event: v1::job_event::Event) -> v1::JobEvent {
        v1::JobEvent {
            job_id: job_id.to_string(),
            sequence: 0,
            timestamp: Some(now()),
            event: Some(event),
        }
    }

    fn headers() -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", CONTENT_TYPE);
        mtswarm_bus::trace::inject_current(&mut headers);
        headers
    }

    /// Appends an event without waiting for the stream (progress events).
    pub async fn append(
        &self,
        job_id: &str,
        event: v1::job_event::Event,
    ) -> Result<(), JournalError> {
        let subject = job_events_subject(job_id)?;
        let payload = Self::message(job_id, event).encode_to_vec();
        self.bus
            .client()
            .publish_with_headers(subject.clone(), Self::headers(), payload.into())
            .await
            .map_err(|e| JournalError::Publish {
                subject,
                source: Box::new(e),
            })
    }

    /// Appends an event and waits until the stream stored it (state changes).
    pub async fn append_confirmed(
        &self,
        job_id: &str,
        event: v1::job_event::Event,
    ) -> Result<u64, JournalError> {
        let subject = job_events_subject(job_id)?;
        let payload = Self::message(job_id, event).encode_to_vec();
        let ack = self
            .bus
            .jetstream()
            .publish_with_headers(subject.clone(), Self::headers(), payload.into())
            .await
            .map_err(|e| JournalError::Publish {
                subject: subject.clone(),
                source: Box::new(e),
            })?
            .await
            .map_err(|e| JournalError::NotAcknowledged {
                subject: subject.clone(),
                source: Box::new(e),
            })?;
        Ok(ack.sequence)
    }

    /// The job's events from `from_sequence` (0 = oldest retained), then live.
    pub async fn watch(
        &self,
        job_id: &str,
        from_sequence: u64,
    ) -> Result<JobEventStream, JournalError> {
        let filter_subject = job_events_subject(job_id)?;
        let stream = self
            .bus
            .jetstream()
            .get_stream_no_info(JOB_EVENTS_STREAM)
            .await
            .map_err(|e| JournalError::OpenStream {
                stream: JOB_EVENTS_STREAM,
                source: Box::new(e),
            })?;
        let deliver_policy = if from_sequence == 0 {
            DeliverPolicy::All
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: from_sequence,
            }
        };
        let consumer = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject,
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| JournalError::Consumer {
                stream: JOB_EVENTS_STREAM,
                source: Box::new(e),
            })?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| JournalError::Consumer {
                stream: JOB_EVENTS_STREAM,
                source: Box::new(e),
            })?;
        Ok(Box::pin(messages.map(|item| {
            let message = item.map_err(|e| JournalError::Read {
                stream: JOB_EVENTS_STREAM,
                source: Box::new(e),
            })?;
            let sequence = message
                .info()
                .map(|info| info.stream_sequence)
                .map_err(JournalError::Metadata)?;
            let mut event = v1::JobEvent::decode(message.payload.as_ref())
                .map_err(|source| JournalError::Decode { sequence, source })?;
            event.sequence = sequence;
            Ok(event)
        })))
    }
}

/// Relays every worker agent event published on `mtswarm.event.>` into its
/// job's journal until `shutdown` fires (the leader's own events are
/// journaled by the job runner). One subscription for all jobs: the cost
/// per event does not depend on how many jobs exist. Only events of jobs
/// `owns` says this leader owns are relayed: with several leaders each
/// event is journaled once, by its job's owner.
pub(crate) async fn relay_agent_events(
    bus: Bus,
    journal: Journal,
    owns: impl Fn(&str) -> bool + Send + 'static,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let subscribe = || bus.client().subscribe(subjects::ALL_EVENTS.to_string());
    // The client re-subscribes by itself after a reconnect; the loop only
    // re-subscribes when the subscription could not be made or ended.
    let Some(mut subscriber) = reopen(
        "agent events subscription",
        &mut backoff,
        &mut shutdown,
        subscribe,
    )
    .await
    else {
        return;
    };
    loop {
        let message = tokio::select! {
            message = subscriber.next() => message,
            _ = shutdown.changed() => break,
        };
        let Some(message) = message else {
            if *shutdown.borrow() {
                break;
            }
            tracing::warn!("agent event subscription ended; subscribing again");
            match reopen(
                "agent events subscription",
                &mut backoff,
                &mut shutdown,
                subscribe,
            )
            .await
            {
                Some(again) => subscriber = again,
                None => return,
            }
            continue;
        };
        let subject = message.subject.to_string();
        // One message may carry a batch of one session's events: each is
        // journaled on its own, in the batch's order.
        let events = match mtswarm_bus::codec::decode_agent_events(
            &subject,
            message.headers.as_ref(),
            &message.payload,
        ) {
            Ok(events) => events,
            Err(error) => {
                tracing::warn!(%subject, %error, "undecodable agent event dropped");
                continue;
            }
        };
        for event in events {
            if event.agent_id == crate::ids::LEADER_AGENT_ID || !owns(&event.job_id) {
                // The job runner journals its own loop's events itself; another
                // leader's job is journaled by that leader.
                continue;
            }
            let job_id = event.job_id.clone();
            if let Err(error) = journal
                .append(&job_id, v1::job_event::Event::AgentEvent(event))
                .await
            {
                tracing::warn!(%subject, %error, "agent event not journaled");
            }
        }
    }
}

/// How long `WatchJob` waits in silence before re-checking whether the job
/// is final (its final state change normally ends the stream first).
pub(crate) const WATCH_IDLE_CHECK: Duration = Duration::from_secs(2);
