//! Unit tests of records, queries and exports.

use super::*;
use crate::subjects;
use serde_json::json;

fn provenance() -> Provenance {
    Provenance {
        job_id: "job1".into(),
        task_id: "t1".into(),
        attempt: 2,
        agent_id: "a1".into(),
        session_id: "s1".into(),
        worker_id: "w1".into(),
        kernel: "dgemm".into(),
        call_id: "call-7".into(),
        timestamp_ms: Some(1_700_000_000_123),
        ..Default::default()
    }
}

#[test]
fn measurement_json_becomes_a_record_with_provenance() {
    let measurement = json!({
        "slice": "board0/c1", "backend": "emulator", "toolchain": "gcc 14",
        "kernel_hash": "abcdef0123456789abcdef", "defines": {"TILE": "64"},
        "cores": 24, "valid": true, "error": null, "failed_validation": false,
        "stats": {"count": 3, "median": 0.5, "trimmed_mean": 0.5, "min": 0.4,
                  "max": 0.6, "stddev": 0.08},
        "flops": 1000, "gflops": 2.0, "peak_fraction": 0.25,
        "speedup_over_baseline": null, "flags": [], "deterministic": true,
        "samples": [{"valid": true, "error": null, "modeled_cycles": 10,
                     "seconds": 0.4, "max_abs_err": null,
                     "counters": {"flops": 1000}}],
        "launches": 3, "wall_seconds": 1.5, "finished_at": 1_700_000_000u64,
        "exact": true, "spot_checked": true
    });
    let record =
        ResultRecord::from_measurement_json(&measurement, &provenance()).expect("converts");
    assert_eq!(record.record_id, "job1.t1.2.call-7");
    // One spelling: the bus form.
    assert_eq!(record.slice_id, "board0-c1");
    assert_eq!(record.params.get("TILE").map(String::as_str), Some("64"));
    assert_eq!(record.samples, vec![0.4]);
    assert_eq!(record.model, "builtin");
    assert_eq!(record.timestamp_ms, 1_700_000_000_123);
    assert!(record.reproduced, "the spot re-run is kept");
    assert_eq!(
        record.subject().expect("subject"),
        "mtswarm.measurement.job1.dgemm.abcdef0123456789.board0-c1"
    );
    let error = ResultRecord::from_measurement_json(&json!({"gflops": 1}), &provenance())
        .expect_err("no valid field");
    assert!(error.to_string().contains("valid"), "{error}");
}

#[test]
fn benchmark_failure_summary_becomes_an_invalid_record() {
    // What the benchmark tool returns when a launch times out.
    let summary = json!({
        "artifact": "b3", "kernel_hash": "0123abcd", "defines": {"TILE": "4096"},
        "valid": false, "error": "launch timed out after 120s",
    });
    let mut provenance = provenance();
    provenance.slice_id = "board2/c0".into();
    let record = ResultRecord::from_measurement_json(&summary, &provenance).expect("converts");
    assert!(!record.valid && !record.trustworthy());
    assert_eq!(record.slice_id, "board2-c0");
    assert_eq!(record.error.as_deref(), Some("launch timed out after 120s"));
    assert_eq!(record.params.get("TILE").map(String::as_str), Some("4096"));
    assert!(record.stats.is_none() && record.gflops.is_none());
    assert!(!record.reproduced);
    record.validate().expect("storable");
}

#[test]
fn filter_subject_narrows_by_tokens_only_when_exact() {
    let query = ResultQuery {
        kernel: Some("dgemm".into()),
        kernel_hash: Some("abcd".into()),
        slice: Some("b0/c1".into()),
        ..Default::default()
    };
    assert_eq!(
        query.filter_subject(),
        "mtswarm.measurement.*.dgemm.*.b0-c1"
    );
    assert_eq!(
        ResultQuery::default().filter_subject(),
        subjects::ALL_MEASUREMENTS
    );
}

#[test]
fn non_finite_numbers_and_bad_ids_are_rejected() {
    let mut record = ResultRecord {
        record_id: "r1".into(),
        job_id: "job1".into(),
        gflops: Some(f64::NAN),
        ..Default::default()
    };
    assert!(record.validate().is_err());
    record.gflops = Some(1.0);
    record.validate().expect("valid");
    record.record_id = "has space".into();
    assert!(record.validate().is_err());
    record.record_id = "r1".into();
    record.job_id = "a.b".into();
    assert!(record.validate().is_err());
}

#[test]
fn source_diffs_are_bounded_checked_and_old_records_still_read() {
    // A record written before source diffs existed reads as pristine.
    let old: ResultRecord = serde_json::from_value(json!({
        "record_id": "r1", "job_id": "job1", "kernel_hash": "abcd", "valid": true
    }))
    .expect("an old record reads");
    assert_eq!(old.source_diff, None);
    assert!(!old.source_edited());
    old.validate().expect("storable");

    let base = ResultRecord {
        record_id: "r2".into(),
        job_id: "job1".into(),
        ..Default::default()
    };
    let small = base
        .clone()
        .with_source_diff(Some("--- a/kernel.c\n+++ b/kernel.c\n".into()));
    assert!(small.source_edited());
    small.validate().expect("a small diff is storable");
    assert!(
        !base
            .clone()
            .with_source_diff(Some(String::new()))
            .source_edited()
    );

    // A huge diff is cut at a line, with the marker, and fits.
    let huge: String = (0..4000).map(|i| format!("+line {i}\n")).collect();
    let cut = base.clone().with_source_diff(Some(huge.clone()));
    let diff = cut.source_diff.as_deref().expect("a diff");
    assert!(diff.len() <= MAX_SOURCE_DIFF_BYTES, "{}", diff.len());
    let last = diff.lines().last().expect("lines");
    assert!(last.starts_with(SOURCE_DIFF_TRUNCATED), "{last}");
    assert!(
        last.contains(&format!("of {} bytes shown", huge.len())),
        "{last}"
    );
    assert!(huge.starts_with(&diff[..diff.len() - last.len() - 1]));
    cut.validate().expect("a cut diff is storable");

    // A record that did not go through the bound is refused.
    let mut unbounded = base;
    unbounded.source_diff = Some(huge);
    let error = unbounded.validate().expect_err("too long");
    assert!(error.to_string().contains("source_diff"), "{error}");
}

#[test]
fn an_undecodable_record_is_named_in_a_bounded_message() {
    let payload = format!(
        "{{\"record_id\": 7, \"job_id\": \"{}\"",
        "\u{7f}".repeat(50_000)
    );
    let err = super::decode_record(
        "s",
        None,
        format!("{{\"samples\": \"{}\"}}", "x".repeat(50_000)).as_bytes(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.len() < 400, "{} bytes", err.len());
    assert!(
        err.starts_with("not a result record: invalid type"),
        "{err}"
    );
    let err = super::decode_record("s", None, payload.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(err.len() < 400, "{} bytes", err.len());
}
