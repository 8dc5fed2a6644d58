//! The `sdk` backend against a fake MT-3000 toolchain (tests/fixtures/sdk):
//! every fake tool records its argv; the fake launcher runs a fake harness
//! that prints MTSWARM_TIME / MTSWARM_RESULT lines.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::sdk_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mtswarm_hw::measure::{MeasureConfig, measure};
use mtswarm_hw::sdk::{ProcessLimits, SdkBoard, SdkConfig, parse_harness_output};
use mtswarm_hw::{Artifact, BackendKind, Board, BuildRequest, ChipSpec, HwError, RunRequest};
use sdk_support::{confined, fake_sdk_config, fixture_kernel, fixtures, sdk_slice};

struct Setup {
    _tmp: tempfile::TempDir,
    log: PathBuf,
    out_dir: PathBuf,
    kernel_dir: PathBuf,
    board: SdkBoard,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().expect("tempdir");
    let BuildRequest {
        kernel_dir,
        out_dir,
        ..
    } = fixture_kernel(tmp.path());
    // Inside the build directory: a build step writes nothing else.
    let log = out_dir.join("argv.log");
    let config = SdkConfig {
        launch_prefix: vec![
            "yhrun".into(),
            "-p".into(),
            "thcp1".into(),
            "-w".into(),
            "node17".into(),
        ],
        ..fake_sdk_config(&log)
    };
    let board =
        SdkBoard::new(sdk_slice("node17", 2), ChipSpec::default(), config).expect("sdk board");
    Setup {
        _tmp: tmp,
        log,
        out_dir,
        kernel_dir,
        board,
    }
}

impl Setup {
    /// A build of the fixture kernel with `defines`.
    fn request(&self, defines: BTreeMap<String, String>) -> BuildRequest {
        BuildRequest {
            kernel_dir: self.kernel_dir.clone(),
            defines,
            out_dir: self.out_dir.clone(),
        }
    }

    async fn build(&self, defines: BTreeMap<String, String>) -> Result<Artifact, HwError> {
        self.board.build(&self.request(defines)).await
    }
}

/// One define, `name=value`.
fn define(name: &str, value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(name.to_string(), value.to_string())])
}

