//! Reports of a sample job: the HTML parses as XML and holds both plots (one
//! bar per busy interval, one point per measurement) and the tables; the
//! terminal tables and the JSON summary carry the outcome; records convert
//! from typed measurements and into the tools' `PastResult`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;

use mtswarm_bus::ResultRecord;
use mtswarm_bus::results::{Provenance, ResultStats};
use mtswarm_hw::board::RunSample;
use mtswarm_hw::measure::Stats;
use mtswarm_hw::{BackendKind, Counters, Measurement};
use mtswarm_report::{
    Baseline, BusyInterval, JobReport, record_from_measurement, slice_utilization,
};

use crate::common;

use common::{assert_contains, class_of, inside, parse_xml};

const T0: u64 = 1_800_000_000_000;

fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn record(
    id: &str,
    slice: &str,
    agent: &str,
    p: BTreeMap<String, String>,
    gflops: Option<f64>,
    at_s: u64,
    wall_s: f64,
) -> ResultRecord {
    ResultRecord {
        record_id: id.into(),
        job_id: "job-42".into(),
        task_id: format!("task-{agent}"),
        attempt: 1,
        agent_id: agent.into(),
        session_id: format!("session-{agent}"),
        worker_id: "w0".into(),
        slice_id: slice.into(),
        backend: "emulator".into(),
        toolchain: "gcc (emulator)".into(),
        kernel: "dgemm".into(),
        kernel_hash: "feedface00112233".into(),
        params: p,
        cores: 24,
        samples: vec![0.01, 0.01],
        stats: gflops.map(|_| ResultStats {
            count: 2,
            median: 0.01,
            trimmed_mean: 0.01,
            min: 0.01,
            max: 0.01,
            stddev: 0.0,
        }),
        flops: gflops.map(|_| 1_000_000),
        gflops,
        peak_fraction: gflops.map(|g| g / 400.0),
        speedup_over_baseline: None,
        valid: gflops.is_some(),
        error: gflops.is_none().then(|| "validation failed".into()),
        flags: vec![],
        model: "builtin".into(),
        wall_seconds: wall_s,
        timestamp_ms: T0 + at_s * 1000,
        ..ResultRecord::default()
    }
}

/// Seven measurements by two agents on two slices (a third slice idle):
/// a naive baseline, improvements, an invalid one, a flagged one, and a
/// repeat of the best configuration.
fn sample_records() -> Vec<ResultRecord> {
    let mut flagged = record(
        "r6",
        "board0/c1",
        "agent-b",
        params(&[("TILE", "999")]),
        Some(5_000.0),
        40,
        2.0,
    );
    flagged.flags = vec!["exceeds the modeled peak".into()];
    vec![
        record(
            "r1",
            "board0/c0",
            "agent-a",
            params(&[]),
            Some(10.0),
            2,
            2.0,
        ),
        record(
            "r2",
            "board0/c1",
            "agent-b",
            params(&[("TILE", "32"), ("UNROLL", "2")]),
            Some(40.0),
            10,
            4.0,
        ),
        record(
            "r3",
            "board0/c0",
            "agent-a",
            params(&[("TILE", "64"), ("UNROLL", "4")]),
            Some(120.0),
            20,
            5.0,
        ),
        record(
            "r4",
            "board0/c0",
            "agent-a",
            params(&[("TILE", "512"), ("UNROLL", "<8>")]),
            None,
            30,
            1.0,
        ),
        record(
            "r5",
            "board0/c1",
            "agent-b",
            params(&[("TILE", "16"), ("UNROLL", "1")]),
            Some(25.0),
            35,
            3.0,
        ),
        flagged,
        record(
            "r7",
            "board0/c1",
            "agent-b",
            params(&[("TILE", "64"), ("UNROLL", "4")]),
            Some(118.0),
            50,
            2.0,
        ),
    ]
}

fn sample_report() -> JobReport {
    let mut report = JobReport::from_records(
        "job-42",
        "dgemm",
        &sample_records(),
        None,
        &["board0/c0".into(), "board0/c1".into(), "board0/c2".into()],
    );
    report.goal = "tune @dgemm.c for 1024x1024 & beyond".into();
    report
}

