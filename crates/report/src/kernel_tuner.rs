//! A job's measurements as a Kernel Tuner cache file
//! (`mtswarm results JOB --format kernel-tuner`): the part of the landscape
//! the job measured, in the format the autotuning ecosystem reads
//! (`mtswarm_hw::landscape`), so a user can plot it with Kernel Tuner's
//! tools, continue it with Kernel Tuner, or replay a search on it.
//!
//! One entry per distinct candidate, told by its most telling record
//! ([`crate::candidates::fold`]): a valid figure is its median time, a
//! candidate that ran and failed (wrong answer, timeout, flagged figure)
//! is `RuntimeFailedConfig`, one that did not build is
//! `CompilationFailedConfig`; a candidate that never reached a slice
//! (pruned, not run) has no figure and is left out, as Kernel Tuner keeps
//! only what it measured.

use std::collections::{BTreeMap, BTreeSet};

use mtswarm_bus::ResultRecord;
use mtswarm_bus::results::CandidateStatus;
use mtswarm_hw::landscape::{DEFAULT_OBJECTIVE, Entry, Landscape, Outcome};
use mtswarm_hw::tune::{Config, ParamValue};

use crate::candidates::{CandidateEntry, fold};

/// Records that do not make one landscape.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// No record to export.
    #[error("no candidate record to export (check the job id and the filters)")]
    Empty,
    /// A cache holds one kernel.
    #[error("the records are of several kernels ({kernels}): select one with --kernel or a job")]
    SeveralKernels {
        /// The kernels, comma-separated.
        kernels: String,
    },
}

/// The records' candidates as a Kernel Tuner cache (see the module docs).
pub fn kernel_tuner_cache(records: &[ResultRecord]) -> Result<Landscape, ExportError> {
    let kernels: BTreeSet<&str> = records.iter().map(|r| r.kernel.as_str()).collect();
    match kernels.len() {
        0 => return Err(ExportError::Empty),
        1 => {}
        _ => {
            return Err(ExportError::SeveralKernels {
                kernels: kernels.into_iter().collect::<Vec<_>>().join(", "),
            });
        }
    }
    let kernel = kernels.into_iter().next().unwrap_or_default().to_owned();
    let refs: Vec<&ResultRecord> = records.iter().collect();
    let candidates = fold(&refs);
    let keys: Vec<String> = candidates
        .iter()
        .flat_map(|c| c.params.keys().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut values: BTreeMap<String, Vec<ParamValue>> = BTreeMap::new();
    let mut landscape = Landscape {
        device_name: device_name(records),
        kernel_name: kernel,
        keys: keys.clone(),
        values: BTreeMap::new(),
        objective: DEFAULT_OBJECTIVE.to_owned(),
        entries: Vec::new(),
    };
    let mut seen = BTreeSet::new();
    // `fold` lists the most telling first: of a candidate measured from
    // edited and pristine sources alike, the first (best) one stays.
    for candidate in &candidates {
        let Some(outcome) = outcome_of(candidate) else {
            continue;
        };
        let config: Config = keys
            .iter()
            .map(|k| {
                let text = candidate.params.get(k).map_or("", String::as_str);
                (k.clone(), param_value(text))
            })
            .collect();
        if !seen.insert(landscape.cache_key(&config)) {
            continue;
        }
        for (k, v) in &config {
            let list = values.entry(k.clone()).or_default();
            if !list.contains(v) {
                list.push(v.clone());
            }
        }
        landscape.entries.push(Entry { config, outcome });
    }
    for list in values.values_mut() {
        list.sort_by(compare);
    }
    landscape.values = values;
    Ok(landscape)
}

/// What a candidate's most telling record says, as a cache entry; `None`
/// for one that never ran.
fn outcome_of(candidate: &CandidateEntry) -> Option<Outcome> {
    let failed = |error: &str| {
        Some(Outcome::Failed {
            error: error.to_owned(),
        })
    };
    match candidate.status {
        CandidateStatus::CompileFailed => failed("CompilationFailedConfig"),
        _ if candidate.valid || candidate.status == CandidateStatus::Screened => candidate
            .median_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|seconds| Outcome::Measured {
                ms: seconds * 1000.0,
                runs_ms: Vec::new(),
            }),
        // Ran and failed: a wrong answer, a timeout, a figure not believed.
        CandidateStatus::Invalid
        | CandidateStatus::TimedOut
        | CandidateStatus::Flagged
        | CandidateStatus::Benchmarked => failed("RuntimeFailedConfig"),
        _ => None,
    }
}

