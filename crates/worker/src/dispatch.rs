//! The daemon's one task consumer: every task published for this worker
//! (`mtswarm.task.<worker>.<slice>`) arrives here and is filed in the inbox
//! of the session it names ([`crate::inbox`]).
//!
//! One consumer per daemon instead of one per session is what lets a daemon
//! hold thousands of sessions: JetStream caps the consumers of a stream,
//! every consumer costs the server state and a pull subscription, and a
//! session that waits for work now costs only its queue. The price is that
//! a delivery waits in an inbox unacknowledged, so this module also keeps
//! queued deliveries alive and ends idle sessions, each with one tick for
//! the whole daemon rather than a timer per session.
//!
//! Routing a delivery:
//! - to its session's inbox when the session runs on the slice of the
//!   task's subject;
//! - terminated when the slice now belongs to another session (the task's
//!   session is gone for good) or the task names another slice than its
//!   subject;
//! - otherwise (no session on the slice: one about to start, or a task
//!   that outlived its session) redelivered later with a growing delay,
//!   and terminated after the consumer's delivery limit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use mtswarm_bus::{Backoff, BusError, Delivery, TaskConsumer, TaskConsumerConfig, subjects, v1};
use tokio::sync::watch;

use crate::host::SessionHost;
use crate::session_entry::SessionEntry;
use crate::stop::StopMode;

/// Longest wait before a task whose session is not here is offered again.
const MAX_REDELIVERY_DELAY: Duration = Duration::from_secs(10);
/// Deliveries asked for per pull.
const PULL_BATCH: usize = 256;
/// Delivery errors in a row before the subscription is opened again.
const ERRORS_BEFORE_REOPEN: u32 = 3;

/// Unacknowledged tasks the consumer may have out at once: every session
/// can have a backlog without one busy agent holding up the others.
fn max_ack_pending(slices: usize) -> i64 {
    i64::try_from(slices.saturating_mul(16))
        .unwrap_or(i64::MAX)
        .max(10_000)
}

/// Opens the daemon's task consumer. A consumer of an earlier version per
/// slice would overlap its filter (the work queue allows one consumer per
/// subject): those are removed and the open tried once more.
pub(crate) async fn open(shared: &SessionHost) -> Result<TaskConsumer, BusError> {
    let config = TaskConsumerConfig {
        slice_id: None,
        ack_wait: shared.config.task_ack_wait,
        max_deliver: shared.config.task_max_deliver,
        max_ack_pending: max_ack_pending(shared.slices.len()),
        batch: PULL_BATCH,
        // A task that comes back after a server restart is still resumed:
        // the session knows it checkpointed that task.
        memory_state: true,
    };
    match shared
        .stores
        .bus
        .task_consumer(&shared.identity.worker_id, config.clone())
        .await
    {
        Ok(consumer) => Ok(consumer),
        Err(first) if !first.is_overlapping_consumer() => Err(first),
        Err(first) => {
            let mut removed = 0usize;
            for slice in shared.slices.iter() {
                let name =
                    subjects::task_consumer_name(&shared.identity.worker_id, Some(&slice.bus_id))?;
                if shared
                    .stores
                    .bus
                    .delete_consumer(subjects::TASKS_STREAM, &name)
                    .await
                    .is_ok()
                {
                    removed += 1;
                }
            }
            if removed == 0 {
                return Err(first);
            }
            tracing::info!(
                removed,
                "removed the per-slice task consumers of an earlier version"
            );
            shared
                .stores
                .bus
                .task_consumer(&shared.identity.worker_id, config)
                .await
        }
    }
}

/// Routes the consumer's deliveries until `shutdown` is set; between
/// deliveries, one tick keeps queued deliveries alive and ends sessions
/// idle for longer than the configured timeout.
pub(crate) async fn run(
    shared: Arc<SessionHost>,
    consumer: TaskConsumer,
    mut shutdown: watch::Receiver<bool>,
) {
    let router = Router::new(&shared);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    // Often enough to keep queued deliveries inside their ack wait and to
    // end an idle session close to its timeout.
    let tick_every = shared
        .progress_interval()
        .min(shared.config.session_idle_timeout / 4)
        .max(Duration::from_millis(50));
    let mut tick = tokio::time::interval(tick_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let Some(mut messages) = reopen(&consumer, &mut backoff, &mut shutdown).await else {
        return;
    };
    let mut errors_in_a_row = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => router.tick().await,
            item = messages.next() => match item {
                Some(Ok(delivery)) => {
                    errors_in_a_row = 0;
                    router.route(delivery).await;
                }
                Some(Err(error)) => {
                    errors_in_a_row += 1;
                    tracing::warn!(%error, errors_in_a_row, "task delivery error");
                    if errors_in_a_row >= ERRORS_BEFORE_REOPEN {
                        errors_in_a_row = 0;
                        let Some(reopened) = reopen(&consumer, &mut backoff, &mut shutdown).await else {
                            return;
                        };
                        messages = reopened;
                    }
                }
                None => {
                    // The pull subscription ended (e.g. the server
                    // restarted): open it again; the consumer is created
                    // again with it.
                    tracing::warn!("the task subscription ended; re-opening it");
                    let Some(reopened) = reopen(&consumer, &mut backoff, &mut shutdown).await else {
                        return;
                    };
                    messages = reopened;
                }
            },
        }
    }
}

