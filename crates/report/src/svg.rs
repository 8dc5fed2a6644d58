//! The report's plots as inline SVG, generated here so the HTML report needs
//! no script, font or network: the best-so-far GFLOPS over time (one point
//! per measurement, a step line for the best so far) and a per-slice
//! timeline of hardware use (one bar per busy interval). The output is
//! well-formed XML.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use mtswarm_core::clock::format_rfc3339;

use crate::{JobReport, params_label};

const WIDTH: f64 = 900.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 20.0;
const MARGIN_TOP: f64 = 20.0;
const MARGIN_BOTTOM: f64 = 45.0;
const PLOT_HEIGHT: f64 = 280.0;
const ROW_HEIGHT: f64 = 26.0;
const TIMELINE_LABEL_WIDTH: f64 = 160.0;
/// Colors per agent (color-blind friendly palette).
const PALETTE: &[&str] = &[
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000",
];

/// Escapes text for XML content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // XML 1.0 forbids most control characters.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Round tick values covering `0..=max` (about `count` of them).
/// The note a plot with nothing to draw shows, centered at (`x`, `y`).
pub(crate) struct EmptyNote {
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) text: &'static str,
}

/// Ends the plot `out`, with `empty`'s note when there was nothing to draw.
pub(crate) fn close_plot(mut out: String, empty: Option<EmptyNote>) -> String {
    if let Some(EmptyNote { x, y, text }) = empty {
        let _ = write!(
            out,
            r#"<text class="empty" x="{x:.1}" y="{y:.1}" text-anchor="middle">{text}</text>"#
        );
    }
    out.push_str("</svg>");
    out
}

pub(crate) fn ticks(max: f64, count: usize) -> Vec<f64> {
    if !(max.is_finite() && max > 0.0) {
        return vec![0.0];
    }
    let raw = max / count.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    (0..)
        .map(|i| i as f64 * step)
        .take_while(|v| *v <= max * (1.0 + 1e-9))
        .collect()
}

pub(crate) fn tick_label(value: f64) -> String {
    if value == 0.0 {
        "0".to_string()
    } else if value.abs() >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}

/// Agent name -> color, by the agent's rank among every agent of the
/// report, so an agent has the same color in both plots.
fn agent_colors(report: &JobReport) -> BTreeMap<String, &'static str> {
    let agents: std::collections::BTreeSet<&str> = report
        .measurements
        .iter()
        .map(|m| m.agent.as_str())
        .chain(report.busy.iter().map(|b| b.agent.as_str()))
        .collect();
    agents
        .into_iter()
        .enumerate()
        .map(|(i, agent)| (agent.to_string(), PALETTE[i % PALETTE.len()]))
        .collect()
}

struct TimeAxis {
    start_ms: u64,
    span_s: f64,
    left: f64,
    right: f64,
}

impl TimeAxis {
    fn new(report: &JobReport, left: f64) -> Self {
        let span_s =
            (report.finished_at_ms.saturating_sub(report.started_at_ms) as f64 / 1000.0).max(1.0);
        Self {
            start_ms: report.started_at_ms,
            span_s,
            left,
            right: WIDTH - MARGIN_RIGHT,
        }
    }

    fn x(&self, ms: u64) -> f64 {
        let s = ms.saturating_sub(self.start_ms) as f64 / 1000.0;
        self.left + (s / self.span_s).clamp(0.0, 1.0) * (self.right - self.left)
    }

    /// Tick marks and labels along `y`, with the axis title below.
    fn draw(&self, out: &mut String, y: f64) {
        let _ = write!(
            out,
            r#"<line class="axis" x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/>"#,
            self.left, self.right
        );
        for t in ticks(self.span_s, 8) {
            let x = self.left + t / self.span_s * (self.right - self.left);
            let _ = write!(
                out,
                r#"<line class="tick" x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{:.1}"/><text class="tick-label" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                y + 5.0,
                y + 18.0,
                tick_label(t)
            );
        }
        let _ = write!(
            out,
            r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle">seconds since {}</text>"#,
            (self.left + self.right) / 2.0,
            y + 36.0,
            escape(&format_rfc3339(self.start_ms))
        );
    }
}

