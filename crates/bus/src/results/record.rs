//! One measured candidate as stored: the record, its status vocabulary, its
//! provenance and the checks a record passes before it is stored.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::MAX_RECORD_ID_LEN;
use super::subject::{canonical_slice_id, measurement_subject};
use crate::error::BusError;
use crate::subjects;

/// Robust statistics of the timed executions, seconds (as measured by
/// `mtswarm_hw::measure`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResultStats {
    /// Number of timed executions the statistics cover.
    pub count: u64,
    /// Median execution time.
    pub median: f64,
    /// Mean without the smallest and largest sample.
    pub trimmed_mean: f64,
    /// Fastest execution.
    pub min: f64,
    /// Slowest execution.
    pub max: f64,
    /// Standard deviation of the execution times.
    pub stddev: f64,
}

/// One measured candidate with its full provenance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResultRecord {
    /// Unique per measurement; the deduplication key (`Nats-Msg-Id`).
    pub record_id: String,
    /// Job the measurement belongs to.
    pub job_id: String,
    /// Task (within the job) whose agent measured.
    pub task_id: String,
    /// Attempt number of the task, from 1; a reassigned task runs a later attempt.
    pub attempt: u32,
    /// Agent that asked for the measurement.
    pub agent_id: String,
    /// Worker session the agent ran in.
    pub session_id: String,
    /// Worker daemon that owns the slice.
    pub worker_id: String,
    /// Canonical id of the slice that ran the candidate.
    pub slice_id: String,
    /// `emulator`, `sdk` or `host`.
    pub backend: String,
    /// Compiler, version and flags that built the candidate, as the backend describes them.
    pub toolchain: String,
    /// Kernel name (the kernel directory's name, e.g. `dgemm`).
    pub kernel: String,
    /// Hash of the kernel source the candidate was built from.
    pub kernel_hash: String,
    /// The `-D` parameters of the candidate.
    pub params: BTreeMap<String, String>,
    /// DSP cores the candidate ran on.
    pub cores: u32,
    /// Seconds of every timed execution, in order.
    pub samples: Vec<f64>,
    /// Present when the measurement is valid.
    pub stats: Option<ResultStats>,
    /// Floating-point operations of one execution.
    pub flops: Option<u64>,
    /// Billions of floating-point operations per second at the median time (valid records only).
    pub gflops: Option<f64>,
    /// Fraction (0..1) of the modeled peak of the cores used.
    pub peak_fraction: Option<f64>,
    /// Baseline median time over this candidate's median (above 1 = faster than the baseline).
    pub speedup_over_baseline: Option<f64>,
    /// Every execution produced the right answer.
    pub valid: bool,
    /// Why the candidate is invalid.
    pub error: Option<String>,
    /// Reasons the figure is not believable (empty = plausible).
    pub flags: Vec<String>,
    /// Model that drove the session (`builtin` for the builtin policies).
    pub model: String,
    /// Wall time of all launches of the measurement (the slice was busy).
    pub wall_seconds: f64,
    /// When the measurement finished, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// What happened to the candidate; records written before statuses
    /// existed read as [`CandidateStatus::Unknown`] (see [`ResultRecord::status`]).
    pub status: CandidateStatus,
    /// Why the candidate has this status (compile error, pruning bound, ...).
    pub reason: Option<String>,
    /// Hash of the harness the candidate ran with (empty = not recorded).
    pub harness_hash: String,
    /// The figure is the kernel's tune.toml baseline (its default
    /// parameters), measured for this job on this kind of slice.
    pub baseline: bool,
    /// Unified diff of the kernel sources the candidate was built from
    /// against the pristine kernel its task started from; `None` when
    /// built from the pristine sources (and in records written before
    /// edits were recorded). At most [`MAX_SOURCE_DIFF_BYTES`]: a longer
    /// diff is cut at a line and ends with [`SOURCE_DIFF_TRUNCATED`].
    pub source_diff: Option<String>,
    /// Exact timing (the emulator): a spot re-run reproduced the figure,
    /// the same modeled cycles on the same inputs and a right answer on
    /// other inputs. Every figure that was its session's best when measured
    /// has one; `false` on real-timing backends (their repeats are the
    /// check) and in records written before it was recorded.
    pub reproduced: bool,
    /// The leader's placement grant of the attempt that measured
    /// (`TaskAssignment.grant`): with the worker's signature over the
    /// stored record (header `Mtswarm-Record-Signature`), it says which
    /// worker produced the record for which placement. `None` when the
    /// leader signs nothing (and in records written before grants).
    pub grant: Option<RecordGrant>,
}

