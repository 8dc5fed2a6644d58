//! mtswarm-report: what a tuning job achieved, for people and for scripts.
//!
//! A [`JobReport`] gathers a job's outcome (best parameters, GFLOPS, share of
//! the modeled peak, the naive baseline and the speedup over it, how many
//! candidates were considered, measured, benchmarked and valid, how busy each slice was)
//! together with what is behind it (every candidate with its status and
//! reason, every measurement, every interval a slice's hardware was busy).
//! Build one from the results store's records with
//! [`JobReport::from_records`], or fill the fields directly; give it the
//! kernel's tune.toml and chip model with [`JobReport::with_kernel_model`]
//! for the parameter axes in tune.toml order and the roofline. Then:
//!
//! - [`JobReport::render_terminal`]: tables for a terminal (comfy-table);
//! - [`JobReport::render_html`] / [`JobReport::write_html`]: one
//!   self-contained XHTML file (no scripts, no network) with inline SVG plots
//!   (best-so-far GFLOPS over time, GFLOPS against each parameter, the
//!   roofline, a per-slice timeline of hardware use), the candidates by
//!   status with their reasons, every benchmarked candidate and the summary;
//! - [`JobReport::summary`]: the [`ReportSummary`] serde struct that
//!   `mtswarm demo --json` prints.
//!
//! Counts use one vocabulary everywhere (see [`candidates`]): *evaluated*
//! candidates have any record, *benchmarked* ones a timed run, *valid* ones
//! are benchmarked with the right answer and no plausibility flag.
//!
//! [`record_from_measurement`] turns a typed hardware measurement into a
//! results-store record (the bus crate cannot depend on the hardware crate).

pub mod candidates;
mod html;
pub mod kernel_tuner;
mod model;
mod roofline_svg;
mod scatter_svg;
mod svg;
mod terminal;
pub mod units;

pub use candidates::{CandidateCounts, CandidateEntry, StatusGroup};
pub use model::{ParameterAxis, Roofline, RooflinePoint};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mtswarm_bus::ResultRecord;
use mtswarm_bus::results::{Provenance, RecordError};
use mtswarm_hw::tune::TuneSpace;
use mtswarm_hw::{ChipSpec, Measurement};
use serde::{Deserialize, Serialize};

/// Candidates listed in the top-candidates table when the caller does not say.
pub const DEFAULT_TOP: usize = 10;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Writing the report file failed.
    #[error("cannot write report {path}: {source}")]
    Io {
        /// The report file.
        path: PathBuf,
        /// Why writing failed.
        #[source]
        source: std::io::Error,
    },
}

/// A measured configuration worth showing (the best one, or a top one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Candidate {
    /// The `-D` parameters.
    pub params: BTreeMap<String, String>,
    /// Measured GFLOPS (at the median time).
    pub gflops: f64,
    /// Fraction (0..1) of the modeled peak of the cores used.
    pub peak_fraction: Option<f64>,
    /// Median of the timed executions, seconds; `None` when not recorded.
    pub median_seconds: Option<f64>,
    /// Slice it was measured on.
    pub slice: String,
    /// Agent that measured it.
    pub agent: String,
    /// Hash of the kernel source it was built from.
    pub kernel_hash: String,
    /// Diff of its kernel sources against the pristine kernel; `None` when
    /// built from the pristine kernel.
    pub source_diff: Option<String>,
    /// Exact timing: a spot re-run reproduced its figure (see
    /// [`ResultRecord::reproduced`]).
    pub reproduced: bool,
}

impl Candidate {
    /// Built from kernel sources an agent edited.
    pub fn source_edited(&self) -> bool {
        self.source_diff.as_deref().is_some_and(|d| !d.is_empty())
    }

