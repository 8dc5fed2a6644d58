//! The abuses tried against a default `mtswarm up`, as an attacker on
//! 127.0.0.1 would try them, each now failing: the stack under test is a
//! real `mtswarm up` (nats-server, leader and two worker daemons as
//! processes, with the credentials it generates), the attacker a client of
//! its own. The KV junk case lives with the bucket listings.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use mtswarm_bus::{subjects, v1};
use mtswarm_tests::jobs::{approvals as approvals_of, get_job};
use tonic::Code;

use crate::secure_up::{
    Control, SecureUp, WAIT, assert_code, decisions_applied, finished_job, node, submit_vecadd,
    wait_for_worker_log, worker_logs,
};

#[tokio::test(flavor = "multi_thread")]
async fn the_default_stack_refuses_anonymous_grpc_and_the_readme_commands_work() {
    let stack = SecureUp::start();
    assert!(
        stack.leader_url().starts_with("https://"),
        "{}",
        stack.ready
    );

    let mut anonymous = stack.control(stack.ca()).await;
    assert_code(
        anonymous.list_jobs(v1::ListJobsRequest::default()).await,
        Code::Unauthenticated,
    );
    // Anonymous DecideApproval and CancelJob, the first two abuses.
    assert_code(
        anonymous
            .decide_approval(v1::DecideApprovalRequest {
                approval_id: "ap-x".into(),
                verdict: v1::ApprovalVerdict::Approve as i32,
                reason: String::new(),
                decided_by: "mallory".into(),
                ..Default::default()
            })
            .await,
        Code::Unauthenticated,
    );
    assert_code(
        anonymous
            .cancel_job(v1::CancelJobRequest {
                job_id: "some-job".into(),
                reason: "mine now".into(),
            })
            .await,
        Code::Unauthenticated,
    );
    // An anonymous Drain or SpawnSession on a worker; an admin is no leader.
    let mut worker = stack.worker(stack.ca()).await;
    assert_code(
        worker
            .drain(v1::DrainRequest {
                grace_seconds: 1,
                reason: "attack".into(),
            })
            .await,
        Code::Unauthenticated,
    );
    let mut as_admin = stack.worker(stack.token("admin")).await;
    let denied = assert_code(
        as_admin
            .spawn_session(v1::SpawnSessionRequest {
                job_id: "j".into(),
                agent_id: "a".into(),
                session_id: "s-rogue".into(),
                slice_id: "board0-c0".into(),
                role: "tuner".into(),
                kernel_dir: "vecadd".into(),
                ..Default::default()
            })
            .await,
        Code::PermissionDenied,
    );
    assert!(denied.message().contains("`leader`"), "{denied:?}");

    // README: `mtswarm fleet` with nothing but the client configuration.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let output = node(&stack.client_config)
            .args(["fleet", "--json"])
            .output()
            .expect("run mtswarm fleet");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let fleet: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        if fleet["slices"].as_array().map(Vec::len) == Some(8) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fleet never showed 8 slices: {fleet}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ... and through the printed `export MTSWARM_LEADER=<url>`.
    let output = node(&stack.client_config)
        .env("MTSWARM_LEADER", stack.leader_url())
        .args(["jobs"])
        .output()
        .expect("run mtswarm jobs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stack.stop();
}

/// Acceptance 2 and the KV abuse: an anonymous NATS client cannot connect
/// at all, with or without TLS; a client identity reads measurements only.
#[tokio::test(flavor = "multi_thread")]
async fn the_default_stack_refuses_anonymous_nats_clients() {
    let stack = SecureUp::start();
    let refused = stack.nats(None).await.expect_err("anonymous NATS");
    let text = refused.to_string().to_lowercase();
    assert!(text.contains("authoriz"), "{refused}");
    let plain = async_nats::ConnectOptions::new()
        .connect(stack.nats_url().replace("tls://", "nats://"))
        .await;
    assert!(
        plain.is_err(),
        "a plaintext anonymous connection was accepted"
    );

    let client = stack.nats(Some("client")).await.expect("client identity");
    let jobs = mtswarm_bus::Jobs::open(&client).await;
    assert!(jobs.is_err(), "the client identity opened the jobs bucket");
    let deleted = client
        .jetstream()
        .delete_stream(subjects::RESULTS_STREAM)
        .await;
    assert!(
        deleted.is_err(),
        "the client identity deleted the results stream"
    );
    let leader = stack.nats(Some("leader")).await.expect("leader identity");
    leader
        .jetstream()
        .get_stream(subjects::RESULTS_STREAM)
        .await
        .expect("the results stream is still there");
    stack.stop();
}

/// A worker's identity is confined to its own part: it may not delete
/// streams, read job records, publish tasks (a task published without the
/// leader), or publish approval decisions.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_identity_cannot_act_as_the_leader() {
    let stack = SecureUp::start();
    let rogue = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let leader = stack.nats(Some("leader")).await.expect("leader identity");

    assert!(
        rogue
            .jetstream()
            .delete_stream(subjects::RESULTS_STREAM)
            .await
            .is_err(),
        "a worker deleted the results stream"
    );
    assert!(
        mtswarm_bus::Jobs::open(&rogue).await.is_err(),
        "a worker opened the jobs bucket"
    );
    // A task for board0's slice published by board1's identity is refused.
    let task = v1::TaskAssignment {
        task_id: "rogue-task".into(),
        job_id: "rogue-job".into(),
        attempt: 1,
        agent_id: "a".into(),
        session_id: "s".into(),
        worker_id: "worker-board0".into(),
        slice_id: "board0-c0".into(),
        ..Default::default()
    };
    assert!(
        rogue.publish_task(&task).await.is_err(),
        "a worker published a task"
    );
    let mut stream = leader
        .jetstream()
        .get_stream(subjects::TASKS_STREAM)
        .await
        .expect("tasks stream");
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.state.messages, 0, "a task was stored: {info:?}");

    // Another daemon's liveness is not a worker's to write: board1's
    // identity cannot take board0's daemon lease (the one key that keeps
    // every slice of board0), and board0 keeps it at the same epoch.
    let leases = mtswarm_bus::Leases::open(&leader).await.expect("leases");
    let victim = leases
        .daemon("worker-board0")
        .await
        .expect("read")
        .expect("board0's daemon lease");
    let rogue_leases = mtswarm_bus::Leases::open(&rogue)
        .await
        .expect("a worker reads the leases");
    assert!(
        rogue_leases
            .take_daemon("worker-board0", Duration::from_secs(3600))
            .await
            .is_err(),
        "a worker took another daemon's lease"
    );
    let after = leases
        .daemon("worker-board0")
        .await
        .expect("read")
        .expect("board0 still holds its daemon lease");
    assert_eq!(after.value.epoch, victim.value.epoch, "{after:?}");

    // A decision published by a worker never reaches a session: the leader
    // identity, subscribed to the session's decisions, sees only the
    // genuine one published after it.
    let mut decisions = leader
        .subscribe_approval_decisions("s-victim")
        .await
        .expect("subscribe");
    leader.flush().await.expect("flush");
    let forged = v1::ApprovalDecision {
        approval_id: "ap-victim".into(),
        job_id: "j".into(),
        session_id: "s-victim".into(),
        call_id: "c".into(),
        verdict: v1::ApprovalVerdict::Approve as i32,
        decided_by: "mallory".into(),
        ..Default::default()
    };
    for _ in 0..121 {
        let _ = rogue.publish_approval_decision(&forged).await;
    }
    let _ = rogue.flush().await;
    let genuine = v1::ApprovalDecision {
        decided_by: "leader".into(),
        verdict: v1::ApprovalVerdict::Deny as i32,
        ..forged.clone()
    };
    leader
        .publish_approval_decision(&genuine)
        .await
        .expect("the leader publishes");
    let first = tokio::time::timeout(WAIT, decisions.next())
        .await
        .expect("a decision in time")
        .expect("a decision")
        .expect("decodable")
        .message;
    assert_eq!(first.decided_by, "leader", "{first:?}");
    stack.stop();
}

