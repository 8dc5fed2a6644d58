//! The demo's end: the job's report (the one `mtswarm report JOB` writes,
//! with the demo's baseline and the slices' busy intervals from the job's
//! events), written as HTML, and its summary printed: a table and a few
//! lines for people, or one JSON object.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, bail};
use mtswarm_bus::results::ResultRecord;
use mtswarm_hw::ChipSpec;
use mtswarm_proto::v1;
use mtswarm_report::{BusyInterval, Candidate, JobReport, ReportSummary};
use serde_json::json;

use super::baseline::BaselineFigure;
use super::progress::JobObservation;
use super::utilization::{UTILIZATION_DEFINITION, phase_utilization, tuning_phases};
use super::{DemoCmd, DemoPlan};

/// A job the demo ran to its end: its record, its results-store records,
/// what its events showed, and the baseline measured beside it.
pub(super) struct Finished {
    pub(super) job_id: String,
    pub(super) job: v1::JobRecord,
    pub(super) records: Vec<ResultRecord>,
    pub(super) seen: JobObservation,
    pub(super) baseline: BaselineFigure,
}

/// Write the job's report and print its summary; fails when the job found
/// no valid benchmark.
pub(super) fn report(
    cmd: &DemoCmd,
    plan: &DemoPlan,
    spec: &ChipSpec,
    finished: &Finished,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let (report, phases) = job_report(plan, spec, finished);
    let Some(best) = report.best.clone() else {
        bail!(
            "job {} recorded {} candidate record(s) but none was a valid benchmark",
            finished.job_id,
            finished.records.len()
        );
    };
    let report_path = match &cmd.report {
        Some(path) => path.clone(),
        None => std::env::current_dir()
            .context("locating the current directory")?
            .join(format!("mtswarm-demo-{}.html", finished.job_id)),
    };
    let report_path = report.write_html(&report_path)?;
    let report_path = report_path.canonicalize().unwrap_or(report_path);
    let summary = report.summary(Some(&report_path));
    let elapsed = started.elapsed().as_secs_f64();
    let end = DemoEnd {
        to_best: time_to_best(&finished.records, Some(best.gflops), started),
        to_first: time_to_best(&finished.records, None, started),
        report,
        summary,
        best,
        phases,
        report_path,
        elapsed,
    };
    if cmd.json {
        end.print_json(plan, finished)?;
    } else {
        end.print_text(finished);
    }
    Ok(ExitCode::SUCCESS)
}

/// The report of the job, every slice of the fleet in it, and each slice's
/// tuning phase (first to last ms its lock was held; none without busy
/// intervals).
fn job_report(
    plan: &DemoPlan,
    spec: &ChipSpec,
    finished: &Finished,
) -> (JobReport, BTreeMap<String, (u64, u64)>) {
    let seen = &finished.seen;
    let mut report = crate::report::job_report(
        &finished.job,
        &finished.records,
        Some(finished.baseline.baseline.clone()),
    );
    report.with_kernel_model(&plan.space, spec);
    for slice in &plan.slices {
        report.slice_utilization.entry(slice.clone()).or_insert(0.0);
    }
    if seen.busy.is_empty() {
        return (report, BTreeMap::new());
    }
    // The lock-holding intervals of every hardware tool (compile
    // included when it takes the lock).
    let first_busy = seen
        .busy
        .iter()
        .map(|b| b.start_ms)
        .min()
        .unwrap_or_default();
    let start = seen
        .first_assignment_ms
        .map_or(first_busy, |a| a.min(first_busy));
    let end = seen
        .last_result_ms
        .unwrap_or_else(|| seen.busy.iter().map(|b| b.end_ms).max().unwrap_or(start));
    report.busy = seen
        .busy
        .iter()
        .map(|interval| BusyInterval {
            slice: mtswarm_bus::results::canonical_slice_id(&interval.slice),
            ..interval.clone()
        })
        .collect();
    // The timeline spans the whole job; utilization is per slice, over
    // its own tuning phase.
    report.started_at_ms = start;
    report.finished_at_ms = end;
    let phases = tuning_phases(&report.busy);
    let mut utilization = phase_utilization(&report.busy, &phases);
    for slice in &plan.slices {
        utilization.entry(slice.clone()).or_insert(0.0);
    }
    report.slice_utilization = utilization;
    (report, phases)
}

/// The report written, and the figures the demo adds to its summary.
struct DemoEnd {
    report: JobReport,
    summary: ReportSummary,
    best: Candidate,
    phases: BTreeMap<String, (u64, u64)>,
    report_path: PathBuf,
    /// Seconds since the demo started.
    elapsed: f64,
    /// Seconds from the demo's start to the best's first trustworthy record.
    to_best: Option<f64>,
    /// Seconds from the demo's start to the first trustworthy record.
    to_first: Option<f64>,
}

impl DemoEnd {
    /// One JSON object: the report's summary and the demo's figures.
    fn print_json(&self, plan: &DemoPlan, finished: &Finished) -> anyhow::Result<()> {
        let phase_seconds: BTreeMap<&str, f64> = self
            .phases
            .iter()
            .map(|(slice, (from, to))| (slice.as_str(), to.saturating_sub(*from) as f64 / 1000.0))
            .collect();
        let mut value = serde_json::to_value(&self.summary)?;
        value["elapsed_seconds"] = json!(self.elapsed);
        value["time_to_best_seconds"] = json!(self.to_best);
        value["time_to_first_result_seconds"] = json!(self.to_first);
        // What the job cost in model terms (leader and agents together).
        value["usage"] = json!(finished.job.usage.as_ref().map(|u| json!({
            "steps": u.steps,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
        })));
        value["baseline_source"] = json!(finished.baseline.source);
        value["slices"] = json!(plan.slices);
        value["candidates_assigned"] = json!(assigned(finished));
        value["tuning_phase_seconds"] = json!(phase_seconds);
        value["utilization_definition"] = json!(UTILIZATION_DEFINITION);
        println!("{value}");
        Ok(())
    }

