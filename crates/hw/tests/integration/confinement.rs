//! Nothing a build or launch starts outlives it, and a build cannot fork
//! without end: a step and a compiler wrapper that leave a `setsid`
//! grandchild behind (for builds the PID namespace and the build cgroup's
//! removal each end it),
//! one that tries to fork 10,000 processes, exit statuses and signals through
//! the PID namespace, a missing compiler, and a confined local launch of the
//! sdk backend. Real gcc, real shells, real processes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;
use crate::sdk_support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use emulator_support::*;
use mtswarm_hw::host::HostBoard;
use mtswarm_hw::sdk::{ProcessLimits, SdkBoard};
use mtswarm_hw::{Board, BuildRequest, ChipSpec, HwError, RunRequest};
use sdk_support::{confined, fake_sdk_config, fixture_kernel, sdk_slice};

/// Tests of this binary that build run one at a time: the cgroup checks look
/// at all of this process's build groups.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A token no other process on the host carries in its command line.
fn unique_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // Digits only: it is the fraction of a `sleep` interval.
    format!("{}{:09}", std::process::id() % 1000, nanos)
}

/// Host pids of live processes whose command line holds `token`.
fn processes_with(token: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let live = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
                .unwrap_or(false);
            live && String::from_utf8_lossy(&cmdline).contains(token)
        })
        .collect()
}

