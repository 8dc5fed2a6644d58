//! Every candidate of a job, once: the results store keeps one record per
//! candidate and status (a candidate may be screened, then benchmarked, or
//! measured again by another agent), and a report counts candidates, not
//! records. This module folds the records into one [`CandidateEntry`] per
//! distinct (kernel hash, parameters) and groups the entries by status with
//! the reasons they carry, so the page can say "12 pruned: roofline bound
//! below the best".
//!
//! The vocabulary every output uses:
//! - *considered*: candidates with any record (a pruned or skipped
//!   candidate has one saying why it did not run);
//! - *measured*: candidates that ran on a slice (screened, benchmarked,
//!   flagged, wrong answer or timed out): what the search spent hardware on;
//! - *benchmarked*: candidates with a timed run (status `benchmarked` or
//!   `flagged`, or `invalid` with run samples: timed, wrong answer);
//! - *valid*: benchmarked with the right answer and no plausibility flag.

use std::collections::BTreeMap;

use mtswarm_bus::ResultRecord;
use mtswarm_bus::results::CandidateStatus;
use serde::{Deserialize, Serialize};

/// Longest reason kept, in characters (compile logs can be pages long).
const MAX_REASON_CHARS: usize = 160;

/// One distinct candidate and the most telling of its records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CandidateEntry {
    /// The `-D` parameters.
    pub params: BTreeMap<String, String>,
    /// Its most telling status over all its records.
    pub status: CandidateStatus,
    /// Why it has this status (first line of the reason, error or flags).
    pub reason: Option<String>,
    /// Ran on a slice (see the module docs).
    pub measured: bool,
    /// Had a timed run (see the module docs).
    pub benchmarked: bool,
    /// Benchmarked, right answer, no flag, with a figure.
    pub valid: bool,
    /// Measured GFLOPS; `None` when the record has no finite figure.
    pub gflops: Option<f64>,
    /// Fraction (0..1) of the modeled peak of the cores used.
    pub peak_fraction: Option<f64>,
    /// Median of the timed executions, seconds.
    pub median_seconds: Option<f64>,
    /// Slice of the session that built or measured it.
    pub slice: String,
    /// Agent that produced it.
    pub agent: String,
    /// Hash of the kernel source it was built from.
    pub kernel_hash: String,
    /// Cores the candidate ran on (0 = not recorded).
    pub cores: u32,
    /// Results-store records folded into this entry.
    pub records: u32,
}

/// How many distinct candidates a job had, in the words of the module docs:
/// the same fields in a report and in its JSON summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CandidateCounts {
    /// With any record (a pruned or skipped one included);
    /// `candidates_evaluated` in summaries written before the measured
    /// count existed.
    #[serde(alias = "candidates_evaluated")]
    pub candidates_considered: u64,
    /// Ran on a slice.
    pub candidates_measured: u64,
    /// Had a timed run (benchmarked, flagged, or invalid after running).
    pub candidates_benchmarked: u64,
    /// Benchmarked, with the right answer and no plausibility flag.
    pub valid_candidates: u64,
}

impl CandidateCounts {
    /// The counts of folded `candidates` (see [`fold`]).
    pub fn of(candidates: &[CandidateEntry]) -> Self {
        let count = |keep: fn(&CandidateEntry) -> bool| {
            candidates.iter().filter(|c| keep(c)).count() as u64
        };
        Self {
            candidates_considered: candidates.len() as u64,
            candidates_measured: count(|c| c.measured),
            candidates_benchmarked: count(|c| c.benchmarked),
            valid_candidates: count(|c| c.valid),
        }
    }
}

/// The candidates of one status, with the reasons they gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusGroup {
    /// The status the group's candidates share.
    pub status: CandidateStatus,
    /// Distinct candidates with this status.
    pub count: u64,
    /// Reasons with how many candidates gave one like it, most frequent
    /// first (ties: first seen first). Reasons that differ only in their
    /// numbers ("bound 1.3e-3 s cannot beat 7.6e-4 s") count as one, shown
    /// as the first one seen.
    pub reasons: Vec<(String, u64)>,
}

/// `reason` with every number replaced by `#`, so reasons of one kind
/// group together whatever figures they quote.
fn reason_kind(reason: &str) -> String {
    let mut kind = String::with_capacity(reason.len());
    let mut chars = reason.chars().peekable();
    while let Some(c) = chars.next() {
        if !c.is_ascii_digit() {
            kind.push(c);
            continue;
        }
        // Digits, a fraction and an exponent (`1.3280e-3`).
        while chars.next_if(|c| c.is_ascii_digit() || *c == '.').is_some() {}
        if chars.next_if(|c| *c == 'e' || *c == 'E').is_some() {
            chars.next_if(|c| *c == '-' || *c == '+');
            while chars.next_if(char::is_ascii_digit).is_some() {}
        }
        kind.push('#');
    }
    kind
}

