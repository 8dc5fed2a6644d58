//! The report as one self-contained HTML file: inline CSS and inline SVG,
//! no script and nothing fetched, so it opens anywhere (a CI artifact, an
//! air-gapped laptop). It is written as well-formed XHTML so any XML parser
//! can check it. Every candidate is on the page: counted by status with
//! the reasons of those not benchmarked, and each benchmarked one in a
//! table (a few hundred rows stay usable: plain rows, no script).

use std::fmt::Write as _;

use mtswarm_core::clock::format_rfc3339;

use crate::candidates::CandidateEntry;
use crate::svg::{self, escape};
use crate::{JobReport, params_label, roofline_svg, scatter_svg, units};

/// Reasons listed per status group; the rest are counted.
const REASONS_SHOWN: usize = 3;

const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 960px; }
h1 { font-size: 1.5em; }
h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
.plot { background: #fff; border: 1px solid #ddd; }
.plot .axis { stroke: #444; stroke-width: 1; }
.plot .tick { stroke: #444; }
.plot .grid { stroke: #eee; }
.plot .tick-label, .plot .lane-label { font-size: 11px; fill: #444; }
.plot .axis-title { font-size: 12px; fill: #222; }
.plot .best-so-far { fill: none; stroke: #d55e00; stroke-width: 2; }
.plot .baseline { stroke: #888; stroke-dasharray: 4 3; }
.plot .baseline-label { font-size: 11px; fill: #666; }
.plot .point.invalid { fill: none; stroke: #c00; stroke-width: 1.5; }
.plot .lane { fill: #f6f6f6; stroke: #e4e4e4; }
.plot .busy { opacity: 0.85; }
.plot .empty { font-size: 13px; fill: #888; }
.plot .point { fill: #0072b2; fill-opacity: 0.6; }
.plot .point.best { fill: #d55e00; fill-opacity: 1; stroke: #000; stroke-width: 1.5; }
.plot .category-best { stroke: #009e73; stroke-width: 2; }
.plot .roof { fill: none; stroke: #444; stroke-width: 2; }
.plot .roof-label, .plot .best-label { font-size: 11px; fill: #444; }
.small-multiples { display: flex; flex-wrap: wrap; gap: 8px; }
tr.best td { font-weight: bold; background: #fff4e5; }
p.note, p.definitions { color: #555; font-size: 0.9em; }
td.reason { font-size: 0.9em; }
";

fn row(out: &mut String, name: &str, value: &str) {
    let _ = write!(
        out,
        "<tr><th scope=\"row\">{}</th><td>{}</td></tr>",
        escape(name),
        escape(value)
    );
}

fn percent(fraction: Option<f64>) -> String {
    fraction
        .map(|f| format!("{:.1}%", f * 100.0))
        .unwrap_or_else(|| "-".to_string())
}

pub(crate) fn render(report: &JobReport) -> String {
    let mut out = String::new();
    head(&mut out, report);
    summary_section(&mut out, report);
    best_source_section(&mut out, report);
    status_section(&mut out, report);
    best_so_far_section(&mut out, report);
    parameters_section(&mut out, report);
    roofline_section(&mut out, report);
    timeline_section(&mut out, report);
    top_section(&mut out, report);
    benchmarked_section(&mut out, report);
    others_section(&mut out, report);
    out.push_str("</body>\n</html>\n");
    out
}

/// The document's head and the page's title: the kernel, the job, its goal.
fn head(out: &mut String, report: &JobReport) {
    out.push_str("<!DOCTYPE html>\n");
    out.push_str("<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n");
    out.push_str("<meta charset=\"utf-8\"/>\n");
    let _ = writeln!(
        out,
        "<title>mtswarm report: {} ({})</title>",
        escape(&report.kernel),
        escape(&report.job_id)
    );
    let _ = writeln!(out, "<style>{STYLE}</style>\n</head>\n<body>");
    let _ = writeln!(
        out,
        "<h1>Tuning report: {} <small>job {}</small></h1>",
        escape(&report.kernel),
        escape(&report.job_id)
    );
    if !report.goal.trim().is_empty() {
        let _ = writeln!(out, "<p class=\"goal\">{}</p>", escape(&report.goal));
    }
}

/// `table#summary`: the best, the baseline, the counts, the window and each
/// slice's utilization, with what the counts count.
fn summary_section(out: &mut String, report: &JobReport) {
    out.push_str("<h2>Summary</h2>\n<table id=\"summary\"><tbody>");
    let best = report.best.as_ref();
    row(
        out,
        "best GFLOPS",
        &best
            .map(|b| format!("{:.2}", b.gflops))
            .unwrap_or_else(|| "no valid candidate".to_string()),
    );
    row(
        out,
        "% of peak",
        &percent(best.and_then(|b| b.peak_fraction)),
    );
    row(
        out,
        "best params",
        &best
            .map(|b| params_label(&b.params))
            .unwrap_or_else(|| "-".to_string()),
    );
    row(
        out,
        "best source",
        &best
            .map(crate::Candidate::source_label)
            .unwrap_or_else(|| "-".to_string()),
    );
    row(
        out,
        "baseline GFLOPS",
        &report
            .baseline
            .as_ref()
            .map(|b| format!("{:.2} ({})", b.gflops, b.description))
            .unwrap_or_else(|| "-".to_string()),
    );
    row(
        out,
        "speedup over naive",
        &report
            .speedup_over_naive()
            .map(|s| format!("{s:.2}x"))
            .unwrap_or_else(|| "-".to_string()),
    );
    row(out, "candidates", &crate::terminal::counts_line(report));
    row(
        out,
        "best median time",
        &best
            .and_then(|b| b.median_seconds)
            .map(units::seconds)
            .unwrap_or_else(|| "-".to_string()),
    );
    row(
        out,
        "window",
        &format!(
            "{} to {} ({})",
            format_rfc3339(report.started_at_ms),
            format_rfc3339(report.finished_at_ms),
            units::wall_time(report.wall_seconds())
        ),
    );
    for (slice, share) in &report.slice_utilization {
        row(out, &format!("utilization {slice}"), &percent(Some(*share)));
    }
    out.push_str("</tbody></table>\n");
    let _ = writeln!(out, "<p class=\"definitions\">{}</p>", escape(DEFINITIONS));
}

/// `pre#best-source-diff`: the best's edited source, when an agent wrote it.
fn best_source_section(out: &mut String, report: &JobReport) {
    let best = report.best.as_ref();
    if let Some(diff) = best.and_then(|b| b.source_diff.as_deref()) {
        out.push_str("<h2>The best's edited source</h2>\n<pre id=\"best-source-diff\">");
        out.push_str(&escape(diff));
        out.push_str(
            "</pre>\n<p class=\"definitions\">The best candidate was built from kernel sources an agent wrote: the unified diff against the pristine kernel the task started from. The harness (host.c, tune.toml, the reference) was the pristine one.</p>\n",
        );
    }
}

/// The best GFLOPS so far, over every timed run.
fn best_so_far_section(out: &mut String, report: &JobReport) {
    out.push_str("<h2>Best GFLOPS so far</h2>\n<figure>");
    out.push_str(&svg::best_so_far(report));
    out.push_str(
        "<figcaption>Each point is one timed run (hollow red: wrong answer or flagged); the line is the best trustworthy figure so far.</figcaption></figure>\n",
    );
}

/// Hardware use per slice over the job.
fn timeline_section(out: &mut String, report: &JobReport) {
    out.push_str("<h2>Hardware use per slice</h2>\n<figure>");
    out.push_str(&svg::slice_timeline(report));
    out.push_str(
        "<figcaption>Each bar is one interval during which the slice's hardware was busy, colored by agent.</figcaption></figure>\n",
    );
}

/// `table#top-candidates`: the trustworthy candidates, best first.
fn top_section(out: &mut String, report: &JobReport) {
    out.push_str("<h2>Top candidates</h2>\n<table id=\"top-candidates\"><thead><tr><th>#</th><th>GFLOPS</th><th>% of peak</th><th>median</th><th>params</th><th>slice</th><th>agent</th><th>kernel hash</th></tr></thead><tbody>");
    for (i, c) in report.top.iter().enumerate() {
        let _ = write!(
            out,
            "<tr><td class=\"number\">{}</td><td class=\"number\">{:.2}</td><td class=\"number\">{}</td><td class=\"number\">{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            i + 1,
            c.gflops,
            percent(c.peak_fraction),
            c.median_seconds
                .map(units::seconds)
                .unwrap_or_else(|| "-".to_string()),
            escape(&params_label(&c.params)),
            escape(&c.slice),
            escape(&c.agent),
            escape(&c.kernel_hash.chars().take(12).collect::<String>())
        );
    }
    if report.top.is_empty() {
        out.push_str("<tr><td colspan=\"8\">no trustworthy candidate</td></tr>");
    }
    out.push_str("</tbody></table>\n");
}

/// What the counts count, under the summary.
const DEFINITIONS: &str = "Evaluated: candidates with any record (compiled, failed, screened, pruned, benchmarked, ...). Benchmarked: candidates with a timed run. Valid: benchmarked with the right answer and no plausibility flag. A candidate measured more than once counts once.";

/// `table#candidates-by-status`: every status with candidates, its count
/// and its most frequent reasons.
fn status_section(out: &mut String, report: &JobReport) {
    out.push_str("<h2>Candidates by status</h2>\n<table id=\"candidates-by-status\"><thead><tr><th>status</th><th>candidates</th><th>reasons (most frequent first)</th></tr></thead><tbody>");
    let groups = report.status_groups();
    for group in &groups {
        let mut reasons: Vec<String> = group
            .reasons
            .iter()
            .take(REASONS_SHOWN)
            .map(|(reason, n)| format!("{n}: {reason}"))
            .collect();
        let more = group.reasons.len().saturating_sub(REASONS_SHOWN);
        if more > 0 {
            reasons.push(format!("and {more} other reason(s)"));
        }
        let _ = write!(
            out,
            "<tr class=\"status-{status}\"><th scope=\"row\">{status}</th><td class=\"number\">{}</td><td class=\"reason\">{}</td></tr>",
            group.count,
            if reasons.is_empty() {
                "-".to_string()
            } else {
                reasons
                    .iter()
                    .map(|r| escape(r))
                    .collect::<Vec<_>>()
                    .join("<br/>")
            },
            status = escape(group.status.as_str()),
        );
    }
    if groups.is_empty() {
        out.push_str("<tr><td colspan=\"3\">no candidate recorded</td></tr>");
    }
    out.push_str("</tbody></table>\n");
}

/// One small scatter per tuning parameter.
fn parameters_section(out: &mut String, report: &JobReport) {
    out.push_str("<h2>GFLOPS against each parameter</h2>\n");
    if report.parameters.is_empty() {
        out.push_str("<p class=\"note\" id=\"parameters-note\">no tuning parameter varies among the benchmarked candidates</p>\n");
        return;
    }
    out.push_str("<figure><div class=\"small-multiples\">");
    for axis in &report.parameters {
        out.push_str(&scatter_svg::parameter_scatter(report, axis));
    }
    out.push_str("</div><figcaption>One point per valid candidate at its value of the parameter; the green bar is the best figure of each value, the large orange point the best candidate.</figcaption></figure>\n");
}

/// The roofline, or the one line saying why there is none.
fn roofline_section(out: &mut String, report: &JobReport) {
    out.push_str("<h2>The best under the roofline</h2>\n");
    if let Some(roofline) = &report.roofline {
        out.push_str("<figure>");
        out.push_str(&roofline_svg::roofline(roofline));
        let _ = writeln!(
            out,
            "<figcaption>Compute roof: modeled peak of {} cores ({:.1} GFLOPS); memory roof: their DDR bandwidth share ({:.1} GB/s) x intensity; ridge at {:.2} flops/byte. Intensity is the tune.toml [model] flops over bytes.</figcaption></figure>",
            roofline.cores,
            roofline.peak_gflops,
            roofline.bandwidth_gbs,
            roofline.ridge()
        );
    }
    if let Some(note) = &report.roofline_note {
        let _ = writeln!(
            out,
            "<p class=\"note\" id=\"roofline-note\">{}</p>",
            escape(note)
        );
    }
}

fn candidate_row(out: &mut String, i: usize, c: &CandidateEntry, best: bool) {
    let _ = write!(
        out,
        "<tr{}><td class=\"number\">{}</td><td class=\"number\">{}</td><td class=\"number\">{}</td><td class=\"number\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        if best { " class=\"best\"" } else { "" },
        i + 1,
        c.gflops
            .map(|g| format!("{g:.2}"))
            .unwrap_or_else(|| "-".to_string()),
        percent(c.peak_fraction),
        c.median_seconds
            .map(units::seconds)
            .unwrap_or_else(|| "-".to_string()),
        escape(&params_label(&c.params)),
        escape(c.status.as_str()),
        escape(&c.slice),
        escape(&c.agent),
    );
}

/// `table#benchmarked-candidates`: every benchmarked candidate, valid ones
/// best first, then the flagged and wrong ones.
fn benchmarked_section(out: &mut String, report: &JobReport) {
    let _ = write!(
        out,
        "<h2>Every benchmarked candidate ({})</h2>\n<table id=\"benchmarked-candidates\"><thead><tr><th>#</th><th>GFLOPS</th><th>% of peak</th><th>median</th><th>params</th><th>status</th><th>slice</th><th>agent</th></tr></thead><tbody>",
        report.counts.candidates_benchmarked
    );
    let mut any = false;
    for (i, c) in report
        .candidates
        .iter()
        .filter(|c| c.benchmarked)
        .enumerate()
    {
        candidate_row(out, i, c, report.is_best(c));
        any = true;
    }
    if !any {
        out.push_str("<tr><td colspan=\"8\">no benchmarked candidate</td></tr>");
    }
    out.push_str("</tbody></table>\n");
}

/// `table#other-candidates`: the candidates without a timed run and why,
/// folded away (the status table above already counts them).
fn others_section(out: &mut String, report: &JobReport) {
    let others: Vec<&CandidateEntry> = report
        .candidates
        .iter()
        .filter(|c| !c.benchmarked)
        .collect();
    if others.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "<h2>Candidates not benchmarked ({})</h2>\n<details><summary>show all</summary><table id=\"other-candidates\"><thead><tr><th>params</th><th>status</th><th>reason</th><th>agent</th></tr></thead><tbody>",
        others.len()
    );
    for c in others {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"reason\">{}</td><td>{}</td></tr>",
            escape(&params_label(&c.params)),
            escape(c.status.as_str()),
            escape(c.reason.as_deref().unwrap_or("-")),
            escape(&c.agent),
        );
    }
    out.push_str("</tbody></table></details>\n");
}
