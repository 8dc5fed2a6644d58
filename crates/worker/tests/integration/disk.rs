//! Disk hygiene of a real daemon on real files: the workspaces of finished
//! sessions go after the retention while live ones stay, leftovers of a
//! previous process (and interrupted removals) go at start, links out of
//! the workspace root are never followed, a spawn over the disk quota is
//! refused with RESOURCE_EXHAUSTED naming the root, the usage and the
//! quota, and the configuration refuses unusable values.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;
use mtswarm_bus::v1;
use mtswarm_worker::{JanitorReport, WorkerConfig, WorkerError, WorkerHandle};
use tonic::Code;

/// Set the modification time of `path` (a file or a real directory).
fn backdate(path: &Path, age: Duration) {
    std::fs::File::open(path)
        .and_then(|f| f.set_modified(SystemTime::now() - age))
        .unwrap_or_else(|e| panic!("backdate {}: {e}", path.display()));
}

/// Wait (bounded by [`WAIT`]) for a janitor report that satisfies `done`.
async fn report_where(
    handle: &WorkerHandle,
    what: &str,
    done: impl Fn(&JanitorReport) -> bool,
) -> JanitorReport {
    let mut reports = handle.janitor_reports();
    let waited = tokio::time::timeout(WAIT, async {
        loop {
            let report = reports.borrow_and_update().clone();
            if done(&report) {
                return report;
            }
            reports.changed().await.expect("the daemon's janitor runs");
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("no janitor report {what} within {WAIT:?}"))
}

/// Put a file to keep in `dir` (outside the workspace root).
fn precious_in(dir: &Path) {
    std::fs::write(dir.join("precious"), "keep me").expect("precious");
}

/// The file [`precious_in`] wrote is still there, unchanged.
fn assert_precious_survives(dir: &Path) {
    let kept = std::fs::read_to_string(dir.join("precious")).expect("outside survives");
    assert_eq!(kept, "keep me");
}

fn removed_ids(report: &JanitorReport) -> Vec<&str> {
    report
        .removed
        .iter()
        .map(|r| r.session_id.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sessions_workspace_goes_after_the_retention_and_a_live_one_stays() {
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.workspace_retention = Duration::from_secs(1);
    let root = config.workspace_root.clone();
    let handle = env.daemon(config).await;
    let slices = handle.slice_ids();
    let finished = Session::on(&handle, &slices[0], "jobW", "agentF", "sessF");
    let live = Session::on(&handle, &slices[1], "jobW", "agentL", "sessL");
    spawn(&handle, finished.spawn_request()).await;
    spawn(&handle, live.spawn_request()).await;
    let finished_ws = root.join("sessF");
    let live_ws = root.join("sessL");
    // A spawn copies nothing; each session's first task copies its kernel.
    assert!(
        !finished_ws.join("vecadd").exists(),
        "kernel copied at spawn"
    );
    let mut results = results(&env.bus, "jobW", "disk-results").await;
    for session in [&finished, &live] {
        env.publish(&session.task(
            &format!("t-{}", session.id),
            1,
            serde_json::json!({"noop": true}),
        ))
        .await;
    }
    for _ in 0..2 {
        let result = next_result(&mut results, "a no-op task's result").await;
        assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    }
    assert!(finished_ws.join("vecadd").is_dir(), "kernel copied");
    assert!(live_ws.join("vecadd").is_dir(), "kernel copied");
    // A link from the finished workspace to a directory outside the root.
    let outside = tempfile::tempdir().expect("outside");
    precious_in(outside.path());
    std::os::unix::fs::symlink(outside.path(), finished_ws.join("escape")).expect("link");

    let mut events = env.bus.subscribe_events("jobW").await.expect("events");
    env.bus.flush().await.expect("flush");
    let cancelled = client(&handle)
        .await
        .cancel_session(v1::CancelSessionRequest {
            session_id: "sessF".into(),
            reason: "done".into(),
        })
        .await
        .expect("cancel")
        .into_inner();
    assert!(cancelled.cancelled);
    session_finished(&mut events, "sessF").await;

    let removal = report_where(&handle, "removing sessF", |r| {
        removed_ids(r).contains(&"sessF")
    })
    .await;
    assert_eq!(removed_ids(&removal), ["sessF"], "{removal:?}");
    assert!(removal.removed[0].bytes > 0, "{removal:?}");
    assert!(!finished_ws.exists(), "the finished workspace is gone");
    assert_precious_survives(outside.path());
    // Two more passes, each more than the retention after the live
    // session's workspace was written: it stays.
    let later = report_where(&handle, "two passes later", |r| r.pass >= removal.pass + 2).await;
    assert!(later.removed.is_empty(), "{later:?}");
    assert!(live_ws.join("vecadd").is_dir(), "the live workspace stays");
    assert_eq!(handle.session_count(), 1);
    let usage = handle.disk_usage();
    assert_eq!(usage.root, root);
    assert!(
        usage.bytes > 0 && usage.bytes == later.usage_bytes,
        "{usage:?} {later:?}"
    );
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_past_the_retention_go_at_start_and_links_out_of_the_root_survive() {
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.workspace_retention = Duration::from_secs(3600);
    let root = config.workspace_root.clone();
    std::fs::create_dir_all(&root).expect("root");
    let two_hours = Duration::from_secs(7200);
    // A previous process's finished workspace.
    let old = root.join("old-sess");
    std::fs::create_dir_all(old.join("vecadd/.build")).expect("old");
    std::fs::write(old.join("vecadd/.build/kernel.o"), vec![0u8; 4096]).expect("object");
    for path in [
        old.join("vecadd/.build/kernel.o"),
        old.join("vecadd/.build"),
        old.join("vecadd"),
        old.clone(),
    ] {
        backdate(&path, two_hours);
    }
    // A recent one, a link to an old directory outside, a stray file and a
    // directory that no session could own.
    std::fs::create_dir_all(root.join("recent-sess")).expect("recent");
    std::fs::write(root.join("recent-sess/kernel.c"), "int x;").expect("recent file");
    let outside = tempfile::tempdir().expect("outside");
    precious_in(outside.path());
    backdate(&outside.path().join("precious"), two_hours);
    backdate(outside.path(), two_hours);
    std::os::unix::fs::symlink(outside.path(), root.join("linked-sess")).expect("link");
    std::fs::write(root.join("notes.txt"), "operator notes").expect("notes");
    backdate(&root.join("notes.txt"), two_hours);
    // What an interrupted removal left (a fresh one: it goes all the same).
    let trash = root.join(".mtswarm-removing-1-7-gone-sess");
    std::fs::create_dir_all(trash.join("vecadd")).expect("trash");
    std::fs::write(trash.join("vecadd/kernel.c"), "int x;").expect("trash file");
    std::fs::create_dir(root.join("not a session")).expect("odd dir");
    backdate(&root.join("not a session"), two_hours);

    let handle = env.daemon(config).await;
    // The first pass ran before the daemon served.
    let first = handle.janitor_reports().borrow().clone();
    assert_eq!(first.pass, 1, "{first:?}");
    assert_eq!(removed_ids(&first), ["old-sess"], "{first:?}");
    assert!(first.removed[0].bytes >= 4096, "{first:?}");
    assert_eq!(first.errors, 0, "{first:?}");
    assert!(!old.exists());
    assert!(!trash.exists(), "the interrupted removal is finished");
    assert!(root.join("recent-sess/kernel.c").is_file());
    assert!(root.join("notes.txt").is_file());
    assert!(root.join("not a session").is_dir());
    let link = std::fs::symlink_metadata(root.join("linked-sess")).expect("the link stays");
    assert!(link.file_type().is_symlink());
    assert_precious_survives(outside.path());
    // The usage counts what is left, and not what the link points at.
    assert_eq!(handle.disk_usage().bytes, first.usage_bytes);
    assert!(first.usage_bytes > 0, "{first:?}");
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_over_the_disk_quota_is_refused_naming_root_usage_and_quota() {
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.disk_quota_bytes = Some(16 * 1024);
    let root = config.workspace_root.clone();
    std::fs::create_dir_all(root.join("earlier-sess")).expect("earlier");
    std::fs::write(root.join("earlier-sess/blob"), vec![0u8; 64 * 1024]).expect("blob");
    let handle = env.daemon(config).await;
    let usage = handle.disk_usage();
    assert!(usage.bytes >= 64 * 1024, "{usage:?}");
    assert_eq!(usage.quota, Some(16 * 1024));

    let slice = handle.slice_ids()[0].clone();
    let session = Session::on(&handle, &slice, "jobQ", "agentQ", "sessQ");
    let status = refused_spawn(
        &mut client(&handle).await,
        session.spawn_request(),
        Code::ResourceExhausted,
        "over the disk quota",
    )
    .await;
    let message = status.message();
    let expected_start = format!("workspace root {} uses ", root.display());
    assert!(message.starts_with(&expected_start), "{message}");
    assert!(
        message.ends_with(
            "of its 16.0 KiB quota; finished sessions' workspaces are removed after 24h (--workspace-retention)"
        ),
        "{message}"
    );
    assert_eq!(handle.session_count(), 0);
    assert!(
        !root.join("sessQ").exists(),
        "no workspace for a refused session"
    );
    handle.shutdown().await.expect("shutdown");
}

#[test]
fn the_configuration_refuses_unusable_retention_quota_and_root() {
    let dir = tempfile::tempdir().expect("dir");
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        "[[board]]\nid = \"emu0\"\nbackend = \"emulator\"\nslices = [{ cluster = 0, cores = 4 }]\n",
    )
    .expect("fleet");
    let valid = || {
        let mut config = WorkerConfig::new(&fleet, "emu0");
        config.topology = mtswarm_bus::TopologyConfig::small();
        config.kernel_root = kernel_root();
        config.workspace_root = dir.path().join("ws");
        config
    };
    valid().validate().expect("the defaults are valid");
    assert_eq!(valid().workspace_retention, Duration::from_secs(24 * 3600));
    assert_eq!(valid().disk_quota_bytes, None);

    let field_of = |config: WorkerConfig| match config.validate() {
        Err(WorkerError::Config { field, reason }) => (field, reason),
        other => panic!("expected a configuration error, got {other:?}"),
    };
    let mut config = valid();
    config.workspace_retention = Duration::from_millis(500);
    let (field, reason) = field_of(config);
    assert_eq!(field, "workspace_retention");
    assert!(reason.contains("at least 1 s"), "{reason}");

    let mut config = valid();
    config.disk_quota_bytes = Some(0);
    let (field, reason) = field_of(config);
    assert_eq!(field, "disk_quota_bytes");
    assert!(reason.contains("0 bytes"), "{reason}");

    let mut config = valid();
    config.workspace_root = "/".into();
    let (field, reason) = field_of(config);
    assert_eq!(field, "workspace_root");
    assert!(reason.contains("directory of its own"), "{reason}");

    let mut config = valid();
    config.disk_quota_bytes = Some(1);
    config.workspace_retention = Duration::from_secs(1);
    config.validate().expect("the smallest usable values");
}