/// A record's status with the run behind it: an `invalid` candidate whose
/// benchmark ran (samples recorded) was timed, one that crashed at
/// screening was not.
pub(crate) fn timed(record: &ResultRecord) -> bool {
    match record.status() {
        CandidateStatus::Benchmarked | CandidateStatus::Flagged => true,
        CandidateStatus::Invalid => !record.samples.is_empty() || record.stats.is_some(),
        _ => false,
    }
}

/// Whether a candidate with this (most telling) status ran on a slice:
/// pruned, not run, compiled-only and failed builds never reached one.
fn ran_on_a_slice(status: CandidateStatus) -> bool {
    matches!(
        status,
        CandidateStatus::Benchmarked
            | CandidateStatus::Flagged
            | CandidateStatus::Invalid
            | CandidateStatus::TimedOut
            | CandidateStatus::Screened
    )
}

/// Which record of a candidate tells its story: a benchmark beats a
/// failed benchmark beats a reason it was not benchmarked.
fn rank(record: &ResultRecord) -> u8 {
    match record.status() {
        CandidateStatus::Benchmarked if record.trustworthy() => 11,
        CandidateStatus::Benchmarked => 10,
        CandidateStatus::Flagged => 9,
        CandidateStatus::Invalid if timed(record) => 8,
        CandidateStatus::TimedOut => 7,
        CandidateStatus::Invalid => 6,
        CandidateStatus::Screened => 5,
        CandidateStatus::Pruned => 4,
        CandidateStatus::NotRun => 3,
        CandidateStatus::Compiled => 2,
        CandidateStatus::CompileFailed => 1,
        CandidateStatus::Unknown => 0,
    }
}

/// The first line of `text`, trimmed and cut to [`MAX_REASON_CHARS`].
fn one_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut short: String = line.chars().take(MAX_REASON_CHARS).collect();
    if line.chars().count() > MAX_REASON_CHARS {
        short.push_str("...");
    }
    Some(short)
}

fn reason_of(record: &ResultRecord) -> Option<String> {
    record
        .reason
        .as_deref()
        .and_then(one_line)
        .or_else(|| record.error.as_deref().and_then(one_line))
        .or_else(|| one_line(&record.flags.join("; ")))
}

fn entry_of(record: &ResultRecord) -> CandidateEntry {
    let valid = record.trustworthy();
    CandidateEntry {
        params: record.params.clone(),
        status: record.status(),
        reason: reason_of(record),
        measured: ran_on_a_slice(record.status()),
        benchmarked: timed(record),
        valid,
        gflops: record.gflops.filter(|g| g.is_finite()),
        peak_fraction: record.peak_fraction,
        median_seconds: record.stats.as_ref().map(|s| s.median),
        slice: record.slice_id.clone(),
        agent: record.agent_id.clone(),
        kernel_hash: record.kernel_hash.clone(),
        cores: record.cores,
        records: 1,
    }
}