/// A result published by another worker's identity for a task it was not
/// placed for, with the genuine message id, is dropped and logged; the
/// genuine result is not taken for a duplicate and is the job's result.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_result_is_dropped_and_the_genuine_one_counts() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let job_id = submit_vecadd(&mut admin).await;
    let record = get_job(&mut admin, &job_id).await;
    assert_eq!(record.submitted_by, "admin");

    // The first task is on record before it is published.
    let leader = stack.nats(Some("leader")).await.expect("leader identity");
    let jobs = mtswarm_bus::Jobs::open(&leader).await.expect("jobs");
    let deadline = Instant::now() + WAIT;
    let assignment = loop {
        let tasks = jobs.tasks(&job_id).await.expect("the job's tasks");
        if let Some(task) = tasks.first().and_then(|t| t.assignment.clone()) {
            break task;
        }
        assert!(Instant::now() < deadline, "no task was assigned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The forger: the other board's worker identity.
    let forger_id = if assignment.worker_id == "worker-board0" {
        "worker-board1"
    } else {
        "worker-board0"
    };
    let forger = stack.nats(Some(forger_id)).await.expect("forger identity");
    let forged = v1::TaskResult {
        task_id: assignment.task_id.clone(),
        attempt: assignment.attempt,
        job_id: job_id.clone(),
        agent_id: assignment.agent_id.clone(),
        session_id: assignment.session_id.clone(),
        worker_id: assignment.worker_id.clone(),
        slice_id: assignment.slice_id.clone(),
        status: v1::TaskStatus::Ok as i32,
        summary: "987654 GFLOPS".into(),
        result_json: r#"{"best":{"gflops":987654.0}}"#.into(),
        ..Default::default()
    };
    // With the genuine message id (the old scheme) and with a guessed token.
    forger.publish_result(&forged).await.expect("stored");
    let guessed = v1::TaskResult {
        result_token: "0".repeat(32),
        ..forged.clone()
    };
    forger.publish_result(&guessed).await.expect("stored");

    // Let the job run: approve what its agent asks for.
    let mut approver = stack.control(stack.token("approver")).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    let record = loop {
        let pending = approvals_of(&mut approver, &job_id, &[v1::ApprovalState::Pending]).await;
        for approval in pending {
            let id = approval.request.map(|r| r.approval_id).unwrap_or_default();
            let decided = approver
                .decide_approval(v1::DecideApprovalRequest {
                    approval_id: id,
                    verdict: v1::ApprovalVerdict::Approve as i32,
                    reason: "ok".into(),
                    decided_by: "somebody-else".into(),
                    ..Default::default()
                })
                .await;
            if let Ok(decided) = decided {
                let decision = decided.into_inner().approval.and_then(|a| a.decision);
                assert_eq!(decision.map(|d| d.decided_by).as_deref(), Some("approver"));
            }
        }
        if let Some(record) = finished_job(&mut admin, &job_id, deadline).await {
            break record;
        }
    };
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    assert!(
        !record.result_json.contains("987654") && !record.summary.contains("987654"),
        "the forgery became the result: {record:?}"
    );
    assert_eq!(record.tasks_done, record.tasks_total, "{record:?}");
    let log = stack.leader_log();
    assert!(
        log.matches("its token is not the one issued").count() >= 2,
        "the forgeries were not dropped and logged:\n{log}"
    );
    stack.stop();
}

/// Any worker identity may write the approvals bucket (records move with
/// sessions), so a worker can store a decided record: unsigned or with a
/// forged signature it is dropped and logged with its approval id, the run
/// keeps waiting, and the genuine decision of the leader still decides it.
#[tokio::test(flavor = "multi_thread")]
async fn a_decision_written_into_the_approvals_bucket_by_a_worker_is_not_applied() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let mut approver = stack.control(stack.token("approver")).await;
    let job_id = submit_vecadd(&mut admin).await;

    // The first call that waits for a decision.
    let deadline = Instant::now() + Duration::from_secs(600);
    let target = loop {
        let pending = approvals_of(&mut approver, &job_id, &[v1::ApprovalState::Pending]).await;
        if let Some(request) = pending.into_iter().find_map(|a| a.request) {
            break request;
        }
        assert!(Instant::now() < deadline, "no approval was requested");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let approval_id = target.approval_id.clone();
    forge_decisions_as_a_worker(&stack, &target).await;

    // The run is still paused; the genuine decision decides over the
    // forgery, and every later call is approved too until the job ends.
    let record = loop {
        approve_over_the_forgery(&mut approver, &job_id, &approval_id).await;
        if let Some(record) = finished_job(&mut admin, &job_id, deadline).await {
            break record;
        }
    };
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");

    // What the session applied for that call: the approver's decision,
    // never the forger's.
    let applied: Vec<String> = decisions_applied(&stack, &job_id, &approval_id)
        .await
        .into_iter()
        .map(|(decided_by, _verdict)| decided_by)
        .collect();
    assert_eq!(applied, vec!["approver".to_string()], "decisions applied");
    let log = stack.leader_log();
    assert!(
        log.contains("stored approval decision is not the leader's"),
        "{log}"
    );
    stack.stop();
}

/// The forger, a worker identity, writes the decided record of `target`
/// directly: unsigned first, then signed by a key of its own; the workers
/// drop both and log why.
async fn forge_decisions_as_a_worker(stack: &SecureUp, target: &v1::ApprovalRequest) {
    let approval_id = target.approval_id.clone();
    let rogue = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let approvals = mtswarm_bus::Approvals::open(&rogue)
        .await
        .expect("a worker opens the approvals bucket");
    let forged_decision = v1::ApprovalDecision {
        approval_id: approval_id.clone(),
        job_id: target.job_id.clone(),
        session_id: target.session_id.clone(),
        call_id: target.call_id.clone(),
        verdict: v1::ApprovalVerdict::Approve as i32,
        reason: "looks fine".into(),
        decided_by: "mallory".into(),
        decided_at: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        timed_out: false,
        signature: Vec::new(),
        ..Default::default()
    };
    let forge = |signature: Vec<u8>| v1::ApprovalRecord {
        request: Some(target.clone()),
        state: v1::ApprovalState::Approved as i32,
        decision: Some(v1::ApprovalDecision {
            signature,
            ..forged_decision.clone()
        }),
        verification_error: String::new(),
    };
    approvals
        .kv()
        .put(&approval_id, &forge(Vec::new()))
        .await
        .expect("a worker identity writes the record");
    wait_for_worker_log(
        stack,
        &format!("approval decision {approval_id} carries no signature"),
        1,
    )
    .await;
    let mut self_signed = forged_decision.clone();
    mtswarm_auth::DecisionSigner::generate()
        .sign(&mut self_signed)
        .expect("sign");
    approvals
        .kv()
        .put(&approval_id, &forge(self_signed.signature))
        .await
        .expect("a worker identity writes the record");
    wait_for_worker_log(
        stack,
        &format!("approval decision {approval_id} is not signed by the leader key"),
        1,
    )
    .await;
    let log = worker_logs(stack);
    assert!(
        log.contains("approval decision dropped: not signed by the leader"),
        "{log}"
    );
}

/// Approve every pending call of the job, and the forged one: the leader's
/// decision of `approval_id` is the approver's, signed.
async fn approve_over_the_forgery(approver: &mut Control, job_id: &str, approval_id: &str) {
    let pending = approvals_of(approver, job_id, &[]).await;
    for approval in pending {
        let id = approval
            .request
            .as_ref()
            .map(|r| r.approval_id.clone())
            .unwrap_or_default();
        let forged = approval.decision.as_ref().map(|d| d.decided_by.as_str()) == Some("mallory");
        if approval.state() != v1::ApprovalState::Pending && !forged {
            continue;
        }
        let decided = approver
            .decide_approval(v1::DecideApprovalRequest {
                approval_id: id.clone(),
                verdict: v1::ApprovalVerdict::Approve as i32,
                reason: "ok".into(),
                decided_by: String::new(),
                ..Default::default()
            })
            .await;
        if id == approval_id {
            let decision = decided
                .expect("the leader decides over the forged record")
                .into_inner()
                .approval
                .and_then(|a| a.decision)
                .expect("decision");
            assert_eq!(decision.decided_by, "approver");
            assert_eq!(decision.signature.len(), 64, "{decision:?}");
        }
    }
}