/// Best-so-far GFLOPS over time: one `circle.point` per measurement
/// (`valid` ones at their figure, `invalid` ones on the time axis) and a
/// `path.best-so-far` step line.
pub(crate) fn best_so_far(report: &JobReport) -> String {
    let height = MARGIN_TOP + PLOT_HEIGHT + MARGIN_BOTTOM;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="best-so-far" class="plot" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="best-so-far GFLOPS over time">"#
    );
    let axis = TimeAxis::new(report, MARGIN_LEFT);
    let bottom = MARGIN_TOP + PLOT_HEIGHT;
    let max_gflops = report
        .measurements
        .iter()
        .filter_map(|m| m.gflops)
        .chain(report.baseline.as_ref().map(|b| b.gflops))
        .filter(|g| g.is_finite())
        .fold(0.0_f64, f64::max);
    let y_max = if max_gflops > 0.0 {
        max_gflops * 1.1
    } else {
        1.0
    };
    let y = |g: f64| bottom - (g / y_max).clamp(0.0, 1.0) * PLOT_HEIGHT;

    // Y axis with grid lines.
    for t in ticks(y_max, 6) {
        let _ = write!(
            out,
            r#"<line class="grid" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/><text class="tick-label" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            axis.left,
            y(t),
            axis.right,
            y(t),
            axis.left - 6.0,
            y(t) + 4.0,
            tick_label(t)
        );
    }
    let _ = write!(
        out,
        r#"<line class="axis" x1="{:.1}" y1="{MARGIN_TOP:.1}" x2="{:.1}" y2="{bottom:.1}"/><text class="axis-title" transform="rotate(-90)" x="{:.1}" y="16" text-anchor="middle">GFLOPS</text>"#,
        axis.left,
        axis.left,
        -(MARGIN_TOP + PLOT_HEIGHT / 2.0)
    );
    axis.draw(&mut out, bottom);

    if let Some(baseline) = &report.baseline
        && baseline.gflops.is_finite()
        && baseline.gflops > 0.0
    {
        let by = y(baseline.gflops);
        let _ = write!(
            out,
            r#"<line class="baseline" x1="{:.1}" y1="{by:.1}" x2="{:.1}" y2="{by:.1}"/><text class="baseline-label" x="{:.1}" y="{:.1}" text-anchor="end">baseline {:.2}</text>"#,
            axis.left,
            axis.right,
            axis.right - 4.0,
            by - 4.0,
            baseline.gflops
        );
    }

    // Step line of the best figure so far.
    let mut path = String::new();
    let mut best: Option<f64> = None;
    for m in &report.measurements {
        let Some(g) = m.gflops.filter(|g| g.is_finite()) else {
            continue;
        };
        let x = axis.x(m.timestamp_ms);
        match best {
            None => {
                let _ = write!(path, "M{x:.1},{:.1}", y(g));
                best = Some(g);
            }
            Some(b) if g > b => {
                let _ = write!(path, " H{x:.1} V{:.1}", y(g));
                best = Some(g);
            }
            Some(_) => {}
        }
    }
    if best.is_some() {
        let _ = write!(path, " H{:.1}", axis.right);
        let _ = write!(out, r#"<path class="best-so-far" d="{path}"/>"#);
    }

    let colors = agent_colors(report);
    legend(&mut out, &colors, axis.left + 10.0);
    for m in &report.measurements {
        let x = axis.x(m.timestamp_ms);
        let color = colors.get(&m.agent).copied().unwrap_or(PALETTE[0]);
        let title = format!(
            "{} | {} | {} | {}",
            match m.gflops {
                Some(g) => format!("{g:.2} GFLOPS"),
                None if m.valid => "valid, no trustworthy figure".to_string(),
                None => "invalid".to_string(),
            },
            params_label(&m.params),
            m.slice,
            m.agent
        );
        match m.gflops.filter(|g| g.is_finite()) {
            Some(g) => {
                let _ = write!(
                    out,
                    r#"<circle class="point valid" cx="{x:.1}" cy="{:.1}" r="4" fill="{color}"><title>{}</title></circle>"#,
                    y(g),
                    escape(&title)
                );
            }
            None => {
                let _ = write!(
                    out,
                    r#"<circle class="point invalid" cx="{x:.1}" cy="{bottom:.1}" r="4"><title>{}</title></circle>"#,
                    escape(&title)
                );
            }
        }
    }
    let empty = report.measurements.is_empty().then_some(EmptyNote {
        x: (axis.left + axis.right) / 2.0,
        y: MARGIN_TOP + PLOT_HEIGHT / 2.0,
        text: "no measurements",
    });
    close_plot(out, empty)
}