fn recorded(log: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[tokio::test]
async fn sdk_issues_the_documented_commands_and_parses_results() {
    let s = setup();
    let defines = BTreeMap::from([
        ("N".to_string(), "4096".to_string()),
        ("UNROLL".to_string(), "4".to_string()),
    ]);
    let artifact = s.build(defines.clone()).await.expect("build");
    let out = std::fs::canonicalize(&s.out_dir).expect("out dir");
    let kdir = std::fs::canonicalize(&s.kernel_dir).expect("kernel dir");
    let root = fixtures();
    let o = |f: &str| out.join(f).display().to_string();
    let lib = |f: &str| format!("{}/{f}", root.join("lib").display());
    let include = format!("-I{}", root.join("include").display());

    let calls = recorded(&s.log);
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(
        strs(&calls[0]),
        [
            "MT-3000-gcc",
            "-c",
            "-O2",
            "-fenable-m3000",
            "-ffunction-sections",
            "-flax-vector-conversions",
            &include,
            "-DN=4096",
            "-DUNROLL=4",
            &kdir.join("kernel.c").display().to_string(),
            "-o",
            &o("kernel.o"),
        ]
    );
    assert_eq!(
        strs(&calls[1]),
        [
            "MT-3000-ld",
            "--gc-sections",
            "-T",
            &lib("dsp.lds"),
            &o("kernel.o"),
            &lib("libhthread_device.a"),
            &lib("vlib3000.a"),
            &lib("slib3000.a"),
            "-o",
            &o("kernel.out"),
        ]
    );
    assert_eq!(strs(&calls[2]), ["MT-3000-makedat", "-J", &o("kernel.out")]);
    assert_eq!(
        strs(&calls[3]),
        [
            "gcc",
            "-O2",
            &include,
            "-DN=4096",
            "-DUNROLL=4",
            &kdir.join("host.c").display().to_string(),
            "-o",
            &o("host"),
            &format!("-L{}", root.join("lib").display()),
            "-lhthread_host",
            "-lpthread",
        ]
    );
    assert_eq!(artifact.backend, BackendKind::Sdk);
    assert_eq!(artifact.program, out.join("host"));
    assert_eq!(artifact.kernel_hash.len(), 64);
    assert!(
        artifact
            .toolchain
            .contains("MT-3000-gcc -O2 -fenable-m3000"),
        "{}",
        artifact.toolchain
    );

    let outcome = s
        .board
        .run(&artifact, &RunRequest::new(8, 3, Duration::from_secs(30)))
        .await
        .expect("run");
    let calls = recorded(&s.log);
    assert_eq!(
        strs(&calls[4]),
        [
            "yhrun",
            "-p",
            "thcp1",
            "-w",
            "node17",
            "env",
            "MTSWARM_CLUSTER=2",
            "MTSWARM_CORES=8",
            &o("host"),
            "--runs",
            "3",
        ]
    );
    assert!(outcome.valid, "{outcome:?}");
    assert_eq!(outcome.samples.len(), 3);
    let secs: Vec<f64> = outcome.samples.iter().map(|x| x.seconds).collect();
    assert_eq!(
        secs,
        [0.001, 0.002, 0.003],
        "seconds come from MTSWARM_TIME"
    );
    assert_eq!(outcome.counters.flops, 2_000_000);
    assert!((outcome.gflops - 2e6 / 0.003 / 1e9).abs() < 1e-9);
    assert!(
        outcome.output_tail.contains("cores=8 cluster=2"),
        "{}",
        outcome.output_tail
    );
}

#[tokio::test]
async fn sdk_kernel_hash_changes_with_defines_and_source() {
    let s = setup();
    let a = s.build(BTreeMap::new()).await.expect("build a");
    let b = s.build(define("N", "8")).await.expect("build b");
    assert_ne!(a.kernel_hash, b.kernel_hash);
    std::fs::write(s.kernel_dir.join("kernel.c"), "/* changed */").expect("edit");
    let c = s.build(BTreeMap::new()).await.expect("build c");
    assert_ne!(a.kernel_hash, c.kernel_hash);
}

#[tokio::test]
async fn sdk_compile_errors_and_bad_inputs_are_clear() {
    let s = setup();
    std::fs::write(s.kernel_dir.join("kernel.c"), "SYNTAX_ERROR").expect("write");
    let err = s.build(BTreeMap::new()).await.expect_err("compile error");
    let msg = err.to_string();
    assert!(
        msg.contains("MT-3000-gcc") && msg.contains("expected ';'"),
        "{msg}"
    );

    let err = s
        .build(define("N; rm -rf /", "1"))
        .await
        .expect_err("bad define");
    assert!(err.to_string().contains("not a C identifier"), "{err}");

    let err = s
        .board
        .build(&BuildRequest {
            kernel_dir: s.out_dir.join("missing"),
            ..s.request(BTreeMap::new())
        })
        .await
        .expect_err("missing dir");
    assert!(matches!(err, HwError::Kernel(_)), "{err}");

    let bad = SdkConfig {
        launch: vec!["{launch_prefix}".into(), "{programm}".into()],
        ..SdkConfig::default()
    };
    let err = bad.validate().expect_err("unknown placeholder");
    assert!(
        err.to_string().contains("unknown placeholder `{programm}`"),
        "{err}"
    );
    let err = SdkConfig::from_toml_str("launch = []").expect_err("empty template");
    assert!(err.to_string().contains("`launch` is empty"), "{err}");
}

#[tokio::test]
async fn sdk_run_timeout_kills_the_process_group() {
    let s = setup();
    let artifact = s.build(define("HANG", "1")).await.expect("build");
    let start = Instant::now();
    let err = s
        .board
        .run(
            &artifact,
            &RunRequest::new(1, 1, Duration::from_millis(300)),
        )
        .await
        .expect_err("hang times out");
    assert!(matches!(err, HwError::Timeout(_)), "{err}");
    // The harness sleeps 30 s; the group kill returns long before that.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let err = s
        .board
        .run(&artifact, &RunRequest::new(25, 1, Duration::from_secs(1)))
        .await
        .expect_err("too many cores");
    assert!(err.to_string().contains("out of range 1..=24"), "{err}");
}

#[tokio::test]
async fn sdk_measurement_catches_a_kernel_wrong_on_later_runs() {
    let s = setup();
    let artifact = s.build(define("FAULT_AFTER", "2")).await.expect("build");
    let config = MeasureConfig {
        cores: 4,
        warmup: 1,
        min_repeats: 4,
        min_seconds: 0.0,
        runs_per_launch: 4,
        launch_timeout: Duration::from_secs(30),
        ..MeasureConfig::default()
    };
    let m = measure(&s.board, &artifact, &ChipSpec::default(), &config)
        .await
        .expect("measure");
    assert!(!m.valid && m.stats.is_none(), "{m:?}");
    assert!(
        m.error.as_deref().unwrap_or("").contains("execution 3"),
        "{:?}",
        m.error
    );
}

#[test]
fn harness_output_without_timing_lines_uses_wall_clock() {
    let out = "noise\nMTSWARM_RESULT {\"valid\":true,\"max_abs_err\":1e-12,\"flops\":100,\"error\":null}\n\
               MTSWARM_RESULT {\"valid\":true,\"flops\":100,\"seconds\":0.5}\nMTSWARM_RESULT {broken\n";
    let samples = parse_harness_output(out, Duration::from_secs(3));
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].seconds, 1.0);
    assert_eq!(samples[0].max_abs_err, Some(1e-12));
    assert_eq!(samples[1].seconds, 0.5);
    assert!(!samples[2].valid);
    assert!(
        samples[2]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("unparseable")
    );
}

