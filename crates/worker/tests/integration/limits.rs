//! Task payloads larger than the worker's limits end at once with a FAILED
//! result that names the limit; the session goes on with the next task.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_bus::v1;
use serde_json::json;

/// Publish `task` and check that its result is FAILED naming `limit`.
async fn fails_naming(
    env: &Env,
    results: &mut mtswarm_bus::DeliveryStream<v1::TaskResult>,
    task: &v1::TaskAssignment,
    limit: &str,
) -> v1::TaskResult {
    env.publish(task).await;
    let result = next_result(results, &task.task_id).await;
    assert_eq!(result.task_id, task.task_id);
    assert_eq!(result.status, v1::TaskStatus::Failed as i32, "{result:?}");
    assert!(result.error.contains(limit), "{}", result.error);
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_task_payloads_fail_naming_the_limit() {
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.max_task_parameters_bytes = 1024;
    config.max_task_instructions_bytes = 512;
    let handle = env.daemon(config).await;
    let slice = handle.slice_ids()[0].clone();
    let mut results = results(&env.bus, "jobL", "tl").await;
    let session = Session::on(&handle, &slice, "jobL", "agentL", "sessL");
    spawn(&handle, session.auto_approved()).await;

    let big = json!({"candidates": [{"N": 4096}], "note": "x".repeat(2000)});
    let oversize_parameters = session.task("taskL1", 1, big);
    let result = fails_naming(
        &env,
        &mut results,
        &oversize_parameters,
        "max_task_parameters_bytes",
    )
    .await;
    assert!(!result.fenced);

    let mut oversize_instructions = session.task("taskL2", 1, json!({"noop": true}));
    oversize_instructions.instructions = "y".repeat(600);
    fails_naming(
        &env,
        &mut results,
        &oversize_instructions,
        "max_task_instructions_bytes",
    )
    .await;
    handle.shutdown().await.expect("shutdown");
}
