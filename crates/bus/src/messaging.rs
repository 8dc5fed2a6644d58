//! Typed publish and consume over NATS: tasks and results through JetStream
//! (durable, acked, deduplicated by `<task_id>.<attempt>`), events and
//! approval notifications through core NATS. Every outgoing message carries a
//! content-type header and the current span's trace context; every incoming
//! one is decoded into its protobuf type, and a payload that does not decode
//! is reported as an error item (and, for JetStream, terminated so it is not
//! redelivered forever) instead of stopping the stream.

use std::pin::Pin;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::{AckKind, Acker, PublishMessage};
use futures::{Stream, StreamExt as _};
use mtswarm_proto::v1;
use mtswarm_telemetry::TelemetryError;

use crate::codec::{self, BusMessage};
use crate::subjects;
use crate::trace;
use crate::{Bus, BusError};

/// Boxed stream of typed JetStream deliveries.
pub type DeliveryStream<T> = Pin<Box<dyn Stream<Item = Result<Delivery<T>, BusError>> + Send>>;
/// Boxed stream of typed core-NATS messages.
pub type ReceivedStream<T> = Pin<Box<dyn Stream<Item = Result<Received<T>, BusError>> + Send>>;

/// The stream's acknowledgement of a JetStream publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReceipt {
    pub stream: String,
    /// Stream sequence of the stored message (of the original, for a duplicate).
    pub sequence: u64,
    /// True when the stream dropped this publish as a duplicate of an
    /// earlier one with the same message id.
    pub duplicate: bool,
}

/// A JetStream publish that was sent but whose acknowledgement has not been
/// awaited yet. Pipelining (send many, then wait for all) is what makes
/// JetStream publishing fast; every pending publish must still be waited on
/// to know it was stored.
#[must_use = "the publish is only known to be stored once `wait` succeeds"]
pub struct PendingPublish {
    subject: String,
    ack: PublishAckFuture,
    bus: Bus,
}

impl PendingPublish {
    /// Waits for the stream's acknowledgement. When no stream stores the
    /// subject (it was deleted), the topology is re-created in the
    /// background so that the caller's retry finds it again.
    pub async fn wait(self) -> Result<PublishReceipt, BusError> {
        let subject = self.subject;
        let ack = match self.ack.await {
            Ok(ack) => ack,
            Err(source) => {
                if source.kind() == async_nats::jetstream::context::PublishErrorKind::StreamNotFound
                {
                    let bus = self.bus;
                    let what = format!("publish to {subject}");
                    tokio::spawn(async move {
                        if let Err(error) = bus.recover_topology(&what).await {
                            tracing::warn!(%error, "re-creating the topology failed");
                        }
                    });
                }
                return Err(BusError::Publish {
                    subject,
                    source: source.into(),
                });
            }
        };
        Ok(PublishReceipt {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}

/// Delivery metadata of a JetStream message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryInfo {
    pub stream: String,
    pub consumer: String,
    pub stream_sequence: u64,
    pub consumer_sequence: u64,
    /// 1 on first delivery, 2 on the first redelivery, ...
    pub delivered: u64,
    /// Messages still pending for the consumer after this one.
    pub pending: u64,
}

/// A typed message from a durable JetStream consumer, to be acknowledged
/// with [`Delivery::ack`] (done), [`Delivery::nak`] (redeliver),
/// [`Delivery::in_progress`] (extend the ack deadline) or [`Delivery::term`]
/// (never redeliver).
pub struct Delivery<T> {
    message: T,
    subject: String,
    headers: HeaderMap,
    info: DeliveryInfo,
    acker: Acker,
    /// The ack subject, for [`Delivery::ack_confirmed`].
    reply: Option<async_nats::Subject>,
    client: async_nats::Client,
}

impl<T> std::fmt::Debug for Delivery<T>
where
    T: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("subject", &self.subject)
            .field("info", &self.info)
            .field("message", &self.message)
            .finish()
    }
}

impl<T> Delivery<T> {
    pub fn message(&self) -> &T {
        &self.message
    }
    pub fn subject(&self) -> &str {
        &self.subject
    }
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    pub fn info(&self) -> &DeliveryInfo {
        &self.info
    }

    /// The publisher's trace context (no valid span when it sent none).
    pub fn trace_context(&self) -> opentelemetry::Context {
        trace::context_from_headers(&self.headers)
    }

    /// Makes the publisher's span the parent of `span` (call before entering it).
    pub fn set_span_parent(&self, span: &tracing::Span) -> Result<bool, TelemetryError> {
        trace::set_parent_from_headers(span, &self.headers)
    }

