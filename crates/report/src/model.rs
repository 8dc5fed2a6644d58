//! What the kernel's tune.toml and the chip model add to a report: the
//! tuning parameters in tune.toml order (the x axes of the GFLOPS-per-
//! parameter plots) and the roofline (the compute roof of the cores used,
//! the memory roof of their DDR bandwidth share, each valid candidate at
//! its modeled arithmetic intensity). Records alone know neither, so a
//! report without them derives the parameters from the records and leaves
//! the roofline out with a note.

use std::collections::{BTreeMap, BTreeSet};

use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::TuneSpace;
use serde::{Deserialize, Serialize};

use crate::candidates::CandidateEntry;

/// One tuning parameter and the values it is plotted against, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ParameterAxis {
    /// Parameter (`-D` macro) name.
    pub name: String,
    /// Its values along the axis, in plot order.
    pub values: Vec<String>,
    /// The value of candidates whose parameters do not name it.
    pub default: Option<String>,
    /// What the parameter means, from tune.toml.
    pub description: Option<String>,
}

impl ParameterAxis {
    /// The candidate's value of this parameter (its default when unnamed).
    pub fn value_of<'a>(&'a self, params: &'a BTreeMap<String, String>) -> Option<&'a str> {
        params
            .get(&self.name)
            .or(self.default.as_ref())
            .map(String::as_str)
    }
}

/// The roofline of the cores a job's candidates ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Roofline {
    /// Modeled FP64 peak of `cores` cores.
    pub peak_gflops: f64,
    /// DDR bandwidth share of those cores (their clusters' shares), GB/s.
    pub bandwidth_gbs: f64,
    /// Cores the roofline is for (those the candidates ran on).
    pub cores: u32,
    /// One per valid candidate with a modeled intensity.
    pub points: Vec<RooflinePoint>,
}

impl Roofline {
    /// Intensity (flops/byte) where the memory roof meets the compute roof.
    pub fn ridge(&self) -> f64 {
        self.peak_gflops / self.bandwidth_gbs
    }

    /// The attainable GFLOPS at `intensity`: min(peak, bandwidth x intensity).
    pub fn bound(&self, intensity: f64) -> f64 {
        self.peak_gflops.min(self.bandwidth_gbs * intensity)
    }
}

/// A valid candidate under the roofline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RooflinePoint {
    /// Modeled flops / modeled DDR bytes of one execution.
    pub intensity: f64,
    /// Measured.
    pub gflops: f64,
    /// The candidate's `-D` parameters.
    pub params: BTreeMap<String, String>,
    /// The point is the job's best candidate.
    pub best: bool,
}

/// Parameters that vary among the benchmarked candidates, when no tune.toml
/// says which are tuned: values sorted numerically when they are all
/// numbers, else as text.
pub(crate) fn derived_axes(candidates: &[CandidateEntry]) -> Vec<ParameterAxis> {
    let mut values: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for entry in candidates.iter().filter(|c| c.benchmarked) {
        for (name, value) in &entry.params {
            values.entry(name).or_default().insert(value);
        }
    }
    values
        .into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(name, v)| ParameterAxis {
            name: name.to_string(),
            values: sorted_values(v.into_iter().map(str::to_string).collect()),
            default: None,
            description: None,
        })
        .collect()
}

fn sorted_values(mut values: Vec<String>) -> Vec<String> {
    let numbers: Option<Vec<f64>> = values.iter().map(|v| v.trim().parse().ok()).collect();
    if let Some(numbers) = numbers {
        let mut paired: Vec<(f64, String)> = numbers.into_iter().zip(values).collect();
        paired.sort_by(|a, b| a.0.total_cmp(&b.0));
        return paired.into_iter().map(|(_, v)| v).collect();
    }
    values.sort();
    values
}

/// The tune.toml parameters in file order, values in file order; values
/// candidates ran with that the file does not list (a baseline override)
/// come last.
pub(crate) fn space_axes(space: &TuneSpace, candidates: &[CandidateEntry]) -> Vec<ParameterAxis> {
    space
        .params
        .iter()
        .map(|param| {
            let mut axis = ParameterAxis {
                name: param.name.clone(),
                values: param.values.iter().map(ToString::to_string).collect(),
                default: Some(param.default.to_string()),
                description: param.description.clone(),
            };
            let extra: BTreeSet<String> = candidates
                .iter()
                .filter(|c| c.benchmarked)
                .filter_map(|c| axis.value_of(&c.params).map(str::to_string))
                .filter(|v| !axis.values.contains(v))
                .collect();
            axis.values
                .extend(sorted_values(extra.into_iter().collect()));
            axis
        })
        .collect()
}

/// The roofline of the valid candidates and a note for the reader: why
/// there is none (no `[model]` table), or which candidates it leaves out.
pub(crate) fn roofline(
    space: &TuneSpace,
    spec: &ChipSpec,
    candidates: &[CandidateEntry],
    best: Option<&CandidateEntry>,
) -> (Option<Roofline>, Option<String>) {
    if space.model.is_none() {
        let note = format!(
            "no roofline: the {} tune.toml has no [model] table (flops and bytes per execution)",
            space.kernel
        );
        return (None, Some(note));
    }
    let valid: Vec<&CandidateEntry> = candidates.iter().filter(|c| c.valid).collect();
    // The cores of the best (all candidates of a job normally share a
    // slice shape), else of any valid one, else one cluster.
    let cores = best
        .map(|b| b.cores)
        .filter(|c| *c > 0)
        .or_else(|| valid.iter().map(|c| c.cores).find(|c| *c > 0))
        .unwrap_or(spec.cores_per_cluster)
        .max(1);
    // The same share as the tools' roofline estimate: a slice of one
    // cluster gets that cluster's DDR share, more cores span clusters.
    let clusters_used = cores
        .div_ceil(spec.cores_per_cluster.max(1))
        .clamp(1, spec.clusters.max(1));
    let bandwidth = spec.cluster_bandwidth() * f64::from(clusters_used);
    let mut points = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for entry in valid {
        let Some(gflops) = entry.gflops.filter(|g| *g > 0.0) else {
            continue;
        };
        match space.model_figures(&entry.params, spec) {
            Ok(Some((flops, bytes))) if flops > 0.0 && bytes > 0.0 => points.push(RooflinePoint {
                intensity: flops / bytes,
                gflops,
                params: entry.params.clone(),
                best: best.is_some_and(|b| {
                    b.params == entry.params && b.kernel_hash == entry.kernel_hash
                }),
            }),
            Ok(_) => failures.push("non-positive flops or bytes".to_string()),
            Err(error) => failures.push(error.to_string()),
        }
    }
    let roofline = Roofline {
        peak_gflops: spec.peak_flops(cores) / 1e9,
        bandwidth_gbs: bandwidth / 1e9,
        cores,
        points,
    };
    if !(roofline.peak_gflops > 0.0 && roofline.bandwidth_gbs > 0.0) {
        let note = "no roofline: the chip model has no peak or no DDR bandwidth".to_string();
        return (None, Some(note));
    }
    let note = failures.first().map(|first| {
        format!(
            "{} valid candidate(s) left out: their [model] figures could not be evaluated ({first})",
            failures.len()
        )
    });
    (Some(roofline), note)
}
