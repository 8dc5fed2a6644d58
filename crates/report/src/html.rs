//! The report as one self-contained HTML file: inline CSS and inline SVG,
//! no script and nothing fetched, so it opens anywhere (a CI artifact, an
//! air-gapped laptop). It is written as well-formed XHTML so any XML parser
//! can check it.

use std::fmt::Write as _;

use crate::svg::{self, escape};
use crate::{JobReport, params_label, utc_time};

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

    out.push_str("<h2>Summary</h2>\n<table id=\"summary\"><tbody>");
    let best = report.best.as_ref();
    row(
        &mut out,
        "best GFLOPS",
        &best
            .map(|b| format!("{:.2}", b.gflops))
            .unwrap_or_else(|| "no valid candidate".to_string()),
    );
    row(
        &mut out,
        "% of peak",
        &percent(best.and_then(|b| b.peak_fraction)),
    );
    row(
        &mut out,
        "best params",
        &best
            .map(|b| params_label(&b.params))
            .unwrap_or_else(|| "-".to_string()),
    );
    row(
        &mut out,
        "baseline GFLOPS",
        &report
            .baseline
            .as_ref()
            .map(|b| format!("{:.2} ({})", b.gflops, b.description))
            .unwrap_or_else(|| "-".to_string()),
    );
    row(
        &mut out,
        "speedup over naive",
        &report
            .speedup_over_naive()
            .map(|s| format!("{s:.2}x"))
            .unwrap_or_else(|| "-".to_string()),
    );
    row(
        &mut out,
        "candidates",
        &format!(
            "{} evaluated, {} valid",
            report.candidates_evaluated, report.valid_candidates
        ),
    );
    row(
        &mut out,
        "window",
        &format!(
            "{} to {} ({:.1} s)",
            utc_time(report.started_at_ms),
            utc_time(report.finished_at_ms),
            report.wall_seconds()
        ),
    );
    for (slice, share) in &report.slice_utilization {
        row(
            &mut out,
            &format!("utilization {slice}"),
            &percent(Some(*share)),
        );
    }
    out.push_str("</tbody></table>\n");

    out.push_str("<h2>Best GFLOPS so far</h2>\n<figure>");
    out.push_str(&svg::best_so_far(report));
    out.push_str(
        "<figcaption>Each point is one measurement (hollow red: invalid); the line is the best trustworthy figure so far.</figcaption></figure>\n",
    );

    out.push_str("<h2>Hardware use per slice</h2>\n<figure>");
    out.push_str(&svg::slice_timeline(report));
    out.push_str(
        "<figcaption>Each bar is one interval during which the slice's hardware was busy, colored by agent.</figcaption></figure>\n",
    );

    out.push_str("<h2>Top candidates</h2>\n<table id=\"top-candidates\"><thead><tr><th>#</th><th>GFLOPS</th><th>% of peak</th><th>median s</th><th>params</th><th>slice</th><th>agent</th><th>kernel hash</th></tr></thead><tbody>");
    for (i, c) in report.top.iter().enumerate() {
        let _ = write!(
            out,
            "<tr><td class=\"number\">{}</td><td class=\"number\">{:.2}</td><td class=\"number\">{}</td><td class=\"number\">{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            i + 1,
            c.gflops,
            percent(c.peak_fraction),
            c.median_seconds
                .map(|s| format!("{s:.4e}"))
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
    out.push_str("</tbody></table>\n</body>\n</html>\n");
    out
}
