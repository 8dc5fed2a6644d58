//! A session paused for approval on one worker whose daemon then dies is
//! spawned again (same session id) on another worker; the task redelivered
//! there with `resume_from_checkpoint` continues from the checkpoint's step
//! instead of starting over, and the session's event numbering continues.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

use common::*;
use mtswarm_bus::{Approvals, Checkpoints, v1};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reassigned_task_resumes_from_the_sessions_checkpoint() {
    let env = Env::start().await;
    let first = env.daemon(env.config("emu0")).await;
    let slice_a = first.slice_ids()[0].clone();
    let approvals = Approvals::open(&env.bus).await.expect("approvals");
    let checkpoints = Checkpoints::open(&env.bus).await.expect("checkpoints");
    let mut requests = env
        .bus
        .subscribe_approval_requests(Some("jobR"))
        .await
        .expect("requests");
    let mut events = env.bus.subscribe_events("jobR").await.expect("events");
    // Make sure the subscriptions reached the server before anything is published.
    env.bus.flush().await.expect("flush");
    let mut results = results(&env.bus, "jobR", "tr").await;

    client(&first)
        .await
        .spawn_session(spawn_request("jobR", "agentR", "sessR", &slice_a))
        .await
        .expect("spawn on the first worker");
    let params = json!({
        "candidates": [{"N": 16384, "CHUNK": 256}, {"N": 16384, "CHUNK": 1024}],
        "repeats": 3
    });
    let attempt1 = task(
        Place {
            job: "jobR",
            agent: "agentR",
            session: "sessR",
            worker: first.worker_id(),
            slice: &slice_a,
        },
        "taskR",
        1,
        params.clone(),
    );
    env.bus
        .publish_task(&attempt1)
        .await
        .expect("publish attempt 1");

    // The run pauses at c0's validate (step 2) with its checkpoint stored.
    let request = next(&mut requests, "the approval request")
        .await
        .expect("request")
        .message;
    assert_eq!(request.tool_name, "validate");
    let mut before = Vec::new();
    events_until(&mut events, &mut before, |e| {
        is_kind(e, v1::AgentEventKind::ApprovalRequested)
    })
    .await;
    let paused = checkpoints
        .get("sessR")
        .await
        .expect("get")
        .expect("checkpoint");
    assert_eq!(paused.value.attempt, 1);
    assert!(
        paused.value.step >= 2,
        "paused at step {}",
        paused.value.step
    );
    let paused_step = paused.value.step;

    // The first worker dies; a reviewer approves meanwhile (in the bucket).
    first.kill().await;
    approvals
        .decide(&v1::ApprovalDecision {
            approval_id: request.approval_id.clone(),
            job_id: "jobR".into(),
            session_id: "sessR".into(),
            call_id: request.call_id.clone(),
            verdict: v1::ApprovalVerdict::Approve as i32,
            decided_by: "reviewer".into(),
            ..Default::default()
        })
        .await
        .expect("decide");

    // The session moves to a slice of another worker and resumes there.
    let second = env.daemon(env.config("emu1")).await;
    let slice_b = second.slice_ids()[0].clone();
    let mut spawn = spawn_request("jobR", "agentR", "sessR", &slice_b);
    spawn.resume = true;
    spawn.auto_approve = true;
    let spawned = client(&second)
        .await
        .spawn_session(spawn)
        .await
        .expect("spawn on the second worker")
        .into_inner();
    assert_eq!(spawned.resumed_from_step, paused_step);
    let mut attempt2 = task(
        Place {
            job: "jobR",
            agent: "agentR",
            session: "sessR",
            worker: second.worker_id(),
            slice: &slice_b,
        },
        "taskR",
        2,
        params,
    );
    attempt2.resume_from_checkpoint = true;
    env.bus
        .publish_task(&attempt2)
        .await
        .expect("publish attempt 2");

    let result = next(&mut results, "the result of attempt 2")
        .await
        .expect("result")
        .message()
        .clone();
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
    events_until(&mut events, &mut after, |e| task_finished(e, 2)).await;
    // Numbering continues across the two workers.
    let mut all = before.clone();
    all.extend(after.iter().cloned());
    let first_seq = all[0].sequence;
    assert_gapless(&all, first_seq);
    let started = after
        .iter()
        .map(payload)
        .find(|p| p["type"] == "task_started" && p["attempt"] == 2)
        .expect("task_started of attempt 2");
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
    let compiles: Vec<String> = after
        .iter()
        .filter(|e| is_kind(e, v1::AgentEventKind::ToolCall))
        .map(payload)
        .filter(|p| p["name"] == "compile")
        .map(|p| p["call_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(compiles, ["c0-compile-r1", "c1-compile"]);
    second.shutdown().await.expect("shutdown");
}

fn approve(request: &v1::ApprovalRequest) -> v1::ApprovalDecision {
    v1::ApprovalDecision {
        approval_id: request.approval_id.clone(),
        job_id: request.job_id.clone(),
        session_id: request.session_id.clone(),
        call_id: request.call_id.clone(),
        verdict: v1::ApprovalVerdict::Approve as i32,
        decided_by: "reviewer".into(),
        ..Default::default()
    }
}

fn seconds(ts: Option<prost_types::Timestamp>) -> f64 {
    let ts = ts.expect("timestamp");
    ts.seconds as f64 + f64::from(ts.nanos) * 1e-9
}

/// A session of `job` on `emu0` paused for the approval of its first
/// validation; returns the first daemon and the request.
async fn paused_on_first_worker(
    env: &Env,
    config: mtswarm_worker::WorkerConfig,
    job: &str,
    session: &str,
    requests: &mut mtswarm_bus::ReceivedStream<v1::ApprovalRequest>,
) -> (mtswarm_worker::WorkerHandle, v1::ApprovalRequest, u32) {
    let first = env.daemon(config).await;
    let slice = first.slice_ids()[0].clone();
    client(&first)
        .await
        .spawn_session(spawn_request(job, "agentM", session, &slice))
        .await
        .expect("spawn on the first worker");
    env.bus
        .publish_task(&task(
            Place {
                job,
                agent: "agentM",
                session,
                worker: first.worker_id(),
                slice: &slice,
            },
            "taskM",
            1,
            json!({"candidates": [{"N": 4096, "CHUNK": 256}], "repeats": 3}),
        ))
        .await
        .expect("publish attempt 1");
    let request = next(requests, "the approval request")
        .await
        .expect("request")
        .message;
    assert_eq!(request.tool_name, "validate");
    let checkpoints = Checkpoints::open(&env.bus).await.expect("checkpoints");
    let step = checkpoints
        .get(session)
        .await
        .expect("get")
        .expect("checkpoint")
        .value
        .step;
    (first, request, step)
}

/// Spawn the session again on `emu1` with `resume` and publish attempt 2.
async fn moved_to_second_worker(
    env: &Env,
    config: mtswarm_worker::WorkerConfig,
    job: &str,
    session: &str,
) -> (mtswarm_worker::WorkerHandle, u32) {
    let second = env.daemon(config).await;
    let slice = second.slice_ids()[0].clone();
    let mut spawn = spawn_request(job, "agentM", session, &slice);
    spawn.resume = true;
    let spawned = client(&second)
        .await
        .spawn_session(spawn)
        .await
        .expect("spawn on the second worker")
        .into_inner();
    let mut attempt2 = task(
        Place {
            job,
            agent: "agentM",
            session,
            worker: second.worker_id(),
            slice: &slice,
        },
        "taskM",
        2,
        json!({"candidates": [{"N": 4096, "CHUNK": 256}], "repeats": 3}),
    );
    attempt2.resume_from_checkpoint = true;
    env.bus
        .publish_task(&attempt2)
        .await
        .expect("publish attempt 2");
    (second, spawned.resumed_from_step)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moved_to_another_daemon_resumes_from_the_checkpoint() {
    let env = Env::start().await;
    let approvals = Approvals::open(&env.bus).await.expect("approvals");
    let mut requests = env
        .bus
        .subscribe_approval_requests(Some("jobM"))
        .await
        .expect("requests");
    let mut events = env.bus.subscribe_events("jobM").await.expect("events");
    env.bus.flush().await.expect("flush");
    let mut results = results(&env.bus, "jobM", "tm").await;

    let (first, request, paused_step) =
        paused_on_first_worker(&env, env.config("emu0"), "jobM", "sessM", &mut requests).await;
    assert!(paused_step > 0);
    // A graceful shutdown leaves no result and keeps the checkpoint.
    first
        .shutdown()
        .await
        .expect("shutdown of the first worker");

    let (second, resumed_from_step) =
        moved_to_second_worker(&env, env.config("emu1"), "jobM", "sessM").await;
    assert_eq!(resumed_from_step, paused_step);

    // The resumed session finds the PENDING record (same approval id) and
    // announces it again; a decision made now reaches the new session.
    let again = next(&mut requests, "the re-announced request")
        .await
        .expect("request")
        .message;
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
    let benchmark = next(&mut requests, "the benchmark approval")
        .await
        .expect("request")
        .message;
    assert_eq!(benchmark.tool_name, "benchmark");
    assert_ne!(benchmark.approval_id, request.approval_id);
    approvals
        .decide(&approve(&benchmark))
        .await
        .expect("decide");

    let result = next(&mut results, "the result")
        .await
        .expect("result")
        .message()
        .clone();
    assert_eq!(result.attempt, 2, "no result of attempt 1: {result:?}");
    assert_eq!(result.worker_id, second.worker_id());
    assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    let mut seen = Vec::new();
    events_until(&mut events, &mut seen, |e| task_finished(e, 2)).await;
    let started = seen
        .iter()
        .map(payload)
        .find(|p| p["type"] == "task_started" && p["attempt"] == 2)
        .expect("task_started of attempt 2");
    assert!(
        started["resumed_from_step"].as_u64().is_some_and(|s| s > 0),
        "{started}"
    );
    assert_eq!(started["resumed_from_step"], paused_step);
    second.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_approval_times_out_from_its_original_request_to_deny() {
    let env = Env::start().await;
    let approvals = Approvals::open(&env.bus).await.expect("approvals");
    let mut requests = env
        .bus
        .subscribe_approval_requests(Some("jobT"))
        .await
        .expect("requests");
    let mut events = env.bus.subscribe_events("jobT").await.expect("events");
    env.bus.flush().await.expect("flush");
    let mut results = results(&env.bus, "jobT", "tt").await;
    let timeout = std::time::Duration::from_secs(6);
    let mut config_a = env.config("emu0");
    config_a.approval_timeout = timeout;
    let mut config_b = env.config("emu1");
    config_b.approval_timeout = timeout;

    let (first, request, _) =
        paused_on_first_worker(&env, config_a, "jobT", "sessT", &mut requests).await;
    first.kill().await;
    // Let part of the timeout pass while no worker runs the session, so a
    // clock restarted by the move would be told apart.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (second, _) = moved_to_second_worker(&env, config_b, "jobT", "sessT").await;
    let moved_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();

    let result = next(&mut results, "the result")
        .await
        .expect("result")
        .message()
        .clone();
    assert_eq!(result.attempt, 2, "{result:?}");
    let record = approvals
        .get(&request.approval_id)
        .await
        .expect("get")
        .expect("record")
        .value;
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
    events_until(&mut events, &mut seen, |e| task_finished(e, 2)).await;
    let decided = seen
        .iter()
        .filter(|e| is_kind(e, v1::AgentEventKind::ApprovalDecided))
        .map(payload)
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
    let mut spawn = spawn_request("jobJ", "agentJ", "sessJ", &slice);
    spawn.resume = true;
    let spawned = client(&daemon)
        .await
        .spawn_session(spawn)
        .await
        .expect("the session spawns despite the junk checkpoint")
        .into_inner();
    assert_eq!(spawned.resumed_from_step, 0);
}
