//! The daemon's control surface over real gRPC: health, reflection,
//! SpawnSession idempotency and refusals with the right codes, Status,
//! CancelSession, Drain, a no-op task, and the slice leases in KV from start
//! to shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::time::Duration;

use common::*;
use futures::StreamExt as _;
use mtswarm_bus::{Checkpoints, Leases, Workers, v1};
use mtswarm_worker::WorkerHandle;
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use v1::worker_client::WorkerClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_is_idempotent_refusals_have_the_right_codes_and_leases_follow_the_daemon() {
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.max_sessions = 2;
    // Nothing here waits for a lease to lapse; a longer TTL keeps a renewal
    // delayed by a loaded machine from fencing s1 before the test cancels it.
    config.lease_ttl = Duration::from_secs(15);
    config.worker_ttl = Duration::from_secs(15);
    let handle = env.daemon(config).await;
    let slices = handle.slice_ids();
    assert_eq!(slices, ["emu0-c0", "emu0-c1"]);
    let mut grpc = client(&handle).await;
    // Subscribed before any session starts, so no session event of the
    // job can be missed, however late in the test it comes.
    let mut events = env.bus.subscribe_events("jobD").await.expect("events");
    env.bus.flush().await.expect("flush");
    let leases = Leases::open(&env.bus).await.expect("leases");
    let workers = Workers::open(&env.bus).await.expect("workers");

    assert_serving_and_registered(&handle, &workers, &leases, &slices).await;
    spawn_twice_gets_one_session(&mut grpc, &leases).await;
    refusals_have_the_right_codes(&mut grpc).await;
    spawn_by_selector_then_the_limit(&mut grpc).await;
    stray_and_no_op_tasks(&env, &handle).await;
    no_op_tasks_store_no_checkpoint_and_one_event_message(&env.bus, "jobD", "s2", "noop1").await;
    status_lists_both_sessions(&mut grpc, &handle).await;
    cancel_ends_the_session(&mut grpc, &mut events).await;
    drain_refuses_new_sessions(&mut grpc).await;
    shutdown_releases_leases_and_registration(handle, &leases, &workers, &slices).await;
}

/// Health says SERVING for the Worker service once started; the worker
/// record names its endpoint and both slices, each with an idle lease of
/// the worker.
async fn assert_serving_and_registered(
    handle: &WorkerHandle,
    workers: &Workers,
    leases: &Leases,
    slices: &[String],
) {
    let health = HealthClient::new(channel(handle).await)
        .check(HealthCheckRequest {
            service: "mtswarm.v1.Worker".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);
    let record = stored(workers.kv(), handle.worker_id()).await;
    assert_eq!(record.endpoint, handle.endpoint());
    assert_eq!(record.slices.len(), 2);
    for slice in slices {
        let lease = stored(leases.kv(), slice).await;
        assert_eq!(lease.worker_id, handle.worker_id());
        assert!(lease.session_id.is_empty());
    }
}

/// Spawn s1, then the same request again: same answer, and the slice's
/// lease names the session.
async fn spawn_twice_gets_one_session(grpc: &mut WorkerClient<Channel>, leases: &Leases) {
    let first = grpc
        .spawn_session(spawn_request("jobD", "a1", "s1", "emu0/c0"))
        .await
        .expect("spawn s1")
        .into_inner();
    assert_eq!(first.slice_id, "emu0-c0");
    let again = grpc
        .spawn_session(spawn_request("jobD", "a1", "s1", "emu0/c0"))
        .await
        .expect("spawn s1 again")
        .into_inner();
    assert_eq!(again, first);
    let lease = stored(leases.kv(), "emu0-c0").await;
    assert_eq!(lease.session_id, "s1");
    assert_eq!(lease.job_id, "jobD");
    assert_eq!(lease.epoch, first.lease_epoch);
}

/// A busy slice, an unknown slice, a bad id and a bad kernel directory.
async fn refusals_have_the_right_codes(grpc: &mut WorkerClient<Channel>) {
    let bad_kernel = v1::SpawnSessionRequest {
        kernel_dir: "../secrets".into(),
        ..spawn_request("jobD", "a2", "s2", "")
    };
    for (request, code, what) in [
        (
            spawn_request("jobD", "a2", "s2", "emu0-c0"),
            Code::FailedPrecondition,
            "busy slice",
        ),
        (
            spawn_request("jobD", "a2", "s2", "emu9-c0"),
            Code::NotFound,
            "unknown slice",
        ),
        (
            spawn_request("jobD", "a2", "s.2", ""),
            Code::InvalidArgument,
            "bad id",
        ),
        (bad_kernel, Code::InvalidArgument, "bad kernel dir"),
    ] {
        refused_spawn(grpc, request, code, what).await;
    }
}

/// Any free slice by selector (s2 gets the other one), then the session
/// limit.
async fn spawn_by_selector_then_the_limit(grpc: &mut WorkerClient<Channel>) {
    let mut by_selector = spawn_request("jobD", "a2", "s2", "");
    by_selector.slice_selector = "backend=emulator".into();
    let second = grpc
        .spawn_session(by_selector)
        .await
        .expect("spawn s2")
        .into_inner();
    assert_eq!(second.slice_id, "emu0-c1");
    refused_spawn(
        grpc,
        spawn_request("jobD", "a3", "s3", ""),
        Code::ResourceExhausted,
        "max sessions",
    )
    .await;
}

/// A task for another session on s2's slice is terminated without a
/// result; the no-op task behind it answers without tools. A later task of
/// the session with a lower attempt number than the previous one is not
/// mistaken for a stale attempt.
async fn stray_and_no_op_tasks(env: &Env, handle: &WorkerHandle) {
    let mut results = results(&env.bus, "jobD", "td").await;
    let s2 = Session::on(handle, "emu0-c1", "jobD", "a2", "s2");
    let stray = Session {
        id: "someone-else".into(),
        ..s2.clone()
    };
    env.publish(&stray.task("stray1", 1, json!({"noop": true})))
        .await;
    env.publish(&s2.task("noop1", 1, json!({"noop": true})))
        .await;
    let result = next_result(&mut results, "the no-op result").await;
    assert_eq!(result.task_id, "noop1", "the stray task got a result");
    assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    let body: serde_json::Value = serde_json::from_str(&result.result_json).expect("json");
    assert_eq!(body["answer_json"]["noop"], true, "{body}");
    assert_eq!(result.usage.expect("usage").device_seconds, 0.0);
    for (task_id, attempt) in [("noop2", 3), ("noop3", 1)] {
        env.publish(&s2.task(task_id, attempt, json!({"noop": true})))
            .await;
        let result = next_result(&mut results, task_id).await;
        assert_eq!(
            (result.task_id.as_str(), result.attempt),
            (task_id, attempt)
        );
        assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    }
}

/// Status lists both sessions with their slices, every slice leased.
async fn status_lists_both_sessions(grpc: &mut WorkerClient<Channel>, handle: &WorkerHandle) {
    let status = grpc
        .status(v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.worker_id, handle.worker_id());
    let mut listed: Vec<(String, String)> = status
        .sessions
        .iter()
        .map(|s| (s.session_id.clone(), s.slice_id.clone()))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("s1".to_owned(), "emu0-c0".to_owned()),
            ("s2".to_owned(), "emu0-c1".to_owned())
        ]
    );
    assert!(status.slices.iter().all(|s| s.lease.is_some()));
}

