//! A session paused for approval on one worker whose daemon then dies is
//! spawned again (same session id) on another worker; the task redelivered
//! there with `resume_from_checkpoint` continues from the checkpoint's step
//! instead of starting over, and the session's event numbering continues.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_bus::{Approvals, Checkpoints, v1};
use serde_json::json;

/// A session moved between two daemons: its ids and the parameters of its task.
struct Moving<'a> {
    job: &'a str,
    agent: &'a str,
    session: &'a str,
    task: &'a str,
    params: serde_json::Value,
}

/// The session spawned on `emu0` with attempt 1 of its task paused for the
/// approval of its first validation; returns the first daemon, the request
/// and the step of the checkpoint stored at the pause.
async fn paused_on_first_worker(
    env: &Env,
    config: mtswarm_worker::WorkerConfig,
    moving: &Moving<'_>,
    requests: &mut mtswarm_bus::ReceivedStream<v1::ApprovalRequest>,
) -> (mtswarm_worker::WorkerHandle, v1::ApprovalRequest, u32) {
    let first = env.daemon(config).await;
    let slice = first.slice_ids()[0].clone();
    let session = Session::on(&first, &slice, moving.job, moving.agent, moving.session);
    spawn(&first, session.spawn_request()).await;
    env.publish(&session.task(moving.task, 1, moving.params.clone()))
        .await;
    let request = next_message(requests, "the approval request").await;
    assert_eq!(request.tool_name, "validate");
    let checkpoints = Checkpoints::open(&env.bus).await.expect("checkpoints");
    let paused = stored(checkpoints.kv(), moving.session).await;
    assert_eq!(paused.attempt, 1);
    (first, request, paused.step)
}

/// Spawn the session again on `emu1` with `resume` (and `auto_approve` when
/// asked) and publish attempt 2 with `resume_from_checkpoint`; returns the
/// second daemon and the step it reported resuming from.
async fn moved_to_second_worker(
    env: &Env,
    config: mtswarm_worker::WorkerConfig,
    moving: &Moving<'_>,
    auto_approve: bool,
) -> (mtswarm_worker::WorkerHandle, u32) {
    let second = env.daemon(config).await;
    let slice = second.slice_ids()[0].clone();
    let session = Session::on(&second, &slice, moving.job, moving.agent, moving.session);
    let request = v1::SpawnSessionRequest {
        resume: true,
        auto_approve,
        ..session.spawn_request()
    };
    let spawned = spawn(&second, request).await;
    let mut attempt2 = session.task(moving.task, 2, moving.params.clone());
    attempt2.resume_from_checkpoint = true;
    env.publish(&attempt2).await;
    (second, spawned.resumed_from_step)
}

