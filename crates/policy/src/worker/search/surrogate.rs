//! The search plan's predictor: a Gaussian process over the candidates'
//! parameter values, and the expected improvement that picks the next one
//! to screen (Bayesian optimization, as tuners such as Kernel Tuner and
//! ytopt use it).
//!
//! Why a Gaussian process rather than a simpler model: the fastest
//! configurations of a blocked kernel sit where several parameters agree
//! (tile shapes that give every core exactly one tile, a micro-kernel that
//! fills the registers), so an additive model over the values misses them
//! until it has screened most of the space. A Gaussian process with a
//! smooth kernel over the values' positions sees such interactions from a
//! few dozen points, and its uncertainty says where screening is still
//! worth it.
//!
//! Inputs: each parameter's distinct values over the task's candidates, in
//! order (numerically when all of them are numbers), mapped to [0, 1]; a
//! Matérn 5/2 kernel with one length scale. Targets: log screened time,
//! standardized. Everything here is small dense linear algebra (at most a
//! few hundred screened points), written out rather than pulled in as a
//! dependency.

use std::collections::{BTreeMap, BTreeSet};

/// Length scale of the kernel over the [0, 1] positions of each parameter's
/// values: about one parameter moved across most of its range, or a few
/// moved a step each, before two times stop telling about each other.
pub(super) const LENGTH_SCALE: f64 = 0.8;
/// Observation noise (in standardized units): the emulator's figures are
/// exact, a board's vary by about this much after the benchmark's
/// statistics; it also keeps the factorization well conditioned.
const NOISE: f64 = 1e-4;

/// Positions in [0, 1] of every candidate's parameter values.
pub(super) struct Encoding {
    points: Vec<Vec<f64>>,
}

impl Encoding {
    /// Encode `candidates` (`-D` maps). Values of a parameter are ordered
    /// numerically when all parse as numbers, else as text; a parameter a
    /// candidate lacks takes the position of the empty value.
    pub(super) fn new(candidates: &[&BTreeMap<String, String>]) -> Self {
        let names: BTreeSet<&str> = candidates
            .iter()
            .flat_map(|c| c.keys().map(String::as_str))
            .collect();
        let mut axes: Vec<(&str, Vec<&str>)> = Vec::with_capacity(names.len());
        for name in names {
            let mut values: Vec<&str> = candidates
                .iter()
                .map(|c| c.get(name).map_or("", String::as_str))
                .collect::<BTreeSet<&str>>()
                .into_iter()
                .collect();
            let numbers: Option<Vec<f64>> = values
                .iter()
                .map(|v| v.trim().parse::<f64>().ok().filter(|x| x.is_finite()))
                .collect();
            if let Some(numbers) = numbers {
                let mut pairs: Vec<(f64, &str)> = numbers.into_iter().zip(values).collect();
                pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
                values = pairs.into_iter().map(|p| p.1).collect();
            }
            axes.push((name, values));
        }
        let points = candidates
            .iter()
            .map(|c| {
                axes.iter()
                    .map(|(name, values)| {
                        let value = c.get(*name).map_or("", String::as_str);
                        let rank = values.iter().position(|v| *v == value).unwrap_or(0);
                        if values.len() > 1 {
                            rank as f64 / (values.len() - 1) as f64
                        } else {
                            0.0
                        }
                    })
                    .collect()
            })
            .collect();
        Self { points }
    }

    pub(super) fn point(&self, candidate: usize) -> &[f64] {
        &self.points[candidate]
    }
}

/// Matérn 5/2 correlation of two points.
fn kernel(a: &[f64], b: &[f64]) -> f64 {
    let squared: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((x - y) / LENGTH_SCALE).powi(2))
        .sum();
    let r = (5.0 * squared).sqrt();
    (1.0 + r + r * r / 3.0) * (-r).exp()
}

/// A Gaussian process fitted to screened points: `predict` gives the mean
/// and standard deviation of a log-time, in the targets' units.
pub(super) struct Surrogate<'a> {
    points: Vec<&'a [f64]>,
    /// Lower-triangular Cholesky factor of the kernel matrix, row-major.
    factor: Vec<f64>,
    /// `K^-1 (y - mean) / scale`.
    weights: Vec<f64>,
    mean: f64,
    scale: f64,
}

impl<'a> Surrogate<'a> {
    /// Fit to `(point, log-time)` pairs. `None` without any point or when
    /// the kernel matrix is not positive definite (it always is with the
    /// noise term; a failure means non-finite inputs).
    pub(super) fn fit(samples: &[(&'a [f64], f64)]) -> Option<Self> {
        let n = samples.len();
        if n == 0 || samples.iter().any(|s| !s.1.is_finite()) {
            return None;
        }
        let mean = samples.iter().map(|s| s.1).sum::<f64>() / n as f64;
        let variance = samples.iter().map(|s| (s.1 - mean).powi(2)).sum::<f64>() / n as f64;
        // One point, or all equal: any positive scale will do.
        let scale = if variance > 1e-24 {
            variance.sqrt()
        } else {
            1.0
        };
        let mut factor = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                factor[i * n + j] = kernel(samples[i].0, samples[j].0);
            }
            factor[i * n + i] += NOISE;
        }
        cholesky(&mut factor, n)?;
        let targets: Vec<f64> = samples.iter().map(|s| (s.1 - mean) / scale).collect();
        let weights = solve_transposed(&factor, n, solve_lower(&factor, n, targets));
        Some(Self {
            points: samples.iter().map(|s| s.0).collect(),
            factor,
            weights,
            mean,
            scale,
        })
    }