    async fn ack_kind(&self, kind: AckKind) -> Result<(), BusError> {
        self.acker
            .ack_with(kind)
            .await
            .map_err(|source| BusError::Ack {
                subject: self.subject.clone(),
                source,
            })
    }

    /// Marks the message processed; it will not be delivered again.
    pub async fn ack(&self) -> Result<(), BusError> {
        self.ack_kind(AckKind::Ack).await
    }

    /// Acknowledges and waits until the server confirms it, so the message is
    /// known not to come back (e.g. before publishing the task's result).
    ///
    /// The confirmation comes back on the connection's shared reply inbox
    /// (one request), not on an inbox subscribed for this one ack.
    pub async fn ack_confirmed(&self) -> Result<(), BusError> {
        let Some(reply) = &self.reply else {
            return self
                .acker
                .double_ack()
                .await
                .map_err(|source| BusError::Ack {
                    subject: self.subject.clone(),
                    source,
                });
        };
        self.client
            .request(reply.clone(), bytes::Bytes::from_static(b"+ACK"))
            .await
            .map(|_| ())
            .map_err(|source| BusError::Ack {
                subject: self.subject.clone(),
                source: source.into(),
            })
    }

    /// Asks for redelivery, after `delay` when given.
    pub async fn nak(&self, delay: Option<Duration>) -> Result<(), BusError> {
        self.ack_kind(AckKind::Nak(delay)).await
    }

    /// Resets the ack-wait timer: the message is still being worked on.
    pub async fn in_progress(&self) -> Result<(), BusError> {
        self.ack_kind(AckKind::Progress).await
    }

    /// Stops redelivery without processing (poison message).
    pub async fn term(&self) -> Result<(), BusError> {
        self.ack_kind(AckKind::Term).await
    }
}

/// A typed message from a core NATS subscription.
#[derive(Debug, Clone)]
pub struct Received<T> {
    pub message: T,
    pub subject: String,
    pub headers: HeaderMap,
}

impl<T> Received<T> {
    /// The publisher's trace context (no valid span when it sent none).
    pub fn trace_context(&self) -> opentelemetry::Context {
        trace::context_from_headers(&self.headers)
    }

    /// Makes the publisher's span the parent of `span` (call before entering it).
    pub fn set_span_parent(&self, span: &tracing::Span) -> Result<bool, TelemetryError> {
        trace::set_parent_from_headers(span, &self.headers)
    }
}

/// An agent event read back from the events stream.
#[derive(Debug, Clone)]
pub struct ReplayedEvent {
    /// Position in the events stream; resume with `stream_sequence + 1`.
    pub stream_sequence: u64,
    pub event: v1::AgentEvent,
    pub headers: HeaderMap,
}

/// Settings of a worker's durable task consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskConsumerConfig {
    /// Only this slice's tasks; `None` = every task of the worker. On the work
    /// queue a worker uses either one worker-wide consumer or one per slice,
    /// not both (their filters would overlap).
    pub slice_id: Option<String>,
    /// Time a delivery may stay unacknowledged before it is redelivered
    /// (extend it with [`Delivery::in_progress`]).
    pub ack_wait: Duration,
    /// Deliveries before the server gives up on a task (`-1` = unlimited).
    pub max_deliver: i64,
    /// Unacknowledged deliveries allowed at once.
    pub max_ack_pending: i64,
    /// Messages requested per pull.
    pub batch: usize,
    /// Keep the consumer's delivery state (pending acks, delivery counts)
    /// in the server's memory instead of its file store. The tasks stay in
    /// the file-backed stream and an ack still removes its task for good;
    /// what a server restart loses is the consumer itself, which
    /// [`TaskConsumer::messages`] creates again, and with it the delivery
    /// counts: unacknowledged tasks come back as first deliveries. It saves
    /// the server an atomic state-file rewrite per consumer on every
    /// change (up to ten a second per consumer), the largest per-task cost
    /// of many lightly loaded per-slice consumers.
    pub memory_state: bool,
}

impl Default for TaskConsumerConfig {
    fn default() -> Self {
        Self {
            slice_id: None,
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            max_ack_pending: 1_000,
            batch: 100,
            memory_state: false,
        }
    }
}

/// Settings of a durable result consumer (the leader's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultConsumerConfig {
    /// Durable name suffix (`results-<name>`), e.g. "leader".
    pub name: String,
    /// Only this job's results; `None` = all jobs.
    pub job_id: Option<String>,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    pub max_ack_pending: i64,
    pub batch: usize,
}