fn seconds(ts: Option<prost_types::Timestamp>) -> f64 {
    let ts = ts.expect("timestamp");
    ts.seconds as f64 + f64::from(ts.nanos) * 1e-9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reassigned_task_resumes_from_the_sessions_checkpoint() {
    let env = Env::start().await;
    let approvals = Approvals::open(&env.bus).await.expect("approvals");
    let mut watch = env.watch("jobR", "tr").await;
    let moving = Moving {
        job: "jobR",
        agent: "agentR",
        session: "sessR",
        task: "taskR",
        params: json!({
            "candidates": [{"N": 16384, "CHUNK": 256}, {"N": 16384, "CHUNK": 1024}],
            "repeats": 3
        }),
    };

    // The run pauses at c0's validate (step 2) with its checkpoint stored.
    let (first, request, paused_step) =
        paused_on_first_worker(&env, env.config("emu0"), &moving, &mut watch.requests).await;
    let mut before = Vec::new();
    events_until(&mut watch.events, &mut before, |e| {
        is_kind(e, v1::AgentEventKind::ApprovalRequested)
    })
    .await;
    assert!(paused_step >= 2, "paused at step {paused_step}");

    // The first worker dies; a reviewer approves meanwhile (in the bucket).
    first.kill().await;
    approvals.decide(&approve(&request)).await.expect("decide");

    // The session moves to a slice of another worker and resumes there.
    let (second, resumed_from_step) =
        moved_to_second_worker(&env, env.config("emu1"), &moving, true).await;
    assert_eq!(resumed_from_step, paused_step);

    let result = next_result(&mut watch.results, "the result of attempt 2").await;
    assert_eq!(result.attempt, 2);
    assert_eq!(result.worker_id, second.worker_id());
    assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    let body: serde_json::Value = serde_json::from_str(&result.result_json).expect("json");
    assert!(
        body["best"]["median_seconds"]
            .as_f64()
            .is_some_and(|m| m > 0.0),
        "{body}"
    );

    let mut after = Vec::new();
    events_until(&mut watch.events, &mut after, |e| task_finished(e, 2)).await;
    // Numbering continues across the two workers.
    let mut all = before.clone();
    all.extend(after.iter().cloned());
    let first_seq = all[0].sequence;
    assert_gapless(&all, first_seq);
    let started = task_started(&after, 2);
    assert_eq!(started["resumed_from_step"], paused_step);
    let first_engine_event = after
        .iter()
        .find(|e| payload(e)["attempt"] == 2 && payload(e).get("engine_seq").is_some())
        .expect("an engine event of attempt 2");
    assert!(
        first_engine_event.step >= paused_step && first_engine_event.step > 1,
        "attempt 2 started at step {}",
        first_engine_event.step
    );
    // The plan goes on where it paused: c0's approved validate runs first
    // (its build is on the dead worker, so the policy rebuilds it once), and
    // c0's original compile is not replayed.
    let compiles: Vec<String> = payloads_of(&after, v1::AgentEventKind::ToolCall)
        .filter(|p| p["name"] == "compile")
        .map(|p| p["call_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(compiles, ["c0-compile-r1", "c1-compile"]);
    second.shutdown().await.expect("shutdown");
}

/// A fresh environment, its approvals bucket, a watch on `job` and the
/// one-candidate session `session` of `job` the tests below move.
async fn moving_one_candidate(
    job: &'static str,
    session: &'static str,
    consumer: &str,
) -> (Env, Approvals, JobWatch, Moving<'static>) {
    let env = Env::start().await;
    let approvals = Approvals::open(&env.bus).await.expect("approvals");
    let watch = env.watch(job, consumer).await;
    let moving = Moving {
        job,
        agent: "agentM",
        session,
        task: "taskM",
        params: json!({"candidates": [{"N": 4096, "CHUNK": 256}], "repeats": 3}),
    };
    (env, approvals, watch, moving)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moved_to_another_daemon_resumes_from_the_checkpoint() {
    let (env, approvals, mut watch, moving) = moving_one_candidate("jobM", "sessM", "tm").await;

    let (first, request, paused_step) =
        paused_on_first_worker(&env, env.config("emu0"), &moving, &mut watch.requests).await;
    assert!(paused_step > 0);
    // A graceful shutdown leaves no result and keeps the checkpoint.
    first
        .shutdown()
        .await
        .expect("shutdown of the first worker");

    let (second, resumed_from_step) =
        moved_to_second_worker(&env, env.config("emu1"), &moving, false).await;
    assert_eq!(resumed_from_step, paused_step);

    // The resumed session finds the PENDING record (same approval id) and
    // announces it again; a decision made now reaches the new session.
    let again = next_message(&mut watch.requests, "the re-announced request").await;
    assert_eq!(again.approval_id, request.approval_id);
    assert_eq!(
        again.requested_at, request.requested_at,
        "the original request"
    );
    let pending = approvals
        .list(Some("jobM"), &[v1::ApprovalState::Pending])
        .await
        .expect("list");
    assert_eq!(pending.len(), 1, "one record for the call: {pending:?}");
    let decision = approve(&request);
    approvals.decide(&decision).await.expect("decide");
    env.bus
        .publish_approval_decision(&decision)
        .await
        .expect("publish decision");
    // The benchmark asks next; approve it too.
    let benchmark = next_message(&mut watch.requests, "the benchmark approval").await;
    assert_eq!(benchmark.tool_name, "benchmark");
    assert_ne!(benchmark.approval_id, request.approval_id);
    approvals
        .decide(&approve(&benchmark))
        .await
        .expect("decide");

    let result = next_result(&mut watch.results, "the result").await;
    assert_eq!(result.attempt, 2, "no result of attempt 1: {result:?}");
    assert_eq!(result.worker_id, second.worker_id());
    assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    let mut seen = Vec::new();
    events_until(&mut watch.events, &mut seen, |e| task_finished(e, 2)).await;
    let started = task_started(&seen, 2);
    assert!(
        started["resumed_from_step"].as_u64().is_some_and(|s| s > 0),
        "{started}"
    );
    assert_eq!(started["resumed_from_step"], paused_step);
    second.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_approval_times_out_from_its_original_request_to_deny() {
    let (env, approvals, mut watch, moving) = moving_one_candidate("jobT", "sessT", "tt").await;
    let timeout = std::time::Duration::from_secs(6);
    let mut config_a = env.config("emu0");
    config_a.approval_timeout = timeout;
    let mut config_b = env.config("emu1");
    config_b.approval_timeout = timeout;

    let (first, request, _) =
        paused_on_first_worker(&env, config_a, &moving, &mut watch.requests).await;
    first.kill().await;
    // Let part of the timeout pass while no worker runs the session, so a
    // clock restarted by the move would be told apart.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (second, _) = moved_to_second_worker(&env, config_b, &moving, false).await;
    let moved_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();

    let result = next_result(&mut watch.results, "the result").await;
    assert_eq!(result.attempt, 2, "{result:?}");
    let record = stored(approvals.kv(), &request.approval_id).await;
    assert_eq!(record.state(), v1::ApprovalState::Denied, "{record:?}");
    let decision = record.decision.expect("decision");
    assert!(decision.timed_out, "{decision:?}");
    assert_eq!(decision.verdict(), v1::ApprovalVerdict::Deny);
    let waited = seconds(decision.decided_at) - seconds(request.requested_at);
    assert!(
        waited >= timeout.as_secs_f64() - 0.5,
        "decided {waited:.2} s after the original request"
    );
    // A clock restarted by the move would decide a full timeout after it.
    assert!(
        seconds(decision.decided_at) - moved_at < timeout.as_secs_f64() - 0.5,
        "the timeout restarted at the move"
    );
    let mut seen = Vec::new();
    events_until(&mut watch.events, &mut seen, |e| task_finished(e, 2)).await;
    let decided = payloads_of(&seen, v1::AgentEventKind::ApprovalDecided)
        .find(|p| p["approval_id"] == request.approval_id.as_str())
        .expect("approval_decided event");
    assert_eq!(decided["timed_out"], true);
    assert_eq!(decided["verdict"], "APPROVAL_VERDICT_DENY");
    second.shutdown().await.expect("shutdown");
}

/// A checkpoint record that does not decode (written by a buggy or hostile
/// client) does not make the session unmovable: spawning it with `resume`
/// starts it afresh instead of refusing every attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_checkpoint_does_not_block_a_resumed_spawn() {
    let env = Env::start().await;
    let daemon = env.daemon(env.config("emu0")).await;
    let slice = daemon.slice_ids()[0].clone();
    env.bus
        .jetstream()
        .get_key_value(mtswarm_bus::subjects::CHECKPOINTS_BUCKET)
        .await
        .expect("checkpoints bucket")
        .put("sessJ", b"\x0f\xff\xff\xff".as_slice().into())
        .await
        .expect("junk checkpoint");
    let request = v1::SpawnSessionRequest {
        resume: true,
        ..spawn_request("jobJ", "agentJ", "sessJ", &slice)
    };
    // The session spawns despite the junk checkpoint.
    let spawned = spawn(&daemon, request).await;
    assert_eq!(spawned.resumed_from_step, 0);
}
