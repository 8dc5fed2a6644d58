//! A session's queue of task deliveries. The daemon's one task consumer
//! ([`crate::dispatch`]) files each delivery in the inbox of the session it
//! names; the session takes them one at a time. A session that waits for
//! work therefore owns no consumer, no subscription and no timer: only this
//! queue and the task that waits on it.
//!
//! A queued delivery is not acknowledged yet, so the server would deliver
//! it again once its ack wait ran out. The dispatcher keeps every queued
//! delivery alive ([`TaskInbox::queued`]) with one daemon-wide tick; the
//! one a session is running reports progress itself.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mtswarm_bus::{Delivery, v1};
use tokio::sync::Notify;

/// One delivered task, shared between the inbox and the keep-alive tick.
pub(crate) type TaskDelivery = Arc<Delivery<v1::TaskAssignment>>;

/// What [`TaskInbox::push`] did with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filed {
    /// Queued behind the tasks already waiting.
    Queued,
    /// A redelivery of a task already waiting: it took the older
    /// delivery's place (its acknowledgement is the current one).
    Replaced,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<TaskDelivery>,
    /// When the session last took a task or became idle: the dispatcher's
    /// idle sweep reads it instead of a timer per session.
    idle_since: Option<Instant>,
}

/// The deliveries waiting for one session.
#[derive(Default)]
pub(crate) struct TaskInbox {
    queue: Mutex<Queue>,
    ready: Notify,
}

fn same_attempt(a: &v1::TaskAssignment, b: &v1::TaskAssignment) -> bool {
    a.task_id == b.task_id && a.attempt == b.attempt
}

impl TaskInbox {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Files `delivery`; a redelivery of an attempt already waiting
    /// replaces it instead of queueing the attempt twice.
    pub(crate) fn push(&self, delivery: Delivery<v1::TaskAssignment>) -> Filed {
        let filed = {
            let mut queue = self.queue();
            let task = delivery.message();
            match queue
                .waiting
                .iter_mut()
                .find(|queued| same_attempt(queued.message(), task))
            {
                Some(queued) => {
                    *queued = Arc::new(delivery);
                    Filed::Replaced
                }
                None => {
                    queue.waiting.push_back(Arc::new(delivery));
                    Filed::Queued
                }
            }
        };
        self.ready.notify_one();
        filed
    }

    /// The next delivery, waiting until one is filed. Cancel-safe: a
    /// delivery is only taken out of the queue when this returns it.
    pub(crate) async fn next(&self) -> TaskDelivery {
        loop {
            let notified = self.ready.notified();
            if let Some(delivery) = self.take() {
                return delivery;
            }
            notified.await;
        }
    }

    fn take(&self) -> Option<TaskDelivery> {
        let mut queue = self.queue();
        let delivery = queue.waiting.pop_front()?;
        queue.idle_since = None;
        Some(delivery)
    }

    /// Marks the session idle from now (it finished a task or just started).
    pub(crate) fn mark_idle(&self) {
        self.queue().idle_since = Some(Instant::now());
    }

    /// Since when the session has been idle with nothing queued; `None`
    /// while it runs a task or has work waiting.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let queue = self.queue();
        if queue.waiting.is_empty() {
            queue.idle_since
        } else {
            None
        }
    }

    /// The deliveries waiting now (for the keep-alive tick).
    pub(crate) fn queued(&self) -> Vec<TaskDelivery> {
        self.queue().waiting.iter().cloned().collect()
    }

    /// Takes every waiting delivery out (the session is ending).
    pub(crate) fn drain(&self) -> Vec<TaskDelivery> {
        self.queue().waiting.drain(..).collect()
    }
}
