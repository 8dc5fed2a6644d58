//! One worker host taken over, abuses 3, 4 and 5 of issue 31, on a real
//! `mtswarm up`: with one worker's NATS credential the attacker may write
//! the approvals bucket and publish approval requests (records move with
//! their sessions), so it replays a decision the leader signed for one
//! call onto another, rewrites what a pending call shows to the person
//! deciding it, and relabels a call of one job as another job's to ride
//! that job's standing approval. The leader signs every decision over the
//! exact call it decides (job, session, approval id, tool, canonical
//! arguments, risk) from the request as its worker signed it, and the
//! worker applies only a decision of its own pending call: each abuse
//! decides nothing, is shown for what it is, and the jobs end as they
//! would have.

use std::time::Duration;

use mtswarm_bus::v1;
use mtswarm_tests::jobs::approvals as approvals_of;
use tonic::Code;

use crate::secure_up::{
    SecureUp, approve_until_finished, decisions_applied, listed_approval, next_pending, node,
    submit_vecadd, wait_for_leader_log, wait_for_worker_log,
};

fn approval_id(record: &v1::ApprovalRecord) -> String {
    record
        .request
        .as_ref()
        .map(|r| r.approval_id.clone())
        .unwrap_or_default()
}

/// Waits until ListApprovals shows `approval_id` pending again with a
/// request that verifies (the session stored its own request again).
async fn wait_restored(control: &mut crate::secure_up::Control, job_id: &str, approval_id: &str) {
    let deadline = std::time::Instant::now() + crate::secure_up::WAIT;
    loop {
        let listed = listed_approval(control, job_id, approval_id).await;
        if listed.as_ref().is_some_and(|a| {
            a.state() == v1::ApprovalState::Pending && a.verification_error.is_empty()
        }) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{approval_id} was not restored: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Abuse 3: an APPROVE the leader signed for one call, copied into
/// another pending call's record, is not applied to it; the session
/// stores its own request again, and only the decision made for it
/// decides it.
#[tokio::test(flavor = "multi_thread")]
async fn a_decision_replayed_onto_another_call_is_not_applied() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let mut approver = stack.control(stack.token("approver")).await;
    let job_id = submit_vecadd(&mut admin).await;

    let first = next_pending(&mut approver, &job_id, &[]).await;
    let first_id = approval_id(&first);
    let decided = approver
        .decide_approval(v1::DecideApprovalRequest {
            approval_id: first_id.clone(),
            verdict: v1::ApprovalVerdict::Approve as i32,
            reason: "ok".into(),
            ..Default::default()
        })
        .await
        .expect("approved")
        .into_inner()
        .approval
        .and_then(|a| a.decision)
        .expect("a signed decision");
    assert_eq!(decided.signature.len(), 64, "{decided:?}");

    let second = next_pending(&mut approver, &job_id, std::slice::from_ref(&first_id)).await;
    let second_id = approval_id(&second);
    let rogue = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let approvals = mtswarm_bus::Approvals::open(&rogue).await.expect("bucket");
    let replayed = v1::ApprovalRecord {
        request: second.request.clone(),
        state: v1::ApprovalState::Approved as i32,
        decision: Some(decided.clone()),
        verification_error: String::new(),
    };
    approvals
        .kv()
        .put(&second_id, &replayed)
        .await
        .expect("a worker identity writes the record");

    wait_for_worker_log(
        &stack,
        "approval decision dropped: it names another call than this session's",
        1,
    )
    .await;
    wait_restored(&mut approver, &job_id, &second_id).await;
    assert!(
        decisions_applied(&stack, &job_id, &second_id)
            .await
            .is_empty(),
        "the replayed decision was applied"
    );

    let record = approve_until_finished(&stack, &job_id).await;
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    assert_eq!(
        decisions_applied(&stack, &job_id, &second_id).await,
        vec![(
            "approver".to_string(),
            "APPROVAL_VERDICT_APPROVE".to_string()
        )],
        "only the decision made for the call decided it"
    );
    stack.stop();
}

/// Abuse 4: a pending call's record rewritten to show a harmless call
/// (`read_file`, low risk) is listed as failing verification, in the API
/// and in `mtswarm approvals`; approving it is refused and recorded as a
/// deny of what it shows, which the session does not apply to its real
/// call; the session stores its own request again and the person decides
/// the real call.
#[tokio::test(flavor = "multi_thread")]
async fn a_rewritten_approval_display_is_shown_unverified_and_never_approves_the_real_call() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let mut approver = stack.control(stack.token("approver")).await;
    let job_id = submit_vecadd(&mut admin).await;
    let target = next_pending(&mut approver, &job_id, &[]).await;
    let target_id = approval_id(&target);
    let real = target.request.clone().expect("request");
    assert_ne!(real.tool_name, "read_file", "{real:?}");

    let rogue = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let approvals = mtswarm_bus::Approvals::open(&rogue).await.expect("bucket");
    let mut spoofed = real.clone();
    spoofed.tool_name = "read_file".into();
    spoofed.risk = v1::RiskLevel::Low as i32;
    spoofed.arguments_json = r#"{"path":"tune.toml"}"#.into();
    spoofed.summary = "read tune.toml".into();
    approvals
        .kv()
        .put(
            &target_id,
            &v1::ApprovalRecord {
                request: Some(spoofed),
                state: v1::ApprovalState::Pending as i32,
                decision: None,
                verification_error: String::new(),
            },
        )
        .await
        .expect("a worker identity writes the record");

    let listed = listed_approval(&mut approver, &job_id, &target_id)
        .await
        .expect("listed");
    assert!(
        !listed.verification_error.is_empty(),
        "the rewritten record was shown as genuine: {listed:?}"
    );
    let output = node(&stack.client_config)
        .args(["approvals", "--job", &job_id])
        .output()
        .expect("run mtswarm approvals");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.contains(&target_id) && l.contains("unverified")),
        "mtswarm approvals does not show the record as unverified:\n{table}"
    );

    let refused = approver
        .decide_approval(v1::DecideApprovalRequest {
            approval_id: target_id.clone(),
            verdict: v1::ApprovalVerdict::Approve as i32,
            reason: "looks harmless".into(),
            ..Default::default()
        })
        .await
        .expect_err("approving a record that fails verification");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("failed verification") && refused.message().contains("denied"),
        "{refused:?}"
    );
    // The leader's deny names `read_file`: the session does not apply it to
    // its real call, and asks again for what it really runs.
    wait_restored(&mut approver, &job_id, &target_id).await;
    assert!(
        decisions_applied(&stack, &job_id, &target_id)
            .await
            .is_empty(),
        "a decision over the rewritten record decided the real call"
    );
    let record = approve_until_finished(&stack, &job_id).await;
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    assert_eq!(
        decisions_applied(&stack, &job_id, &target_id).await,
        vec![(
            "approver".to_string(),
            "APPROVAL_VERDICT_APPROVE".to_string()
        )]
    );
    stack.stop();
}

