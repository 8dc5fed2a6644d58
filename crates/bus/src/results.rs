//! The results store: every measured candidate of every job, kept durably in
//! the JetStream stream `MTSWARM_MEASUREMENTS` so later sessions (and
//! reports) can learn from what was already tried. NATS is the system of
//! record; this module is the only way records enter or leave it.
//!
//! - Subject per record: `mtswarm.measurement.<job_id>.<kernel>.<hash16>.<slice>`
//!   (see [`measurement_subject`]). Job, kernel name, kernel-hash prefix and
//!   slice are subject tokens so [`ResultsStore::query`] lets the server filter
//!   on them; every other filter (full hash, backend, validity, time) is
//!   applied while scanning.
//! - Payload: one [`ResultRecord`] as JSON (serde) with the header
//!   `Content-Type: application/json; schema=mtswarm.ResultRecord.v1`. JSON
//!   rather than protobuf because records are exported as JSONL/CSV, read by
//!   people and scripts, and carry open-ended parameter maps; the bus
//!   messages that drive the system stay protobuf.
//! - `Nats-Msg-Id` = [`ResultRecord::record_id`], so a record published twice
//!   within the duplicate window (a retry after a lost ack, a resumed session)
//!   is stored once.
//! - Queries scan with an ordered consumer on the narrowest subject filter
//!   and keep at most `limit` records in memory.
//!
//! [`to_jsonl`] / [`to_csv`] export records for analysis; CSV flattens the
//! `-D` parameters into `param.<NAME>` columns.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{BufRead, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{self, DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

use crate::messaging::PublishReceipt;
use crate::subjects;
use crate::topology::TopologyConfig;
use crate::trace;
use crate::{Bus, BusError};

/// Content type of a stored result record.
pub const RESULT_RECORD_CONTENT_TYPE: &str = "application/json; schema=mtswarm.ResultRecord.v1";
/// Records a query returns when the caller does not say.
pub const DEFAULT_QUERY_LIMIT: usize = 1_000;
/// Largest `limit` a query accepts (the results are held in memory).
pub const MAX_QUERY_LIMIT: usize = 100_000;
/// Size cap of the measurements stream; the oldest records go first.
pub const MEASUREMENTS_MAX_BYTES: i64 = 4 << 30;
/// Largest single record (a record with 10,000 raw samples is ~250 KB).
pub const MEASUREMENT_MAX_RECORD_BYTES: i32 = 1 << 20;
/// Longest accepted record id.
pub const MAX_RECORD_ID_LEN: usize = 512;
/// Characters of the kernel hash used as a subject token.
const HASH_TOKEN_LEN: usize = 16;
/// Longest kernel or slice subject token.
const MAX_TOKEN_LEN: usize = 64;
/// A scan that receives nothing for this long while records are still
/// pending fails instead of hanging.
const SCAN_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Robust statistics of the timed executions, seconds (as measured by
/// `mtswarm_hw::measure`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResultStats {
    pub count: u64,
    pub median: f64,
    /// Mean without the smallest and largest sample.
    pub trimmed_mean: f64,
    pub min: f64,
    pub max: f64,
    pub stddev: f64,
}

/// One measured candidate with its full provenance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResultRecord {
    /// Unique per measurement; the deduplication key (`Nats-Msg-Id`).
    pub record_id: String,
    pub job_id: String,
    pub task_id: String,
    pub attempt: u32,
    pub agent_id: String,
    pub session_id: String,
    pub worker_id: String,
    pub slice_id: String,
    /// `emulator`, `sdk` or `host`.
    pub backend: String,
    pub toolchain: String,
    /// Kernel name (the kernel directory's name, e.g. `dgemm`).
    pub kernel: String,
    /// Hash of the kernel source the candidate was built from.
    pub kernel_hash: String,
    /// The `-D` parameters of the candidate.
    pub params: BTreeMap<String, String>,
    pub cores: u32,
    /// Seconds of every timed execution, in order.
    pub samples: Vec<f64>,
    /// Present when the measurement is valid.
    pub stats: Option<ResultStats>,
    /// Floating-point operations of one execution.
    pub flops: Option<u64>,
    pub gflops: Option<f64>,
    /// Fraction (0..1) of the modeled peak of the cores used.
    pub peak_fraction: Option<f64>,
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
}

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
    CompileFailed,
    /// Ran and produced a wrong answer (or crashed).
    Invalid,
    /// Ran with a right answer once (a screening validation), no benchmark.
    Screened,
    /// Not run: the roofline bound says it cannot beat the best so far.
    Pruned,
    /// Not run: the evaluation budget or the deadline ran out.
    NotRun,
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

