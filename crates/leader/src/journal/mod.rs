//! A job's event stream, as `WatchJob` serves it: every agent event of the
//! job's agents (the leader's own loop included), state changes, approval
//! requests and decisions, and accepted task results, in one order.
//!
//! The journal is a JetStream stream of its own (`MTSWARM_JOB_EVENTS`) with
//! two kinds of entries, told apart by their subject:
//! - `mtswarm.jobevent.<job_id>`: what the leader wrote, a protobuf
//!   `JobEvent` (state changes, results, approvals) or an
//!   `AgentEventBatch` of its own loop's events (`append_leader_events`).
//!   Only the leader may publish there.
//! - `mtswarm.jobevent.<job_id>.agents`: what a worker published on
//!   `mtswarm.event.<job_id>.<agent_id>` (one `AgentEvent` or a batch),
//!   copied by the NATS server itself: the journal *sources* the events
//!   stream with a subject transform. No leader process relays an event,
//!   so a thousand agents' events cost the leader nothing, and every event
//!   is journaled once whichever leader owns the job. Such an entry is
//!   read as agent events only, never as a `JobEvent`, so a worker cannot
//!   forge a state change or a result in a job's watch.
//!
//! A `JobEvent`'s `sequence` is its place in the journal (`watch::Position`):
//! the entry's stream sequence times
//! [`MAX_EVENTS_PER_MESSAGE`](mtswarm_bus::codec::MAX_EVENTS_PER_MESSAGE) plus the
//! event's index in a worker's batch. It increases within a job and is not
//! dense; `from_sequence = sequence + 1` resumes right after an event, even
//! inside a batch.
//!
//! The final state change ends a watch, so it is appended only once the
//! server has sourced the job's events published before it (`settle`).
//!
//! Every append waits for the stream's acknowledgement and sends again, under
//! the same `Nats-Msg-Id`, what was not acknowledged (`append`): a stream
//! whose leader died drops a publish until a new leader is elected (seconds
//! on a cluster), and an event lost there (an accepted result) would be
//! missing from `WatchJob` for good.

mod append;
mod settle;
mod watch;

use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::stream;
use mtswarm_bus::codec::BusMessage as _;
use mtswarm_bus::{Bus, TopologyConfig, subjects, v1};
use prost::Message as _;

use self::append::PendingAppend;
use crate::error::JournalError;

/// Stream holding every job's events.
pub const JOB_EVENTS_STREAM: &str = "MTSWARM_JOB_EVENTS";
/// Wildcard of the subjects the leader writes (one token after the prefix:
/// the sourced agent events' subjects have two and do not match it).
const LEADER_JOB_EVENTS: &str = "mtswarm.jobevent.*";
/// Which worker event subjects the journal sources, and where it puts them:
/// `mtswarm.event.<job_id>.<agent_id>` becomes `mtswarm.jobevent.<job_id>.agents`.
const SOURCED_EVENTS: &str = "mtswarm.event.*.*";
const SOURCED_EVENTS_INTO: &str = "mtswarm.jobevent.{{wildcard(1)}}.agents";
/// Content type of journal messages.
const CONTENT_TYPE: &str = "application/x-protobuf; proto=mtswarm.v1.JobEvent";

/// `mtswarm.jobevent.<job_id>`: the entries the leader writes.
pub fn job_events_subject(job_id: &str) -> Result<String, mtswarm_bus::BusError> {
    subjects::validate_id("job id", job_id)?;
    Ok(format!("mtswarm.jobevent.{job_id}"))
}

/// `mtswarm.jobevent.<job_id>.agents`: the job's worker events, sourced.
fn sourced_events_subject(job_id: &str) -> Result<String, mtswarm_bus::BusError> {
    Ok(format!("{}.agents", job_events_subject(job_id)?))
}

/// Writer and reader of the job event journal.
#[derive(Clone, Debug)]
pub struct Journal {
    bus: Bus,
}

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

