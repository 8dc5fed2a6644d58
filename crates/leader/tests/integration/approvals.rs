//! The approval broker over real NATS and gRPC: a request published on the
//! bus shows up in ListApprovals and WatchJob; DecideApproval writes the
//! record, publishes the decision to the session and refuses a second
//! decision and an unspecified verdict. CancelJob then ends the job.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::*;
use futures::StreamExt as _;
use mtswarm_bus::{Approvals, v1};
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use tonic::Status;

/// The requests of the job's pending approvals, as ListApprovals answers.
async fn pending(control: &mut Control, job_id: &str) -> Result<Vec<v1::ApprovalRequest>, Status> {
    Ok(control
        .list_approvals(v1::ListApprovalsRequest {
            job_id: job_id.into(),
            states: vec![v1::ApprovalState::Pending as i32],
        })
        .await?
        .into_inner()
        .approvals
        .into_iter()
        .filter_map(|a| a.request)
        .collect())
}

async fn pending_ids(control: &mut Control, job_id: &str) -> Vec<String> {
    pending(control, job_id)
        .await
        .expect("list_approvals")
        .into_iter()
        .map(|r| r.approval_id)
        .collect()
}

#[tokio::test]
async fn approvals_are_listed_watched_decided_once_and_published() {
    let env = Env::start().await;
    // The leader's first model turn is held, so the job stays RUNNING.
    let model = Arc::new(GatedModel::held_answer("done"));
    let leader = env.leader(model.clone()).await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1.").await;
    let mut watch = watch(&mut control, &job_id, 0).await;
    let mut decisions = env
        .bus
        .subscribe_approval_decisions("sess-1")
        .await
        .expect("decision subscription");

    env.bus
        .publish_approval_request(&approval_request(&job_id, "ap1", "sess-1"))
        .await
        .expect("publish request");
    env.bus
        .publish_approval_request(&approval_request(&job_id, "ap2", "sess-1"))
        .await
        .expect("publish request");
    let mut probe = control.clone();
    let listed = eventually("both requests in ListApprovals", || {
        let mut probe = probe.clone();
        let job_id = job_id.clone();
        async move {
            let ids = pending_ids(&mut probe, &job_id).await;
            (ids.len() == 2).then_some(ids)
        }
    })
    .await;
    assert_eq!(listed, vec!["ap1".to_string(), "ap2".to_string()]);

    let decided = decide(
        &mut control,
        "ap1",
        v1::ApprovalVerdict::Approve,
        "looks fine",
        "alice",
    )
    .await
    .expect("decide");
    assert_eq!(decided.state(), v1::ApprovalState::Approved);

    let published = within("the published decision", decisions.next())
        .await
        .expect("a decision")
        .expect("decodable decision")
        .message;
    assert_eq!(published.approval_id, "ap1");
    assert_eq!(published.call_id, "call-ap1");
    assert_eq!(published.verdict(), v1::ApprovalVerdict::Approve);
    assert_eq!(published.decided_by, "alice");

    let stored = Approvals::open(&env.bus)
        .await
        .expect("approvals bucket")
        .get("ap1")
        .await
        .expect("get")
        .expect("record exists");
    assert_eq!(stored.value.state(), v1::ApprovalState::Approved);
    assert_eq!(
        stored.value.decision.as_ref().map(|d| d.reason.as_str()),
        Some("looks fine")
    );

    let twice = decide(&mut control, "ap1", v1::ApprovalVerdict::Deny, "", "")
        .await
        .expect_err("second decision");
    assert_eq!(twice.code(), tonic::Code::FailedPrecondition, "{twice:?}");
    let unspecified = decide(
        &mut control,
        "ap2",
        v1::ApprovalVerdict::Unspecified,
        "",
        "",
    )
    .await
    .expect_err("unspecified verdict");
    assert_eq!(
        unspecified.code(),
        tonic::Code::InvalidArgument,
        "{unspecified:?}"
    );
    assert_eq!(
        pending_ids(&mut probe, &job_id).await,
        vec!["ap2".to_string()]
    );
    let unknown = decide(&mut control, "nope", v1::ApprovalVerdict::Approve, "", "")
        .await
        .expect_err("unknown approval");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let cancelled = cancel_job(&mut control, &job_id, "test over").await;
    assert_eq!(cancelled.expect("cancel"), v1::JobState::Cancelled);

    let mut requested = Vec::new();
    let mut decided_events = Vec::new();
    let mut last_state = None;
    within("the watch stream to end", async {
        while let Some(event) = watch.message().await.expect("watch item") {
            match event.event {
                Some(v1::job_event::Event::ApprovalRequested(r)) => requested.push(r.approval_id),
                Some(v1::job_event::Event::ApprovalDecided(d)) => {
                    decided_events.push(d.approval_id)
                }
                Some(v1::job_event::Event::StateChange(c)) => last_state = Some(c.current()),
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(requested, vec!["ap1".to_string(), "ap2".to_string()]);
    assert_eq!(decided_events, vec!["ap1".to_string()]);
    assert_eq!(last_state, Some(v1::JobState::Cancelled));
    assert_eq!(model.inner.remaining(), 1, "the held turn never ran");
    leader.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn the_leader_loop_waits_for_a_decision_on_its_own_medium_risk_call() {
    let env = Env::start().await;
    let mut worker = FakeWorker::start(&env.bus, "fw1", "fb0").await;
    let model: Arc<dyn mtswarm_core::ChatModel> = Arc::new(ScriptedModel::new([
        ScriptedTurn::call("c1", "spawn_agent", r#"{"name":"a1"}"#),
        ScriptedTurn::text("spawned"),
    ]));
    let mut config = env.config_with_model(model);
    config.auto_approve = mtswarm_core::AutoApprove::LowOnly;
    let leader = start_leader(config).await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1.").await;
    let probe = control.clone();
    let approval = eventually("the leader's approval request", || {
        let mut probe = probe.clone();
        let job_id = job_id.clone();
        async move { pending(&mut probe, &job_id).await.ok()?.into_iter().next() }
    })
    .await;
    assert_eq!(approval.agent_id, "leader");
    assert_eq!(approval.tool_name, "spawn_agent");
    assert_eq!(approval.risk(), v1::RiskLevel::Medium);
    assert!(
        worker.calls.try_recv().is_err(),
        "nothing spawned before the decision"
    );

    decide(
        &mut control,
        &approval.approval_id,
        v1::ApprovalVerdict::Approve,
        "",
        "bob",
    )
    .await
    .expect("decide");
    let spawn = worker.next_spawn("the approved spawn").await;
    assert_eq!(spawn.agent_id, "a1");
    let events = watch_to_end(&mut control, &job_id, 0).await;
    // No task ran, so there is no measurement: the answer alone is no success.
    assert_eq!(final_state(&events), Some(v1::JobState::Failed));
    assert!(events.iter().any(|e| matches!(
        &e.event,
        Some(v1::job_event::Event::ApprovalDecided(d)) if d.approval_id == approval.approval_id
    )));
    leader.shutdown().await.expect("shutdown");
}
