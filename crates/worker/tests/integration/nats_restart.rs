//! The NATS server restarts (same port, same file store) between two tasks
//! of a session: the session's task subscription, the slice lease, the
//! worker record and the quarantine watch come back by themselves, and the
//! next task still runs on the same session.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::time::Duration;

use common::*;
use mtswarm_bus::{Leases, Workers, v1};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_survives_a_server_restart() {
    let mut env = Env::start().await;
    let mut config = env.config("emu0");
    // Longer than a restart plus the client's reconnect backoff.
    config.lease_ttl = Duration::from_secs(10);
    config.worker_ttl = Duration::from_secs(10);
    let handle = env.daemon(config).await;
    let slice = handle.slice_ids()[0].clone();
    let session = Session::on(&handle, &slice, "jobN", "agentN", "sessN");
    spawn(&handle, session.auto_approved()).await;

    {
        let mut results = results(&env.bus, "jobN", "tn1").await;
        env.publish(&session.task("taskN1", 1, json!({"noop": true})))
            .await;
        let result = next_result(&mut results, "result 1").await;
        assert_eq!(result.task_id, "taskN1");
        assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    }
    // The result is out before the task's ack: restart only once the session
    // is idle again, or the lost ack makes the task come back first.
    let mut grpc = client(&handle).await;
    tokio::time::timeout(WAIT, async {
        loop {
            let status = grpc
                .status(v1::StatusRequest::default())
                .await
                .expect("status")
                .into_inner();
            if status
                .sessions
                .iter()
                .any(|s| s.session_id == "sessN" && s.state == v1::SessionState::Idle as i32)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the session goes idle after task 1");

    env.nats.restart().expect("nats-server restarts");
    env.bus
        .wait_connected(WAIT)
        .await
        .expect("test client reconnects");

    let mut results = results(&env.bus, "jobN", "tn2").await;
    let second = session.task(
        "taskN2",
        1,
        json!({"candidates": [{"N": 4096, "CHUNK": 256}], "repeats": 3}),
    );
    env.publish(&second).await;
    let result = loop {
        let delivery = next(&mut results, "result 2").await.expect("result");
        if delivery.message().task_id == "taskN2" {
            break delivery.message().clone();
        }
    };
    assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    assert_eq!(result.session_id, "sessN");
    assert!(!result.fenced);
    assert_eq!(handle.session_count(), 1, "the session is still running");

    // The lease still names the session and the worker is still registered.
    let leases = Leases::open(&env.bus).await.expect("leases");
    let lease = stored(leases.kv(), &slice).await;
    assert_eq!(lease.session_id, "sessN");
    assert_eq!(lease.worker_id, handle.worker_id());
    let workers = Workers::open(&env.bus).await.expect("workers");
    assert!(
        workers
            .list()
            .await
            .expect("list")
            .iter()
            .any(|w| w.value.worker_id == handle.worker_id()),
        "worker record present"
    );
    handle.shutdown().await.expect("shutdown");
}