/// Cancel s1: it ends (its SessionFinished event comes); cancelling an
/// unknown session cancels nothing.
async fn cancel_ends_the_session(
    grpc: &mut WorkerClient<Channel>,
    events: &mut mtswarm_bus::ReceivedStream<v1::AgentEvent>,
) {
    let cancelled = grpc
        .cancel_session(v1::CancelSessionRequest {
            session_id: "s1".into(),
            reason: "test".into(),
        })
        .await
        .expect("cancel")
        .into_inner();
    assert!(cancelled.cancelled);
    let mut seen = Vec::new();
    events_until(events, &mut seen, |e| {
        e.session_id == "s1" && is_kind(e, v1::AgentEventKind::SessionFinished)
    })
    .await;
    let unknown_cancel = grpc
        .cancel_session(v1::CancelSessionRequest {
            session_id: "nope".into(),
            reason: String::new(),
        })
        .await
        .expect("cancel unknown")
        .into_inner();
    assert!(!unknown_cancel.cancelled);
}

/// Drain: no new sessions, and Status says the daemon drains.
async fn drain_refuses_new_sessions(grpc: &mut WorkerClient<Channel>) {
    grpc.drain(v1::DrainRequest {
        grace_seconds: 30,
        reason: "maintenance".into(),
    })
    .await
    .expect("drain");
    refused_spawn(
        grpc,
        spawn_request("jobD", "a4", "s4", ""),
        Code::FailedPrecondition,
        "draining",
    )
    .await;
    let status = grpc
        .status(v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert!(status.draining);
}

/// Shutdown releases the slices' leases and the worker record.
async fn shutdown_releases_leases_and_registration(
    handle: WorkerHandle,
    leases: &Leases,
    workers: &Workers,
    slices: &[String],
) {
    let worker_id = handle.worker_id().to_owned();
    tokio::time::timeout(Duration::from_secs(60), handle.shutdown())
        .await
        .expect("shutdown in time")
        .expect("shutdown");
    for slice in slices {
        assert!(
            leases.get(slice).await.expect("get").is_none(),
            "{slice} still leased"
        );
    }
    assert!(workers.kv().get(&worker_id).await.expect("get").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_for_the_board_and_quarantined_slices_are_refused_and_reflection_works() {
    let env = Env::start().await;
    let handle = env.daemon(env.config("emu0")).await;
    let mut other = env.config("emu0");
    other.worker_id = Some("worker-intruder".into());
    let error = match mtswarm_worker::WorkerDaemon::start(other).await {
        Ok(_) => panic!("a second daemon took the same board"),
        Err(error) => error,
    };
    assert!(
        matches!(error, mtswarm_worker::WorkerError::SliceTaken { ref holder, .. } if holder == handle.worker_id()),
        "{error}"
    );

    // A quarantined slice is refused, and Status says why it is out.
    let quarantine = mtswarm_bus::Quarantine::open(&env.bus)
        .await
        .expect("quarantine");
    quarantine
        .put(&v1::SliceQuarantine {
            slice_id: "emu0-c0".into(),
            worker_id: handle.worker_id().into(),
            reason: "runs keep hanging".into(),
            ..Default::default()
        })
        .await
        .expect("quarantine put");
    let mut grpc = client(&handle).await;
    let refused = refused_spawn(
        &mut grpc,
        spawn_request("jobQ", "q1", "sq1", "emu0-c0"),
        Code::FailedPrecondition,
        "quarantined",
    )
    .await;
    assert!(refused.message().contains("runs keep hanging"), "{refused}");
    let status = grpc
        .status(v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let quarantined: Vec<bool> = status.slices.iter().map(|s| s.quarantined).collect();
    assert_eq!(quarantined, [true, false]);
    // Without a named slice the free, healthy one is chosen.
    let spawned = grpc
        .spawn_session(spawn_request("jobQ", "q1", "sq1", ""))
        .await
        .expect("spawn elsewhere")
        .into_inner();
    assert_eq!(spawned.slice_id, "emu0-c1");

    // Reflection knows the Worker service.
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel(&handle).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = next(&mut responses, "the reflection answer")
        .await
        .expect("response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer");
    };
    assert!(
        list.service.iter().any(|s| s.name == "mtswarm.v1.Worker"),
        "{list:?}"
    );
    handle.shutdown().await.expect("shutdown");
}

#[test]
fn config_validation_names_the_problem() {
    let dir = tempfile::tempdir().expect("dir");
    let mut config = mtswarm_worker::WorkerConfig::new(dir.path().join("missing.toml"), "b0");
    config.kernel_root = kernel_root();
    let error = config
        .validate()
        .expect_err("missing fleet file")
        .to_string();
    assert!(error.contains("fleet_file"), "{error}");
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(&fleet, "").expect("write");
    config.fleet_file = fleet;
    config.worker_id = Some("bad id".into());
    let error = config.validate().expect_err("bad worker id").to_string();
    assert!(error.contains("worker_id"), "{error}");
    config.worker_id = None;
    config.lease_ttl = Duration::from_millis(10);
    let error = config.validate().expect_err("short ttl").to_string();
    assert!(error.contains("lease_ttl"), "{error}");
    config.lease_ttl = Duration::from_secs(5);
    config.validate().expect("valid");
}

/// A first attempt of a no-op task changes nothing a resume needs: the
/// session stored no checkpoint for it, and its events, `task_started` to `task_finished`
/// with the engine's in between, are one stored message of the events
/// stream.
async fn no_op_tasks_store_no_checkpoint_and_one_event_message(
    bus: &mtswarm_bus::Bus,
    job: &str,
    session: &str,
    task_id: &str,
) {
    // noop1 and noop3 (first attempts) stored nothing; noop2, attempt 3,
    // stored its final state (a later attempt always does, so a stale one
    // is fenced off), and noop3 left it in place. (The head's revision is
    // the bucket's sequence, which the head's history records share, so
    // it says nothing about how often the head was written.)
    let checkpoints = Checkpoints::open(bus).await.expect("checkpoints");
    let stored = checkpoints
        .get(session)
        .await
        .expect("checkpoint lookup")
        .map(|stored| (stored.value.task_id, stored.value.attempt));
    assert_eq!(stored, Some(("noop2".to_owned(), 3)), "stored checkpoint");
    let mut replay = bus.replay_events(job, 0).await.expect("replay");
    let mut seen = Vec::new();
    loop {
        let replayed = tokio::time::timeout(Duration::from_secs(10), replay.next())
            .await
            .expect("the task's events are replayed")
            .expect("replay continues")
            .expect("replayed event");
        let body = payload(&replayed.event);
        if body["task_id"] != task_id {
            continue;
        }
        seen.push((replayed.stream_sequence, body["type"].clone()));
        if body["type"] == "task_finished" {
            break;
        }
    }
    assert!(
        seen.len() >= 3,
        "task_started, engine events, task_finished: {seen:?}"
    );
    assert_eq!(seen[0].1, "task_started", "{seen:?}");
    assert!(
        seen.iter().all(|(sequence, _)| *sequence == seen[0].0),
        "one stored message: {seen:?}"
    );
}
