//! A slice whose emulator crashes every launch fails its hardware runs in a
//! row (the reference kernel crashes too); at `quarantine_after` failures
//! the worker quarantines the slice, ends the session's task with a fenced
//! result, refuses the slice in SpawnSession, and takes it again once the
//! record is lifted. Candidates that are wrong on a healthy slice are
//! theirs to answer for: the slice stays in service.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_bus::Quarantine;
use serde_json::json;

const FLAKY_FLEET: &str = r#"
[[board]]
id = "flaky"
backend = "emulator"
slices = [{ cluster = 0, cores = 4, faults = { crash = 1.0, seed = 1 } }, { cluster = 1, cores = 4 }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_failing_n_runs_in_a_row_is_quarantined_and_its_session_fenced() {
    let env = Env::start_with_fleet(FLAKY_FLEET).await;
    let mut config = env.config("flaky");
    config.quarantine_after = 2;
    let handle = env.daemon(config).await;
    let slice = handle.slice_ids()[0].clone();
    assert_eq!(slice, "flaky-c0");
    let quarantine = Quarantine::open(&env.bus).await.expect("quarantine bucket");
    let mut watch = env.watch("jobQ", "tq").await;
    let mut grpc = client(&handle).await;

    let session = Session::on(&handle, &slice, "jobQ", "agentQ", "sessQ");
    let mut spawn = session.auto_approved();
    grpc.spawn_session(spawn.clone()).await.expect("spawn");
    let params = json!({
        "candidates": [{"N": 4096, "CHUNK": 256}, {"N": 4096, "CHUNK": 1024}, {"N": 4096, "CHUNK": 2048}],
        "repeats": 3
    });
    env.publish(&session.task("taskQ", 1, params)).await;

    let result = fenced_result(&mut watch.results).await;
    assert!(result.error.contains("quarantined"), "{}", result.error);

    // The session ends on the fence; the record names the count and the worker.
    fenced_session_end(&mut watch.events, "sessQ").await;
    let record = stored(quarantine.kv(), &slice).await;
    assert_eq!(record.consecutive_failures, 2, "{record:?}");
    assert_eq!(record.by, handle.worker_id());
    assert_eq!(record.worker_id, handle.worker_id());
    assert!(record.reason.contains("signal"), "{}", record.reason);

    // Refused while quarantined, even under another session id.
    spawn.session_id = "sessQ2".into();
    let refused = refused_spawn(
        &mut grpc,
        spawn.clone(),
        tonic::Code::FailedPrecondition,
        "a quarantined slice",
    )
    .await;
    assert!(
        refused.message().contains("quarantined"),
        "{}",
        refused.message()
    );
    // A selector never lands on it either.
    let mut by_selector = spawn_request("jobQ", "agentQ3", "sessQ3", "");
    by_selector.slice_selector = "cluster=0".into();
    refused_spawn(
        &mut grpc,
        by_selector,
        tonic::Code::FailedPrecondition,
        "no free matching slice",
    )
    .await;

    // Lifted: back in service.
    quarantine.lift(&slice).await.expect("lift");
    let spawned = grpc
        .spawn_session(spawn)
        .await
        .expect("spawn after the lift")
        .into_inner();
    assert_eq!(spawned.slice_id, slice);
    handle.shutdown().await.expect("shutdown");
}

/// A kernel root holding `wrongadd`: vecadd's harness and tune.toml with
/// device code that computes a - b, wrong on every candidate.
fn wrong_kernel_root(dir: &std::path::Path) -> std::path::PathBuf {
    let root = dir.join("kernels");
    let kernel = root.join("wrongadd");
    std::fs::create_dir_all(&kernel).expect("kernel dir");
    for file in ["host.c", "tune.toml"] {
        std::fs::copy(kernel_root().join("vecadd").join(file), kernel.join(file)).expect("copy");
    }
    std::fs::write(
        kernel.join("kernel.c"),
        "#include <stdint.h>\n#include <hthread_device.h>\n\
         __global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {\n\
         (void)e; int t = get_thread_id(), g = get_group_size();\n\
         for (uint64_t i = t; i < n; i += g) c[i] = a[i] - b[i];\n}\n",
    )
    .expect("kernel.c");
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_candidates_on_a_healthy_slice_are_the_candidates_fault_not_the_slices() {
    // The suite's default fleet: its slices are healthy.
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.quarantine_after = 2;
    config.kernel_root = wrong_kernel_root(env.dir.path());
    let handle = env.daemon(config).await;
    let slice = handle.slice_ids()[0].clone();
    let quarantine = Quarantine::open(&env.bus).await.expect("quarantine bucket");
    let mut watch = env.watch("jobH", "th").await;
    let mut grpc = client(&handle).await;
    let session = Session::on(&handle, &slice, "jobH", "agentH", "sessH");
    let mut spawn = session.auto_approved();
    spawn.kernel_dir = "wrongadd".into();
    grpc.spawn_session(spawn).await.expect("spawn");
    // Three candidates in a row, every one wrong, with quarantine_after = 2.
    let params = json!({
        "candidates": [{"N": 4096, "CHUNK": 256}, {"N": 4096, "CHUNK": 1024}, {"N": 4096, "CHUNK": 2048}],
        "repeats": 1
    });
    let mut task = session.task("taskH", 1, params);
    task.kernel_dir = "wrongadd".into();
    env.publish(&task).await;
    let result = next_result(&mut watch.results, "the task's result").await;
    // The task ran its candidates and ended on its own, never fenced off.
    assert!(!result.fenced, "{result:?}");
    assert!(
        result.result_json.contains("differs") || result.result_json.contains("tolerance"),
        "the candidates ran and were wrong: {result:?}"
    );
    assert!(
        quarantine.kv().get(&slice).await.expect("read").is_none(),
        "a healthy slice was quarantined for wrong candidates"
    );
    handle.shutdown().await.expect("shutdown");
}
