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
//! Matérn 5/2 kernel with a length scale per parameter. Targets: log
//! screened time, standardized.
//!
//! Why a length scale per parameter: parameters do not matter alike. On a
//! convolution, moving the block width one step can double the time while
//! the padding flag changes nothing; with one scale for all, the process
//! either trusts the flag's neighbours too little (and screens both
//! sides of every flag) or the width's too much. The scales are the ones
//! under which the screened figures are likeliest (the marginal likelihood
//! of type-II maximum likelihood, as every Bayesian-optimization library
//! fits them), chosen per parameter from a few values ([`LENGTH_GRID`])
//! on a bounded subset of the points, so a fit stays cheap however many
//! there are.
//!
//! Everything here is small dense linear algebra (at most a few hundred
//! screened points), written out rather than pulled in as a dependency.

use std::collections::{BTreeMap, BTreeSet};

/// Length scale of the kernel over the [0, 1] positions of a parameter's
/// values before the figures say otherwise: about one parameter moved
/// across most of its range, or a few moved a step each, before two times
/// stop telling about each other.
pub(super) const LENGTH_SCALE: f64 = 0.8;
/// The length scales a parameter may get. None shorter: a scale much below
/// the step between two values makes every candidate a stranger to its
/// neighbours, and the search screens at random (measured on pnpoly at
/// 2.5 %, 30 seeds: P(optimum) 0.27 with 0.1 and 0.2 allowed, 0.53
/// without). The longest is a parameter that barely matters.
const LENGTH_GRID: [f64; 4] = [0.4, LENGTH_SCALE, 1.6, 4.0];
/// Passes over the parameters when choosing their scales (each pass tries
/// every value of [`LENGTH_GRID`] for one parameter, the others held).
const LENGTH_PASSES: usize = 2;
/// Points the likelihood is evaluated on at most: the fastest half of
/// them, then an even spread of the rest (the scales matter most where the
/// fast configurations are). Bounds a choice to a few dozen small
/// factorizations.
const LIKELIHOOD_POINTS: usize = 64;
/// Fewer screened points than this say nothing about the scales: the
/// common one is kept.
const MIN_POINTS_FOR_SCALES: usize = 10;
/// Observation noise (in standardized units): the emulator's figures are
/// exact, a board's vary by about this much after the benchmark's
/// statistics; it also keeps the factorization well conditioned.
pub(super) const NOISE: f64 = 1e-4;
/// The noise assumed while choosing the scales: a little more than the
/// fit's, so that two near-equal figures a step apart do not alone push a
/// parameter's scale to the shortest.
const LIKELIHOOD_NOISE: f64 = 1e-3;

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

/// Matérn 5/2 correlation of two points, `lengths` the scale of each
/// parameter.
pub(super) fn kernel(a: &[f64], b: &[f64], lengths: &[f64]) -> f64 {
    let squared: f64 = a
        .iter()
        .zip(b)
        .zip(lengths)
        .map(|((x, y), length)| ((x - y) / length).powi(2))
        .sum();
    let r = (5.0 * squared).sqrt();
    (1.0 + r + r * r / 3.0) * (-r).exp()
}

/// `(point, log-time)` pairs a process is fitted to.
pub(super) type Samples<'a> = Vec<(&'a [f64], f64)>;

/// The factor's rows (row `i` holding its `i + 1` entries).
pub(super) type FactorRows = Vec<Vec<f64>>;

/// A Gaussian process fitted to screened points: each parameter's length
/// scale and the kernel matrix's factor. A screening step predicts with it
/// through [`super::posterior::Posterior`].
#[derive(Clone)]
pub(super) struct Surrogate<'a> {
    /// The pairs fitted.
    samples: Samples<'a>,
    /// Lower-triangular Cholesky factor of the kernel matrix.
    rows: FactorRows,
    /// Each parameter's length scale.
    lengths: Vec<f64>,
}

