//! The call an approval decision must name. A decision is applied only to
//! the call it was made for: the same approval id, job, session, call id,
//! tool, canonical arguments and risk. Both the leader (relaying and
//! recording decisions) and the worker (applying them) check a decision
//! against the call it answers with [`ApprovedCall::mismatch`], so a
//! decision replayed onto another call is never applied.

use mtswarm_bus::v1;

use crate::provenance::arguments_digest;

/// The fields of a pending call a decision must repeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovedCall {
    /// The approval request's id.
    pub approval_id: String,
    /// The job the call belongs to.
    pub job_id: String,
    /// The agent making the call (not checked: the session names it).
    pub agent_id: String,
    /// The session making the call.
    pub session_id: String,
    /// The engine's id of the call.
    pub call_id: String,
    /// The tool called.
    pub tool_name: String,
    /// [`arguments_digest`] of the call's arguments.
    pub arguments_sha256: String,
    /// The call's risk (`v1::RiskLevel`).
    pub risk: i32,
}

impl ApprovedCall {
    /// The call `request` asks approval for.
    pub fn of(request: &v1::ApprovalRequest) -> Self {
        Self {
            approval_id: request.approval_id.clone(),
            job_id: request.job_id.clone(),
            agent_id: request.agent_id.clone(),
            session_id: request.session_id.clone(),
            call_id: request.call_id.clone(),
            tool_name: request.tool_name.clone(),
            arguments_sha256: arguments_digest(&request.arguments_json),
            risk: request.risk,
        }
    }

    /// An unsigned `verdict` on this call that names it exactly (every
    /// field [`ApprovedCall::mismatch`] checks, and the agent); who
    /// decided, when and why are the caller's to fill in.
    pub fn decision(&self, verdict: v1::ApprovalVerdict) -> v1::ApprovalDecision {
        v1::ApprovalDecision {
            approval_id: self.approval_id.clone(),
            job_id: self.job_id.clone(),
            agent_id: self.agent_id.clone(),
            session_id: self.session_id.clone(),
            call_id: self.call_id.clone(),
            tool_name: self.tool_name.clone(),
            arguments_sha256: self.arguments_sha256.clone(),
            risk: self.risk,
            verdict: verdict as i32,
            ..Default::default()
        }
    }

    /// The first field in which `decision` names another call, if any.
    pub fn mismatch(&self, decision: &v1::ApprovalDecision) -> Option<&'static str> {
        [
            ("approval id", decision.approval_id == self.approval_id),
            ("job", decision.job_id == self.job_id),
            ("session", decision.session_id == self.session_id),
            ("call id", decision.call_id == self.call_id),
            ("tool", decision.tool_name == self.tool_name),
            (
                "arguments",
                decision.arguments_sha256 == self.arguments_sha256,
            ),
            ("risk", decision.risk == self.risk),
        ]
        .into_iter()
        .find_map(|(field, same)| (!same).then_some(field))
    }
}