#[test]
fn report_from_records_finds_best_baseline_and_utilization() {
    let report = sample_report();
    let best = report.best.as_ref().expect("best");
    assert_eq!(best.gflops, 120.0);
    assert_eq!(best.params, params(&[("TILE", "64"), ("UNROLL", "4")]));
    assert_eq!(best.slice, "board0/c0");
    let baseline = report.baseline.as_ref().expect("baseline");
    assert_eq!(
        baseline.gflops, 10.0,
        "the parameterless run is the naive one"
    );
    assert_eq!(report.speedup_over_naive(), Some(12.0));
    // Seven records of six candidates (r7 repeats r3); all six ran timed
    // (r4 with a wrong answer, r6 flagged), four are valid.
    assert_eq!(report.counts.candidates_considered, 6);
    assert_eq!(report.counts.candidates_measured, 6);
    assert_eq!(report.counts.candidates_benchmarked, 6);
    assert_eq!(report.counts.valid_candidates, 4);
    // Flagged figures never rank; a repeated configuration is listed once.
    let top: Vec<f64> = report.top.iter().map(|c| c.gflops).collect();
    assert_eq!(top, [120.0, 40.0, 25.0, 10.0]);
    // Window: from the first busy start (2 s - 2 s = T0) to the last record (50 s).
    assert_eq!(report.started_at_ms, T0);
    assert_eq!(report.finished_at_ms, T0 + 50_000);
    let utilization = &report.slice_utilization;
    assert_eq!(utilization["board0/c2"], 0.0, "idle slice listed");
    // board0/c0 busy 0-2, 15-20, 29-30 s = 8 s of 50.
    assert!((utilization["board0/c0"] - 8.0 / 50.0).abs() < 1e-9);
    // board0/c1 busy 6-10, 32-35, 38-40, 48-50 s = 11 s of 50.
    assert!((utilization["board0/c1"] - 11.0 / 50.0).abs() < 1e-9);
}

#[test]
fn overlapping_intervals_count_once_and_are_clamped_to_the_window() {
    let busy = |slice: &str, start_ms, end_ms| BusyInterval {
        slice: slice.into(),
        start_ms,
        end_ms,
        ..Default::default()
    };
    let shares = slice_utilization(
        &[
            busy("a", 0, 400),
            busy("a", 200, 600),
            busy("a", 900, 2_000),
            busy("b", 5_000, 6_000),
        ],
        0,
        1_000,
    );
    assert!((shares["a"] - 0.7).abs() < 1e-9, "{shares:?}");
    assert_eq!(shares["b"], 0.0);
    assert!(slice_utilization(&[busy("a", 0, 10)], 5, 5)["a"] == 0.0);
}

#[test]
fn html_is_well_formed_with_both_plots_and_the_tables() {
    let report = sample_report();
    let html = report.render_html();
    let elements = parse_xml(&html);
    assert_eq!(elements[0].0, "html");

    // Plot 1: one point per measurement, valid ones distinguished.
    let plot = inside(&html, "svg", "best-so-far");
    let plot_elements = parse_xml(plot);
    let points: Vec<_> = plot_elements
        .iter()
        .filter(|e| e.0 == "circle" && class_of(e).contains(&"point"))
        .collect();
    assert_eq!(points.len(), sample_records().len());
    let invalid = points
        .iter()
        .filter(|e| class_of(e).contains(&"invalid"))
        .count();
    assert_eq!(invalid, 2, "the failed and the flagged measurement");
    assert_eq!(
        plot_elements
            .iter()
            .filter(|e| class_of(e).contains(&"best-so-far"))
            .count(),
        1
    );

    // Plot 2: one bar per busy interval, one lane per slice.
    let timeline = inside(&html, "svg", "slice-timeline");
    let timeline_elements = parse_xml(timeline);
    let bars = timeline_elements
        .iter()
        .filter(|e| e.0 == "rect" && class_of(e).contains(&"busy"))
        .count();
    assert_eq!(bars, report.busy.len());
    assert_eq!(bars, 7);
    let lanes = timeline_elements
        .iter()
        .filter(|e| e.0 == "rect" && class_of(e).contains(&"lane"))
        .count();
    assert_eq!(lanes, 3);

    // Top candidates table: one row per distinct trustworthy candidate.
    let table = inside(&html, "table", "top-candidates");
    let rows = parse_xml(table).iter().filter(|e| e.0 == "tr").count();
    assert_eq!(rows, 1 + report.top.len(), "header + candidates");
    assert_contains(table, "TILE=64 UNROLL=4");

    // Summary and escaping of user text.
    let summary = inside(&html, "table", "summary");
    assert_contains(summary, "120.00");
    assert_contains(summary, "12.00x");
    assert!(html.contains("1024x1024 &amp; beyond"));
    assert!(html.contains("UNROLL=&lt;8&gt;"), "params are escaped");

    // Self-contained: no scripts, nothing fetched.
    assert!(!html.contains("<script"));
    for attribute in ["src=", "href="] {
        assert!(!html.contains(attribute), "{attribute} found");
    }
}

