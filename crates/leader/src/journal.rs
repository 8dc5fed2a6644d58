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
//!
//! Every append waits for the stream's acknowledgement and sends again, under
//! the same `Nats-Msg-Id`, what was not acknowledged: a stream whose leader
//! died drops a publish until a new leader is elected (seconds on a
//! cluster), and an event lost there (an accepted result) would be missing
//! from `WatchJob` for good.

use std::pin::Pin;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::stream;
use futures::{Stream, StreamExt as _};
use mtswarm_bus::{Backoff, Bus, TopologyConfig, reopen, retry_within, subjects, v1};
use prost::Message as _;

use crate::error::JournalError;

/// Stream holding every job's events.
pub const JOB_EVENTS_STREAM: &str = "MTSWARM_JOB_EVENTS";
/// Wildcard of the journal subjects.
pub(crate) const ALL_JOB_EVENTS: &str = "mtswarm.jobevent.>";
/// Content type of journal messages.
const CONTENT_TYPE: &str = "application/x-protobuf; proto=mtswarm.v1.JobEvent";

/// `mtswarm.jobevent.<job_id>`.
pub fn job_events_subject(job_id: &str) -> Result<String, mtswarm_bus::BusError> {
    subjects::validate_id("job id", job_id)?;
    Ok(format!("mtswarm.jobevent.{job_id}"))
}

