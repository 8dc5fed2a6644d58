//! `mtswarm emu run` end to end: the real binary, real gcc, the example
//! kernels.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::path::Path;
use std::process::Output;

/// `mtswarm emu run` of the example kernel `kernel` with `args`.
fn emu_run(kernel: &str, args: &[&str]) -> Output {
    common::mtswarm_command()
        .env(
            "MTSWARM_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("emu-cache"),
        )
        .args(["emu", "run"])
        .arg(common::kernels().join(kernel))
        .args(args)
        .output()
        .expect("mtswarm runs")
}

#[test]
fn emu_run_json_reports_the_required_fields() {
    let out = emu_run("dgemm", &["--cores", "2", "--runs", "2", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["valid"], true);
    assert!(report["error"].is_null());
    assert!(report["modeled_cycles"].as_u64().is_some_and(|c| c > 0));
    assert!(report["seconds"].as_f64().is_some_and(|s| s > 0.0));
    assert!(report["gflops"].as_f64().is_some_and(|g| g > 0.0));
    let peak = report["peak_fraction"].as_f64().expect("peak_fraction");
    assert!(peak > 0.5 && peak <= 1.0, "{peak}");
    assert_eq!(report["samples"].as_array().map(Vec::len), Some(2));
}

#[test]
fn emu_run_exits_non_zero_when_invalid_or_over_capacity() {
    for (cores, define, error) in [
        ("2", "FAULT_AFTER=0", "tolerance"),
        ("1", "CHUNK=65536", "AM capacity exceeded"),
    ] {
        let out = emu_run(
            "vecadd",
            &[
                "--cores",
                cores,
                "-D",
                define,
                "--unchecked-defines",
                "--json",
            ],
        );
        assert!(!out.status.success(), "{define}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(report["valid"], false, "{define}: {report}");
        assert!(
            report["error"].as_str().is_some_and(|e| e.contains(error)),
            "{define}: {report}"
        );
    }
}

#[test]
fn emu_run_refuses_defines_outside_tune_toml() {
    let typo = emu_run("dgemm", &["-D", "MBB=64", "--json"]);
    assert_eq!(typo.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&typo.stderr);
    assert!(
        stderr.contains("MBB") && stderr.contains("known: VARIANT, MB, NB"),
        "{stderr}"
    );
    let value = emu_run("dgemm", &["-D", "MB=48"]);
    assert_eq!(value.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&value.stderr);
    assert!(
        stderr.contains("MB=48") && stderr.contains("32, 64, 128"),
        "{stderr}"
    );
}

#[test]
fn emu_run_prints_a_human_summary_without_json() {
    let out = emu_run("vecadd", &["--cores", "2"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("valid") && text.contains("modeled cycles"),
        "{text}"
    );
}
