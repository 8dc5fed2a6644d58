//! Acceptance 6: `mtswarm up` as a process. It reports ready through its
//! ready file, every daemon serves Prometheus metrics where it says,
//! `mtswarm fleet --json` lists the built-in fleet's 8 slices,
//! the demo's dgemm job followed off a terminal (`submit --watch` into a
//! pipe) prints a line per state change and result, not per engine event
//! (`watch --events` prints them all), and SIGINT (Ctrl-C) stops everything: no nats-server, leader or worker
//! left running, temporary directories removed, the logs kept where it
//! said.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use mtswarm_tests::cli::{UP_READY_FILE, spawn_up};
use mtswarm_tests::node_bin;
use mtswarm_tests::observability::scrape;
use mtswarm_tests::process::process_exists;

fn node() -> Command {
    let mut command = Command::new(node_bin!());
    command
        .env("MTSWARM_CACHE_DIR", mtswarm_tests::emulator_cache_dir())
        // The stack's client configuration goes here, not to ~/.mtswarm.
        .env(
            "MTSWARM_CONFIG",
            std::env::temp_dir().join(format!("mtswarm-up-test-{}.toml", std::process::id())),
        )
        .env_remove("MTSWARM_LEADER")
        .env_remove("MTSWARM_NATS_URL")
        .env_remove("MTSWARM_FLEET")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

fn fleet_json(leader: &str) -> Result<serde_json::Value, String> {
    let output = node()
        .args(["fleet", "--json", "--leader", leader])
        .output()
        .map_err(|e| format!("running mtswarm fleet: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("fleet --json output: {e}"))
}

fn pids(ready: &serde_json::Value) -> Vec<u32> {
    let pids = &ready["pids"];
    let mut all: Vec<u32> = Vec::new();
    for key in ["nats", "leader"] {
        all.extend(pids[key].as_u64().and_then(|p| u32::try_from(p).ok()));
    }
    for worker in pids["workers"].as_array().into_iter().flatten() {
        all.extend(worker.as_u64().and_then(|p| u32::try_from(p).ok()));
    }
    all
}

#[test]
fn up_serves_the_built_in_fleet_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ready_path = dir.path().join(UP_READY_FILE);
    let (mut up, ready) = spawn_up(node(), dir.path(), Duration::from_secs(120));
    let leader = ready.grpc.clone();
    let children = pids(&ready.document);
    assert_eq!(
        children.len(),
        4,
        "nats, leader, 2 workers: {}",
        ready.document
    );
    assert!(children.iter().all(|pid| process_exists(*pid)));
    let logs = PathBuf::from(ready.document["logs"].as_str().expect("logs dir"));
    assert_eq!(logs, dir.path().join("logs"), "--log-dir is used");
    assert!(logs.is_dir());
    let fleet_file = PathBuf::from(ready.document["fleet"].as_str().expect("fleet file"));
    assert!(fleet_file.is_file());

    // Workers register right after they serve; give the KV a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let fleet = loop {
        let fleet = fleet_json(&leader).unwrap_or_else(|e| panic!("{e}\n{}", up.stderr()));
        let slices = fleet["slices"].as_array().map(Vec::len).unwrap_or(0);
        if slices == 8 || std::time::Instant::now() >= deadline {
            break fleet;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let slices = fleet["slices"].as_array().expect("slices array");
    assert_eq!(slices.len(), 8, "{fleet}");
    assert!(
        slices
            .iter()
            .all(|s| s["state"] == "free" && s["backend"] == "emulator"),
        "{fleet}"
    );
    let boards: std::collections::BTreeSet<&str> =
        slices.iter().filter_map(|s| s["board"].as_str()).collect();
    assert_eq!(
        boards,
        std::collections::BTreeSet::from(["board0", "board1"])
    );
    assert_eq!(
        fleet["workers"].as_array().map(Vec::len),
        Some(2),
        "{fleet}"
    );

    // Every daemon serves its metrics where `up` says.
    let leader_metrics = ready.document["metrics"]
        .as_str()
        .expect("the leader's metrics URL");
    let text = scrape(leader_metrics).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains("# TYPE mtswarm_jobs gauge"), "{text}");
    let workers = ready.document["workers"].as_array().expect("workers");
    for worker in workers {
        let url = worker["metrics"].as_str().expect("a worker's metrics URL");
        assert_ne!(url, leader_metrics);
        let text = scrape(url).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains("mtswarm_worker_sessions{"), "{text}");
        assert!(text.contains("mtswarm_kernel_runs_total{"), "{text}");
    }

    watch_off_a_terminal_is_short(&leader);

    up.interrupt().expect("send SIGINT");
    let status = up
        .wait_exit(Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{status}; stderr:\n{}", up.stderr());
    for pid in children {
        assert!(!process_exists(pid), "process {pid} survived `mtswarm up`");
    }
    assert!(
        !fleet_file.exists(),
        "temporary directory of {} left behind",
        fleet_file.display()
    );
    for log in ["nats-server.log", "leader.log", "worker-board0.log"] {
        let path = logs.join(log);
        let kept = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(kept > 0, "{} not kept after the stop", path.display());
    }
    let said = format!("logs kept in {}", logs.display());
    assert!(up.stderr().contains(&said), "{}", up.stderr());
    assert!(!ready_path.exists(), "ready file removed on exit");

    // With the stack gone, the client explains what to do.
    let output = node()
        .args([
            "fleet",
            "--json",
            "--leader",
            &leader,
            "--connect-timeout",
            "2",
        ])
        .output()
        .expect("run mtswarm fleet");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is `mtswarm up` running?"), "{stderr}");
}

/// The demo's job through `submit --watch` with stdout a pipe: at most 50
/// lines, its results and its end among them; `watch --events` replays
/// every agent event as well.
fn watch_off_a_terminal_is_short(leader: &str) {
    let output = node()
        .args([
            "submit",
            "Tune the dgemm kernel for the highest GFLOPS",
            "--kernel",
            "dgemm",
            "--auto-approve",
            "--watch",
            "--leader",
            leader,
        ])
        .output()
        .expect("run mtswarm submit --watch");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines = stdout.lines().count();
    assert!(lines <= 50, "{lines} lines off a terminal:\n{stdout}");
    assert!(
        stdout.contains("result of task") && stdout.contains("-> succeeded"),
        "{stdout}"
    );
    let job_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("submitted job "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("submit names the job")
        .to_string();
    let all = node()
        .args(["watch", &job_id, "--events", "--leader", leader])
        .output()
        .expect("run mtswarm watch --events");
    let every = String::from_utf8_lossy(&all.stdout);
    assert!(
        all.status.success(),
        "watch --events: {}\n{every}\n{}",
        all.status,
        String::from_utf8_lossy(&all.stderr)
    );
    assert!(
        every.lines().count() > lines && every.contains(" step "),
        "--events adds the agent events: {} lines",
        every.lines().count()
    );
}

#[test]
fn up_names_a_port_in_use() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let port = taken.local_addr().expect("address").port();
    let dir = tempfile::tempdir().expect("temp dir");
    let output = node()
        .args(["up", "--nats-port", &port.to_string()])
        .args(["--leader-listen", "127.0.0.1:0", "--log-dir"])
        .arg(dir.path().join("logs"))
        .output()
        .expect("run mtswarm up");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("port {port} for NATS is in use")),
        "{stderr}"
    );
}