/// The one spelling of a slice id in records and outputs: the bus form,
/// every character outside `[A-Za-z0-9_-]` replaced by `-` (`board0/c1` ->
/// `board0-c1`). Inputs in either spelling go through this.
pub fn canonical_slice_id(slice: &str) -> String {
    slice
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

impl ResultRecord {
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
    pub job_id: String,
    pub task_id: String,
    pub attempt: u32,
    pub agent_id: String,
    pub session_id: String,
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
    #[error("not a benchmark measurement: {source}")]
    NotAMeasurement {
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid result record {record_id:?}: {reason}")]
    Invalid {
        record_id: String,
        reason: &'static str,
    },
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("writing results: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding results as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("encoding results as CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("line {line} of the JSONL input is not a result record: {source}")]
    BadLine {
        line: usize,
        #[source]
        source: serde_json::Error,
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
}

#[derive(Debug, Deserialize)]
struct SampleView {
    seconds: f64,
}

/// Filters of [`ResultsStore::query`]. Every `Some` narrows the result.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultQuery {
    pub job_id: Option<String>,
    /// Kernel name.
    pub kernel: Option<String>,
    /// Full kernel hash, or a prefix of at least 4 characters.
    pub kernel_hash: Option<String>,
    pub slice: Option<String>,
    pub backend: Option<String>,
    /// Only valid measurements.
    pub valid_only: bool,
    /// Only records with one of these statuses (empty = every status).
    pub statuses: Vec<CandidateStatus>,
    /// Only records measured at or after this instant.
    pub since: Option<SystemTime>,
    /// At most this many records: the most recently stored matches, in
    /// stream (storage) order.
    pub limit: usize,
}

impl Default for ResultQuery {
    fn default() -> Self {
        Self {
            job_id: None,
            kernel: None,
            kernel_hash: None,
            slice: None,
            backend: None,
            valid_only: false,
            statuses: Vec::new(),
            since: None,
            limit: DEFAULT_QUERY_LIMIT,
        }
    }
}

impl ResultQuery {
    fn check(&self) -> Result<(), BusError> {
        if self.limit == 0 || self.limit > MAX_QUERY_LIMIT {
            return Err(BusError::InvalidId {
                kind: "query limit",
                value: self.limit.to_string(),
                reason: "must be between 1 and 100000",
            });
        }
        if let Some(job_id) = &self.job_id {
            subjects::validate_id("job id", job_id)?;
        }
        if let Some(hash) = &self.kernel_hash
            && hash.len() < 4
        {
            return Err(BusError::InvalidId {
                kind: "kernel hash",
                value: hash.clone(),
                reason: "give at least 4 characters of the hash",
            });
        }
        Ok(())
    }

    /// The narrowest subject filter the server can apply.
    fn filter_subject(&self) -> String {
        let job = self.job_id.as_deref().unwrap_or("*");
        let kernel = self.kernel.as_deref().map_or("*".to_string(), token);
        // A hash shorter than the token can only be matched while scanning.
        let hash = match &self.kernel_hash {
            Some(h) if h.len() >= HASH_TOKEN_LEN => hash_token(h),
            _ => "*".to_string(),
        };
        let slice = self
            .slice
            .as_deref()
            .map_or("*".to_string(), |s| token(&canonical_slice_id(s)));
        if job == "*" && kernel == "*" && hash == "*" && slice == "*" {
            return subjects::ALL_MEASUREMENTS.to_string();
        }
        format!(
            "{}.measurement.{job}.{kernel}.{hash}.{slice}",
            subjects::PREFIX
        )
    }

    /// Whether `record` passes every filter (the subject filter already
    /// narrowed by token; this is exact).
    pub fn matches(&self, record: &ResultRecord) -> bool {
        let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        same(&self.job_id, &record.job_id)
            && same(&self.kernel, &record.kernel)
            && self
                .slice
                .as_deref()
                .is_none_or(|s| canonical_slice_id(s) == canonical_slice_id(&record.slice_id))
            && same(&self.backend, &record.backend)
            && self
                .kernel_hash
                .as_deref()
                .is_none_or(|h| record.kernel_hash.starts_with(h))
            && (!self.valid_only || record.valid)
            && (self.statuses.is_empty() || self.statuses.contains(&record.status()))
            && self
                .since
                .is_none_or(|since| record.timestamp_ms >= unix_millis(since))
    }
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

/// A kernel name or slice id as a subject token: characters outside
/// `[A-Za-z0-9_-]` become `_` (so `board0/c1` is `board0_c1`), at most 64
/// characters, `none` when empty. Distinct names may share a token; queries
/// compare the exact values after the server's filter.
pub fn token(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .take(MAX_TOKEN_LEN)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "none".to_string()
    } else {
        cleaned
    }
}

fn hash_token(hash: &str) -> String {
    token(&hash.chars().take(HASH_TOKEN_LEN).collect::<String>())
}

/// `mtswarm.measurement.<job_id>.<kernel>.<hash16>.<slice>` (kernel, hash
/// prefix and slice as [`token`]s).
pub fn measurement_subject(
    job_id: &str,
    kernel: &str,
    kernel_hash: &str,
    slice_id: &str,
) -> Result<String, BusError> {
    subjects::validate_id("job id", job_id)?;
    Ok(format!(
        "{}.measurement.{job_id}.{}.{}.{}",
        subjects::PREFIX,
        token(kernel),
        hash_token(kernel_hash),
        // Both spellings of a slice share its token (queries canonicalize).
        token(&canonical_slice_id(slice_id))
    ))
}

/// The measurements stream as [`Bus::ensure_topology`] creates it: limits
/// retention without an age limit (the history is what later jobs learn
/// from), capped in size with the oldest records dropped first, and
/// deduplicated by record id within the topology's duplicate window.
pub fn measurements_stream_config(config: &TopologyConfig) -> stream::Config {
    stream::Config {
        name: subjects::MEASUREMENTS_STREAM.to_string(),
        description: Some("mtswarm measured candidates (results store)".to_string()),
        subjects: vec![subjects::ALL_MEASUREMENTS.to_string()],
        retention: stream::RetentionPolicy::Limits,
        storage: config.storage,
        num_replicas: config.replicas,
        duplicate_window: config.duplicate_window,
        max_bytes: MEASUREMENTS_MAX_BYTES,
        max_message_size: MEASUREMENT_MAX_RECORD_BYTES,
        discard: stream::DiscardPolicy::Old,
        ..Default::default()
    }
}

/// Durable store of measured candidates over the measurements stream.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct ResultsStore {
    bus: Bus,
}

fn scan_error(source: impl Into<crate::error::NatsSource>) -> BusError {
    BusError::Consumer {
        stream: subjects::MEASUREMENTS_STREAM.to_string(),
        consumer: "ordered scan".to_string(),
        source: source.into(),
    }
}

impl ResultsStore {
    /// Opens the store, creating the measurements stream with the default
    /// topology settings when [`Bus::ensure_topology`] has not run yet.
    pub async fn open(bus: &Bus) -> Result<ResultsStore, BusError> {
        bus.jetstream()
            .get_or_create_stream(measurements_stream_config(&TopologyConfig::default()))
            .await
            .map_err(|source| BusError::Topology {
                what: format!("stream {}", subjects::MEASUREMENTS_STREAM),
                source: source.into(),
            })?;
        Ok(ResultsStore { bus: bus.clone() })
    }

    /// Stores `record` and returns its stream sequence (that of the first
    /// copy when the record id was stored before, within the duplicate window).
    pub async fn record(&self, record: &ResultRecord) -> Result<u64, BusError> {
        Ok(self.record_with_receipt(record).await?.sequence)
    }

    /// Like [`ResultsStore::record`], also telling whether the stream dropped
    /// the publish as a duplicate.
    pub async fn record_with_receipt(
        &self,
        record: &ResultRecord,
    ) -> Result<PublishReceipt, BusError> {
        record.validate()?;
        let subject = record.subject()?;
        let payload = serde_json::to_vec(record).map_err(|source| BusError::Publish {
            subject: subject.clone(),
            source: source.into(),
        })?;
        let mut headers = HeaderMap::new();
        headers.insert(
            crate::codec::CONTENT_TYPE_HEADER,
            RESULT_RECORD_CONTENT_TYPE,
        );
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            record.record_id.as_str(),
        );
        trace::inject_current(&mut headers);
        let publish = PublishMessage::build()
            .payload(payload.into())
            .headers(headers);
        let publish_error = |source: crate::error::NatsSource| BusError::Publish {
            subject: subject.clone(),
            source,
        };
        let ack = self
            .bus
            .jetstream()
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|e| publish_error(e.into()))?
            .await
            .map_err(|e| publish_error(e.into()))?;
        Ok(PublishReceipt {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Records matching `query` in stream (storage) order; when more than
    /// `query.limit` match, the most recently stored `limit` of them. The
    /// scan reads every record under the query's subject filter, so narrow
    /// queries (job, kernel, slice) are the cheap ones.
    pub async fn query(&self, query: &ResultQuery) -> Result<Vec<ResultRecord>, BusError> {
        query.check()?;
        let mut kept: VecDeque<ResultRecord> = VecDeque::with_capacity(query.limit.min(1024));
        self.scan(query, |record| {
            if kept.len() == query.limit {
                kept.pop_front();
            }
            kept.push_back(record);
        })
        .await?;
        Ok(kept.into())
    }

    /// The `n` best trustworthy records of `kernel` (valid, unflagged, with a
    /// GFLOPS figure), highest GFLOPS first, over every job.
    pub async fn best_for_kernel(
        &self,
        kernel: &str,
        n: usize,
    ) -> Result<Vec<ResultRecord>, BusError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let query = ResultQuery {
            kernel: Some(kernel.to_string()),
            valid_only: true,
            limit: n,
            ..Default::default()
        };
        query.check()?;
        let mut best: Vec<ResultRecord> = Vec::new();
        self.scan(&query, |record| {
            if !record.trustworthy() {
                return;
            }
            best.push(record);
            // Trim in batches: memory stays within 2n, sorting amortized.
            if best.len() >= 2 * n.max(1) {
                best.sort_by(by_gflops_desc);
                best.truncate(n);
            }
        })
        .await?;
        best.sort_by(by_gflops_desc);
        best.truncate(n);
        Ok(best)
    }

    /// Feeds every record matching `query` to `visit`, in stream order.
    /// Records that do not decode are logged and skipped: one bad record
    /// must not hide the rest of the history.
    async fn scan(
        &self,
        query: &ResultQuery,
        mut visit: impl FnMut(ResultRecord),
    ) -> Result<(), BusError> {
        let stream = self
            .bus
            .jetstream()
            .get_stream_no_info(subjects::MEASUREMENTS_STREAM)
            .await
            .map_err(scan_error)?;
        let consumer: consumer::Consumer<pull::OrderedConfig> = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: query.filter_subject(),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(scan_error)?;
        if consumer.cached_info().num_pending == 0 {
            return Ok(());
        }
        let mut messages = consumer.messages().await.map_err(scan_error)?;
        loop {
            let next = tokio::time::timeout(SCAN_IDLE_TIMEOUT, messages.next())
                .await
                .map_err(|_| {
                    scan_error(format!(
                        "no record arrived for {SCAN_IDLE_TIMEOUT:?} while the scan was incomplete"
                    ))
                })?;
            let Some(message) = next else {
                return Ok(());
            };
            let message = message.map_err(scan_error)?;
            let pending = message.info().map(|info| info.pending).unwrap_or(0);
            match decode_record(&message.subject, message.headers.as_ref(), &message.payload) {
                Ok(record) if query.matches(&record) => visit(record),
                Ok(_) => {}
                Err(reason) => {
                    tracing::warn!(subject = %message.subject, %reason, "skipping undecodable result record")
                }
            }
            if pending == 0 {
                return Ok(());
            }
        }
    }
}

fn by_gflops_desc(a: &ResultRecord, b: &ResultRecord) -> std::cmp::Ordering {
    let figure = |r: &ResultRecord| r.gflops.unwrap_or(f64::NEG_INFINITY);
    figure(b).total_cmp(&figure(a))
}

fn decode_record(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<ResultRecord, String> {
    if let Some(found) = headers.and_then(|h| h.get(crate::codec::CONTENT_TYPE_HEADER))
        && found.as_str() != RESULT_RECORD_CONTENT_TYPE
    {
        return Err(format!(
            "content type {:?} on {subject}, expected {RESULT_RECORD_CONTENT_TYPE:?}",
            found.as_str()
        ));
    }
    serde_json::from_slice(payload).map_err(|e| format!("not a result record: {e}"))
}

/// Writes one JSON object per line.
pub fn to_jsonl(records: &[ResultRecord], mut out: impl Write) -> Result<(), ExportError> {
    for record in records {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads records written by [`to_jsonl`] (blank lines are skipped).
pub fn read_jsonl(input: impl BufRead) -> Result<Vec<ResultRecord>, ExportError> {
    let mut records = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line).map_err(|source| ExportError::BadLine {
            line: index + 1,
            source,
        })?;
        records.push(record);
    }
    Ok(records)
}

/// Fixed CSV columns, before the `param.<NAME>` columns.
pub const CSV_COLUMNS: &[&str] = &[
    "record_id",
    "job_id",
    "task_id",
    "attempt",
    "agent_id",
    "session_id",
    "worker_id",
    "slice_id",
    "backend",
    "toolchain",
    "kernel",
    "kernel_hash",
    "model",
    "timestamp_ms",
    "valid",
    "error",
    "flags",
    "cores",
    "count",
    "median_s",
    "trimmed_mean_s",
    "min_s",
    "max_s",
    "stddev_s",
    "flops",
    "gflops",
    "peak_fraction",
    "speedup_over_baseline",
    "wall_seconds",
    "samples_s",
    "status",
    "reason",
    "harness_hash",
    "baseline",
];

/// Writes a header and one row per record: the [`CSV_COLUMNS`], then one
/// `param.<NAME>` column per parameter name found in any record (sorted;
/// empty where a record lacks it). Flags are joined with `; `, samples with
/// spaces; absent figures are empty cells.
pub fn to_csv(records: &[ResultRecord], out: impl Write) -> Result<(), ExportError> {
    let param_names: BTreeSet<&str> = records
        .iter()
        .flat_map(|r| r.params.keys().map(String::as_str))
        .collect();
    let mut writer = csv::Writer::from_writer(out);
    let header = CSV_COLUMNS
        .iter()
        .map(|c| (*c).to_string())
        .chain(param_names.iter().map(|name| format!("param.{name}")));
    writer.write_record(header)?;
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in records {
        let stat = |pick: fn(&ResultStats) -> f64| opt(r.stats.as_ref().map(pick));
        let mut row: Vec<String> = vec![
            r.record_id.clone(),
            r.job_id.clone(),
            r.task_id.clone(),
            r.attempt.to_string(),
            r.agent_id.clone(),
            r.session_id.clone(),
            r.worker_id.clone(),
            r.slice_id.clone(),
            r.backend.clone(),
            r.toolchain.clone(),
            r.kernel.clone(),
            r.kernel_hash.clone(),
            r.model.clone(),
            r.timestamp_ms.to_string(),
            r.valid.to_string(),
            r.error.clone().unwrap_or_default(),
            r.flags.join("; "),
            r.cores.to_string(),
            r.stats
                .as_ref()
                .map(|s| s.count.to_string())
                .unwrap_or_default(),
            stat(|s| s.median),
            stat(|s| s.trimmed_mean),
            stat(|s| s.min),
            stat(|s| s.max),
            stat(|s| s.stddev),
            r.flops.map(|f| f.to_string()).unwrap_or_default(),
            opt(r.gflops),
            opt(r.peak_fraction),
            opt(r.speedup_over_baseline),
            r.wall_seconds.to_string(),
            r.samples
                .iter()
                .map(f64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            r.status().as_str().to_string(),
            r.reason.clone().unwrap_or_default(),
            r.harness_hash.clone(),
            r.baseline.to_string(),
        ];
        row.extend(
            param_names
                .iter()
                .map(|name| r.params.get(*name).cloned().unwrap_or_default()),
        );
        writer.write_record(&row)?;
    }
    writer.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn provenance() -> Provenance {
        Provenance {
            job_id: "job1".into(),
            task_id: "t1".into(),
            attempt: 2,
            agent_id: "a1".into(),
            session_id: "s1".into(),
            worker_id: "w1".into(),
            kernel: "dgemm".into(),
            call_id: "call-7".into(),
            timestamp_ms: Some(1_700_000_000_123),
            ..Default::default()
        }
    }

    #[test]
    fn measurement_json_becomes_a_record_with_provenance() {
        let measurement = json!({
            "slice": "board0/c1", "backend": "emulator", "toolchain": "gcc 14",
            "kernel_hash": "abcdef0123456789abcdef", "defines": {"TILE": "64"},
            "cores": 24, "valid": true, "error": null, "failed_validation": false,
            "stats": {"count": 3, "median": 0.5, "trimmed_mean": 0.5, "min": 0.4,
                      "max": 0.6, "stddev": 0.08},
            "flops": 1000, "gflops": 2.0, "peak_fraction": 0.25,
            "speedup_over_baseline": null, "flags": [], "deterministic": true,
            "samples": [{"valid": true, "error": null, "modeled_cycles": 10,
                         "seconds": 0.4, "max_abs_err": null,
                         "counters": {"flops": 1000}}],
            "launches": 3, "wall_seconds": 1.5, "finished_at": 1_700_000_000u64
        });
        let record =
            ResultRecord::from_measurement_json(&measurement, &provenance()).expect("converts");
        assert_eq!(record.record_id, "job1.t1.2.call-7");
        // One spelling: the bus form.
        assert_eq!(record.slice_id, "board0-c1");
        assert_eq!(record.params.get("TILE").map(String::as_str), Some("64"));
        assert_eq!(record.samples, vec![0.4]);
        assert_eq!(record.model, "builtin");
        assert_eq!(record.timestamp_ms, 1_700_000_000_123);
        assert_eq!(
            record.subject().expect("subject"),
            "mtswarm.measurement.job1.dgemm.abcdef0123456789.board0-c1"
        );
        let error = ResultRecord::from_measurement_json(&json!({"gflops": 1}), &provenance())
            .expect_err("no valid field");
        assert!(error.to_string().contains("valid"), "{error}");
    }

    #[test]
    fn benchmark_failure_summary_becomes_an_invalid_record() {
        // What the benchmark tool returns when a launch times out.
        let summary = json!({
            "artifact": "b3", "kernel_hash": "0123abcd", "defines": {"TILE": "4096"},
            "valid": false, "error": "launch timed out after 120s",
        });
        let mut provenance = provenance();
        provenance.slice_id = "board2/c0".into();
        let record = ResultRecord::from_measurement_json(&summary, &provenance).expect("converts");
        assert!(!record.valid && !record.trustworthy());
        assert_eq!(record.slice_id, "board2-c0");
        assert_eq!(record.error.as_deref(), Some("launch timed out after 120s"));
        assert_eq!(record.params.get("TILE").map(String::as_str), Some("4096"));
        assert!(record.stats.is_none() && record.gflops.is_none());
        record.validate().expect("storable");
    }

    #[test]
    fn filter_subject_narrows_by_tokens_only_when_exact() {
        let query = ResultQuery {
            kernel: Some("dgemm".into()),
            kernel_hash: Some("abcd".into()),
            slice: Some("b0/c1".into()),
            ..Default::default()
        };
        assert_eq!(
            query.filter_subject(),
            "mtswarm.measurement.*.dgemm.*.b0-c1"
        );
        assert_eq!(
            ResultQuery::default().filter_subject(),
            subjects::ALL_MEASUREMENTS
        );
    }

    #[test]
    fn non_finite_numbers_and_bad_ids_are_rejected() {
        let mut record = ResultRecord {
            record_id: "r1".into(),
            job_id: "job1".into(),
            gflops: Some(f64::NAN),
            ..Default::default()
        };
        assert!(record.validate().is_err());
        record.gflops = Some(1.0);
        record.validate().expect("valid");
        record.record_id = "has space".into();
        assert!(record.validate().is_err());
        record.record_id = "r1".into();
        record.job_id = "a.b".into();
        assert!(record.validate().is_err());
    }
}
