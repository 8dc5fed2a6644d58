//! `mtswarm emu sweep` and `mtswarm search replay` end to end: a sweep
//! written as a Kernel Tuner cache and resumed, and the builtin search
//! replayed on a recorded landscape over several seeds.

use crate::common;

use std::path::Path;
use std::process::Command;

use mtswarm_hw::landscape::Landscape;

fn landscapes() -> std::path::PathBuf {
    common::kernels().join("../landscapes")
}

fn mtswarm() -> Command {
    let mut command = common::mtswarm_command();
    command.env(
        "MTSWARM_CACHE_DIR",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("emu-cache"),
    );
    command
}

#[test]
fn a_sweep_writes_a_kernel_tuner_cache_and_resumes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("vecadd.json");
    let sweep = |limit: &str| {
        mtswarm()
            .args(["emu", "sweep"])
            .arg(common::kernels().join("vecadd"))
            .arg("--out")
            .arg(&out)
            .args(["--limit", limit, "--jobs", "2", "--cores", "4"])
            .output()
            .expect("mtswarm runs")
    };
    let first = sweep("2");
    common::stdout_of(&first, "the first sweep");
    let second = sweep("3");
    let said = common::stdout_of(&second, "the resumed sweep");
    assert!(said.contains("3 configurations, 3 measured"), "{said}");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("2 configurations done, 1 to go"),
        "the second sweep resumed: {stderr}"
    );
    let text = std::fs::read_to_string(&out).expect("written");
    let landscape = Landscape::from_kernel_tuner_json(&text).expect("a Kernel Tuner cache");
    assert_eq!(landscape.kernel_name, "vecadd");
    assert_eq!(landscape.entries.len(), 3);
    assert_eq!(landscape.measured(), 3);
    assert!(
        landscape.device_name.contains("4 cores"),
        "{}",
        landscape.device_name
    );
}

#[test]
fn a_replay_reports_each_seed_against_the_landscapes_optimum() {
    let file = landscapes().join("dgemm.json");
    let out = mtswarm()
        .args(["search", "replay"])
        .arg(&file)
        .args(["--agents", "2", "--budget", "10%", "--seeds", "3", "--json"])
        .arg("--kernel")
        .arg(common::kernels().join("dgemm"))
        .output()
        .expect("mtswarm runs");
    let report: serde_json::Value =
        serde_json::from_str(&common::stdout_of(&out, "search replay")).expect("one JSON object");
    let landscape =
        Landscape::from_kernel_tuner_json(&std::fs::read_to_string(&file).expect("read"))
            .expect("reads");
    let optimum = landscape
        .optimum()
        .and_then(|e| e.outcome.seconds())
        .expect("optimum");
    assert_eq!(report["optimum_seconds"].as_f64(), Some(optimum));
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3);
    for run in runs {
        assert_eq!(run["agents"], 2);
        let evaluations = run["evaluations"].as_u64().expect("evaluations");
        assert!((1..=11).contains(&evaluations), "{run}");
        let share = run["best_share_of_optimum"].as_f64().expect("share");
        assert!(share > 0.0 && share <= 1.0, "{run}");
        let curve = run["best_so_far_seconds"].as_array().expect("curve");
        assert_eq!(curve.len() as u64, evaluations);
        let last = curve
            .last()
            .and_then(serde_json::Value::as_f64)
            .expect("a figure");
        assert!((optimum / last - share).abs() < 1e-9, "{run}");
    }
    let curves: std::collections::BTreeSet<String> = runs
        .iter()
        .map(|r| r["best_so_far_seconds"].to_string())
        .collect();
    assert!(curves.len() > 1, "three seeds, one search: {curves:?}");
}

#[test]
fn a_file_that_is_not_a_landscape_is_a_clear_error() {
    let out = mtswarm()
        .args(["search", "replay"])
        .arg(common::kernels().join("vecadd/tune.toml"))
        .output()
        .expect("mtswarm runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a Kernel Tuner cache file"), "{stderr}");
}
