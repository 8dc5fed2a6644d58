//! Slice health: every hardware run of a slice goes through a
//! [`MonitoredBoard`] that counts failed runs in a row. A crash, a timeout
//! or a wrong answer is the hardware's failure; a compile error, a capacity
//! error or a bad configuration is the kernel's and is not counted; a valid
//! run resets the count. When the count reaches the daemon's
//! `quarantine_after`, the board reports the slice to the daemon, which
//! writes the `SliceQuarantine` record and fences the slice's session (see
//! the daemon's quarantine monitor).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use mtswarm_hw::{Artifact, Board, BuildRequest, HwError, RunOutcome, RunRequest, Slice};
use tokio::sync::mpsc;

/// A slice whose runs failed `quarantine_after` times in a row.
#[derive(Debug, Clone)]
pub(crate) struct FailingSlice {
    pub(crate) slice_index: usize,
    pub(crate) consecutive_failures: u32,
    /// The last failure, for the quarantine record.
    pub(crate) reason: String,
}

/// Consecutive failed hardware runs of one slice.
#[derive(Debug, Default)]
pub(crate) struct SliceHealth {
    consecutive_failures: AtomicU32,
}

impl SliceHealth {
    /// Forget the failures (a valid run, or the slice was quarantined).
    pub(crate) fn reset(&self) {
        self.consecutive_failures.store(0, Ordering::SeqCst);
    }

    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::SeqCst)
    }
}

/// Why a run counts as a hardware failure, if it does.
fn failure_of(result: &Result<RunOutcome, HwError>) -> Option<String> {
    match result {
        Ok(outcome) if outcome.valid => None,
        Ok(outcome) => Some(
            outcome
                .error
                .clone()
                .unwrap_or_else(|| "the run's output is invalid".to_owned()),
        ),
        Err(error @ HwError::Timeout(_)) => Some(error.to_string()),
        Err(_) => None,
    }
}

/// How a run ended, as the `mtswarm.kernel.runs` metric counts it (one of
/// `mtswarm_telemetry::metrics::KERNEL_RUN_OUTCOMES`).
fn outcome_label(result: &Result<RunOutcome, HwError>) -> &'static str {
    match result {
        Ok(outcome) if outcome.valid => "valid",
        Ok(_) => "invalid",
        Err(HwError::Timeout(_)) => "timeout",
        Err(_) => "error",
    }
}

/// A board whose runs are counted for the slice's health (and the
/// daemon's metrics).
pub(crate) struct MonitoredBoard {
    inner: Arc<dyn Board>,
    slice_index: usize,
    bus_id: String,
    worker_id: String,
    health: Arc<SliceHealth>,
    quarantine_after: u32,
    reports: mpsc::UnboundedSender<FailingSlice>,
}

impl MonitoredBoard {
    pub(crate) fn new(
        inner: Arc<dyn Board>,
        slice_index: usize,
        bus_id: String,
        worker_id: String,
        health: Arc<SliceHealth>,
        quarantine_after: u32,
        reports: mpsc::UnboundedSender<FailingSlice>,
    ) -> Self {
        Self {
            inner,
            slice_index,
            bus_id,
            worker_id,
            health,
            quarantine_after,
            reports,
        }
    }
}

#[async_trait::async_trait]
impl Board for MonitoredBoard {
    fn slice(&self) -> &Slice {
        self.inner.slice()
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        self.inner.build(request).await
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        let result = self.inner.run(artifact, request).await;
        mtswarm_telemetry::metrics::metrics().kernel_run(
            &self.worker_id,
            &self.bus_id,
            outcome_label(&result),
        );
        match failure_of(&result) {
            None if result.is_ok() => self.health.reset(),
            None => {}
            Some(reason) => {
                let count = self
                    .health
                    .consecutive_failures
                    .fetch_add(1, Ordering::SeqCst)
                    + 1;
                tracing::warn!(
                    slice.id = %self.bus_id,
                    consecutive_failures = count,
                    quarantine_after = self.quarantine_after,
                    %reason,
                    "hardware run failed"
                );
                if self.quarantine_after > 0 && count >= self.quarantine_after {
                    let _ = self.reports.send(FailingSlice {
                        slice_index: self.slice_index,
                        consecutive_failures: count,
                        reason,
                    });
                }
            }
        }
        result
    }
}
