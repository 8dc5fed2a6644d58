//! The search plan's predictor: an additive model of log-time over the
//! parameter values, and the distances between configurations that break
//! its ties.

use std::collections::{BTreeSet, HashMap};

use crate::policy::outcome::CandidateOutcome;

/// log-time = mean + one effect per (parameter, value), fitted by a few
/// rounds of backfitting on the screened candidates.
pub(super) struct AdditiveModel {
    mean: f64,
    effects: HashMap<String, HashMap<String, f64>>,
}

impl AdditiveModel {
    pub(super) fn fit(samples: &[(&CandidateOutcome, f64)]) -> Self {
        let mut model = Self {
            mean: 0.0,
            effects: HashMap::new(),
        };
        if samples.is_empty() {
            return model;
        }
        model.mean = samples.iter().map(|s| s.1).sum::<f64>() / samples.len() as f64;
        let names: BTreeSet<&String> = samples.iter().flat_map(|s| s.0.defines.keys()).collect();
        for _ in 0..4 {
            for name in &names {
                let mut sums: HashMap<String, (f64, u32)> = HashMap::new();
                for (o, y) in samples {
                    let value = o.defines.get(*name).cloned().unwrap_or_default();
                    let others = model.predict(o) - model.effect(name, &value);
                    let entry = sums.entry(value).or_insert((0.0, 0));
                    entry.0 += y - others;
                    entry.1 += 1;
                }
                let effects: HashMap<String, f64> = sums
                    .into_iter()
                    .map(|(v, (sum, n))| (v, sum / f64::from(n)))
                    .collect();
                model.effects.insert((*name).clone(), effects);
            }
        }
        model
    }

    fn effect(&self, name: &str, value: &str) -> f64 {
        self.effects
            .get(name)
            .and_then(|e| e.get(value))
            .copied()
            .unwrap_or(0.0)
    }

    /// Predicted log-time; an unseen value takes its parameter's best
    /// (lowest) effect.
    pub(super) fn predict(&self, o: &CandidateOutcome) -> f64 {
        let mut total = self.mean;
        for (name, effects) in &self.effects {
            let value = o.defines.get(name).map(String::as_str).unwrap_or("");
            total += match effects.get(value) {
                Some(e) => *e,
                None => effects
                    .values()
                    .copied()
                    .fold(f64::INFINITY, f64::min)
                    .min(0.0),
            };
        }
        total
    }
}

/// Every pair of `-D` settings of a configuration (the interactions an
/// additive model cannot see).
pub(super) fn pairs(o: &CandidateOutcome) -> Vec<(&str, &str, &str, &str)> {
    let items: Vec<(&String, &String)> = o.defines.iter().collect();
    let mut out = Vec::with_capacity(items.len() * items.len() / 2);
    for (i, (k1, v1)) in items.iter().enumerate() {
        for (k2, v2) in &items[i + 1..] {
            out.push((k1.as_str(), v1.as_str(), k2.as_str(), v2.as_str()));
        }
    }
    out
}

/// Parameters whose `-D` values differ.
pub(super) fn distance(a: &CandidateOutcome, b: &CandidateOutcome) -> usize {
    let keys: BTreeSet<&String> = a.defines.keys().chain(b.defines.keys()).collect();
    keys.into_iter()
        .filter(|k| a.defines.get(*k) != b.defines.get(*k))
        .count()
}