#[tokio::test]
async fn confined_processes_get_rlimits() {
    let tmp = tempfile::tempdir().expect("tmp");
    let limits = ProcessLimits {
        open_files: Some(64),
        cpu_seconds: Some(7),
        ..Default::default()
    };
    let out = confined(
        &["sh", "-c", "ulimit -n; ulimit -t; ulimit -c"],
        tmp.path(),
        Duration::from_secs(10),
        &limits,
    )
    .await
    .expect("runs");
    assert!(out.status.success());
    assert_eq!(out.stdout.lines().collect::<Vec<_>>(), ["64", "7", "0"]);
}

#[tokio::test]
async fn confined_processes_can_run_at_a_lower_cpu_priority() {
    let tmp = tempfile::tempdir().expect("tmp");
    let niceness = |nice: Option<i32>| {
        let tmp = tmp.path().to_path_buf();
        async move {
            let limits = ProcessLimits {
                nice,
                ..Default::default()
            };
            // `nice` with no command prints the current niceness.
            let out = confined(&["nice"], &tmp, Duration::from_secs(10), &limits)
                .await
                .expect("runs");
            assert!(out.status.success(), "{out:?}");
            out.stdout.trim().parse::<i32>().expect("a niceness")
        }
    };
    let inherited = niceness(None).await;
    let lowered = niceness(Some(5)).await;
    assert_eq!(lowered, (inherited + 5).min(19));
}

/// A shell script that starts `command` in the background and writes its
/// pid as the host sees it to `pidfile` (`$!` is a pid inside the step's
/// own PID namespace; /proc is the host's), then waits.
fn host_pid_script(pidfile: &Path, command: &str) -> String {
    format!(
        "sh -c 'read -r pid rest < /proc/self/stat; echo $pid > {}.tmp; mv {0}.tmp {0}; exec {command}' & wait",
        pidfile.display()
    )
}

/// True while `pid` is alive (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Waits (at most 5 s) until `pid` is no longer alive.
async fn wait_until_dead(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn timeout_kills_grandchildren_in_the_group() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pidfile = tmp.path().join("pid");
    let script = host_pid_script(&pidfile, "sleep 60");
    let err = confined(
        &["sh", "-c", &script],
        tmp.path(),
        Duration::from_millis(300),
        &ProcessLimits::default(),
    )
    .await
    .expect_err("times out");
    assert!(matches!(err, HwError::Timeout(_)), "{err}");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pid written")
        .trim()
        .parse()
        .expect("pid");
    wait_until_dead(pid).await;
    assert!(!alive(pid), "grandchild {pid} survived the group kill");
}

#[tokio::test]
async fn abandoning_a_run_kills_its_process_group() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pidfile = tmp.path().join("pid");
    let script = host_pid_script(&pidfile, "sleep 60");
    let cwd = tmp.path().to_path_buf();
    let run = tokio::spawn(async move {
        confined(
            &["sh", "-c", &script],
            &cwd,
            Duration::from_secs(120),
            &ProcessLimits::default(),
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the script never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(alive(pid));
    run.abort();
    let _ = run.await;
    wait_until_dead(pid).await;
    assert!(!alive(pid), "grandchild {pid} survived the cancelled run");
}