/// Wait (bounded) until no process carries `token`; the ones still there.
async fn wait_until_gone(token: &str) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_with(token);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A compiler wrapper: `body` runs for every compile (not for the version
/// query the board makes unconfined), then the real gcc.
fn wrapper(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("cc-wrapper.sh");
    let script = format!(
        "#!/bin/sh\ncase \" $* \" in *\" -dumpfullversion \"*|*\" -dumpversion \"*) exec gcc \"$@\" ;; esac\n{body}\nexec gcc \"$@\"\n"
    );
    std::fs::write(&path, script).expect("write wrapper");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A host-backend board (native build steps through `compiler`): the
/// confinement of build steps is the same for every backend.
fn board_with(compiler: &Path, cache: &Path) -> HostBoard {
    HostBoard::new(slice(2), ChipSpec::default())
        .expect("slice")
        .with_cache_dir(cache)
        .with_compiler(compiler.display().to_string())
}

fn request(out: &Path) -> BuildRequest {
    BuildRequest {
        kernel_dir: kernels_dir().join("vecadd"),
        defines: defines("vecadd", &[]),
        out_dir: out.to_path_buf(),
    }
}

/// Build cgroups of this process still present.
/// The build cgroups of this process left after a wait for their removal
/// (a loaded host reaps killed processes late; the removal keeps trying).
async fn build_cgroups_left_after_removal() -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = build_cgroups_left();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn build_cgroups_left() -> Vec<String> {
    let prefix = format!("mtswarm-build-{}-", std::process::id());
    ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"]
        .iter()
        .filter_map(|root| std::fs::read_dir(root).ok())
        .flat_map(|d| d.flatten())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_setsid_grandchild_of_the_compiler_dies_with_the_build() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let token = format!("300.{}", unique_token());
    // The orphan leaves the process group and the session; the marker (in
    // the step's own directory, the only one it may write) proves it ran.
    let cc = wrapper(
        tmp.path(),
        &format!(
            "setsid sh -c 'echo alive >> orphan.marker; exec sleep {token}' </dev/null >/dev/null 2>&1 &\nn=0; while [ ! -s orphan.marker ] && [ $n -lt 1000000 ]; do n=$((n+1)); done"
        ),
    );
    let out = tmp.path().join("out");
    let board = board_with(&cc, &tmp.path().join("cache"));
    let artifact = board
        .build(&request(&out))
        .await
        .expect("the wrapper forwards to gcc: the build succeeds");
    assert!(
        std::fs::read_to_string(out.join("orphan.marker"))
            .expect("the wrapper ran in the build directory")
            .contains("alive"),
        "the orphan was started and alive"
    );
    let left = wait_until_gone(&token).await;
    assert!(
        left.is_empty(),
        "setsid grandchildren {left:?} outlived the build"
    );
    let cgroups = build_cgroups_left_after_removal().await;
    assert!(cgroups.is_empty(), "{cgroups:?}");

    // The board stays healthy: the artifact runs and validates.
    let outcome = board
        .run(&artifact, &RunRequest::new(2, 1, Duration::from_secs(60)))
        .await
        .expect("runs");
    assert!(outcome.valid, "{:?}", outcome.error);
}

#[tokio::test]
async fn a_setsid_grandchild_of_any_step_dies_with_it() {
    // No sandbox policy, so no build cgroup: the PID namespace alone.
    let tmp = tempfile::tempdir().expect("tmp");
    let token = format!("300.{}", unique_token());
    let script = format!(
        "setsid sh -c 'echo started > marker.tmp; mv marker.tmp marker; exec sleep {token}' \
         </dev/null >/dev/null 2>&1 &\nwhile [ ! -s marker ]; do :; done"
    );
    let out = confined(
        &["sh", "-c", &script],
        tmp.path(),
        Duration::from_secs(20),
        &ProcessLimits::default(),
    )
    .await
    .expect("runs");
    assert!(out.status.success(), "{out:?}");
    assert!(tmp.path().join("marker").exists(), "the orphan started");
    let left = wait_until_gone(&token).await;
    assert!(
        left.is_empty(),
        "setsid grandchild {left:?} outlived its step"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compiler_forking_ten_thousand_processes_is_stopped_at_the_limit() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let token = format!("60.{}", unique_token());
    let cc = wrapper(
        tmp.path(),
        &format!(
            "i=0\nwhile [ $i -lt 10000 ]; do sleep {token} & i=$((i+1)); done\necho \"forked all $i\" >&2"
        ),
    );
    let board = board_with(&cc, &tmp.path().join("cache"));
    let started = Instant::now();
    let err = board
        .build(&request(&tmp.path().join("out")))
        .await
        .expect_err("the fork bomb must not build");
    let msg = err.to_string();
    assert!(matches!(err, HwError::Compile(_)), "{err}");
    assert!(!msg.contains("forked all"), "{msg}");
    assert!(
        msg.contains("fork") || msg.contains("Resource temporarily unavailable"),
        "the error says a fork was refused: {msg}"
    );
    let left = wait_until_gone(&token).await;
    assert!(
        left.is_empty(),
        "{} of the bomb's processes survived",
        left.len()
    );
    let cgroups = build_cgroups_left_after_removal().await;
    assert!(cgroups.is_empty(), "{cgroups:?}");
    eprintln!("fork bomb stopped in {:?}: {msg}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_compiler_is_a_clear_error() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let board = board_with(
        Path::new("/nonexistent/mtswarm-cc"),
        &tmp.path().join("cache"),
    );
    let err = board
        .build(&request(&tmp.path().join("out")))
        .await
        .expect_err("no compiler");
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/mtswarm-cc") && msg.contains("No such file"),
        "{msg}"
    );
}

#[tokio::test]
async fn exit_codes_and_signals_come_through_the_pid_namespace() {
    let tmp = tempfile::tempdir().expect("tmp");
    let run = |script: &'static str| {
        let cwd = tmp.path().to_path_buf();
        async move {
            confined(
                &["sh", "-c", script],
                &cwd,
                Duration::from_secs(10),
                &ProcessLimits::default(),
            )
            .await
            .expect("runs")
        }
    };
    let out = run("echo out; echo err >&2; exit 7").await;
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("out\n", "err\n")
    );
    let out = run("kill -ABRT $$").await;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
    // The program is not pid 1 of its namespace (its init is), so it keeps
    // ordinary signal semantics; and it does run in a namespace of its own.
    let out = run("echo $$").await;
    let pid: u32 = out.stdout.trim().parse().expect("a pid");
    assert!(pid > 1, "{out:?}");
    if mtswarm_hw::sandbox::pidns::available() {
        assert!(
            pid < 10,
            "the program got host pid {pid}, not a new namespace"
        );
    }
}

/// An sdk board on the fake toolchain launching on this host.
fn local_sdk_board(tmp: &Path, launch: Option<Vec<String>>) -> (SdkBoard, BuildRequest) {
    let request = fixture_kernel(tmp);
    let mut config = fake_sdk_config(&request.out_dir.join("argv.log"));
    if let Some(launch) = launch {
        config.launch = launch;
    }
    let board =
        SdkBoard::new(sdk_slice("local", 0), ChipSpec::default(), config).expect("sdk board");
    (board, request)
}

