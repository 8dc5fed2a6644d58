//! Acceptance 2: approvals across processes. A job with `auto_approve =
//! false` makes a worker session (in a worker process) pause on its first
//! medium-risk call; the request is listed by the leader (ListApprovals);
//! approving resumes the session and the tool runs; denying gives the model
//! a denial observation. "Approve this tool for the whole job" answers the
//! other agents' calls of that tool too: a two-agent vecadd job asks at
//! most two questions, each showing the candidate's parameters, and a
//! job-spec rule by tool runs that tool without asking at all.

use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::jobs::{approvals, decide_approval, decide_approval_for, is_final};
use mtswarm_tests::stack::Control;
use mtswarm_tests::{TestStack, small_fleet_toml};

use crate::support::{
    agent_events, fan_out_options, get_job, job_spec, start_stack, submit, task_results,
};

/// Waits until the job has a pending approval and returns it.
async fn next_pending(
    control: &mut Control,
    job_id: &str,
    timeout: Duration,
) -> v1::ApprovalRecord {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let pending = approvals(control, job_id, &[v1::ApprovalState::Pending]).await;
        if let Some(record) = pending.into_iter().next() {
            return record;
        }
        let job = get_job(control, job_id).await;
        assert!(
            !is_final(job.state()),
            "job ended without a pending approval: {job:#?}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pending approval for job {job_id} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn decide(
    control: &mut Control,
    approval_id: &str,
    verdict: v1::ApprovalVerdict,
    reason: &str,
) -> Result<v1::ApprovalRecord, tonic::Status> {
    decide_approval(control, approval_id, verdict, reason, "e2e-test").await
}

/// Decides whatever else the job's sessions ask for with `verdict` until
/// the job is final (at most 240 s, fewer than 20 requests); returns the
/// final record and the requests it decided.
async fn decide_until_final(
    stack: &TestStack,
    control: &mut Control,
    job_id: &str,
    verdict: v1::ApprovalVerdict,
    reason: &str,
) -> (v1::JobRecord, Vec<v1::ApprovalRequest>) {
    let mut decided = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let job = get_job(control, job_id).await;
        if is_final(job.state()) {
            return (job, decided);
        }
        for record in approvals(control, job_id, &[v1::ApprovalState::Pending]).await {
            let pending = record.request.expect("request");
            decide(control, &pending.approval_id, verdict, reason)
                .await
                .expect("decide");
            decided.push(pending);
        }
        assert!(decided.len() < 20, "the session keeps asking: {decided:#?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job_id} not final in time: {job:#?}\n{}",
            stack.worker_logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The events of a finished job (the stream replays everything and ends).
async fn all_events(stack: &TestStack, control: &mut Control, job_id: &str) -> Vec<v1::JobEvent> {
    crate::support::watch_to_end(control, job_id, Duration::from_secs(60), || {
        stack.worker_logs()
    })
    .await
}

/// The payload of the result event of tool call `call_id` among `events`.
fn tool_result_of(events: &[v1::JobEvent], call_id: &str) -> Option<serde_json::Value> {
    agent_events(events).into_iter().find_map(|e| {
        if e.kind() != v1::AgentEventKind::ToolResult {
            return None;
        }
        let payload: serde_json::Value = serde_json::from_str(&e.payload_json).unwrap_or_default();
        (payload["call_id"] == call_id).then_some(payload)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_calls_are_listed_and_resume_on_approve_or_deny() {
    let options = fan_out_options(&[("reviewed", "")], small_fleet_toml(1, 1, 2));
    let (stack, mut control) = start_stack(options, 1).await;
    approving_resumes_the_session(&stack, &mut control).await;
    denying_is_the_calls_observation(&stack, &mut control).await;
    stack.shutdown().await;
}

/// Approve: every paused call of the session is approved; tools run.
async fn approving_resumes_the_session(stack: &TestStack, control: &mut Control) {
    let job_id = submit(
        control,
        job_spec("Tune vecadd with a human in the loop", "vecadd", false),
    )
    .await;
    let first = next_pending(control, &job_id, Duration::from_secs(120)).await;
    let request = first.request.clone().expect("request");
    assert_eq!(request.job_id, job_id);
    assert_eq!(request.agent_id, "reviewed");
    assert_eq!(request.risk(), v1::RiskLevel::Medium, "{request:#?}");
    assert!(!request.tool_name.is_empty());
    assert!(
        !request.session_id.is_empty() && !request.call_id.is_empty(),
        "{request:#?}"
    );
    let decided = decide(
        control,
        &request.approval_id,
        v1::ApprovalVerdict::Approve,
        "looks fine",
    )
    .await
    .expect("DecideApproval(approve)");
    assert_eq!(decided.state(), v1::ApprovalState::Approved);
    // Deciding twice is refused.
    let again = decide(
        control,
        &request.approval_id,
        v1::ApprovalVerdict::Deny,
        "changed my mind",
    )
    .await
    .expect_err("second decision refused");
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");
    // Approve whatever else the session asks for until the job ends.
    let (job, approved) =
        decide_until_final(stack, control, &job_id, v1::ApprovalVerdict::Approve, "ok").await;
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "{job:#?}\n{}",
        stack.worker_logs()
    );
    let events = all_events(stack, control, &job_id).await;
    let results = task_results(&events);
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(results[0].status(), v1::TaskStatus::Ok, "{:#?}", results[0]);
    // The approved tool ran: its result event follows the decision and is ok.
    let approved_tool_ok =
        tool_result_of(&events, &request.call_id).is_some_and(|payload| payload["ok"] == true);
    assert!(
        approved_tool_ok,
        "no successful result of the approved call {}",
        request.call_id
    );
    // Every decided request is listed as approved, the first one too.
    let listed_decided = approvals(control, &job_id, &[v1::ApprovalState::Approved]).await;
    assert!(listed_decided.len() > approved.len());
}

/// Deny: the model sees the denial as the call's observation.
async fn denying_is_the_calls_observation(stack: &TestStack, control: &mut Control) {
    let job_id = submit(
        control,
        job_spec("Tune vecadd, but the reviewer says no", "vecadd", false),
    )
    .await;
    let pending = next_pending(control, &job_id, Duration::from_secs(120)).await;
    let request = pending.request.expect("request");
    let reason = "not on this board today";
    let decided = decide(
        control,
        &request.approval_id,
        v1::ApprovalVerdict::Deny,
        reason,
    )
    .await
    .expect("DecideApproval(deny)");
    assert_eq!(decided.state(), v1::ApprovalState::Denied);
    // Deny anything else it asks, so the job ends.
    let (job, _denied) =
        decide_until_final(stack, control, &job_id, v1::ApprovalVerdict::Deny, reason).await;
    let events = all_events(stack, control, &job_id).await;
    let payload = tool_result_of(&events, &request.call_id).unwrap_or_else(|| {
        panic!(
            "no result event for the denied call {}; job {job:#?}",
            request.call_id
        )
    });
    assert_eq!(payload["ok"], false, "{payload}");
    let observation = payload["content"].as_str().unwrap_or_default();
    assert!(
        observation.contains("denied") && observation.contains(reason),
        "the model's observation names the denial and its reason: {observation}"
    );
    // The worker's answer reflects it: the candidate was dropped.
    let results = task_results(&events);
    assert_eq!(results.len(), 1, "{results:#?}");
    let parsed: serde_json::Value =
        serde_json::from_str(&results[0].result_json).unwrap_or_default();
    assert!(
        parsed.get("best").is_none_or(serde_json::Value::is_null),
        "nothing was benchmarked, so there is no best: {parsed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approving_a_tool_for_the_job_answers_every_agents_later_calls() {
    let agents = [("left", ""), ("right", "")];
    let options = fan_out_options(&agents, small_fleet_toml(1, 2, 2));
    let (stack, mut control) = start_stack(options, 2).await;

    // Every question is answered "approve this tool for the whole job".
    let job_id = submit(
        &mut control,
        job_spec("Tune vecadd, approving tools for the job", "vecadd", false),
    )
    .await;
    let (job, asked) = approve_each_tool_for_the_job(&stack, &mut control, &job_id).await;
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "{job:#?}\n{}",
        stack.worker_logs()
    );
    assert!(
        !asked.is_empty() && asked.len() <= 2,
        "questions asked: {:#?}",
        asked.iter().map(|q| &q.tool_name).collect::<Vec<_>>()
    );
    assert_each_question_shows_the_candidate(&asked);
    assert_standing_decisions_answered_the_rest(&mut control, &job_id, &asked).await;
    a_job_rule_runs_its_tools_unasked(&stack, &mut control).await;
    stack.shutdown().await;
}

/// Answer each question of the job with "approve this tool for the whole
/// job" until it is final (at most 240 s); the final record and the
/// questions answered.
async fn approve_each_tool_for_the_job(
    stack: &TestStack,
    control: &mut Control,
    job_id: &str,
) -> (v1::JobRecord, Vec<v1::ApprovalRequest>) {
    let mut asked: Vec<v1::ApprovalRequest> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let job = get_job(control, job_id).await;
        if is_final(job.state()) {
            return (job, asked);
        }
        for record in approvals(control, job_id, &[v1::ApprovalState::Pending]).await {
            let request = record.request.expect("request");
            // A call of a tool approved for the job may still be listed for
            // a moment before its standing decision lands: not a question.
            if asked.iter().any(|q| q.tool_name == request.tool_name) {
                continue;
            }
            match decide_approval_for(
                control,
                &request.approval_id,
                v1::ApprovalVerdict::Approve,
                "fine for this job",
                "e2e-test",
                v1::ApprovalScope::ToolForJob,
            )
            .await
            {
                Ok(record) => {
                    let decision = record.decision.expect("decision");
                    assert_eq!(decision.scope(), v1::ApprovalScope::ToolForJob);
                    assert_eq!(decision.tool_name, request.tool_name);
                    asked.push(request);
                }
                // Decided meanwhile by an earlier standing decision.
                Err(status) if status.code() == tonic::Code::FailedPrecondition => {}
                Err(status) => panic!("DecideApproval: {status:?}"),
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job_id} not final in time: {job:#?}\n{}",
            stack.worker_logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each question shows what the call will do: the candidate's parameters
/// (the task's CHUNK and BUF), the slice and the tool.
fn assert_each_question_shows_the_candidate(asked: &[v1::ApprovalRequest]) {
    for question in asked {
        let candidate: serde_json::Value =
            serde_json::from_str(&question.candidate_json).unwrap_or_default();
        assert_eq!(candidate["CHUNK"], "1024", "{question:#?}");
        assert_eq!(candidate["BUF"], "2", "{question:#?}");
        assert!(
            question.summary.contains("CHUNK=1024")
                && question.summary.contains(&question.tool_name)
                && !question.slice_id.is_empty()
                && question.summary.contains(&question.slice_id),
            "{question:#?}"
        );
    }
}

/// The other agent's calls were decided by the standing decisions, signed,
/// naming the decision they came from; nothing is left pending, and the
/// standing records are not listed as approvals of their own.
async fn assert_standing_decisions_answered_the_rest(
    control: &mut Control,
    job_id: &str,
    asked: &[v1::ApprovalRequest],
) {
    let decided = approvals(control, job_id, &[]).await;
    let standing: Vec<&v1::ApprovalDecision> = decided
        .iter()
        .filter_map(|r| r.decision.as_ref())
        .filter(|d| !d.standing_approval_id.is_empty())
        .collect();
    assert!(!standing.is_empty(), "{decided:#?}");
    for decision in &standing {
        assert_eq!(decision.verdict(), v1::ApprovalVerdict::Approve);
        assert!(
            asked
                .iter()
                .any(|q| q.approval_id == decision.standing_approval_id),
            "{decision:#?}"
        );
        assert_eq!(decision.decided_by, "e2e-test");
    }
    assert!(
        decided
            .iter()
            .all(|r| r.state() != v1::ApprovalState::Pending),
        "{decided:#?}"
    );
    // The standing records are not listed as approvals of their own.
    assert_eq!(
        decided.len(),
        decided
            .iter()
            .filter_map(|r| r.request.as_ref())
            .map(|r| &r.approval_id)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
}

/// A job-spec rule by tool: `validate` and `benchmark` run unasked.
async fn a_job_rule_runs_its_tools_unasked(stack: &TestStack, control: &mut Control) {
    let mut spec = job_spec("Tune vecadd under a job policy", "vecadd", false);
    spec.approval_rules = ["validate", "benchmark", "run"]
        .into_iter()
        .map(|tool| v1::ApprovalRule {
            tool: tool.into(),
            risk: v1::RiskLevel::Unspecified as i32,
            action: v1::ApprovalAction::Allow as i32,
        })
        .collect();
    let job_id = submit(control, spec).await;
    let (job, asked) =
        decide_until_final(stack, control, &job_id, v1::ApprovalVerdict::Approve, "ok").await;
    assert_eq!(job.state(), v1::JobState::Succeeded, "{job:#?}");
    assert!(
        asked
            .iter()
            .all(|q| !["validate", "benchmark", "run"].contains(&q.tool_name.as_str())),
        "the rule's tools asked: {asked:#?}"
    );
}