impl ResultConsumerConfig {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            job_id: None,
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            max_ack_pending: 10_000,
            batch: 100,
        }
    }
}

/// A worker's durable pull consumer of task assignments.
#[derive(Debug, Clone)]
pub struct TaskConsumer {
    consumer: PullConsumer,
    name: String,
    batch: usize,
    /// To create the consumer again when its state lives in memory.
    bus: Bus,
    config: pull::Config,
}

impl TaskConsumer {
    /// Durable consumer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tasks as they arrive (and redeliveries of unacknowledged ones).
    /// A consumer whose state lives in memory
    /// ([`TaskConsumerConfig::memory_state`]) is created again first, since
    /// a server restart removes it (for an existing one this changes
    /// nothing).
    pub async fn messages(&self) -> Result<DeliveryStream<v1::TaskAssignment>, BusError> {
        let consumer = if self.config.memory_storage {
            self.bus
                .durable_consumer(subjects::TASKS_STREAM, &self.name, self.config.clone())
                .await?
        } else {
            self.consumer.clone()
        };
        deliveries(&consumer, subjects::TASKS_STREAM, &self.name, self.batch).await
    }
}

/// A durable pull consumer of task results.
#[derive(Debug, Clone)]
pub struct ResultConsumer {
    consumer: PullConsumer,
    name: String,
    batch: usize,
}

impl ResultConsumer {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Results as they arrive (and redeliveries of unacknowledged ones).
    pub async fn messages(&self) -> Result<DeliveryStream<v1::TaskResult>, BusError> {
        deliveries(
            &self.consumer,
            subjects::RESULTS_STREAM,
            &self.name,
            self.batch,
        )
        .await
    }
}

fn consumer_error(
    stream: &str,
    consumer: &str,
    source: impl Into<crate::error::NatsSource>,
) -> BusError {
    BusError::Consumer {
        stream: stream.to_string(),
        consumer: consumer.to_string(),
        source: source.into(),
    }
}

async fn deliveries<T: BusMessage>(
    consumer: &PullConsumer,
    stream: &'static str,
    name: &str,
    batch: usize,
) -> Result<DeliveryStream<T>, BusError> {
    let messages = consumer
        .stream()
        .max_messages_per_batch(batch.max(1))
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| consumer_error(stream, name, e))?;
    let name: std::sync::Arc<str> = std::sync::Arc::from(name);
    let typed = messages.then(move |item| {
        let name = name.clone();
        async move {
            let message = item.map_err(|e| consumer_error(stream, &name, e))?;
            into_delivery::<T>(message).await
        }
    });
    Ok(Box::pin(typed))
}

async fn into_delivery<T: BusMessage>(
    message: async_nats::jetstream::Message,
) -> Result<Delivery<T>, BusError> {
    let info = message.info().map(|info| DeliveryInfo {
        stream: info.stream.to_string(),
        consumer: info.consumer.to_string(),
        stream_sequence: info.stream_sequence,
        consumer_sequence: info.consumer_sequence,
        delivered: u64::try_from(info.delivered).unwrap_or(0),
        pending: info.pending,
    });
    let client = message.context.client();
    let reply = message.reply.clone();
    let (message, acker) = message.split();
    let subject = message.subject.to_string();
    let info = match info {
        Ok(info) => info,
        Err(source) => {
            return Err(BusError::Ack { subject, source });
        }
    };
    let headers = message.headers.unwrap_or_default();
    match codec::decode::<T>(&subject, Some(&headers), &message.payload) {
        Ok(decoded) => Ok(Delivery {
            message: decoded,
            subject,
            headers,
            info,
            acker,
            reply,
            client,
        }),
        Err(error) => {
            // A payload that cannot be decoded now never will be: stop redelivery.
            if let Err(term_error) = acker.ack_with(AckKind::Term).await {
                tracing::warn!(%subject, error = %term_error, "could not terminate undecodable message");
            }
            Err(error)
        }
    }
}

fn received_stream<T: BusMessage>(subscriber: async_nats::Subscriber) -> ReceivedStream<T> {
    Box::pin(subscriber.map(|message| {
        let subject = message.subject.to_string();
        let headers = message.headers.unwrap_or_default();
        let decoded = codec::decode::<T>(&subject, Some(&headers), &message.payload)?;
        Ok(Received {
            message: decoded,
            subject,
            headers,
        })
    }))
}