impl Journal {
    /// Creates or updates the journal stream (same limits as the events
    /// stream), sourcing the workers' events (see the module doc). The
    /// events stream must exist ([`Bus::ensure_topology`]).
    pub async fn ensure(bus: &Bus, topology: &TopologyConfig) -> Result<Self, JournalError> {
        let source = events_source(bus).await?;
        bus.jetstream()
            .create_or_update_stream(stream::Config {
                name: JOB_EVENTS_STREAM.to_string(),
                description: Some("mtswarm job event journal (WatchJob)".to_string()),
                subjects: vec![LEADER_JOB_EVENTS.to_string()],
                sources: Some(vec![source]),
                // A sourcing stream gets no duplicate window by default, and
                // an append retried under its message id relies on one.
                duplicate_window: DUPLICATE_WINDOW,
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
                source: Box::new(bus.creation_error(
                    format!("stream {JOB_EVENTS_STREAM}"),
                    topology,
                    e,
                )),
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

    fn headers(content_type: &str) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(mtswarm_bus::codec::CONTENT_TYPE_HEADER, content_type);
        mtswarm_bus::trace::inject_current(&mut headers);
        headers
    }

    /// Appends the leader agent's `events` (consecutive events of its loop,
    /// in order) as few entries as they fit in: each an `AgentEventBatch`
    /// on the leader's subject, numbered event by event like a worker's
    /// batch. One stored (and synced) entry for what a loop emitted while
    /// the previous entry was being stored: the loop's events cost the
    /// journal one write per round trip, not one per event.
    pub async fn append_leader_events(
        &self,
        job_id: &str,
        events: &[v1::AgentEvent],
    ) -> Result<(), JournalError> {
        let subject = job_events_subject(job_id)?;
        for run in self.bus.event_messages(events) {
            let batch = v1::AgentEventBatch {
                events: run.to_vec(),
            };
            let mut headers = Self::headers(v1::AgentEventBatch::CONTENT_TYPE);
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                new_message_id().as_str(),
            );
            let payload = bytes::Bytes::from(batch.encode_to_vec());
            PendingAppend::new(self.bus.clone(), subject.clone(), headers, payload)
                .confirm()
                .await?;
        }
        Ok(())
    }

    /// Appends an event and waits until the stream stored it (see
    /// [`Journal::append_confirmed`]); the error is logged by the caller.
    pub async fn append(
        &self,
        job_id: &str,
        event: v1::job_event::Event,
    ) -> Result<(), JournalError> {
        self.append_confirmed(job_id, event).await.map(|_| ())
    }

    /// Appends an event and waits until the stream stored it; returns its
    /// sequence as `WatchJob` numbers it. A publish the stream did not
    /// acknowledge (its leader being elected again after a node died, the
    /// connection moving to another node) is sent again under the same
    /// `Nats-Msg-Id` until it is acknowledged or `APPEND_PATIENCE` ran out,
    /// so a retry of a publish that was stored after all is dropped by the
    /// stream, not stored twice.
    pub async fn append_confirmed(
        &self,
        job_id: &str,
        event: v1::job_event::Event,
    ) -> Result<u64, JournalError> {
        self.append_with_id(job_id, event, new_message_id()).await
    }

    /// [`Journal::append_confirmed`] under a message id of the caller's: an
    /// event that may be appended twice (an accepted result replayed after a
    /// leader restart) is stored once within the stream's duplicate window.
    pub async fn append_with_id(
        &self,
        job_id: &str,
        event: v1::job_event::Event,
        message_id: String,
    ) -> Result<u64, JournalError> {
        let subject = job_events_subject(job_id)?;
        let payload = bytes::Bytes::from(Self::message(job_id, event).encode_to_vec());
        let mut headers = Self::headers(CONTENT_TYPE);
        headers.insert(async_nats::header::NATS_MESSAGE_ID, message_id.as_str());
        let stream_sequence = PendingAppend::new(self.bus.clone(), subject, headers, payload)
            .confirm()
            .await?;
        Ok(watch::Position::first_of(stream_sequence).sequence())
    }
}

/// The entries of the journal on `filter_subjects` from `start`, then live
/// (an ordered consumer: in stream order, without gaps).
async fn read_entries(
    bus: &Bus,
    filter_subjects: Vec<String>,
    deliver_policy: DeliverPolicy,
) -> Result<pull::Ordered, JournalError> {
    let consumer_error = |e: Box<dyn std::error::Error + Send + Sync>| JournalError::Consumer {
        stream: JOB_EVENTS_STREAM,
        source: e,
    };
    let stream = bus
        .jetstream()
        .get_stream_no_info(JOB_EVENTS_STREAM)
        .await
        .map_err(|e| JournalError::OpenStream {
            stream: JOB_EVENTS_STREAM,
            source: Box::new(e),
        })?;
    stream
        .create_consumer(pull::OrderedConfig {
            filter_subjects,
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| consumer_error(Box::new(e)))?
        .messages()
        .await
        .map_err(|e| consumer_error(Box::new(e)))
}

/// The journal's source: the events stream, transformed into the job's
/// `.agents` subject. A journal that already sources it keeps its source
/// as it is (changing it would make the server source again); a new one
/// starts after the events already stored, which an earlier leader relayed
/// into the journal itself.
async fn events_source(bus: &Bus) -> Result<stream::Source, JournalError> {
    let open_error = |stream: &'static str| {
        move |e: async_nats::jetstream::context::GetStreamError| JournalError::OpenStream {
            stream,
            source: Box::new(e),
        }
    };
    match bus.jetstream().get_stream(JOB_EVENTS_STREAM).await {
        Ok(journal) => {
            let kept = journal
                .cached_info()
                .config
                .sources
                .iter()
                .flatten()
                .find(|source| source.name == subjects::EVENTS_STREAM)
                .cloned();
            if let Some(kept) = kept {
                return Ok(kept);
            }
        }
        Err(error) if !not_found(&error) => return Err(open_error(JOB_EVENTS_STREAM)(error)),
        Err(_) => {}
    }
    let stored = match bus.jetstream().get_stream(subjects::EVENTS_STREAM).await {
        Ok(events) => events.cached_info().state.last_sequence,
        // No events stream yet: the server sources it once it exists.
        Err(error) if not_found(&error) => 0,
        Err(error) => return Err(open_error(subjects::EVENTS_STREAM)(error)),
    };
    Ok(stream::Source {
        name: subjects::EVENTS_STREAM.to_string(),
        start_sequence: (stored > 0).then_some(stored + 1),
        subject_transforms: vec![stream::SubjectTransform {
            source: SOURCED_EVENTS.to_string(),
            destination: SOURCED_EVENTS_INTO.to_string(),
        }],
        ..Default::default()
    })
}

/// How long the journal remembers an append's message id: a retry within
/// it is dropped (JetStream's usual default, set outright since a stream
/// that sources another has none).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The stream asked for does not exist.
fn not_found(error: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::context::GetStreamErrorKind;
    matches!(error.kind(), GetStreamErrorKind::JetStream(e)
        if e.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// How long an append keeps sending an event the stream did not
/// acknowledge. An election of the journal stream's leader after a node of
/// a cluster died takes seconds (up to about ten on a loaded machine); a
/// leader cut off from every node longer than this logs the event as lost.
pub(crate) const APPEND_PATIENCE: Duration = Duration::from_secs(60);

/// How long opening a watch is retried before `WatchJob` answers
/// `Unavailable`: several stream leader elections, well under a client's
/// patience.
pub(crate) const WATCH_OPEN_PATIENCE: Duration = Duration::from_secs(30);

/// A fresh message id for an event appended once.
fn new_message_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// How long `WatchJob` waits in silence before re-checking whether the job
/// is final (its final state change normally ends the stream first).
pub(crate) const WATCH_IDLE_CHECK: Duration = Duration::from_secs(2);
