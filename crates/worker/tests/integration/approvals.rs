//! Approvals across the bus: a session without auto-approval stores a
//! PENDING record and publishes the request for a medium-risk call; an
//! APPROVE decision published on the session's decision subject resumes it
//! and the tool runs; a DENY written to the approvals bucket reaches the
//! model as a denial observation; with no decision the default verdict
//! applies after the timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::time::Duration;

use common::*;
use mtswarm_bus::{Approvals, v1};
use serde_json::json;

fn tool_result(events: &[v1::AgentEvent], call_id: &str) -> Option<serde_json::Value> {
    payloads_of(events, v1::AgentEventKind::ToolResult).find(|p| p["call_id"] == call_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_on_the_subject_runs_the_tool_and_deny_in_kv_gives_a_denial() {
    let env = Env::start().await;
    let handle = env.daemon(env.config("emu0")).await;
    let slice = handle.slice_ids()[0].clone();
    let approvals = Approvals::open(&env.bus).await.expect("approvals");
    let mut watch = env.watch("jobA", "ta").await;

    // auto_approve off: validate and benchmark (medium risk) need a human.
    let session = Session::on(&handle, &slice, "jobA", "agentA", "sessA");
    spawn(&handle, session.spawn_request()).await;
    let params = json!({"params": {"N": 16384, "CHUNK": 256}, "repeats": 3});
    env.publish(&session.task("taskA", 1, params)).await;

    let request = next_message(&mut watch.requests, "the validate approval request").await;
    assert_eq!(request.tool_name, "validate");
    assert_eq!(request.session_id, "sessA");
    assert_eq!(request.risk, v1::RiskLevel::Medium as i32);
    let record = stored(approvals.kv(), &request.approval_id).await;
    assert_eq!(record.state(), v1::ApprovalState::Pending);

    // APPROVE, only as a message: the worker records it and runs the tool.
    env.bus
        .publish_approval_decision(&approve(&request))
        .await
        .expect("publish decision");
    let benchmark = next_message(&mut watch.requests, "the benchmark approval request").await;
    assert_eq!(benchmark.tool_name, "benchmark");
    let record = stored(approvals.kv(), &request.approval_id).await;
    assert_eq!(record.state(), v1::ApprovalState::Approved);

    // DENY, only in the bucket (as if the notification were lost).
    approvals
        .decide(&decision(
            &benchmark,
            v1::ApprovalVerdict::Deny,
            "not on this board today",
        ))
        .await
        .expect("decide");

    let result = next_result(&mut watch.results, "the result").await;
    assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    let body: serde_json::Value = serde_json::from_str(&result.result_json).expect("json");
    assert!(body["best"].is_null(), "the benchmark never ran: {body}");

    let mut all = Vec::new();
    events_until(&mut watch.events, &mut all, |e| task_finished(e, 1)).await;
    assert_gapless(&all, 1);
    let validated = tool_result(&all, &request.call_id).expect("validate result");
    assert_eq!(validated["ok"], true, "{validated}");
    assert!(
        validated["content"]
            .as_str()
            .is_some_and(|c| c.contains("validation PASSED")),
        "{validated}"
    );
    let denied = tool_result(&all, &benchmark.call_id).expect("benchmark result");
    assert_eq!(denied["ok"], false);
    let content = denied["content"].as_str().unwrap_or("");
    assert!(
        content.contains("denied by the reviewer") && content.contains("not on this board today"),
        "{content}"
    );
    let decided: Vec<serde_json::Value> =
        payloads_of(&all, v1::AgentEventKind::ApprovalDecided).collect();
    assert_eq!(decided.len(), 2, "{decided:?}");
    assert_eq!(decided[0]["verdict"], "APPROVAL_VERDICT_APPROVE");
    assert_eq!(decided[1]["verdict"], "APPROVAL_VERDICT_DENY");
    // The policy saw the denial and says why the candidate has no figure.
    assert!(
        body["answer_json"]["candidates"][0]["failure"]
            .as_str()
            .is_some_and(|f| f.contains("denied")),
        "{body}"
    );
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_decision_applies_the_default_verdict_after_the_timeout() {
    let env = Env::start().await;
    let mut config = env.config("emu0");
    config.approval_timeout = Duration::from_secs(2);
    let handle = env.daemon(config).await;
    let slice = handle.slice_ids()[1].clone();
    let approvals = Approvals::open(&env.bus).await.expect("approvals");
    let mut decisions = env
        .bus
        .subscribe_approval_decisions("sessT")
        .await
        .expect("decisions");
    // Flushed with the job's subscriptions.
    let mut watch = env.watch("jobT", "tt").await;

    let session = Session::on(&handle, &slice, "jobT", "agentT", "sessT");
    spawn(&handle, session.spawn_request()).await;
    let params = json!({"params": {"N": 16384, "CHUNK": 256}});
    env.publish(&session.task("taskT", 1, params)).await;

    let request = next_message(&mut watch.requests, "the approval request").await;
    assert_eq!(request.timeout_seconds, 2);
    assert_eq!(request.default_verdict, v1::ApprovalVerdict::Deny as i32);
    let timed_out = next_message(&mut decisions, "the timeout decision").await;
    assert_eq!(timed_out.approval_id, request.approval_id);
    assert!(timed_out.timed_out);
    assert_eq!(timed_out.verdict(), v1::ApprovalVerdict::Deny);
    let record = stored(approvals.kv(), &request.approval_id).await;
    assert_eq!(record.state(), v1::ApprovalState::Denied);

    let result = next_result(&mut watch.results, "the result").await;
    assert_eq!(result.status, v1::TaskStatus::Ok as i32);
    let mut all = Vec::new();
    events_until(&mut watch.events, &mut all, |e| task_finished(e, 1)).await;
    let denied = tool_result(&all, &request.call_id).expect("denied call result");
    assert_eq!(denied["ok"], false);
    assert!(
        denied["content"]
            .as_str()
            .is_some_and(|c| c.contains("approval timed out")),
        "{denied}"
    );
    handle.shutdown().await.expect("shutdown");
}
