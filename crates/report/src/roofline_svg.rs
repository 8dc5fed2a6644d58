//! The roofline as an inline SVG, log-log: x = arithmetic intensity
//! (modeled flops per DDR byte), y = GFLOPS; the memory roof (bandwidth
//! share x intensity) rising to the ridge, the compute roof (modeled peak of
//! the cores used) flat after it, each valid candidate as a point and the
//! best highlighted. How far the best sits below its roof is what is left
//! to win; which roof it sits under says what limits it.

use std::fmt::Write as _;

use crate::svg::escape;
use crate::{Roofline, params_label};

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 50.0;

/// A decade's label: `0.01`, `1`, `1000`, `1e6`.
fn decade_label(exponent: i32) -> String {
    match exponent {
        0..=5 => format!("1{}", "0".repeat(exponent as usize)),
        -4..=-1 => format!("0.{}1", "0".repeat((-exponent - 1) as usize)),
        _ => format!("1e{exponent}"),
    }
}

/// A log10 axis over whole decades covering `lo..=hi` (both > 0).
struct LogAxis {
    lo: i32,
    hi: i32,
    from: f64,
    to: f64,
}

impl LogAxis {
    fn new(lo: f64, hi: f64, from: f64, to: f64) -> Self {
        let lo = lo.log10().floor() as i32;
        let hi = (hi.log10().ceil() as i32).max(lo + 1);
        Self { lo, hi, from, to }
    }

    fn at(&self, value: f64) -> f64 {
        let t = (value.log10() - f64::from(self.lo)) / f64::from(self.hi - self.lo);
        self.from + t.clamp(0.0, 1.0) * (self.to - self.from)
    }

    fn min(&self) -> f64 {
        10f64.powi(self.lo)
    }

    fn max(&self) -> f64 {
        10f64.powi(self.hi)
    }
}

