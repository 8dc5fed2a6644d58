//! `mtswarm emu run` end to end: the real binary, real gcc, the example
//! kernels.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::path::{Path, PathBuf};
use std::process::Command;

fn kernels() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels")
}

fn mtswarm() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mtswarm"));
    cmd.env(
        "MTSWARM_CACHE_DIR",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("emu-cache"),
    );
    cmd
}

#[test]
fn emu_run_json_reports_the_required_fields() {
    let out = mtswarm()
        .args(["emu", "run"])
        .arg(kernels().join("dgemm"))
        .args(["--cores", "2", "--runs", "2", "--json"])
        .output()
        .expect("mtswarm runs");
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
    let out = mtswarm()
        .args(["emu", "run"])
        .arg(kernels().join("vecadd"))
        .args([
            "--cores",
            "2",
            "-D",
            "FAULT_AFTER=0",
            "--unchecked-defines",
            "--json",
        ])
        .output()
        .expect("mtswarm runs");
    assert!(!out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["valid"], false);
    assert!(
        report["error"]
            .as_str()
            .is_some_and(|e| e.contains("tolerance"))
    );

    let out = mtswarm()
        .args(["emu", "run"])
        .arg(kernels().join("vecadd"))
        .args([
            "--cores",
            "1",
            "-D",
            "CHUNK=65536",
            "--unchecked-defines",
            "--json",
        ])
        .output()
        .expect("mtswarm runs");
    assert!(!out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["valid"], false);
    assert!(
        report["error"]
            .as_str()
            .is_some_and(|e| e.contains("AM capacity exceeded")),
        "{report}"
    );
}

#[test]
fn emu_run_refuses_defines_outside_tune_toml() {
    let typo = mtswarm()
        .args(["emu", "run"])
        .arg(kernels().join("dgemm"))
        .args(["-D", "MBB=64", "--json"])
        .output()
        .expect("mtswarm runs");
    assert_eq!(typo.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&typo.stderr);
    assert!(
        stderr.contains("MBB") && stderr.contains("known: VARIANT, MB, NB"),
        "{stderr}"
    );
    let value = mtswarm()
        .args(["emu", "run"])
        .arg(kernels().join("dgemm"))
        .args(["-D", "MB=48"])
        .output()
        .expect("mtswarm runs");
    assert_eq!(value.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&value.stderr);
    assert!(
        stderr.contains("MB=48") && stderr.contains("32, 64, 128"),
        "{stderr}"
    );
}

#[test]
fn emu_run_prints_a_human_summary_without_json() {
    let out = mtswarm()
        .args(["emu", "run"])
        .arg(kernels().join("vecadd"))
        .args(["--cores", "2"])
        .output()
        .expect("mtswarm runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("valid") && text.contains("modeled cycles"),
        "{text}"
    );
}