async fn reopen(
    consumer: &TaskConsumer,
    backoff: &mut Backoff,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<mtswarm_bus::DeliveryStream<v1::TaskAssignment>> {
    mtswarm_bus::reopen::reopen("the task subscription", backoff, shutdown, || {
        consumer.messages()
    })
    .await
}

/// Where a delivery goes.
enum Route {
    /// Into this session's inbox.
    Session(Arc<SessionEntry>),
    /// Never to be run: terminated, with the reason logged.
    Terminate(&'static str),
    /// Offered again later: no session runs on the slice now.
    Later,
}

struct Router {
    shared: Arc<SessionHost>,
    /// Slice bus id -> index, so routing does not scan the slices.
    slice_index: HashMap<String, usize>,
}

impl Router {
    fn new(shared: &Arc<SessionHost>) -> Self {
        let slice_index = shared
            .slices
            .iter()
            .enumerate()
            .map(|(index, slice)| (slice.bus_id.clone(), index))
            .collect();
        Self {
            shared: shared.clone(),
            slice_index,
        }
    }

    fn route_of(&self, delivery: &Delivery<v1::TaskAssignment>) -> Route {
        let task = delivery.message();
        let subject_slice = delivery.subject().rsplit('.').next().unwrap_or_default();
        if subject_slice != task.slice_id {
            return Route::Terminate("the task names another slice than its subject");
        }
        let Some(&index) = self.slice_index.get(subject_slice) else {
            return Route::Terminate("the task's slice is not on this worker");
        };
        let table = self.shared.slices.table();
        match (
            table.sessions.get(&task.session_id),
            table.slice_owner[index].as_deref(),
        ) {
            (Some(entry), _) if entry.slice_index == index => Route::Session(entry.clone()),
            (Some(_), _) => Route::Terminate("the task's session runs on another slice"),
            // Reserved for the task's session, which is still starting.
            (None, Some(owner)) if owner == task.session_id => Route::Later,
            (None, Some(_)) => Route::Terminate("task for another session on this slice"),
            (None, None) => Route::Later,
        }
    }

    async fn route(&self, delivery: Delivery<v1::TaskAssignment>) {
        match self.route_of(&delivery) {
            Route::Session(entry) => {
                entry.inbox.push(delivery);
            }
            Route::Terminate(reason) => {
                let task = delivery.message();
                tracing::warn!(
                    task.id = %task.task_id,
                    task.session_id = %task.session_id,
                    task.slice_id = %task.slice_id,
                    subject = %delivery.subject(),
                    "{reason}; terminated"
                );
                if let Err(error) = delivery.term().await {
                    tracing::warn!(%error, "could not terminate the task");
                }
            }
            Route::Later => self.offer_later(delivery).await,
        }
    }

    /// No session on the task's slice: ask for the task again after a
    /// delay that doubles with every delivery, and give up at the limit.
    async fn offer_later(&self, delivery: Delivery<v1::TaskAssignment>) {
        let task = delivery.message();
        let delivered = delivery.info().delivered;
        let limit = self.shared.config.task_max_deliver;
        if limit > 0 && delivered >= u64::try_from(limit).unwrap_or(u64::MAX) {
            tracing::warn!(
                task.id = %task.task_id,
                task.session_id = %task.session_id,
                delivered,
                "no session on this worker takes the task; terminated after its last delivery"
            );
            if let Err(error) = delivery.term().await {
                tracing::warn!(%error, "could not terminate the task");
            }
            return;
        }
        let doublings = u32::try_from(delivered.saturating_sub(1)).unwrap_or(u32::MAX);
        let delay = Duration::from_millis(500)
            .saturating_mul(2u32.saturating_pow(doublings))
            .min(MAX_REDELIVERY_DELAY);
        tracing::debug!(
            task.id = %task.task_id,
            task.session_id = %task.session_id,
            delivered,
            ?delay,
            "no session on the task's slice yet; offered again later"
        );
        if let Err(error) = delivery.nak(Some(delay)).await {
            tracing::warn!(%error, "could not ask for the task again");
        }
    }

    /// Keep every queued delivery from being redelivered, and end sessions
    /// that have waited for a task longer than the idle timeout.
    async fn tick(&self) {
        let sessions = self.shared.slices.sessions();
        let idle_timeout = self.shared.config.session_idle_timeout;
        let now = Instant::now();
        for entry in sessions {
            for delivery in entry.inbox.queued() {
                if let Err(error) = delivery.in_progress().await {
                    tracing::debug!(%error, "progress ack of a queued task failed");
                }
            }
            if entry
                .inbox
                .idle_since()
                .is_some_and(|since| now.duration_since(since) >= idle_timeout)
            {
                entry.stop(StopMode::Idle(idle_timeout));
            }
        }
    }
}
