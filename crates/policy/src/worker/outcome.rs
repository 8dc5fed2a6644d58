//! What the policy reads out of tool results and writes into its answer:
//! one [`CandidateOutcome`] per candidate, the patterns that find artifacts
//! and figures in tool results, and the answer's ```` ```json ```` block
//! (`mtswarm_core::answer::last_json` reads it back).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One candidate's figures as the policy saw them in the benchmark result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateOutcome {
    /// Position in the task's candidate list (0-based; the `c<index>` of call ids).
    pub index: usize,
    /// The candidate's `-D` map, values as text.
    pub defines: BTreeMap<String, String>,
    /// Artifact id of its last successful compile (`b<n>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// Median of the benchmark's timed runs, seconds; `None` until benchmarked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_seconds: Option<f64>,
    /// Throughput the benchmark reported, GFLOPS (absent when its runs
    /// counted no flops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    /// Share of the modeled peak of the cores used, percent, as the
    /// benchmark reported it.
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

    /// Read a benchmark tool result into the figures (or the failure);
    /// true when it gave a median and did not fail.
    pub(crate) fn read_benchmark(&mut self, content: &str) -> bool {
        let median = capture_f64(&MEDIAN, content);
        let ok = median.is_some()
            && !content.starts_with("error")
            && !content.contains("benchmark FAILED");
        if ok {
            self.median_seconds = median;
            self.gflops = capture_f64(&GFLOPS, content);
            self.peak_percent = capture_f64(&PEAK, content);
        } else {
            self.failure = Some(format!("benchmark: {}", first_line(content)));
        }
        ok
    }

    /// The candidate's defines and figures for an answer's headline:
    /// `N=4 with median 1.0000e-4 s, 10.00 GFLOPS`.
    pub(crate) fn figures_text(&self) -> String {
        format!(
            "{} with median {:.4e} s{}",
            defines_text(&self.defines),
            self.median_seconds.unwrap_or_default(),
            self.gflops
                .map(|g| format!(", {g:.2} GFLOPS"))
                .unwrap_or_default()
        )
    }
}

/// A regular expression written in this crate. One that does not compile
/// is a bug the tests catch; in a running daemon it is logged once and
/// matches nothing, so a tool result reads as having no such figure rather
/// than taking the worker down.
pub(crate) struct Pattern(Option<Regex>);

impl Pattern {
    pub(crate) fn new(pattern: &str) -> Self {
        match Regex::new(pattern) {
            Ok(re) => Self(Some(re)),
            Err(error) => {
                tracing::error!(%error, pattern, "built-in pattern does not compile; it matches nothing");
                Self(None)
            }
        }
    }

    /// [`Regex::captures`], or `None` when the pattern did not compile.
    pub(crate) fn captures<'t>(&self, text: &'t str) -> Option<Captures<'t>> {
        self.0.as_ref()?.captures(text)
    }
}

pub(crate) static ARTIFACT: LazyLock<Pattern> =
    LazyLock::new(|| Pattern::new(r"as artifact (b[0-9]+)"));
pub(crate) static MEDIAN: LazyLock<Pattern> =
    LazyLock::new(|| Pattern::new(r"median ([0-9.]+(?:[eE][-+]?[0-9]+)?) s"));
pub(crate) static GFLOPS: LazyLock<Pattern> = LazyLock::new(|| Pattern::new(r"([0-9.]+) GFLOPS"));
pub(crate) static PEAK: LazyLock<Pattern> =
    LazyLock::new(|| Pattern::new(r"\(([0-9.]+)% of peak\)"));

/// The artifact id (`b<n>`) a compile or build result names, if any.
pub(crate) fn artifact_id(content: &str) -> Option<String> {
    ARTIFACT
        .captures(content)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
}

pub(crate) fn capture_f64(re: &Pattern, text: &str) -> Option<f64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles_and_reads_a_benchmark_line() {
        for pattern in [&ARTIFACT, &MEDIAN, &GFLOPS, &PEAK] {
            assert!(pattern.0.is_some());
        }
        let line = "artifact b2 on 4 cores: median 1.0000e-4 s, trimmed mean 1e-4 s \
                    over 3 runs (min 1, max 2), 10.00 GFLOPS (2.0% of peak)";
        assert_eq!(capture_f64(&MEDIAN, line), Some(1.0e-4));
        assert_eq!(capture_f64(&GFLOPS, line), Some(10.0));
        assert_eq!(capture_f64(&PEAK, line), Some(2.0));
        let compiled = "compiled as artifact b7 (defines N=4)";
        assert_eq!(artifact_id(compiled).as_deref(), Some("b7"));
    }

    #[test]
    fn a_pattern_that_does_not_compile_matches_nothing() {
        let broken = Pattern::new("(unclosed");
        assert!(broken.0.is_none());
        assert!(broken.captures("(unclosed").is_none());
        assert_eq!(capture_f64(&broken, "(unclosed"), None);
    }
}
