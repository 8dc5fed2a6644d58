//! Admission and backpressure: at most `max_active_jobs` leader loops run at
//! once, at most `max_queued_jobs` accepted jobs wait for a slot (QUEUED, in
//! submission order), and a submission beyond both is refused with a message
//! naming the limits (SubmitJob maps it to RESOURCE_EXHAUSTED).
//!
//! Admission is two-phase so that a refused or failed store never leaves a
//! counted job behind: [`Scheduler::reserve`] takes a run or queue place
//! before the job record is written, then [`Scheduler::commit`] turns it into
//! a running or queued job (or [`Scheduler::cancel`] gives it back). A job
//! whose runner ends calls [`Scheduler::finished`], which hands out the
//! oldest queued job.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::error::AdmissionError;

/// A place taken by [`Scheduler::reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a reservation must be committed or cancelled"]
pub(crate) enum Ticket {
    /// A run slot is free: the job starts at once.
    Run,
    /// All run slots are taken: the job waits in the queue.
    Queue,
}

/// Something waiting to start (the runner's start parameters).
pub(crate) trait Pending: Send {
    fn job_id(&self) -> &str;
}

struct State<P> {
    running: usize,
    reserved_run: usize,
    reserved_queue: usize,
    queued: VecDeque<P>,
}

/// The admission state of one leader.
pub(crate) struct Scheduler<P> {
    max_active: usize,
    max_queued: usize,
    state: Mutex<State<P>>,
}

impl<P: Pending> Scheduler<P> {
    pub(crate) fn new(max_active: usize, max_queued: usize) -> Self {
        Self {
            max_active: max_active.max(1),
            max_queued,
            state: Mutex::new(State {
                running: 0,
                reserved_run: 0,
                reserved_queue: 0,
                queued: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<P>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a run place, else a queue place; `Err` names the limits when
    /// both are exhausted.
    pub(crate) fn reserve(&self) -> Result<Ticket, AdmissionError> {
        let mut state = self.lock();
        if state.running + state.reserved_run < self.max_active {
            state.reserved_run += 1;
            return Ok(Ticket::Run);
        }
        if state.queued.len() + state.reserved_queue < self.max_queued {
            state.reserved_queue += 1;
            return Ok(Ticket::Queue);
        }
        Err(AdmissionError {
            max_active: self.max_active,
            max_queued: self.max_queued,
        })
    }

    /// Gives a reservation back (the job was not stored).
    pub(crate) fn cancel(&self, ticket: Ticket) {
        let mut state = self.lock();
        match ticket {
            Ticket::Run => state.reserved_run = state.reserved_run.saturating_sub(1),
            Ticket::Queue => state.reserved_queue = state.reserved_queue.saturating_sub(1),
        }
    }

    /// Turns a reservation into a job: returns it back when it must start
    /// now, or keeps it queued (then `None`).
    pub(crate) fn commit(&self, ticket: Ticket, pending: P) -> Option<P> {
        let mut state = self.lock();
        match ticket {
            Ticket::Run => {
                state.reserved_run = state.reserved_run.saturating_sub(1);
                state.running += 1;
                Some(pending)
            }
            Ticket::Queue => {
                state.reserved_queue = state.reserved_queue.saturating_sub(1);
                // A slot may have freed since the reservation while the
                // queue was empty: nobody would wake this job otherwise.
                self.start_or_queue(&mut state, pending)
            }
        }
    }

    /// Adds a job without checking the limits (jobs resumed at start: they
    /// were accepted before) and returns it when it may start now.
    pub(crate) fn admit_resumed(&self, pending: P) -> Option<P> {
        let mut state = self.lock();
        self.start_or_queue(&mut state, pending)
    }

    /// Starts `pending` when nothing waits before it and a run slot is
    /// free (returning it), else queues it at the back.
    fn start_or_queue(&self, state: &mut State<P>, pending: P) -> Option<P> {
        if state.queued.is_empty() && state.running + state.reserved_run < self.max_active {
            state.running += 1;
            Some(pending)
        } else {
            state.queued.push_back(pending);
            None
        }
    }

    /// A running job ended: frees its slot and returns the next queued job
    /// to start, if any.
    pub(crate) fn finished(&self) -> Option<P> {
        let mut state = self.lock();
        state.running = state.running.saturating_sub(1);
        if state.running + state.reserved_run < self.max_active
            && let Some(next) = state.queued.pop_front()
        {
            state.running += 1;
            return Some(next);
        }
        None
    }

    /// Removes a queued job (cancelled before it started) and returns it.
    pub(crate) fn remove_queued(&self, job_id: &str) -> Option<P> {
        let mut state = self.lock();
        let index = state.queued.iter().position(|p| p.job_id() == job_id)?;
        state.queued.remove(index)
    }

    /// (running, queued) counts.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.running, state.queued.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Job(&'static str);
    impl Pending for Job {
        fn job_id(&self) -> &str {
            self.0
        }
    }

    #[test]
    fn runs_up_to_the_limit_queues_in_order_and_refuses_beyond() {
        let scheduler: Scheduler<Job> = Scheduler::new(1, 2);
        let first = scheduler.reserve().expect("run place");
        assert_eq!(first, Ticket::Run);
        assert!(scheduler.commit(first, Job("a")).is_some());
        for id in ["b", "c"] {
            let ticket = scheduler.reserve().expect("queue place");
            assert_eq!(ticket, Ticket::Queue);
            assert!(scheduler.commit(ticket, Job(id)).is_none());
        }
        let refused = scheduler.reserve().expect_err("full").to_string();
        assert!(refused.contains("max_active_jobs = 1"), "{refused}");
        assert!(refused.contains("max_queued_jobs = 2"), "{refused}");
        assert_eq!(scheduler.counts(), (1, 2));
        assert_eq!(scheduler.finished().map(|j| j.0), Some("b"));
        assert_eq!(scheduler.remove_queued("c").map(|j| j.0), Some("c"));
        assert!(scheduler.remove_queued("c").is_none());
        assert!(scheduler.finished().is_none());
        assert_eq!(scheduler.counts(), (0, 0));
        let ticket = scheduler.reserve().expect("free again");
        scheduler.cancel(ticket);
        assert_eq!(scheduler.reserve(), Ok(Ticket::Run));
    }
}