    /// `edited: kernel.c +12 -3 (kernel 0123456789ab)` or `pristine kernel`.
    pub fn source_label(&self) -> String {
        match self.source_diff.as_deref().filter(|d| !d.is_empty()) {
            Some(diff) => format!(
                "edited: {} (kernel {})",
                diff_stat(diff),
                self.kernel_hash.chars().take(12).collect::<String>()
            ),
            None => "pristine kernel".to_string(),
        }
    }
}

/// `kernel.c +12 -3`: the files a unified diff changes and its added and
/// removed lines.
pub fn diff_stat(diff: &str) -> String {
    let (mut files, mut added, mut removed) = (Vec::new(), 0, 0);
    for line in diff.lines() {
        if let Some(file) = line.strip_prefix("+++ ") {
            let file = file.trim();
            files.push(file.strip_prefix("b/").unwrap_or(file).to_string());
        } else if line.starts_with('+') {
            added += 1;
        } else if line.starts_with('-') && !line.starts_with("--- ") {
            removed += 1;
        }
    }
    format!("{} +{added} -{removed}", files.join(", "))
}

/// The reference the speedup is measured against (the naive kernel).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Baseline {
    /// The baseline's measured GFLOPS.
    pub gflops: f64,
    /// Its `-D` parameters (the tune.toml defaults).
    pub params: BTreeMap<String, String>,
    /// Where the figure comes from, e.g. "naive kernel".
    pub description: String,
}

/// One measurement on the time axis.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MeasurementPoint {
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Slice it was measured on.
    pub slice: String,
    /// Agent that measured it.
    pub agent: String,
    /// Present for trustworthy measurements.
    pub gflops: Option<f64>,
    /// Every execution produced the right answer.
    pub valid: bool,
    /// The candidate's `-D` parameters.
    pub params: BTreeMap<String, String>,
}

/// An interval during which a slice's hardware was busy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BusyInterval {
    /// The busy slice.
    pub slice: String,
    /// Milliseconds since the Unix epoch.
    pub start_ms: u64,
    /// Milliseconds since the Unix epoch; not before `start_ms`.
    pub end_ms: u64,
    /// Agent whose measurement kept it busy.
    pub agent: String,
    /// What ran, e.g. the candidate's parameters.
    pub label: String,
}

/// Everything a report shows about one job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobReport {
    /// The job's id.
    pub job_id: String,
    /// Kernel name (the kernel directory's name).
    pub kernel: String,
    /// The goal the job was submitted with; empty when not known (records
    /// do not carry it, the caller fills it from the job).
    pub goal: String,
    /// Window of the job, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// End of the job's window, milliseconds since the Unix epoch.
    pub finished_at_ms: u64,
    /// Fastest trustworthy candidate; `None` when none produced one.
    pub best: Option<Candidate>,
    /// What the speedup is measured against; `None` when no baseline was measured.
    pub baseline: Option<Baseline>,
    /// How many distinct candidates were considered, measured,
    /// benchmarked and valid (flattened: the fields stand at the top level).
    #[serde(flatten)]
    pub counts: CandidateCounts,
    /// Slice id -> share (0..1) of the job's window its hardware was busy.
    pub slice_utilization: BTreeMap<String, f64>,
    /// Best first (at most [`DEFAULT_TOP`]).
    pub top: Vec<Candidate>,
    /// Every distinct candidate (see [`candidates::fold`] for the order).
    pub candidates: Vec<CandidateEntry>,
    /// The x axes of the GFLOPS-per-parameter plots.
    pub parameters: Vec<ParameterAxis>,
    /// Present when the kernel's tune.toml has a `[model]` table.
    pub roofline: Option<Roofline>,
    /// Why the roofline is missing or what it leaves out.
    pub roofline_note: Option<String>,
    /// Every measurement, for the plots over time.
    pub measurements: Vec<MeasurementPoint>,
    /// Every interval a slice's hardware was busy, for the timeline and utilization.
    pub busy: Vec<BusyInterval>,
}

