//! Deciding one approval request as the local user: shared by `mtswarm
//! approve` / `deny` and the interactive approvals of `mtswarm watch`, so
//! both send the same request with the same decider.

use anyhow::Context as _;
use clap::ValueEnum;
use mtswarm_proto::v1;

use crate::common::{local_identity, rpc_error};

/// How far a decision reaches (`--scope`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// This call only.
    #[default]
    Call,
    /// This call and every later call of the same tool in the job.
    #[value(alias = "tool-for-job")]
    Job,
    /// This call and every later call of the same tool by the same agent.
    #[value(alias = "tool-for-agent")]
    Agent,
}

impl Scope {
    fn to_proto(self) -> v1::ApprovalScope {
        match self {
            Self::Call => v1::ApprovalScope::Call,
            Self::Job => v1::ApprovalScope::ToolForJob,
            Self::Agent => v1::ApprovalScope::ToolForAgent,
        }
    }
}

/// DecideApproval with the local identity as the decider.
pub(crate) async fn decide_approval(
    control: &mut crate::common::Control,
    leader: &str,
    approval_id: &str,
    verdict: v1::ApprovalVerdict,
    reason: &str,
    scope: Scope,
) -> anyhow::Result<v1::ApprovalRecord> {
    let what = match verdict {
        v1::ApprovalVerdict::Approve => format!("approving {approval_id}"),
        _ => format!("denying {approval_id}"),
    };
    control
        .decide_approval(v1::DecideApprovalRequest {
            approval_id: approval_id.to_string(),
            verdict: verdict as i32,
            reason: reason.to_string(),
            decided_by: local_identity(),
            scope: scope.to_proto() as i32,
        })
        .await
        .map_err(|status| rpc_error(&what, leader, status))?
        .into_inner()
        .approval
        .context("the leader answered without the approval record")
}
