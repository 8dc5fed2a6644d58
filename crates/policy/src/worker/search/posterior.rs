//! The process's predictions at every candidate of one screening step,
//! kept current while points are added as pending ones.
//!
//! Why it exists: a screening step predicts every candidate it may screen,
//! then picks a batch, each pick as if the points ahead of it (the other
//! agents' running configurations, this agent's builds in flight, the
//! picks before it) had returned their predicted time: the "kriging
//! believer" of batch Bayesian optimization. Refitting the process with
//! those points and predicting every candidate again costs a triangular
//! solve per candidate, quadratic in the points, per pick. Appending a
//! point to a Cholesky factor appends one row and leaves the others as they
//! are, so each candidate's solve only gains one entry per pending point:
//! linear per candidate. The figures are the refit's to the last bit (the
//! same sums in the same order); with a few hundred points and a thousand
//! candidates a step is several times cheaper.
//!
//! As in a refit, the targets are standardized again over the fitted and
//! the pending points: the pending ones, picked for their low predictions,
//! lower the prior mean and widen the scale, which keeps a batch exploring.

use super::surrogate::{
    FactorRows, NOISE, Samples, Surrogate, kernel, solve_lower, solved_entry, standardized,
};

/// Predictions of a [`Surrogate`] at a fixed list of points (the
/// candidates of a step), with pending points added in groups.
pub(super) struct Posterior<'a> {
    lengths: Vec<f64>,
    /// The fitted then the pending points, with their log-times.
    samples: Samples<'a>,
    /// Lower-triangular Cholesky factor of the samples' kernel matrix (plus
    /// the noise), row `i` holding its `i + 1` entries.
    rows: FactorRows,
    /// The standardized targets' mean and scale, and `K^-1` times them.
    mean: f64,
    scale: f64,
    weights: Vec<f64>,
    tracked: Vec<Tracked<'a>>,
}

/// A point predicted at every step: its kernel with each sample and the
/// forward solve of that against the factor (`L^-1 k`), both one entry
/// longer per pending point.
struct Tracked<'a> {
    point: &'a [f64],
    cross: Vec<f64>,
    whitened: Vec<f64>,
}

impl<'a> Posterior<'a> {
    /// Predicts every one of `points` under `gp`.
    pub(super) fn new(gp: Surrogate<'a>, points: Vec<&'a [f64]>) -> Self {
        let (samples, rows, lengths) = gp.into_parts();
        let tracked = points
            .into_iter()
            .map(|point| {
                let cross: Vec<f64> = samples
                    .iter()
                    .map(|s| kernel(s.0, point, &lengths))
                    .collect();
                let whitened = solve_lower(&rows, cross.clone());
                Tracked {
                    point,
                    cross,
                    whitened,
                }
            })
            .collect();
        let mut posterior = Self {
            lengths,
            samples,
            rows,
            mean: 0.0,
            scale: 1.0,
            weights: Vec::new(),
            tracked,
        };
        posterior.standardize();
        posterior
    }

    /// Adds `points` as measured at what the process predicts for them now,
    /// as a refit with them would. `false` (and nothing added) when the
    /// extended kernel matrix is not positive definite, as a refit would
    /// fail.
    pub(super) fn add_pending(&mut self, points: &[&'a [f64]]) -> bool {
        if points.is_empty() {
            return true;
        }
        let predicted: Vec<f64> = points.iter().map(|p| self.predict_at(p).0).collect();
        let fitted = self.rows.len();
        for point in points {
            let cross: Vec<f64> = self
                .samples
                .iter()
                .map(|s| kernel(point, s.0, &self.lengths))
                .collect();
            let mut row = solve_lower(&self.rows, cross);
            // The diagonal: the point's own kernel (exactly one) and the
            // noise, less the row's squares one by one, as the
            // factorization subtracts them.
            let mut diagonal = kernel(point, point, &self.lengths) + NOISE;
            for x in &row {
                diagonal -= x * x;
            }
            if diagonal <= 0.0 || !diagonal.is_finite() {
                self.rows.truncate(fitted);
                self.samples.truncate(fitted);
                return false;
            }
            row.push(diagonal.sqrt());
            self.rows.push(row);
            self.samples.push((point, f64::NAN));
        }
        for (sample, value) in self.samples[fitted..].iter_mut().zip(predicted) {
            sample.1 = value;
        }
        for tracked in &mut self.tracked {
            for &(point, _) in &self.samples[fitted..] {
                let k = kernel(point, tracked.point, &self.lengths);
                tracked.cross.push(k);
                let row = &self.rows[tracked.whitened.len()];
                let entry = solved_entry(row, &tracked.whitened, k);
                tracked.whitened.push(entry);
            }
        }
        self.standardize();
        true
    }

    /// Mean and standard deviation of the log-time at tracked point `i`.
    pub(super) fn predict(&self, i: usize) -> (f64, f64) {
        let tracked = &self.tracked[i];
        self.to_log(&tracked.cross, &tracked.whitened)
    }

    /// Mean and standard deviation of the log-time at any `point`.
    fn predict_at(&self, point: &[f64]) -> (f64, f64) {
        let cross: Vec<f64> = self
            .samples
            .iter()
            .map(|s| kernel(s.0, point, &self.lengths))
            .collect();
        let whitened = solve_lower(&self.rows, cross.clone());
        self.to_log(&cross, &whitened)
    }

    fn to_log(&self, cross: &[f64], whitened: &[f64]) -> (f64, f64) {
        let mean: f64 = cross.iter().zip(&self.weights).map(|(k, w)| k * w).sum();
        let variance = (1.0 - whitened.iter().map(|x| x * x).sum::<f64>()).max(1e-12);
        (self.mean + self.scale * mean, self.scale * variance.sqrt())
    }

    /// Standardizes the targets over every sample and solves for the
    /// weights.
    fn standardize(&mut self) {
        let (targets, mean, scale) = standardized(&self.samples);
        self.mean = mean;
        self.scale = scale;
        self.weights = solve_transposed(&self.rows, solve_lower(&self.rows, targets));
    }
}

#[cfg(test)]
impl Surrogate<'_> {
    /// Mean and standard deviation of the log-time at `point`: what a
    /// step without pending points predicts there.
    pub(super) fn predict(&self, point: &[f64]) -> (f64, f64) {
        Posterior::new(self.clone(), vec![point]).predict(0)
    }
}

