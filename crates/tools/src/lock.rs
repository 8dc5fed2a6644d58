//! The slice lock the engine takes around hardware calls: `mtswarm-hw`'s
//! fair, accounted [`HwLock`] behind `mtswarm-core`'s [`ResourceLock`] trait
//! (neither crate may know the other, so the adapter lives here).
//!
//! The adapter also keeps each slice's *tuning phase* as this lock saw it:
//! from the first time a hardware call of the session held the slice to the
//! last time one released it, with the time held in between. Its
//! [`TuningPhase::utilization`] is the share of that phase the slice was
//! busy; the start-up before the first hardware call (reading, analysing,
//! the first compile) and the answer after the last one are not part of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mtswarm_core::{ResourceGuard, ResourceLock};
use mtswarm_hw::lock::{HwGuard, HwLock};

/// One slice's tuning phase: first acquisition to last release.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TuningPhase {
    /// When a hardware call first held the slice.
    pub first_acquired: Instant,
    /// When a hardware call last released it (`None` while the first is held).
    pub last_released: Option<Instant>,
    /// Sum of the completed holds.
    pub busy: Duration,
    /// Completed holds.
    pub holds: u64,
}

impl TuningPhase {
    /// First acquisition to last release.
    pub fn span(&self) -> Duration {
        self.last_released
            .map(|end| end.saturating_duration_since(self.first_acquired))
            .unwrap_or_default()
    }

    /// Share of the phase the slice was held, 0..1 (0 before the first
    /// release).
    pub fn utilization(&self) -> f64 {
        let span = self.span().as_secs_f64();
        if span <= 0.0 {
            0.0
        } else {
            (self.busy.as_secs_f64() / span).min(1.0)
        }
    }
}

type Phases = Arc<Mutex<HashMap<String, TuningPhase>>>;

/// [`HwLock`] as the engine's resource lock; resources are slice ids.
#[derive(Debug, Clone, Default)]
pub struct HwResourceLock {
    lock: HwLock,
    phases: Phases,
}

/// Books the hold into the tuning phase when the engine releases the slice.
struct PhaseGuard {
    resource: String,
    acquired: Instant,
    phases: Phases,
    _guard: HwGuard,
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(phase) = phases.get_mut(&self.resource) {
            phase.busy += now.saturating_duration_since(self.acquired);
            phase.holds += 1;
            phase.last_released = Some(now);
        }
        // The slice itself is released after this, when `_guard` drops.
    }
}

impl HwResourceLock {
    /// Wraps the daemon's slice lock, with no hold statistics yet.
    pub fn new(lock: HwLock) -> Self {
        Self {
            lock,
            phases: Phases::default(),
        }
    }

    /// The underlying lock (for statistics).
    pub fn hw_lock(&self) -> &HwLock {
        &self.lock
    }

    /// The tuning phase of `resource` through this lock (`None` before its
    /// first acquisition).
    pub fn tuning_phase(&self, resource: &str) -> Option<TuningPhase> {
        let phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        phases.get(resource).copied()
    }
}

#[async_trait::async_trait]
impl ResourceLock for HwResourceLock {
    async fn acquire(&self, resource: &str) -> ResourceGuard {
        let guard = self.lock.acquire(resource).await;
        let waited = guard.waited();
        let acquired = Instant::now();
        {
            let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
            phases
                .entry(resource.to_owned())
                .or_insert_with(|| TuningPhase {
                    first_acquired: acquired,
                    last_released: None,
                    busy: Duration::ZERO,
                    holds: 0,
                });
        }
        ResourceGuard::new(
            waited,
            PhaseGuard {
                resource: resource.to_owned(),
                acquired,
                phases: self.phases.clone(),
                _guard: guard,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_tuning_phase_spans_first_acquisition_to_last_release() {
        let lock = HwResourceLock::default();
        assert!(lock.tuning_phase("emu0/c0").is_none());
        let first = lock.acquire("emu0/c0").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let open = lock.tuning_phase("emu0/c0").expect("acquired");
        assert_eq!((open.holds, open.last_released), (0, None));
        drop(first);
        // Idle between the holds, then a second hold.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = lock.clone().acquire("emu0/c0").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(second);
        let phase = lock.tuning_phase("emu0/c0").expect("phase");
        assert_eq!(phase.holds, 2);
        // Held at least 400 ms, idle at least 100 ms in between.
        assert!(phase.busy >= Duration::from_millis(400), "{phase:?}");
        assert!(
            phase.span() >= phase.busy + Duration::from_millis(100),
            "{phase:?}"
        );
        let share = phase.busy.as_secs_f64() / phase.span().as_secs_f64();
        assert!((phase.utilization() - share).abs() < 1e-12 && share < 1.0);
        assert!(lock.tuning_phase("emu0/c1").is_none());
    }
}
