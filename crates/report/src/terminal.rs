//! The report as terminal tables (comfy-table): what a person running
//! `mtswarm` sees at the end of a job.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};

use crate::{JobReport, params_label, units};

/// `9 considered: 6 measured (5 benchmarked, 4 valid), 3 not run`: the
/// job's counts in the words every output uses (see [`crate::candidates`]);
/// a search that prunes most of a space says so instead of counting what it
/// never ran.
pub(crate) fn counts_line(report: &JobReport) -> String {
    let not_run = report
        .counts
        .candidates_considered
        .saturating_sub(report.counts.candidates_measured);
    format!(
        "{} considered: {} measured ({} benchmarked, {} valid), {not_run} not run (pruned, skipped or not built)",
        report.counts.candidates_considered,
        report.counts.candidates_measured,
        report.counts.candidates_benchmarked,
        report.counts.valid_candidates
    )
}

fn percent(fraction: Option<f64>) -> String {
    fraction
        .map(|f| format!("{:.1}%", f * 100.0))
        .unwrap_or_else(|| "-".to_string())
}

fn table() -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table
}

pub(crate) fn render(report: &JobReport) -> String {
    let mut summary = table();
    summary.set_header(vec!["job", report.job_id.as_str()]);
    let best = report.best.as_ref();
    let rows: Vec<(&str, String)> = vec![
        ("kernel", report.kernel.clone()),
        (
            "best GFLOPS",
            best.map(|b| format!("{:.2}", b.gflops))
                .unwrap_or_else(|| "no valid candidate".to_string()),
        ),
        ("% of peak", percent(best.and_then(|b| b.peak_fraction))),
        (
            "best params",
            best.map(|b| params_label(&b.params))
                .unwrap_or_else(|| "-".to_string()),
        ),
        (
            "best source",
            best.map(crate::Candidate::source_label)
                .unwrap_or_else(|| "-".to_string()),
        ),
        (
            "baseline GFLOPS",
            report
                .baseline
                .as_ref()
                .map(|b| format!("{:.2} ({})", b.gflops, b.description))
                .unwrap_or_else(|| "-".to_string()),
        ),
        (
            "speedup over naive",
            report
                .speedup_over_naive()
                .map(|s| format!("{s:.2}x"))
                .unwrap_or_else(|| "-".to_string()),
        ),
        ("candidates", counts_line(report)),
        (
            "best median time",
            best.and_then(|b| b.median_seconds)
                .map(units::seconds)
                .unwrap_or_else(|| "-".to_string()),
        ),
        ("wall time", units::wall_time(report.wall_seconds())),
    ];
    for (name, value) in rows {
        summary.add_row(vec![name.to_string(), value]);
    }

    let mut slices = table();
    slices.set_header(vec!["slice", "utilization"]);
    for (slice, share) in &report.slice_utilization {
        slices.add_row(vec![slice.clone(), percent(Some(*share))]);
    }

    let groups = report.status_groups();
    let mut statuses = table();
    statuses.set_header(vec!["status", "candidates", "most frequent reason"]);
    for group in &groups {
        statuses.add_row(vec![
            group.status.as_str().to_string(),
            group.count.to_string(),
            group
                .reasons
                .first()
                .map(|(reason, n)| format!("{n}: {reason}"))
                .unwrap_or_else(|| "-".to_string()),
        ]);
    }
    if let Some(column) = statuses.column_mut(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }

    let mut top = table();
    top.set_header(vec![
        "#",
        "GFLOPS",
        "% of peak",
        "median",
        "params",
        "slice",
        "agent",
    ]);
    for (i, c) in report.top.iter().enumerate() {
        top.add_row(vec![
            (i + 1).to_string(),
            format!("{:.2}", c.gflops),
            percent(c.peak_fraction),
            c.median_seconds
                .map(units::seconds)
                .unwrap_or_else(|| "-".to_string()),
            params_label(&c.params),
            c.slice.clone(),
            c.agent.clone(),
        ]);
    }
    for column in [1, 2, 3] {
        if let Some(column) = top.column_mut(column) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }

    let mut out = summary.to_string();
    if !report.slice_utilization.is_empty() {
        out.push('\n');
        out.push_str(&slices.to_string());
    }
    if !groups.is_empty() {
        out.push_str("\ncandidates by status\n");
        out.push_str(&statuses.to_string());
    }
    if !report.top.is_empty() {
        out.push_str("\ntop candidates\n");
        out.push_str(&top.to_string());
    }
    out.push('\n');
    out
}