/// `svg#roofline`: `path.roof` (memory then compute roof), one
/// `circle.point` per valid candidate, `circle.point.best` for the best.
pub(crate) fn roofline(roofline: &Roofline) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="roofline" class="plot" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="roofline: GFLOPS against arithmetic intensity">"#
    );
    let ridge = roofline.ridge();
    let finite = |v: &f64| v.is_finite() && *v > 0.0;
    let intensities = roofline
        .points
        .iter()
        .map(|p| p.intensity)
        .chain([ridge])
        .filter(finite);
    let x_lo = intensities.clone().fold(f64::INFINITY, f64::min) / 2.0;
    let x_hi = intensities.fold(0.0_f64, f64::max) * 2.0;
    let y_lo = roofline
        .points
        .iter()
        .map(|p| p.gflops)
        .chain([roofline.bound(x_lo)])
        .filter(finite)
        .fold(f64::INFINITY, f64::min)
        / 2.0;
    let y_hi = roofline.peak_gflops * 1.5;
    if !(finite(&x_lo) && finite(&x_hi) && finite(&y_lo) && finite(&y_hi)) {
        out.push_str(r#"<text class="empty" x="320" y="190" text-anchor="middle">no figures to plot</text></svg>"#);
        return out;
    }
    let bottom = HEIGHT - BOTTOM;
    let right = WIDTH - RIGHT;
    let x = LogAxis::new(x_lo, x_hi, LEFT, right);
    let y = LogAxis::new(y_lo, y_hi, bottom, TOP);

    for e in x.lo..=x.hi {
        let px = x.at(10f64.powi(e));
        let _ = write!(
            out,
            r#"<line class="grid" x1="{px:.1}" y1="{TOP:.1}" x2="{px:.1}" y2="{bottom:.1}"/><text class="tick-label" x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            bottom + 16.0,
            decade_label(e)
        );
    }
    for e in y.lo..=y.hi {
        let py = y.at(10f64.powi(e));
        let _ = write!(
            out,
            r#"<line class="grid" x1="{LEFT:.1}" y1="{py:.1}" x2="{right:.1}" y2="{py:.1}"/><text class="tick-label" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            py + 4.0,
            decade_label(e)
        );
    }
    let _ = write!(
        out,
        r#"<line class="axis" x1="{LEFT:.1}" y1="{TOP:.1}" x2="{LEFT:.1}" y2="{bottom:.1}"/><line class="axis" x1="{LEFT:.1}" y1="{bottom:.1}" x2="{right:.1}" y2="{bottom:.1}"/><text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle">arithmetic intensity (modeled flops per DDR byte, log)</text><text class="axis-title" transform="rotate(-90)" x="{:.1}" y="16" text-anchor="middle">GFLOPS (log)</text>"#,
        (LEFT + right) / 2.0,
        HEIGHT - 10.0,
        -(TOP + (bottom - TOP) / 2.0)
    );

    // The memory roof starts where it enters the plot (at the left edge or
    // at the bottom), bends at the ridge and runs flat to the right edge.
    let start = x.min().max(y.min() / roofline.bandwidth_gbs);
    let ridge_x = ridge.min(x.max());
    let _ = write!(
        out,
        r#"<path class="roof" d="M{:.1},{:.1} L{:.1},{:.1} L{:.1},{:.1}"/>"#,
        x.at(start),
        y.at(roofline.bound(start)),
        x.at(ridge_x),
        y.at(roofline.bound(ridge_x)),
        x.at(x.max()),
        y.at(roofline.bound(x.max()))
    );
    let _ = write!(
        out,
        r#"<text class="roof-label" x="{:.1}" y="{:.1}" text-anchor="end">compute roof {:.1} GFLOPS ({} cores)</text><text class="roof-label" x="{:.1}" y="{:.1}">memory roof {:.1} GB/s x intensity</text>"#,
        right - 4.0,
        y.at(roofline.peak_gflops) - 6.0,
        roofline.peak_gflops,
        roofline.cores,
        x.at(start) + 6.0,
        (y.at(roofline.bound(start)) - 8.0).max(TOP + 12.0),
        roofline.bandwidth_gbs
    );

    let mut best_mark = String::new();
    for point in &roofline.points {
        if !(finite(&point.intensity) && finite(&point.gflops)) {
            continue;
        }
        let (px, py) = (x.at(point.intensity), y.at(point.gflops));
        let bound = roofline.bound(point.intensity);
        let title = format!(
            "{:.2} GFLOPS at {:.3} flops/byte ({:.0}% of its roof {:.1}) | {}",
            point.gflops,
            point.intensity,
            point.gflops / bound * 100.0,
            bound,
            params_label(&point.params)
        );
        if point.best {
            let _ = write!(
                best_mark,
                r#"<circle class="point best" cx="{px:.1}" cy="{py:.1}" r="6"><title>best: {}</title></circle><text class="best-label" x="{:.1}" y="{:.1}">best</text>"#,
                escape(&title),
                px + 9.0,
                py + 4.0
            );
        } else {
            let _ = write!(
                out,
                r#"<circle class="point" cx="{px:.1}" cy="{py:.1}" r="3.5"><title>{}</title></circle>"#,
                escape(&title)
            );
        }
    }
    out.push_str(&best_mark);
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decades_read_as_plain_numbers() {
        assert_eq!(decade_label(0), "1");
        assert_eq!(decade_label(3), "1000");
        assert_eq!(decade_label(-2), "0.01");
        assert_eq!(decade_label(7), "1e7");
        assert_eq!(decade_label(-6), "1e-6");
    }

    #[test]
    fn log_axis_places_decades_evenly() {
        let axis = LogAxis::new(0.5, 50.0, 0.0, 300.0);
        assert_eq!((axis.lo, axis.hi), (-1, 2));
        assert!((axis.at(0.1) - 0.0).abs() < 1e-9);
        assert!((axis.at(1.0) - 100.0).abs() < 1e-9);
        assert!((axis.at(100.0) - 300.0).abs() < 1e-9);
    }
}
