//! How the cores of a group stop together: barriers with modeled clocks,
//! the launch's abort flag, and deadlock detection.
//!
//! Every core runs on its own host thread. A barrier releases its
//! participants at the slowest arrival's modeled time plus the barrier
//! cost, whatever order the host threads arrive in, so the figures stay
//! deterministic. A core that returns or faults while the others wait
//! for it would hang the launch until its timeout; instead the group stops
//! at once with an error naming who waits where.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::EmuError;

/// The first error of a launch, and the flag every running core and the
/// harness poll (through the engine's epoch) to stop.
#[derive(Debug, Default)]
pub(crate) struct Abort {
    raised: AtomicBool,
    error: Mutex<Option<EmuError>>,
}

impl Abort {
    /// Stop the launch with `error`, unless it already stopped.
    pub(crate) fn raise(&self, error: EmuError) {
        if let Ok(mut slot) = self.error.lock()
            && slot.is_none()
        {
            *slot = Some(error);
        }
        self.raised.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }

    /// The error the launch stopped with.
    pub(crate) fn error(&self) -> Option<EmuError> {
        self.error.lock().ok().and_then(|e| e.clone())
    }
}

#[derive(Debug, Default)]
struct Barrier {
    arrived: u32,
    expected: u32,
    max_clk: f64,
    generation: u64,
    /// Release times of recent generations (a subset barrier can complete
    /// again before a woken participant reads its own).
    releases: VecDeque<(u64, f64)>,
}

#[derive(Debug)]
struct State {
    barriers: BTreeMap<i32, Barrier>,
    /// Cores still running their kernel.
    live: u32,
    /// (core, barrier) of each core waiting at a barrier.
    waiting: Vec<(u32, i32)>,
}

/// The barriers of one group execution.
#[derive(Debug)]
pub(crate) struct Barriers {
    state: Mutex<State>,
    cv: Condvar,
    barrier_cycles: f64,
}

impl Barriers {
    pub(crate) fn new(cores: u32, barrier_cycles: f64) -> Self {
        Self {
            state: Mutex::new(State {
                barriers: BTreeMap::new(),
                live: cores,
                waiting: Vec::new(),
            }),
            cv: Condvar::new(),
            barrier_cycles,
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, EmuError> {
        self.state
            .lock()
            .map_err(|_| EmuError::Launch("a core thread died holding the barrier lock".into()))
    }

    /// Core `core` arrives at barrier `id` of `ncores` participants at
    /// modeled time `clk`; returns when everybody arrived, with the time
    /// they all leave.
    pub(crate) fn arrive(
        &self,
        core: u32,
        id: i32,
        ncores: u32,
        clk: f64,
        abort: &Abort,
    ) -> Result<f64, EmuError> {
        let mut st = self.lock()?;
        let b = st.barriers.entry(id).or_default();
        if b.arrived == 0 {
            b.expected = ncores;
            b.max_clk = clk;
        } else if b.expected != ncores {
            return Err(EmuError::Usage(format!(
                "barrier {id} on core {core}: cores disagree on the participant count ({ncores} vs {})",
                b.expected
            )));
        }
        b.max_clk = b.max_clk.max(clk);
        b.arrived += 1;
        if b.arrived == b.expected {
            let release = b.max_clk + self.barrier_cycles;
            b.arrived = 0;
            b.generation += 1;
            let generation = b.generation;
            b.releases.push_back((generation, release));
            if b.releases.len() > 64 {
                b.releases.pop_front();
            }
            // The released cores no longer wait, whenever they wake.
            st.waiting.retain(|w| w.1 != id);
            self.cv.notify_all();
            return Ok(release);
        }
        let generation = b.generation;
        st.waiting.push((core, id));
        if let Some(err) = deadlock(&st) {
            abort.raise(err.clone());
            self.cv.notify_all();
            return Err(err);
        }
        loop {
            // Bounded waits: a launch stopped by its timeout has no core
            // left to notify the waiters.
            st = self
                .cv
                .wait_timeout(st, std::time::Duration::from_millis(20))
                .map_err(|_| EmuError::Launch("a core thread died at a barrier".into()))?
                .0;
            if abort.is_raised() {
                st.waiting.retain(|w| w.0 != core);
                return Err(EmuError::Aborted);
            }
            let release = st.barriers.get(&id).and_then(|b| {
                b.releases
                    .iter()
                    .find(|(g, _)| *g == generation + 1)
                    .map(|(_, r)| *r)
            });
            if let Some(release) = release {
                st.waiting.retain(|w| w.0 != core);
                return Ok(release);
            }
        }
    }

    /// Core `core` left its kernel (returned or faulted).
    pub(crate) fn leave(&self, abort: &Abort) {
        if let Ok(mut st) = self.state.lock() {
            st.live = st.live.saturating_sub(1);
            if let Some(err) = deadlock(&st) {
                abort.raise(err);
            }
        }
        self.cv.notify_all();
    }

    /// Wake every waiting core (the launch is stopping).
    pub(crate) fn wake_all(&self) {
        self.cv.notify_all();
    }
}

/// Every core still running waits at a barrier that cannot complete.
fn deadlock(st: &State) -> Option<EmuError> {
    if st.waiting.is_empty() || st.waiting.len() as u32 != st.live {
        return None;
    }
    let who: Vec<String> = st
        .waiting
        .iter()
        .map(|(core, id)| format!("core {core} at barrier {id}"))
        .collect();
    Some(EmuError::Usage(format!(
        "deadlock: {} wait for cores that have returned or wait elsewhere",
        who.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_barrier_releases_everybody_at_the_slowest_arrival_plus_its_cost() {
        let sync = Arc::new(Barriers::new(3, 100.0));
        let abort = Arc::new(Abort::default());
        let handles: Vec<_> = [10.0, 500.0, 40.0]
            .into_iter()
            .enumerate()
            .map(|(core, clk)| {
                let (sync, abort) = (sync.clone(), abort.clone());
                std::thread::spawn(move || sync.arrive(core as u32, 0, 3, clk, &abort))
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().expect("joins").expect("released"), 600.0);
        }
    }

    #[test]
    fn a_core_that_returns_while_another_waits_is_a_deadlock_not_a_hang() {
        let sync = Arc::new(Barriers::new(2, 0.0));
        let abort = Arc::new(Abort::default());
        let waiter = {
            let (sync, abort) = (sync.clone(), abort.clone());
            std::thread::spawn(move || sync.arrive(0, 7, 2, 0.0, &abort))
        };
        // Wait until core 0 is registered as waiting, then core 1 leaves.
        loop {
            if sync
                .state
                .lock()
                .map(|s| !s.waiting.is_empty())
                .unwrap_or(false)
            {
                break;
            }
            std::thread::yield_now();
        }
        sync.leave(&abort);
        let err = waiter.join().expect("joins").unwrap_err();
        assert_eq!(err, EmuError::Aborted);
        let EmuError::Usage(msg) = abort.error().expect("raised") else {
            panic!("usage error expected");
        };
        assert!(msg.contains("core 0 at barrier 7"), "{msg}");
    }
}