#[tokio::test]
async fn a_local_sdk_launch_is_confined_and_still_measures() {
    let _serial = SERIAL.lock().await;
    let run = RunRequest::new(4, 2, Duration::from_secs(20));
    // The documented launch, run on this host: the harness works.
    let tmp = tempfile::tempdir().expect("tmp");
    let (board, build) = local_sdk_board(tmp.path(), None);
    let artifact = board.build(&build).await.expect("confined build");
    let outcome = board.run(&artifact, &run).await.expect("runs");
    assert!(outcome.valid, "{:?} {}", outcome.error, outcome.output_tail);
    assert_eq!(outcome.samples.len(), 2);
    assert!(
        outcome.output_tail.contains("cores=4"),
        "{}",
        outcome.output_tail
    );

    // A launch that probes: the host's files, writing outside, the daemon's
    // environment and starting a process (shell builtins only until then).
    // SAFETY: set before the launch; no other test of this binary reads it.
    unsafe { std::env::set_var("SDK_TEST_API_KEY", "sk-not-for-harnesses") };
    let outside = tempfile::tempdir().expect("tmp");
    let outside_file = outside.path().join("answer");
    let script = format!(
        "if read -r line < /etc/passwd; then echo \"PROBE passwd ok $line\"; else echo 'PROBE passwd fail'; fi\n\
         if echo x > {}; then echo 'PROBE outside ok'; else echo 'PROBE outside fail'; fi\n\
         echo \"PROBE secret [$SDK_TEST_API_KEY]\"\n\
         (true)\necho 'PROBE fork ok'",
        outside_file.display()
    );
    let tmp2 = tempfile::tempdir().expect("tmp");
    let (probe_board, build) =
        local_sdk_board(tmp2.path(), Some(vec!["sh".into(), "-c".into(), script]));
    let artifact = probe_board.build(&build).await.expect("confined build");
    let outcome = probe_board.run(&artifact, &run).await.expect("runs");
    let tail = &outcome.output_tail;
    assert!(tail.contains("PROBE passwd fail"), "{tail}");
    assert!(!tail.contains("root:x"), "{tail}");
    assert!(tail.contains("PROBE outside fail"), "{tail}");
    assert!(
        !outside_file.exists(),
        "the launch wrote outside its directory"
    );
    assert!(tail.contains("PROBE secret []"), "{tail}");
    assert!(!tail.contains("PROBE fork ok"), "{tail}");
    assert!(!outcome.valid, "a probe prints no result: {tail}");
}

/// A descriptor of this process without close-on-exec, as a daemon's
/// parent could pass down: (its number, the file that keeps it open).
fn leaked_descriptor(dir: &Path) -> (i32, std::fs::File) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::create(dir.join("daemon-secret")).expect("create");
    let fd = file.as_raw_fd();
    // SAFETY: clearing FD_CLOEXEC of a descriptor this test owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        assert!(flags >= 0);
        assert_eq!(libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC), 0);
    }
    (fd, file)
}

#[tokio::test(flavor = "multi_thread")]
async fn descriptors_the_daemon_holds_reach_neither_a_build_step_nor_a_launch() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let (fd, _keep) = leaked_descriptor(tmp.path());
    // The build step: a compiler wrapper that tries to read the descriptor.
    let cc = wrapper(
        tmp.path(),
        &format!(
            "if ( : <&{fd} ) 2>/dev/null; then echo leaked >> fd.marker; else echo closed >> fd.marker; fi"
        ),
    );
    let out = tmp.path().join("out");
    let board = board_with(&cc, &tmp.path().join("cache"));
    let artifact = board.build(&request(&out)).await.expect("builds");
    let marker = std::fs::read_to_string(out.join("fd.marker")).expect("the wrapper ran");
    assert!(
        marker.contains("closed") && !marker.contains("leaked"),
        "{marker}"
    );
    // The launch: native device code that looks for the descriptor and
    // spoils its answer when it finds it.
    let dir = fixture(&kernel_with_body(
        "#include <fcntl.h>",
        &format!(
            "int t = get_thread_id(), g = get_group_size();\n\
             for (uint64_t i = t; i < n; i += g) c[i] = a[i] + b[i];\n\
             if (t == 0 && fcntl({fd}, F_GETFD) != -1) c[0] = -1e300;"
        ),
    ));
    let native = HostBoard::new(slice(2), ChipSpec::default())
        .expect("slice")
        .with_cache_dir(tmp.path().join("cache"));
    let built = native
        .build(&BuildRequest {
            kernel_dir: dir.path().to_path_buf(),
            defines: defines("vecadd", &[("N", "4096")]),
            out_dir: tmp.path().join("native"),
        })
        .await
        .expect("builds natively");
    let outcome = native
        .run(&built, &RunRequest::new(2, 1, Duration::from_secs(60)))
        .await
        .expect("runs");
    assert!(
        outcome.valid,
        "the launch saw descriptor {fd}: {:?}",
        outcome.error
    );
    drop(artifact);
}