impl<'a> Surrogate<'a> {
    /// Fit to `(point, log-time)` pairs, each parameter's length scale
    /// chosen by the likelihood of the pairs ([`likeliest_lengths`]).
    /// `None` without any point or when the kernel matrix is not positive
    /// definite (it always is with the noise term; a failure means
    /// non-finite inputs).
    pub(super) fn fit(samples: Samples<'a>) -> Option<Self> {
        if samples.iter().any(|s| !s.1.is_finite()) {
            return None;
        }
        let lengths = likeliest_lengths(&samples, samples.first()?.0.len());
        Self::fit_with(samples, lengths)
    }

    fn fit_with(samples: Samples<'a>, lengths: Vec<f64>) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|s| !s.1.is_finite()) {
            return None;
        }
        let rows = factorized(&samples, &lengths, NOISE)?;
        Some(Self {
            samples,
            rows,
            lengths,
        })
    }

    /// The fitted pairs, the factor's rows (row `i` holding its `i + 1`
    /// entries) and the length scales.
    pub(super) fn into_parts(self) -> (Samples<'a>, FactorRows, Vec<f64>) {
        (self.samples, self.rows, self.lengths)
    }

    /// Fit to `samples` with this process's length scales, as a step
    /// extends a fit with pending points (its tests compare the two).
    #[cfg(test)]
    pub(super) fn refit(&self, samples: Samples<'a>) -> Option<Self> {
        Self::fit_with(samples, self.lengths.clone())
    }
}

/// The targets standardized, with their mean and scale.
pub(super) fn standardized(samples: &[(&[f64], f64)]) -> (Vec<f64>, f64, f64) {
    let n = samples.len() as f64;
    let mean = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let variance = samples.iter().map(|s| (s.1 - mean).powi(2)).sum::<f64>() / n;
    // One point, or all equal: any positive scale will do.
    let scale = if variance > 1e-24 {
        variance.sqrt()
    } else {
        1.0
    };
    let targets = samples.iter().map(|s| (s.1 - mean) / scale).collect();
    (targets, mean, scale)
}

/// The Cholesky factor of the kernel matrix of `samples` plus `noise` on
/// its diagonal, by rows; `None` when it is not positive definite.
fn factorized(samples: &[(&[f64], f64)], lengths: &[f64], noise: f64) -> Option<FactorRows> {
    let n = samples.len();
    let mut factor = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            factor[i * n + j] = kernel(samples[i].0, samples[j].0, lengths);
        }
        factor[i * n + i] += noise;
    }
    cholesky(&mut factor, n)?;
    Some(
        (0..n)
            .map(|i| factor[i * n..i * n + i + 1].to_vec())
            .collect(),
    )
}

/// Log marginal likelihood of the standardized `samples` under `lengths`
/// (up to a constant): the fit to the figures minus the model's
/// complexity.
fn log_likelihood(samples: &[(&[f64], f64)], lengths: &[f64]) -> Option<f64> {
    let rows = factorized(samples, lengths, LIKELIHOOD_NOISE)?;
    let (targets, _, _) = standardized(samples);
    let whitened = solve_lower(&rows, targets);
    let fit: f64 = whitened.iter().map(|x| x * x).sum();
    let log_determinant: f64 = rows.iter().map(|row| row[row.len() - 1].ln()).sum();
    Some(-0.5 * fit - log_determinant)
}

/// The length scale of each of `dimensions` parameters under which
/// `samples` are likeliest: coordinate passes over [`LENGTH_GRID`] from
/// [`LENGTH_SCALE`], on at most [`LIKELIHOOD_POINTS`] of them. Few points
/// keep the common scale.
fn likeliest_lengths(samples: &[(&[f64], f64)], dimensions: usize) -> Vec<f64> {
    let mut lengths = vec![LENGTH_SCALE; dimensions];
    if samples.len() < MIN_POINTS_FOR_SCALES {
        return lengths;
    }
    let subset = likelihood_subset(samples);
    let Some(mut best) = log_likelihood(&subset, &lengths) else {
        return lengths;
    };
    for _ in 0..LENGTH_PASSES {
        for d in 0..dimensions {
            let mut chosen = lengths[d];
            for length in LENGTH_GRID {
                if length == chosen {
                    continue;
                }
                lengths[d] = length;
                if let Some(likelihood) = log_likelihood(&subset, &lengths)
                    && likelihood > best
                {
                    best = likelihood;
                    chosen = length;
                }
            }
            lengths[d] = chosen;
        }
    }
    lengths
}

