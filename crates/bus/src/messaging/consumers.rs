//! Durable JetStream consumers: the worker's task consumer and the leader's
//! result consumer, created or updated with their settings.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::Stream;
use mtswarm_proto::v1;

use super::delivery::{DeliveryStream, consumer_error, deliveries};
use crate::connection::Bus;
use crate::error::BusError;
use crate::subjects;

/// Settings of a worker's durable task consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskConsumerConfig {
    /// Only this slice's tasks; `None` = every task of the worker. On the work
    /// queue a worker uses either one worker-wide consumer or one per slice,
    /// not both (their filters would overlap).
    pub slice_id: Option<String>,
    /// Time a delivery may stay unacknowledged before it is redelivered
    /// (extend it with [`Delivery::in_progress`](super::Delivery::in_progress)).
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
    /// Time to acknowledge a delivery before it is redelivered (default 30 s).
    pub ack_wait: Duration,
    /// Deliveries per message before the server gives up; -1 = no limit (default).
    pub max_deliver: i64,
    /// Unacknowledged deliveries in flight before the server pauses (default 10,000).
    pub max_ack_pending: i64,
    /// Messages fetched per pull request (default 100).
    pub batch: usize,
    /// The server removes the consumer after this long without a pull
    /// (zero, the default: never). A leader whose id is new on every start
    /// sets it, so the consumers of leaders that are gone do not pile up
    /// on the server.
    pub inactive_threshold: Duration,
}

impl ResultConsumerConfig {
    /// Defaults for the durable consumer `results-<name>`, over all jobs.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            job_id: None,
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            max_ack_pending: 10_000,
            batch: 100,
            inactive_threshold: Duration::ZERO,
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
    /// Durable name of the consumer.
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

impl Bus {
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
            memory_storage: config.memory_state,
            ..explicit_ack_config(
                &name,
                format!("tasks of worker {worker_id}"),
                filter_subject,
                Redelivery {
                    ack_wait: config.ack_wait,
                    max_deliver: config.max_deliver,
                    max_ack_pending: config.max_ack_pending,
                },
            )
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
        let consumer_config = pull::Config {
            inactive_threshold: config.inactive_threshold,
            ..explicit_ack_config(
                &name,
                "task results".to_string(),
                filter_subject,
                Redelivery {
                    ack_wait: config.ack_wait,
                    max_deliver: config.max_deliver,
                    max_ack_pending: config.max_ack_pending,
                },
            )
        };
        let consumer = self
            .durable_consumer(subjects::RESULTS_STREAM, &name, consumer_config)
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
                if crate::error::is_missing_stream(source.as_ref())
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
        // Create-or-update so changed settings (ack wait, limits) take effect.
        self.consumer_stream(stream_name, name)
            .await?
            .create_consumer(config)
            .await
            .map_err(|e| consumer_error(stream_name, name, e))
    }

    /// Deletes a durable consumer (e.g. when a worker leaves for good).
    pub async fn delete_consumer(&self, stream_name: &str, name: &str) -> Result<(), BusError> {
        self.consumer_stream(stream_name, name)
            .await?
            .delete_consumer(name)
            .await
            .map(|_| ())
            .map_err(|e| consumer_error(stream_name, name, e))
    }

    /// The stream `stream_name` for work on its consumer `name` (errors
    /// name both).
    async fn consumer_stream(&self, stream_name: &str, name: &str) -> Result<Stream<()>, BusError> {
        self.jetstream()
            .get_stream_no_info(stream_name)
            .await
            .map_err(|e| consumer_error(stream_name, name, e))
    }
}

/// When the server delivers a message again, and how often.
struct Redelivery {
    ack_wait: Duration,
    max_deliver: i64,
    max_ack_pending: i64,
}

/// A durable consumer named `name` with explicit acks over every message
/// matching `filter_subject`, from the start of the stream.
fn explicit_ack_config(
    name: &str,
    description: String,
    filter_subject: String,
    redelivery: Redelivery,
) -> pull::Config {
    pull::Config {
        durable_name: Some(name.to_string()),
        description: Some(description),
        filter_subject,
        ack_policy: AckPolicy::Explicit,
        ack_wait: redelivery.ack_wait,
        max_deliver: redelivery.max_deliver,
        max_ack_pending: redelivery.max_ack_pending,
        deliver_policy: DeliverPolicy::All,
        ..Default::default()
    }
}
