//! GFLOPS against one tuning parameter, as a small inline SVG: the
//! parameter's values as categories along x (tune.toml order, or sorted),
//! every valid benchmarked candidate as a point at its GFLOPS, a short bar
//! at the best figure of each value and the best candidate highlighted. One
//! such plot per parameter side by side shows which knob matters: a knob
//! whose bars climb steeply moves GFLOPS, a flat one does not.

use std::fmt::Write as _;

use crate::svg::{EmptyNote, close_plot, escape, tick_label, ticks};
use crate::{JobReport, ParameterAxis, params_label};

const WIDTH: f64 = 430.0;
const HEIGHT: f64 = 230.0;
const LEFT: f64 = 55.0;
const RIGHT: f64 = 10.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 48.0;
/// Beyond this many categories only every n-th value is labelled.
const MAX_LABELS: usize = 12;

/// `svg#param-NAME.param-scatter`: one `circle.point` per valid candidate
/// with a value of the parameter (`circle.point.best` for the best), one
/// `line.category-best` per value with candidates.
pub(crate) fn parameter_scatter(report: &JobReport, axis: &ParameterAxis) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="param-{id}" class="plot param-scatter" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="GFLOPS against {id}">"#,
        id = escape(&axis.name)
    );
    let bottom = HEIGHT - BOTTOM;
    let plot_height = bottom - TOP;
    let right = WIDTH - RIGHT;
    let categories = axis.values.len().max(1);
    let band = (right - LEFT) / categories as f64;

    // (category, gflops, is best, label) of each valid candidate.
    let points: Vec<(usize, f64, bool, String)> = report
        .candidates
        .iter()
        .filter(|c| c.valid)
        .filter_map(|c| {
            let gflops = c.gflops?;
            let value = axis.value_of(&c.params)?;
            let category = axis.values.iter().position(|v| v == value)?;
            Some((category, gflops, report.is_best(c), params_label(&c.params)))
        })
        .collect();
    let max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let y_max = if max > 0.0 { max * 1.1 } else { 1.0 };
    let y = |g: f64| bottom - (g / y_max).clamp(0.0, 1.0) * plot_height;

    let _ = write!(
        out,
        r#"<text class="axis-title" x="{LEFT:.1}" y="14">{}</text>"#,
        escape(&axis.name)
    );
    for t in ticks(y_max, 4) {
        let _ = write!(
            out,
            r#"<line class="grid" x1="{LEFT:.1}" y1="{ty:.1}" x2="{right:.1}" y2="{ty:.1}"/><text class="tick-label" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 5.0,
            y(t) + 4.0,
            tick_label(t),
            ty = y(t),
        );
    }
    let _ = write!(
        out,
        r#"<line class="axis" x1="{LEFT:.1}" y1="{TOP:.1}" x2="{LEFT:.1}" y2="{bottom:.1}"/><line class="axis" x1="{LEFT:.1}" y1="{bottom:.1}" x2="{right:.1}" y2="{bottom:.1}"/><text class="axis-title" transform="rotate(-90)" x="{:.1}" y="14" text-anchor="middle">GFLOPS</text>"#,
        -(TOP + plot_height / 2.0)
    );
    let label_every = axis.values.len().div_ceil(MAX_LABELS).max(1);
    for (i, value) in axis.values.iter().enumerate() {
        let x = LEFT + (i as f64 + 0.5) * band;
        if i % label_every == 0 {
            let _ = write!(
                out,
                r#"<text class="tick-label" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                bottom + 15.0,
                escape(value)
            );
        }
        let best_here = points
            .iter()
            .filter(|p| p.0 == i)
            .map(|p| p.1)
            .fold(None, |acc: Option<f64>, g| {
                Some(acc.map_or(g, |a| a.max(g)))
            });
        if let Some(g) = best_here {
            let _ = write!(
                out,
                r#"<line class="category-best" x1="{:.1}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}"><title>{}={}: best {:.2} GFLOPS</title></line>"#,
                x - band * 0.35,
                x + band * 0.35,
                escape(&axis.name),
                escape(value),
                g,
                gy = y(g),
            );
        }
    }
    let _ = write!(
        out,
        r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle">{}{}</text>"#,
        (LEFT + right) / 2.0,
        HEIGHT - 8.0,
        escape(&axis.name),
        axis.description
            .as_deref()
            .map(|d| format!(" ({})", escape(d)))
            .unwrap_or_default()
    );

    // Spread the points of one category over a band so equal figures do
    // not hide each other; the best is drawn last, on top.
    let mut within: Vec<usize> = vec![0; categories];
    let mut best_mark = String::new();
    for (category, gflops, best, label) in &points {
        let k = within[*category];
        within[*category] += 1;
        let offset = ((k % 9) as f64 - 4.0) / 4.0 * band * 0.3;
        let x = LEFT + (*category as f64 + 0.5) * band + offset;
        let title = format!("{gflops:.2} GFLOPS | {label}");
        if *best {
            let _ = write!(
                best_mark,
                r#"<circle class="point best" cx="{:.1}" cy="{:.1}" r="5.5"><title>best: {}</title></circle>"#,
                LEFT + (*category as f64 + 0.5) * band,
                y(*gflops),
                escape(&title)
            );
        } else {
            let _ = write!(
                out,
                r#"<circle class="point" cx="{x:.1}" cy="{:.1}" r="3"><title>{}</title></circle>"#,
                y(*gflops),
                escape(&title)
            );
        }
    }
    out.push_str(&best_mark);
    let empty = points.is_empty().then_some(EmptyNote {
        x: (LEFT + right) / 2.0,
        y: TOP + plot_height / 2.0,
        text: "no valid candidate",
    });
    close_plot(out, empty)
}