#[test]
fn empty_jobs_render_without_panicking() {
    let report = JobReport::from_records("job-0", "vecadd", &[], None, &[]);
    let html = report.render_html();
    parse_xml(&html);
    assert!(html.contains("no measurements"));
    assert!(html.contains("no trustworthy candidate"));
    let text = report.render_terminal();
    assert_contains(&text, "no valid candidate");
    let summary = serde_json::to_value(report.summary(None)).expect("json");
    assert!(summary["best"].is_null());
    assert_eq!(summary["candidates_considered"], 0);
    assert_eq!(summary["candidates_measured"], 0);
}

#[test]
fn terminal_tables_show_the_best_params_and_figures() {
    let text = sample_report().render_terminal();
    assert_contains(&text, "job-42");
    assert_contains(&text, "TILE=64 UNROLL=4");
    assert_contains(&text, "120.00");
    assert!(text.contains("30.0%"), "peak share of the best: {text}");
    assert_contains(&text, "12.00x");
    assert!(text.contains("board0/c2"), "idle slice listed: {text}");
    assert_contains(
        &text,
        "6 considered: 6 measured (6 benchmarked, 4 valid), 0 not run",
    );
}

#[test]
fn json_summary_has_the_required_fields_and_the_report_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = sample_report();
    let path = report
        .write_html(dir.path().join("reports/job-42.html"))
        .expect("written");
    let on_disk = std::fs::read_to_string(&path).expect("read back");
    assert_eq!(on_disk, report.render_html());

    let summary = serde_json::to_value(report.summary(Some(&path))).expect("json");
    assert_eq!(summary["job_id"], "job-42");
    assert_eq!(summary["best"]["params"]["TILE"], "64");
    assert_eq!(summary["best"]["params"]["UNROLL"], "4");
    assert_eq!(summary["best"]["gflops"], 120.0);
    assert_eq!(summary["best"]["peak_fraction"], 0.3);
    assert_eq!(summary["baseline"]["gflops"], 10.0);
    assert_eq!(summary["speedup_over_naive"], 12.0);
    assert_eq!(summary["candidates_considered"], 6);
    assert_eq!(summary["candidates_measured"], 6);
    assert_eq!(summary["candidates_benchmarked"], 6);
    assert_eq!(summary["valid_candidates"], 4);
    assert_eq!(summary["candidates_by_status"]["benchmarked"], 4);
    assert_eq!(summary["candidates_by_status"]["flagged"], 1);
    assert_eq!(summary["candidates_by_status"]["invalid"], 1);
    let utilization = summary["slice_utilization"].as_object().expect("map");
    assert_eq!(utilization.len(), 3);
    for (slice, share) in utilization {
        let share = share.as_f64().expect("number");
        assert!((0.0..=1.0).contains(&share), "{slice}: {share}");
    }
    assert_eq!(summary["report_path"], path.display().to_string());

    // An explicit baseline overrides the guess.
    let mut with_baseline = JobReport::from_records(
        "job-42",
        "dgemm",
        &sample_records(),
        Some(Baseline {
            gflops: 60.0,
            params: BTreeMap::new(),
            description: "reference BLAS".into(),
        }),
        &[],
    );
    with_baseline.goal.clear();
    assert_eq!(with_baseline.speedup_over_naive(), Some(2.0));
}

#[test]
fn unwritable_report_path_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "x").expect("write");
    let error = sample_report()
        .write_html(blocker.join("report.html"))
        .expect_err("parent is a file");
    assert!(error.to_string().contains("report.html"), "{error}");
}

