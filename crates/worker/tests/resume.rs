//! A session paused for approval on one worker whose daemon then dies is
//! spawned again (same session id) on another worker; the task redelivered
//! there with `resume_from_checkpoint` continues from the checkpoint's step
//! instead of starting over, and the session's event numbering continues.

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
        "candidates": [{"N": 16384, "CHUNK": 512}, {"N": 16384, "CHUNK": 1024}],
        "repeats": 3
    });
    let attempt1 = task(
        "jobR",
        "agentR",
        "sessR",
        first.worker_id(),
        &slice_a,
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
        "jobR",
        "agentR",
        "sessR",
        second.worker_id(),
        &slice_b,
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