/// Solves `L^T x = b` for the factor's rows (the weights' second solve).
fn solve_transposed(rows: &[Vec<f64>], mut b: Vec<f64>) -> Vec<f64> {
    for i in (0..rows.len()).rev() {
        let mut sum = b[i];
        for k in i + 1..rows.len() {
            sum -= rows[k][i] * b[k];
        }
        b[i] = sum / rows[i][i];
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points on a line.
    fn line(count: usize) -> Vec<Vec<f64>> {
        (0..count)
            .map(|i| vec![i as f64 / (count - 1) as f64])
            .collect()
    }

    /// The smooth log-time the tests fit.
    fn samples(points: &[Vec<f64>]) -> Vec<(&[f64], f64)> {
        points
            .iter()
            .map(|p| (p.as_slice(), (4.0 * p[0]).sin() + p[1]))
            .collect()
    }

    /// A fit to `screened`, and every point of `candidates` tracked.
    fn fitted<'a>(
        screened: &'a [Vec<f64>],
        candidates: &'a [Vec<f64>],
    ) -> (Surrogate<'a>, Posterior<'a>) {
        let gp = Surrogate::fit(samples(screened)).expect("fit");
        let posterior = Posterior::new(gp.clone(), candidates.iter().map(Vec::as_slice).collect());
        (gp, posterior)
    }

    /// A plane of points, two parameters.
    fn plane(side: usize) -> Vec<Vec<f64>> {
        line(side)
            .iter()
            .flat_map(|x| line(side).into_iter().map(move |y| vec![x[0], y[0]]))
            .collect()
    }

    #[test]
    fn the_process_interpolates_its_points_and_is_unsure_far_from_them() {
        let points = [vec![0.0], vec![0.5], vec![1.0]];
        let samples: Vec<(&[f64], f64)> = points
            .iter()
            .zip([1.0, -1.0, 2.0])
            .map(|(p, y)| (p.as_slice(), y))
            .collect();
        let gp = Surrogate::fit(samples.clone()).expect("fit");
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
    fn without_pending_points_it_predicts_as_the_process_does() {
        let screened = plane(4);
        let candidates = plane(9);
        let (gp, posterior) = fitted(&screened, &candidates);
        for (i, candidate) in candidates.iter().enumerate() {
            assert_eq!(posterior.predict(i), gp.predict(candidate), "at {i}");
        }
    }

    #[test]
    fn pending_points_predict_as_a_refit_with_them_to_the_last_bit() {
        let screened = plane(4);
        let candidates = plane(9);
        let (gp, mut posterior) = fitted(&screened, &candidates);
        // A group of two (as running configurations are added), then one.
        let groups: [&[&[f64]]; 2] = [&[&[0.1, 0.2], &[0.9, 0.4]], &[&[0.5, 0.5]]];
        let mut samples = samples(&screened);
        let mut refit = gp;
        for group in groups {
            let values: Vec<f64> = group.iter().map(|p| refit.predict(p).0).collect();
            samples.extend(group.iter().copied().zip(values));
            refit = refit.refit(samples.clone()).expect("refit");
            assert!(posterior.add_pending(group));
            for (i, candidate) in candidates.iter().enumerate() {
                assert_eq!(posterior.predict(i), refit.predict(candidate), "at {i}");
            }
        }
    }

    #[test]
    fn a_pending_point_lowers_the_spread_around_it() {
        let screened = plane(3);
        let candidates = plane(9);
        let (_, mut posterior) = fitted(&screened, &candidates);
        // (0.25, 0.25) is tracked point 2 * 9 + 2.
        let at = 2 * 9 + 2;
        let (_, before) = posterior.predict(at);
        assert!(posterior.add_pending(&[&[0.25, 0.25]]));
        let (_, after) = posterior.predict(at);
        assert!(after < before * 0.1, "{after} vs {before}");
    }
}