/// Abuse 5: a standing approval of a tool for one job does not decide a
/// call of another job relabelled as the first job's: the leader refuses
/// the relabelled request (its grant names the other job), the call stays
/// pending until a person decides it.
#[tokio::test(flavor = "multi_thread")]
async fn a_standing_approval_of_one_job_does_not_cross_into_another() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let mut approver = stack.control(stack.token("approver")).await;
    let job_a = submit_vecadd(&mut admin).await;
    let first_a = next_pending(&mut approver, &job_a, &[]).await;
    let tool = first_a
        .request
        .as_ref()
        .map(|r| r.tool_name.clone())
        .expect("request");
    approver
        .decide_approval(v1::DecideApprovalRequest {
            approval_id: approval_id(&first_a),
            verdict: v1::ApprovalVerdict::Approve as i32,
            reason: "for this job".into(),
            scope: v1::ApprovalScope::ToolForJob as i32,
            ..Default::default()
        })
        .await
        .expect("a standing approval for job A");

    let job_b = submit_vecadd(&mut admin).await;
    let pending_b = loop {
        let record = next_pending(&mut approver, &job_b, &[]).await;
        if record.request.as_ref().is_some_and(|r| r.tool_name == tool) {
            break record;
        }
        // Another tool first: decide it and wait for the one A stands for.
        approver
            .decide_approval(v1::DecideApprovalRequest {
                approval_id: approval_id(&record),
                verdict: v1::ApprovalVerdict::Approve as i32,
                reason: "ok".into(),
                ..Default::default()
            })
            .await
            .expect("approved");
    };
    let id_b = approval_id(&pending_b);

    // Relabelled as job A's and announced on A's subject.
    let rogue = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let mut relabelled = pending_b.request.clone().expect("request");
    relabelled.job_id = job_a.clone();
    rogue
        .publish_approval_request(&relabelled)
        .await
        .expect("a worker identity publishes approval requests");
    rogue.flush().await.expect("flush");
    wait_for_leader_log(
        &stack,
        "approval request refused: not signed by the worker its task was placed on",
        1,
    )
    .await;
    let still = listed_approval(&mut approver, &job_b, &id_b)
        .await
        .expect("listed");
    assert_eq!(
        still.state(),
        v1::ApprovalState::Pending,
        "a standing approval of job A decided job B's call: {still:?}"
    );
    assert!(decisions_applied(&stack, &job_b, &id_b).await.is_empty());
    assert!(
        approvals_of(&mut approver, &job_a, &[])
            .await
            .iter()
            .all(|a| approval_id(a) != id_b),
        "job B's call was recorded as job A's"
    );

    let record_a = approve_until_finished(&stack, &job_a).await;
    let record_b = approve_until_finished(&stack, &job_b).await;
    assert_eq!(record_a.state(), v1::JobState::Succeeded, "{record_a:?}");
    assert_eq!(record_b.state(), v1::JobState::Succeeded, "{record_b:?}");
    let applied = decisions_applied(&stack, &job_b, &id_b).await;
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(applied[0].0, "approver", "{applied:?}");
    stack.stop();
}