/// One entry per distinct (kernel hash, parameters), from its most telling
/// record (highest GFLOPS among equals). Order: valid ones by GFLOPS (best
/// first), then the other benchmarked ones, then the rest by status.
pub fn fold(records: &[&ResultRecord]) -> Vec<CandidateEntry> {
    type Key = (String, Vec<(String, String)>);
    let mut kept: BTreeMap<Key, (u8, CandidateEntry)> = BTreeMap::new();
    for record in records {
        let key = (
            record.kernel_hash.clone(),
            record
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        let candidate = (rank(record), entry_of(record));
        match kept.get_mut(&key) {
            None => {
                kept.insert(key, candidate);
            }
            Some((rank, entry)) => {
                let records = entry.records + 1;
                let better = candidate.0 > *rank
                    || (candidate.0 == *rank
                        && candidate.1.gflops.unwrap_or(f64::NEG_INFINITY)
                            > entry.gflops.unwrap_or(f64::NEG_INFINITY));
                if better {
                    (*rank, *entry) = candidate;
                }
                entry.records = records;
            }
        }
    }
    let mut entries: Vec<(u8, CandidateEntry)> = kept.into_values().collect();
    entries.sort_by(|(ra, a), (rb, b)| {
        rb.cmp(ra).then_with(|| {
            b.gflops
                .unwrap_or(f64::NEG_INFINITY)
                .total_cmp(&a.gflops.unwrap_or(f64::NEG_INFINITY))
        })
    });
    entries.into_iter().map(|(_, entry)| entry).collect()
}

/// Candidates by status, in the order [`CandidateStatus::ALL`] lists them,
/// statuses without candidates left out.
pub fn status_groups(candidates: &[CandidateEntry]) -> Vec<StatusGroup> {
    CandidateStatus::ALL
        .into_iter()
        .filter_map(|status| {
            // (kind, first reason of that kind, candidates).
            let mut kinds: Vec<(String, String, u64)> = Vec::new();
            let mut count = 0u64;
            for entry in candidates.iter().filter(|c| c.status == status) {
                count += 1;
                let Some(reason) = &entry.reason else {
                    continue;
                };
                let kind = reason_kind(reason);
                match kinds.iter_mut().find(|(k, _, _)| *k == kind) {
                    Some((_, _, n)) => *n += 1,
                    None => kinds.push((kind, reason.clone(), 1)),
                }
            }
            // Stable: equal counts keep their first-seen order.
            kinds.sort_by_key(|k| std::cmp::Reverse(k.2));
            let reasons = kinds.into_iter().map(|(_, first, n)| (first, n)).collect();
            (count > 0).then_some(StatusGroup {
                status,
                count,
                reasons,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        params: &[(&str, &str)],
        status: CandidateStatus,
        gflops: Option<f64>,
    ) -> ResultRecord {
        ResultRecord {
            kernel_hash: "h".into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            status,
            gflops,
            valid: gflops.is_some(),
            ..ResultRecord::default()
        }
    }

    #[test]
    fn a_screened_then_benchmarked_candidate_counts_once_as_benchmarked() {
        let screened = record(&[("T", "8")], CandidateStatus::Screened, None);
        let benchmarked = record(&[("T", "8")], CandidateStatus::Benchmarked, Some(5.0));
        let pruned = record(&[("T", "4")], CandidateStatus::Pruned, None);
        let entries = fold(&[&screened, &benchmarked, &pruned]);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].status, CandidateStatus::Benchmarked);
        assert_eq!(entries[0].records, 2);
        assert!(entries[0].benchmarked && entries[0].valid);
        assert_eq!(entries[1].status, CandidateStatus::Pruned);
        assert!(!entries[1].benchmarked);
    }

    #[test]
    fn reasons_are_one_line_grouped_and_counted() {
        let mut a = record(&[("T", "1")], CandidateStatus::CompileFailed, None);
        a.reason = Some("\n  error: unknown type\nmore".into());
        let mut b = record(&[("T", "2")], CandidateStatus::CompileFailed, None);
        b.error = Some("error: unknown type".into());
        let mut c = record(&[("T", "3")], CandidateStatus::CompileFailed, None);
        c.reason = Some("x".repeat(500));
        let groups = status_groups(&fold(&[&a, &b, &c]));
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].count, 3);
        assert_eq!(groups[0].reasons[0], ("error: unknown type".to_string(), 2));
        assert_eq!(groups[0].reasons[1].0.chars().count(), MAX_REASON_CHARS + 3);
    }

    #[test]
    fn reasons_differing_only_in_numbers_group_under_the_first() {
        let pruned = |reason: &str, t: &str| {
            let mut r = record(&[("T", t)], CandidateStatus::Pruned, None);
            r.reason = Some(reason.into());
            r
        };
        let a = pruned(
            "pruned: roofline bound 1.3280e-3 s cannot beat 7.5781e-4 s",
            "1",
        );
        let b = pruned(
            "pruned: roofline bound 2.5e-3 s cannot beat 7.5781e-4 s",
            "2",
        );
        let c = pruned("pruned: roofline bound 9 s cannot beat 12.5 s", "3");
        let d = pruned("pruned: over the AM by 512 bytes", "4");
        let groups = status_groups(&fold(&[&a, &b, &c, &d]));
        assert_eq!(
            groups[0].reasons,
            [
                (
                    "pruned: roofline bound 1.3280e-3 s cannot beat 7.5781e-4 s".to_string(),
                    3
                ),
                ("pruned: over the AM by 512 bytes".to_string(), 1),
            ]
        );
        assert_eq!(
            reason_kind("kernel.c:12: error 3.5E+2x"),
            "kernel.c:#: error #x"
        );
    }
}
