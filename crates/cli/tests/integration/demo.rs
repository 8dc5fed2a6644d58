//! `mtswarm demo` end to end: the real binary starts a real nats-server, the
//! leader and the worker daemons, tunes a reduced dgemm space on emulated
//! boards and writes its report. The runs get their own TMPDIR so that every
//! process the demo starts (nats-server's store, worker workspaces, builds)
//! names a path under it: after the demo exits, no process may still do so.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// A debug build on a busy machine: generous, but bounded.
const DEMO_TIMEOUT: Duration = Duration::from_secs(600);

fn demo_command(tmp: &Path) -> Command {
    let mut command = common::mtswarm_command();
    command
        .env("TMPDIR", tmp)
        .env_remove("MTSWARM_LLM_URL")
        .env_remove("MTSWARM_LLM_MODEL")
        .arg("demo")
        .arg("--kernel")
        .arg(common::kernels().join("dgemm"))
        .args(["--boards", "1", "--clusters", "2", "--max-candidates", "4"])
        .args(["--metrics-port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// Processes whose command line names a path under `dir`.
fn processes_using(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().to_string();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmdline.contains(&needle) {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    found
}

/// The processes still using `dir` once none is left or `grace` is over.
fn processes_gone_within(dir: &Path, grace: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + grace;
    loop {
        let left = processes_using(dir);
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Lines of the child's stdout, read on a thread so the test can wait with
/// a timeout.
fn stdout_lines(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

fn wait_exit(child: &mut std::process::Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for the demo") {
            return status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the demo did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn demo_json_tunes_beats_the_naive_kernel_writes_the_report_and_cleans_up() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let report = tmp.path().join("report.html");
    let mut child = demo_command(tmp.path())
        .arg("--json")
        .arg("--report")
        .arg(&report)
        .spawn()
        .expect("starting mtswarm demo");
    let lines = stdout_lines(&mut child);
    let status = wait_exit(&mut child, DEMO_TIMEOUT);
    let output: Vec<String> = lines.try_iter().collect();
    assert!(
        status.success(),
        "demo failed ({status}); stdout: {output:?}"
    );
    assert_eq!(
        output.len(),
        1,
        "--json prints exactly one line: {output:?}"
    );
    let summary: Value = serde_json::from_str(&output[0]).expect("one JSON object");

    assert!(!summary["job_id"].as_str().unwrap_or("").is_empty());
    let best = &summary["best"];
    assert!(best["params"].is_object() && !best["params"].as_object().expect("map").is_empty());
    let best_gflops = best["gflops"].as_f64().expect("best.gflops");
    // Exact timing: no figure becomes a best without a spot re-run.
    assert_eq!(best["reproduced"], true, "{best}");
    let peak = best["peak_fraction"].as_f64().expect("best.peak_fraction");
    assert!(peak > 0.0 && peak <= 1.0, "peak fraction {peak}");
    let baseline = summary["baseline"]["gflops"]
        .as_f64()
        .expect("baseline.gflops");
    assert!(baseline > 0.0);
    assert!(
        best_gflops > baseline,
        "best {best_gflops} GFLOPS does not beat the naive {baseline} GFLOPS"
    );
    assert_eq!(summary["candidates_assigned"].as_u64(), Some(4));
    let considered = summary["candidates_considered"]
        .as_u64()
        .expect("considered");
    let measured = summary["candidates_measured"].as_u64().expect("measured");
    let benchmarked = summary["candidates_benchmarked"]
        .as_u64()
        .expect("benchmarked");
    assert!(
        (1..=4).contains(&benchmarked)
            && (benchmarked..=4).contains(&measured)
            && (measured..=4).contains(&considered),
        "considered {considered}, measured {measured}, benchmarked {benchmarked} of 4"
    );
    // Per slice: lock held over the slice's own tuning phase.
    let utilization = summary["slice_utilization"].as_object().expect("per slice");
    assert_eq!(utilization.len(), 2, "one entry per slice: {utilization:?}");
    let phases = summary["tuning_phase_seconds"]
        .as_object()
        .expect("tuning_phase_seconds per slice");
    for (slice, share) in utilization {
        let share = share.as_f64().expect("number");
        assert!(share > 0.0 && share <= 1.0, "{slice}: {share}");
        let phase = phases
            .get(slice)
            .and_then(Value::as_f64)
            .unwrap_or_else(|| panic!("{slice} has no tuning phase: {phases:?}"));
        assert!(phase > 0.0, "{slice}: tuning phase {phase} s");
    }
    assert!(
        summary["utilization_definition"]
            .as_str()
            .is_some_and(|d| d.contains("first hardware-lock acquisition")),
        "{summary}"
    );
    let elapsed = summary["elapsed_seconds"].as_f64().expect("elapsed");
    assert!(elapsed > 0.0);
    // The best was found (its first record) after the first result and
    // before the demo ended.
    let first = summary["time_to_first_result_seconds"]
        .as_f64()
        .expect("time_to_first_result_seconds");
    let to_best = summary["time_to_best_seconds"]
        .as_f64()
        .expect("time_to_best_seconds");
    assert!(
        0.0 < first && first <= to_best && to_best <= elapsed,
        "first result {first} s, best {to_best} s, elapsed {elapsed} s"
    );
    assert!(
        summary["usage"]["prompt_tokens"]
            .as_u64()
            .is_some_and(|t| t > 0),
        "the job's model usage: {summary:#}"
    );

    let path = summary["report_path"].as_str().expect("report_path");
    assert_eq!(
        Path::new(path),
        report.canonicalize().expect("report exists")
    );
    let html = std::fs::read_to_string(path).expect("the report");
    assert!(
        html.contains("id=\"best-so-far\""),
        "best-so-far plot missing"
    );
    assert!(
        html.contains("id=\"slice-timeline\""),
        "slice timeline plot missing"
    );

    let left = processes_using(tmp.path());
    assert!(left.is_empty(), "processes left running: {left:?}");
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("tmp")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("mtswarm-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary directories left: {leftovers:?}"
    );
}

#[test]
fn ctrl_c_during_the_job_stops_everything() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut child = demo_command(tmp.path())
        .arg("--report")
        .arg(tmp.path().join("report.html"))
        .spawn()
        .expect("starting mtswarm demo");
    let lines = stdout_lines(&mut child);
    // Non-terminal output: plain lines; the job runs once it is submitted.
    loop {
        let line = lines
            .recv_timeout(DEMO_TIMEOUT)
            .expect("the demo submitted no job");
        if line.starts_with("submitted job") {
            break;
        }
    }
    assert!(
        !processes_using(tmp.path()).is_empty(),
        "nats-server should be running under the demo's TMPDIR"
    );
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    let status = wait_exit(&mut child, Duration::from_secs(120));
    assert_eq!(status.code(), Some(130), "exit status {status}");
    // SIGKILLed processes take a moment to be gone on a loaded machine;
    // anything still there after the grace period was left running.
    let left = processes_gone_within(tmp.path(), Duration::from_secs(10));
    assert!(left.is_empty(), "processes left running: {left:?}");
    assert!(!tmp.path().join("report.html").exists());
}