/// [`crate::v1::PlacementGrant`] as a measurement record carries it (JSON;
/// the signature in hex).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordGrant {
    /// Job of the task.
    pub job_id: String,
    /// Task placed.
    pub task_id: String,
    /// Attempt placed.
    pub attempt: u32,
    /// Agent that runs it.
    pub agent_id: String,
    /// Session that runs it.
    pub session_id: String,
    /// Worker the session runs on.
    pub worker_id: String,
    /// Slice (bus form) the session runs on.
    pub slice_id: String,
    /// The worker's record key.
    pub worker_key: String,
    /// The leader's signature, hex.
    pub signature: String,
}

impl RecordGrant {
    /// The grant as a record carries it. It takes the grant apart field by
    /// field, so a field added to the grant's message does not compile
    /// until the record carries it too.
    pub fn of(grant: &crate::v1::PlacementGrant) -> Self {
        let crate::v1::PlacementGrant {
            job_id,
            task_id,
            attempt,
            agent_id,
            session_id,
            worker_id,
            slice_id,
            worker_key,
            signature,
        } = grant.clone();
        Self {
            job_id,
            task_id,
            attempt,
            agent_id,
            session_id,
            worker_id,
            slice_id,
            worker_key,
            signature: super::hex::encode(&signature),
        }
    }

    /// The grant itself (a signature that is not hex decodes to nothing,
    /// which no key verifies). The literal names every field of the grant,
    /// so it too does not compile when the message gains one.
    pub fn to_grant(&self) -> crate::v1::PlacementGrant {
        crate::v1::PlacementGrant {
            job_id: self.job_id.clone(),
            task_id: self.task_id.clone(),
            attempt: self.attempt,
            agent_id: self.agent_id.clone(),
            session_id: self.session_id.clone(),
            worker_id: self.worker_id.clone(),
            slice_id: self.slice_id.clone(),
            worker_key: self.worker_key.clone(),
            signature: super::hex::decode(&self.signature).unwrap_or_default(),
        }
    }
}

/// Longest [`ResultRecord::source_diff`] a record may carry.
pub const MAX_SOURCE_DIFF_BYTES: usize = 16 * 1024;

/// Starts the last line of a [`ResultRecord::source_diff`] that was cut.
pub const SOURCE_DIFF_TRUNCATED: &str = "\\ diff truncated: ";

/// What happened to one candidate an agent touched: one record per
/// candidate and status.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CandidateStatus {
    /// Written before statuses existed: judged by [`ResultRecord::status`].
    #[default]
    Unknown,
    /// Built, not run yet (the task ended before it got a slice).
    Compiled,
    /// Compilation failed (or the kernel failed static analysis).
    CompileFailed,
    /// Ran and produced a wrong answer (or crashed).
    Invalid,
    /// Ran with a right answer once (a screening validation), no benchmark.
    Screened,
    /// Not run: the roofline bound says it cannot beat the best so far.
    Pruned,
    /// Not run: the evaluation budget or the deadline ran out.
    NotRun,
    /// An execution exceeded its time limit.
    TimedOut,
    /// Benchmarked, but the figure is not believable (see `flags`).
    Flagged,
    /// Benchmarked with a valid, plausible figure.
    Benchmarked,
}

impl CandidateStatus {
    /// Every status, in the order reports list them.
    pub const ALL: [CandidateStatus; 10] = [
        CandidateStatus::Benchmarked,
        CandidateStatus::Flagged,
        CandidateStatus::Screened,
        CandidateStatus::Compiled,
        CandidateStatus::Pruned,
        CandidateStatus::NotRun,
        CandidateStatus::Invalid,
        CandidateStatus::CompileFailed,
        CandidateStatus::TimedOut,
        CandidateStatus::Unknown,
    ];