/// At most [`LIKELIHOOD_POINTS`] of `samples`: the fastest half of them,
/// then an even spread of the rest, fastest first.
fn likelihood_subset<'a>(samples: &[(&'a [f64], f64)]) -> Vec<(&'a [f64], f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.1.total_cmp(&b.1));
    if sorted.len() <= LIKELIHOOD_POINTS {
        return sorted;
    }
    let head = LIKELIHOOD_POINTS / 2;
    let rest = &sorted[head..];
    let spread = LIKELIHOOD_POINTS - head;
    let mut subset = sorted[..head].to_vec();
    subset.extend((0..spread).map(|k| rest[k * rest.len() / spread]));
    subset
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

/// Solves `L x = b` for the factor's rows.
pub(super) fn solve_lower(rows: &[Vec<f64>], mut b: Vec<f64>) -> Vec<f64> {
    for (i, row) in rows.iter().enumerate() {
        b[i] = solved_entry(row, &b[..i], b[i]);
    }
    b
}

/// The next entry of a forward solve against `row`, whose entries before
/// it are `solved`: `value` less the row's products with them, over the
/// row's diagonal. The one sum behind every prediction, so a solve
/// extended by a row later (a pending point) adds exactly what a solve
/// from scratch would.
pub(super) fn solved_entry(row: &[f64], solved: &[f64], value: f64) -> f64 {
    let mut sum = value;
    for (l, x) in row.iter().zip(solved) {
        sum -= l * x;
    }
    sum / row[row.len() - 1]
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
    fn a_parameter_that_changes_nothing_gets_the_longest_scale() {
        // Time follows the first parameter sharply; the second is noise-free
        // and irrelevant.
        let points: Vec<Vec<f64>> = (0..8)
            .flat_map(|i| (0..4).map(move |j| vec![f64::from(i) / 7.0, f64::from(j) / 3.0]))
            .collect();
        let samples: Vec<(&[f64], f64)> = points
            .iter()
            .map(|p| (p.as_slice(), (6.0 * p[0]).sin()))
            .collect();
        let lengths = likeliest_lengths(&samples, 2);
        assert_eq!(lengths[1], 4.0, "{lengths:?}");
        assert!(lengths[0] < lengths[1], "{lengths:?}");
        // Too few points: the common scale.
        assert_eq!(likeliest_lengths(&samples[..5], 2), vec![LENGTH_SCALE; 2]);
        // The fit uses them: the irrelevant parameter's far values predict
        // the near ones' times.
        let gp = Surrogate::fit(samples.clone()).expect("fit");
        let (mean, _) = gp.predict(&[3.0 / 7.0, 0.5]);
        assert!((mean - (6.0_f64 * 3.0 / 7.0).sin()).abs() < 0.05, "{mean}");
    }

    #[test]
    fn the_likelihood_subset_keeps_the_fastest_half_and_a_spread() {
        let points: Vec<Vec<f64>> = (0..200).map(|i| vec![f64::from(i)]).collect();
        let samples: Vec<(&[f64], f64)> = points.iter().map(|p| (p.as_slice(), -p[0])).collect();
        let subset = likelihood_subset(&samples);
        assert_eq!(subset.len(), LIKELIHOOD_POINTS);
        // The fastest (lowest) 32 first, then every few of the rest down to
        // near the slowest.
        assert_eq!(subset[0].1, -199.0);
        assert_eq!(subset[31].1, -168.0);
        assert!(subset[LIKELIHOOD_POINTS - 1].1 > -10.0);
        assert_eq!(likelihood_subset(&samples[..20]).len(), 20);
    }

    #[test]
    fn a_non_finite_target_is_not_fitted() {
        let p = [0.0];
        assert!(Surrogate::fit(vec![(&p, f64::NAN)]).is_none());
        assert!(Surrogate::fit(Vec::new()).is_none());
    }
}