fn measurement() -> Measurement {
    let sample = |seconds| RunSample {
        valid: true,
        error: None,
        modeled_cycles: Some(1_000),
        seconds,
        max_abs_err: Some(0.0),
        counters: Counters {
            flops: 2_000_000,
            ..Default::default()
        },
        seed: None,
        useful_flops: 2_000_000,
    };
    Measurement {
        slice: "board1/c3".into(),
        backend: BackendKind::Emulator,
        toolchain: "gcc 14 (emulator)".into(),
        kernel_hash: "0123456789abcdef0123".into(),
        defines: params(&[("TILE", "64")]),
        cores: 24,
        valid: true,
        error: None,
        failed_validation: false,
        stats: Stats::of(&[0.002, 0.004, 0.003]),
        flops: Some(2_000_000),
        gflops: Some(0.667),
        peak_fraction: Some(0.01),
        speedup_over_baseline: Some(1.5),
        flags: vec![],
        deterministic: true,
        exact: false,
        spot_checked: false,
        samples: vec![sample(0.002), sample(0.004), sample(0.003)],
        launches: 3,
        wall_seconds: 0.25,
        finished_at: 1_800_000_000,
        harness: Default::default(),
    }
}

fn provenance() -> Provenance {
    Provenance {
        job_id: "job-42".into(),
        task_id: "task-1".into(),
        attempt: 2,
        agent_id: "agent-a".into(),
        session_id: "session-a".into(),
        worker_id: "w1".into(),
        kernel: "dgemm".into(),
        model: "qwen3-coder".into(),
        call_id: "call_7".into(),
        timestamp_ms: None,
        ..Default::default()
    }
}

#[test]
fn typed_measurements_become_records_with_full_provenance() {
    let record = record_from_measurement(&measurement(), &provenance()).expect("converts");
    assert_eq!(record.record_id, "job-42.task-1.2.call_7");
    assert_eq!(record.slice_id, "board1-c3");
    assert_eq!(record.backend, "emulator");
    assert_eq!(record.toolchain, "gcc 14 (emulator)");
    assert_eq!(record.kernel, "dgemm");
    assert_eq!(record.kernel_hash, "0123456789abcdef0123");
    assert_eq!(record.params, params(&[("TILE", "64")]));
    assert_eq!(record.samples, vec![0.002, 0.004, 0.003]);
    let stats = record.stats.as_ref().expect("stats");
    assert_eq!((stats.count, stats.median), (3, 0.003));
    assert_eq!(stats.trimmed_mean, 0.003);
    assert_eq!((stats.min, stats.max), (0.002, 0.004));
    assert_eq!(record.gflops, Some(0.667));
    assert_eq!(record.flops, Some(2_000_000));
    assert_eq!(record.model, "qwen3-coder");
    assert_eq!(record.attempt, 2);
    assert_eq!(record.wall_seconds, 0.25);
    assert!(record.timestamp_ms / 1000 >= 1_800_000_000);
    assert!(record.trustworthy());
    record.validate().expect("storable");
}

#[test]
fn records_convert_to_the_tools_past_results() {
    let record = record_from_measurement(&measurement(), &provenance()).expect("record");
    let past: mtswarm_tools::PastResult =
        serde_json::from_value(serde_json::to_value(&record).expect("json")).expect("past");
    assert_eq!(past.record_id, record.record_id);
    assert_eq!(past.kernel, "dgemm");
    assert_eq!(past.kernel_hash, record.kernel_hash);
    assert_eq!(past.params, record.params);
    assert_eq!(past.gflops, record.gflops);
    assert_eq!(past.peak_fraction, record.peak_fraction);
    assert_eq!(past.slice_id, record.slice_id);
    assert_eq!(past.backend, "emulator");
    assert_eq!(past.valid, record.valid);
    assert_eq!(past.timestamp_ms, record.timestamp_ms);
    assert_eq!(past.stats.as_ref().map(|s| s.median), Some(0.003));
}

/// Renders the sample report to a PNG with a headless Chromium when one is
/// installed; without one there is nothing to run.
#[test]
fn sample_report_renders_to_png_when_chromium_is_installed() {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let Some(browser) = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path_var).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
    else {
        eprintln!("no headless Chromium on PATH: PNG rendering not checked");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let html = sample_report()
        .write_html(dir.path().join("report.html"))
        .expect("html");
    let png = dir.path().join("report.png");
    let status = std::process::Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1000,1400")
        .arg(format!("file://{}", html.display()))
        .status()
        .expect("chromium runs");
    assert!(status.success());
    let bytes = std::fs::read(&png).expect("png written");
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG image");
}