    /// The snake_case name used in JSON, CSV and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateStatus::Unknown => "unknown",
            CandidateStatus::Compiled => "compiled",
            CandidateStatus::CompileFailed => "compile_failed",
            CandidateStatus::Invalid => "invalid",
            CandidateStatus::Screened => "screened",
            CandidateStatus::Pruned => "pruned",
            CandidateStatus::NotRun => "not_run",
            CandidateStatus::TimedOut => "timed_out",
            CandidateStatus::Flagged => "flagged",
            CandidateStatus::Benchmarked => "benchmarked",
        }
    }

    /// Parses [`CandidateStatus::as_str`] names.
    pub fn parse(name: &str) -> Option<CandidateStatus> {
        Self::ALL.into_iter().find(|s| s.as_str() == name.trim())
    }
}

impl CandidateStatus {
    /// What happened to a candidate, from a candidate-shaped JSON object as
    /// agents write it: an explicit `status`, else `failure` (compile or
    /// analysis errors, time-outs, wrong answers), a `median_seconds`
    /// figure, `skipped` (pruned, screened only, not run), a screening
    /// time or a built `artifact`.
    pub fn of_candidate_json(candidate: &serde_json::Value) -> CandidateStatus {
        let text = |k: &str| candidate[k].as_str().unwrap_or_default();
        if let Some(status) = candidate["status"].as_str().and_then(Self::parse) {
            return status;
        }
        let failure = text("failure");
        if !failure.is_empty() {
            if failure.starts_with("compile") || failure.starts_with("analysis") {
                return CandidateStatus::CompileFailed;
            }
            if failure.contains("timed out") || failure.contains("timeout") {
                return CandidateStatus::TimedOut;
            }
            return CandidateStatus::Invalid;
        }
        if candidate["median_seconds"].as_f64().is_some() {
            return CandidateStatus::Benchmarked;
        }
        let skipped = text("skipped");
        if skipped.starts_with("pruned") {
            return CandidateStatus::Pruned;
        }
        if skipped.starts_with("screened") || candidate["screen_seconds"].as_f64().is_some() {
            return CandidateStatus::Screened;
        }
        if skipped.starts_with("not run") {
            return CandidateStatus::NotRun;
        }
        if candidate["artifact"].as_str().is_some() {
            return CandidateStatus::Compiled;
        }
        CandidateStatus::Unknown
    }
}

impl std::fmt::Display for CandidateStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ResultRecord {
    /// Whether the candidate was built from edited kernel sources.
    pub fn source_edited(&self) -> bool {
        self.source_diff.as_deref().is_some_and(|d| !d.is_empty())
    }

    /// Sets [`ResultRecord::source_diff`] (`None` for an empty diff), cut
    /// at a line to [`MAX_SOURCE_DIFF_BYTES`] with a marker saying so.
    pub fn with_source_diff(mut self, diff: Option<String>) -> Self {
        self.source_diff = diff.filter(|d| !d.is_empty()).map(bound_source_diff);
        self
    }

    /// Valid, unflagged and with a figure: fit to be called a best result.
    pub fn trustworthy(&self) -> bool {
        self.valid
            && self.flags.is_empty()
            && self.gflops.is_some_and(f64::is_finite)
            && matches!(
                self.status(),
                CandidateStatus::Benchmarked | CandidateStatus::Unknown
            )
    }

    /// The record's status; for records without one (older writers), what
    /// the measurement says: benchmarked, flagged or invalid.
    pub fn status(&self) -> CandidateStatus {
        match self.status {
            CandidateStatus::Unknown if self.stats.is_some() || !self.samples.is_empty() => {
                if !self.valid {
                    CandidateStatus::Invalid
                } else if !self.flags.is_empty() {
                    CandidateStatus::Flagged
                } else {
                    CandidateStatus::Benchmarked
                }
            }
            CandidateStatus::Unknown if !self.valid && self.error.is_some() => {
                CandidateStatus::Invalid
            }
            status => status,
        }
    }

