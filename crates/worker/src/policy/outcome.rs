//! What the policy reads out of tool results and writes into its answer:
//! one [`CandidateOutcome`] per candidate, the patterns that find artifacts
//! and figures in tool results, and the answer's ```` ```json ```` block
//! (`mtswarm_core::answer::last_json` reads it back).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One candidate's figures as the policy saw them in the benchmark result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateOutcome {
    pub index: usize,
    pub defines: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_percent: Option<f64>,
    /// Why the candidate has no figure (compile error, invalid, denied, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Roofline bound from the estimate tool, seconds (search plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_seconds: Option<f64>,
    /// Time seen by the screening validation, seconds (search plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen_seconds: Option<f64>,
    /// Why the search did not run the candidate (pruned, out of budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl CandidateOutcome {
    pub(crate) fn new(index: usize, defines: BTreeMap<String, String>) -> Self {
        Self {
            index,
            defines,
            artifact: None,
            median_seconds: None,
            gflops: None,
            peak_percent: None,
            failure: None,
            estimate_seconds: None,
            screen_seconds: None,
            skipped: None,
        }
    }
}

pub(crate) static ARTIFACT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"as artifact (b[0-9]+)").expect("literal regex"));
pub(crate) static MEDIAN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"median ([0-9.]+(?:[eE][-+]?[0-9]+)?) s").expect("literal regex"));
pub(crate) static GFLOPS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"([0-9.]+) GFLOPS").expect("literal regex"));
pub(crate) static PEAK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\(([0-9.]+)% of peak\)").expect("literal regex"));

pub(crate) fn capture_f64(re: &Regex, text: &str) -> Option<f64> {
    re.captures(text)
        .and_then(|c| c.get(1))
        .and_then(|m| m.as_str().parse().ok())
}

pub(crate) fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    line.chars().take(300).collect()
}

pub(crate) fn defines_text(defines: &BTreeMap<String, String>) -> String {
    if defines.is_empty() {
        return "(defaults)".to_owned();
    }
    defines
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn final_error(reason: &str) -> String {
    format!(
        "The task could not be run: {reason}\n```json\n{}\n```",
        json!({"error": reason, "best": null})
    )
}
