//! Reading a job's journal for `WatchJob`: an ordered consumer over the
//! job's two subjects, each entry turned into the `JobEvent`s it holds and
//! numbered by its [`Position`].
//!
//! The subject says who wrote an entry. The leader's subject is read as a
//! `JobEvent`, or as a batch of the leader agent's events when its content
//! type says so (an undecodable one ends the watch with an error: the
//! leader wrote it, so something is broken). The sourced `.agents` subject holds
//! whatever a worker published, so it is read as agent events only; an
//! undecodable entry, an event that names another job or the leader agent
//! (whose events the leader journals itself), and events past
//! [`MAX_EVENTS_PER_MESSAGE`] in one entry are dropped and logged, and the
//! watch goes on: a hostile worker cannot end or rewrite another job's
//! watch.

use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::{Stream, StreamExt as _};
use mtswarm_bus::codec::{BusMessage as _, MAX_EVENTS_PER_MESSAGE, decode_agent_events};
use mtswarm_bus::{Backoff, retry_within, v1};
use prost::Message as _;

use super::{
    JOB_EVENTS_STREAM, Journal, WATCH_OPEN_PATIENCE, job_events_subject, read_entries,
    sourced_events_subject,
};
use crate::error::JournalError;
use crate::ids::LEADER_AGENT_ID;

/// Boxed stream of journal entries (sequence filled in).
pub(crate) type JobEventStream =
    Pin<Box<dyn Stream<Item = Result<v1::JobEvent, JournalError>> + Send>>;

/// Events one journal entry may number (a worker's batch at most).
const PER_ENTRY: u64 = MAX_EVENTS_PER_MESSAGE as u64;

/// An event's place in the journal: its entry's stream sequence and its
/// index within the entry (0 for an entry of one event). As a `sequence`
/// it is `stream_sequence * MAX_EVENTS_PER_MESSAGE + index`, so sequences
/// increase in journal order and `sequence + 1` is the place right after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    stream_sequence: u64,
    index: u64,
}

impl Position {
    /// The place of the first (or only) event of entry `stream_sequence`.
    pub(crate) fn first_of(stream_sequence: u64) -> Self {
        Self {
            stream_sequence,
            index: 0,
        }
    }

    /// The place a `from_sequence` names.
    fn of(sequence: u64) -> Self {
        Self {
            stream_sequence: sequence / PER_ENTRY,
            index: sequence % PER_ENTRY,
        }
    }

    /// The place as a `JobEvent` sequence.
    pub(crate) fn sequence(self) -> u64 {
        self.stream_sequence
            .saturating_mul(PER_ENTRY)
            .saturating_add(self.index)
    }
}

impl Journal {
    /// The job's events from `from_sequence` (0 = oldest retained), then live.
    ///
    /// Opening is retried for up to [`WATCH_OPEN_PATIENCE`]: while a NATS
    /// cluster elects a new leader for the journal stream, consumer creation
    /// times out for a few seconds, and a watcher should see that as a
    /// delay, not an `Unavailable`.
    pub async fn watch(
        &self,
        job_id: &str,
        from_sequence: u64,
    ) -> Result<JobEventStream, JournalError> {
        let subjects = [job_events_subject(job_id)?, sourced_events_subject(job_id)?];
        retry_within(
            "job event watch",
            Backoff::new(Duration::from_millis(100), Duration::from_secs(2)),
            WATCH_OPEN_PATIENCE,
            || self.open_watch(job_id, &subjects, Position::of(from_sequence)),
        )
        .await
    }

    /// One attempt at [`Journal::watch`].
    async fn open_watch(
        &self,
        job_id: &str,
        subjects: &[String; 2],
        from: Position,
    ) -> Result<JobEventStream, JournalError> {
        let deliver_policy = if from.stream_sequence == 0 {
            DeliverPolicy::All
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: from.stream_sequence,
            }
        };
        let messages = read_entries(&self.bus, subjects.to_vec(), deliver_policy).await?;
        let reader = EntryReader {
            job_id: job_id.to_string(),
            leader_subject: subjects[0].clone(),
            from,
        };
        Ok(Box::pin(messages.flat_map(move |item| {
            futures::stream::iter(reader.events(item))
        })))
    }
}

/// Turns the journal entries of one job into its `JobEvent`s.
struct EntryReader {
    job_id: String,
    /// The subject of the entries the leader wrote.
    leader_subject: String,
    /// Where the watch starts: events before it are skipped.
    from: Position,
}

type Entry = Result<async_nats::jetstream::Message, pull::OrderedError>;

impl EntryReader {
    /// The events of one entry at or after `from`, in order.
    fn events(&self, entry: Entry) -> Vec<Result<v1::JobEvent, JournalError>> {
        let message = match entry {
            Ok(message) => message,
            Err(e) => {
                return vec![Err(JournalError::Read {
                    stream: JOB_EVENTS_STREAM,
                    source: Box::new(e),
                })];
            }
        };
        let info = match message.info() {
            Ok(info) => info,
            Err(e) => return vec![Err(JournalError::Metadata(e))],
        };
        let stream_sequence = info.stream_sequence;
        let timestamp = prost_types::Timestamp {
            seconds: info.published.unix_timestamp(),
            nanos: i32::try_from(info.published.nanosecond()).unwrap_or(0),
        };
        if message.subject.as_str() == self.leader_subject {
            self.leader_entry(&message, stream_sequence, timestamp)
        } else {
            self.as_job_events(self.agent_events(&message, stream_sequence), timestamp)
        }
    }