    /// Builds a record from the JSON form of an `mtswarm_hw::measure::Measurement`
    /// (what the benchmark tool returns under `data.measurement`) or of the
    /// benchmark tool's failure summary. The bus does not depend on the
    /// hardware crate, so the conversion reads the serialized form; typed
    /// callers use `mtswarm_report::record_from_measurement`.
    pub fn from_measurement_json(
        measurement: &serde_json::Value,
        provenance: &Provenance,
    ) -> Result<ResultRecord, RecordError> {
        let view: MeasurementView = serde_json::from_value(measurement.clone())
            .map_err(|source| RecordError::NotAMeasurement { source })?;
        let record_id = provenance.record_id();
        validate_record_id(&record_id).map_err(|reason| RecordError::Invalid {
            record_id: record_id.clone(),
            reason,
        })?;
        let timestamp_ms = provenance.timestamp_ms.unwrap_or_else(|| {
            if view.finished_at > 0 {
                // Seconds resolution from the measurement; keep "now" when it
                // lies within that second, for sub-second ordering.
                let now = unix_millis(SystemTime::now());
                let start = view.finished_at.saturating_mul(1000);
                if (start..start + 1000).contains(&now) {
                    now
                } else {
                    start
                }
            } else {
                unix_millis(SystemTime::now())
            }
        });
        Ok(ResultRecord {
            record_id,
            job_id: provenance.job_id.clone(),
            task_id: provenance.task_id.clone(),
            attempt: provenance.attempt,
            agent_id: provenance.agent_id.clone(),
            session_id: provenance.session_id.clone(),
            worker_id: provenance.worker_id.clone(),
            slice_id: canonical_slice_id(if view.slice.is_empty() {
                &provenance.slice_id
            } else {
                &view.slice
            }),
            backend: view.backend,
            toolchain: view.toolchain,
            kernel: provenance.kernel.clone(),
            kernel_hash: view.kernel_hash,
            params: view.defines,
            cores: view.cores,
            samples: view.samples.into_iter().map(|s| s.seconds).collect(),
            stats: view.stats,
            flops: view.flops,
            gflops: view.gflops,
            peak_fraction: view.peak_fraction,
            speedup_over_baseline: view.speedup_over_baseline,
            valid: view.valid,
            error: view.error,
            flags: view.flags,
            model: if provenance.model.is_empty() {
                "builtin".to_string()
            } else {
                provenance.model.clone()
            },
            wall_seconds: view.wall_seconds,
            timestamp_ms,
            status: CandidateStatus::Unknown,
            reason: None,
            harness_hash: view.harness_hash,
            baseline: false,
            source_diff: None,
            reproduced: view.spot_checked,
            grant: provenance.grant.clone(),
        }
        .with_derived_status())
    }

    /// Fixes the status of a measurement record from what it says
    /// (benchmarked, flagged, invalid), with the error as the reason.
    pub fn with_derived_status(mut self) -> Self {
        self.status = self.status();
        if self.status == CandidateStatus::Unknown {
            self.status = if self.valid {
                CandidateStatus::Benchmarked
            } else {
                CandidateStatus::Invalid
            };
        }
        if self.reason.is_none() {
            self.reason = match self.status {
                CandidateStatus::Flagged => Some(self.flags.join("; ")),
                _ => self.error.clone(),
            };
        }
        self
    }

    /// Checks what the store relies on: a usable record id, a valid job id,
    /// and finite numbers (JSON cannot carry NaN or infinities).
    pub fn validate(&self) -> Result<(), BusError> {
        let invalid = |reason| BusError::InvalidId {
            kind: "result record",
            value: self.record_id.chars().take(MAX_RECORD_ID_LEN).collect(),
            reason,
        };
        validate_record_id(&self.record_id).map_err(invalid)?;
        subjects::validate_id("job id", &self.job_id)?;
        let optional = [self.gflops, self.peak_fraction, self.speedup_over_baseline];
        let stats = self
            .stats
            .iter()
            .flat_map(|s| [s.median, s.trimmed_mean, s.min, s.max, s.stddev]);
        let all_finite = self.samples.iter().all(|v| v.is_finite())
            && optional.iter().flatten().all(|v| v.is_finite())
            && stats.clone().all(f64::is_finite)
            && self.wall_seconds.is_finite();
        if !all_finite {
            return Err(invalid(
                "samples, statistics, gflops, peak_fraction and wall_seconds must be finite numbers",
            ));
        }
        if self
            .source_diff
            .as_ref()
            .is_some_and(|d| d.len() > MAX_SOURCE_DIFF_BYTES)
        {
            return Err(invalid(
                "source_diff is longer than 16 KiB (cut it with ResultRecord::with_source_diff)",
            ));
        }
        Ok(())
    }

