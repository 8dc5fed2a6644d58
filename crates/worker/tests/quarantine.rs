//! A slice whose emulator crashes every launch fails its hardware runs in a
//! row; at `quarantine_after` failures the worker quarantines the slice,
//! ends the session's task with a fenced result, refuses the slice in
//! SpawnSession, and takes it again once the record is lifted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

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