    /// Mean and standard deviation of the log-time at `point`.
    pub(super) fn predict(&self, point: &[f64]) -> (f64, f64) {
        let n = self.points.len();
        let cross: Vec<f64> = self.points.iter().map(|p| kernel(p, point)).collect();
        let mean: f64 = cross.iter().zip(&self.weights).map(|(k, w)| k * w).sum();
        let v = solve_lower(&self.factor, n, cross);
        let variance = (1.0 - v.iter().map(|x| x * x).sum::<f64>()).max(1e-12);
        (self.mean + self.scale * mean, self.scale * variance.sqrt())
    }
}

/// Expected improvement of a point predicted `(mean, sd)` over the best
/// (lowest) target so far.
pub(super) fn expected_improvement(best: f64, mean: f64, sd: f64) -> f64 {
    if sd <= 0.0 {
        return (best - mean).max(0.0);
    }
    let z = (best - mean) / sd;
    (best - mean) * normal_cdf(z) + sd * normal_pdf(z)
}

fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// The complementary error function (Numerical Recipes' `erfcc`, relative
/// error below 1.2e-7 everywhere): plenty for ranking candidates.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// In-place Cholesky factorization of the symmetric positive definite
/// `n x n` matrix whose lower triangle `a` holds (row-major); `None` when
/// it is not positive definite.
fn cholesky(a: &mut [f64], n: usize) -> Option<()> {
    for j in 0..n {
        let mut diagonal = a[j * n + j];
        for k in 0..j {
            diagonal -= a[j * n + k] * a[j * n + k];
        }
        if diagonal <= 0.0 || !diagonal.is_finite() {
            return None;
        }
        let pivot = diagonal.sqrt();
        a[j * n + j] = pivot;
        for i in j + 1..n {
            let mut sum = a[i * n + j];
            for k in 0..j {
                sum -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = sum / pivot;
        }
    }
    Some(())
}

/// Solve `L x = b` for the lower-triangular factor `L`.
fn solve_lower(l: &[f64], n: usize, mut b: Vec<f64>) -> Vec<f64> {
    for i in 0..n {
        let mut sum = b[i];
        for k in 0..i {
            sum -= l[i * n + k] * b[k];
        }
        b[i] = sum / l[i * n + i];
    }
    b
}

/// Solve `L^T x = b` for the lower-triangular factor `L`.
fn solve_transposed(l: &[f64], n: usize, mut b: Vec<f64>) -> Vec<f64> {
    for i in (0..n).rev() {
        let mut sum = b[i];
        for k in i + 1..n {
            sum -= l[k * n + i] * b[k];
        }
        b[i] = sum / l[i * n + i];
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defines(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn values_are_placed_in_numeric_order_and_text_values_in_text_order() {
        let a = defines(&[("MB", "16"), ("V", "naive")]);
        let b = defines(&[("MB", "128"), ("V", "blocked")]);
        let c = defines(&[("MB", "32"), ("V", "naive")]);
        let encoding = Encoding::new(&[&a, &b, &c]);
        // MB: 16 < 32 < 128 (not "128" < "16" < "32"); V: blocked < naive.
        assert_eq!(encoding.point(0), &[0.0, 1.0]);
        assert_eq!(encoding.point(1), &[1.0, 0.0]);
        assert_eq!(encoding.point(2), &[0.5, 1.0]);
    }

    #[test]
    fn the_process_interpolates_its_points_and_is_unsure_far_from_them() {
        let points = [vec![0.0], vec![0.5], vec![1.0]];
        let samples: Vec<(&[f64], f64)> = points
            .iter()
            .zip([1.0, -1.0, 2.0])
            .map(|(p, y)| (p.as_slice(), y))
            .collect();
        let gp = Surrogate::fit(&samples).expect("fit");
        for (p, y) in &samples {
            let (mean, sd) = gp.predict(p);
            assert!((mean - y).abs() < 1e-2, "{mean} vs {y}");
            assert!(sd < 0.05, "{sd}");
        }
        let (_, near) = gp.predict(&[0.55]);
        let (_, far) = gp.predict(&[3.0]);
        assert!(far > near * 5.0, "near {near}, far {far}");
    }

    #[test]
    fn expected_improvement_prefers_a_low_mean_and_then_uncertainty() {
        let best = 0.0;
        assert!(expected_improvement(best, -1.0, 0.1) > expected_improvement(best, 1.0, 0.1));
        assert!(expected_improvement(best, 1.0, 2.0) > expected_improvement(best, 1.0, 0.1));
        assert!(expected_improvement(best, 5.0, 0.0) == 0.0);
        // The normal CDF behind it.
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.959_964) - 0.975).abs() < 1e-6);
        assert!(normal_cdf(-8.0) < 1e-12);
    }

    #[test]
    fn a_non_finite_target_is_not_fitted() {
        let p = [0.0];
        assert!(Surrogate::fit(&[(&p, f64::NAN)]).is_none());
        assert!(Surrogate::fit(&[]).is_none());
    }
}
