//! Task payloads larger than the worker's limits end at once with a FAILED
//! result that names the limit; the session goes on with the next task.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

use common::*;
use mtswarm_bus::v1;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_task_payloads_fail_naming_the_limit() {
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.max_task_parameters_bytes = 1024;
    config.max_task_instructions_bytes = 512;
    let handle = env.daemon(config).await;
    let slice = handle.slice_ids()[0].clone();
    let mut results = results(&env.bus, "jobL", "tl").await;
    let mut spawn = spawn_request("jobL", "agentL", "sessL", &slice);
    spawn.auto_approve = true;
    client(&handle)
        .await
        .spawn_session(spawn)
        .await
        .expect("spawn");

    let big = json!({"candidates": [{"N": 4096}], "note": "x".repeat(2000)});
    let oversize_parameters = task(
        Place {
            job: "jobL",
            agent: "agentL",
            session: "sessL",
            worker: handle.worker_id(),
            slice: &slice,
        },
        "taskL1",
        1,
        big,
    );
    env.bus
        .publish_task(&oversize_parameters)
        .await
        .expect("publish");
    let result = next(&mut results, "result 1")
        .await
        .expect("result")
        .message()
        .clone();
    assert_eq!(result.task_id, "taskL1");
    assert_eq!(result.status, v1::TaskStatus::Failed as i32, "{result:?}");
    assert!(
        result.error.contains("max_task_parameters_bytes"),
        "{}",
        result.error
    );
    assert!(!result.fenced);

    let mut oversize_instructions = task(
        Place {
            job: "jobL",
            agent: "agentL",
            session: "sessL",
            worker: handle.worker_id(),
            slice: &slice,
        },
        "taskL2",
        1,
        json!({"noop": true}),
    );
    oversize_instructions.instructions = "y".repeat(600);
    env.bus
        .publish_task(&oversize_instructions)
        .await
        .expect("publish");
    let result = next(&mut results, "result 2")
        .await
        .expect("result")
        .message()
        .clone();
    assert_eq!(result.task_id, "taskL2");
    assert_eq!(result.status, v1::TaskStatus::Failed as i32, "{result:?}");
    assert!(
        result.error.contains("max_task_instructions_bytes"),
        "{}",
        result.error
    );
    handle.shutdown().await.expect("shutdown");
}