/// Headers every outgoing message carries: content type and trace context.
fn outgoing_headers<T: BusMessage>() -> HeaderMap {
    let mut headers = HeaderMap::new();
    codec::set_content_type::<T>(&mut headers);
    trace::inject_current(&mut headers);
    headers
}

fn require_attempt(attempt: u32) -> Result<(), BusError> {
    if attempt == 0 {
        return Err(BusError::InvalidId {
            kind: "attempt",
            value: "0".into(),
            reason: "attempts start at 1",
        });
    }
    Ok(())
}

impl Bus {
    async fn publish_jetstream<T: BusMessage>(
        &self,
        subject: String,
        message_id: String,
        message: &T,
    ) -> Result<PendingPublish, BusError> {
        let mut headers = outgoing_headers::<T>();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, message_id.as_str());
        let publish = PublishMessage::build()
            .payload(codec::encode(message))
            .headers(headers);
        let ack = self
            .jetstream()
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|source| BusError::Publish {
                subject: subject.clone(),
                source: source.into(),
            })?;
        Ok(PendingPublish {
            subject,
            ack,
            bus: self.clone(),
        })
    }

    /// Sends `task` to `mtswarm.task.<worker_id>.<slice_id>` without waiting
    /// for the stream's acknowledgement (see [`PendingPublish`]).
    pub async fn publish_task_pipelined(
        &self,
        task: &v1::TaskAssignment,
    ) -> Result<PendingPublish, BusError> {
        subjects::validate_id("task id", &task.task_id)?;
        subjects::validate_id("job id", &task.job_id)?;
        require_attempt(task.attempt)?;
        let subject = subjects::task(&task.worker_id, &task.slice_id)?;
        let message_id = subjects::message_id(&task.task_id, task.attempt);
        self.publish_jetstream(subject, message_id, task).await
    }

    /// Stores `task` in the tasks stream and waits for the acknowledgement.
    /// A second publish of the same task id and attempt (within the duplicate
    /// window) is dropped by the stream: the receipt says `duplicate: true`.
    pub async fn publish_task(
        &self,
        task: &v1::TaskAssignment,
    ) -> Result<PublishReceipt, BusError> {
        self.publish_task_pipelined(task).await?.wait().await
    }

    /// Sends `result` to `mtswarm.result.<job_id>` without waiting for the ack.
    pub async fn publish_result_pipelined(
        &self,
        result: &v1::TaskResult,
    ) -> Result<PendingPublish, BusError> {
        subjects::validate_id("task id", &result.task_id)?;
        require_attempt(result.attempt)?;
        let subject = subjects::result(&result.job_id)?;
        let message_id = subjects::result_message_id(result);
        self.publish_jetstream(subject, message_id, result).await
    }

    /// Stores `result` in the results stream (deduplicated by task id and
    /// attempt) and waits for the acknowledgement.
    pub async fn publish_result(
        &self,
        result: &v1::TaskResult,
    ) -> Result<PublishReceipt, BusError> {
        self.publish_result_pipelined(result).await?.wait().await
    }

    /// Creates (or opens) the durable task consumer of `worker_id`: explicit
    /// acks, redelivery after `ack_wait`, at most `max_deliver` deliveries.
    pub async fn task_consumer(
        &self,
        worker_id: &str,
        config: TaskConsumerConfig,
    ) -> Result<TaskConsumer, BusError> {
        let name = subjects::task_consumer_name(worker_id, config.slice_id.as_deref())?;
        let filter_subject = match &config.slice_id {
            Some(slice_id) => subjects::task(worker_id, slice_id)?,
            None => subjects::tasks_for_worker(worker_id)?,
        };
        let mut consumer_config = pull::Config {
            durable_name: Some(name.clone()),
            description: Some(format!("tasks of worker {worker_id}")),
            filter_subject,
            ack_policy: AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            max_deliver: config.max_deliver,
            max_ack_pending: config.max_ack_pending,
            deliver_policy: DeliverPolicy::All,
            memory_storage: config.memory_state,
            ..Default::default()
        };
        let consumer = match self
            .durable_consumer(subjects::TASKS_STREAM, &name, consumer_config.clone())
            .await
        {
            Ok(consumer) => consumer,
            // A consumer that already exists with its state on file cannot
            // be switched to memory: keep it as it is.
            Err(error) if consumer_config.memory_storage => {
                tracing::debug!(consumer = %name, %error, "task consumer kept with file state");
                consumer_config.memory_storage = false;
                self.durable_consumer(subjects::TASKS_STREAM, &name, consumer_config.clone())
                    .await?
            }
            Err(error) => return Err(error),
        };
        Ok(TaskConsumer {
            consumer,
            name,
            batch: config.batch,
            bus: self.clone(),
            config: consumer_config,
        })
    }

    /// Creates (or opens) a durable result consumer.
    pub async fn result_consumer(
        &self,
        config: ResultConsumerConfig,
    ) -> Result<ResultConsumer, BusError> {
        let name = subjects::result_consumer_name(&config.name)?;
        let filter_subject = match &config.job_id {
            Some(job_id) => subjects::result(job_id)?,
            None => subjects::ALL_RESULTS.to_string(),
        };
        let consumer = self
            .durable_consumer(
                subjects::RESULTS_STREAM,
                &name,
                pull::Config {
                    durable_name: Some(name.clone()),
                    description: Some("task results".to_string()),
                    filter_subject,
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    max_deliver: config.max_deliver,
                    max_ack_pending: config.max_ack_pending,
                    deliver_policy: DeliverPolicy::All,
                    ..Default::default()
                },
            )
            .await?;
        Ok(ResultConsumer {
            consumer,
            name,
            batch: config.batch,
        })
    }

    /// Creates or updates a durable consumer; a missing stream is
    /// re-created once ([`Bus::recover_topology`]) before giving up.
    async fn durable_consumer(
        &self,
        stream_name: &'static str,
        name: &str,
        config: pull::Config,
    ) -> Result<PullConsumer, BusError> {
        match self
            .create_durable_consumer(stream_name, name, config.clone())
            .await
        {
            Err(BusError::Consumer { source, .. })
                if crate::topology::is_missing_stream(source.as_ref())
                    && self
                        .recover_topology(&format!("consumer {name} on {stream_name}"))
                        .await? =>
            {
                self.create_durable_consumer(stream_name, name, config)
                    .await
            }
            other => other,
        }
    }

    async fn create_durable_consumer(
        &self,
        stream_name: &'static str,
        name: &str,
        config: pull::Config,
    ) -> Result<PullConsumer, BusError> {
        let stream = self
            .jetstream()
            .get_stream_no_info(stream_name)
            .await
            .map_err(|e| consumer_error(stream_name, name, e))?;
        // Create-or-update so changed settings (ack wait, limits) take effect.
        stream
            .create_consumer(config)
            .await
            .map_err(|e| consumer_error(stream_name, name, e))
    }

    /// Deletes a durable consumer (e.g. when a worker leaves for good).
    pub async fn delete_consumer(&self, stream_name: &str, name: &str) -> Result<(), BusError> {
        let stream = self
            .jetstream()
            .get_stream_no_info(stream_name)
            .await
            .map_err(|e| consumer_error(stream_name, name, e))?;
        stream
            .delete_consumer(name)
            .await
            .map(|_| ())
            .map_err(|e| consumer_error(stream_name, name, e))
    }

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

    async fn subscribe_core<T: BusMessage>(
        &self,
        subject: String,
    ) -> Result<ReceivedStream<T>, BusError> {
        let subscriber = self
            .client()
            .subscribe(subject.clone())
            .await
            .map_err(|source| BusError::Subscribe {
                subject,
                source: source.into(),
            })?;
        Ok(received_stream(subscriber))
    }

    /// Publishes a progress event to `mtswarm.event.<job_id>.<agent_id>` (core
    /// NATS: fire and forget; the events stream keeps a copy for replay).
    pub async fn publish_event(&self, event: &v1::AgentEvent) -> Result<(), BusError> {
        let subject = subjects::event(&event.job_id, &event.agent_id)?;
        self.publish_core(subject, event).await
    }

    /// Live events of one job (from now on).
    pub async fn subscribe_events(
        &self,
        job_id: &str,
    ) -> Result<ReceivedStream<v1::AgentEvent>, BusError> {
        self.subscribe_core(subjects::events_for_job(job_id)?).await
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
        Ok(Box::pin(messages.map(move |item| {
            let message = item.map_err(|e| consumer_error(stream_name, "ordered", e))?;
            let stream_sequence =
                message
                    .info()
                    .map(|info| info.stream_sequence)
                    .map_err(|source| BusError::Ack {
                        subject: message.subject.to_string(),
                        source,
                    })?;
            let subject = message.subject.to_string();
            let headers = message.headers.clone().unwrap_or_default();
            let event =
                codec::decode::<v1::AgentEvent>(&subject, Some(&headers), &message.payload)?;
            Ok(ReplayedEvent {
                stream_sequence,
                event,
                headers,
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