    /// The subject this record is stored on.
    pub fn subject(&self) -> Result<String, BusError> {
        measurement_subject(
            &self.job_id,
            &self.kernel,
            &self.kernel_hash,
            &self.slice_id,
        )
    }
}

/// Who produced a measurement: everything a record needs that the
/// measurement itself does not say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Provenance {
    /// Job the measurement belongs to.
    pub job_id: String,
    /// Task (within the job) whose agent measured.
    pub task_id: String,
    /// Attempt number of the task, from 1.
    pub attempt: u32,
    /// Agent that asked for the measurement.
    pub agent_id: String,
    /// Worker session the agent ran in.
    pub session_id: String,
    /// Worker daemon that owns the slice.
    pub worker_id: String,
    /// Used when the measurement names no slice (a failure summary).
    pub slice_id: String,
    /// Kernel name (the kernel directory's name).
    pub kernel: String,
    /// Model name; empty = `builtin`.
    pub model: String,
    /// Id of the tool call that measured (unique within a task attempt).
    pub call_id: String,
    /// When the measurement finished; `None` = from the measurement (or now).
    pub timestamp_ms: Option<u64>,
    /// The attempt's placement grant, copied into every record.
    pub grant: Option<RecordGrant>,
}

impl Provenance {
    /// `<job_id>.<task_id>.<attempt>.<call_id>`: the same tool call of the
    /// same attempt is one record, however often it is published.
    pub fn record_id(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.job_id, self.task_id, self.attempt, self.call_id
        )
    }
}

/// Why a measurement could not become a record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The JSON is not shaped like a benchmark measurement.
    #[error("not a benchmark measurement: {source}")]
    NotAMeasurement {
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The record breaks a storage rule (see [`ResultRecord::validate`]).
    #[error("invalid result record {record_id:?}: {reason}")]
    Invalid {
        /// Id of the refused record.
        record_id: String,
        /// The rule it breaks.
        reason: &'static str,
    },
}

/// The serialized shape of `mtswarm_hw::measure::Measurement` as far as a
/// record needs it. Everything but `valid` is optional so the benchmark
/// tool's short failure summary converts too.
#[derive(Debug, Deserialize)]
struct MeasurementView {
    #[serde(default)]
    slice: String,
    #[serde(default)]
    backend: String,
    #[serde(default)]
    toolchain: String,
    #[serde(default)]
    kernel_hash: String,
    #[serde(default)]
    harness_hash: String,
    #[serde(default)]
    defines: BTreeMap<String, String>,
    #[serde(default)]
    cores: u32,
    valid: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    stats: Option<ResultStats>,
    #[serde(default)]
    flops: Option<u64>,
    #[serde(default)]
    gflops: Option<f64>,
    #[serde(default)]
    peak_fraction: Option<f64>,
    #[serde(default)]
    speedup_over_baseline: Option<f64>,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    samples: Vec<SampleView>,
    #[serde(default)]
    wall_seconds: f64,
    #[serde(default)]
    finished_at: u64,
    #[serde(default)]
    spot_checked: bool,
}

#[derive(Debug, Deserialize)]
struct SampleView {
    seconds: f64,
}

/// `diff` cut at a line so that it and the truncation marker fit in
/// [`MAX_SOURCE_DIFF_BYTES`] (unchanged when it fits).
fn bound_source_diff(diff: String) -> String {
    if diff.len() <= MAX_SOURCE_DIFF_BYTES {
        return diff;
    }
    let total = diff.len();
    // Room for the marker line and its figures.
    let mut cut = MAX_SOURCE_DIFF_BYTES - 96;
    while !diff.is_char_boundary(cut) {
        cut -= 1;
    }
    let cut = diff[..cut].rfind('\n').map_or(cut, |i| i + 1);
    format!(
        "{}{SOURCE_DIFF_TRUNCATED}{cut} of {total} bytes shown\n",
        &diff[..cut]
    )
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn validate_record_id(record_id: &str) -> Result<(), &'static str> {
    if record_id.is_empty() {
        return Err("the record id must not be empty");
    }
    if record_id.len() > MAX_RECORD_ID_LEN {
        return Err("the record id is longer than 512 characters");
    }
    if !record_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the record id may hold only printable ASCII without spaces");
    }
    Ok(())
}
