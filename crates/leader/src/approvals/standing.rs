//! Standing approvals: "approve `benchmark` for this job" (or for this
//! agent). A human decision with such a scope is stored a second time,
//! under a key derived from what it covers (job, tool and, for the agent
//! scope, agent). Each later request of the job is looked up there before
//! anyone is asked: a match decides the request at once, signed, with the
//! standing decision's id recorded (`standing_approval_id`), so the record
//! says who allowed it and when.
//!
//! Any worker identity may write the approvals bucket, so a stored
//! standing approval counts only when the leader's signature over it
//! verifies (the scope, tool and agent are signed fields) and it names the
//! request's own job, tool and agent. Lookups are two key reads per
//! request, whatever the number of jobs or approvals.

use mtswarm_bus::{Approvals, STANDING_APPROVAL_PREFIX, v1};
use sha2::{Digest, Sha256};

/// The key of the standing approval covering `tool` in `job_id`, for the
/// agent `agent_id` or (`None`) every agent.
fn key(job_id: &str, tool: &str, agent_id: Option<&str>) -> String {
    let mut hash = Sha256::new();
    for part in [job_id, tool, agent_id.unwrap_or("")] {
        hash.update(part.as_bytes());
        hash.update([0u8]);
    }
    // The scope is part of the key: a job-wide key never equals an agent's.
    hash.update([u8::from(agent_id.is_some())]);
    format!(
        "{STANDING_APPROVAL_PREFIX}{}",
        &hex::encode(hash.finalize())[..32]
    )
}

/// Whether `scope` reaches beyond one call.
pub(crate) fn is_standing(scope: v1::ApprovalScope) -> bool {
    matches!(
        scope,
        v1::ApprovalScope::ToolForJob | v1::ApprovalScope::ToolForAgent
    )
}

/// The key `decision` is stored under, or `None` for a decision of one call.
fn key_of(decision: &v1::ApprovalDecision) -> Option<String> {
    match decision.scope() {
        v1::ApprovalScope::ToolForJob => Some(key(&decision.job_id, &decision.tool_name, None)),
        v1::ApprovalScope::ToolForAgent => Some(key(
            &decision.job_id,
            &decision.tool_name,
            Some(&decision.agent_id),
        )),
        v1::ApprovalScope::Unspecified | v1::ApprovalScope::Call => None,
    }
}

/// Stores a decided record whose decision has a standing scope (a later
/// one for the same job, tool and agent replaces it). Failing to store it
/// only means later calls ask again; the decision itself stands.
pub(crate) async fn remember(approvals: &Approvals, record: &v1::ApprovalRecord) {
    let Some(decision) = &record.decision else {
        return;
    };
    let Some(key) = key_of(decision) else {
        return;
    };
    if let Err(error) = approvals.put_standing(&key, record).await {
        tracing::warn!(%error, approval_id = %decision.approval_id, "standing approval not stored; later calls ask again");
    }
}

/// The standing decision that covers `request`, if there is a genuine one:
/// the agent's first, then the job's.
pub(crate) async fn covering(
    approvals: &Approvals,
    signer: Option<&mtswarm_auth::DecisionSigner>,
    request: &v1::ApprovalRequest,
) -> Option<v1::ApprovalDecision> {
    let candidates = [
        (
            key(&request.job_id, &request.tool_name, Some(&request.agent_id)),
            v1::ApprovalScope::ToolForAgent,
        ),
        (
            key(&request.job_id, &request.tool_name, None),
            v1::ApprovalScope::ToolForJob,
        ),
    ];
    for (key, scope) in candidates {
        let stored = match approvals.standing(&key).await {
            Ok(Some(stored)) => stored,
            Ok(None) => continue,
            Err(error) => {
                tracing::warn!(%error, %key, "standing approval unreadable; asking");
                continue;
            }
        };
        let Some(decision) = stored.value.decision else {
            continue;
        };
        let names_the_request = decision.scope() == scope
            && decision.job_id == request.job_id
            && decision.tool_name == request.tool_name
            && (scope == v1::ApprovalScope::ToolForJob || decision.agent_id == request.agent_id);
        if !names_the_request {
            tracing::warn!(%key, approval_id = %decision.approval_id, "standing approval names another call; ignored");
            continue;
        }
        if let Some(signer) = signer
            && let Err(error) = signer.verifier().verify(&decision)
        {
            tracing::warn!(%error, %key, "standing approval not signed by this leader; ignored");
            continue;
        }
        return Some(decision);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_jobs_tools_agents_and_scopes() {
        let job = key("j1", "benchmark", None);
        assert!(job.starts_with(STANDING_APPROVAL_PREFIX));
        assert_ne!(job, key("j2", "benchmark", None));
        assert_ne!(job, key("j1", "validate", None));
        assert_ne!(job, key("j1", "benchmark", Some("")));
        assert_ne!(
            key("j1", "benchmark", Some("a")),
            key("j1", "benchmark", Some("b"))
        );
    }
}