    /// The report's table, then the best, the speedup, the candidates, the
    /// slices' utilization and where the report is.
    fn print_text(&self, finished: &Finished) {
        let (report, best, baseline) = (&self.report, &self.best, &finished.baseline);
        println!();
        println!("{}", report.render_terminal());
        println!(
            "best: {} -> {:.1} GFLOPS ({:.1} % of peak) on {}{}",
            mtswarm_report::params_label(&best.params),
            best.gflops,
            best.peak_fraction.unwrap_or_default() * 100.0,
            best.slice,
            if best.reproduced {
                ", reproduced by a spot re-run"
            } else {
                ""
            }
        );
        if let Some(speedup) = self.summary.speedup_over_naive {
            println!(
                "speedup over the naive kernel: {speedup:.1}x (baseline {:.2} GFLOPS; {})",
                baseline.baseline.gflops, baseline.source
            );
        }
        println!(
            "candidates: {} assigned, {} (considered: any record; measured: ran on a slice; benchmarked: timed run; valid: right answer, unflagged)",
            assigned(finished),
            report.counts_line()
        );
        let utilization = &report.slice_utilization;
        let lowest = utilization.iter().min_by(|a, b| a.1.total_cmp(b.1));
        if let Some((slice, share)) = lowest {
            let mean = utilization.values().sum::<f64>() / utilization.len() as f64;
            println!(
                "slice utilization ({UTILIZATION_DEFINITION}): lowest {:.1} % ({slice}), mean {:.1} %",
                share * 100.0,
                mean * 100.0
            );
        }
        if let Some(seconds) = self.to_best {
            println!(
                "best found {} after the demo started",
                mtswarm_report::units::wall_time(seconds)
            );
        }
        println!("HTML report: {}", self.report_path.display());
        println!(
            "demo finished in {}",
            mtswarm_report::units::wall_time(self.elapsed)
        );
    }
}

/// Candidates the leader assigned to the agents. Evaluated, benchmarked
/// and valid come from the records (one per candidate and status), as in
/// `mtswarm report`.
fn assigned(finished: &Finished) -> u64 {
    finished.seen.agents.values().map(|a| a.assigned).sum()
}

/// Seconds from `started` (the demo's start) to the first trustworthy
/// record as fast as the best (`best_gflops`): when the system had its
/// answer's figure, which a side-by-side comparison with a sweep needs (the
/// job itself goes on to confirm it and to rule the rest out). Another
/// configuration with the same figure counts: a landscape may tie (the
/// emulator's modeled time is exact, and several micro-kernel shapes can
/// take the same cycles), and which of the ties the job names is a
/// tie-break, not when it was found. With `best_gflops` `None`, to the
/// first trustworthy record of any candidate (what starting up cost).
fn time_to_best(
    records: &[ResultRecord],
    best_gflops: Option<f64>,
    started: Instant,
) -> Option<f64> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    let start_ms = u64::try_from(now_ms.saturating_sub(started.elapsed().as_millis())).ok()?;
    first_record_at_least(records, best_gflops)
        .map(|ms| ms.saturating_sub(start_ms) as f64 / 1000.0)
}

/// Timestamp (ms) of the first trustworthy record whose figure is at least
/// `gflops` (any, without it).
fn first_record_at_least(records: &[ResultRecord], gflops: Option<f64>) -> Option<u64> {
    records
        .iter()
        .filter(|r| {
            !r.baseline
                && r.trustworthy()
                && gflops.is_none_or(|best| r.gflops.is_some_and(|g| g >= best))
        })
        .map(|r| r.timestamp_ms)
        .min()
}

#[cfg(test)]
mod tests {
    use mtswarm_bus::results::{CandidateStatus, ResultStats};

    use super::*;

    fn record(params: &str, gflops: f64, timestamp_ms: u64) -> ResultRecord {
        ResultRecord {
            params: BTreeMap::from([("MR".to_owned(), params.to_owned())]),
            status: CandidateStatus::Benchmarked,
            valid: true,
            gflops: Some(gflops),
            stats: Some(ResultStats {
                count: 1,
                median: 1.0 / gflops,
                ..ResultStats::default()
            }),
            timestamp_ms,
            ..ResultRecord::default()
        }
    }

    #[test]
    fn the_best_is_found_when_its_figure_first_is_even_by_another_configuration() {
        let mut flagged = record("9", 300.0, 1_000);
        flagged.flags.push("faster than the roofline".to_owned());
        let records = [
            flagged,
            record("4", 100.0, 2_000),
            // A tie of the best, found first: the job had its answer then.
            record("8", 200.0, 3_000),
            record("6", 200.0, 9_000),
        ];
        assert_eq!(first_record_at_least(&records, Some(200.0)), Some(3_000));
        assert_eq!(first_record_at_least(&records, None), Some(2_000));
        assert_eq!(first_record_at_least(&records, Some(250.0)), None);
    }
}