/// `mtswarm emulator (board0-c0, board1-c0)`: the backends and slices.
fn device_name(records: &[ResultRecord]) -> String {
    let backends: BTreeSet<&str> = records.iter().map(|r| r.backend.as_str()).collect();
    let slices: BTreeSet<&str> = records.iter().map(|r| r.slice_id.as_str()).collect();
    let mut name = format!(
        "mtswarm {} ({})",
        backends.into_iter().collect::<Vec<_>>().join("+"),
        slices.into_iter().take(8).collect::<Vec<_>>().join(", ")
    );
    name.truncate(256);
    name
}

/// `-D` text as a tuning value: integers and numbers as such, else text.
fn param_value(text: &str) -> ParamValue {
    if let Ok(i) = text.parse::<i64>() {
        ParamValue::Int(i)
    } else {
        match text.parse::<f64>() {
            Ok(x) if x.is_finite() => ParamValue::Float(x),
            _ => ParamValue::Str(text.to_owned()),
        }
    }
}

/// Numbers in numeric order, before text in text order.
fn compare(a: &ParamValue, b: &ParamValue) -> std::cmp::Ordering {
    let number = |v: &ParamValue| match v {
        ParamValue::Int(i) => Some(*i as f64),
        ParamValue::Float(x) => Some(*x),
        ParamValue::Str(_) => None,
    };
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.to_string().cmp(&b.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_bus::results::ResultStats;

    fn record(
        params: &[(&str, &str)],
        status: CandidateStatus,
        median: Option<f64>,
    ) -> ResultRecord {
        let valid = matches!(
            status,
            CandidateStatus::Benchmarked | CandidateStatus::Screened
        );
        ResultRecord {
            record_id: format!("r-{params:?}-{status}"),
            kernel: "vecadd".into(),
            kernel_hash: "abc".into(),
            backend: "emulator".into(),
            slice_id: "emu0-c0".into(),
            params: params
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            status,
            valid,
            samples: median.map(|m| vec![m]).unwrap_or_default(),
            stats: median.map(|m| ResultStats {
                count: 1,
                median: m,
                trimmed_mean: m,
                min: m,
                max: m,
                stddev: 0.0,
            }),
            gflops: median.map(|m| 1.0 / m),
            ..ResultRecord::default()
        }
    }

    #[test]
    fn measured_failed_and_unrun_candidates_become_figures_errors_and_nothing() {
        let records = [
            record(
                &[("CHUNK", "512")],
                CandidateStatus::Benchmarked,
                Some(2e-3),
            ),
            record(
                &[("CHUNK", "1024")],
                CandidateStatus::Benchmarked,
                Some(1e-3),
            ),
            record(&[("CHUNK", "2048")], CandidateStatus::CompileFailed, None),
            record(&[("CHUNK", "4096")], CandidateStatus::Invalid, Some(5e-4)),
            record(&[("CHUNK", "8192")], CandidateStatus::Pruned, None),
        ];
        let landscape = kernel_tuner_cache(&records).expect("exports");
        assert_eq!(landscape.kernel_name, "vecadd");
        assert_eq!(landscape.keys, ["CHUNK"]);
        assert_eq!(landscape.entries.len(), 4, "the pruned one never ran");
        assert_eq!(
            landscape.optimum().map(|e| e.config["CHUNK"].clone()),
            Some(ParamValue::Int(1024))
        );
        let outcome = |chunk: i64| {
            landscape
                .entries
                .iter()
                .find(|e| e.config["CHUNK"] == ParamValue::Int(chunk))
                .map(|e| e.outcome.clone())
        };
        assert_eq!(outcome(512).and_then(|o| o.seconds()), Some(2e-3));
        assert_eq!(
            outcome(2048),
            Some(Outcome::Failed {
                error: "CompilationFailedConfig".into()
            })
        );
        assert_eq!(
            outcome(4096),
            Some(Outcome::Failed {
                error: "RuntimeFailedConfig".into()
            })
        );
        // Kernel Tuner reads it back the same.
        let back = Landscape::from_kernel_tuner_json(&landscape.to_kernel_tuner_json())
            .expect("reads back");
        assert_eq!(back.entries.len(), 4);
        assert_eq!(
            back.values["CHUNK"],
            [512, 1024, 2048, 4096].map(ParamValue::Int)
        );
    }

    #[test]
    fn records_of_several_kernels_or_none_are_refused() {
        let mut other = record(&[("N", "1")], CandidateStatus::Benchmarked, Some(1.0));
        other.kernel = "dgemm".into();
        let records = [
            record(
                &[("CHUNK", "512")],
                CandidateStatus::Benchmarked,
                Some(2e-3),
            ),
            other,
        ];
        assert!(matches!(
            kernel_tuner_cache(&records),
            Err(ExportError::SeveralKernels { .. })
        ));
        assert!(matches!(kernel_tuner_cache(&[]), Err(ExportError::Empty)));
    }
}
