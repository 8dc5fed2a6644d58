//! Events and approval notifications through core NATS: fire and forget,
//! with the events stream keeping a copy for replay.

use std::pin::Pin;

use async_nats::Subscriber;
use async_nats::jetstream::consumer::{self, DeliverPolicy, pull};
use futures::{Stream, StreamExt as _};
use mtswarm_proto::v1;

use super::delivery::{
    Received, ReceivedStream, ReplayedEvent, consumer_error, outgoing_headers, received_stream,
};
use crate::codec::{self, BusMessage};
use crate::connection::Bus;
use crate::error::BusError;
use crate::subjects;

impl Bus {
    async fn publish_core<T: BusMessage>(
        &self,
        subject: String,
        message: &T,
    ) -> Result<(), BusError> {
        self.client()
            .publish_with_headers(
                subject.clone(),
                outgoing_headers::<T>(),
                codec::encode(message),
            )
            .await
            .map_err(|source| BusError::Publish {
                subject,
                source: source.into(),
            })
    }

    /// A core NATS subscription to `subject`.
    async fn core_subscriber(&self, subject: String) -> Result<Subscriber, BusError> {
        self.client()
            .subscribe(subject.clone())
            .await
            .map_err(|source| BusError::Subscribe {
                subject,
                source: source.into(),
            })
    }

    async fn subscribe_core<T: BusMessage>(
        &self,
        subject: String,
    ) -> Result<ReceivedStream<T>, BusError> {
        Ok(received_stream(self.core_subscriber(subject).await?))
    }

    /// Publishes a progress event to `mtswarm.event.<job_id>.<agent_id>` (core
    /// NATS: fire and forget; the events stream keeps a copy for replay).
    pub async fn publish_event(&self, event: &v1::AgentEvent) -> Result<(), BusError> {
        let subject = subjects::event(&event.job_id, &event.agent_id)?;
        self.publish_core(subject, event).await
    }

    /// Publishes consecutive events of one session as one message on the
    /// first event's subject: an `AgentEventBatch` when there are several
    /// (one stored message in the events stream for all of them), a plain
    /// `AgentEvent` when there is one, nothing when there are none. Events
    /// that would not fit one message under [`Bus::max_record_bytes`] (full
    /// tool results ride in events) go in as many consecutive messages as
    /// they need. The events must share job and agent: a batch that mixes
    /// them is refused (`BusError::MixedEventBatch`), since its subject
    /// could name only one.
    pub async fn publish_events(&self, events: &[v1::AgentEvent]) -> Result<(), BusError> {
        let Some(first) = events.first() else {
            return Ok(());
        };
        if let Some(other) = events
            .iter()
            .find(|e| e.job_id != first.job_id || e.agent_id != first.agent_id)
        {
            return Err(BusError::MixedEventBatch {
                expected: format!("{}/{}", first.job_id, first.agent_id),
                found: format!("{}/{}", other.job_id, other.agent_id),
            });
        }
        let subject = subjects::event(&first.job_id, &first.agent_id)?;
        for chunk in self.event_messages(events) {
            match chunk {
                [only] => self.publish_core(subject.clone(), only).await?,
                several => {
                    let batch = v1::AgentEventBatch {
                        events: several.to_vec(),
                    };
                    self.publish_core(subject.clone(), &batch).await?;
                }
            }
        }
        Ok(())
    }

    /// `events` cut into the runs one message may carry on this connection
    /// (within [`Bus::max_record_bytes`] and
    /// [`codec::MAX_EVENTS_PER_MESSAGE`]), in order: what
    /// [`Bus::publish_events`] sends, and what a writer of its own batches
    /// (the job journal) stores as one message each.
    pub fn event_messages<'a>(&self, events: &'a [v1::AgentEvent]) -> Vec<&'a [v1::AgentEvent]> {
        let budget = self
            .max_record_bytes()
            .saturating_sub(EVENT_BATCH_HEADROOM)
            .max(1);
        event_chunks(events, budget)
    }

    /// Live events of one job (from now on), batches unpacked: one item
    /// per event, in publication order.
    pub async fn subscribe_events(
        &self,
        job_id: &str,
    ) -> Result<ReceivedStream<v1::AgentEvent>, BusError> {
        let subscriber = self
            .core_subscriber(subjects::events_for_job(job_id)?)
            .await?;
        Ok(Box::pin(subscriber.flat_map(|message| {
            let subject = message.subject.to_string();
            let headers = message.headers.unwrap_or_default();
            let items: Vec<Result<Received<v1::AgentEvent>, BusError>> =
                match codec::decode_agent_events(&subject, Some(&headers), &message.payload) {
                    Ok(events) => events
                        .into_iter()
                        .map(|event| {
                            Ok(Received {
                                message: event,
                                subject: subject.clone(),
                                headers: headers.clone(),
                            })
                        })
                        .collect(),
                    Err(error) => vec![Err(error)],
                };
            futures::stream::iter(items)
        })))
    }

    /// Events of one job from the events stream, starting at stream sequence
    /// `from_stream_sequence` (0 = oldest retained), then live. Ordered and
    /// gap-free within what the stream retained.
    pub async fn replay_events(
        &self,
        job_id: &str,
        from_stream_sequence: u64,
    ) -> Result<Pin<Box<dyn Stream<Item = Result<ReplayedEvent, BusError>> + Send>>, BusError> {
        let filter_subject = subjects::events_for_job(job_id)?;
        let stream_name = subjects::EVENTS_STREAM;
        let stream = self
            .jetstream()
            .get_stream_no_info(stream_name)
            .await
            .map_err(|e| consumer_error(stream_name, "ordered", e))?;
        let deliver_policy = if from_stream_sequence == 0 {
            DeliverPolicy::All
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: from_stream_sequence,
            }
        };
        let consumer: consumer::Consumer<pull::OrderedConfig> = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject,
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| consumer_error(stream_name, "ordered", e))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| consumer_error(stream_name, "ordered", e))?;
        Ok(Box::pin(messages.flat_map(move |item| {
            futures::stream::iter(match replayed(stream_name, item) {
                Ok(events) => events.into_iter().map(Ok).collect(),
                Err(error) => vec![Err(error)],
            })
        })))
    }

    /// Announces a pending approval on `mtswarm.approval.request.<job_id>`.
    /// The durable record is [`crate::Approvals::create`]'s job.
    pub async fn publish_approval_request(
        &self,
        request: &v1::ApprovalRequest,
    ) -> Result<(), BusError> {
        subjects::validate_id("approval id", &request.approval_id)?;
        self.publish_core(subjects::approval_request(&request.job_id)?, request)
            .await
    }

    /// Approval requests of one job, or of all jobs when `job_id` is `None`.
    pub async fn subscribe_approval_requests(
        &self,
        job_id: Option<&str>,
    ) -> Result<ReceivedStream<v1::ApprovalRequest>, BusError> {
        let subject = match job_id {
            Some(job_id) => subjects::approval_request(job_id)?,
            None => subjects::ALL_APPROVAL_REQUESTS.to_string(),
        };
        self.subscribe_core(subject).await
    }

    /// Sends a decision to the session on `mtswarm.approval.decision.<session_id>`.
    pub async fn publish_approval_decision(
        &self,
        decision: &v1::ApprovalDecision,
    ) -> Result<(), BusError> {
        self.publish_core(subjects::approval_decision(&decision.session_id)?, decision)
            .await
    }

    /// Decisions addressed to one session.
    pub async fn subscribe_approval_decisions(
        &self,
        session_id: &str,
    ) -> Result<ReceivedStream<v1::ApprovalDecision>, BusError> {
        self.subscribe_core(subjects::approval_decision(session_id)?)
            .await
    }
}