#[test]
fn a_recorded_baseline_is_the_reference_and_no_candidate() {
    let mut records = sample_records();
    let mut naive = record(
        "base",
        "board0/c0",
        "agent-a",
        params(&[("VARIANT", "naive")]),
        Some(4.0),
        1,
        1.0,
    );
    naive.baseline = true;
    records.push(naive);
    let report = JobReport::from_records("job-42", "dgemm", &records, None, &[]);
    let baseline = report.baseline.as_ref().expect("baseline");
    assert_eq!(
        baseline.gflops, 4.0,
        "the marked record, not the parameterless one"
    );
    assert_eq!(baseline.description, "tune.toml baseline");
    assert_eq!(report.speedup_over_naive(), Some(30.0));
    // The same six candidates as without it.
    assert_eq!(report.counts.candidates_considered, 6);
    assert_eq!(report.counts.candidates_measured, 6);
    assert_eq!(report.counts.candidates_benchmarked, 6);
    assert_eq!(report.counts.valid_candidates, 4);
    assert!(report.top.iter().all(|c| !c.params.contains_key("VARIANT")));
    assert!(
        report
            .candidates
            .iter()
            .all(|c| !c.params.contains_key("VARIANT")),
        "the baseline is not listed among the candidates"
    );
    // Its slice time still counts as busy: the window starts with it.
    assert_eq!(report.started_at_ms, T0);
}

#[test]
fn an_edited_best_is_named_with_its_hash_and_its_diff() {
    let mut records = sample_records();
    let mut edited = record(
        "r8",
        "board0/c0",
        "agent-a",
        params(&[("TILE", "64"), ("UNROLL", "4")]),
        Some(300.0),
        60,
        2.0,
    )
    .with_source_diff(Some(
        "--- a/kernel.c\n+++ b/kernel.c\n@@ -1,2 +1,2 @@\n-scalar <loop>\n+vector loop\n ctx\n"
            .into(),
    ));
    edited.kernel_hash = "0badc0de99887766".into();
    records.push(edited);
    let report = JobReport::from_records("job-42", "dgemm", &records, None, &[]);
    let best = report.best.as_ref().expect("best");
    assert_eq!(best.gflops, 300.0);
    assert!(best.source_edited());
    assert_eq!(
        best.source_label(),
        "edited: kernel.c +1 -1 (kernel 0badc0de9988)"
    );

    let text = report.render_terminal();
    assert_contains(&text, "edited: kernel.c +1 -1 (kernel 0badc0de9988)");

    let html = report.render_html();
    parse_xml(&html);
    assert_contains(
        inside(&html, "table", "summary"),
        "edited: kernel.c +1 -1 (kernel 0badc0de9988)",
    );
    let diff = inside(&html, "pre", "best-source-diff");
    assert_contains(diff, "-scalar &lt;loop&gt;\n+vector loop");

    let summary = serde_json::to_value(report.summary(None)).expect("json");
    assert_eq!(summary["best"]["source_edited"], true);
    assert_eq!(summary["best"]["kernel_hash"], "0badc0de99887766");
    assert!(
        summary["best"]["source_diff"]
            .as_str()
            .is_some_and(|d| d.contains("+vector loop"))
    );

    // The pristine best of the sample says so, and carries no diff.
    let pristine = sample_report();
    assert_contains(&pristine.render_terminal(), "pristine kernel");
    assert!(!pristine.render_html().contains("best-source-diff"));
    let summary = serde_json::to_value(pristine.summary(None)).expect("json");
    assert_eq!(summary["best"]["source_edited"], false);
    assert!(summary["best"].get("source_diff").is_none());
}

/// A summary written before the measured count existed still reads: its
/// `candidates_evaluated` is the considered count, and nothing is said to
/// have been measured.
#[test]
fn an_older_summary_reads_its_evaluated_count_as_considered() {
    let mut old = serde_json::to_value(sample_report().summary(None)).expect("json");
    let object = old.as_object_mut().expect("an object");
    let considered = object.remove("candidates_considered").expect("considered");
    object.remove("candidates_measured").expect("measured");
    object.insert("candidates_evaluated".into(), considered);
    let read: mtswarm_report::ReportSummary = serde_json::from_value(old).expect("reads");
    assert_eq!(read.counts.candidates_considered, 6);
    assert_eq!(read.counts.candidates_measured, 0);
}