    /// An entry the leader wrote: a batch of its loop's events, or one
    /// `JobEvent`. Undecodable, it is an error (see the module doc).
    fn leader_entry(
        &self,
        message: &async_nats::jetstream::Message,
        stream_sequence: u64,
        timestamp: prost_types::Timestamp,
    ) -> Vec<Result<v1::JobEvent, JournalError>> {
        let decode_error = |source| {
            vec![Err(JournalError::Decode {
                sequence: stream_sequence,
                source,
            })]
        };
        let batch = message
            .headers
            .as_ref()
            .and_then(|h| h.get(mtswarm_bus::codec::CONTENT_TYPE_HEADER))
            .is_some_and(|t| t.as_str() == v1::AgentEventBatch::CONTENT_TYPE);
        if batch {
            return match v1::AgentEventBatch::decode(message.payload.as_ref()) {
                Ok(batch) => {
                    self.as_job_events(self.placed(stream_sequence, batch.events), timestamp)
                }
                Err(source) => decode_error(source),
            };
        }
        let position = Position::first_of(stream_sequence);
        if position < self.from {
            return Vec::new();
        }
        match v1::JobEvent::decode(message.payload.as_ref()) {
            Ok(mut event) => {
                event.sequence = position.sequence();
                vec![Ok(event)]
            }
            Err(source) => decode_error(source),
        }
    }

    /// Agent events with their places, as the watch's `JobEvent`s.
    fn as_job_events(
        &self,
        events: Vec<(Position, v1::AgentEvent)>,
        timestamp: prost_types::Timestamp,
    ) -> Vec<Result<v1::JobEvent, JournalError>> {
        events
            .into_iter()
            .map(|(position, event)| {
                Ok(v1::JobEvent {
                    job_id: self.job_id.clone(),
                    sequence: position.sequence(),
                    timestamp: Some(timestamp),
                    event: Some(v1::job_event::Event::AgentEvent(event)),
                })
            })
            .collect()
    }

    /// The events of entry `stream_sequence` at or after `from`, each with
    /// its place; at most [`MAX_EVENTS_PER_MESSAGE`] of them.
    fn placed(
        &self,
        stream_sequence: u64,
        events: Vec<v1::AgentEvent>,
    ) -> Vec<(Position, v1::AgentEvent)> {
        (0..PER_ENTRY)
            .zip(events)
            .map(|(index, event)| {
                let position = Position {
                    stream_sequence,
                    index,
                };
                (position, event)
            })
            .filter(|(position, _)| *position >= self.from)
            .collect()
    }

    /// The worker events a sourced entry holds, at or after `from`, each
    /// with its place; what is not this job's worker events is dropped and
    /// logged (see the module doc).
    fn agent_events(
        &self,
        message: &async_nats::jetstream::Message,
        stream_sequence: u64,
    ) -> Vec<(Position, v1::AgentEvent)> {
        let subject = message.subject.as_str();
        let events = match decode_agent_events(subject, message.headers.as_ref(), &message.payload)
        {
            Ok(events) => events,
            Err(error) => {
                tracing::warn!(%subject, stream_sequence, %error, "undecodable agent event entry skipped");
                return Vec::new();
            }
        };
        if events.len() > MAX_EVENTS_PER_MESSAGE {
            tracing::warn!(%subject, stream_sequence, events = events.len(), kept = MAX_EVENTS_PER_MESSAGE, "agent event entry longer than a publisher writes; its tail skipped");
        }
        let mut placed = self.placed(stream_sequence, events);
        placed.retain(|(_, event)| {
            let foreign = event.job_id != self.job_id || event.agent_id == LEADER_AGENT_ID;
            if foreign {
                tracing::warn!(%subject, stream_sequence, job_id = %event.job_id, agent_id = %event.agent_id, "agent event of another job or of the leader agent skipped");
            }
            !foreign
        });
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_names_its_entry_and_index_and_the_next_one_follows_it() {
        let place = Position {
            stream_sequence: 42,
            index: 3,
        };
        assert_eq!(place.sequence(), 42 * PER_ENTRY + 3);
        assert_eq!(Position::of(place.sequence()), place);
        let next = Position::of(place.sequence() + 1);
        assert_eq!((next.stream_sequence, next.index), (42, 4));
        // After the last index an entry can hold comes the next entry.
        let last = Position {
            stream_sequence: 42,
            index: PER_ENTRY - 1,
        };
        assert_eq!(Position::of(last.sequence() + 1), Position::first_of(43));
        assert!(Position::first_of(43) > last);
        // 0 (and anything below the first entry) reads from the start.
        assert_eq!(Position::of(0).stream_sequence, 0);
        assert_eq!(Position::of(PER_ENTRY - 1).stream_sequence, 0);
    }
}