/// One colored dot and name per agent, in a row along the top of a plot.
fn legend(out: &mut String, colors: &BTreeMap<String, &'static str>, left: f64) {
    let mut x = left;
    let y = MARGIN_TOP + 10.0;
    for (agent, color) in colors {
        let _ = write!(
            out,
            r#"<g class="legend"><circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{color}"/><text class="tick-label" x="{:.1}" y="{:.1}">{}</text></g>"#,
            x + 8.0,
            y + 4.0,
            escape(agent)
        );
        x += 20.0 + 7.0 * agent.chars().count().min(24) as f64;
    }
}

/// Per-slice timeline: one row per slice, one `rect.busy` per busy interval.
pub(crate) fn slice_timeline(report: &JobReport) -> String {
    let slices = report.slices();
    let rows = slices.len().max(1) as f64;
    let bottom = MARGIN_TOP + rows * ROW_HEIGHT;
    let height = bottom + MARGIN_BOTTOM;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="slice-timeline" class="plot" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="hardware use per slice over time">"#
    );
    let axis = TimeAxis::new(report, TIMELINE_LABEL_WIDTH);
    let row_of: BTreeMap<&str, usize> = slices
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    for (i, slice) in slices.iter().enumerate() {
        let top = MARGIN_TOP + i as f64 * ROW_HEIGHT;
        let share = report
            .slice_utilization
            .get(slice)
            .map(|u| format!(" ({:.0}%)", u * 100.0))
            .unwrap_or_default();
        let _ = write!(
            out,
            r#"<rect class="lane" x="{:.1}" y="{top:.1}" width="{:.1}" height="{ROW_HEIGHT:.1}"/><text class="lane-label" x="{:.1}" y="{:.1}" text-anchor="end">{}{}</text>"#,
            axis.left,
            axis.right - axis.left,
            axis.left - 6.0,
            top + ROW_HEIGHT / 2.0 + 4.0,
            escape(slice),
            escape(&share)
        );
    }
    axis.draw(&mut out, bottom);
    let colors = agent_colors(report);
    for b in &report.busy {
        let Some(row) = row_of.get(b.slice.as_str()) else {
            continue;
        };
        let top = MARGIN_TOP + *row as f64 * ROW_HEIGHT + 3.0;
        let x = axis.x(b.start_ms);
        // At least a pixel wide so short runs stay visible.
        let width = (axis.x(b.end_ms) - x).max(1.0);
        let color = colors.get(&b.agent).copied().unwrap_or(PALETTE[0]);
        let title = format!(
            "{} | {} | {} | {:.2} s",
            b.slice,
            b.agent,
            b.label,
            b.end_ms.saturating_sub(b.start_ms) as f64 / 1000.0
        );
        let _ = write!(
            out,
            r#"<rect class="busy" x="{x:.1}" y="{top:.1}" width="{width:.1}" height="{:.1}" fill="{color}"><title>{}</title></rect>"#,
            ROW_HEIGHT - 6.0,
            escape(&title)
        );
    }
    let empty = report.busy.is_empty().then_some(EmptyNote {
        x: (axis.left + axis.right) / 2.0,
        y: MARGIN_TOP + rows * ROW_HEIGHT / 2.0 + 4.0,
        text: "no hardware use recorded",
    });
    close_plot(out, empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 5), vec![0.0]);
        assert_eq!(ticks(f64::NAN, 5), vec![0.0]);
        let t = ticks(37.0, 6);
        assert!(t.len() >= 4 && t.len() <= 9, "{t:?}");
        assert!(*t.last().expect("last") <= 37.0);
    }

    #[test]
    fn escape_makes_text_safe_for_xml() {
        assert_eq!(
            escape("a<b & \"c\" 'd'>\u{1}"),
            "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt; "
        );
    }
}
