//! Scenario 6: a worker session paused for approval (a job without
//! auto-approve, so the builtin worker policy's hardware calls wait for a
//! human) loses its worker to SIGKILL. The approval stays listed; approving
//! it resumes the session on its new slice and the tool runs. With a short
//! approval timeout and nobody deciding, the call ends denied with
//! `timed_out`.

use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::chaos::{ChaosOptions, ChaosStack, Seen};
use mtswarm_tests::jobs::{approvals, decide_approval, get_job};
use mtswarm_tests::stack::Control;
use mtswarm_tests::{node_bin, small_fleet_toml};
use tokio::time::Instant;

use crate::support::{
    Started, first_assignment, is_final, ms, one_at_a_time, outcome, report, start_job, vecadd_job,
    wait_attempt,
};

/// Waits until the job has a pending approval and returns its request.
async fn first_pending(
    stack: &ChaosStack,
    control: &mut Control,
    job_id: &str,
) -> v1::ApprovalRequest {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let pending = approvals(control, job_id, &[v1::ApprovalState::Pending]).await;
        if let Some(request) = pending.into_iter().find_map(|r| r.request) {
            return request;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pending approval for job {job_id}\n{}",
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn decide(
    control: &mut Control,
    approval_id: &str,
    verdict: v1::ApprovalVerdict,
) -> v1::ApprovalRecord {
    decide_approval(control, approval_id, verdict, "chaos test", "chaos-test")
        .await
        .expect("DecideApproval")
}

/// A one-agent vecadd job with `goal` on two free slices whose worker
/// sessions wait for a reviewer (undecided calls are denied after
/// `approval_timeout`): its stack, Control client and id, its first
/// assignment and the first request that waits for a decision.
async fn paused_for_approval(
    approval_timeout: Duration,
    goal: &str,
) -> (
    ChaosStack,
    Control,
    String,
    v1::TaskAssignment,
    v1::ApprovalRequest,
) {
    let mut options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    options.worker_args = vec![
        "--approval-timeout".into(),
        approval_timeout.as_secs().to_string(),
    ];
    let Started {
        stack,
        mut control,
        job_id,
        ..
    } = start_job(options, 2, vecadd_job(goal, 1, false)).await;
    let first = first_assignment(&stack, &job_id).await;
    let request = first_pending(&stack, &mut control, &job_id).await;
    (stack, control, job_id, first, request)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pending_approval_survives_its_worker_and_resumes_on_the_new_slice() {
    let _serial = one_at_a_time().await;
    let (mut stack, mut control, job_id, first, request) = paused_for_approval(
        Duration::from_secs(600),
        "Tune vecadd with a reviewer; a worker will die",
    )
    .await;
    assert_eq!(request.session_id, first.session_id);

    let killed_at = stack.kill_worker(&first.worker_id);
    let (reassigned_at, second) =
        wait_attempt(&stack, &job_id, &first.task_id, 2, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    // The new session has resumed the paused checkpoint (it re-announces
    // the task) and still finds the same record: no second request.
    wait_for_the_resumed_session(&stack, &first.session_id, reassigned_at).await;
    assert_one_pending_record_of_the_call(&mut control, &job_id, &request).await;

    let approved_at = tokio::time::Instant::now();
    let decided = decide(
        &mut control,
        &request.approval_id,
        v1::ApprovalVerdict::Approve,
    )
    .await;
    assert_eq!(decided.state(), v1::ApprovalState::Approved);
    let tool_ran = approved_tool_result(&stack, &request.call_id, approved_at).await;
    // Approve whatever else the session asks until the job ends.
    let approved = 1 + approve_until_final(&stack, &mut control, &job_id).await;
    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(10)).await;
    let (job, accepted) = (&end.job, &end.accepted);
    report(
        "approvals_move",
        &[
            ("reassign_ms", ms(reassigned_at.duration_since(killed_at))),
            (
                "tool_ran_ms_after_approve",
                ms(tool_ran.0.duration_since(approved_at)),
            ),
            ("approved_tool_ok", tool_ran.1["ok"].to_string()),
            ("approvals_decided", approved.to_string()),
            ("accepted", accepted.len().to_string()),
        ],
    );

    // The call ran on the new slice (not denied). Its outcome may be an
    // error when it needs a build the dead worker held (the policy then
    // compiles again); what matters here is that the approval reached it.
    let observation = tool_ran.1["content"].as_str().unwrap_or_default();
    assert!(
        !observation.contains("denied"),
        "the approved call ran instead of being denied: {}",
        tool_ran.1
    );
    assert_ne!(second.worker_id, first.worker_id);
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "{job:#?}\n{}",
        stack.logs()
    );
    assert_eq!(accepted.len(), 1, "{accepted:#?}");
    assert_eq!(accepted[0].attempt, 2, "{:#?}", accepted[0]);
    assert_eq!(accepted[0].worker_id, second.worker_id);
}

/// Wait until the session `session` announces its task again after
/// `reassigned_at`: it resumed from its checkpoint.
async fn wait_for_the_resumed_session(stack: &ChaosStack, session: &str, reassigned_at: Instant) {
    stack
        .observer
        .wait_for(
            "the resumed session's task_started",
            Duration::from_secs(60),
            |seen| {
                seen.iter().find_map(|o| match &o.seen {
                    Seen::Event(e) if o.at > reassigned_at && e.session_id == session => {
                        mtswarm_tests::chaos::log_payload(e, "task_started")
                    }
                    _ => None,
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
}

/// The paused call has one pending record, the one from before the move.
async fn assert_one_pending_record_of_the_call(
    control: &mut Control,
    job_id: &str,
    request: &v1::ApprovalRequest,
) {
    let pending = approvals(control, job_id, &[v1::ApprovalState::Pending]).await;
    let same_call: Vec<&v1::ApprovalRequest> = pending
        .iter()
        .filter_map(|r| r.request.as_ref())
        .filter(|r| r.session_id == request.session_id && r.call_id == request.call_id)
        .collect();
    assert_eq!(
        same_call.len(),
        1,
        "one pending record for the paused call: {pending:#?}"
    );
    assert_eq!(same_call[0].approval_id, request.approval_id);
}

/// When the approved call's tool result came after `approved_at`, and its
/// payload.
async fn approved_tool_result(
    stack: &ChaosStack,
    call_id: &str,
    approved_at: Instant,
) -> (Instant, serde_json::Value) {
    stack
        .observer
        .wait_for(
            "the approved call's tool result",
            Duration::from_secs(60),
            |seen| {
                seen.iter().find_map(|o| match &o.seen {
                    Seen::Event(e)
                        if o.at > approved_at && e.kind() == v1::AgentEventKind::ToolResult =>
                    {
                        let payload: serde_json::Value =
                            serde_json::from_str(&e.payload_json).unwrap_or_default();
                        (payload["call_id"] == call_id).then_some((o.at, payload))
                    }
                    _ => None,
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()))
}

/// Approve whatever else the job's sessions ask until the job is final (at
/// most 240 s); how many were approved.
async fn approve_until_final(stack: &ChaosStack, control: &mut Control, job_id: &str) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    let mut approved = 0;
    loop {
        let job = get_job(control, job_id).await;
        if is_final(job.state()) {
            return approved;
        }
        for record in approvals(control, job_id, &[v1::ApprovalState::Pending]).await {
            if let Some(pending) = record.request {
                decide(control, &pending.approval_id, v1::ApprovalVerdict::Approve).await;
                approved += 1;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job not final in time: {job:#?}\n{}",
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn undecided_approval_times_out_denied_across_a_move() {
    let _serial = one_at_a_time().await;
    let timeout = Duration::from_secs(6);
    let (mut stack, mut control, job_id, first, request) =
        paused_for_approval(timeout, "Tune vecadd; nobody answers the reviewer").await;
    let killed_at = stack.kill_worker(&first.worker_id);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let record = loop {
        let all = approvals(&mut control, &job_id, &[]).await;
        let record = all
            .into_iter()
            .find(|r| {
                r.request
                    .as_ref()
                    .is_some_and(|q| q.approval_id == request.approval_id)
            })
            .expect("the approval stays listed");
        if record.state() != v1::ApprovalState::Pending {
            break record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "approval {} still pending {:?} after the kill\n{}",
            request.approval_id,
            killed_at.elapsed(),
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let decided_after_kill = killed_at.elapsed();
    let reassigned = stack
        .observer
        .tasks(&job_id)
        .iter()
        .any(|(_, t)| t.attempt >= 2);
    // Its calls would keep waiting for a reviewer; end the job.
    let _ = control
        .cancel_job(v1::CancelJobRequest {
            job_id: job_id.clone(),
            reason: "chaos test done".to_string(),
        })
        .await;
    report(
        "approvals_timeout",
        &[
            ("approval_timeout_ms", ms(timeout)),
            ("decided_ms_after_kill", ms(decided_after_kill)),
            ("task_reassigned", reassigned.to_string()),
        ],
    );

    let decision = record.decision.clone().expect("a decision");
    assert_eq!(record.state(), v1::ApprovalState::Denied, "{record:#?}");
    assert!(decision.timed_out, "{record:#?}");
    assert_eq!(decision.verdict(), v1::ApprovalVerdict::Deny, "{record:#?}");
    assert!(
        reassigned,
        "the session moved: {:#?}",
        stack.observer.tasks(&job_id)
    );
}