/// The machine-readable outcome of a job (`mtswarm demo --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportSummary {
    /// The job's id.
    pub job_id: String,
    /// Kernel name (the kernel directory's name).
    pub kernel: String,
    /// `null` when no candidate produced a trustworthy figure.
    pub best: Option<BestSummary>,
    /// `null` when no baseline was measured.
    pub baseline: Option<BaselineSummary>,
    /// best.gflops / baseline.gflops.
    pub speedup_over_naive: Option<f64>,
    /// How many distinct candidates were considered, measured,
    /// benchmarked and valid (flattened: the fields stand at the top level).
    #[serde(flatten)]
    pub counts: CandidateCounts,
    /// Status name -> distinct candidates (every candidate counted once, by
    /// its most telling record).
    pub candidates_by_status: BTreeMap<String, u64>,
    /// Slice id -> 0..1.
    pub slice_utilization: BTreeMap<String, f64>,
    /// Length of the job's window (first to last busy interval), seconds.
    pub wall_seconds: f64,
    /// The HTML report, when one was written.
    pub report_path: Option<String>,
}

/// The best candidate in a [`ReportSummary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestSummary {
    /// The `-D` parameters.
    pub params: BTreeMap<String, String>,
    /// Measured GFLOPS.
    pub gflops: f64,
    /// Fraction (0..1) of the modeled peak of the cores used.
    pub peak_fraction: Option<f64>,
    /// Slice it was measured on.
    pub slice: String,
    /// Hash of the kernel source it was built from.
    pub kernel_hash: String,
    /// Built from kernel sources an agent edited (see `source_diff`).
    #[serde(default)]
    pub source_edited: bool,
    /// Diff of those sources against the pristine kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_diff: Option<String>,
    /// Exact timing: a spot re-run reproduced its figure.
    #[serde(default)]
    pub reproduced: bool,
}

/// The baseline in a [`ReportSummary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineSummary {
    /// The baseline's measured GFLOPS.
    pub gflops: f64,
    /// Its `-D` parameters.
    pub params: BTreeMap<String, String>,
    /// Where the figure comes from, e.g. "naive kernel".
    pub description: String,
}

/// Turns a typed measurement into a results-store record.
pub fn record_from_measurement(
    measurement: &Measurement,
    provenance: &Provenance,
) -> Result<ResultRecord, RecordError> {
    let value = serde_json::to_value(measurement)
        .map_err(|source| RecordError::NotAMeasurement { source })?;
    ResultRecord::from_measurement_json(&value, provenance)
}

fn candidate_of(record: &ResultRecord) -> Candidate {
    Candidate {
        params: record.params.clone(),
        gflops: record.gflops.unwrap_or_default(),
        peak_fraction: record.peak_fraction,
        median_seconds: record.stats.as_ref().map(|s| s.median),
        slice: record.slice_id.clone(),
        agent: record.agent_id.clone(),
        kernel_hash: record.kernel_hash.clone(),
        source_diff: record.source_diff.clone().filter(|d| !d.is_empty()),
        reproduced: record.reproduced,
    }
}

/// Share of `[start_ms, end_ms)` covered by each slice's busy intervals
/// (overlapping intervals of one slice count once), clamped to 0..1.
pub fn slice_utilization(
    busy: &[BusyInterval],
    start_ms: u64,
    end_ms: u64,
) -> BTreeMap<String, f64> {
    let mut per_slice: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for interval in busy {
        let from = interval.start_ms.max(start_ms);
        let to = interval.end_ms.min(end_ms);
        per_slice
            .entry(interval.slice.as_str())
            .or_default()
            .extend((to > from).then_some((from, to)));
    }
    let window = end_ms.saturating_sub(start_ms);
    per_slice
        .into_iter()
        .map(|(slice, mut spans)| {
            spans.sort_unstable();
            let mut covered = 0u64;
            let mut current: Option<(u64, u64)> = None;
            for (from, to) in spans {
                current = match current {
                    Some((a, b)) if from <= b => Some((a, b.max(to))),
                    Some((a, b)) => {
                        covered += b - a;
                        Some((from, to))
                    }
                    None => Some((from, to)),
                };
            }
            if let Some((a, b)) = current {
                covered += b - a;
            }
            let share = if window == 0 {
                0.0
            } else {
                (covered as f64 / window as f64).clamp(0.0, 1.0)
            };
            (slice.to_string(), share)
        })
        .collect()
}

