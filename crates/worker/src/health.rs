//! Slice health: every hardware run of a slice goes through a
//! [`MonitoredBoard`] that counts failed runs in a row. A run that crashes,
//! times out or answers wrong fails, but whose failure it is takes a
//! second run to tell: candidates are written to win and may be wrong, trap
//! or hang on a healthy slice. So after a failed run the board runs the
//! reference kernel ([`mtswarm_hw::reference`], known to be right) on the
//! same slice, and counts the failure only if the reference fails too. A
//! compile error, a capacity error or a bad configuration is the kernel's
//! and is never counted; a valid run resets the count. When the count
//! reaches the daemon's `quarantine_after`, the board reports the slice to
//! the daemon, which writes the `SliceQuarantine` record and fences the
//! slice's session (see the daemon's quarantine monitor).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use mtswarm_hw::{Artifact, Board, BuildRequest, HwError, RunOutcome, RunRequest, Slice};
use tokio::sync::{Mutex, mpsc};

/// Longest a reference run may take.
const REFERENCE_TIMEOUT: Duration = Duration::from_secs(120);

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

/// What a monitored board reports to: its slice, the slice's health,
/// when failures quarantine it, and where the reports go.
pub(crate) struct SliceMonitor {
    pub(crate) slice_index: usize,
    pub(crate) bus_id: String,
    pub(crate) worker_id: String,
    pub(crate) health: Arc<SliceHealth>,
    pub(crate) quarantine_after: u32,
    pub(crate) reports: mpsc::UnboundedSender<FailingSlice>,
    /// Where the reference kernel and its build live.
    pub(crate) reference_dir: PathBuf,
}

/// A board whose runs are counted for the slice's health (and the
/// daemon's metrics).
pub(crate) struct MonitoredBoard {
    inner: Arc<dyn Board>,
    monitor: SliceMonitor,
    /// The reference kernel's build, once made.
    reference: Mutex<Option<Artifact>>,
}

impl MonitoredBoard {
    pub(crate) fn new(inner: Arc<dyn Board>, monitor: SliceMonitor) -> Self {
        Self {
            inner,
            monitor,
            reference: Mutex::new(None),
        }
    }

    /// Run the reference kernel on this slice: `None` when it is right,
    /// else why it is not (then the slice is failing).
    async fn reference_failure(&self, cores: u32) -> Option<String> {
        let mut built = self.reference.lock().await;
        if built.is_none() {
            let kernel_dir =
                match mtswarm_hw::reference::write_reference_kernel(&self.monitor.reference_dir) {
                    Ok(dir) => dir,
                    // Nothing to compare with: the failure counts.
                    Err(e) => return Some(format!("the reference kernel cannot be written: {e}")),
                };
            let request = BuildRequest {
                kernel_dir,
                defines: Default::default(),
                out_dir: self.monitor.reference_dir.join("build"),
            };
            match self.inner.build(&request).await {
                Ok(artifact) => *built = Some(artifact),
                Err(e) => return Some(format!("the reference kernel does not build: {e}")),
            }
        }
        let artifact = built.as_ref()?;
        let request = RunRequest {
            cores: cores.clamp(1, self.inner.slice().cores.max(1)),
            runs: 1,
            timeout: REFERENCE_TIMEOUT,
            args: Vec::new(),
            seed: None,
        };
        let result = self.inner.run(artifact, &request).await;
        failure_of(&result).map(|reason| format!("the reference kernel fails too: {reason}"))
    }

    /// One more failed run of the slice in a row; reported when it reaches
    /// `quarantine_after`.
    fn count_failure(&self, reason: String) {
        let count = self
            .monitor
            .health
            .consecutive_failures
            .fetch_add(1, Ordering::SeqCst)
            + 1;
        tracing::warn!(
            slice.id = %self.monitor.bus_id,
            consecutive_failures = count,
            quarantine_after = self.monitor.quarantine_after,
            %reason,
            "hardware run failed"
        );
        if self.monitor.quarantine_after > 0 && count >= self.monitor.quarantine_after {
            let _ = self.monitor.reports.send(FailingSlice {
                slice_index: self.monitor.slice_index,
                consecutive_failures: count,
                reason,
            });
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
            &self.monitor.worker_id,
            &self.monitor.bus_id,
            outcome_label(&result),
        );
        match failure_of(&result) {
            None if result.is_ok() => self.monitor.health.reset(),
            None => {}
            Some(reason) => match self.reference_failure(request.cores).await {
                Some(reference) => self.count_failure(format!("{reason}; {reference}")),
                None => tracing::info!(
                    slice.id = %self.monitor.bus_id,
                    %reason,
                    "a candidate failed and the reference kernel passed on this slice: the \
                     failure is the candidate's, not the slice's"
                ),
            },
        }
        result
    }
}
