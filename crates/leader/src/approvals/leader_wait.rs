//! The leader loop's own approval pauses: its requests are stored and
//! announced like any agent's, and the loop waits for the decisions (or the
//! timeout's deny, or the job's cancellation).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use mtswarm_bus::v1;
use mtswarm_core::ApprovalDecision;
use tokio::sync::watch;

use crate::ids::LEADER_AGENT_ID;
use crate::job::JobContext;
use crate::keys::LeaderKeys;
use crate::stores::Stores;

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

/// What became of the loop's approval requests.
pub(crate) enum Decisions {
    Decided(HashMap<String, ApprovalDecision>),
    Cancelled(String),
    Failed(String),
}

/// Marks a still-pending approval as denied by timeout.
async fn record_timeout(stores: &Stores, keys: &LeaderKeys, approval_id: &str) {
    let Ok(Some(current)) = stores.approvals.get(approval_id).await else {
        return;
    };
    let signer = keys.decision();
    let current = super::as_worker_sees_it(signer, &current);
    let request = current.value.request.clone().unwrap_or_default();
    let mut decision = v1::ApprovalDecision {
        approval_id: approval_id.to_string(),
        reason: "approval timed out".to_string(),
        decided_by: "timeout".to_string(),
        decided_at: Some(now()),
        timed_out: true,
        ..mtswarm_auth::ApprovedCall::of(&request).decision(v1::ApprovalVerdict::Deny)
    };
    if let Some(signer) = signer
        && let Err(error) = signer.sign(&mut decision)
    {
        tracing::warn!(%error, "timeout decision not signed");
    }
    if stores
        .approvals
        .decide_at(&decision, &current)
        .await
        .is_ok()
    {
        let _ = stores
            .journal
            .append(
                &request.job_id,
                v1::job_event::Event::ApprovalDecided(decision),
            )
            .await;
    }
}

/// The leader loop paused: store and announce its approval requests like
/// any agent's, then wait for the decisions (DecideApproval publishes them
/// to the leader session's decision subject).
pub(crate) async fn await_decisions(
    stores: &Stores,
    keys: &LeaderKeys,
    context: &JobContext,
    session_id: &str,
    approvals: &[mtswarm_core::ApprovalRequest],
    timeout: Duration,
    cancel: &mut watch::Receiver<Option<String>>,
) -> Decisions {
    let mut decisions_in = match stores.bus.subscribe_approval_decisions(session_id).await {
        Ok(stream) => stream,
        Err(error) => return Decisions::Failed(format!("cannot wait for approvals: {error}")),
    };
    let mut waiting: HashMap<String, String> = HashMap::new();
    for approval in approvals {
        let approval_id = uuid::Uuid::now_v7().simple().to_string();
        let request = v1::ApprovalRequest {
            approval_id: approval_id.clone(),
            job_id: context.job_id.clone(),
            agent_id: LEADER_AGENT_ID.to_string(),
            session_id: session_id.to_string(),
            call_id: approval.call_id.clone(),
            tool_name: approval.tool.clone(),
            arguments_json: approval.arguments.to_string(),
            risk: match approval.risk {
                mtswarm_core::Risk::Low => v1::RiskLevel::Low,
                mtswarm_core::Risk::Medium => v1::RiskLevel::Medium,
                mtswarm_core::Risk::High => v1::RiskLevel::High,
            } as i32,
            reason: format!("{:?}-risk leader tool", approval.risk).to_lowercase(),
            requested_at: Some(now()),
            timeout_seconds: timeout.as_secs(),
            default_verdict: v1::ApprovalVerdict::Deny as i32,
            summary: format!("{} (leader tool)", approval.tool),
            ..Default::default()
        };
        let mut request = request;
        if let Some(signer) = keys.decision()
            && let Err(error) = signer.sign_own_request(&mut request)
        {
            tracing::warn!(%error, "leader approval request not signed");
        }
        if let Err(error) = stores.approvals.create(&request).await {
            return Decisions::Failed(format!("approval not stored: {error}"));
        }
        if let Err(error) = stores.bus.publish_approval_request(&request).await {
            tracing::warn!(%error, "leader approval request not announced");
        }
        waiting.insert(approval_id, approval.call_id.clone());
    }
    let mut decided = HashMap::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while decided.len() < waiting.len() {
        tokio::select! {
            message = decisions_in.next() => match message {
                Some(Ok(received)) => {
                    let decision = received.message;
                    if let Some(call_id) = waiting.get(&decision.approval_id) {
                        let verdict = match decision.verdict() {
                            v1::ApprovalVerdict::Approve => ApprovalDecision::Approve,
                            _ => ApprovalDecision::Deny {
                                reason: (!decision.reason.is_empty()).then(|| decision.reason.clone()),
                            },
                        };
                        decided.insert(call_id.clone(), verdict);
                    }
                }
                Some(Err(error)) => tracing::warn!(%error, "undecodable approval decision"),
                None => return Decisions::Failed("approval decision subscription ended".into()),
            },
            _ = tokio::time::sleep_until(deadline) => {
                // Undecided calls get the default verdict (deny), recorded
                // as timed out so they leave the pending list.
                for (approval_id, call_id) in &waiting {
                    if decided.contains_key(call_id) {
                        continue;
                    }
                    record_timeout(stores, keys, approval_id).await;
                    decided.insert(
                        call_id.clone(),
                        ApprovalDecision::Deny {
                            reason: Some("approval timed out".to_string()),
                        },
                    );
                }
                break;
            }
            changed = cancel.changed() => {
                if changed.is_ok()
                    && let Some(reason) = cancel.borrow().clone()
                {
                    return Decisions::Cancelled(reason);
                }
            }
        }
    }
    Decisions::Decided(decided)
}