/// The timed runs, for the best-so-far plot: a pruned or screened
/// candidate has no figure to plot, and would read as a failed measurement.
fn measurement_points(records: &[&ResultRecord]) -> Vec<MeasurementPoint> {
    records
        .iter()
        .filter(|r| candidates::timed(r))
        .map(|r| MeasurementPoint {
            timestamp_ms: r.timestamp_ms,
            slice: r.slice_id.clone(),
            agent: r.agent_id.clone(),
            gflops: r.trustworthy().then_some(r.gflops).flatten(),
            valid: r.valid,
            params: r.params.clone(),
        })
        .collect()
}

/// Each record's `wall_seconds` on its slice, ending at its timestamp.
fn busy_intervals(records: &[&ResultRecord]) -> Vec<BusyInterval> {
    records
        .iter()
        .filter(|r| r.wall_seconds > 0.0)
        .map(|r| {
            let wall_ms = (r.wall_seconds * 1000.0).round() as u64;
            BusyInterval {
                slice: r.slice_id.clone(),
                start_ms: r.timestamp_ms.saturating_sub(wall_ms),
                end_ms: r.timestamp_ms,
                agent: r.agent_id.clone(),
                label: params_label(&r.params),
            }
        })
        .collect()
}

/// From the first busy start (or record) to the last busy end (or record).
fn window(busy: &[BusyInterval], records: &[&ResultRecord]) -> (u64, u64) {
    let started_at_ms = busy
        .iter()
        .map(|b| b.start_ms)
        .chain(records.iter().map(|r| r.timestamp_ms))
        .min()
        .unwrap_or_default();
    let finished_at_ms = busy
        .iter()
        .map(|b| b.end_ms)
        .chain(records.iter().map(|r| r.timestamp_ms))
        .max()
        .unwrap_or_default();
    (started_at_ms, finished_at_ms)
}