/// Room a batch leaves under the record limit for its headers (content
/// type, trace context) and the batch's own framing.
const EVENT_BATCH_HEADROOM: usize = 4 * 1024;

/// `events` cut into runs whose encoded size stays within `budget` bytes
/// (an event larger than that on its own is a run of one) and whose length
/// stays within [`codec::MAX_EVENTS_PER_MESSAGE`], in order.
fn event_chunks(events: &[v1::AgentEvent], budget: usize) -> Vec<&[v1::AgentEvent]> {
    use prost::Message as _;
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (index, event) in events.iter().enumerate() {
        // Each repeated field entry costs its length plus tag and length prefix.
        let size = event.encoded_len() + 1 + prost::length_delimiter_len(event.encoded_len());
        let full = index - start == codec::MAX_EVENTS_PER_MESSAGE;
        if index > start && (full || bytes + size > budget) {
            chunks.push(&events[start..index]);
            (start, bytes) = (index, 0);
        }
        bytes += size;
    }
    if start < events.len() {
        chunks.push(&events[start..]);
    }
    chunks
}

/// The events of one message of the events stream (a batch unpacked), each
/// with the message's stream sequence.
fn replayed(
    stream_name: &'static str,
    item: Result<async_nats::jetstream::Message, pull::OrderedError>,
) -> Result<Vec<ReplayedEvent>, BusError> {
    let message = item.map_err(|e| consumer_error(stream_name, "ordered", e))?;
    let stream_sequence = message
        .info()
        .map(|info| info.stream_sequence)
        .map_err(|source| BusError::Ack {
            subject: message.subject.to_string(),
            source,
        })?;
    let subject = message.subject.to_string();
    let headers = message.headers.clone().unwrap_or_default();
    let events = codec::decode_agent_events(&subject, Some(&headers), &message.payload)?;
    let last = events.len().saturating_sub(1);
    Ok(events
        .into_iter()
        .enumerate()
        .map(|(index, event)| ReplayedEvent {
            stream_sequence,
            last_of_message: index == last,
            event,
            headers: headers.clone(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_cut_into_runs_that_fit_the_budget_in_order() {
        let event = |sequence: u64, bytes: usize| v1::AgentEvent {
            sequence,
            payload_json: "x".repeat(bytes),
            ..Default::default()
        };
        let events = vec![event(1, 100), event(2, 100), event(3, 5_000), event(4, 100)];
        let runs: Vec<Vec<u64>> = event_chunks(&events, 1_000)
            .into_iter()
            .map(|run| run.iter().map(|e| e.sequence).collect())
            .collect();
        assert_eq!(runs, vec![vec![1, 2], vec![3], vec![4]]);
        let all: Vec<usize> = event_chunks(&events, 1 << 20)
            .into_iter()
            .map(<[v1::AgentEvent]>::len)
            .collect();
        assert_eq!(all, vec![4]);
        assert!(event_chunks(&[], 10).is_empty());
    }

    #[test]
    fn a_long_run_of_small_events_is_cut_at_the_most_one_message_carries() {
        let events = vec![v1::AgentEvent::default(); 2 * codec::MAX_EVENTS_PER_MESSAGE + 1];
        let lengths: Vec<usize> = event_chunks(&events, 1 << 30)
            .into_iter()
            .map(<[v1::AgentEvent]>::len)
            .collect();
        assert_eq!(
            lengths,
            vec![
                codec::MAX_EVENTS_PER_MESSAGE,
                codec::MAX_EVENTS_PER_MESSAGE,
                1
            ]
        );
    }
}