/// Boxed stream of journal entries (sequence filled in).
pub(crate) type JobEventStream =
    Pin<Box<dyn Stream<Item = Result<v1::JobEvent, JournalError>> + Send>>;

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

    fn headers() -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", CONTENT_TYPE);
        mtswarm_bus::trace::inject_current(&mut headers);
        headers
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
    /// stream sequence. A publish the stream did not acknowledge (its leader
    /// being elected again after a node died, the connection moving to
    /// another node) is sent again under the same `Nats-Msg-Id` until it is
    /// acknowledged or `APPEND_PATIENCE` ran out, so a retry of a publish
    /// that was stored after all is dropped by the stream, not stored twice.
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
        self.send(job_id, event, message_id).await?.confirm().await
    }

    /// Sends an event without waiting for the acknowledgement; the caller
    /// confirms it with [`PendingAppend::confirm`] (the relay keeps many in
    /// flight). The send itself is retried like an unacknowledged publish.
    pub(crate) async fn send(
        &self,
        job_id: &str,
        event: v1::job_event::Event,
        message_id: String,
    ) -> Result<PendingAppend, JournalError> {
        let subject = job_events_subject(job_id)?;
        let payload = bytes::Bytes::from(Self::message(job_id, event).encode_to_vec());
        let mut headers = Self::headers();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, message_id.as_str());
        let mut pending = PendingAppend {
            journal: self.clone(),
            subject,
            headers,
            payload,
            ack: None,
            give_up: tokio::time::Instant::now() + APPEND_PATIENCE,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(2)),
            attempts: 0,
        };
        pending.send().await?;
        Ok(pending)
    }
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
        let filter_subject = job_events_subject(job_id)?;
        retry_within(
            "job event watch",
            Backoff::new(Duration::from_millis(100), Duration::from_secs(2)),
            WATCH_OPEN_PATIENCE,
            || self.open_watch(filter_subject.clone(), from_sequence),
        )
        .await
    }

    /// One attempt at [`Journal::watch`].
    async fn open_watch(
        &self,
        filter_subject: String,
        from_sequence: u64,
    ) -> Result<JobEventStream, JournalError> {
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

/// An event sent to the journal whose acknowledgement is still due.
pub(crate) struct PendingAppend {
    journal: Journal,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: bytes::Bytes,
    /// The acknowledgement of the latest send, once it went out.
    ack: Option<async_nats::jetstream::context::PublishAckFuture>,
    give_up: tokio::time::Instant,
    backoff: Backoff,
    attempts: u32,
}

impl PendingAppend {
    /// Sends the event, retrying a send that fails (the client refuses while
    /// its outbound buffer is full or it is closed) until the patience ran out.
    async fn send(&mut self) -> Result<(), JournalError> {
        loop {
            self.attempts += 1;
            let sent = self
                .journal
                .bus
                .jetstream()
                .publish_with_headers(
                    self.subject.clone(),
                    self.headers.clone(),
                    self.payload.clone(),
                )
                .await;
            match sent {
                Ok(ack) => {
                    self.ack = Some(ack);
                    return Ok(());
                }
                Err(error) => {
                    let error = JournalError::Publish {
                        subject: self.subject.clone(),
                        source: Box::new(error),
                    };
                    self.wait_or_give_up(error).await?;
                }
            }
        }
    }

    /// Waits before the next send, or returns `error` when the patience ran out.
    async fn wait_or_give_up(&mut self, error: JournalError) -> Result<(), JournalError> {
        let delay = self.backoff.next_delay();
        if tokio::time::Instant::now() + delay >= self.give_up {
            return Err(error);
        }
        tracing::debug!(%error, attempt = self.attempts, "journal append not stored yet; sending it again");
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// Waits until the stream stored the event (sending it again, same
    /// message id, while it is not acknowledged); returns its sequence.
    pub(crate) async fn confirm(mut self) -> Result<u64, JournalError> {
        loop {
            let Some(ack) = self.ack.take() else {
                self.send().await?;
                continue;
            };
            match ack.await {
                Ok(ack) => {
                    if self.attempts > 1 {
                        tracing::info!(subject = %self.subject, attempts = self.attempts, duplicate = ack.duplicate, "journal append stored after a retry");
                    }
                    return Ok(ack.sequence);
                }
                Err(error) => {
                    let error = JournalError::NotAcknowledged {
                        subject: self.subject.clone(),
                        source: Box::new(error),
                    };
                    self.wait_or_give_up(error).await?;
                    self.send().await?;
                }
            }
        }
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
    // Appends are sent as events arrive and confirmed in order, up to
    // RELAY_WINDOW in flight: a confirmed append per event would cap the
    // relay at one round trip per event. An append retried after a failed
    // acknowledgement can land after events sent behind it.
    let mut in_flight = futures::stream::FuturesOrdered::new();
    loop {
        let message = tokio::select! {
            message = subscriber.next(), if in_flight.len() < RELAY_WINDOW => message,
            Some(confirmed) = in_flight.next(), if !in_flight.is_empty() => {
                log_unjournaled(confirmed);
                continue;
            }
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
                None => break,
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
            match journal
                .send(
                    &job_id,
                    v1::job_event::Event::AgentEvent(event),
                    new_message_id(),
                )
                .await
            {
                Ok(pending) => {
                    let subject = subject.clone();
                    in_flight.push_back(async move {
                        pending.confirm().await.map_err(|error| (subject, error))
                    });
                }
                Err(error) => tracing::warn!(%subject, %error, "agent event not journaled"),
            }
        }
    }
    // What was sent before shutdown is confirmed for a short while.
    let drained = tokio::time::timeout(RELAY_DRAIN, async {
        while let Some(confirmed) = in_flight.next().await {
            log_unjournaled(confirmed);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("agent events still unconfirmed at shutdown");
    }
}

/// Agent event appends the relay keeps unconfirmed before it reads the
/// next message (the events of one batch may go past it).
const RELAY_WINDOW: usize = 256;
/// How long the relay confirms its appends in flight at shutdown.
const RELAY_DRAIN: Duration = Duration::from_secs(5);

fn log_unjournaled(confirmed: Result<u64, (String, JournalError)>) {
    if let Err((subject, error)) = confirmed {
        tracing::warn!(%subject, %error, "agent event not journaled");
    }
}

/// How long `WatchJob` waits in silence before re-checking whether the job
/// is final (its final state change normally ends the stream first).
pub(crate) const WATCH_IDLE_CHECK: Duration = Duration::from_secs(2);