/// The best [`DEFAULT_TOP`] of the trustworthy records, best first: one per
/// distinct (kernel hash, parameters), its best figure kept.
fn top_candidates(trustworthy: &[&ResultRecord]) -> Vec<Candidate> {
    let mut distinct: BTreeMap<(String, Vec<(String, String)>), Candidate> = BTreeMap::new();
    for r in trustworthy {
        let key = (
            r.kernel_hash.clone(),
            r.params
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        let candidate = candidate_of(r);
        match distinct.get(&key) {
            Some(kept) if kept.gflops >= candidate.gflops => {}
            _ => {
                distinct.insert(key, candidate);
            }
        }
    }
    let mut top: Vec<Candidate> = distinct.into_values().collect();
    top.sort_by(|a, b| b.gflops.total_cmp(&a.gflops));
    top.truncate(DEFAULT_TOP);
    top
}

/// The baseline the records hold: the tune.toml baseline when one was
/// measured, else the earliest trustworthy record without parameters (the
/// naive kernel), else none.
fn reference_baseline(
    marked: Option<&ResultRecord>,
    trustworthy: &[&ResultRecord],
) -> Option<Baseline> {
    let naive = trustworthy.iter().copied().find(|r| r.params.is_empty());
    let (record, description) = match (marked, naive) {
        (Some(r), _) => (r, "tune.toml baseline"),
        (None, Some(r)) => (r, "naive kernel (no parameters)"),
        (None, None) => return None,
    };
    Some(Baseline {
        gflops: record.gflops.unwrap_or_default(),
        params: record.params.clone(),
        description: description.to_string(),
    })
}

impl JobReport {
    /// A report of one job from its results-store records (any order).
    ///
    /// - Measurements (the best-so-far plot): the timed runs.
    /// - Busy intervals: each record's `wall_seconds` ending at its timestamp.
    /// - Window: from the first busy start (or record) to the last one.
    /// - Best and top: trustworthy records (valid, unflagged, with a figure),
    ///   one entry per distinct (kernel hash, parameters), best figure kept.
    /// - Baseline: `baseline` when given; otherwise the earliest trustworthy
    ///   record marked as the tune.toml baseline, else the earliest one
    ///   without parameters (the naive kernel), else none.
    /// - Candidates: one per distinct (kernel hash, parameters), counted as
    ///   considered / measured / benchmarked / valid (see [`candidates`]); the parameter
    ///   axes are those that vary among the benchmarked ones until
    ///   [`JobReport::with_kernel_model`] gives the tune.toml ones.
    /// - `slices`: every slice of the job, so idle ones show with 0.
    pub fn from_records(
        job_id: &str,
        kernel: &str,
        records: &[ResultRecord],
        baseline: Option<Baseline>,
        slices: &[String],
    ) -> JobReport {
        let mut all_records: Vec<&ResultRecord> = records.iter().collect();
        all_records.sort_by_key(|r| r.timestamp_ms);
        // The tune.toml baseline is the reference the candidates are
        // compared with, not one of them: it only keeps its slice busy.
        let marked_baseline = all_records
            .iter()
            .copied()
            .find(|r| r.baseline && r.trustworthy());
        let records: Vec<&ResultRecord> = all_records
            .iter()
            .copied()
            .filter(|r| !r.baseline)
            .collect();

        let measurements = measurement_points(&records);
        let busy = busy_intervals(&all_records);
        let (started_at_ms, finished_at_ms) = window(&busy, &all_records);
        let trustworthy: Vec<&ResultRecord> = records
            .iter()
            .copied()
            .filter(|r| r.trustworthy())
            .collect();
        let top = top_candidates(&trustworthy);
        // Only a real reference: a speed-up over "the first candidate that
        // happened to run" says nothing.
        let baseline = baseline.or_else(|| reference_baseline(marked_baseline, &trustworthy));

        let mut slice_utilization = slice_utilization(&busy, started_at_ms, finished_at_ms);
        for slice in slices
            .iter()
            .cloned()
            .chain(records.iter().map(|r| r.slice_id.clone()))
        {
            slice_utilization.entry(slice).or_insert(0.0);
        }

        let candidates = candidates::fold(&records);
        JobReport {
            job_id: job_id.to_string(),
            kernel: kernel.to_string(),
            goal: String::new(),
            started_at_ms,
            finished_at_ms,
            best: top.first().cloned(),
            baseline,
            counts: CandidateCounts::of(&candidates),
            slice_utilization,
            top,
            parameters: model::derived_axes(&candidates),
            candidates,
            roofline: None,
            roofline_note: Some(
                "no roofline: the report was made without the kernel's tune.toml".to_string(),
            ),
            measurements,
            busy,
        }
    }

    /// Adds what the kernel's tune.toml and the chip model know: the
    /// parameter axes in tune.toml order and the roofline of the valid
    /// candidates (compute roof: modeled peak of the cores they ran on;
    /// memory roof: those cores' DDR bandwidth share; intensity: the
    /// `[model]` flops over bytes). Without a `[model]` table the roofline
    /// is left out with a note.
    pub fn with_kernel_model(&mut self, space: &TuneSpace, spec: &ChipSpec) -> &mut Self {
        self.parameters = model::space_axes(space, &self.candidates);
        let best = self.best_entry().cloned();
        let (roofline, note) = model::roofline(space, spec, &self.candidates, best.as_ref());
        self.roofline = roofline;
        self.roofline_note = note;
        self
    }

    /// The candidate entry of the best, if any.
    pub fn best_entry(&self) -> Option<&CandidateEntry> {
        let best = self.best.as_ref()?;
        self.candidates
            .iter()
            .find(|c| c.valid && c.params == best.params && c.kernel_hash == best.kernel_hash)
    }

    /// Is `entry` the best candidate?
    pub fn is_best(&self, entry: &CandidateEntry) -> bool {
        self.best.as_ref().is_some_and(|b| {
            entry.valid && b.params == entry.params && b.kernel_hash == entry.kernel_hash
        })
    }

    /// `9 considered: 6 measured (5 benchmarked, 4 valid), 3 not run`: the counts in the words every
    /// output uses.
    pub fn counts_line(&self) -> String {
        terminal::counts_line(self)
    }

    /// The candidates by status with their reasons.
    pub fn status_groups(&self) -> Vec<StatusGroup> {
        candidates::status_groups(&self.candidates)
    }

    /// best.gflops / baseline.gflops, when both exist and the baseline is positive.
    pub fn speedup_over_naive(&self) -> Option<f64> {
        let best = self.best.as_ref()?;
        let baseline = self.baseline.as_ref()?;
        (baseline.gflops > 0.0 && best.gflops.is_finite()).then(|| best.gflops / baseline.gflops)
    }

    /// Seconds between the start and the end of the job's window.
    pub fn wall_seconds(&self) -> f64 {
        self.finished_at_ms.saturating_sub(self.started_at_ms) as f64 / 1000.0
    }

    /// Every slice the report knows of: utilization keys and busy intervals.
    pub fn slices(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self
            .slice_utilization
            .keys()
            .map(String::as_str)
            .chain(self.busy.iter().map(|b| b.slice.as_str()))
            .collect();
        set.into_iter().map(str::to_string).collect()
    }

    /// The JSON summary; `report_path` names the HTML report if one was written.
    pub fn summary(&self, report_path: Option<&Path>) -> ReportSummary {
        ReportSummary {
            job_id: self.job_id.clone(),
            kernel: self.kernel.clone(),
            best: self.best.as_ref().map(|b| BestSummary {
                params: b.params.clone(),
                gflops: b.gflops,
                peak_fraction: b.peak_fraction,
                slice: b.slice.clone(),
                kernel_hash: b.kernel_hash.clone(),
                source_edited: b.source_edited(),
                source_diff: b.source_diff.clone(),
                reproduced: b.reproduced,
            }),
            baseline: self.baseline.as_ref().map(|b| BaselineSummary {
                gflops: b.gflops,
                params: b.params.clone(),
                description: b.description.clone(),
            }),
            speedup_over_naive: self.speedup_over_naive(),
            counts: self.counts,
            candidates_by_status: self
                .status_groups()
                .into_iter()
                .map(|g| (g.status.as_str().to_string(), g.count))
                .collect(),
            slice_utilization: self.slice_utilization.clone(),
            wall_seconds: self.wall_seconds(),
            report_path: report_path.map(|p| p.display().to_string()),
        }
    }

    /// Tables for a terminal: the summary, slice utilization, top candidates.
    pub fn render_terminal(&self) -> String {
        terminal::render(self)
    }

    /// The self-contained HTML report (well-formed XHTML).
    pub fn render_html(&self) -> String {
        html::render(self)
    }

    /// Writes the HTML report to `path` (creating parent directories) and
    /// returns the path.
    pub fn write_html(&self, path: impl AsRef<Path>) -> Result<PathBuf, ReportError> {
        let path = path.as_ref().to_path_buf();
        let io_error = |source| ReportError::Io {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io_error)?;
        }
        std::fs::write(&path, self.render_html()).map_err(io_error)?;
        Ok(path)
    }
}

/// `A=1 B=2`, or `(defaults)` without parameters.
pub fn params_label(params: &BTreeMap<String, String>) -> String {
    if params.is_empty() {
        return "(defaults)".to_string();
    }
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}
