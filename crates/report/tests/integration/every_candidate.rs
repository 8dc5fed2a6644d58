//! A job of a few hundred candidates in every status: the page lists each
//! benchmarked one, counts every status with its reasons, plots GFLOPS
//! against each tune.toml parameter and the valid candidates under the
//! roofline with the best marked, and prints times in readable units; the
//! terminal tables and the JSON summary use the same counts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;

use mtswarm_bus::ResultRecord;
use mtswarm_bus::results::{CandidateStatus, ResultStats};
use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::TuneSpace;
use mtswarm_report::JobReport;

use crate::common;

use common::{assert_contains, class_of, inside, parse_xml};

const T0: u64 = 1_800_000_000_000;
const TILES: [u32; 12] = [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96];
const UNROLLS: [u32; 5] = [1, 2, 4, 8, 16];
const VECS: [u32; 6] = [1, 2, 3, 4, 5, 6];

fn tune_toml(with_model: bool) -> String {
    let list = |values: &[u32]| {
        values
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let model = if with_model {
        "[model]\nflops = \"2 * N * N * N\"\nbytes = \"8.0 * N * N * N / TILE\"\n"
    } else {
        ""
    };
    format!(
        r#"kernel = "tiled"
tolerance = 1e-9
{model}
[sizes]
N = 1024

[[param]]
name = "TILE"
values = [{}]
default = 32

[[param]]
name = "UNROLL"
values = [{}]
default = 1

[[param]]
name = "VEC"
values = [{}]
default = 1
"#,
        list(&TILES),
        list(&UNROLLS),
        list(&VECS)
    )
}

fn params(tile: u32, unroll: u32, vec: u32) -> BTreeMap<String, String> {
    [("TILE", tile), ("UNROLL", unroll), ("VEC", vec)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn record(n: usize, p: BTreeMap<String, String>, status: CandidateStatus) -> ResultRecord {
    ResultRecord {
        record_id: format!("r{n}"),
        job_id: "job-7".into(),
        agent_id: format!("agent-{}", n % 4),
        slice_id: format!("board0-c{}", n % 4),
        backend: "emulator".into(),
        kernel: "tiled".into(),
        kernel_hash: "abcdef0123456789".into(),
        params: p,
        cores: 24,
        status,
        model: "builtin".into(),
        wall_seconds: 0.1,
        // 321 records over 72 s.
        timestamp_ms: T0 + n as u64 * 225,
        ..ResultRecord::default()
    }
}

/// A valid benchmark: TILE matters most, UNROLL a little, VEC hardly.
fn benchmarked(n: usize, ti: usize, ui: usize, vi: usize) -> ResultRecord {
    let gflops = 1.0 + 5.0 * ti as f64 + ui as f64 + 0.1 * vi as f64;
    let median = 2.0 * 1024f64.powi(3) / (gflops * 1e9);
    let mut r = record(
        n,
        params(TILES[ti], UNROLLS[ui], VECS[vi]),
        CandidateStatus::Benchmarked,
    );
    r.valid = true;
    r.gflops = Some(gflops);
    r.peak_fraction = Some(gflops / 2764.8);
    r.samples = vec![median; 3];
    r.stats = Some(ResultStats {
        count: 3,
        median,
        trimmed_mean: median,
        min: median,
        max: median,
        stddev: 0.0,
    });
    r
}

/// 300 valid benchmarks (TILE among its first 10 values), then 2 screening
/// records of candidates benchmarked above, 12 pruned, 3 failed compiles, 2
/// screened only, a flagged and a wrong benchmark: 321 records of 319
/// candidates.
fn job_records() -> Vec<ResultRecord> {
    let mut records = Vec::new();
    for ti in 0..10 {
        for ui in 0..UNROLLS.len() {
            for vi in 0..VECS.len() {
                records.push(benchmarked(records.len(), ti, ui, vi));
            }
        }
    }
    for vec in &VECS[..2] {
        let mut r = record(records.len(), params(8, 1, *vec), CandidateStatus::Screened);
        r.valid = true;
        r.reason = Some("screened: right answer once".into());
        records.push(r);
    }
    // The rest use TILE 88 and 96, which no benchmark above ran.
    let mut spare = TILES[10..].iter().flat_map(|t| {
        UNROLLS
            .iter()
            .flat_map(move |u| VECS.iter().map(move |v| params(*t, *u, *v)))
    });
    let mut push = |status: CandidateStatus, reason: &str, records: &mut Vec<ResultRecord>| {
        let mut r = record(records.len(), spare.next().expect("spare params"), status);
        r.reason = Some(reason.into());
        records.push(r);
    };
    for _ in 0..12 {
        push(
            CandidateStatus::Pruned,
            "roofline bound below the best",
            &mut records,
        );
    }
    push(
        CandidateStatus::CompileFailed,
        "error: 'v16df' undeclared\nkernel.c:12",
        &mut records,
    );
    push(
        CandidateStatus::CompileFailed,
        "error: 'v16df' undeclared\nkernel.c:40",
        &mut records,
    );
    push(
        CandidateStatus::CompileFailed,
        "error: AM overflow",
        &mut records,
    );
    push(
        CandidateStatus::Screened,
        "screened: right answer once",
        &mut records,
    );
    push(
        CandidateStatus::Screened,
        "screened: right answer once",
        &mut records,
    );
    let mut flagged = benchmarked(records.len(), 0, 0, 0);
    flagged.params = params(96, 16, 6);
    flagged.status = CandidateStatus::Flagged;
    flagged.gflops = Some(9_000.0);
    flagged.flags = vec!["faster than the roofline bound".into()];
    records.push(flagged);
    let mut wrong = record(records.len(), params(96, 16, 5), CandidateStatus::Invalid);
    wrong.samples = vec![0.01; 3];
    wrong.error = Some("max abs error 3.2e-2 above the tolerance".into());
    records.push(wrong);
    records
}

fn report(with_model: bool) -> (JobReport, ChipSpec) {
    let spec = ChipSpec::default();
    let space = TuneSpace::from_toml_str(&tune_toml(with_model)).expect("tune.toml");
    let mut report = JobReport::from_records("job-7", "tiled", &job_records(), None, &[]);
    report.with_kernel_model(&space, &spec);
    (report, spec)
}

fn count_class(
    elements: &[(String, std::collections::HashMap<String, String>)],
    tag: &str,
    class: &str,
) -> usize {
    elements
        .iter()
        .filter(|e| e.0 == tag && class_of(e).contains(&class))
        .count()
}

#[test]
fn counts_use_one_vocabulary() {
    let (report, _) = report(true);
    assert_eq!(job_records().len(), 321);
    assert_eq!(report.counts.candidates_considered, 319);
    assert_eq!(
        report.counts.candidates_measured, 304,
        "benchmarked, flagged, wrong and screened ran; pruned and failed builds did not"
    );
    assert_eq!(
        report.counts.candidates_benchmarked, 302,
        "300 valid, flagged, wrong"
    );
    assert_eq!(report.counts.valid_candidates, 300);
    let summary = serde_json::to_value(report.summary(None)).expect("json");
    assert_eq!(summary["candidates_considered"], 319);
    assert_eq!(summary["candidates_measured"], 304);
    assert_eq!(summary["candidates_benchmarked"], 302);
    assert_eq!(summary["valid_candidates"], 300);
    let by_status = &summary["candidates_by_status"];
    assert_eq!(by_status["benchmarked"], 300);
    assert_eq!(by_status["pruned"], 12);
    assert_eq!(by_status["compile_failed"], 3);
    assert_eq!(
        by_status["screened"], 2,
        "screened then benchmarked counts as benchmarked"
    );
    assert_eq!(by_status["flagged"], 1);
    assert_eq!(by_status["invalid"], 1);
    let text = report.render_terminal();
    assert_contains(
        &text,
        "319 considered: 304 measured (302 benchmarked, 300 valid), 15 not run",
    );
    assert_contains(&text, "12: roofline bound below the best");
    assert!(text.contains("1 min 12 s"), "wall time: {text}");
}

#[test]
fn every_benchmarked_candidate_has_a_row_and_every_status_its_count() {
    let (report, _) = report(true);
    let html = report.render_html();
    parse_xml(&html);

    let table = inside(&html, "table", "benchmarked-candidates");
    let rows = parse_xml(table);
    let body_rows = rows.iter().filter(|e| e.0 == "tr").count() - 1;
    assert_eq!(body_rows, 302);
    assert_eq!(
        rows.iter()
            .filter(|e| e.0 == "tr" && class_of(e).contains(&"best"))
            .count(),
        1
    );
    // The best first: TILE 80 (the 10th value), UNROLL 16, VEC 6.
    let first_row = &table[table.find("<tbody>").expect("tbody")..];
    let first_row = &first_row[..first_row.find("</tr>").expect("row")];
    assert_contains(first_row, "TILE=80 UNROLL=16 VEC=6");
    assert_contains(first_row, "class=\"best\"");

    let statuses = inside(&html, "table", "candidates-by-status");
    for (status, count) in [
        ("benchmarked", 300),
        ("flagged", 1),
        ("screened", 2),
        ("pruned", 12),
        ("invalid", 1),
        ("compile_failed", 3),
    ] {
        let row = format!(
            "<tr class=\"status-{status}\"><th scope=\"row\">{status}</th><td class=\"number\">{count}</td>"
        );
        assert!(statuses.contains(&row), "{row} in {statuses}");
    }
    assert_contains(statuses, "12: roofline bound below the best");
    // Reasons group by their first line.
    assert_contains(statuses, "2: error: &#39;v16df&#39; undeclared");
    assert_contains(statuses, "1: error: AM overflow");

    // The best-so-far plot shows the timed runs only, not the pruned.
    let over_time = parse_xml(inside(&html, "svg", "best-so-far"));
    assert_eq!(count_class(&over_time, "circle", "point"), 302);
    assert_eq!(
        count_class(&over_time, "circle", "invalid"),
        2,
        "flagged and wrong"
    );
    let others = inside(&html, "table", "other-candidates");
    let other_rows = parse_xml(others).iter().filter(|e| e.0 == "tr").count() - 1;
    assert_eq!(other_rows, 319 - 302);
}

#[test]
fn one_scatter_per_parameter_with_the_best_marked() {
    let (report, _) = report(true);
    let html = report.render_html();
    let elements = parse_xml(&html);
    let scatters: Vec<&str> = elements
        .iter()
        .filter(|e| e.0 == "svg" && class_of(e).contains(&"param-scatter"))
        .map(|e| e.1["id"].as_str())
        .collect();
    assert_eq!(
        scatters,
        ["param-TILE", "param-UNROLL", "param-VEC"],
        "tune.toml order"
    );
    for id in scatters {
        let plot = parse_xml(inside(&html, "svg", id));
        assert_eq!(
            count_class(&plot, "circle", "point"),
            300,
            "{id}: every valid candidate"
        );
        assert_eq!(count_class(&plot, "circle", "best"), 1, "{id}");
    }
    // TILE: all 12 tune.toml values on the axis, 10 of them with candidates.
    let tile = inside(&html, "svg", "param-TILE");
    assert_eq!(count_class(&parse_xml(tile), "line", "category-best"), 10);
    for value in TILES {
        assert!(
            tile.contains(&format!(">{value}</text>")),
            "TILE {value} labelled"
        );
    }
    assert_contains(tile, "best: 50.50 GFLOPS | TILE=80 UNROLL=16 VEC=6");
}

#[test]
fn the_roofline_shows_every_valid_candidate_and_the_best() {
    let (report, spec) = report(true);
    let roofline = report.roofline.as_ref().expect("a roofline");
    assert_eq!(roofline.cores, 24);
    assert!((roofline.peak_gflops - spec.peak_flops(24) / 1e9).abs() < 1e-9);
    assert!((roofline.bandwidth_gbs - spec.cluster_bandwidth() / 1e9).abs() < 1e-9);
    assert_eq!(roofline.points.len(), 300);
    let best: Vec<_> = roofline.points.iter().filter(|p| p.best).collect();
    assert_eq!(best.len(), 1);
    // Intensity = 2 N^3 / (8 N^2 N / TILE) = TILE / 4.
    assert!(
        (best[0].intensity - 20.0).abs() < 1e-6,
        "{}",
        best[0].intensity
    );
    assert_eq!(best[0].gflops, 50.5);
    assert!(report.roofline_note.is_none(), "{:?}", report.roofline_note);

    let html = report.render_html();
    let plot = parse_xml(inside(&html, "svg", "roofline"));
    assert_eq!(count_class(&plot, "circle", "point"), 300);
    assert_eq!(count_class(&plot, "circle", "best"), 1);
    assert_eq!(count_class(&plot, "path", "roof"), 1);
    let svg = inside(&html, "svg", "roofline");
    assert_contains(svg, "best: 50.50 GFLOPS at 20.000 flops/byte");
    assert_contains(svg, "compute roof 2764.8 GFLOPS (24 cores)");
    assert_contains(svg, "memory roof 30.0 GB/s");
}

#[test]
fn without_a_model_the_roofline_is_a_one_line_note() {
    let (report, _) = report(false);
    assert!(report.roofline.is_none());
    let html = report.render_html();
    parse_xml(&html);
    assert!(!html.contains("id=\"roofline\""));
    let note = inside(&html, "p", "roofline-note");
    assert_contains(note, "no [model] table");
    // The parameter plots need no model.
    assert!(html.contains("id=\"param-TILE\""));

    // Without any tune.toml: the varying parameters, sorted numerically.
    let bare = JobReport::from_records("job-7", "tiled", &job_records(), None, &[]);
    let names: Vec<&str> = bare.parameters.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["TILE", "UNROLL", "VEC"]);
    assert_eq!(bare.parameters[1].values, ["1", "2", "4", "8", "16"]);
    assert!(
        bare.render_html()
            .contains("without the kernel&#39;s tune.toml")
    );
}

#[test]
fn times_read_in_units() {
    let (report, _) = report(true);
    let html = report.render_html();
    let table = inside(&html, "table", "benchmarked-candidates");
    // The best: 2 * 1024^3 flops at 50.5 GFLOPS = 42.5 ms.
    assert!(table.contains("42.5 ms"), "median of the best");
    // The slowest valid one, 1 GFLOPS: 2.15 s.
    assert!(table.contains("2.15 s"), "median of the slowest");
    assert!(!table.contains("e-"), "no exponent notation in the table");
    let summary = inside(&html, "table", "summary");
    assert_contains(summary, "(1 min 12 s)");
    assert_contains(summary, "42.5 ms");
}
